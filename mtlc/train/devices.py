"""Where a run computes: the device, the precision, and the processes of a torchrun launch.
"""
import contextlib
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import click
import torch
import torch.distributed as dist

from ..errors import UserError


def pick_device(name, echo=lambda line: click.echo(line, err=True)):
    """The device of --device (auto: CUDA where available, else the CPU). Where a faster device than
    the one used is there, or auto picked CUDA, one line (to stderr) says which is used and how to
    choose: an Apple GPU (mps) is never used, since none of this project's tests ran on one."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
        if name == "cuda":
            echo(f"computing on the GPU ({torch.cuda.get_device_name()}); --device cpu for the CPU")
    if name == "cpu" and mps_available():
        echo("computing on the CPU: this Mac's GPU (mps) is not supported by this project (untested on one)")
    return torch.device(name)


def mps_available():
    """Whether torch offers an Apple GPU here (macOS on Apple silicon)."""
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(precision, device, convolutions=True):
    """'auto' is bf16 where the device computes it natively (CUDA GPUs with bf16, CPUs with
    AVX512-BF16 or AMX), else fp32. A network without convolutions (a pretrained trunk's head on its
    features) keeps fp32 on a CPU: its step took 4.5x as long in bf16 on this project's Xeon
    (docs/pretrained.md)."""
    if precision != "auto":
        return precision
    if device.type != "cuda" and not convolutions:
        return "fp32"
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return "bf16" if native else "fp32"


@dataclass
class Processes:
    """This process's place among the processes of a torchrun launch (rank 0 of 1 without one)."""
    rank: int = 0
    world: int = 1

    @property
    def main(self):
        return self.rank == 0

    def echo(self, message):
        """Print on the main process only."""
        if self.main:
            click.echo(message)

    def main_first(self, work):
        """work() on the main process, then on the others: the main process decodes an image folder
        into the cache, the others then map that file (one copy in the page cache, no second decode).
        Where the main process fails, the others exit with its exit code (it says why) instead of
        waiting for it forever."""
        if self.world == 1:
            return work()
        if not self.main:
            code = self.from_main(None)
            if code:
                raise SystemExit(code)
            return work()
        code = 1
        try:
            result = work()
            code = 0
            return result
        except click.ClickException as exc:
            code = exc.exit_code
            raise
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) and exc.code else 1
            raise
        finally:
            self.from_main(code)

    def from_main(self, value):
        """The main process's value (any picklable object) on every process."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


MAX_PROCESSES = 2 ** 16
# What torchrun sets for every process besides WORLD_SIZE; without them there is no process group.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def environment_number(name, default):
    """A count torchrun sets in the environment (WORLD_SIZE, LOCAL_RANK), checked: exit 2 in one line
    for anything but a whole number (1 or more for WORLD_SIZE)."""
    value = os.environ.get(name, default)
    if value is None or not value.strip().isascii() or not value.strip().isdigit() or \
            (name == "WORLD_SIZE" and not 1 <= int(value) <= MAX_PROCESSES):
        raise UserError(f"the environment variable {name}={value!r} is not a process count torchrun sets: unset it "
                        f"(one process), or start the run with torchrun")
    return int(value)


@contextlib.contextmanager
def processes(device_name):
    """(Processes, this process's device). Under torchrun (WORLD_SIZE > 1) it joins the process group:
    nccl with one GPU per process (LOCAL_RANK) on CUDA, gloo on CPU; and leaves it at the end."""
    device = pick_device(device_name)
    world = environment_number("WORLD_SIZE", "1")
    if world == 1:
        yield Processes(), device
        return
    missing = [name for name in TORCHRUN_VARIABLES if not os.environ.get(name)]
    if missing:
        raise UserError(f"WORLD_SIZE={world} without {', '.join(missing)}: start several processes with torchrun "
                        f"(torchrun --nproc_per_node {world} ...), or unset WORLD_SIZE for one")
    if device.type == "cuda":
        device = torch.device("cuda", environment_number("LOCAL_RANK", None))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield Processes(dist.get_rank(), dist.get_world_size()), device
    finally:
        dist.destroy_process_group()


def average_buffers(modules, world):
    """Average the BN running means over the processes. Each process's running mean followed the
    batch means of its own shard; their average is what one process seeing the whole (equally
    sharded) batch would hold, and it keeps every process's teacher identical."""
    buffers = [b for m in modules for b in m.buffers()]
    flat = torch.cat([b.flatten() for b in buffers])
    dist.all_reduce(flat)
    flat /= world
    torch._foreach_copy_(buffers, [v.view_as(b) for v, b in zip(flat.split([b.numel() for b in buffers]), buffers)])


def device_name(device):
    """The GPU's or the CPU's model name, for benchmark records."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def sync(device):
    """Wait for the device's queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def conv_rate(device, dtype, repeats, batch=160):
    """GFLOP/s of forward + backward of conv-large's widest 3x3 convolution, channels_last, on a
    batch of `batch` images (the training step's 160; fewer where only the code path is checked)."""
    x = torch.randn(batch, 128, 32, 32, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    conv = torch.nn.Conv2d(128, 128, 3, padding=1, bias=False).to(device, dtype, memory_format=torch.channels_last)
    x.requires_grad_()
    flops = 3 * 2 * batch * 128 * 32 * 32 * 128 * 9  # forward, grad input, grad weight
    times = []
    for i in range(repeats + 2):
        sync(device)
        start = time.perf_counter()
        conv(x).sum().backward()
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return flops / statistics.median(times) / 1e9
