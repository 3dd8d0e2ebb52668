"""MT+LC: Local Clustering with Mean Teacher, the library behind the scripts.

    import mtlc
    classifier = mtlc.load("runs/digits/lc.pt")            # a checkpoint's teacher, calibrated
    predictions = classifier.predict(["photo.jpg", "more/"])  # [Prediction(path, label, confidence, ...)]

The LC loss alone, for your own training loop: `from mtlc.kernels import lc_loss` once the package is
installed (`pip install .`), `from kernels import lc_loss` in a checkout. Attributes are imported
when first used, so that `import mtlc.label.apply` (label.py) does not import torch.
"""
import sys

__all__ = ["Classifier", "Prediction", "load"]

if sys.platform == "win32":  # the kept files' locks (fcntl) and link-free opens have no form here on Windows
    raise SystemExit("mtlc does not run on native Windows: install and run it in WSL2 (wsl --install), where "
                     "every command works as on Linux")


def __getattr__(name):
    if name in __all__:
        from .use import classifier
        return getattr(classifier, name)
    raise AttributeError(f"module 'mtlc' has no attribute {name!r}")
