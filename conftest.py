"""Repository-wide pytest set-up: on a machine without a GPU, run Triton kernels on the
(fixed) CPU interpreter. This must happen before any test module defines a @triton.jit kernel."""

from pytest_kopt import interpret

interpret.configure()
