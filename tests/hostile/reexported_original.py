"""torch math through an object torch keeps under another name: torch.nn.functional holds the function torch.conv_tbc
was before the fence replaced that attribute, and torch.distributions reaches it without a private name (third red
team, session 49). alpha * x + y as a two-channel convolution, in every call. The fence replaces such re-exports by
identity; this file runs with the policy off (it refuses torch.nn by name only on import)."""

import torch
import triton
import triton.language as tl
from torch import distributions

CONV = distributions.transforms.F.conv_tbc


@triton.jit
def _nothing(o_ptr):
    pass


def kernel(x, y, alpha):
    B, N = x.shape
    inp = torch.stack([x.float(), y.float()], dim=2).reshape(B * N, 1, 2)
    weight = torch.tensor([[[float(alpha)], [1.0]]])
    out = CONV(inp, weight, torch.zeros(1), 0).reshape(B, N).to(x.dtype)
    _nothing[(1,)](out)
    return (out,)
