"""kernels/families/mla_decode_paged/: the dense MLA decode through mla_paged's stages, on the CPU interpreter.

The family is mla_paged's stages as they are plus a dense entry (the dense cache as pages in order); these tests
hold the entry to the ``mla`` problem's float64 reference at both page layouts (64-token pages where kv is
contiguous and Skv a multiple of 64, one page a sequence otherwise), to its plan being made once per shape, and to
clear errors for what it cannot take. The stages themselves are tested in test_mla_paged_family.py.
"""

from __future__ import annotations

import pytest
import torch
from family_modules import CANDIDATE_IMPORTS, import_rendered, imported_modules
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt.families import load_family
from pytest_kopt.problems.mla import MLA

FAMILY = load_family("mla_decode_paged")
PAGED = load_family("mla_paged")
SMALL = {"CONFIG": "knobs", "BLOCK_H": 16, "BLOCK_N": 16, "KEYS_AS_M": True, "QK_SPLIT": False, "num_warps": 4, "KV_LOAD": "pointer"}
_RENDERED: dict = {}


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mla_decode_paged")


def render(knobs: dict, tmp_dir):
    key = tuple(sorted(knobs.items()))
    if key not in _RENDERED:
        _RENDERED[key] = import_rendered(FAMILY, knobs, tmp_dir)
    return _RENDERED[key]


def check(kernel, inputs):
    o, lse = kernel(**inputs)
    errors = MLA.compare((o, lse), MLA.reference(**inputs))
    assert all(e.ok for e in errors), [e.reason for e in errors if not e.ok]


def test_the_family_is_mla_paged_with_a_dense_entry():
    """The same knobs and choices as mla_paged (one knobs block, taken from it), and its stages in the candidate."""
    assert FAMILY.knobs == PAGED.knobs and FAMILY.space == PAGED.space and FAMILY.try_early == PAGED.try_early
    headers = [line for line in FAMILY.source.splitlines() if line.startswith("# -- ")]
    assert [h.split()[2] for h in headers] == ["mla_paged/knobs.py", "mla_paged/tiles.py", "mla_paged/gluon_merge.py", "mla_paged/gluon_ws.py", "mla_paged/gluon_pair.py", "mla_paged/combine.py",
                                                "mla_paged/host.py", "dense.py"]
    assert "def kernel(q, kv, scale):" in FAMILY.render({}) and "def kernel(q, kv_cache" not in FAMILY.render({})
    assert imported_modules(FAMILY.source) <= CANDIDATE_IMPORTS


@settings(max_examples=6, deadline=None)
@given(case=MLA.case_strategy("cpu"), seed=st.integers(0, 2**31 - 1))
def test_matches_the_reference(tmp_dir, case, seed):
    check(render({}, tmp_dir).kernel, MLA.make_inputs(case, device="cpu", seed=seed))


@pytest.mark.parametrize("skv, contiguous, page", [(128, True, 64), (100, True, 100), (128, False, 128)])
def test_both_page_layouts(tmp_dir, skv, contiguous, page):
    """64-token pages in order where they can be; one page a sequence else (kv a view with a gap between rows here).
    Several parts over few tiles, so sequences split and merge; the second call reuses the table and the plan."""
    module = render(SMALL, tmp_dir)
    module._sm_count = lambda index: 6
    module._PLANS.clear()
    module._DENSE.clear()
    inputs = MLA.make_inputs({"B": 2, "Sq": 3, "H": 2, "Skv": skv}, device="cpu", seed=skv)
    if not contiguous:
        kv = torch.full((2, skv, 640), float("nan"), dtype=inputs["kv"].dtype)[..., :576]
        kv.copy_(inputs["kv"])
        inputs["kv"] = kv
    check(module.kernel, inputs)
    check(module.kernel, MLA.make_inputs({"B": 2, "Sq": 3, "H": 2, "Skv": skv}, device="cpu", seed=skv + 1) if contiguous else inputs)
    ((key, (plan, got_page, table, lengths, addresses)),) = module._DENSE.items()
    assert got_page == page and table.tolist() == torch.arange(2 * skv // page).view(2, -1).tolist()
    assert lengths.tolist() == [skv, skv] and addresses == (table.data_ptr(), lengths.data_ptr())
    assert list(module._PLANS.values()) == [plan]


@pytest.mark.parametrize("spoil, message", [
    (lambda i: {**i, "kv": i["kv"][..., :512]}, "kv must be"),
    (lambda i: {**i, "kv": i["kv"][:1]}, "q must be"),
    (lambda i: {**i, "q": i["q"][0]}, "q must be"),
    (lambda i: {**i, "kv": i["kv"][:, :2]}, "Sq <= Skv"),
    (lambda i: {**i, "kv": i["kv"].float()}, "dtype"),
])
def test_bad_inputs_raise_a_clear_value_error(tmp_dir, spoil, message):
    module = render({}, tmp_dir)
    inputs = MLA.make_inputs({"B": 2, "Sq": 3, "H": 2, "Skv": 40}, device="cpu", seed=0)
    module.kernel(**inputs)
    with pytest.raises(ValueError, match=message):
        module.kernel(**spoil(inputs))
