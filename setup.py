"""Which packages the wheel installs; everything else is in pyproject.toml.

The repository keeps its kernels in kernels/ at the top, but the wheel installs them as
``pytest_kopt.kernels``: a top-level ``kernels`` would claim a name another PyPI project owns
(Hugging Face's ``kernels``), and a user with both installed would get one or the other. The
folders are found, not listed, so a new family folder installs without an edit here.
"""

from setuptools import find_namespace_packages, setup

KERNELS = ["pytest_kopt." + name for name in find_namespace_packages(include=["kernels", "kernels.*"], exclude=["kernels.notes*"])]

setup(
    packages=find_namespace_packages(include=["pytest_kopt", "pytest_kopt.*"]) + KERNELS,
    package_dir={"pytest_kopt.kernels": "kernels"},
    package_data={"pytest_kopt.kernels": ["**/*.json"]},  # a promoted winner's provenance beside it
)
