"""The network, importable from the project's root as `from model import ConvLarge` (the public
contract's name); it lives in mtlc/train/model.py with the rest of the package."""
from mtlc.train.model import ConvLarge

__all__ = ["ConvLarge"]
