"""Candidate files the benchmarks time beside the promoted best (``KOPT_BENCH_EXTRA``), and how a run names them.

``KOPT_BENCH_EXTRA="kda=path.py,mla=other.py"`` (``;`` separates entries too) adds each file's ``kernel`` to its
problem's implementations in ``benchmarks/test_headline.py`` as ``candidate:file=<path>``. A file that is missing or
a problem that is not benchmarked is an error before anything runs: a typo would otherwise cost the comparison the
run was for. The run's JSON records each file's sha256 (``commit_info["sha256:<path>"]``, beside the bests'), so a
file promoted after the run is still found as the one it timed (``kopt status``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SHA_PREFIX = "sha256:"  # commit_info keys: sha256:<path relative to the repository> -> the file's first 16 hex digits


def parse(text: str, problems: tuple[str, ...], root: Path) -> list[tuple[str, str]]:
    """[(problem, path as given)] from the variable's text, paths relative to ``root`` (the directory the run loads
    them from); ValueError naming the entry that is wrong."""
    extras = []
    for entry in (e.strip() for e in re.split(r"[,;]", text or "")):
        if not entry:
            continue
        problem, sep, path = (part.strip() for part in entry.partition("="))
        if not sep or not problem or not path:
            raise ValueError(f"KOPT_BENCH_EXTRA entry {entry!r}: write PROBLEM=PATH (entries separated by ',' or ';')")
        if problem not in problems:
            raise ValueError(f"KOPT_BENCH_EXTRA entry {entry!r}: no benchmarked problem {problem!r} (one of {', '.join(problems)})")
        if not (root / path).is_file():
            raise ValueError(f"KOPT_BENCH_EXTRA entry {entry!r}: no file {path} (relative to {root})")
        extras.append((problem, path))
    return extras


def digests(extras: list[tuple[str, str]], root: Path) -> dict[str, str]:
    """commit_info entries for the extra files: ``sha256:<path>`` -> the first 16 hex digits of its sha256."""
    return {SHA_PREFIX + path: hashlib.sha256((root / path).read_bytes()).hexdigest()[:16] for _, path in extras}
