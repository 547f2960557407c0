"""The block rows' products in Gluon, for the fused preparation (gluon_prep.py): q and k rows of one chunk against
decayed k columns as tf32 warpgroup products from shared memory, each [2 BT, BT] result the q rows' products (Aqk)
over the k rows' (Akk). The factorisations are those of the Triton rows (rows.py)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from .common import _gl_exp


@gluon.jit
def _gl_seg_add(v1, f1, v2, f2):
    """Running sums that restart where a flag is set (each 16-row block's own sums)."""
    return gl.where(f2 > 0, v2, v1 + v2), gl.maximum(f1, f2)


@gluon.jit
def _gl_pair(a_s, b_s, top, bottom, cols, ACC: gl.constexpr, BT: gl.constexpr):
    """[top; bottom] @ cols^T for [BT, K] float32 tiles: one tf32 warpgroup product from shared memory
    ([2 BT, BT]: the q rows' products over the k rows' products)."""
    a_s.slice(0, BT).store(top)
    a_s.slice(BT, BT).store(bottom)
    b_s.store(cols)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(a_s, b_s.permute((1, 0)), gl.zeros([2 * BT, BT], gl.float32, ACC),
                        use_acc=False)  # float32 operands: tf32 (the compiler's default input precision)
    gl.thread_barrier()  # every warp has read the tiles before the next pair overwrites them
    return acc


@gluon.jit
def _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, H: gl.constexpr, BT: gl.constexpr, ACC: gl.constexpr):
    """One level of the exact split (the Triton rows' ``_split_level``): the lower-left H x H quarter of every 2H x 2H
    diagonal block, factored around the later half's first row m, exp(G_i - G_m) k_j exp(G_m - G_j), exponents <= 0:
    running sums restarting every H rows, forward over the gates after m, backward over the next rows' gates gn up to
    m. ri: row index of g's layout; rr, cc: of the [2 BT, BT] product. Aqk's and Akk's quarters stacked, else 0."""
    later = (ri % (2 * H)) >= H
    restart = gl.where(ri % H == 0, 1.0, 0.0) + gl.zeros_like(g)
    fwd, _ = gl.associative_scan((gl.where(ri % H == 0, 0.0, g), restart), 0, _gl_seg_add)
    restart_rev = gl.where(ri % H == H - 1, 1.0, 0.0) + gl.zeros_like(g)
    rev, _ = gl.associative_scan((gn, restart_rev), 0, _gl_seg_add, reverse=True)
    up = gl.where(later, _gl_exp(gl.minimum(fwd, 0.0)), 0.0)
    down = gl.where(later, 0.0, k * _gl_exp(gl.minimum(rev, 0.0)))
    p = _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)
    i = rr % BT
    sel = ((i % (2 * H)) >= H) & ((cc % (2 * H)) < H) & (i // (2 * H) == cc // (2 * H))
    return gl.where(sel, p, 0.0)


@gluon.jit
def _gl_off(a_s, b_s, q, k, e, gs, c16, ri, BT: gl.constexpr, ACC: gl.constexpr):
    """Rows 16.. against columns ..15, factored around row 16: exp(G_i - G_16) = exp(E_i), and k_j exp(G_16 - G_j)
    with G_16 - G_j = c16 - (running sum at j), c16 = floored g_16 + block 0's total (both exponents <= 0); the
    [2 BT, BT] product is zero elsewhere."""
    BC: gl.constexpr = 16
    up = gl.where(ri >= BC, _gl_exp(e), 0.0)
    down = gl.where(ri < BC, k * _gl_exp(gl.minimum(c16[None, :] - gs, 0.0)), 0.0)
    return _gl_pair(a_s, b_s, q * up, k * up, down, ACC, BT)


@gluon.jit
def _gl_split(a_s, b_s, q, k, g, g_ptr, s_gt, t0, T, ri, c1, rr, cc, FLOOR: gl.constexpr, BT: gl.constexpr,
              ACC: gl.constexpr):
    """The diagonal blocks' strictly lower part by the exact split (``_gl_level`` at H = 8, 4, 2, 1: every pair of
    a 16-row block lies in one level's quarter, the highest bit where i and j differ). g_ptr: the chunk's first
    gate; gn below is the next row's gate, floored (0 past the chunk and T)."""
    gn = gl.load(g_ptr + (ri + 1) * s_gt + c1[None, :], mask=(ri + 1 < BT) & ((t0 + ri + 1) < T), other=0.0)
    gn = gl.maximum(gn.to(gl.float32), FLOOR)
    z = _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8, BT, ACC)
    for lv in gl.static_range(1, 4):
        z += _gl_level(a_s, b_s, q, k, g, gn, ri, rr, cc, 8 >> lv, BT, ACC)
    return z
