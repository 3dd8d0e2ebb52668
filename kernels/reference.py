"""Plain-torch local-clustering loss (paper Eq. 4-5): the ground truth the fast paths are tested against.

Written for clarity, not speed: it materializes the N_l x N_u and N_u x N_u distance matrices.
"""
import math
import os

from typing import Optional

import torch


def check_lc_inputs(z_labeled, z_unlabeled, eps, classes=None):
    """Raise ValueError unless the inputs describe a valid LC loss; return eps as a float."""
    for name, z in (("z_labeled", z_labeled), ("z_unlabeled", z_unlabeled)):
        if not isinstance(z, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(z).__name__}")
        if z.dim() != 2:
            raise ValueError(f"{name} must be 2-D (points x features), got shape {tuple(z.shape)}")
        if not z.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {z.dtype}")
    if z_labeled.shape[1] != z_unlabeled.shape[1]:
        raise ValueError(f"feature dimensions differ: z_labeled has D={z_labeled.shape[1]}, "
                         f"z_unlabeled has D={z_unlabeled.shape[1]}")
    if z_labeled.shape[1] < 1:
        raise ValueError("features must have at least one dimension (D >= 1)")
    if z_labeled.device != z_unlabeled.device:
        raise ValueError(f"z_labeled is on {z_labeled.device} but z_unlabeled is on {z_unlabeled.device}")
    if z_unlabeled.shape[0] < 1:
        raise ValueError("z_unlabeled must hold at least one point")
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps must be a number, got {eps!r}") from None
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be finite and > 0, got {eps}")
    if classes is not None:
        n_rows = z_labeled.shape[0] + z_unlabeled.shape[0]
        if not isinstance(classes, torch.Tensor) or classes.dim() != 1 or len(classes) != n_rows:
            raise ValueError(f"classes must be a 1-D tensor of N_l + N_u = {n_rows} class ids, got "
                             f"{tuple(classes.shape) if isinstance(classes, torch.Tensor) else type(classes).__name__}")
        if classes.is_floating_point() or classes.is_complex() or classes.dtype == torch.bool:
            raise ValueError(f"classes must hold integers, got {classes.dtype}")
        if classes.device != z_labeled.device:
            raise ValueError(f"classes is on {classes.device} but the features are on {z_labeled.device}")
    return eps


def lc_loss_reference(z_labeled: torch.Tensor, z_unlabeled: torch.Tensor, eps: float,
                      classes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """L_lc = term(z_L, z_U) + term(z_U, z_U), Eq. 5, with the authors' released semantics.

    Shapes: z_labeled (N_l, D), z_unlabeled (N_u, D), classes (N_l + N_u,) -> loss ().

    d2(a, b) is the MEAN over the D features of (a_k - b_k)^2, not the sum of Eq. 4: the paper's
    eps values (40, 50) are in these units. A pair is a neighbour when d2 <= eps (Eq. 4), weighted
    by w = exp(-d2 / eps); each term averages w * d2 over its neighbour pairs. The mask and the
    neighbour count are constants for the gradient. A term with no neighbour pair is 0 (the authors'
    code gives NaN there). The U x U term runs over all ordered pairs, the diagonal included.

    classes (not in the paper): one integer per row of [z_L; z_U]; a pair is then a neighbour only
    if its two classes are equal as well.
    """
    eps = check_lc_inputs(z_labeled, z_unlabeled, eps, classes)
    # fp16/bf16 features are computed in fp32 (a ground truth rounds no intermediate, and the CPU's
    # cdist has no half-precision kernel); the loss comes back in the features' dtype.
    out_dtype = torch.promote_types(z_labeled.dtype, z_unlabeled.dtype)
    work_dtype = torch.promote_types(out_dtype, torch.float32)
    z_labeled, z_unlabeled = z_labeled.to(work_dtype), z_unlabeled.to(work_dtype)
    dim = z_labeled.shape[1]
    n_labeled = z_labeled.shape[0]
    if classes is None:
        classes = torch.zeros(n_labeled + z_unlabeled.shape[0], dtype=torch.long, device=z_labeled.device)

    def term(a, b, class_a, class_b):
        # Exact differences (no |a|^2 + |b|^2 - 2ab expansion), N_a x N_b memory.
        d2 = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").pow(2) / dim
        neighbour = ((d2 <= eps) & (class_a[:, None] == class_b[None, :])).detach()
        weight = torch.exp(-d2 / eps)
        count = neighbour.sum().clamp(min=1)
        return torch.where(neighbour, weight * d2, torch.zeros_like(d2)).sum() / count

    unlabeled_classes = classes[n_labeled:]
    return (term(z_labeled, z_unlabeled, classes[:n_labeled], unlabeled_classes)
            + term(z_unlabeled, z_unlabeled, unlabeled_classes, unlabeled_classes)).to(out_dtype)


def triton_interpreted():
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET set: CPU tensors, for tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
