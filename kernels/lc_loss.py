"""The public local-clustering loss `lc_loss` (paper Eq. 4-5): the fused Triton kernels
(lc_loss_triton.py, imported only where they run: Triton installs on Linux only) for CUDA tensors,
the memory-bounded torch path (lc_loss_torch.py) everywhere else."""
import warnings
from typing import Optional, Tuple, Union

import torch

from .lc_loss_torch import ChunkedLCLoss
from .reference import check_lc_inputs, triton_interpreted

# What a run that needs the fused kernel is told where Triton cannot be imported.
NO_TRITON = ("the fused LC kernel needs Triton, which cannot be imported here: pip install triton (Linux; "
             "or impl='torch', the torch path)")


def triton_function(on_cuda):
    """TritonLCLoss, imported now. Where Triton is missing: on CUDA tensors ImportError naming the pip
    command; on CPU tensors under TRITON_INTERPRET (the kernels' emulation, for tests) a warning
    naming it, and the torch path, which computes the same loss (tests/test_lc_loss.py)."""
    try:
        from .lc_loss_triton import TritonLCLoss
    except ImportError as e:
        if on_cuda:
            raise ImportError(f"{NO_TRITON} ({e})") from None
        warnings.warn(f"{NO_TRITON}; the torch path computes the loss instead", stacklevel=3)
        return ChunkedLCLoss
    return TritonLCLoss


def lc_loss(z_labeled: torch.Tensor, z_unlabeled: torch.Tensor, eps: float, *, impl: str = "auto",
            return_fraction: bool = False,
            classes: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Local-clustering loss L_lc (paper Eq. 4-5) of student features, as a 0-dim tensor.

    Shapes: z_labeled (N_l, D), z_unlabeled (N_u, D), classes (N_l + N_u,) -> loss () [, fraction ()].

    z_labeled: (N_l, D), N_l >= 0; z_unlabeled: (N_u, D), N_u >= 1; eps: the cut-off on the MEAN
    squared feature distance (the authors' units; Eq. 4 writes the sum). Semantics are those of
    `lc_loss_reference` on finite features; a NaN or infinite feature makes the loss NaN, where
    the reference leaves that point's pairs out: a training guard sees it. Memory is
    O((N_l + N_u) D) in forward and backward. The loss and the gradients come back in the inputs'
    dtype.
    impl: "auto" (Triton for CUDA tensors, the torch path otherwise), "triton" (CUDA tensors, or
    CPU tensors under TRITON_INTERPRET=1) or "torch" (row-chunked, any device).
    return_fraction: also return the fraction of the N_l N_u + N_u^2 ordered pairs that are
    neighbours (the U x U diagonal included), a 0-dim fp32 tensor without gradient.
    classes: None (the paper's loss), or an integer tensor with one class id per row of
    [z_labeled; z_unlabeled] (e.g. the labels, then the predicted classes): a pair is a neighbour
    only if its classes agree as well (ids must fit in int32).

    Precision: |a|^2 + |b|^2 - 2 a.b cancels when points sit far from each other's common centre
    compared with their distance, which is where LC-trained clusters end up. Points are centred
    first (distances do not change), and fp32 features are then handled in fp64 (on Hopper fp64
    tensor cores run at the fp32 CUDA-core rate). fp16/bf16 features are centred on a centre
    rounded to their dtype (exact for points near it) and multiplied on half-precision tensor
    cores with fp32 accumulation: their distances are as good as the half-precision inputs allow.
    """
    eps = check_lc_inputs(z_labeled, z_unlabeled, eps, classes)
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl must be 'auto', 'triton' or 'torch', got {impl!r}")
    if impl == "auto":
        impl = "triton" if z_labeled.is_cuda else "torch"
    if impl == "triton" and not z_labeled.is_cuda and not triton_interpreted():
        raise ValueError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before triton is imported)")
    dtype = torch.promote_types(z_labeled.dtype, z_unlabeled.dtype)
    z = torch.cat([z_labeled.to(dtype), z_unlabeled.to(dtype)])
    fn = triton_function(z.is_cuda) if impl == "triton" else ChunkedLCLoss
    if fn is not ChunkedLCLoss and dtype in (torch.float16, torch.bfloat16):
        work = z - z.detach().float().mean(0).to(dtype)
    else:
        work = z.double() - z.detach().double().mean(0)
    loss, fraction = fn.apply(work, z_labeled.shape[0], eps, classes)
    return (loss.to(dtype), fraction) if return_fraction else loss.to(dtype)
