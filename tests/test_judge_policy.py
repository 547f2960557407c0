"""The judge's static policy: what it refuses, with a reason naming the line, and what it lets through."""

from __future__ import annotations

import keyword
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kopt import REPO_ROOT
from pytest_kopt.judge.policy import ALLOWED_IMPORTS, check_source

HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
JIT = "\n@triton.jit\ndef _k(x_ptr):\n    tl.store(x_ptr, tl.load(x_ptr))\n"


def candidate(host_body: str, extra_imports: str = "") -> str:
    """A candidate whose kernel(...) runs ``host_body`` (indented by us)."""
    body = "\n".join("    " + line for line in host_body.strip().splitlines())
    return HEADER + extra_imports + JIT + f"\n\ndef kernel(x, y, alpha):\n{body}\n"


REFUSED = {
    # third-party kernel libraries, by name
    "fla": (candidate("return x", "from fla.ops.kda import chunk_kda\n"), "third-party kernel libraries"),
    "flash_attn": (candidate("return x", "import flash_attn\n"), "third-party kernel libraries"),
    "flashinfer": (candidate("return x", "import flashinfer as fi\n"), "third-party kernel libraries"),
    "xformers": (candidate("return x", "from xformers.ops import memory_efficient_attention\n"), "third-party kernel libraries"),
    "flash_mla": (candidate("return x", "import flash_mla\n"), "third-party kernel libraries"),
    "deep_gemm": (candidate("return x", "import deep_gemm\n"), "third-party kernel libraries"),
    "cutlass": (candidate("return x", "import cutlass\n"), "third-party kernel libraries"),
    # the project's own code
    "reference": (candidate("return x", "from kernels.reference.kda import naive_recurrent_kda\n"), "project's own references"),
    "harness": (candidate("return x", "import pytest_kopt\n"), "project's own references"),
    # process and loader machinery
    "importlib": (candidate("return x", "import importlib\n"), "machinery"),
    "ctypes": (candidate("return x", "import ctypes\n"), "machinery"),
    "subprocess": (candidate("return x", "import subprocess\n"), "machinery"),
    "os.system": (candidate("os.system('true')\nreturn x", "import os\n"), "machinery"),
    "socket": (candidate("return x", "import socket\n"), "machinery"),
    "cpp_extension": (candidate("return x", "from torch.utils.cpp_extension import load_inline\n"), "only torch"),
    "load_inline attr": (candidate("m = torch.utils.cpp_extension.load_inline('m', '')\nreturn x"), "not allowed"),
    "__import__": (candidate("m = __import__('os')\nreturn x"), "__import__ is not allowed"),
    "eval": (candidate("return eval('x')"), "eval is not allowed"),
    "exec": (candidate("exec('y = x')\nreturn x"), "exec is not allowed"),
    "open": (candidate("open('result.json', 'w')\nreturn x"), "open is not allowed"),
    # torch math in host code
    "matmul": (candidate("return torch.matmul(x, y)"), "torch math"),
    "einsum": (candidate("return torch.einsum('ij,jk->ik', x, y)"), "torch math"),
    "bmm": (candidate("return x.bmm(y)"), "torch math"),
    "softmax": (candidate("return x.softmax(-1)"), "torch math"),
    "F.*": (candidate("return F.silu(x)", "import torch.nn.functional as F\n"), "only torch"),
    "sdpa": (candidate("return torch.nn.functional.scaled_dot_product_attention(x, y, y)"), "torch math"),
    "cumsum": (candidate("return torch.cumsum(x, 0)"), "torch math"),
    "from torch import": (candidate("return einsum('i,i->', x, y)", "from torch import einsum\n"), "torch math"),
    "@": (candidate("return x @ y"), "@ operator"),
    # computed names and reflection
    "getattr computed": (candidate("f = getattr(torch, 'ein' + 'sum')\nreturn f('i,i->', x, y)"), "computed attribute name"),
    "getattr literal": (candidate("f = getattr(torch, 'einsum')\nreturn f('i,i->', x, y)"), "not allowed"),
    "getattr by alias": (candidate("g = getattr\nreturn g(torch, 'mm')(x, y)"), "only be called directly"),
    "dunder": (candidate("return x.__class__.__dict__"), "no reflection on internals"),
    "frames": (candidate("def gen():\n    yield 1\ng = gen()\nreturn g.gi_frame.f_back"), "not allowed"),
    "private torch": (candidate("torch._C._set_grad_enabled(False)\nreturn x"), "private internals are not allowed"),
    # allowed modules re-export the rest of Python: every chain stops at its first link
    "torch.sys": (candidate("return torch.sys.modules['pytest_kopt']"), "not allowed"),
    "torch.os": (candidate("torch.os.system('true')\nreturn x"), "the module os"),
    "typing.sys": (candidate("return typing.sys.modules", "import typing\n"), "not allowed"),
    "dataclasses.builtins": (candidate("return dataclasses.builtins.open", "import dataclasses\n"), "the module builtins"),
    "dataclasses.inspect": (candidate("return dataclasses.inspect.stack()", "import dataclasses\n"), "the module inspect"),
    "triton time": (candidate("return triton.compiler.compiler.time.time()"), "not allowed"),
    "typing.operator": (candidate("return typing.operator.attrgetter('x')", "import typing\n"), "not allowed"),
    "getattr machinery": (candidate("return getattr(typing, 'sys')", "import typing\n"), "not allowed"),
    # the same links imported by name, read by a class pattern, a format field or a class made by type() (red team,
    # session 49)
    "from torch import sys": (candidate("return sys.modules", "from torch import sys\n"), "imports sys from torch"),
    "from typing import sys": (candidate("return x", "from typing import sys\n"), "imports sys from typing"),
    "from dataclasses import inspect": (candidate("return x", "from dataclasses import inspect\n"), "machinery too"),
    "from torch import ctypes": (candidate("return x", "from torch import ctypes\n"), "machinery too"),
    "match class pattern": (candidate("match torch:\n    case object(sys=s):\n        return s\nreturn x"), "class patterns"),
    "format attribute": (candidate("return '{0.sys}'.format(torch)"), "format field that reads an attribute"),
    "format item": (candidate("return '{0[0]}'.format(x)"), "format field that reads an attribute or an item"),
    "format nested spec": (candidate("return '{0:{1.sys}}'.format(1, torch)"), "format field"),
    "format computed": (candidate("t = '{0.sys}'\nreturn t.format(torch)"), "computed template"),
    "type with bases": (candidate("C = type('C', (torch.Tensor,), {})\nreturn x"), "type(name, bases, dict)"),
    "dunder string": (candidate("d = {'__torch_function__': None}\nreturn x"), "dunder names are internals"),
    # the second red team (session 49): a jit body is host Python too (``fn.fn``, the interpreter); ways around the
    # fence; patching through a name bound to an import, an item or a tensor's method name
    "torch in a jit body": (HEADER + "\n@triton.jit\ndef _k(x_ptr):\n    torch.load(x_ptr)\n\n\ndef kernel(x, y, alpha):\n"
                            "    return x\n", "torch inside a @triton.jit kernel"),
    "mro": (candidate("base = torch.Tensor.mro()[1]\nreturn base.subtract(x, y)"), "attribute mro is not allowed"),
    "super with arguments": (candidate("return super(torch.Tensor, x).subtract(y)"), "super(...) with arguments"),
    "map2_": (candidate("return x.map2_(x, y, lambda o, a, b: a + b)"), "attribute map2_ is not allowed"),
    "raw storage": (candidate("return bytes(x.untyped_storage())"), "attribute untyped_storage is not allowed"),
    "patch through a name": (candidate("return x") + "\nT = torch.Tensor\nT.detach = None\n", "assigning to T.detach"),
    "patch through an item": (candidate("return x") + "\nL = [torch.Tensor]\nL[0].detach = None\n", "only an attribute of a name"),
    "patch an output's method": (candidate("x.detach = lambda: y\nreturn x"), "detach is a tensor's"),
    # the third red team (session 49): private names through a name bound to an import; patching by any store
    "private through a name": (candidate("T = torch\nreturn T._C._VariableFunctions.rsub(x, y)"), "private internals"),
    "patch in a for target": (candidate("return x") + "\nfor torch.Tensor.data_ptr in [None]:\n    pass\n", "patching modules"),
    "patch in a comprehension": (candidate("return x") + "\nZ = [0 for torch.Tensor.detach in [None]]\n", "patching modules"),
    "patch in a with target": (candidate("return x") + "\nclass C:\n    pass\nwith C() as torch.Tensor.detach:\n    pass\n",
                               "patching modules"),
    "patch through a loop name": (candidate("return x") + "\nfor M in (torch,):\n    M.empty_like = None\n", "patching modules"),
    "delete a method": (candidate("return x") + "\ndel torch.Tensor.detach\n", "patching modules"),
    "torch submodule": (candidate("return torch.distributions.transforms.F.conv_tbc(x, y, y)"), "torch.distributions"),
    "torch submodule imported": (candidate("return x", "from torch import distributions\n"), "submodules other than torch.cuda"),
    "torch submodule import": (candidate("return x", "import torch.fx\n"), "not in the allow-list"),
    # the fourth red team (session 49): chains followed on the real objects, whatever their names
    "builtins under another name": (candidate("return enum.bltns.exec('1')", "import enum\n"), "is the module builtins"),
    "pkgutil under triton": (candidate("return tl.extra.pkgutil.resolve_name('torch._C:TensorBase.add')"), "is the module pkgutil"),
    "torch through torch.cuda": (candidate("return torch.cuda.torch.sparse.sampled_addmm(x, x, y)"), "is the module torch.sparse"),
    "re under typing": (candidate("return typing.stdlib_re.escape('x')", "import typing\n"), "is the module re"),
    "private dataclasses": (candidate("return dataclasses._FIELDS", "import dataclasses\n"), "private internals"),
    # the fifth red team (session 50): annotations are code, also as strings (typing evaluates them, and
    # functools.singledispatch's register does so at import); a return annotation was never read at all
    "return annotation": (candidate("return x") + "\ndef f() -> exec('1'):\n    pass\n", "exec is not allowed"),
    "string annotation": (candidate("return x") + "\ndef f(a: 'exec(1) or int'):\n    pass\n", "code typing may evaluate"),
    "string in a subscript annotation": (candidate("return x") + "\ndef f(a: list['exec(1)']):\n    pass\n", "exec is not allowed"),
    "string variable annotation": (candidate("return x") + "\nz: 'globals() or int' = 1\n", "globals is not allowed"),
    "singledispatch": (candidate("return x", "import functools\n") + "\nh = functools.singledispatch(len)\n", "singledispatch"),
    "singledispatch imported": (candidate("return x", "from functools import singledispatchmethod\n"), "singledispatchmethod"),
    # the sixth (session 50): attributes named by data, and private names further down a chain from self
    "update_wrapper": (candidate("return x", "import functools\n") + "\nclass C:\n    pass\n"
                       "functools.update_wrapper(C, torch, assigned=('sys',), updated=())\n", "update_wrapper"),
    "wraps imported": (candidate("return x", "from functools import wraps\n"), "imports wraps"),
    "private under self": (candidate("return x") + "\nclass C:\n    def f(self):\n        self.m = torch\n"
                           "        return self.m._C\n", "private internals"),
    # the seventh (session 51): a module passed on as a value (the chain check followed an import's own name only),
    # getattr's literal names checked against a shorter list than attributes written out, classes made from data
    "module bound to a name": (candidate("E = enum\nreturn E.bltns.exec('1')", "import enum\n"), "the module enum is used as a value"),
    "module by walrus": (candidate("return (E := enum).bltns.exec('1')", "import enum\n"), "the module enum is used as a value"),
    "module as a default": (candidate("return x", "import enum\n") + "\ndef f(m=enum):\n    return m.bltns\n",
                            "the module enum is used as a value"),
    "module in a list": (candidate("return [enum][0].bltns.exec('1')", "import enum\n"), "the module enum is used as a value"),
    "module as a match subject": (candidate("match enum:\n    case M:\n        return M.bltns.exec('1')", "import enum\n"),
                                  "the module enum is used as a value"),
    "module in a comprehension's first iterable": (candidate("return [m.bltns for m in [enum]]", "import enum\n"),
                                                   "the module enum is used as a value"),
    "submodule as a value": (candidate("lang = triton.language\nreturn x"), "the module triton.language is used as a value"),
    "getattr of a fence escape": (candidate("return getattr(torch.Tensor, 'mro')()[1].mul(x, y)"), "attribute mro is not allowed"),
    "getattr of a module": (candidate("return getattr(enum, 'bltns').exec('1')", "import enum\n"), "is the module builtins"),
    "make_dataclass": (candidate("return x", "import dataclasses\n") + "\nC = dataclasses.make_dataclass('C', [])\n",
                       "make_dataclass"),
    "Enum's functional API": (candidate("return x", "import enum\n") + "\nK = enum.Enum('K', [('a', 1)])\n", "functional API"),
    "a subclass's functional API": (candidate("return x", "import enum\n") + "\nclass K(enum.Enum):\n    pass\n"
                                    "\nJ = K('J', ['a'])\n", "functional API"),
    # the eighth (session 51): an import inside a function (its name was taken for the function's own variable), and
    # code the garbage collector runs at a moment of its choosing (a suspended generator's finally)
    "import in a function": (candidate("import enum as E\nM = E\nreturn M.bltns", ""), "top level of the file only"),
    "import in a class": (candidate("return x") + "\nclass C:\n    import enum\n", "top level of the file only"),
    "generator": (candidate("return x") + "\ndef g():\n    try:\n        yield\n    finally:\n        pass\n", "yield is not allowed"),
    "yield from": (candidate("return x") + "\ndef g():\n    yield from range(3)\n", "yield from is not allowed"),
    "coroutine": (candidate("return x") + "\nasync def g():\n    pass\n", "async def g is not allowed"),
    # the ninth (session 51): special names bound by assignment, not def; kernel rebound
    "__del__ bound in a class": (candidate("return x") + "\nclass C:\n    __del__ = print\n", "binding __del__"),
    "__getattr__ bound at the top": (candidate("return x") + "\n__getattr__ = print\n", "binding __getattr__"),
    "__torch_function__ bound": (candidate("return x") + "\nclass T(torch.Tensor):\n    __torch_function__ = classmethod(print)\n",
                                 "binding __torch_function__"),
    "import as a special name": (candidate("return x", "from math import sqrt as __del__\n"), "importing as __del__"),
    "kernel deleted": (candidate("return x") + "\ndel kernel\n", "kernel may only be defined once"),
    "kernel rebound by global": (candidate("return x") + "\ndef f():\n    global kernel\n", "global kernel is not allowed"),
    # the tenth (session 51): a dataclass's __init__ called on an input stores its fields there
    "__init__ on another object": (candidate("Hooks.__init__(x, print)", "import dataclasses\n") +
                                   "\n@dataclasses.dataclass\nclass Hooks:\n    detach: object\n", "__init__ on anything but self"),
    # patching
    "patch allclose": (candidate("return x") + "\ntorch.allclose = lambda *a, **k: True\n", "patching modules"),
    "patch method": (candidate("return x") + "\ntorch.Tensor.copy_ = None\n", "patching modules"),
    # escape hatches
    "side stream": (candidate("with torch.cuda.stream(torch.cuda.Stream()):\n    return x"), "streams"),
    "torch.compile": (candidate("return torch.compile(lambda a: a)(x)"), "compilers"),
    "triton internals": (candidate("return x", "from triton.runtime import driver\n"), "only torch"),
    "relative import": (candidate("return x", "from . import helper\n"), "relative imports"),
    # Python would decode the file otherwise than the policy reads it (red team, session 49: a utf-7 file that the
    # policy read as an honest kernel ran a hidden one)
    "utf-7 file": ("# -*- coding: utf-7 -*-\n" + candidate("return x"), "declares the encoding 'utf-7'"),
    "latin-1 second line": ("#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n" + candidate("return x"), "latin-1"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_policy_refuses_with_a_reason_naming_the_line(name: str) -> None:
    source, expected = REFUSED[name]
    report = check_source(source)
    assert not report.ok, f"{name}: accepted"
    assert any(expected in reason for reason in report.reasons), report.reasons
    assert all(reason.startswith("line ") or "no " in reason for reason in report.reasons), report.reasons


@pytest.mark.parametrize("line", ["# -*- coding: utf-8 -*-", "# coding=utf8", "# coding: UTF-8"])
def test_a_utf8_declaration_and_plain_format_pass(line: str) -> None:
    source = line + "\n" + candidate("s = 'a {} {:>4} {name}'.format(1, 2, name=3)\nt = type(x)\nreturn x")
    assert check_source(source).ok, check_source(source).reasons


def test_a_name_that_shadows_a_module_in_its_own_scope_passes() -> None:
    """Only a module is refused as a value: a function's own variable of the same name (the mla bests' ``tma``, a
    flag beside the imported ``tma`` module), a parameter, a comprehension's target and an Enum's value lookup pass."""
    source = candidate("tma = x.is_contiguous()\nreturn x if tma else y", "from triton.experimental.gluon.language.nvidia.hopper import tma\n")
    source += "\nf = lambda enum: enum\nvalues = [enum for enum in range(3)]\n"
    source += "\nclass K(enum.Enum):\n    A = 1\n\nk = K(1)\n"
    source += "\nclass B:\n    def __init__(self):\n        self.n = 1\n\nclass D(B):\n    def __init__(self):\n"
    source += "        super().__init__()\n        B.__init__(self)\n"
    report = check_source(source.replace("import torch\n", "import torch\nimport enum\n", 1))
    assert report.ok, report.reasons


def test_the_offending_line_number_is_reported() -> None:
    source = candidate("a = x\nreturn torch.einsum('i,i->', a, y)")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "einsum" in text)
    assert check_source(source).reasons == [f"line {line}: torch.einsum: torch math is not allowed in host code; do the math in a @triton.jit kernel"]


def test_a_kernel_file_without_triton_jit_or_kernel_is_refused() -> None:
    no_jit = HEADER + "\ndef kernel(x, y, alpha):\n    return x\n"
    assert any("no @triton.jit" in r for r in check_source(no_jit).reasons)
    no_kernel = HEADER + JIT + "\ndef forward(x):\n    return x\n"
    assert any("no module-level kernel" in r for r in check_source(no_kernel).reasons)
    assert any("syntax error" in r for r in check_source("def kernel(:\n").reasons)


@pytest.mark.parametrize("path", ["kernels/families/kda_recurrent.py", "kernels/families/mla_naive.py", "tests/hostile/good_axpy.py"])
def test_baselines_pass_the_policy(path: str) -> None:
    report = check_source((REPO_ROOT / path).read_text())
    assert report.ok, report.reasons
    assert report.jit_functions


def test_triton_math_host_arithmetic_and_allowed_helpers_pass() -> None:
    source = HEADER + "import math\nfrom triton.language.extra import libdevice  # noqa\n" + """
@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def _k(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    s = tl.sum(tl.exp(x) * x, axis=0) + tl.dot(x[:, None] * 1.0, x[None, :] * 1.0).sum()
    tl.store(o_ptr, tl.sqrt(s))


def kernel(x, y, alpha):
    scale = 1.0 / math.sqrt(x.shape[-1]) if alpha is None else alpha
    out = torch.empty(1, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(x.numel(), 64),)
    _k[grid](x.contiguous().view(-1), out, x.numel())
    n = max(x.shape[0], 1) * 2 ** 3
    return out.reshape(1), scale, n
"""
    report = check_source(source)
    assert report.ok, report.reasons


@pytest.mark.parametrize("line, ok", [
    ("from triton.tools.tensor_descriptor import TensorDescriptor\n", True),
    ("import triton.tools.tensor_descriptor\n", True),
    ("from triton.tools import tensor_descriptor\n", True),  # the allowed module itself, imported by name
    ("from triton.tools import tensor_descriptor, disasm\n", False),
    ("from triton.tools.disasm import get_sass\n", False),
    ("import triton.tools\n", False),
])
def test_only_the_host_descriptor_is_allowed_from_triton_tools(line: str, ok: bool) -> None:
    report = check_source(candidate("return x", line))
    assert report.ok == ok, report.reasons


@pytest.mark.parametrize("line, ok", [
    ("from triton.experimental import gluon\n", True),
    ("import triton.experimental.gluon as gluon\n", True),
    ("from triton.experimental.gluon import language as gl\n", True),
    ("import triton.experimental\n", False),
    ("from triton.experimental import gluon, proton\n", False),
])
def test_gluon_imports_in_either_form(line: str, ok: bool) -> None:
    report = check_source(candidate("return x", line))
    assert report.ok == ok, report.reasons


IDENTIFIER = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))


@settings(max_examples=30, deadline=None)
@given(IDENTIFIER)
def test_only_allow_listed_modules_import(module: str) -> None:
    report = check_source(candidate("return x", f"import {module}\n"))
    assert report.ok == (module in ALLOWED_IMPORTS), report.reasons


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["torch", "x", "y", "torch.nn.functional", "torch.linalg"]),
       st.sampled_from(["matmul", "mm", "bmm", "einsum", "softmax", "cumsum", "exp", "sum", "mean", "sigmoid"]))
def test_torch_math_names_are_refused_on_any_host_object(base: str, name: str) -> None:
    report = check_source(candidate(f"return {base}.{name}(x)"))
    assert not report.ok
    assert any(name in reason or "torch math" in reason for reason in report.reasons)


def test_reasons_do_not_repeat_for_one_chain() -> None:
    report = check_source(candidate("return torch.nn.functional.softmax(x, -1)"))
    assert len(report.reasons) == 1, report.reasons


def test_policy_reads_every_hostile_file_without_crashing() -> None:
    for path in sorted(Path(REPO_ROOT / "tests" / "hostile").glob("*.py")):
        check_source(path.read_text(), path.name)  # must not raise


SYNTAX_TOUR = candidate("return x", "import functools\nimport typing\n") + """
Row = typing.NamedTuple("Row", [("a", int)])


@functools.lru_cache(maxsize=None)
def plan(n: int, *rest: int, flag: bool = False, **named: 'typing.Any') -> 'tuple[int, ...]':
    total: int = n
    async_like = [v async for v in rest] if False else [v for v in rest if v]
    with open_nothing() as (a, b):
        pass
    try:
        total += sum(async_like)
    except* ValueError:
        pass
    match n:
        case 1 | 2:
            total = (lambda q=n, /, *, r=1: q + r)()
        case [first, *others]:
            total = first
        case {"k": value, **others}:
            total = value
    while (m := total) > 10:
        total = m // 2 if m else -m
    del async_like
    global FLAG
    return tuple(x[1:2:1] for x in [[total, f"{total!r:>{n}}"]])


class Plan:
    limit: typing.ClassVar[int] = 4

    def __init__(self, n: int) -> None:
        self.n = n
"""


def test_the_policy_reads_every_node_of_the_syntax_tree() -> None:
    """A node the checker never visits is code it never reads (a function's return annotation went unread until the
    fifth red team): on clean files, every node ``ast.walk`` yields is visited. A new visitor that skips a field
    fails this."""
    import ast

    from pytest_kopt.judge import policy

    class Recording(policy._Checker):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()

        def visit(self, node: ast.AST) -> None:
            self.seen.add(id(node))
            super().visit(node)

    sources = {"tour": SYNTAX_TOUR, **{p.name: p.read_text() for p in sorted((REPO_ROOT / "kernels" / "best").glob("*.py"))
                                       if p.name != "__init__.py"}}
    for name, source in sources.items():
        tree = ast.parse(source)
        checker = Recording()
        checker.visit(tree)
        assert not checker.report.reasons, f"{name}: {checker.report.reasons[:3]}"
        # an import's names are read by the import's own visitor
        missed = [n for n in ast.walk(tree) if id(n) not in checker.seen and not isinstance(n, ast.alias)]
        assert not missed, f"{name}: never visited: {[ast.dump(n)[:80] for n in missed[:5]]}"
