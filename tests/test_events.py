"""The event log: durable appends, continuous sequence numbers, torn tails tolerated and repaired."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.events import CorruptLog, EventLog, read_events, repair, signals_deferred


def write_some(path: Path, n: int, run_id: str = "r1") -> list[dict]:
    with EventLog(path, run_id) as log:
        return [log.append("note", text=f"event {i}", i=i) for i in range(n)]


def test_append_writes_one_json_object_a_line_with_the_common_fields(tmp_path):
    path = tmp_path / "events.jsonl"
    written = write_some(path, 3)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    for line, event in zip(lines, written):
        data = json.loads(line)
        assert data == event
        assert set(data) >= {"seq", "time", "run_id", "kind"}
        assert data["run_id"] == "r1" and data["kind"] == "note"
    assert [e["seq"] for e in written] == [1, 2, 3]
    assert read_events(path) == written


def test_every_append_is_fsynced_before_it_returns(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.fstat(fd).st_size)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    log = EventLog(path, "r")
    before = len(synced)
    log.append("note", text="a")
    log.append("note", text="b")
    # each append synced the file at its full new size, and another reader sees both lines already
    assert synced[before:] == [len(path.read_bytes().splitlines(keepends=True)[0]), path.stat().st_size]
    assert [e["text"] for e in read_events(path)] == ["a", "b"]
    log.close()


def test_sequence_continues_across_reopen(tmp_path):
    path = tmp_path / "events.jsonl"
    write_some(path, 2)
    with EventLog(path, "r1") as log:
        event = log.append("run_resumed", budget_used=0)
    assert event["seq"] == 3
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3]


def test_reserved_fields_are_refused(tmp_path):
    with EventLog(tmp_path / "e.jsonl", "r") as log:
        with pytest.raises(ValueError, match="seq"):
            log.append("note", seq=5)
    assert read_events(tmp_path / "e.jsonl") == []


def test_values_become_strict_json(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, "r") as log:
        log.append("verdict", rel_rms=math.inf, nan=math.nan, path=tmp_path / "x.py", ids={"b", "a"}, nested={"t": (1, 2.5)})
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    event = json.loads(text)
    assert event["rel_rms"] is None and event["nan"] is None
    assert event["path"] == str(tmp_path / "x.py")
    assert event["ids"] == ["a", "b"] and event["nested"] == {"t": [1, 2.5]}


def test_a_torn_last_line_is_tolerated_and_repaired(tmp_path):
    path = tmp_path / "events.jsonl"
    events = write_some(path, 3)
    good_size = path.stat().st_size
    with open(path, "ab") as fp:
        fp.write(b'{"seq":4,"time":"2025-01-01T00:00:00.000+00:00","run_id":"r1","kind":"no')
    assert read_events(path) == events
    assert repair(path) > 0
    assert path.stat().st_size == good_size
    assert repair(path) == 0  # idempotent
    with EventLog(path, "r1") as log:
        assert log.append("note", text="after")["seq"] == 4
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3, 4]


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    events = write_some(path, 2)
    path.write_bytes(path.read_bytes()[:-1])  # drop only the final newline
    assert read_events(path) == events
    with EventLog(path, "r1") as log:  # opening repairs: the newline comes back, nothing is lost
        log.append("note", text="third")
    assert [e["seq"] for e in read_events(path)] == [1, 2, 3]


def test_eventlog_repairs_on_open_and_reports_what_it_cut(tmp_path):
    path = tmp_path / "events.jsonl"
    write_some(path, 2)
    with open(path, "ab") as fp:
        fp.write(b'{"seq":3,"ti')
    with EventLog(path, "r1") as log:
        assert log.repaired_bytes == len(b'{"seq":3,"ti')
        assert log.append("note")["seq"] == 4
    record = read_events(path)[2]  # the cut is in the log, written in the same step as the cut
    assert (record["seq"], record["kind"], record["bytes"]) == (3, "log_repaired", len(b'{"seq":3,"ti'))


def test_damage_before_the_last_line_is_an_error_and_repair_changes_nothing(tmp_path):
    path = tmp_path / "events.jsonl"
    write_some(path, 3)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b"garbage\n"
    damaged = b"".join(lines)
    path.write_bytes(damaged)
    with pytest.raises(CorruptLog, match="line 2"):
        read_events(path)
    with pytest.raises(CorruptLog):
        repair(path)
    assert path.read_bytes() == damaged
    with pytest.raises(CorruptLog):
        EventLog(path, "r1")


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000), data=st.data())
def test_a_log_cut_anywhere_reads_as_a_prefix_and_can_go_on(tmp_path_factory, cut, data):
    path = tmp_path_factory.mktemp("cut") / "events.jsonl"
    n = data.draw(st.integers(min_value=1, max_value=8))
    events = write_some(path, n)
    blob = path.read_bytes()
    cut = cut % (len(blob) + 1)
    path.write_bytes(blob[:cut])
    got = read_events(path)
    assert got == events[: len(got)]
    complete_lines = blob[:cut].count(b"\n")
    assert len(got) in (complete_lines, complete_lines + 1)  # +1: a whole last line that lost its newline
    torn = len(got) < complete_lines + 1 and cut > blob[:cut].rfind(b"\n") + 1  # bytes after the last whole line
    with EventLog(path, "r1") as log:
        log.append("note", text="resumed")
    again = read_events(path)
    assert again[: len(got)] == got
    assert [e["kind"] for e in again[len(got):]] == (["log_repaired"] if torn else []) + ["note"]
    assert [e["seq"] for e in again] == list(range(1, len(again) + 1))


def test_ctrl_c_waits_until_the_block_is_done_then_acts(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path, "r")
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler would normally run here
            log.append("note", text="whole")
            with signals_deferred():  # nested blocks hand it outwards
                log.append("note", text="still")
    assert [e["text"] for e in read_events(path)] == ["whole", "still"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    log.close()
