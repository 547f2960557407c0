"""CI correctness gate: every kernel promoted into kernels/best/ (file stem = problem name), and
every problem's baseline candidate, matches its reference on hypothesis shapes, so a kernel
that regresses in correctness fails the plain ``pytest`` run. On a machine without a GPU the
kernels run on the Triton CPU interpreter (the repository conftest switches it on); on a GPU
they run natively, on more and larger cases. See docs/reports.md for adding this to your CI.

The second half shows the gate bites: known-good kernels copied, broken on purpose, rejected. The last part holds
every promoted kernel with a provenance file (kernels/best/<problem>.json) to its family's render.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from pytest_kopt.families import load_family
from pytest_kopt.gate import BEST_DIR, KernelIncorrect, best_kernels, check_kernel
from pytest_kopt.problems import available_problems, get_problem


def gated() -> list:
    kernels = [pytest.param(name, path, id=f"best/{path.name}") for name, path in best_kernels()]
    for name in available_problems():  # so the gate is never vacuous, even before anything is promoted
        path = get_problem(name).baseline_candidate_path
        kernels.append(pytest.param(name, path, id=f"baseline/{name}/{path.name}"))
    return kernels


@pytest.mark.parametrize(("problem", "path"), gated())
def test_kernel_matches_reference(problem, path):
    check_kernel(problem, path)


def test_every_best_kernel_names_a_problem():
    known = set(available_problems())
    for name, path in best_kernels():
        assert name in known, f"{path}: kernels/best/<problem>.py must be named after a problem (- may be written _): {sorted(known)}"


KDA_BASELINE = get_problem("kda").baseline_candidate_path

# (the line as written, the broken line, what the gate must report): bugs kernel edits really make.
BREAKAGES = [
    # the last key channel is dropped: wrong on every case, the smoke case included
    pytest.param(r"offs_k < K\b", "offs_k < K - 1", r"^kda B1 T32 H2 K32 V32 .*seed=0 on cpu: o: relative RMS error", id="off-by-one-mask"),
    # a 5% too large query scale: o is 5% off everywhere
    pytest.param(r"\* scale\b", "* scale * 1.05", r"^kda .*: o: relative RMS error 0\.05", id="wrong-scale"),
    # every V-block writes block 0: right while V fits in one block (the smoke case, V=32=BV) and
    # wrong beyond, so only a hypothesis shape with V=64 can catch it
    pytest.param(r"offs_v = iv \* BV \+ ", "offs_v = ", r"^kda B\d+ T\d+ H\d+ K\d+ V64\b.*: o: ", id="block-offset-lost"),
]


@pytest.mark.parametrize(("pattern", "broken", "reported"), BREAKAGES)
def test_gate_fails_a_broken_copy(tmp_path, pattern, broken, reported):
    copy = tmp_path / "kda.py"
    shutil.copy(KDA_BASELINE, copy)
    source = copy.read_text()
    assert re.search(pattern, source), f"{KDA_BASELINE} no longer has {pattern!r}: update this breakage"
    copy.write_text(re.sub(pattern, broken, source, count=1))
    with pytest.raises(KernelIncorrect) as failure:
        check_kernel("kda", copy, device="cpu", max_examples=12)
    assert re.search(reported, str(failure.value)), str(failure.value)


# ---- provenance: a promoted kernel is its family rendered with its knobs ----------------------------------------
PROVENANCE_KEYS = {"problem", "candidate_id", "family", "knobs", "run", "commit", "machine", "metric", "figures",
                   "promoted_at", "note"}


@pytest.mark.parametrize("record", sorted(BEST_DIR.glob("*.json")), ids=lambda p: p.name)
def test_every_best_with_provenance_is_its_family_re_rendered(record):
    """kernels/best/<problem>.json names the run, candidate, family and knobs a promoted kernel came from; the family
    rendered with those knobs today gives back kernels/best/<problem>.py byte for byte (a drifted best, or a family
    edited under a best, fails here)."""
    data = json.loads(record.read_text())
    assert PROVENANCE_KEYS <= set(data), sorted(PROVENANCE_KEYS - set(data))
    best = record.with_suffix(".py")
    assert best.is_file(), f"{record.name} describes {best.name}, which is missing"
    assert data["problem"] in available_problems() and best.stem in (data["problem"], data["problem"].replace("-", "_"))
    assert set(data["figures"]) == {"eager", "device", "graph"} and data["metric"] in data["figures"]
    assert data["figures"][data["metric"]] is not None and data["machine"]["gpu"]
    assert data["family"] in get_problem(data["problem"]).families
    assert load_family(data["family"]).render(data["knobs"]) == best.read_text(), (
        f"{best} is not {data['family']} rendered with its knobs: re-render it (or record the knobs it was made with)")
