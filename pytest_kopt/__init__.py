"""pytest-kopt: a pytest plugin that runs a long-horizon write -> check -> time -> improve loop for Triton kernels."""

from pathlib import Path

__version__ = "0.1.0"

# The repository root holds kernels/ (references, families, promoted winners) next to this package.
REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS_DIR = REPO_ROOT / "kernels"
