import os

import torch

# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; the variable must be
# set before triton is first imported (the kernels module imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
