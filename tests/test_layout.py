"""The repository's layout, as docs/architecture.md draws it: the tree and the README agree and
exist, every link in the docs leads somewhere (into a packed folder too), benchmarks/ holds the
pytest-benchmark suite only, and the tracked lines are mostly code and docs, not run data."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pytest_kopt import REPO_ROOT, runstore

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "results" / "README.md",
        REPO_ROOT / "tools" / "README.md", *sorted((REPO_ROOT / "results").glob("h200-*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def tree(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index("## Layout")
    return text[text.index("```", start): text.index("```", text.index("```", start) + 3) + 3]


def tracked(*paths: str) -> list[str]:
    found = subprocess.run(["git", "ls-files", "-z", *paths], cwd=REPO_ROOT, capture_output=True)
    if found.returncode != 0:
        pytest.skip("not a git checkout")
    return [name for name in found.stdout.decode().split("\0") if name]


def leads_somewhere(path: Path) -> bool:
    """A file or folder that exists, or a file kept in a packed folder's archive."""
    if path.exists():
        return True
    found = runstore.locate(path)
    return found is not None and str(found[1]) in runstore._member_files(found[0])


def test_the_readme_draws_the_layout_of_the_architecture_page() -> None:
    drawn = tree(REPO_ROOT / "docs" / "architecture.md")
    assert tree(REPO_ROOT / "README.md") == drawn
    folders = re.findall(r"^\s*([a-z_]+/)", drawn, flags=re.M) + re.findall(r"(?<=: )([a-z_]+/)", drawn)
    assert {"pytest_kopt/", "kernels/", "benchmarks/", "tests/", "gpu/", "tools/", "results/"} <= set(folders)
    for line in drawn.splitlines()[1:-1]:
        name = re.match(r"^(\s*)([a-z_]+)/", line)
        if name and not name.group(1):
            parent = REPO_ROOT / name.group(2)
            assert parent.is_dir(), f"the layout names {name.group(2)}/, which does not exist"
        elif name:
            assert (parent / name.group(2)).is_dir(), f"the layout names {parent.name}/{name.group(2)}/, which does not exist"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_leads_somewhere(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = (doc.parent / target.split("#")[0]).resolve()
        if not leads_somewhere(path):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO_ROOT)} links to what is not there: {broken}"


def test_benchmarks_holds_the_pytest_benchmark_suite_only() -> None:
    files = sorted(p.name for p in (REPO_ROOT / "benchmarks").iterdir() if p.name != "__pycache__")
    assert files == ["conftest.py", "test_headline.py"]


def test_the_tracked_lines_are_mostly_code_and_docs() -> None:
    """`git ls-files | xargs wc -l`: everything outside results/ at least as many lines as results/."""
    data = code = 0
    for name in tracked():
        path = REPO_ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        lines = path.read_bytes().count(b"\n")
        if name.startswith("results/"):
            data += lines
        else:
            code += lines
    assert code >= data, f"{data} lines of run data under results/ against {code} of code and docs: pack runs and sessions (kopt pack)"


@pytest.mark.parametrize("script", sorted((REPO_ROOT / "tools").glob("*.sh")), ids=lambda p: p.name)
def test_device_scripts_parse_and_name_files_that_exist(script: Path) -> None:
    """A device script is run where a mistake costs device time: it parses, and every repository
    file it sources or runs (tools/..., benchmarks/..., kernels/...) is there."""
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    named = set(re.findall(r"\b((?:tools|benchmarks|kernels|tests)/[\w./-]+\.(?:sh|py))\b", text))
    missing = sorted(path for path in named if not (REPO_ROOT / path).exists())
    assert not missing, f"{script.name} names files that are not in the repository: {missing}"
