"""Runs as data: `kopt pack` / `kopt unpack`, and the tools reading a packed run as they read its folder.

The committed runs under results/runs/ are packed; these tests pin that nothing of a run is lost
on the way (every byte, the loop's own files first), that a hostile or torn archive is refused with
a clear message, that a packed run is never written to (resume says how to unpack it), and that
`kopt report`, `kopt memory` and the replay agent give the same output from a packed run as
from its folder.
"""

from __future__ import annotations

import fcntl
import io
import lzma
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from pytest_kopt import REPO_ROOT, cli, runstore
from pytest_kopt.agents.memory import build_memory
from pytest_kopt.agents.replay import ReplayAgent, load_steps
from pytest_kopt.events import read_events
from pytest_kopt.report import render
from pytest_kopt.run import RunError, RunOptions, resolve
from pytest_kopt.runsummary import summarise

from test_report import make_run

COMMITTED_RUNS = sorted((REPO_ROOT / "results" / "runs").glob("*" + runstore.SUFFIX))
SMALLEST_RUN = [min(COMMITTED_RUNS, key=lambda p: p.stat().st_size)] if COMMITTED_RUNS else []


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def report_text(run_dir: Path) -> str:
    return "\n".join(line for line in render([summarise(run_dir)]).splitlines() if not line.startswith("_Generated"))


def test_pack_and_unpack_keep_every_byte_and_the_loop_files_first(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    make_run(run, run_id="r1", agent="search", n_candidates=8, seed=3)
    (run / "candidates").mkdir()
    (run / "candidates" / "abc.py").write_bytes(b"def kernel():\n    pass\n\xe2\x9c\x93\n")
    (run / "best.py").write_text("# best\n")
    (run / "lock").write_text("123\n")  # a stale lock (no process holds it) and scratch are not data
    (run / "scratch").mkdir()
    (run / "scratch" / "tmp.bin").write_bytes(b"x")
    before = {k: v for k, v in folder_bytes(run).items() if k != "lock" and not k.startswith("scratch/")}

    archive = runstore.pack(run)
    assert archive == tmp_path / "runs" / "r1.tar.xz" and not run.exists()  # a run leaves no folder behind
    with tarfile.open(archive, "r:xz") as tar:
        names = tar.getnames()
    assert names[:2] == ["r1/events.jsonl", "r1/best.py"] and all(n.startswith("r1/") for n in names)

    assert runstore.unpack(archive) == run
    assert folder_bytes(run) == before and archive.is_file()  # the archive is what git tracks: it stays
    first = archive.read_bytes()
    runstore.pack(run)
    assert archive.read_bytes() == first  # deterministic: an unchanged run packs to the same bytes


def test_a_readme_stays_readable_beside_the_archive(tmp_path: Path) -> None:
    session = tmp_path / "results" / "h200-x"
    (session / "call1").mkdir(parents=True)
    (session / "README.md").write_text("# what this session measured\n")
    (session / "call1" / "bench.json").write_text('{"a": 1}\n')
    archive = runstore.pack(session)
    assert sorted(p.name for p in session.iterdir()) == ["README.md"]  # the folder keeps only its README
    with tarfile.open(archive, "r:xz") as tar:
        assert tar.getnames() == ["h200-x/call1/bench.json"]
    # a link into the folder still leads somewhere: readable() finds the file in the archive
    with runstore.readable(session / "call1" / "bench.json") as path:
        assert path.read_text() == '{"a": 1}\n'
        unpacked = path
    assert not unpacked.exists()  # the temporary copy is gone after the block
    runstore.unpack(archive)
    assert (session / "call1" / "bench.json").read_text() == '{"a": 1}\n'


def test_pack_refuses_to_lose_what_the_archive_holds(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "a.log").write_text("a\n")
    (folder / "b.log").write_text("b\n")
    archive = runstore.pack(folder, keep=True)
    (folder / "b.log").unlink()
    before = archive.read_bytes()
    with pytest.raises(runstore.StoreError, match=r"holds 1 file\(s\) the folder lacks \(e.g. b.log\).*kopt unpack"):
        runstore.pack(folder)
    assert archive.read_bytes() == before and (folder / "a.log").is_file()


def test_pack_refuses_a_run_a_process_owns_and_a_link(tmp_path: Path) -> None:
    run = tmp_path / "live"
    run.mkdir()
    (run / "events.jsonl").write_text("{}\n")
    with open(run / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(runstore.StoreError, match="a process owns this run"):
            runstore.pack(run)
    (run / "link").symlink_to(run / "events.jsonl")
    with pytest.raises(runstore.StoreError, match="only plain files"):
        runstore.pack(run)
    assert not runstore.packed_path(run).exists() and (run / "events.jsonl").is_file()


def test_unpack_never_overwrites_a_file_that_differs(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "events.jsonl").write_text("{}\n")
    (run / "best.py").write_text("# best\n")
    archive = runstore.pack(run, keep=True)
    assert runstore.unpack(archive) == run  # identical files already there are fine
    (run / "best.py").write_text("# edited by hand\n")
    (run / "events.jsonl").unlink()
    with pytest.raises(runstore.StoreError, match="differ from .*nothing was unpacked"):
        runstore.unpack(archive)
    assert (run / "best.py").read_text() == "# edited by hand\n" and not (run / "events.jsonl").exists()


def hostile_archive(path: Path, name: str, *, kind: bytes = tarfile.REGTYPE) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    path.write_bytes(lzma.compress(buf.getvalue()))
    return path


@pytest.mark.parametrize("name,kind,message", [
    ("r/../../escape.txt", tarfile.REGTYPE, "not a path inside r/"),
    ("/tmp/absolute.txt", tarfile.REGTYPE, "not a path inside r/"),
    ("other/events.jsonl", tarfile.REGTYPE, "not a path inside r/"),
    ("r/link", tarfile.SYMTYPE, "not a plain file"),
])
def test_a_hostile_archive_is_refused_and_writes_nothing(tmp_path: Path, name: str, kind: bytes, message: str) -> None:
    archive = hostile_archive(tmp_path / "r.tar.xz", name, kind=kind)
    with pytest.raises(runstore.StoreError, match=message):
        runstore.unpack(archive)
    with pytest.raises(runstore.StoreError, match=message), runstore.readable(archive):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.tar.xz"]


def test_a_torn_archive_is_refused_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    make_run(run, run_id="r", agent="search", n_candidates=4, seed=1)
    archive = runstore.pack(run)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(runstore.StoreError, match=r"r.tar.xz: not a readable .tar.xz archive"):
        runstore.unpack(archive)
    for command in (["report", str(archive), "--out", str(tmp_path / "out")], ["memory", str(archive)], ["unpack", str(archive)]):
        assert cli.main(command) == 2
        assert f"kopt {command[0]}: {archive}: not a readable" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_readable_finds_a_packed_run_by_any_of_its_paths(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r7"
    make_run(run, run_id="r7", agent="search", n_candidates=4, seed=7)
    expected = (run / "events.jsonl").read_bytes()
    runstore.pack(run)
    for given in (run, run / "events.jsonl", runstore.packed_path(run), str(run)):
        with runstore.readable(given) as path:
            log = path if path.name == "events.jsonl" else path / "events.jsonl"
            assert log.read_bytes() == expected and log.parent.name == "r7"  # the run keeps its id
    with runstore.readable(tmp_path / "runs" / "absent") as path:
        assert path == tmp_path / "runs" / "absent"  # nothing packed there: the path as given


def test_report_memory_and_replay_read_a_packed_run_as_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "runs" / "r1"
    make_run(run, run_id="r1", agent="search", n_candidates=10, seed=3)
    (run / "candidates").mkdir()
    for event in read_events(run / "events.jsonl"):
        if event["kind"] == "candidate":
            (run / "candidates" / f"{event['candidate_id']}.py").write_text(f"# candidate {event['candidate_id']}\n")
    copy = tmp_path / "copy" / "r1"
    shutil.copytree(run, copy)
    steps = load_steps(copy)
    memory = build_memory(read_events(copy / "events.jsonl"), copy)
    report = report_text(copy)
    assert any(s.source for s in steps) and "# candidate" in memory

    archive = runstore.pack(run)
    assert cli.main(["report", str(archive), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "\n".join(l for l in (tmp_path / "out" / "report.md").read_text().splitlines() if not l.startswith("_Generated")) == report
    assert cli.main(["memory", str(run)]) == 0  # the folder's old path: its archive is found beside it
    assert capsys.readouterr().out == memory
    assert cli.main(["memory", str(run / "events.jsonl")]) == 0
    assert capsys.readouterr().out == memory
    assert ReplayAgent(replay_path=archive).steps == steps
    assert ReplayAgent(replay_path=run / "events.jsonl").steps == steps


@pytest.mark.parametrize("given", ["archive", "folder"])
def test_a_packed_run_is_not_resumed_in_place(tmp_path: Path, given: str) -> None:
    run = tmp_path / "runs" / "r1"
    make_run(run, run_id="r1", agent="search", n_candidates=3, seed=3)
    archive = runstore.pack(run)
    run_dir = archive if given == "archive" else run
    with pytest.raises(RunError, match=rf"packed run.*kopt unpack {archive}.*--kopt-resume --kopt-run-dir={run}.*kopt pack {run}"):
        resolve(RunOptions(problem="kda", run_dir=run_dir, resume=True))
    with pytest.raises(RunError, match="packed run"):  # nor is a new run started where its folder was
        resolve(RunOptions(problem="kda", run_dir=run))
    assert not run.exists()
    runstore.unpack(archive)  # the way the message says: unpacked, it resumes
    assert resolve(RunOptions(problem="kda", run_dir=run, resume=True)).started is not None


def test_the_commands_pack_and_unpack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "r"
    make_run(run, run_id="r", agent="search", n_candidates=3, seed=2)
    before = folder_bytes(run)
    assert cli.main(["pack", str(run)]) == 0 and not run.exists()
    assert cli.main(["unpack", str(run)]) == 0  # the folder's path names its archive too
    assert folder_bytes(run) == before
    assert f"unpacked {run}.tar.xz -> {run}/" in capsys.readouterr().out
    assert cli.main(["pack", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("archive", SMALLEST_RUN, ids=lambda p: p.name)
def test_a_committed_run_reads_the_same_packed_and_unpacked(tmp_path: Path, archive: Path) -> None:
    """The smallest committed run, through each reader, from its archive and from `kopt unpack`."""
    copy = tmp_path / archive.name
    shutil.copy(archive, copy)
    with runstore.readable(copy) as packed:
        from_archive = (report_text(packed), build_memory(read_events(packed / "events.jsonl"), packed), load_steps(packed))
    unpacked = runstore.unpack(copy)
    from_folder = (report_text(unpacked), build_memory(read_events(unpacked / "events.jsonl"), unpacked), load_steps(unpacked))
    assert from_archive == from_folder
    assert from_folder[2] and all(step.source for step in from_folder[2] if step.tool == "write_candidate")


def test_every_committed_run_is_packed_whole() -> None:
    tracked = subprocess.run(["git", "ls-files", "results/runs"], cwd=REPO_ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    loose = [name for name in tracked.stdout.split() if not name.endswith(runstore.SUFFIX)]
    assert len(COMMITTED_RUNS) >= 5 and not loose  # a run committed as a folder: pack it (kopt pack)
    for archive in COMMITTED_RUNS:
        files = runstore._member_files(archive)
        assert files[0] == "events.jsonl" and "best.py" in files and any(f.startswith("candidates/") for f in files), archive.name


def test_readable_can_unpack_only_the_files_asked_for(tmp_path: Path) -> None:
    run = tmp_path / "r"
    make_run(run, run_id="r", agent="search", n_candidates=4, seed=4)
    (run / "best.json").write_text("{}\n")
    archive = runstore.pack(run)
    with runstore.readable(archive, only=("events.jsonl", "best.json")) as folder:
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == ["best.json", "events.jsonl"]
    with runstore.readable(archive, only=lambda name: name.startswith("evals/")) as folder:
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        assert files and all(f.startswith("evals/") for f in files)
