"""Kernel families: KNOBS/SPACE read without importing, candidates rendered by replacing one block."""

from __future__ import annotations

import ast

import pytest

from pytest_kopt.families import FAMILIES_DIR, FamilyError, load_family, parse_family, render
from pytest_kopt.judge.policy import check_source
from pytest_kopt.tools import candidate_id

FAMILY = '''"""doc"""
import math

# kopt:knobs-begin
KNOBS = {"BV": 32, "num_warps": 4, "fuse": False}
# kopt:knobs-end
SPACE = {"BV": [16, 32, 64], "num_warps": [1, 2, 4, 8], "fuse": [False, True]}


def kernel(x):
    return KNOBS["BV"] * x
'''

REPO_FAMILIES = sorted(p.stem for p in FAMILIES_DIR.glob("*.py") if p.name != "__init__.py")


def test_parse_reads_defaults_and_space_without_importing():
    fam = parse_family(FAMILY, "toy")
    assert fam.knobs == {"BV": 32, "num_warps": 4, "fuse": False}
    assert fam.space["num_warps"] == [1, 2, 4, 8]
    assert fam.size() == 3 * 4 * 2
    combos = list(fam.combinations())
    assert len(combos) == fam.size() and len({tuple(c.items()) for c in combos}) == fam.size()


def test_try_early_lists_overrides_inside_the_space():
    assert parse_family(FAMILY, "toy").try_early == ()
    fam = parse_family(FAMILY + 'TRY_EARLY = [{"BV": 64}, {"fuse": True, "num_warps": 8}]\n', "toy")
    assert fam.try_early == ({"BV": 64}, {"fuse": True, "num_warps": 8})


def test_requires_names_the_combinations_a_family_refuses():
    fam = parse_family(FAMILY + 'REQUIRES = [({"fuse": True, "num_warps": [1, 2]}, {"BV": [16, 32]})]\n', "toy")
    assert fam.refusal({}) is None and fam.refusal({"fuse": True}) is None  # num_warps 4: the rule is off
    assert fam.refusal({"fuse": True, "num_warps": 2}) is None  # BV 32 is allowed
    reason = fam.refusal({"fuse": True, "num_warps": 1, "BV": 64})
    assert reason and "'BV': 64" in reason
    assert parse_family(FAMILY, "toy").requires == ()


def test_default_knobs_render_the_file_unchanged():
    fam = parse_family(FAMILY, "toy")
    assert render(fam, {}) == FAMILY
    assert fam.render(dict(fam.knobs)) == FAMILY


def test_render_replaces_only_the_block():
    fam = parse_family(FAMILY, "toy")
    out = fam.render({"BV": 64, "fuse": True})
    again = parse_family(out, "toy")
    assert again.knobs == {"BV": 64, "num_warps": 4, "fuse": True}
    assert again.space == fam.space
    before, after = FAMILY.splitlines(), out.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == 1 and after[changed[0]].startswith("KNOBS = ")
    ast.parse(out)


def test_every_combination_renders_a_distinct_candidate():
    fam = parse_family(FAMILY, "toy")
    ids = {candidate_id(fam.render(k)) for k in fam.combinations()}
    assert len(ids) == fam.size()


def test_unknown_knob_is_refused_with_the_known_ones():
    fam = parse_family(FAMILY, "toy")
    with pytest.raises(FamilyError, match="no knob.*BLOCK.*has BV, num_warps, fuse"):
        fam.render({"BLOCK": 1})


@pytest.mark.parametrize(
    "text, message",
    [
        (FAMILY.replace("# kopt:knobs-end\n", ""), "exactly one"),
        (FAMILY.replace("# kopt:knobs-begin\n", "# kopt:knobs-begin\n# kopt:knobs-begin\n"), "exactly one"),
        (FAMILY.replace('"fuse": [False, True]', '"fuse": [False, True], "BK": [1]'), "BK"),
        (FAMILY.replace('"num_warps": [1, 2, 4, 8]', '"num_warps": []'), "non-empty"),
        (FAMILY.replace('KNOBS = {"BV": 32,', 'KNOBS = {"BV": int("32"),'), "literal"),
        (FAMILY.replace("SPACE = ", "OTHER = "), "SPACE"),
        (FAMILY.replace("def kernel(x):", "def kernel(x)"), "not valid Python"),
        (FAMILY + 'TRY_EARLY = [{"BV": 128}]\n', "TRY_EARLY sets BV=128"),
        (FAMILY + 'TRY_EARLY = [{"BK": 16}]\n', "TRY_EARLY sets BK=16"),
        (FAMILY + 'TRY_EARLY = {"BV": 16}\n', "list of knob dicts"),
        (FAMILY + 'REQUIRES = [({"BK": 1}, {"BV": [16]})]\n', "REQUIRES names 'BK'"),
        (FAMILY + 'REQUIRES = [({"fuse": True}, {"BV": 16})]\n', "must be lists"),
        (FAMILY + 'REQUIRES = [{"fuse": True}]\n', "pair of dicts"),
    ],
)
def test_malformed_families_say_what_is_wrong(text, message):
    with pytest.raises(FamilyError, match=message):
        parse_family(text, "bad")


def test_load_by_name_or_path(tmp_path):
    (tmp_path / "toy.py").write_text(FAMILY)
    assert load_family("toy", tmp_path).knobs["BV"] == 32
    assert load_family(tmp_path / "toy.py").name == "toy"
    with pytest.raises(FamilyError, match="no family file"):
        load_family("missing", tmp_path)


@pytest.mark.parametrize("name", REPO_FAMILIES)
def test_repository_families_follow_the_contract(name):
    """Every family in kernels/families parses, its defaults lie in its space, and it renders."""
    fam = load_family(name)
    assert fam.space, f"{name} has an empty SPACE"
    for knob, choices in fam.space.items():
        assert fam.knobs[knob] in choices, f"{name}: default {knob}={fam.knobs[knob]!r} is not one of {choices}"
    assert fam.render({}) == fam.source
    for knobs in [{}, *fam.try_early]:  # what the search measures first is never refused by the family itself
        assert fam.refusal(knobs) is None, (name, knobs, fam.refusal(knobs))
        # nor by the judge's policy (session 11: an import form the policy refused failed every rendered candidate)
        report = check_source(fam.render(knobs))
        assert report.ok, (name, knobs, report.reasons)
    first_other = next((k for k in fam.combinations() if k != fam.knobs), None)
    if first_other is None:
        return  # a single-point space: nothing else to render
    rendered = fam.render(first_other)
    assert parse_family(rendered, name).knobs == first_other
    compile(rendered, f"{name}.py", "exec")
