"""Ahead-of-time compile of every LC-loss kernel launch for an H100/H200 (sm_90), on any machine.

The launches are recorded from TritonLCLoss itself (a forward and a backward on CPU tensors, with
JITFunction.run replaced by a recorder), so the configurations (dtypes, block sizes, warps, stages)
are those the code really launches. Each one is specialised by Triton's own launch binder, as a
launch on the GPU would be (int arguments equal to 1 become constants, multiples of 16 get a
divisibility hint), and built with triton.compile for GPUTarget("cuda", 90, 32). The bundled
ptxas (run by triton.compile with -v) reports registers and spills; nothing else is needed offline.

The sweep runs in a child Python without TRITON_INTERPRET: under the interpreter (conftest.py sets
it on machines without a GPU) @triton.jit gives interpreted functions that cannot be compiled, and
_launch_config swaps bf16 for fp32. Run as a script from the repository root,
`PYTHONPATH=. python tests/test_kernel_compile.py [classes|all]` prints one JSON line per configuration:
that is how other triton versions, and every combination of shapes ("all"), are checked by hand.
"""
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path
from unittest import mock

import pytest
import torch

triton = pytest.importorskip("triton", exc_type=ImportError, reason="the kernels compile with Triton, which cannot be imported here")
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction, create_function_from_signature

# The Triton kernels and the autograd.Function that launches them.
LC_LOSS_MODULE = importlib.import_module("kernels.lc_loss_triton")

# Compiling every kernel for sm_90 ahead of time takes minutes on a CPU: the full suite's job.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
INT_ARGS = ("n_rows", "n_labeled", "dim")
BLOCK_AND_DTYPE_CONSTEXPRS = ("BLOCK_D", "BLOCK_OUT", "DOT", "ACC")  # reported with each configuration
# (N_l, N_u): n_rows = N_l + N_u and n_labeled in each of Triton's int classes: 1, a multiple of 16
# (0 included), anything else. n_rows = 1 only with N_l = 0.
ROW_SHAPES = [(0, 1), (1, 31), (16, 48), (5, 27), (1, 6), (32, 5), (17, 50)]
# dim = 1, and one multiple of 16 and one other dim per feature block size (16, 32, 64).
DIMS = [1, 7, 16, 20, 32, 40, 128]
SHAPES = {
    # Every int class of each argument and every feature block size, each once (with the model's
    # feature dim, 128, on the last): the test.
    "classes": [(n_labeled, n_unlabeled, dim) for (n_labeled, n_unlabeled), dim in zip(ROW_SHAPES, DIMS)],
    # Every combination: 588 configurations, 8-10 minutes on one core, by hand only.
    "all": [(n_labeled, n_unlabeled, dim) for n_labeled, n_unlabeled in ROW_SHAPES for dim in DIMS],
}
# lc_loss hands TritonLCLoss fp32 features as fp64; fp32 launches exist only for direct callers.
LC_LOSS_DTYPES = {str(dtype) for dtype in (torch.float64, torch.float16, torch.bfloat16)}
# Spilled bytes stored per thread that the launches lc_loss makes may have, by whether Triton knows
# the feature dim to be 1 or a multiple of 16 (the model's dims are). Other dims load rows unvectorised
# and unpipelined, through registers, and spill more. Measured with triton 3.8 (3.6), all shapes:
# at most 168 (224) B, the fp64 column kernel, on known dims, which spilled 2 KB at 4 warps; 1.5 KB,
# the half-precision column kernel at 4 warps, on other dims.
SPILL_BUDGET_BYTES = {"1": 256, "16k": 256, "any": 2048}  # by the class of dim
H100_MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory one block may use on sm_90


# Feature dims whose launches are also compiled with class ids (pairs of one class only): the model's,
# and one that is no multiple of 16 (the most spilling).
CLASS_DIMS = (7, 128)


def record_launches(dtype, n_labeled, n_unlabeled, dim, with_classes=False):
    """(kernel, args, kwargs) of every kernel launch of one forward and backward of TritonLCLoss."""
    launches = []

    def record(kernel, *args, grid, warmup, **kwargs):
        launches.append((kernel, args, kwargs))

    with mock.patch.object(JITFunction, "run", record):
        z = torch.zeros(n_labeled + n_unlabeled, dim, dtype=dtype, requires_grad=True)
        classes = torch.zeros(n_labeled + n_unlabeled, dtype=torch.long) if with_classes else None
        loss, _ = LC_LOSS_MODULE.TritonLCLoss.apply(z, n_labeled, 0.5, classes)
        loss.backward()
    return launches


def specialise(kernel, args, kwargs, backend):
    """signature, constexprs, attrs and options exactly as JITFunction.run derives them from a launch."""
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    int_classes = {name: _int_class(spec) for name, spec in zip(kernel.arg_names, specialization)
                   if name in INT_ARGS}
    return kernel._pack_args(backend, kwargs, bound_args, specialization, options), int_classes


def _int_class(spec):
    kind, value = spec
    if kind == "constexpr":
        return str(value)  # equal to 1: compiled in as a constant
    return "16k" if value == "D" else "any"


def ptxas_usage(log):
    """Registers, spill bytes and stack frame per thread from a `ptxas -v` log."""
    stack, stores, loads = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                     log).groups()
    registers = re.search(r"Used (\d+) registers", log).group(1)
    return dict(registers=int(registers), spill_stores=int(stores), spill_loads=int(loads), stack=int(stack))


def compile_for_sm90(source, options, target):
    """Build one kernel for the target; the compile's own ptxas -v log gives the resource usage."""
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True  # printed by triton.compile's ptxas step...
    knobs.compilation.always_compile = True  # ...which a cache hit would skip
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(source, target=target, options=options.__dict__)
    return dict(ptx_targets_sm90a=".target sm_90a" in compiled.asm["ptx"], cubin_bytes=len(compiled.asm["cubin"]),
                shared=compiled.metadata.shared, **ptxas_usage(log.getvalue()))


def launches_of(dtype, shapes):
    """(shape, kernel, args, kwargs) of the launches for each shape, with class ids too for CLASS_DIMS."""
    for shape in shapes:
        for with_classes in (False, True) if shape[2] in CLASS_DIMS else (False,):
            for kernel, args, kwargs in record_launches(dtype, *shape, with_classes):
                yield shape, kernel, args, kwargs


def sweep(shapes, dtypes):
    """One result per distinct compiled configuration that TritonLCLoss launches for these shapes."""
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)
    seen = set()
    for dtype in dtypes:
        for shape, kernel, args, kwargs in launches_of(dtype, shapes):
            (options, signature, constexprs, attrs), int_classes = specialise(kernel, args, kwargs, backend)
            source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
            key = (source.hash(), repr(options))
            if key in seen:
                continue
            seen.add(key)
            result = dict(kernel=kernel.__name__, dtype=str(dtype), shape=shape, **int_classes,
                          classes=bool(kwargs["HAS_CLASSES"]),
                          **{name: str(kwargs.get(name)) for name in BLOCK_AND_DTYPE_CONSTEXPRS},
                          num_warps=options.num_warps, num_stages=options.num_stages, triton=triton.__version__)
            try:
                result.update(compile_for_sm90(source, options, target))
            except Exception as error:  # reported per configuration, so one run lists every failure
                result["error"] = describe(error)
            yield result


def describe(error):
    """The error and its root cause with where it was raised (a CompilationError only names the kernel line)."""
    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    where = traceback.extract_tb(root.__traceback__)[-1] if root.__traceback__ else None
    place = f" at {Path(where.filename).name}:{where.lineno}: {where.line}" if where else ""
    return f"{type(error).__name__}: {str(error)[:1000]}\nroot cause: {type(root).__name__}: {root}{place}"


def run_sweep(name, tmp_path, children=os.cpu_count()):
    """The sweep in child Pythons without the interpreter, the dtypes shared out among them (one a
    core); their kernel caches stay in tmp_path."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, __file__, name, str(k), str(children)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for k in range(children)]
    results = []
    for proc in procs:
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-5000:]
        results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return results


def assert_all_compile(results):
    failed = [f"{r['kernel']} {r['dtype']} {r['shape']}: {r['error']}" for r in results if "error" in r]
    assert not failed, "\n".join(failed)
    for r in results:
        assert r["ptx_targets_sm90a"] and r["cubin_bytes"] > 0, r
        assert r["shared"] <= H100_MAX_SHARED_BYTES, r  # larger would fail at launch (OutOfResources)


def assert_spills_within_budget(results):
    used = [r for r in results if r["dtype"] in LC_LOSS_DTYPES]
    over = [r for r in used if r["spill_stores"] > SPILL_BUDGET_BYTES[r["dim"]]]
    assert used and not over, "\n".join(map(json.dumps, over))


def assert_covers_every_config(results):
    kernels = {"_lc_fwd_kernel", "_lc_bwd_rows_kernel", "_lc_bwd_cols_kernel"}
    dtypes = {str(dtype) for dtype in LC_LOSS_MODULE.DOT_DTYPES}  # every input dtype TritonLCLoss launches with
    assert {(r["kernel"], r["dtype"], r["classes"]) for r in results} == {
        (k, d, c) for k in kernels for d in dtypes for c in (False, True)}
    for name in INT_ARGS:
        assert {r[name] for r in results} == {"1", "16k", "any"}, name  # the shapes hit Triton's int classes


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_sweep("classes", tmp_path_factory.mktemp("sweep"))  # about 75 s on one core, 40 on two


def test_every_kernel_dtype_and_int_class_compiles_for_sm90(results):
    assert_covers_every_config(results)
    assert_all_compile(results)


def test_lc_loss_launches_spill_within_budget(results):
    assert_all_compile(results)
    assert_spills_within_budget(results)


if __name__ == "__main__":
    # python tests/test_kernel_compile.py [classes|all] [K N]: the dtypes K, K + N, ... (all without K N)
    part, parts = (int(a) for a in sys.argv[2:4]) if len(sys.argv) > 3 else (0, 1)
    shapes = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "classes"]
    for result in sweep(shapes, list(LC_LOSS_MODULE.DOT_DTYPES)[part::parts]):
        print(json.dumps(result), flush=True)
