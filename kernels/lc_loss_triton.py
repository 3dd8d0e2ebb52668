"""Fused Triton kernels for the local-clustering loss (paper Eq. 4-5) and the autograd.Function that
launches them; imported by `lc_loss` (lc_loss.py) only where they run, so that a machine without
Triton (macOS, Windows, a CPU) has the rest.

Three kernels share one tile routine that recomputes the mean squared distances of a block of
rows of z = [z_L; z_U] to a block of unlabeled points from |a|^2 + |b|^2 - 2 a.b, the dot products
on tensor cores. Nothing N x N is ever stored:
  * forward: per row, the sum of w * d2 over its neighbours and the neighbour count;
  * backward, row roles: grad_a = sum_j K_ij (a - b_j), one program per (row block, feature block);
  * backward, column roles: grad_b = sum_i K_ij (b - a_i), one program per (column block, feature block);
with K_ij = g / count * w (1 - d2/eps) * 2/D on neighbour pairs. Every output element is written
by exactly one program that loops in a fixed order, so results are bitwise reproducible.
"""
import torch
import triton
import triton.language as tl

from .lc_loss_torch import finish_forward
from .reference import triton_interpreted

BLOCK_M = 64  # rows of z per tile
BLOCK_N = 64  # unlabeled points per tile


@triton.jit
def _dot(a, b, acc, DOT: tl.constexpr):
    """acc + a @ b, both operands in the DOT dtype, accumulated in acc's dtype."""
    # out_dtype must name acc's dtype: triton 3.6 defaults it to fp32 and rejects an fp64 acc.
    return tl.dot(a.to(DOT), b.to(DOT), acc, input_precision="ieee", out_dtype=acc.dtype)


@triton.jit
def _sq_dist_tile(z_ptr, sq_ptr, cls_ptr, rows, cols, row_start, row_stop, n_rows, n_labeled, dim, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  DOT: tl.constexpr, ACC: tl.constexpr, HAS_CLASSES: tl.constexpr):
    """d2 (mean squared distance) between z[rows] and u[cols] = z[n_labeled + cols], and the
    neighbour mask; rows outside [row_start, row_stop) and cols past the end are no neighbours, nor,
    with HAS_CLASSES, pairs whose classes (cls_ptr, one per row of z) differ."""
    row_ok = (rows >= row_start) & (rows < row_stop)
    col_ok = cols < n_rows - n_labeled
    row_off = rows.to(tl.int64) * dim
    col_off = (n_labeled + cols).to(tl.int64) * dim
    dot = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k0 in range(0, dim, BLOCK_D):
        ks = k0 + tl.arange(0, BLOCK_D)
        k_ok = ks < dim
        a = tl.load(z_ptr + row_off[:, None] + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b_t = tl.load(z_ptr + col_off[None, :] + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        dot = _dot(a, b_t, dot, DOT)
    sq_a = tl.load(sq_ptr + rows, mask=row_ok, other=0.0)
    sq_b = tl.load(sq_ptr + n_labeled + cols, mask=col_ok, other=0.0)
    d2 = tl.maximum((sq_a[:, None] + sq_b[None, :] - 2.0 * dot) / dim, 0.0).to(tl.float32)
    # A point is its own neighbour at distance exactly 0 (the U x U diagonal).
    d2 = tl.where(rows[:, None] == (n_labeled + cols)[None, :], 0.0, d2)
    neighbour = (d2 <= eps) & row_ok[:, None] & col_ok[None, :]
    if HAS_CLASSES:
        class_a = tl.load(cls_ptr + rows, mask=row_ok, other=0)
        class_b = tl.load(cls_ptr + n_labeled + cols, mask=col_ok, other=0)
        neighbour = neighbour & (class_a[:, None] == class_b[None, :])
    return d2, neighbour


@triton.jit
def _lc_fwd_kernel(z_ptr, sq_ptr, cls_ptr, row_num_ptr, row_cnt_ptr, n_rows, n_labeled, dim, eps,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT: tl.constexpr, ACC: tl.constexpr, HAS_CLASSES: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    num = tl.zeros((BLOCK_M,), dtype=tl.float32)
    cnt = tl.zeros((BLOCK_M,), dtype=tl.int32)
    for c0 in range(0, n_rows - n_labeled, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        d2, neighbour = _sq_dist_tile(z_ptr, sq_ptr, cls_ptr, rows, cols, 0, n_rows, n_rows, n_labeled, dim, eps,
                                      BLOCK_M, BLOCK_N, BLOCK_D, DOT, ACC, HAS_CLASSES)
        num += tl.sum(tl.where(neighbour, tl.exp(-d2 / eps) * d2, 0.0), axis=1)
        cnt += tl.sum(neighbour.to(tl.int32), axis=1)
    tl.store(row_num_ptr + rows, num, mask=rows < n_rows)
    tl.store(row_cnt_ptr + rows, cnt, mask=rows < n_rows)


@triton.jit
def _pair_coef(d2, neighbour, eps):
    """d(w * d2)/d(d2) = w (1 - d2/eps) on neighbour pairs (Eq. 4). It lies in [0, 1]: the tensor
    cores see it unscaled, and the per-term factor g / count * 2/D is applied afterwards, so fp16
    never has to hold the tiny scaled values."""
    return tl.where(neighbour, tl.exp(-d2 / eps) * (1.0 - d2 / eps), 0.0)


@triton.jit
def _lc_bwd_rows_kernel(z_ptr, sq_ptr, cls_ptr, scale_ptr, grad_ptr, n_rows, n_labeled, dim, eps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_OUT: tl.constexpr, DOT: tl.constexpr, ACC: tl.constexpr, HAS_CLASSES: tl.constexpr):
    """grad of row a_i: scale_i * sum_j K_ij (a_i - b_j), for one block of rows and of features."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    out_ok = outs < dim
    row_sum = tl.zeros((BLOCK_M,), dtype=ACC)
    acc = tl.zeros((BLOCK_M, BLOCK_OUT), dtype=ACC)
    for c0 in range(0, n_rows - n_labeled, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        d2, neighbour = _sq_dist_tile(z_ptr, sq_ptr, cls_ptr, rows, cols, 0, n_rows, n_rows, n_labeled, dim, eps,
                                      BLOCK_M, BLOCK_N, BLOCK_D, DOT, ACC, HAS_CLASSES)
        coef = _pair_coef(d2, neighbour, eps)
        row_sum += tl.sum(coef.to(ACC), axis=1)
        b = tl.load(z_ptr + (n_labeled + cols).to(tl.int64)[:, None] * dim + outs[None, :],
                    mask=(cols < n_rows - n_labeled)[:, None] & out_ok[None, :], other=0.0)
        acc = _dot(coef, b, acc, DOT)
    scale = tl.where(rows < n_labeled, tl.load(scale_ptr), tl.load(scale_ptr + 1))
    offs = rows.to(tl.int64)[:, None] * dim + outs[None, :]
    io_mask = (rows < n_rows)[:, None] & out_ok[None, :]
    a = tl.load(z_ptr + offs, mask=io_mask, other=0.0).to(ACC)
    # The difference a * sum_j K_ij - sum_j K_ij b_j cancels as much as d2 does: kept in ACC.
    tl.store(grad_ptr + offs, scale[:, None] * (a * row_sum[:, None] - acc).to(tl.float32), mask=io_mask)


@triton.jit
def _cols_partial(z_ptr, sq_ptr, cls_ptr, cols, outs, b, row_start, row_stop, n_rows, n_labeled, dim, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_OUT: tl.constexpr, DOT: tl.constexpr, ACC: tl.constexpr, HAS_CLASSES: tl.constexpr):
    """sum_i K_ij (b_j - a_i) over the rows in [row_start, row_stop), on the forward pass's tiles."""
    col_sum = tl.zeros((BLOCK_N,), dtype=ACC)
    acc = tl.zeros((BLOCK_N, BLOCK_OUT), dtype=ACC)
    for r0 in range((row_start // BLOCK_M) * BLOCK_M, row_stop, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        d2, neighbour = _sq_dist_tile(z_ptr, sq_ptr, cls_ptr, rows, cols, row_start, row_stop, n_rows, n_labeled,
                                      dim, eps, BLOCK_M, BLOCK_N, BLOCK_D, DOT, ACC, HAS_CLASSES)
        coef = _pair_coef(d2, neighbour, eps)
        col_sum += tl.sum(coef.to(ACC), axis=0)
        a = tl.load(z_ptr + rows.to(tl.int64)[:, None] * dim + outs[None, :],
                    mask=(rows < n_rows)[:, None] & (outs < dim)[None, :], other=0.0)
        acc = _dot(tl.trans(coef), a, acc, DOT)
    return (b * col_sum[:, None] - acc).to(tl.float32)


@triton.jit
def _lc_bwd_cols_kernel(z_ptr, sq_ptr, cls_ptr, scale_ptr, grad_ptr, n_rows, n_labeled, dim, eps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_OUT: tl.constexpr, DOT: tl.constexpr, ACC: tl.constexpr, HAS_CLASSES: tl.constexpr):
    """grad of unlabeled b_j in its column roles, for one block of points and of features; the
    labeled and unlabeled rows are summed apart because their terms have different scales."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    outs = tl.program_id(1) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    offs = cols.to(tl.int64)[:, None] * dim + outs[None, :]
    io_mask = (cols < n_rows - n_labeled)[:, None] & (outs < dim)[None, :]
    b = tl.load(z_ptr + n_labeled * dim + offs, mask=io_mask, other=0.0).to(ACC)
    from_labeled = _cols_partial(z_ptr, sq_ptr, cls_ptr, cols, outs, b, 0, n_labeled, n_rows, n_labeled, dim, eps,
                                 BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_OUT, DOT, ACC, HAS_CLASSES)
    from_unlabeled = _cols_partial(z_ptr, sq_ptr, cls_ptr, cols, outs, b, n_labeled, n_rows, n_rows, n_labeled, dim,
                                   eps, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_OUT, DOT, ACC, HAS_CLASSES)
    grad = tl.load(scale_ptr) * from_labeled + tl.load(scale_ptr + 1) * from_unlabeled
    tl.store(grad_ptr + offs, grad, mask=io_mask)


BLOCK_OUT = 64  # features per backward program (fp64 accumulators: keep the tile small)
DOT_DTYPES = {torch.float64: tl.float64, torch.float32: tl.float32, torch.float16: tl.float16,
              torch.bfloat16: tl.bfloat16}


def _launch_config(z):
    dot = DOT_DTYPES[z.dtype]
    if dot == tl.bfloat16 and triton_interpreted():
        dot = tl.float32  # the interpreter multiplies bf16 as raw uint16 bits; fp32 holds bf16 exactly
    return dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=min(64, max(16, triton.next_power_of_2(z.shape[1]))),
                DOT=dot, ACC=tl.float64 if z.dtype == torch.float64 else tl.float32)


def _backward_config(z):
    """The forward's tiles, a block of output features, and the warps and stages of the backward kernels."""
    config = dict(_launch_config(z), BLOCK_OUT=min(BLOCK_OUT, max(16, triton.next_power_of_2(z.shape[1]))))
    if z.dtype == torch.float64:
        # With 4 warps the fp64 tiles spill (ptxas -v, sm_90: 2 KB per thread in the column kernel);
        # 8 warps bring that under 256 B (dims that are multiples of 16), 2 stages halve the 128 KiB of
        # shared memory.
        config.update(num_warps=8, num_stages=2)
    return config


class TritonLCLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, n_labeled, eps, classes=None):
        z = z.contiguous()
        n_rows, dim = z.shape
        acc_dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        # Norms of the values exactly as the kernel reads them, in the accumulator dtype.
        sq_norm = z.to(acc_dtype).pow(2).sum(1)
        row_num = torch.empty(n_rows, dtype=torch.float32, device=z.device)
        row_cnt = torch.empty(n_rows, dtype=torch.int32, device=z.device)
        _lc_fwd_kernel[(triton.cdiv(n_rows, BLOCK_M),)](
            z, sq_norm, _class_ids(classes, z), row_num, row_cnt, n_rows, n_labeled, dim, eps,
            HAS_CLASSES=classes is not None, **_launch_config(z))
        return finish_forward(ctx, z, sq_norm, classes, row_num, row_cnt.long(), n_labeled, eps)

    @staticmethod
    def backward(ctx, grad_loss, _grad_fraction):
        z, sq_norm, classes, inv_count = ctx.saved_tensors
        class_ids, has_classes = _class_ids(classes, z), classes is not None
        n_labeled, eps = ctx.n_labeled, ctx.eps
        n_rows, dim = z.shape
        n_unlabeled = n_rows - n_labeled
        # d(d2)/da = 2 (a - b) / D; the 1/count of each term and the upstream gradient.
        scale = (grad_loss * inv_count * (2.0 / dim)).float().contiguous()
        config = _backward_config(z)
        grad_rows = torch.empty(n_rows, dim, dtype=torch.float32, device=z.device)
        grad_cols = torch.empty(n_unlabeled, dim, dtype=torch.float32, device=z.device)
        _lc_bwd_rows_kernel[(triton.cdiv(n_rows, BLOCK_M), triton.cdiv(dim, config["BLOCK_OUT"]))](
            z, sq_norm, class_ids, scale, grad_rows, n_rows, n_labeled, dim, eps, HAS_CLASSES=has_classes, **config)
        _lc_bwd_cols_kernel[(triton.cdiv(n_unlabeled, BLOCK_N), triton.cdiv(dim, config["BLOCK_OUT"]))](
            z, sq_norm, class_ids, scale, grad_cols, n_rows, n_labeled, dim, eps, HAS_CLASSES=has_classes, **config)
        grad_rows[n_labeled:] += grad_cols
        return grad_rows.to(z.dtype), None, None, None


def _class_ids(classes, z):
    """The class ids as the kernels read them (int32), or, without classes, a stand-in pointer that the
    HAS_CLASSES=False kernels never read."""
    return z if classes is None else classes.to(torch.int32).contiguous()
