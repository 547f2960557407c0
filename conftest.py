"""Repository-wide pytest set-up: on a machine without a GPU, run Triton kernels on the
(fixed) CPU interpreter. This must happen before any test module defines a @triton.jit kernel.

Under pytest-xdist (``make test``) a worker's environment names it (``PYTEST_XDIST_WORKER``...);
a pytest a test starts in a subprocess is no worker, and pytest-benchmark would read those names
and save no JSON there, so they leave the environment once this worker has read them."""

import os

from pytest_kopt import interpret

interpret.configure()

for _name in [name for name in os.environ if name.startswith("PYTEST_XDIST_")]:
    del os.environ[_name]
