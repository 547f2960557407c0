"""Kernel families: KNOBS/SPACE read without importing, candidates rendered by replacing one block and reducing the
text to live code; a family may be a folder of stage files joined into one candidate."""

from __future__ import annotations

import ast

import pytest

from pytest_kopt.families import FamilyError, family_names, join_folder, load_family, parse_family, render
from pytest_kopt.judge.policy import check_source
from pytest_kopt.tools import candidate_id

FAMILY = '''"""doc"""
import math

# kopt:knobs-begin
KNOBS = {"BV": 32, "num_warps": 4, "fuse": False}
# kopt:knobs-end
SPACE = {"BV": [16, 32, 64], "num_warps": [1, 2, 4, 8], "fuse": [False, True]}


def kernel(x):
    return math.floor(KNOBS["BV"] * x)
'''

REPO_FAMILIES = family_names()
BASELINE_FAMILIES = ["kda_recurrent", "mla_naive"]  # the problems' baselines: live code as written


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
    rendered = fam.render({})
    if name in BASELINE_FAMILIES:  # the search agent's first candidate is the baseline file itself
        assert rendered == fam.source
    assert parse_family(rendered, name).render({}) == rendered  # a rendered candidate is live code already
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


def test_repository_folders_are_listed_and_loaded():
    assert "kda_chunked" in REPO_FAMILIES and "kda_recurrent" in REPO_FAMILIES and "__init__" not in REPO_FAMILIES
    fam = load_family("kda_chunked")
    assert fam.path.is_dir() and fam.name == "kda_chunked" and fam.knobs and fam.space


STAGES = {
    "__init__.py": '''"""The toy family: one kernel in two stages."""

from . import knobs, math_stage, host  # noqa: F401
''',
    "knobs.py": '''"""Its knobs."""

# kopt:knobs-begin
KNOBS = {"scale": 2, "fast": True}
# kopt:knobs-end
SPACE = {"scale": [1, 2], "fast": [True, False]}
''',
    "math_stage.py": '''"""Device math."""

import math
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2


def _slow(x):
    return math.floor(x)
''',
    "host.py": '''"""Host."""

import torch
import triton

from .knobs import KNOBS
from .math_stage import _slow, _twice  # noqa: F401


def kernel(x):
    if KNOBS["fast"]:
        return x * KNOBS["scale"]
    return _slow(x)
''',
}


def toy_folder(tmp_path, **changes):
    folder = tmp_path / "toy"
    folder.mkdir()
    for name, text in {**STAGES, **changes}.items():
        if text is not None:
            (folder / name).write_text(text)
    return folder


def test_a_folder_joins_into_one_candidate(tmp_path):
    folder = toy_folder(tmp_path)
    joined = join_folder(folder)
    assert joined.startswith('"""The toy family: one kernel in two stages."""\n\nimport math\nimport torch\nimport triton\n'
                             "import triton.language as tl\n\n\n# -- knobs.py ")
    order = [joined.index(f"# -- {stage}.py ") for stage in ("knobs", "math_stage", "host")]
    assert order == sorted(order) and "# Device math." in joined
    assert "from ." not in joined and joined.count("import triton\n") == 1
    ast.parse(joined)
    fam = load_family(folder)
    assert fam.name == "toy" and fam.knobs == {"scale": 2, "fast": True} and fam.source == joined
    assert load_family("toy", tmp_path).source == joined
    assert family_names(tmp_path) == ["toy"]
    fast = fam.render({})
    assert "_slow" not in fast and "import math" not in fast and "_twice" not in fast and "x * KNOBS" in fast
    slow = fam.render({"fast": False})
    assert "def _slow" in slow and "import math" in slow and "x * KNOBS" not in slow
    namespace: dict = {}
    exec(compile(slow, "toy", "exec"), namespace)  # noqa: S102 - the test's own source
    assert namespace["kernel"](2.5) == 2


def test_a_folder_takes_a_sibling_familys_stages(tmp_path):
    """``from ..toy import knobs, math_stage`` takes those stages as they are (one knobs block: the sibling's), the
    family's own entry beside them; a name defined twice, a stage named twice or an alias are refused."""
    toy_folder(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "__init__.py").write_text('"""Another entry on toy\'s stages."""\n\nfrom ..toy import knobs, math_stage\nfrom . import entry\n')
    (other / "entry.py").write_text('"""Its entry."""\n\nfrom .knobs import KNOBS\nfrom .math_stage import _slow\n\n\n'
                                    'def kernel(x, y):\n    return _slow(x + y) * KNOBS["scale"]\n')
    fam = load_family(other)
    assert fam.knobs == {"scale": 2, "fast": True} and "# -- toy/knobs.py " in fam.source and "# -- entry.py " in fam.source
    namespace: dict = {}
    exec(compile(fam.render({"scale": 1}), "other", "exec"), namespace)  # noqa: S102 - the test's own source
    assert namespace["kernel"](1.5, 1.0) == 2
    for init, message in [("from ..toy import knobs, math_stage, host\nfrom . import entry\n", "kernel is defined in stage host"),
                          ("from ..toy import knobs\nfrom . import knobs\n", "names stage 'knobs' twice"),
                          ("from ..toy import knobs as k\n", "under its own name"),
                          ("from ..toy.sub import knobs\n", "'from ..<family> import' only")]:
        (other / "__init__.py").write_text('"""doc"""\n\n' + init)
        with pytest.raises(FamilyError, match=message):
            load_family(other)


@pytest.mark.parametrize("changes, message", [
    ({"__init__.py": '"""doc"""\n'}, "no 'from . import"),
    ({"__init__.py": "from . import knobs, host\n"}, "docstring"),
    ({"math_stage.py": None}, "math_stage.py is not in the folder"),
    ({"host.py": STAGES["host.py"].replace("_slow, _twice", "_slow, _gone")}, "imports _gone from stage math_stage"),
    ({"host.py": STAGES["host.py"].replace("from .knobs", "from ..knobs")}, "another stage of the family only"),
    ({"host.py": STAGES["host.py"] + "\n\ndef _twice(x):\n    return x\n"}, "_twice is defined in stage math_stage"),
    ({"host.py": STAGES["host.py"] + "\ndef broken(:\n"}, "not valid Python"),
])
def test_malformed_folders_say_what_is_wrong(tmp_path, changes, message):
    folder = toy_folder(tmp_path, **changes)
    with pytest.raises(FamilyError, match=message):
        load_family(folder)


def test_the_search_agent_reads_a_folder_family():
    """The KDA problem's families, the folder among them: the search agent loads both, starts with the baseline file
    itself (a live family renders to itself) and measures the folder's defaults next."""
    from pytest_kopt.agents.search import SearchAgent
    from pytest_kopt.problems import get_problem

    agent = SearchAgent(problem=get_problem("kda"))
    assert set(agent.families) == {"kda_recurrent", "kda_chunked"} and not agent.load_notes
    first = agent.next_action()
    assert first.tool == "write_candidate" and first.args["notes"].endswith("[baseline]")
    assert first.args["source"] == agent.baseline_source
    agent.observe(first, {"verdict": "fail", "reasons": ["pretend"]})
    second = agent.next_action()
    assert second.args["strategy"] == "kda_chunked" and second.args["source"] == load_family("kda_chunked").render({})


# ---- kopt render ----------------------------------------------------------------------------------------------------
def _promoted(tmp_path, monkeypatch, knobs):
    """A kernels/ folder holding the toy family and a best rendered from it with ``knobs``, as the command reads them."""
    import json

    from pytest_kopt import families

    (tmp_path / "families").mkdir()
    (tmp_path / "families" / "toy.py").write_text(FAMILY)
    (tmp_path / "best").mkdir()
    text = load_family("toy", tmp_path / "families").render(knobs)
    (tmp_path / "best" / "toy-problem.py").write_text(text)
    record = {"problem": "toy-problem", "candidate_id": candidate_id(text), "family": "toy", "knobs": knobs}
    (tmp_path / "best" / "toy-problem.json").write_text(json.dumps(record))
    monkeypatch.setattr(families, "KERNELS_DIR", tmp_path)
    monkeypatch.setattr(families, "FAMILIES_DIR", tmp_path / "families")
    return tmp_path / "best" / "toy-problem.py", text


def test_kopt_render_writes_a_family_with_knobs_and_says_its_id(tmp_path, monkeypatch, capsys):
    from pytest_kopt.cli import main

    _promoted(tmp_path, monkeypatch, {"BV": 64})
    out = tmp_path / "candidate.py"
    assert main(["render", "toy", "--knobs", '{"fuse": true}', "--out", str(out)]) == 0
    assert out.read_text() == load_family("toy", tmp_path / "families").render({"fuse": True})
    assert f"candidate {candidate_id(out.read_text())}" in capsys.readouterr().out
    # --best: the promoted kernel's family and knobs, overridden by --knobs
    assert main(["render", "--best", "toy-problem", "--knobs", '{"num_warps": 8}', "--out", str(out)]) == 0
    assert out.read_text() == load_family("toy", tmp_path / "families").render({"BV": 64, "num_warps": 8})


def test_kopt_render_check_finds_a_best_its_family_no_longer_renders(tmp_path, monkeypatch, capsys):
    from pytest_kopt.cli import main

    best, text = _promoted(tmp_path, monkeypatch, {"BV": 16})
    assert main(["render", "--best", "toy-problem", "--check"]) == 0
    assert candidate_id(text) in capsys.readouterr().out
    # the family edited under the best: the check fails and shows where
    family_file = tmp_path / "families" / "toy.py"
    family_file.write_text(family_file.read_text().replace("math.floor", "math.ceil"))
    assert main(["render", "--best", "toy-problem", "--check"]) == 1
    shown = capsys.readouterr().out
    assert "is not toy rendered with its knobs" in shown and "+    return math.ceil" in shown
    assert best.read_text() == text  # a check writes nothing


@pytest.mark.parametrize("argv, message", [
    (["render"], "name a family or --best"),
    (["render", "toy", "--best", "toy-problem"], "name a family or --best"),
    (["render", "toy", "--knobs", "{bad"], "--knobs is not JSON"),
    (["render", "toy", "--knobs", "[1]"], "must be a JSON object"),
    (["render", "toy", "--knobs", '{"NOPE": 1}'], "has no knob"),
    (["render", "missing"], "no family file"),
    (["render", "--best", "absent"], "cannot read"),
    (["render", "--best", "toy-problem", "--check", "--knobs", '{"BV": 32}'], "--check takes --best PROBLEM alone"),
    (["render", "toy", "--out", "{tmp}"], "cannot write"),  # a folder where the file would go
])
def test_kopt_render_refuses_bad_input_with_a_reason(tmp_path, monkeypatch, capsys, argv, message):
    from pytest_kopt.cli import main

    _promoted(tmp_path, monkeypatch, {})
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == 2
    assert message in capsys.readouterr().err


def test_kopt_render_check_holds_for_every_repository_best(capsys):
    """The command agrees with tests/test_best_kernels.py: every promoted kernel with a family is its render."""
    import json

    from pytest_kopt import KERNELS_DIR
    from pytest_kopt.cli import main

    for record in sorted((KERNELS_DIR / "best").glob("*.json")):
        if json.loads(record.read_text()).get("family"):
            assert main(["render", "--best", record.stem, "--check"]) == 0, capsys.readouterr().out


def test_kopt_render_best_needs_a_family_in_its_provenance(tmp_path, monkeypatch, capsys):
    """A promoted kernel written by hand (its JSON names no family) has no render to compare or write."""
    import json

    from pytest_kopt.cli import main

    _promoted(tmp_path, monkeypatch, {})
    (tmp_path / "best" / "toy-problem.json").write_text(json.dumps({"problem": "toy-problem", "candidate_id": "0" * 12}))
    assert main(["render", "--best", "toy-problem", "--check"]) == 2
    assert "names no family and knobs" in capsys.readouterr().err
