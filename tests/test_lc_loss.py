"""The LC loss: Triton kernel and torch path against the float64 reference (paper Eq. 4-5).

On a machine without a GPU the Triton kernels run under TRITON_INTERPRET=1 (see conftest.py).
"""
import math
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch

from conftest import needs_triton
from kernels import lc_loss, lc_loss_reference
from kernels.lc_loss_torch import ChunkedLCLoss
from mtlc.errors import UserError
from mtlc.train.lc import fused_kernel_checked

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def seeded(request):
    """Fresh random inputs in every test, drawn from a seed of the test's own name: a failure
    reproduces when the test runs alone (-k)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
IMPLS = [pytest.param("triton", marks=needs_triton), "torch"]
# Relative tolerances per input dtype, on the loss and on each gradient (relative to its largest
# element). fp32 is docs/lc-loss.md's promise; the half types carry the rounding of their inputs'
# centred copies (bf16: 8 significant bits, fp16: 11) and of the loss and gradients they return.
RTOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}
# (N_l, N_u, D): off the 64-blocks and the 16/64 feature chunks, N_l = 0, N_u = 1, D = 1, D >= 1000
# (over two row and column blocks: the interpreter's cost grows with N^2 D, and larger N drive the
# same code; tools/gpu_check.py times the paper's sizes on a GPU).
SHAPES = [(0, 1, 1), (1, 1, 1), (0, 7, 3), (3, 5, 7), (30, 100, 2), (4, 16, 16), (16, 64, 64),
          (1, 130, 65), (10, 70, 100), (33, 65, 129), (64, 128, 128), (17, 50, 300),
          pytest.param((5, 70, 1000), marks=pytest.mark.slow), pytest.param((0, 40, 1024), marks=pytest.mark.slow)]


def clustered(n_labeled, n_unlabeled, dim, n_clusters, offset=0.0, side=1.0, dtype=torch.float32):
    """Fresh random points in boxes of the given side around cluster centres 3k apart in every feature.

    Inside a cluster d2 <= side^2; across clusters d2 >= (3 - side)^2. With side = 1 and eps = 2 no
    pair is within a factor 2 of the cut-off, so every dtype sees the same neighbour pairs.
    """
    direction = torch.randint(0, 2, (dim,), dtype=torch.float64) * 2 - 1
    which = torch.randint(0, n_clusters, (n_labeled + n_unlabeled, 1), dtype=torch.float64)
    points = offset + 3.0 * which * direction + side * (torch.rand(n_labeled + n_unlabeled, dim, dtype=torch.float64) - 0.5)
    points = points.to(dtype).to(DEVICE)
    return points[:n_labeled].clone(), points[n_labeled:].clone()


def reference_and_grads(z_labeled, z_unlabeled, eps, grad_out, classes=None):
    zl = z_labeled.detach().double().requires_grad_()
    zu = z_unlabeled.detach().double().requires_grad_()
    loss = lc_loss_reference(zl, zu, eps, classes=classes)
    gl, gu = torch.autograd.grad(loss, (zl, zu), grad_outputs=torch.tensor(grad_out, dtype=torch.float64,
                                                                           device=loss.device), allow_unused=True)
    return loss.detach(), (torch.zeros_like(zl) if gl is None else gl), gu


def loss_and_grads(z_labeled, z_unlabeled, eps, impl, grad_out, classes=None):
    zl = z_labeled.detach().requires_grad_()
    zu = z_unlabeled.detach().requires_grad_()
    loss = lc_loss(zl, zu, eps, impl=impl, classes=classes)
    gl, gu = torch.autograd.grad(loss, (zl, zu), grad_outputs=torch.tensor(grad_out, dtype=loss.dtype,
                                                                           device=loss.device))
    return loss.detach(), gl, gu


def assert_matches_reference(z_labeled, z_unlabeled, eps, impl, rtol, grad_out=None, classes=None):
    grad_out = grad_out if grad_out is not None else 0.5 + 2.0 * torch.rand(()).item()  # != 1
    ref, ref_gl, ref_gu = reference_and_grads(z_labeled, z_unlabeled, eps, grad_out, classes)
    loss, gl, gu = loss_and_grads(z_labeled, z_unlabeled, eps, impl, grad_out, classes)
    assert loss.dtype == z_labeled.dtype and gl.dtype == z_labeled.dtype and gu.dtype == z_labeled.dtype
    assert loss.dim() == 0
    torch.testing.assert_close(loss.double(), ref, rtol=rtol, atol=rtol * 1e-3)
    for got, want in ((gl, ref_gl), (gu, ref_gu)):
        assert torch.isfinite(got).all()
        scale = want.abs().max().item() if want.numel() else 0.0
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=rtol * scale + 1e-30)
    return ref


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_fp32(shape, impl):
    n_labeled, n_unlabeled, dim = shape
    zl, zu = clustered(n_labeled, n_unlabeled, dim, n_clusters=torch.randint(1, 6, ()).item())
    ref = assert_matches_reference(zl, zu, 2.0, impl, RTOL[torch.float32])
    if n_unlabeled > 1:
        assert ref > 0  # the shape exercises real neighbour pairs, not only the diagonal


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 7), (16, 64, 64), (33, 65, 129), pytest.param((5, 70, 1000), marks=pytest.mark.slow)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_half(shape, dtype, impl):
    zl, zu = clustered(*shape, n_clusters=3, dtype=dtype)
    assert_matches_reference(zl, zu, 2.0, impl, RTOL[dtype])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("where", ["labeled", "unlabeled"])
def test_a_non_finite_feature_makes_the_loss_nan(impl, where):
    """As lc_loss's docstring says: the fast paths never hide a NaN or an infinity (a training guard
    must see it), unlike the reference, which leaves that point's pairs out."""
    for bad in (float("nan"), float("inf")):
        zl, zu = clustered(5, 9, 16, n_clusters=2)
        (zl if where == "labeled" else zu)[1, 3] = bad
        assert torch.isnan(lc_loss(zl, zu, 2.0, impl=impl))
        assert torch.isfinite(lc_loss_reference(zl, zu, 2.0)) or bad == float("inf")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_reference_takes_half_precision_features_on_any_device(dtype):
    """What people compare their own loop against: fp16/bf16 features (whose cdist a CPU lacks) give
    the loss and gradients in their dtype, the fp64 reference's within the dtype's tolerance."""
    zl, zu = clustered(16, 64, 64, n_clusters=3, dtype=dtype)
    zl, zu = zl.detach().requires_grad_(), zu.detach().requires_grad_()
    loss = lc_loss_reference(zl, zu, 2.0)
    loss.backward()
    assert loss.dtype == zl.grad.dtype == zu.grad.dtype == dtype
    ref, ref_gl, ref_gu = reference_and_grads(zl, zu, 2.0, 1.0)
    torch.testing.assert_close(loss.double(), ref, rtol=RTOL[dtype], atol=RTOL[dtype] * 1e-3)
    for got, want in ((zl.grad, ref_gl), (zu.grad, ref_gu)):
        torch.testing.assert_close(got.double(), want, rtol=RTOL[dtype], atol=RTOL[dtype] * want.abs().max().item())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(0, 7, 3), (3, 5, 7), (30, 100, 2), (16, 64, 64), (1, 130, 65), (33, 65, 129)],
                         ids=lambda s: "x".join(map(str, s)))
def test_class_ids_match_reference(shape, dtype, impl):
    """Pairs of one class only (classes=): fresh random ids, some classes absent or alone, against the
    reference; the ids decide, so the same points give a smaller loss than without them."""
    n_labeled, n_unlabeled, dim = shape
    zl, zu = clustered(n_labeled, n_unlabeled, dim, n_clusters=2, dtype=dtype)
    classes = torch.randint(0, 4, (n_labeled + n_unlabeled,), device=DEVICE) * 7 - 3  # any integers
    assert_matches_reference(zl, zu, 2.0, impl, RTOL[dtype], classes=classes)
    if n_unlabeled > 5 and dtype == torch.float32:
        with_ids, fraction = lc_loss(zl, zu, 2.0, impl=impl, return_fraction=True, classes=classes)
        without, all_fraction = lc_loss(zl, zu, 2.0, impl=impl, return_fraction=True)
        assert fraction < all_fraction
        one_class = torch.full_like(classes, 5)
        assert torch.equal(lc_loss(zl, zu, 2.0, impl=impl, classes=one_class), without)


@pytest.mark.parametrize("impl", ["reference", *IMPLS])
def test_class_ids_by_hand(impl):
    """The hand-worked case of test_one_value_by_hand with classes: the labeled point and u1 in class
    0, u2 and u3 in class 1. L x U keeps d2 0.5 only (u2 is of another class); U x U keeps the three
    self-pairs (d2 = 0) only: u1-u2 are neighbours by distance but not by class."""
    z_l = torch.tensor([[0.0, 0.0]], dtype=torch.float64, device=DEVICE)
    z_u = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], dtype=torch.float64, device=DEVICE)
    classes = torch.tensor([0, 0, 1, 1], device=DEVICE)
    eps = 2.6
    expected = math.exp(-0.5 / eps) * 0.5 / 1 + 0.0 / 3
    fn = lc_loss_reference if impl == "reference" else (lambda *a, **k: lc_loss(*a, impl=impl, **k))
    assert fn(z_l, z_u, eps, classes=classes).item() == pytest.approx(expected, rel=1e-6)


def eps_between_pair_distances(z_labeled, z_unlabeled, quantile):
    """An eps in the widest gap of the pairs' exact d2 near the quantile, and its relative margin."""
    zl, zu = z_labeled.double(), z_unlabeled.double()
    d2 = torch.cat([torch.cdist(zl, zu).flatten(), torch.cdist(zu, zu).flatten()]).pow(2) / zl.shape[1]
    d2 = d2.unique().cpu()
    lo, hi = int(len(d2) * (quantile - 0.1)), int(len(d2) * (quantile + 0.1)) + 1
    window = d2[max(lo, 1):min(hi, len(d2))]
    gaps = window[1:] / window[:-1]
    k = int(gaps.argmax())
    eps = math.sqrt(window[k].item() * window[k + 1].item())
    return eps, math.sqrt(gaps[k].item()) - 1


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(4, 9, 5), (8, 24, 32), (0, 30, 128)], ids=lambda s: "x".join(map(str, s)))
def test_gaussian_features_fp32(shape, impl):
    zl = 3.0 * torch.randn(shape[0], shape[2], device=DEVICE)
    zu = 3.0 * torch.randn(shape[1], shape[2], device=DEVICE)
    eps, margin = eps_between_pair_distances(zl, zu, quantile=0.4)
    assert margin > 1e-5  # fp32 distances are good to ~1e-6: no pair changes side
    assert_matches_reference(zl, zu, eps, impl, RTOL[torch.float32])


@pytest.mark.parametrize("impl", IMPLS)
def test_no_neighbour_pairs(impl):
    # eps below every distance between distinct points: only the U x U diagonal (d2 = 0) is left.
    zl, zu = clustered(6, 20, 16, n_clusters=1, side=1.0)
    zl, zu = zl * 10, zu * 10  # spread 10: every off-diagonal d2 is far above 1e-6
    loss, gl, gu = loss_and_grads(zl, zu, 1e-6, impl, 1.0)
    assert loss.item() == 0.0
    assert torch.count_nonzero(gl) == 0 and torch.count_nonzero(gu) == 0
    assert lc_loss_reference(zl, zu, 1e-6).item() == 0.0  # the authors' code gives NaN here


@pytest.mark.parametrize("impl", IMPLS)
def test_every_pair_a_neighbour(impl):
    zl = torch.randn(12, 40, device=DEVICE)
    zu = torch.randn(50, 40, device=DEVICE)
    assert_matches_reference(zl, zu, 1e3, impl, RTOL[torch.float32])


@pytest.mark.parametrize("impl", IMPLS)
def test_near_duplicates_far_from_origin(impl):
    # One tight cluster 1000 away from the origin: |a|^2 ~ 1e6 against d2 ~ 1e-5. Without centring,
    # fp32 |a|^2 + |b|^2 - 2ab would lose every digit.
    zl, zu = clustered(20, 100, 128, n_clusters=1, offset=1000.0, side=1e-2)
    assert_matches_reference(zl, zu, 1.0, impl, RTOL[torch.float32])


@pytest.mark.parametrize("impl", IMPLS)
def test_tight_clusters_away_from_origin(impl):
    zl, zu = clustered(20, 150, 128, n_clusters=4, offset=30.0, side=0.05)
    assert_matches_reference(zl, zu, 2.0, impl, RTOL[torch.float32])


@pytest.mark.parametrize("impl", IMPLS + ["reference"])
def test_boundary_pair_counts_as_neighbour(impl):
    """Documents the cut-off: d2 == eps exactly is a neighbour (Eq. 4's <=), one fp32 ulp below it is not.

    The Triton kernel compares in fp32, the torch paths in fp64: pairs within rounding of eps may
    fall on either side in different implementations. The other tests keep every pair far from
    the cut-off for that reason.
    """
    zl = torch.tensor([[0.0]], device=DEVICE)
    zu = torch.tensor([[2.0]], device=DEVICE)  # d2 = 4, exactly representable on every path
    fn = lc_loss_reference if impl == "reference" else (lambda a, b, e: lc_loss(a, b, e, impl=impl))
    assert fn(zl, zu, 4.0).item() == pytest.approx(4.0 * math.exp(-1.0), rel=1e-6)
    assert fn(zl, zu, torch.nextafter(torch.tensor(4.0), torch.tensor(0.0)).item()).item() == 0.0


def test_reference_gradcheck():
    zl, zu = clustered(3, 6, 4, n_clusters=2, dtype=torch.float64)
    zl.requires_grad_()
    zu.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: lc_loss_reference(a, b, 2.0), (zl, zu))
    loss = lc_loss_reference(zl, zu, 2.0)
    assert loss > 0


@pytest.mark.parametrize("impl", IMPLS)
def test_bitwise_deterministic(impl):
    zl, zu = clustered(40, 150, 96, n_clusters=3)
    first = loss_and_grads(zl, zu, 2.0, impl, 1.3)
    second = loss_and_grads(zl, zu, 2.0, impl, 1.3)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_auto_picks_a_path_for_the_device():
    zl, zu = clustered(5, 20, 8, n_clusters=2)
    expected = "triton" if zl.is_cuda else "torch"
    assert torch.equal(lc_loss(zl, zu, 2.0), lc_loss(zl, zu, 2.0, impl=expected))


@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), float("inf"), "abc", None])
def test_invalid_eps(eps):
    zl, zu = torch.randn(2, 4), torch.randn(3, 4)
    for fn in (lc_loss, lc_loss_reference):
        with pytest.raises(ValueError, match="eps"):
            fn(zl, zu, eps)


@pytest.mark.parametrize("zl, zu, match", [
    (torch.randn(4), torch.randn(3, 4), "2-D"),
    (torch.randn(2, 4), torch.randn(3, 4, 1), "2-D"),
    (torch.randn(2, 4), torch.randn(3, 5), "feature dimensions differ"),
    (torch.randn(2, 4), torch.randn(3, 4, device="meta"), "is on"),
    (torch.randn(2, 4), torch.randn(0, 4), "at least one point"),
    (torch.ones(2, 4, dtype=torch.long), torch.randn(3, 4), "floating-point"),
])
def test_invalid_tensors(zl, zu, match):
    for fn in (lc_loss, lc_loss_reference):
        with pytest.raises(ValueError, match=match):
            fn(zl, zu, 1.0)


@pytest.mark.parametrize("classes, match", [
    (torch.zeros(4, dtype=torch.long), "N_l \\+ N_u = 5"),
    (torch.zeros(5, 1, dtype=torch.long), "1-D"),
    (torch.zeros(5), "integers"),
    (torch.zeros(5, dtype=torch.bool), "integers"),
    (torch.zeros(5, dtype=torch.long, device="meta"), "is on"),
    ([0, 0, 0, 0, 0], "1-D tensor"),
])
def test_invalid_classes(classes, match):
    for fn in (lc_loss, lc_loss_reference):
        with pytest.raises(ValueError, match=match):
            fn(torch.randn(2, 4), torch.randn(3, 4), 1.0, classes=classes)


def test_invalid_impl():
    with pytest.raises(ValueError, match="impl"):
        lc_loss(torch.randn(2, 4), torch.randn(3, 4), 1.0, impl="cuda")


@pytest.mark.slow
def test_torch_path_memory_is_bounded():
    """N_l = 4000, N_u = 16000, D = 128 forward + backward in under 1 GB of extra memory on CPU.

    A dense implementation needs N x N_u fp32 matrices of 1.28 GB each; the peak RSS of a fresh
    process tells how much the chunked path really allocated.
    """
    code = textwrap.dedent("""
        import resource, torch
        from kernels import lc_loss
        torch.manual_seed(0)
        def run(n_l, n_u):
            zl = torch.randn(n_l, 128, requires_grad=True)
            zu = torch.randn(n_u, 128, requires_grad=True)
            lc_loss(zl, zu, 2.0, impl="torch").backward()
        run(40, 160)  # warm-up: libraries and thread pools allocate on first use
        inputs = 2 * 20000 * 128 * 4 * 2  # the two inputs and their gradients
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        run(4000, 16000)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(after - before - inputs)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    extra = int(out.stdout.strip().splitlines()[-1])
    assert extra < 1e9, f"torch path used {extra / 1e9:.2f} GB of extra memory"


@pytest.mark.parametrize("chunk_pairs", [1, 37, 500])
def test_torch_path_chunks_match_reference(monkeypatch, chunk_pairs):
    # Chunk edges inside the labeled rows, on the labeled/unlabeled border and inside the unlabeled rows.
    monkeypatch.setattr(sys.modules["kernels.lc_loss_torch"], "CHUNK_PAIRS", chunk_pairs)
    zl, zu = clustered(50, 70, 9, n_clusters=3)
    assert_matches_reference(zl, zu, 2.0, "torch", RTOL[torch.float32])


@pytest.mark.parametrize("impl", IMPLS)
def test_neighbour_fraction(impl):
    zl, zu = clustered(7, 30, 5, n_clusters=3)
    loss, fraction = lc_loss(zl, zu, 2.0, impl=impl, return_fraction=True)
    d2 = torch.cat([torch.cdist(zl, zu).flatten(), torch.cdist(zu, zu).flatten()]).pow(2) / 5
    assert fraction.item() == pytest.approx((d2 <= 2.0).double().mean().item(), rel=1e-6)
    assert not fraction.requires_grad and torch.equal(loss, lc_loss(zl, zu, 2.0, impl=impl))


@pytest.mark.parametrize("impl", ["reference", *IMPLS])
def test_one_value_by_hand(impl):
    """Eq. 4-5 on 1 labeled and 3 unlabeled points in D = 2, worked out by hand. d2 is the MEAN over
    the features (the sum would double every distance), and each term is normalised by its own
    neighbour count (pooling the two terms' pairs would give another value)."""
    z_l = torch.tensor([[0.0, 0.0]], dtype=torch.float64, device=DEVICE)
    z_u = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], dtype=torch.float64, device=DEVICE)
    eps = 2.6
    w = lambda d2: math.exp(-d2 / eps)  # noqa: E731
    # L x U: d2 = 0.5, 2 (neighbours) and 9 (not): 2 neighbour pairs.
    term_lu = (w(0.5) * 0.5 + w(2.0) * 2.0) / 2
    # U x U, ordered, diagonal included: the 3 self-pairs (d2 = 0) and u1-u2 both ways (d2 = 2.5)
    # are neighbours; u1-u3 (6.5) and u2-u3 (5) are not: 5 neighbour pairs.
    term_uu = (2 * w(2.5) * 2.5) / 5
    loss = lc_loss_reference(z_l, z_u, eps) if impl == "reference" else lc_loss(z_l, z_u, eps, impl=impl)
    assert loss.item() == pytest.approx(term_lu + term_uu, rel=1e-6)  # Triton's d2 and sums are fp32
    assert loss.item() != pytest.approx((w(0.5) * 0.5 + w(2.0) * 2.0 + 2 * w(2.5) * 2.5) / 7, rel=1e-3)


def test_without_triton_the_torch_path_runs_and_a_cuda_run_is_told_the_pip_command(monkeypatch):
    """Triton installs on Linux only: where it cannot be imported, the loss needs it only for the
    fused kernel; on CPU tensors under the interpreter the torch path computes the same loss, and a
    CUDA run stops before its first step in one line naming the pip command."""
    module = sys.modules["kernels.lc_loss"]
    monkeypatch.setitem(sys.modules, "triton", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "kernels.lc_loss_triton", None)
    with pytest.warns(UserWarning, match="pip install triton"):
        assert module.triton_function(False) is ChunkedLCLoss
    with pytest.raises(ImportError, match="pip install triton"):
        module.triton_function(True)
    with pytest.raises(UserError, match=r"pip install triton \(Linux; or --device cpu\)"):
        fused_kernel_checked("cuda")
    fused_kernel_checked("cpu")
    zl, zu = torch.randn(3, 8, dtype=torch.float64), torch.randn(9, 8, dtype=torch.float64)
    assert torch.equal(lc_loss(zl, zu, 2.0, impl="torch"), lc_loss(zl, zu, 2.0))
