"""Runs and device-session folders kept as data: one ``FOLDER.tar.xz`` beside where the folder was.

A committed run (``results/runs/<run>/``: ``events.jsonl``, ``candidates/``, ``evals/``, ``best.*``)
is hundreds of near-identical candidate files; packed it is one file that git stores once, that
``git grep`` skips and that a reader never mistakes for code. The tools read a packed run where
they read a directory: ``readable(path)`` turns a run path (a directory, a ``.tar.xz``, or a path
into a folder that is now packed) into a directory to read, unpacking to a temporary directory
that is removed afterwards. ``kopt report``, ``kopt memory``, ``kopt status`` and the replay
agent go through it. Resuming writes to the run, so it needs the directory: ``kopt unpack``, resume,
``kopt pack`` (``packed_message`` says so where a packed run is named to be written to).

The archive holds every file of the folder under ``<folder name>/`` except a top-level
``README.md``, which stays in the folder so git shows what the folder holds (a device-session
folder ``results/h200-*/`` keeps its README; a run, with none, leaves no folder). The archive
is the plain format ``tar -xJf FOLDER.tar.xz -C PARENT`` also unpacks, and packing is
deterministic (sorted members, no times or owners), so packing an unchanged folder again writes
the same bytes. xz rather than gzip: the solid archive compresses the candidates against each
other (a 28 MB run packs to 0.86 MB instead of 6.7 MB).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path, PurePosixPath

SUFFIX = ".tar.xz"
KEPT_OUT = "README.md"  # a top-level README stays readable in git beside the archive
SKIPPED = ("lock", "scratch")  # a run's lock file and the judge's scratch: not data
FIRST = ("events.jsonl", "best.json", "best.py")  # at the archive's front: a reader of the log stops early
XZ_PRESET = 6  # xz's default: 8 MB window, ~100 MB to compress; preset 9 saved 6 % for 7x the memory


class StoreError(ValueError):
    """A folder that cannot be packed or an archive that cannot be unpacked; the message says why."""


def packed_path(folder: str | Path) -> Path:
    """Where ``folder``'s archive lives: ``PARENT/NAME.tar.xz``."""
    folder = Path(folder)
    return folder.with_name(folder.name + SUFFIX)


def is_archive(path: str | Path) -> bool:
    return str(path).endswith(SUFFIX) and Path(path).is_file()


def folder_of(archive: str | Path) -> Path:
    """The folder an archive unpacks to: ``PARENT/NAME`` for ``PARENT/NAME.tar.xz``."""
    archive = Path(archive)
    if not archive.name.endswith(SUFFIX):
        raise StoreError(f"{archive}: not a packed folder (its name does not end in {SUFFIX})")
    return archive.with_name(archive.name[: -len(SUFFIX)])


def locate(path: str | Path) -> tuple[Path, PurePosixPath] | None:
    """The archive that holds ``path`` and the path inside its folder, or None where ``path`` is a
    plain path to read as it is. ``path`` may be an archive, a packed folder's old path
    (``results/runs/r`` with ``results/runs/r.tar.xz`` beside it) or a path below one
    (``results/runs/r/events.jsonl``). A path that exists is read as it is (an unpacked working copy
    wins over its archive)."""
    path = Path(path)
    if is_archive(path):
        return path, PurePosixPath(".")
    if path.exists():
        return None
    for folder in (path, *path.parents):
        if folder.name and packed_path(folder).is_file():
            return packed_path(folder), PurePosixPath(path.relative_to(folder).as_posix())
        if folder.exists():
            return None
    return None


@contextlib.contextmanager
def readable(path: str | Path, *, only: Collection[str] | Callable[[str], bool] | None = None) -> Iterator[Path]:
    """``path`` as something to read: itself where it is plain, else the same path inside its
    archive unpacked to a temporary directory (removed when the block ends). The unpacked folder
    keeps its name, so a run's id (its folder's name) reads the same packed and unpacked.

    ``only`` unpacks just some files (paths inside the folder, or a test on them); given as names,
    reading stops once they are all found, so ``only=("events.jsonl",)`` reads only the front of a
    packed run (``pack`` puts the loop's own files first)."""
    found = locate(path)
    if found is None:
        yield Path(path)
        return
    archive, inside = found
    with tempfile.TemporaryDirectory(prefix="kopt-unpacked-") as tmp:
        folder = _extract(archive, Path(tmp), only)
        yield folder if str(inside) == "." else folder / inside


@contextlib.contextmanager
def readable_all(paths: Collection[str | Path]) -> Iterator[list[Path]]:
    """Each of ``paths`` as something to read, like ``readable``, with every archive among them
    unpacked once into one temporary directory: paths from different archives share a parent, as
    they would unpacked side by side, so names relative to it read as ``NAME/...``."""
    found = [locate(path) for path in paths]
    if not any(found):
        yield [Path(path) for path in paths]
        return
    with tempfile.TemporaryDirectory(prefix="kopt-unpacked-") as tmp:
        folders = {archive: _extract(archive, Path(tmp)) for archive in dict.fromkeys(f[0] for f in found if f)}
        yield [Path(path) if f is None else folders[f[0]] if str(f[1]) == "." else folders[f[0]] / f[1]
               for path, f in zip(paths, found)]


def packed_message(run_dir: str | Path) -> str | None:
    """Why a run cannot be written to at ``run_dir`` because it is packed (with the commands that
    unpack it), or None where nothing packed is in the way."""
    run_dir = Path(run_dir)
    archive = run_dir if str(run_dir).endswith(SUFFIX) else packed_path(run_dir)
    if not archive.is_file() or (run_dir != archive and (run_dir / "events.jsonl").is_file()):
        return None  # no archive, or an unpacked working copy of it: write there
    folder = folder_of(archive)
    return (f"{archive} is a packed run; a run is resumed in its directory: unpack it with `kopt unpack {archive}` "
            f"(writes {folder}/), continue with --kopt-resume --kopt-run-dir={folder}, then `kopt pack {folder}` packs it again")


# ---- packing ----------------------------------------------------------------------------------
def files_to_pack(folder: Path) -> list[Path]:
    """The folder's files in archive order (the loop's own files first, then by path), less the
    top-level README, the lock and scratch; raises on a link or anything but a plain file."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if relative.parts[0] in SKIPPED or relative.as_posix() == KEPT_OUT:
            continue
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise StoreError(f"{path}: only plain files and folders can be packed (a link or special file would not survive)")
        if path.is_file():
            found.append(path)
    first = {name: i for i, name in enumerate(FIRST)}

    def order(path: Path) -> tuple[int, bool, str]:  # the loop's files, then other top-level files, then folders
        relative = path.relative_to(folder)
        return first.get(relative.as_posix(), len(first)), len(relative.parts) > 1, relative.as_posix()

    return sorted(found, key=order)


def pack(folder: str | Path, *, keep: bool = False) -> Path:
    """Pack ``folder`` into ``folder.tar.xz`` and (unless ``keep``) remove the packed files; returns
    the archive. An existing archive is replaced only when the folder holds all of its files (so
    a folder that was never unpacked cannot shrink its archive), and the new archive is read back
    and checked against the files before anything is removed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StoreError(f"{folder}: no such folder to pack")
    _refuse_if_owned(folder)
    files = files_to_pack(folder)
    if not files:
        raise StoreError(f"{folder}: nothing to pack (only a README, a lock or scratch)")
    archive = packed_path(folder)
    if archive.is_file():
        lost = sorted(set(_member_files(archive)) - {f.relative_to(folder).as_posix() for f in files})
        if lost:
            raise StoreError(f"{archive} holds {len(lost)} file(s) the folder lacks (e.g. {lost[0]}): "
                             f"unpack it first (`kopt unpack {archive}`) so packing again loses nothing")
    partial = archive.with_name(archive.name + ".partial")
    try:
        with tarfile.open(partial, "w:xz", preset=XZ_PRESET, format=tarfile.PAX_FORMAT) as tar:
            for path in files:
                data = path.read_bytes()
                info = tarfile.TarInfo(f"{folder.name}/{path.relative_to(folder).as_posix()}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
        _check_against(partial, folder, files)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    if not keep:
        for path in files:
            path.unlink()
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if sub.relative_to(folder).parts[0] not in SKIPPED and not any(sub.iterdir()):
                sub.rmdir()
        if not any(p for p in folder.iterdir() if p.name not in SKIPPED):
            shutil.rmtree(folder)  # a run: nothing of it is left outside the archive
    return archive


def _refuse_if_owned(folder: Path) -> None:
    lock = folder / "lock"
    if not lock.is_file():
        return
    with open(lock, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"{folder}: a process owns this run (its lock is held); pack it after the run stops") from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def _check_against(archive: Path, folder: Path, files: list[Path]) -> None:
    """Read the archive back; every file must come out byte for byte."""
    want = {f"{folder.name}/{p.relative_to(folder).as_posix()}": hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    got = {}
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            got[member.name] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
    if got != want:
        raise StoreError(f"{archive}: the archive read back differs from {folder} ({len(set(got.items()) ^ set(want.items()))} entries); nothing was removed")


# ---- unpacking --------------------------------------------------------------------------------
def _members(archive: Path) -> Iterator[tuple[str, bytes | None]]:
    """The archive's entries in order, as (path relative to its folder, bytes; None for a folder),
    in one pass, each checked to be a plain file or folder inside the archive's one folder."""
    top = folder_of(archive).name
    try:
        with tarfile.open(archive, "r|xz") as tar:  # a stream: one pass of the decompressor
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts or not parts or parts[0] != top:
                    raise StoreError(f"{archive}: member {member.name!r} is not a path inside {top}/")
                if not (member.isfile() or member.isdir()):
                    raise StoreError(f"{archive}: member {member.name!r} is not a plain file or folder")
                inside = PurePosixPath(*parts[1:]).as_posix() if len(parts) > 1 else "."
                yield inside, tar.extractfile(member).read() if member.isfile() else None
    except (tarfile.TarError, EOFError, OSError) as exc:  # lzma.LZMAError is an OSError
        raise StoreError(f"{archive}: not a readable {SUFFIX} archive ({exc})") from None


def _member_files(archive: Path) -> list[str]:
    """The archive's file paths relative to its folder, after checking every member is safe."""
    return [name for name, data in _members(archive) if data is not None]


def _extract(archive: Path, into: Path, only: Collection[str] | Callable[[str], bool] | None = None) -> Path:
    """Unpack a checked archive (or the files ``only`` names or accepts) under ``into``; returns
    ``into/<folder name>``. Each member is checked before it is written, and only plain files are
    written, under that one folder."""
    folder = into / folder_of(archive).name
    folder.mkdir(exist_ok=True)
    wanted = set(only) if only is not None and not callable(only) else None
    for name, data in _members(archive):
        if data is None or (wanted is not None and name not in wanted) or (callable(only) and not only(name)):
            continue
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if wanted is not None:
            wanted.discard(name)
            if not wanted:
                break
    return folder


def unpack(archive: str | Path) -> Path:
    """Unpack ``PARENT/NAME.tar.xz`` to ``PARENT/NAME/`` (the archive stays: it is what git tracks);
    returns the folder. Files already there are kept when they hold the same bytes; a file that
    differs is never overwritten (the refusal names it)."""
    archive = Path(archive)
    if not archive.is_file():
        raise StoreError(f"{archive}: no such archive")
    folder = folder_of(archive)
    with tempfile.TemporaryDirectory(prefix="kopt-unpack-", dir=archive.parent) as tmp:
        unpacked = _extract(archive, Path(tmp))
        clashes = []
        for source in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            target = folder / source.relative_to(unpacked)
            if target.exists() and target.read_bytes() != source.read_bytes():
                clashes.append(target)
        if clashes:
            raise StoreError(f"{len(clashes)} file(s) in {folder} differ from {archive} (e.g. {clashes[0]}); "
                             "nothing was unpacked: pack the folder or move them away first")
        for source in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            target = folder / source.relative_to(unpacked)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
    return folder


# ---- the commands -----------------------------------------------------------------------------
class PackCommand:
    """Pack a run or data folder into FOLDER.tar.xz (its README.md stays in the folder)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("folders", nargs="+", type=Path, metavar="FOLDER", help="e.g. results/runs/<run> or results/h200-<date>")
        parser.add_argument("--keep", action="store_true", help="keep the packed files in the folder as well")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        return _each(args.folders, lambda folder: f"packed {folder} -> {pack(folder, keep=args.keep)}", "pack")


class UnpackCommand:
    """Unpack FOLDER.tar.xz to FOLDER/ (to resume a run, or to open a device session's files)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("archives", nargs="+", type=Path, metavar="ARCHIVE",
                            help=f"e.g. results/runs/<run>{SUFFIX} (or the folder's own path, results/runs/<run>)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        def one(path: Path) -> str:
            archive = path if str(path).endswith(SUFFIX) else packed_path(path)
            return f"unpacked {archive} -> {unpack(archive)}/"

        return _each(args.archives, one, "unpack")


def _each(paths: list[Path], action, verb: str) -> int:
    status = 0
    for path in paths:
        try:
            print(action(path))
        except (StoreError, OSError) as exc:
            print(f"kopt {verb}: {exc}", file=sys.stderr)
            status = 2
    return status
