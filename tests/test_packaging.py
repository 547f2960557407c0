"""What `pip install .` installs: the package ``pytest_kopt`` and nothing else at the top level.

The repository's kernels/ installs as ``pytest_kopt.kernels`` (setup.py): a top-level ``kernels``
would collide with another PyPI project's package of that name. The wheel is built once, offline,
from a copy of the files it is made of (no build isolation, so no index is needed; ~10 s).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pytest_kopt
from pytest_kopt import KERNELS_DIR, REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    pytest.importorskip("setuptools", reason="building the wheel without an index needs setuptools installed")
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO_ROOT / "pytest_kopt", source / "pytest_kopt", ignore=ignore)
    shutil.copytree(REPO_ROOT / "kernels", source / "kernels", ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = out.glob("pytest_kopt-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_no_top_level_package_but_pytest_kopt(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"pytest_kopt", f"pytest_kopt-{pytest_kopt.__version__}.dist-info"}
    top_level = next(n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["pytest_kopt"]


def test_the_wheel_carries_every_kernel_module_under_the_package(wheel: zipfile.ZipFile) -> None:
    expected = {f"pytest_kopt/kernels/{p.relative_to(KERNELS_DIR).as_posix()}" for p in KERNELS_DIR.rglob("*.py")
                if "notes" not in p.relative_to(KERNELS_DIR).parts and "__pycache__" not in p.parts}
    assert expected and expected <= set(wheel.namelist())
    assert not [n for n in wheel.namelist() if n.startswith("pytest_kopt/kernels/notes/")]  # notes are docs, not code


@pytest.mark.parametrize("how", ["installed", "on PYTHONPATH"])
def test_the_package_imports_its_kernels_under_its_own_name(tmp_path: Path, how: str) -> None:
    """Run outside the checkout, the problems load their references as pytest_kopt.kernels.* and
    never import a top-level ``kernels``: as installed here, and as on the lent GPU machine, where
    the checkout is only on PYTHONPATH (the editable install's finder taken away)."""
    code = "import sys\n"
    if how == "on PYTHONPATH":
        code += (f"sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
                 f"sys.path.insert(0, {str(REPO_ROOT)!r})\n")
    code += ("import pytest_kopt.problems as p\n"
             "for name in ('kda', 'mla', 'mla-prefill'): p.get_problem(name)\n"
             "import pytest_kopt.kernels.reference.kda as r\n"
             "print(r.__file__)\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kernels'))\n")
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, top_level = ran.stdout.splitlines()[-2:]
    assert Path(where).resolve() == (KERNELS_DIR / "reference" / "kda.py").resolve() and top_level == "[]"
