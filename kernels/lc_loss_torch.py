"""Memory-bounded torch path of the LC loss (what CPU training uses).

Same math and the same interface as the Triton kernel in lc_loss.py: the autograd Function takes the
features of all points stacked as z = [z_L; z_U] (centred, fp64) and walks over row chunks, so
no N x N matrix exists at once. The backward pass recomputes each chunk's distances instead of
storing them, like the fused kernel does tile by tile.
"""
import torch

# Pairs per chunk: 2M fp64 values, 16 MB per temporary.
CHUNK_PAIRS = 1 << 21


def combine_row_sums(row_num, row_cnt, n_labeled):
    """Per-row sums -> L_lc (Eq. 5), the fraction of pairs that are neighbours, and the gradient
    scale 1 / neighbour count of each term.

    Rows 0..n_labeled-1 are labeled points (term L x U), the rest unlabeled (term U x U). Summing
    per-row partials in a fixed order keeps the result bitwise reproducible.
    """
    num = torch.stack([row_num[:n_labeled].sum(), row_num[n_labeled:].sum()])
    count = torch.stack([row_cnt[:n_labeled].sum(), row_cnt[n_labeled:].sum()])
    # A term without neighbour pairs has num == 0; dividing by 1 makes it 0 instead of NaN.
    inv_count = 1.0 / count.clamp(min=1).to(row_num.dtype)
    n_unlabeled = len(row_num) - n_labeled
    fraction = count.sum().to(torch.float32) / (len(row_num) * n_unlabeled)
    return (num * inv_count).sum(), fraction, inv_count


def finish_forward(ctx, z, sq_norm, classes, row_num, row_cnt, n_labeled, eps):
    """The loss and neighbour fraction from the per-row sums; saves what the backward recomputes from."""
    loss, fraction, inv_count = combine_row_sums(row_num, row_cnt, n_labeled)
    # A NaN or infinite feature compares false with eps, so its pairs would drop out and the loss
    # merely shrink: the norms (NaN or infinite then) make it NaN instead, for a training guard to see.
    # Two small launches (a sum, an add times 0); finite norms leave the loss bitwise as it was.
    loss = torch.add(loss, sq_norm.sum(dtype=loss.dtype), alpha=0)
    ctx.save_for_backward(z, sq_norm, classes, inv_count)
    ctx.mark_non_differentiable(fraction)
    ctx.n_labeled, ctx.eps = n_labeled, eps
    return loss, fraction


def _chunk_sq_dist(z, sq_norm, classes, start, stop, n_labeled, eps):
    """Mean squared distances of rows start..stop of z to every unlabeled point, and the neighbour mask
    (within eps and, with classes, of one class)."""
    u, sq_u = z[n_labeled:], sq_norm[n_labeled:]
    dim = z.shape[1]
    d2 = torch.addmm(sq_norm[start:stop, None] + sq_u[None, :], z[start:stop], u.T, alpha=-2.0)
    d2 = d2.div_(dim).clamp_(min=0.0)
    # A point is its own neighbour at distance exactly 0 (the U x U diagonal).
    own = torch.arange(min(max(start, n_labeled), stop), stop, device=z.device)
    d2[own - start, own - n_labeled] = 0.0
    neighbour = d2 <= eps
    if classes is not None:
        neighbour &= classes[start:stop, None] == classes[None, n_labeled:]
    return d2, neighbour


def _row_chunks(n_rows, n_cols):
    step = max(1, CHUNK_PAIRS // max(n_cols, 1))
    return [(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


class ChunkedLCLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, n_labeled, eps, classes=None):
        n_rows, n_unlabeled = z.shape[0], z.shape[0] - n_labeled
        sq_norm = z.pow(2).sum(1)
        row_num = torch.empty(n_rows, dtype=z.dtype, device=z.device)
        row_cnt = torch.empty(n_rows, dtype=torch.int64, device=z.device)
        for start, stop in _row_chunks(n_rows, n_unlabeled):
            d2, neighbour = _chunk_sq_dist(z, sq_norm, classes, start, stop, n_labeled, eps)
            row_num[start:stop] = (torch.exp(-d2 / eps) * d2).mul_(neighbour).sum(1)
            row_cnt[start:stop] = neighbour.sum(1)
        return finish_forward(ctx, z, sq_norm, classes, row_num, row_cnt, n_labeled, eps)

    @staticmethod
    def backward(ctx, grad_loss, _grad_fraction):
        z, sq_norm, classes, inv_count = ctx.saved_tensors
        n_labeled, eps = ctx.n_labeled, ctx.eps
        n_rows, dim = z.shape
        u = z[n_labeled:]
        # d(w * d2)/d(d2) = w * (1 - d2/eps) (Eq. 4); d(d2)/da = 2 (a - b) / D.
        group_scale = grad_loss * inv_count * (2.0 / dim)
        grad_z = torch.empty_like(z)
        grad_u = torch.zeros_like(u)
        for start, stop in _row_chunks(n_rows, u.shape[0]):
            d2, neighbour = _chunk_sq_dist(z, sq_norm, classes, start, stop, n_labeled, eps)
            rows = torch.arange(start, stop, device=z.device)
            row_scale = group_scale[(rows >= n_labeled).long()]
            coef = torch.exp(-d2 / eps).mul_(1.0 - d2 / eps).mul_(neighbour).mul_(row_scale[:, None])
            a = z[start:stop]
            # sum_j coef_ij (a_i - b_j) for the row roles, sum_i coef_ij (b_j - a_i) for the column roles.
            grad_z[start:stop] = a * coef.sum(1, keepdim=True) - coef @ u
            grad_u += u * coef.sum(0)[:, None] - coef.T @ a
        grad_z[n_labeled:] += grad_u
        return grad_z, None, None, None
