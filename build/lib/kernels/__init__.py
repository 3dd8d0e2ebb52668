"""The local-clustering (LC) loss: fused Triton kernel, memory-bounded torch path, plain reference."""
from .lc_loss import lc_loss
from .reference import lc_loss_reference

__all__ = ["lc_loss", "lc_loss_reference"]
