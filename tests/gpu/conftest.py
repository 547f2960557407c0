"""GPU checks, run on the H200 as `pytest tests/gpu` (skipped where there is no CUDA GPU).

Every test here is marked ``gpu`` and skipped off-GPU, so the CPU suite collects them and moves
on. Inputs are drawn from a fresh seed each run (the ``seed`` fixture; a failure names it).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the judge's toy problem and hostile files


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest tests/gpu` on the H200)")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture
def seed() -> int:
    """A fresh seed for each test's inputs: every run checks new data."""
    return random.randrange(2**31)
