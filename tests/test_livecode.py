"""Live code only (pytest_kopt/livecode.py): knob branches folded and unreachable definitions dropped by text edits,
comments and layout of what survives kept; and never a change of what the kept code computes."""

from __future__ import annotations

import ast
import textwrap

import pytest

from pytest_kopt.livecode import live


def family(knobs: str, body: str) -> str:
    return f'''"""doc"""

# kopt:knobs-begin
KNOBS = {knobs}
# kopt:knobs-end
SPACE = {{}}
{textwrap.dedent(body)}'''


def run(source: str, *args):
    namespace: dict = {}
    exec(compile(source, "<candidate>", "exec"), namespace)  # noqa: S102 - the tests' own sources
    return namespace["kernel"](*args)


BRANCHES = '''

def kernel(x):
    # before the branch
    if KNOBS["mode"] == "a":
        y = x + 1  # a
        if KNOBS["n"] > 2:
            y = y * 2
    elif KNOBS["mode"] == "b":
        y = x - 1
    else:
        y = 0
    return y
'''


@pytest.mark.parametrize("mode, n, kept, gone", [
    ("a", 3, ["y = x + 1  # a", "    y = y * 2"], ["elif", "else", "x - 1", "KNOBS[\"mode\"] =="]),
    ("a", 1, ["y = x + 1  # a"], ["y * 2", "elif", "x - 1"]),
    ("b", 3, ["    y = x - 1"], ["x + 1", "y = 0", "if "]),
    ("c", 3, ["    y = 0"], ["x + 1", "x - 1", "if "]),
])
def test_static_branches_fold_to_the_one_taken(mode, n, kept, gone):
    source = family(f'{{"mode": "{mode}", "n": {n}}}', BRANCHES)
    out = live(source)
    for text in kept:
        assert text in out, out
    for text in gone:
        assert text not in out.split("def kernel")[1], out
    assert "# before the branch" in out
    assert [run(out, x) for x in range(-2, 3)] == [run(source, x) for x in range(-2, 3)]
    ast.parse(out)
    assert live(out) == out


def test_elif_chains_with_a_dynamic_head_keep_it():
    body = '''

    def kernel(x):
        if x > 0:
            return 1
        elif KNOBS["m"] == 1:  # always false here
            return 2
        elif KNOBS["m"] == 0:
            return 3
        elif x < -5:
            return 4
        return 5
    '''
    source = family('{"m": 0}', body)
    out = live(source)
    assert "return 2" not in out and "return 4" not in out and "elif" not in out
    assert "else:\n        return 3" in out
    assert [run(out, x) for x in range(-8, 3)] == [run(source, x) for x in range(-8, 3)]


def test_static_operands_leave_a_test_and_conditional_expressions_fold():
    body = '''

    def kernel(x):
        if KNOBS["on"] and x > 0 and (KNOBS["n"] == 2 or x < -1):
            y = 1
        else:
            y = 2
        z = (10 if KNOBS["on"] else 20) + (x if not KNOBS["on"] else 0)
        w = 3 if not KNOBS["on"] and x > 100 else 4
        u = 5 if KNOBS["on"] and x > 1 else 6
        return y, z, w, u
    '''
    source = family('{"on": True, "n": 2}', body)
    out = live(source)
    assert "if x > 0:" in out and "z = 10 + 0" in out and "w = 4" in out and "u = 5 if x > 1 else 6" in out, out
    assert [run(out, x) for x in range(-3, 3)] == [run(source, x) for x in range(-3, 3)]


def test_a_test_decided_only_after_a_call_keeps_the_call():
    body = '''

    def kernel(x):
        calls = []
        if calls.append(x) or KNOBS["on"]:
            return len(calls)
        return -1
    '''
    source = family('{"on": True}', body)
    assert live(source) == source  # dropping the call would change what runs


def test_checks_stay_as_written():
    body = '''

    def kernel(x):
        if KNOBS["n"] not in (1, 2):
            raise ValueError("n")
        if x < 0:
            raise ValueError("x")
        return x
    '''
    source = family('{"n": 1}', body)
    assert live(source) == source


def test_knobs_through_aliases_and_constants():
    body = '''

    def _plan(knobs, x):
        n = int(knobs["n"])
        wide = n > 2
        if wide:
            return x * n
        return x + n


    def kernel(x):
        K = KNOBS
        if K.get("flag", False):
            return 0
        return _plan(KNOBS, x)
    '''
    source = family('{"n": 3}', body)
    out = live(source)
    assert "if wide" not in out and "wide =" not in out and "K = KNOBS" not in out and "return 0" not in out, out
    assert "return x * n" in out and "return x + n" not in out
    assert run(out, 5) == run(source, 5) == 15


def test_a_parameter_some_call_gives_another_dict_is_not_knobs():
    body = '''

    def _pick(knobs):
        if knobs["n"] == 3:
            return "three"
        return "other"


    def kernel(x):
        return _pick(KNOBS), _pick({"n": x})
    '''
    source = family('{"n": 3}', body)
    assert live(source) == source
    assert run(source, 4) == ("three", "other")


@pytest.mark.parametrize("write", ['KNOBS["n"] = 4', "KNOBS.update(n=4)", "_set(KNOBS)"])
def test_a_file_that_writes_into_knobs_is_not_folded(write):
    body = f'''

    def _set(d):
        d["n"] = 4


    def kernel(x):
        {write}
        if KNOBS["n"] == 3:
            return 1
        return 2
    '''
    source = family('{"n": 3}', body)
    out = live(source)
    assert 'if KNOBS["n"] == 3' in out
    assert run(out, 0) == run(source, 0) == 2


def test_unreachable_definitions_and_imports_go_with_their_comments():
    body = '''
    import math
    from typing import Any, Callable

    LIMIT = 3
    UNUSED = 4


    # only the slow path uses this
    def _slow(x: Any):
        return math.sqrt(x)


    def _fast(x):
        return x * LIMIT


    def kernel(x):
        if KNOBS["fast"]:
            return _fast(x)
        return _slow(x)
    '''
    source = family('{"fast": True}', body)
    out = live(source)
    assert "_slow" not in out and "only the slow path" not in out and "UNUSED" not in out and "import math" not in out
    assert "from typing import" not in out  # Any was used only by _slow
    assert "LIMIT = 3" in out and "\n\n\n\n" not in out and not out.endswith("\n\n")
    assert run(out, 2) == 6
    slow = live(family('{"fast": False}', body))
    assert "_fast" not in slow and "LIMIT" not in slow and "import math" in slow and "from typing import Any\n" in slow


def test_a_file_without_kernel_is_not_pruned():
    source = family('{"a": 1}', "\n\ndef helper():\n    return 1\n")
    assert live(source) == source


def test_multiline_headers_strings_and_an_emptied_block():
    body = '''

    def kernel(x):
        for i in range(2):
            if (KNOBS["a"]
                    == 1):
                x += 1
        if KNOBS["a"] == 1:
            s = """line one
    line two"""
        else:
            s = ""
        return x, s
    '''
    source = family('{"a": 2}', body)
    out = live(source)
    assert "for i in range(2):\n        pass\n" in out
    assert run(out, 1) == run(source, 1) == (1, "")
    one = live(family('{"a": 1}', body))
    assert run(one, 1) == (3, "line one\nline two"), one


def test_a_local_holding_a_list_from_the_knobs_is_not_a_constant():
    body = '''

    def kernel(x):
        sizes = KNOBS["sizes"]
        sizes.append(x)
        if len(sizes) > 2:
            return "grown"
        return "as given"
    '''
    source = family('{"sizes": [1, 2]}', body)
    assert live(source) == source
    assert run(source, 3) == "grown"
