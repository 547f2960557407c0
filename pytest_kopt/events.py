"""The run's event log: one JSON object a line in ``RUN_DIR/events.jsonl``, the truth of a run.

Every event is flushed and fsynced before ``append`` returns, so a run killed at any moment
leaves a log that ends at the last thing that really happened, give or take one torn line.
``read_events`` tolerates a torn last line; ``repair`` cuts it off (``EventLog`` repairs on
open, and records the cut as a ``log_repaired`` event in the same atomic replacement of the
file, so no kill can leave a repair unrecorded). A damaged line anywhere else is never skipped
silently: it raises ``CorruptLog``.

A line is written whole or (after a kill -9 or a power cut) torn at the end, never glued to
the next: Ctrl-C and SIGTERM wait while a line is written.

Values are written as strict JSON: non-finite floats (an infinite error, a NaN timing) become
``null``, paths become strings, numpy scalars become numbers. Every string is scrubbed of the
secrets registered with ``register_secret`` (an LLM endpoint's key): runs get committed.

The event kinds are the constants below (``RUN_STARTED``, ``VERDICT``, ...); readers fold a log
once, through ``pytest_kopt.runstate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import signal
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonlines

RESERVED = ("seq", "time", "run_id", "kind")
TEMP_GLOB = ".*.tmp"  # atomic_write's temporary files

# ---- event kinds (docs/architecture.md, Event log, pins their fields) -------------------------
RUN_STARTED = "run_started"  # objective (with metric: eager|device|graph, score: what its number is), environment, budget, agent, ...
RUN_RESUMED = "run_resumed"
RUN_FINISHED = "run_finished"
RUN_INTERRUPTED = "run_interrupted"
LOG_REPAIRED = "log_repaired"
TOOL_CALL = "tool_call"  # call, tool, args; redo; rejected (the error of a call whose arguments were not JSON)
TOOL_RESULT = "tool_result"
CANDIDATE = "candidate"
VERDICT = "verdict"  # ...; when the judge gave them: metric, figures, incumbent {candidate_id, ratio}, incumbent_error, isolation
BEST = "best"  # candidate_id, candidate_us, speedup, vs_baseline, call; ratio (how it beat the best before it); recovered (on resume)
RETRACT = "retract"
PROMOTE = "promote"  # action (promoted|refused|unchanged), reason, candidate_id, path, replaced, ratio, mode, machine, timed_on, result_path
NOTE = "note"
LLM_REQUEST = "llm_request"
LLM_RESPONSE = "llm_response"
COMPACTION = "compaction"
RUN_ENDED = (RUN_FINISHED, RUN_INTERRUPTED)
SESSION_STARTS = (RUN_STARTED, RUN_RESUMED)

SCRUBBED = "***"
_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Never write ``value`` (nor its JSON-escaped form) into a log or a result file from now on."""
    if value and len(value) >= 4:
        _SECRETS.add(value)
        escaped = json.dumps(value)[1:-1]
        if escaped != value:
            _SECRETS.add(escaped)


def scrub(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, SCRUBBED)
    return text


# what a run directory that cannot be written says: the run stops (it can be resumed), it is not
# an answer to give an agent and go on
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full or the run directory is not writable."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


class CorruptLog(ValueError):
    """A line other than the last one is not a JSON object: the log was damaged, not torn."""


def _plain(value: Any) -> Any:
    """Turn ``value`` into strict-JSON data (see the module docstring)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return scrub(value) if _SECRETS else value
    if value is None or isinstance(value, (int, bool)):
        return value
    if isinstance(value, dict):
        return {_plain(str(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _plain(value.item())
    return str(value)


def dumps(obj: Any) -> str:
    """One compact, strict JSON line."""
    return json.dumps(_plain(obj), separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _scan(path: Path) -> tuple[list[dict], int, bool]:
    """Parse ``path``: (events, bytes that hold them, whether a newline must be appended)."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")  # the last piece is b"" when the file ends with a newline
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    events: list[dict] = []
    good = 0
    for i, line in enumerate(lines[: last + 1]):
        ended = i < len(lines) - 1  # has its newline
        if line.strip():
            try:
                events.append(jsonlines.Reader([line]).read(type=dict))
            except jsonlines.InvalidLineError as exc:
                if i == last:  # a torn last line: tolerated, repair() cuts it
                    return events, good, False
                raise CorruptLog(f"{path}: line {i + 1} is not a JSON object ({exc}); the log is damaged, not torn") from None
        good += len(line) + ended
        if not ended:
            return events, good, True
    return events, good, False


def read_events(path: str | os.PathLike) -> list[dict]:
    """All events of a log, in order; a torn last line is left out."""
    return _scan(Path(path))[0]


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` so that ``path`` holds either the old or the whole new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fp:
            fp.write(data.encode("utf-8") if isinstance(data, str) else data)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk must not leave half a file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def repair(path: str | os.PathLike, *, run_id: str | None = None) -> int:
    """Cut a torn last line off the log (or end a whole last line that lost its newline).

    Returns the number of bytes removed. With ``run_id`` the repaired log also ends with a
    ``log_repaired`` event (``bytes``: what was cut) and replaces the old file atomically: a kill
    leaves the torn log or the repaired, recorded one, never a silent repair. Raises
    ``CorruptLog`` for damage elsewhere, and then changes nothing.
    """
    path = Path(path)
    if not path.exists():
        return 0
    events, good, needs_newline = _scan(path)
    size = path.stat().st_size
    if good == size and not needs_newline:
        return 0
    kept = path.read_bytes()[:good] + (b"\n" if needs_newline else b"")
    if run_id is not None and size > good:  # restoring a lost newline cuts nothing: nothing to record
        seq = max((int(e.get("seq", 0)) for e in events), default=0)
        record = {"seq": seq + 1, "time": now_iso(), "run_id": run_id, "kind": LOG_REPAIRED, "bytes": size - good}
        kept += (dumps(record) + "\n").encode("utf-8")
    atomic_write(path, kept)
    _fsync_dir(path.parent)
    return size - good


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def signals_deferred():
    """Hold Ctrl-C/SIGTERM until the block is done, then act on them as usual.

    A half-written line must never get a neighbour, and the log and the state it describes
    must move together. Handlers are swapped (not the OS signal mask) because Python may run
    a signal's handler some bytecodes after the signal arrived. Nests; main thread only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class EventLog:
    """Appends events to one log, continuing its sequence numbers; repairs a torn tail on open."""

    def __init__(self, path: str | os.PathLike, run_id: str):
        self.path = Path(path)
        self.run_id = run_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self.repaired_bytes = repair(self.path, run_id=run_id)
        existing = [] if created else read_events(self.path)
        self.seq = max((int(e.get("seq", 0)) for e in existing), default=0)
        self._fp = open(self.path, "ab")
        self._writer = jsonlines.Writer(self._fp, dumps=dumps, flush=True)
        if created:
            _fsync_dir(self.path.parent)

    def append(self, kind: str, **fields: Any) -> dict:
        """Write one event durably and return it as written (strict JSON data)."""
        clash = [k for k in RESERVED if k in fields]
        if clash:
            raise ValueError(f"event fields may not be named {', '.join(clash)}")
        event = _plain({"seq": self.seq + 1, "time": now_iso(), "run_id": self.run_id, "kind": kind, **fields})
        with signals_deferred():
            self._writer.write(event)
            os.fsync(self._fp.fileno())
            self.seq += 1
        return event

    def close(self) -> None:
        if not self._fp.closed:
            self._writer.close()
            self._fp.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

