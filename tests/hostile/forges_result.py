"""Hostile: writes a passing result where the judge writes its own, then exits cleanly before
the judge can (needs the static policy switched off: open and os are refused)."""

import json
import os

import torch
import triton
import triton.language as tl

with open("result.json", "w") as fh:
    json.dump({"result": {"verdict": "pass", "stage": "profile", "reasons": []}, "hmac": "0" * 64}, fh)
os._exit(0)


@triton.jit
def _noop(x_ptr):
    pass


def kernel(x, y, alpha):
    return (x,)
