"""KDA forward, chunk-parallel: prepare every chunk at once, then scan the state across chunks and read out.

Per (batch, head) the KDA recurrence keeps a K x V float32 state S; per step t
``S = exp(g_t) * S; S += beta_t k_t (v_t - S^T k_t)^T; o_t = S^T (scale q_t)``.
Cut the sequence into chunks of BT = 32 steps and write G_i for the running sum of g from the chunk's start to
step i (inclusive). Unrolling the recurrence inside a chunk that starts from state S0 (the UT / WY form of the
delta rule):

    delta = u - w S0                       the delta-rule corrections, one row per step
    u     = A (V),  w = A (exp(G) * K)     A = (I + Akk)^-1 diag(beta)
    Akk_ij = beta_i <k_i, exp(G_i - G_j) k_j>          (j < i)
    Aqk_ij = scale <q_i, exp(G_i - G_j) k_j>           (j <= i)
    o      = (scale exp(G) * Q) S0 + Aqk delta = qd S0 + au,   qd = scale exp(G) Q - Aqk w,  au = Aqk u
    S_end  = exp(G_last) * S0 + (exp(G_last - G) * K)^T delta

Two stages. The preparation (every chunk at once): the block rows (Aqk and Akk, 16 rows at a time), the solve
(A's inverse) and the scan's inputs w, u, kd = exp(G_last - G) k, qd, au, gl = exp(G_last). The scan (one program
per value slice and head, chunk after chunk): delta = u - w S, o = qd S + au, S = gl S + kd^T delta. On Hopper the
preparation is one Gluon program per chunk and the scan a warp-specialised Gluon kernel, launched beside each
other where the scan is the longer stage; elsewhere Triton kernels of the same algebra (host.py says where).

Any gate in (-inf, 0] (-1000 resets, long strong-decay runs, -3e4) keeps exp in range: every decay is factored
around a reference inside its span, each exponent a running sum of exactly the gates it spans; a diagonal block too
steep for one reference is split exactly; gates are floored at -30 (below e^-30 a decay is negligible). Precision (relative RMS against the float64 recurrence, tolerance 5e-3): the factors that need more than
bf16 are tf32 or bf16 hi / lo pairs (~16 bits); w, kd, qd, u and au are stored in bf16; the state is rounded to
bf16 in its products. Measured: ~3.2e-3 in o and ~2.4e-3 in the final state at fla's shapes (fla: ~4.0e-3).
Measurements, history and open questions: kernels/notes/kda/README.md."""

from . import knobs, common, rows, solve, scan, gluon_rows, gluon_solve, gluon_prep, gluon_scan, host  # noqa: F401
from .host import kernel  # noqa: F401
