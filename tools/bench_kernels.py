"""Benchmark of the LC loss, forward + backward: reference, torch path, torch.compile'd reference, Triton.

    python tools/bench_kernels.py                      # N in {160, 1024, 4096, 16384, 65536}, D = 128
    python tools/bench_kernels.py --dtype bfloat16 --sizes 1024,16384

N = N_l + N_u points with N_l = N / 5. Prints the median time and the peak extra memory (beyond the
inputs) of each method, and on CUDA checks the kernel's targets. On a CPU it runs what fits the
time and memory budgets, and says what it skipped and why.
"""
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# Tensors of 1 MiB and more get their own mmap, unmapped when freed, so the peak resident memory of
# a call shows what it allocated (glibc otherwise keeps freed memory and reuses it unseen).
if sys.platform == "linux" and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import click  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import lc_loss, lc_loss_reference  # noqa: E402

EPS = 2.0  # with unit-Gaussian features about half of all pairs are neighbours
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dense_bytes(n_labeled, n_unlabeled, itemsize):
    """What the reference holds at once: about a dozen N_a x N_b matrices (autograd included)."""
    return 12 * itemsize * (n_labeled * n_unlabeled + n_unlabeled * n_unlabeled)


def available_bytes():
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def fwd_bwd(fn, zl, zu):
    def step():
        zl.grad = zu.grad = None
        fn(zl, zu, EPS).backward()
    return step


def cpu_peak_extra(step):
    """Peak resident memory of one call beyond what was resident before it (Linux: resets VmHWM)."""
    def read(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = read("VmRSS:")
    step()
    return max(0, read("VmHWM:") - before)  # allocations under 1 MiB are noise here


def measure_cpu(step, repeat):
    start = time.perf_counter()
    step()  # warm-up (and compilation)
    warm = time.perf_counter() - start
    times = []
    for _ in range(max(1, min(repeat, int(10 / max(warm, 1e-3))))):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, cpu_peak_extra(step)


def measure_cuda(step, repeat):
    import triton.testing
    step()  # warm-up (and compilation)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(step, rep=max(25, 10 * repeat), return_mode="median")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return ms, torch.cuda.max_memory_allocated() - before


def methods(device):
    compiled = torch.compile(lc_loss_reference, dynamic=False)
    rows = [("reference", lc_loss_reference, None),
            ("torch path", lambda a, b, e: lc_loss(a, b, e, impl="torch"), None),
            ("compiled ref", compiled, None)]
    if device.type == "cuda":
        rows.append(("triton", lambda a, b, e: lc_loss(a, b, e, impl="triton"), None))
    else:
        rows.append(("triton", None, "CUDA only: Triton's CPU interpreter checks correctness, it is no speed path"))
    return rows


@click.command()
@click.option("--sizes", default="160,1024,4096,16384,65536", show_default=True,
              help="Comma-separated total point counts N = N_l + N_u (N_l = N/5).")
@click.option("--dim", default=128, show_default=True, help="Feature dimension D.")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="float32", show_default=True,
              help="Feature dtype.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: CUDA when available.")
@click.option("--repeat", default=5, show_default=True, help="Timed runs per measurement (CPU; fewer for slow ones).")
@click.option("--time-budget", default=120.0, show_default=True,
              help="Skip a method at a size where its predicted time (from the last size, O(N^2)) exceeds this many seconds.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random features.")
@click.option("--skip", type=click.Choice(["reference", "torch path", "compiled ref", "triton"]), multiple=True,
              help="Leave out a method (repeat for several); e.g. 'compiled ref' saves its compilations.")
def main(sizes, dim, dtype, device, repeat, time_budget, seed, skip):
    """Time and memory of the LC loss's implementations, forward + backward."""
    try:
        sizes = [int(s) for s in sizes.split(",")]
    except ValueError:
        raise click.BadParameter("a comma-separated list of integers", param_hint="--sizes")
    if any(n < 2 for n in sizes):
        raise click.BadParameter("every N must be >= 2", param_hint="--sizes")
    if device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device here", param_hint="--device")
    device = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    dtype = DTYPES[dtype]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"
    click.echo(f"# LC loss forward+backward | {name} | torch {torch.__version__} | D={dim} {str(dtype)[6:]} eps={EPS}")
    click.echo(f"{'N':>6} {'N_l':>6} {'method':<13} {'median ms':>11} {'peak extra MB':>14} {'vs reference':>13}")
    measure = measure_cuda if device.type == "cuda" else measure_cpu
    last = {}  # method -> (N, ms) of its last run, to predict the next
    results = {}
    gen = torch.Generator().manual_seed(seed)
    for n in sizes:
        n_labeled = n // 5
        zl = torch.randn(n_labeled, dim, generator=gen).to(device, dtype).requires_grad_()
        zu = torch.randn(n - n_labeled, dim, generator=gen).to(device, dtype).requires_grad_()
        for label, fn, why in methods(device):
            if label in skip:
                continue
            if why is None and label in last:
                prev_n, prev_ms = last[label]
                predicted = prev_ms / 1e3 * (n / prev_n) ** 2 * (2 + repeat)
                if device.type == "cpu" and predicted > time_budget:
                    why = f"predicted {predicted:.0f} s > --time-budget {time_budget:.0f} s"
            if why is None and device.type == "cpu" and label in ("reference", "compiled ref"):
                need = dense_bytes(n_labeled, n - n_labeled, zl.element_size())
                if need > 0.6 * available_bytes():
                    why = f"needs ~{need / 2**30:.0f} GiB, more than this machine can spare"
            if why is not None:
                click.echo(f"{n:>6} {n_labeled:>6} {label:<13} skipped: {why}")
                continue
            try:
                ms, peak = measure(fwd_bwd(fn, zl, zu), repeat)
            except torch.OutOfMemoryError:
                click.echo(f"{n:>6} {n_labeled:>6} {label:<13} out of memory")
                torch.cuda.empty_cache()
                last.pop(label, None)
                continue
            except Exception as exc:  # torch.compile fails on some set-ups: report it and go on
                click.echo(f"{n:>6} {n_labeled:>6} {label:<13} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
                continue
            last[label] = (n, ms)
            results[(n, label)] = (ms, peak)
            ref = results.get((n, "reference"))
            ratio = f"{ref[0] / ms:.2f}x" if ref and label != "reference" else ""
            peak_txt = "n/a" if peak is None else f"{peak / 2**20:.1f}"
            click.echo(f"{n:>6} {n_labeled:>6} {label:<13} {ms:>11.3f} {peak_txt:>14} {ratio:>13}")
    if device.type == "cuda":
        report_targets(results, sizes)


def report_targets(results, sizes):
    """The kernel's targets (docs/lc-loss.md), checked on what was measured."""
    def check(text, ok):
        click.echo(f"target: {text}: {'n/a' if ok is None else ('PASS' if ok else 'FAIL')}")
    t, r = lambda n: results.get((n, "triton")), lambda n: results.get((n, "reference"))
    small = min(sizes)
    check(f"triton at least as fast as the reference at N={small}",
          t(small) and r(small) and t(small)[0] <= r(small)[0])
    big = [n for n in sizes if n >= 8192 and t(n) and r(n)]
    check("triton >= 10x faster than the reference at N >= 8192",
          all(r(n)[0] / t(n)[0] >= 10 for n in big) if big else None)
    check("triton peak extra memory at N=16384 < 1% of the reference's",
          t(16384)[1] < 0.01 * r(16384)[1] if t(16384) and r(16384) else None)
    check("triton runs at N=65536", bool(t(65536)) if 65536 in sizes else None)


if __name__ == "__main__":
    main()
