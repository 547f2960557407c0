"""pytest-kopt: a pytest plugin that runs a long-horizon write -> check -> time -> improve loop for Triton kernels."""

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
# The source checkout this package sits in (git metadata, results/); in a wheel install, its site-packages.
REPO_ROOT = PACKAGE_DIR.parent
# kernels/ (references, families, promoted winners) is the package ``pytest_kopt.kernels``: installed
# inside this package by a wheel, beside it in a source checkout.
KERNELS_DIR = PACKAGE_DIR / "kernels" if (PACKAGE_DIR / "kernels").is_dir() else REPO_ROOT / "kernels"


def _kernels_from_the_checkout() -> None:
    """In a source checkout (installed editable, or only on PYTHONPATH as on the lent GPU machine)
    kernels/ sits beside this package: make ``pytest_kopt.kernels`` name it, as a wheel installs it."""
    name = f"{__name__}.kernels"
    if name in sys.modules or KERNELS_DIR.parent == PACKAGE_DIR or not (KERNELS_DIR / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(name, KERNELS_DIR / "__init__.py", submodule_search_locations=[str(KERNELS_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_kernels_from_the_checkout()
