"""Linear algebra checks, nn and fft lowerings on ``tpu`` match CPU torch,
without CPU fallback; checks that validate values raise torch's errors."""

from __future__ import annotations

import re
import sys

import jax.numpy as jnp
import pytest
import torch
from conftest import no_fallback, programs_run, run_both

from lazytpu.lowering import conv

# -- _linalg_check_errors (Note [Deferred checks]) ------------------------------


@pytest.mark.parametrize(
    "fn",
    [torch.linalg.inv, torch.linalg.cholesky, lambda a: torch.linalg.solve(a, a[..., :1]), torch.linalg.lu_factor],
)
def test_linalg_checked_ops_match(fn, eager_mode):
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    a = a @ a.mT + 4 * torch.eye(4, dtype=torch.float64)
    with no_fallback():
        run_both(fn, a.requires_grad_(), mode_name=eager_mode, grad=fn is not torch.linalg.lu_factor)


def test_linalg_check_fuses():
    a = torch.randn(4, 4)
    a = (a @ a.T + torch.eye(4)).to("tpu")

    def step():
        torch.linalg.cholesky(torch.linalg.inv(a)).sum().item()

    assert programs_run(step) == 1


@pytest.mark.parametrize("b_dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("left", [True, False])
def test_solve_triangular_of_mixed_dtypes_solves_in_a_dtype(b_dtype, left):
    # CPU casts B to A's dtype; the lowering once handed JAX both dtypes and the program failed at the next read
    a = (torch.eye(3) * 2 + torch.ones(3, 3).tril()).requires_grad_()
    b = torch.randn(2, 3, 3).to(b_dtype).requires_grad_()
    with no_fallback():
        out = run_both(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=left), a, b, grad=True)
    assert out.dtype == torch.float32


@pytest.mark.parametrize(
    "fn",
    [torch.linalg.inv, torch.linalg.cholesky, lambda a: torch.linalg.solve(a, a[..., :1]), torch.linalg.lu_factor],
)
def test_linalg_check_raises_torch_error(fn, eager_mode):
    a = torch.zeros(2, 3, 3)
    a[:, 0, 0] = 1
    with pytest.raises(RuntimeError) as expected:  # LinAlgError, or RuntimeError for lu_factor
        fn(a)
    with torch.tpu.set_eager_mode(eager_mode), pytest.raises(RuntimeError) as actual:
        code = getattr(fn, "__code__", None)  # the innermost user line: the lambda's, else this call's
        line = code.co_firstlineno if code is not None else sys._getframe().f_lineno + 1
        out = fn(a.to("tpu"))
        (out[0] if isinstance(out, tuple) else out).cpu()  # at the latest when the result is read
    assert type(actual.value) is type(expected.value)
    if eager_mode == "strict":  # raised at the call, as on CPU
        assert str(actual.value) == str(expected.value)
    else:  # raised at the read, naming the op and the line that recorded it (Note [Deferred checks])
        api = "torch." + str(expected.value).split(":")[0].removeprefix("torch.")
        assert str(actual.value) == f"{expected.value} ({api} recorded at {__file__}:{line})"
    ok = torch.eye(3).to("tpu")
    assert torch.linalg.inv(ok).cpu().equal(torch.eye(3))  # the error does not linger


# -- conjugation and FFTs of real inputs (torch conjugates the r2c result) -------


@pytest.mark.parametrize(
    "fn",
    [
        torch.conj,
        lambda x: x.conj().conj() * 2,
        lambda x: x.mH @ x,
        lambda x: torch.fft.ifft(x.real, n=6, norm="ortho"),
        lambda x: torch.fft.ihfft2(x.real),
        lambda x: torch.fft.hfftn(x, dim=(0, 1)),
    ],
)
def test_conj_and_hermitian_ffts(fn, eager_mode):
    x = torch.randn(4, 5, dtype=torch.complex128)
    with no_fallback():
        run_both(fn, x, mode_name=eager_mode, rtol=1e-7, atol=1e-7)


def test_fft_real_input_grad():
    x = torch.randn(3, 8, requires_grad=True)
    with no_fallback():
        run_both(lambda t: torch.fft.ifft(t).imag * 3 + torch.fft.ifft(t).real, x, grad=True, rtol=1e-4, atol=1e-5)


# -- pooling -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,size",
    [((2, 3, 7), (3,)), ((2, 3, 7, 5), (3, 4)), ((3, 7, 5), (7, 2)), ((1, 2, 5, 6, 7), (2, 3, 4))],
)
def test_adaptive_max_pool(shape, size, eager_mode):
    x = torch.randn(shape)
    x.flatten()[::7] = 0.5  # ties: the first wins
    fn = getattr(torch.nn.functional, f"adaptive_max_pool{len(size)}d")
    with no_fallback():
        run_both(lambda t: fn(t, size, return_indices=True), x.requires_grad_(), mode_name=eager_mode, grad=True)


def test_adaptive_max_pool_nan_and_bf16():
    x = torch.randn(2, 6, 9, dtype=torch.bfloat16)
    x[0, 0, 1] = x[0, 0, 2] = float("nan")  # the last NaN of a window wins
    with no_fallback():
        run_both(lambda t: torch.nn.functional.adaptive_max_pool1d(t, 4, return_indices=True), x)


# -- normalization statistics (Note [CPU norm statistics]) -----------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_statistics(dtype, training, eager_mode):
    x = torch.randn(3, 2, 4, dtype=dtype)
    mean, var = torch.zeros(2, dtype=dtype), torch.ones(2, dtype=dtype)
    for op in (torch.ops.aten.native_batch_norm, torch.ops.aten._native_batch_norm_legit):
        with no_fallback():
            run_both(
                lambda t, m, v, op=op: op(t, None, None, m, v, training, 0.1, 1e-5), x, mean, var, mode_name=eager_mode
            )


def test_native_layer_norm_statistics_dtype():
    x = torch.randn(3, 2, 4, dtype=torch.float16)
    with no_fallback():
        run_both(lambda t: torch.ops.aten.native_layer_norm(t, [4], None, None, 1e-5), x)


# -- custom ops with a Python body (dispatch step 6) ------------------------------


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_chunked(reduction):
    x, w = torch.randn(5, 3, requires_grad=True), torch.randn(7, 3, requires_grad=True)
    target = torch.randint(0, 7, (5,))
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)

    def fn(a, b, t):
        return torch.nn.functional.linear_cross_entropy(a, b, t, reduction=reduction, options=options)

    with no_fallback():
        run_both(fn, x, w, target, grad=True, rtol=1e-5, atol=1e-5)


# -- scaled matrix products: integer scalars truncate, half precision rounds as CPU ----


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16])
@pytest.mark.parametrize(
    "fn,shapes",
    [
        (torch.addmv, [(5,), (5, 4), (4,)]),
        (torch.addbmm, [(3, 6), (4, 3, 5), (4, 5, 6)]),
        (torch.baddbmm, [(1,), (4, 3, 5), (4, 5, 6)]),
        (torch.addr, [(5, 6), (5,), (6,)]),
    ],
)
def test_scaled_products(fn, shapes, dtype):
    args = [torch.randint(-9, 9, s).to(dtype) if dtype == torch.int64 else torch.randn(s).to(dtype) * 9 for s in shapes]
    if fn is torch.addr and dtype == torch.int64:  # torch refuses float scalars here
        with pytest.raises(RuntimeError, match="must not be a floating point number"):
            fn(*[a.to("tpu") for a in args], beta=1.7)
        return
    with no_fallback():
        run_both(lambda a, b, c: fn(a, b, c, beta=1.7, alpha=2.6), *args)
        run_both(lambda a, b, c: fn(a, b, c, beta=0.2, alpha=0.6), *args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape,kernel,out",
    [
        ((2, 3, 9, 11), 3, (4, 5)),
        ((3, 9, 11), (2, 3), (5, 4)),
        ((2, 2, 7, 8, 9), (3, 2, 2), (3, 4, 5)),
        ((1, 2, 8, 8), (0, 2), (4, 4)),  # empty windows: -inf at each window's start (the lowering failed)
        ((1, 1, 4, 4, 4), (1, 0, 2), (2, 2, 2)),
    ],
)
def test_fractional_max_pool_given_samples(shape, kernel, out, dtype, eager_mode):
    nd = len(out)
    x = torch.randn(shape, dtype=dtype)
    samples = torch.rand(shape[0] if len(shape) == nd + 2 else 1, shape[-nd - 1], nd, dtype=dtype)
    fn = getattr(torch.nn.functional, f"fractional_max_pool{nd}d")

    def pool(t, u):
        return fn(t, kernel, output_size=out, return_indices=True, _random_samples=u)

    with no_fallback():
        # CPU's backward of empty windows fails an internal assert
        grad = dtype == torch.float32 and 0 not in torch.Size([kernel] if isinstance(kernel, int) else kernel)
        run_both(pool, x.requires_grad_(grad), samples, mode_name=eager_mode, grad=grad)


# -- im2col / col2im (Note [im2col order]) ----------------------------------------


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 3, 5, 5), dict(kernel_size=2)),
        ((3, 6, 7), dict(kernel_size=(2, 3), dilation=(2, 1), padding=1, stride=(2, 1))),
        ((1, 2, 4, 4), dict(kernel_size=3, padding=2, stride=3)),
    ],
)
def test_unfold_fold(shape, kw, eager_mode):
    x = torch.randn(shape, requires_grad=True)
    F = torch.nn.functional
    with no_fallback():
        cols = run_both(lambda t: F.unfold(t, **kw), x, mode_name=eager_mode, grad=True)
        c = cols.detach().cpu().requires_grad_()
        run_both(lambda t: F.fold(t, shape[-2:], **kw), c, mode_name=eager_mode, grad=True)


def test_unfold_bool_and_int():
    x = torch.randint(0, 3, (2, 2, 4, 5))
    with no_fallback():
        run_both(lambda t: torch.nn.functional.unfold(t.bool(), (2, 3), padding=1), x)
        run_both(lambda t: torch.nn.functional.fold(t, (3, 6), 2), x.reshape(2, 4, 10).double())


# -- margin losses' backward ---------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_margin_losses_backward(reduction, eager_mode):
    F = torch.nn.functional
    x = torch.randn(4, 5, requires_grad=True)
    target = torch.tensor([1, 0, 4, 2])
    labels = torch.tensor([[1, 3, -1, 0, 0], [0, -1, 2, 2, 2], [4, 3, 2, 1, 0], [-1, 0, 0, 0, 0]])
    weight = torch.rand(5)
    with no_fallback():
        run_both(
            lambda t, y, w: F.multi_margin_loss(t, y, p=2, weight=w, reduction=reduction), x, target, weight, grad=True
        )
        run_both(lambda t, y: F.multi_margin_loss(t[0], y[:1], margin=0.5, reduction=reduction), x, target, grad=True)
        run_both(lambda t, y: F.multilabel_margin_loss(t, y, reduction=reduction), x, labels, grad=True)
        # one sample: a 0-d target (and any 1-d multilabel one) gives a 0-d loss on CPU; it was (1,)
        # (Note [Meta shape fixes] in lazytpu/frontend/metas.py)
        run_both(lambda t, y: F.multi_margin_loss(t[0], y[0], reduction=reduction), x, target, grad=True)
        run_both(lambda t, y: F.multi_margin_loss(t[0, 0], y[1], reduction=reduction), x, target, grad=True)
        run_both(lambda t, y: F.multilabel_margin_loss(t[0], y[0], reduction=reduction), x, labels, grad=True)


# -- cdist ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 0.5, 3.0, float("inf")])
@pytest.mark.parametrize("rows,mode", [(4, "use_mm_for_euclid_dist_if_necessary"), (30, "use_mm_for_euclid_dist")])
def test_cdist(p, rows, mode):
    torch.manual_seed(0)
    x1, x2 = torch.randn(2, rows, 3, requires_grad=True), torch.randn(2, 5, 3, requires_grad=True)
    if rows < 25:  # a zero distance: zero gradient (the matrix-product form rounds it to noise)
        x2.data[0, 0] = x1.data[0, 0]
        x2.data[1, 1, 0] = x1.data[1, 0, 0]  # one equal coordinate: zero, not NaN, below p = 1
    with no_fallback():
        run_both(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), x1, x2, grad=p != 0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shape1,shape2",
    [((0, 4, 5), (3, 5)), ((2, 0, 4, 5), (3, 5)), ((3, 5), (0, 4, 5)), ((2, 0, 5), (2, 3, 5)), ((4, 5), (2, 3, 5))],
)
def test_cdist_backward_over_empty_or_broadcast_batches(shape1, shape2):
    """PyTorch's test_ops_gradients sample: the other input's batch broadcast,
    or nothing to differentiate. CPU's kernel returns zeros of ``x1``'s own
    shape when there are no distances (the lowering broadcast it and failed)."""
    x1 = torch.randn(shape1, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(shape2, dtype=torch.float64, requires_grad=True)
    with no_fallback():
        run_both(torch.cdist, x1, x2, grad=True)
        dist = torch.cdist(x1, x2).detach()
        grad = torch.randn(dist.shape, dtype=torch.float64)
        backward = torch.ops.aten._cdist_backward
        run_both(lambda g, a, b, d: backward(g, a, b, 2.0, d), grad, x1.detach(), x2.detach(), dist)


# -- rrelu ---------------------------------------------------------------------------


def test_rrelu_eval_matches(eager_mode):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    with no_fallback():
        run_both(lambda t: torch.nn.functional.rrelu(t, 0.1, 0.3, training=False), x, mode_name=eager_mode, grad=True)


def test_rrelu_training_draws_and_writes_noise():
    x = torch.randn(200).to("tpu").requires_grad_()
    noise = torch.zeros(200, device="tpu")
    with no_fallback():
        out = torch.ops.aten.rrelu_with_noise(x, noise, 0.1, 0.3, True)
        out.sum().backward()
    x, out, noise, grad = x.detach().cpu(), out.detach().cpu(), noise.cpu(), x.grad.cpu()
    negative = x <= 0
    assert torch.all(noise[~negative] == 1)
    assert torch.all((noise[negative] >= 0.1) & (noise[negative] < 0.3))
    assert len(noise[negative].unique()) > 10  # drawn, not a constant slope
    torch.testing.assert_close(out, x * noise)
    torch.testing.assert_close(grad, noise)


def test_rrelu_in_place_training_runs_on_the_device():
    leaf = torch.randn(200).to("tpu").requires_grad_()
    with no_fallback():
        x = leaf * 1
        out = torch.nn.functional.rrelu_(x, 0.1, 0.3, training=True)
        out.sum().backward()
    assert out is x
    x, base, grad = x.detach().cpu(), leaf.detach().cpu(), leaf.grad.cpu()
    negative = base <= 0
    torch.testing.assert_close(x[~negative], base[~negative])
    slope = x[negative] / base[negative]
    assert torch.all((slope >= 0.1) & (slope < 0.3)) and len(slope.unique()) > 10
    torch.testing.assert_close(grad[negative], slope)


# -- embedding max_norm (embedding_renorm_) ---------------------------------------------


@pytest.mark.parametrize("dtype,norm_type", [(torch.float32, 2.0), (torch.bfloat16, 1.0), (torch.float64, 3.0)])
def test_embedding_max_norm_renormalizes_in_place(dtype, norm_type, eager_mode):
    weight = torch.randn(10, 4, dtype=dtype) * 3
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])

    def fn(w, i):
        out = torch.nn.functional.embedding(i, w, max_norm=1.5, norm_type=norm_type)
        return out, w  # the weight's touched rows are renormalized in place

    with no_fallback():
        run_both(fn, weight, idx, mode_name=eager_mode)


# -- embedding bags (Note [Embedding bag outputs]) ----------------------------------------


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("extra", [dict(), dict(padding_idx=2), dict(include_last_offset=True)])
def test_embedding_bag(mode, extra, eager_mode):
    weight = torch.randn(10, 3, requires_grad=True)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2]), torch.tensor([0, 4, 4, 9])
    if extra.get("include_last_offset"):
        offsets = torch.tensor([0, 4, 4, 9])

    def fn(w, i, o):
        return torch.nn.functional.embedding_bag(i, w, o, mode=mode, **extra)

    with no_fallback():
        run_both(fn, weight, idx, offsets, mode_name=eager_mode, grad=True)


def test_embedding_bag_per_sample_weights():
    weight, psw = torch.randn(10, 3, requires_grad=True), torch.rand(9, requires_grad=True)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2]), torch.tensor([0, 4, 6])

    def fn(w, i, o, p):
        return torch.nn.functional.embedding_bag(i, w, o, mode="sum", per_sample_weights=p)

    with no_fallback():
        run_both(fn, weight, idx, offsets, psw, grad=True)


def test_geqrf(eager_mode):
    a = torch.randn(2, 5, 3, dtype=torch.float64)
    with no_fallback():
        run_both(torch.geqrf, a, mode_name=eager_mode)


# -- complex32 (Note [complex32 storage]) ----------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.chalf(),
        lambda x: torch.complex(x.half(), (x * 3).half()),
        lambda x: torch.view_as_complex(x.half().reshape(3, 2, 2)),
        lambda x: torch.view_as_real(x.chalf()) * 2,
        lambda x: (x.chalf(), x.chalf().to(torch.complex64) * 1e-3),
    ],
)
def test_complex32(fn, eager_mode):
    x = torch.randn(3, 4) * 100 + 1e-3  # parts rounded to float16 where torch rounds them
    with no_fallback():
        out = run_both(fn, x, mode_name=eager_mode)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o.device.type == "tpu" for o in outs)


def test_complex32_upload_download():
    z = torch.complex(torch.randn(5).half(), torch.randn(5).half())
    t = z.to("tpu")
    assert t.dtype is torch.complex32
    assert torch.equal(torch.view_as_real(t.cpu()), torch.view_as_real(z))


# -- least squares (Note [lstsq drivers]) ----------------------------------------------


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shapes", [((2, 6, 3), (2, 6, 2)), ((3, 5), (3, 2)), ((6, 3), (6,)), ((6, 3), "deficient")])
def test_linalg_lstsq(driver, shapes, eager_mode):
    sa, sb = shapes
    a = torch.randn(*sa, dtype=torch.float64)
    if sb == "deficient":  # rank 2 of 3: gelsd/gelss report no residuals
        a[:, 2] = a[:, 0] + a[:, 1]
        sb = (6, 2)
        if driver == "gels":
            return  # gels assumes full rank (LAPACK's result is arbitrary)
    b = torch.randn(*sb, dtype=torch.float64)
    with no_fallback():
        out = run_both(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver=driver)), a, b, mode_name=eager_mode)
    assert out[2].dtype is torch.int64


def test_linalg_lstsq_grad():
    a, b = torch.randn(5, 3, requires_grad=True), torch.randn(5, 2, requires_grad=True)
    with no_fallback():
        run_both(lambda x, y: torch.linalg.lstsq(x, y).solution, a, b, grad=True)


# -- CTC loss (Note [CTC in log space]) ------------------------------------------------


@pytest.mark.parametrize("layout", ["padded", "concatenated", "unbatched"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss(layout, reduction, zero_infinity, eager_mode):
    torch.manual_seed(0)
    t, n, c = 12, 4, 6
    log_probs = torch.randn(t, n, c, dtype=torch.float64).log_softmax(2).requires_grad_()
    il = torch.tensor([12, 9, 3, 12])
    tl = torch.tensor([5, 4, 3, 0])  # the third cannot align (3 frames, repeated labels need 4); the last is empty
    targets = torch.tensor([[1, 2, 2, 3, 1], [4, 4, 5, 1, 0], [2, 2, 3, 0, 0], [0, 0, 0, 0, 0]])
    if layout == "concatenated":
        targets = torch.cat([row[:k] for row, k in zip(targets, tl.tolist())])
    if layout == "unbatched":
        log_probs = log_probs[:, 0].detach().requires_grad_()
        targets, il, tl = targets[0], il[0], tl[0]
    grad = zero_infinity or layout == "unbatched"  # an infinite loss has a NaN gradient in torch

    def fn(lp, tg, i, k):
        return torch.nn.functional.ctc_loss(lp, tg, i, k, blank=0, reduction=reduction, zero_infinity=zero_infinity)

    with no_fallback():
        run_both(fn, log_probs, targets, il, tl, mode_name=eager_mode, grad=grad)


# -- LDL^T (Note [Bunch-Kaufman]) ------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 7])
def test_ldl_factor_pivots_match_lapack(n, eager_mode):
    torch.manual_seed(n)
    a = torch.randn(6, n, n, dtype=torch.float64)
    a = a + a.mT
    a[::2].diagonal(dim1=-2, dim2=-1).mul_(0.01)  # small diagonals: 2x2 pivots and interchanges
    a[1, 0, 0] = 0
    b = torch.randn(6, n, 2, dtype=torch.float64)

    def fn(x, y):
        ld, piv, info = torch.linalg.ldl_factor_ex(x)
        return ld, piv, info, torch.linalg.ldl_solve(ld, piv, y)

    with no_fallback():
        out = run_both(fn, a, b, mode_name=eager_mode)
    assert out[1].dtype is torch.int32


def test_ldl_factor_singular_info():
    a = torch.zeros(2, 3, 3)
    a[1] = torch.eye(3)
    with no_fallback():
        run_both(lambda x: tuple(torch.linalg.ldl_factor_ex(x)), a)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_soft_margin_loss_rounds_each_step(dtype, reduction):
    x = torch.tensor([3.6113, -8.0703, -0.5737, 3.1289, -3.0332, 12.0], dtype=dtype)  # exp(65) overflows float16
    y = torch.tensor([-1.0, 8.0, 1.0, -1.0, 1.0, -1.0], dtype=dtype)
    with no_fallback():
        run_both(lambda a, b: torch.nn.functional.soft_margin_loss(a, b, reduction=reduction), x, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bilinear_half_rounds_as_cpu(dtype):
    torch.manual_seed(0)
    x1, x2 = torch.randn(7, 3, 5, dtype=dtype), torch.randn(7, 3, 4, dtype=dtype)
    w, b = torch.randn(6, 5, 4, dtype=dtype, requires_grad=True), torch.randn(6, dtype=dtype)
    with no_fallback():
        run_both(torch.nn.functional.bilinear, x1, x2, w, b, grad=True, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape, size", [((2, 3, 7, 6, 9), (3, 4, 2)), ((3, 5, 5, 4), (2, 5, 3))])
def test_adaptive_avg_pool3d_half_sums_in_dtype(dtype, shape, size):
    x = torch.randn(shape, dtype=dtype) * 30 + 20  # window sums past bf16's exact integers
    with no_fallback():
        run_both(lambda a: torch.nn.functional.adaptive_avg_pool3d(a, size), x, atol=0, rtol=0)


def test_dtype_changing_view_of_strided_complex():
    """``real``/``view_as_real`` of a diagonal is computed as a value with
    non-dense meta strides; reading it in a program must see its elements
    (linalg_eig_backward multiplies by ``real(diag(V^H gV))``)."""
    m, v = torch.randn(4, 4, dtype=torch.complex64), torch.randn(4, 4, dtype=torch.complex64)
    with no_fallback():
        run_both(lambda a, b: b * torch.real(a.diagonal()).unsqueeze(-2), m, v)
        run_both(lambda a: torch.view_as_real(a.diagonal()) * 2, m)


def test_linalg_eig_grad():
    a = torch.randn(5, 5, requires_grad=True)
    with no_fallback():
        run_both(lambda x: torch.linalg.eig(x)[1].abs(), a, grad=True, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "nd, stride, padding, dilation, output_padding, groups",
    [
        (2, (2, 2), (1, 1), (1, 1), (1, 0), 1),
        (3, (2, 1, 2), (1, 0, 1), (1, 2, 1), (1, 0, 0), 2),
        (1, (3,), (2,), (2,), (1,), 2),
    ],
)
def test_conv_transpose_float16_col2im(nd, stride, padding, dilation, output_padding, groups):
    torch.manual_seed(0)
    x, w = (
        torch.randn((2, 4) + (5,) * nd, dtype=torch.float16) * 3,
        torch.randn((4, 3) + (3,) * nd, dtype=torch.float16),
    )
    bias = torch.randn(3 * groups, dtype=torch.float16)
    fn = [None, torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d][nd] if nd < 3 else None
    fn = fn or torch.nn.functional.conv_transpose3d
    # bit for bit where CPU torch takes col2im; where it takes oneDNN's float16 kernels (AVX512-FP16 hosts),
    # their own order of accumulation is not reproduced: float16's tolerance
    exact = conv._slow_conv_transpose(jnp.float16, stride, output_padding)
    with no_fallback():
        run_both(
            lambda a, b, c: fn(a, b, c, stride, padding, output_padding, groups, dilation),
            x,
            w,
            bias,
            **(dict(atol=0, rtol=0) if exact else {}),
        )


@pytest.mark.parametrize("output_padding", [(1, 0), (2, 3)])  # (2, 3) >= stride: torch leaves oneDNN for col2im
def test_conv_transpose_bfloat16_paths(output_padding):
    torch.manual_seed(0)
    x, w = torch.randn(2, 2, 4, 4, dtype=torch.bfloat16) * 3, torch.randn(2, 2, 4, 5, dtype=torch.bfloat16)
    bias = torch.randn(4, dtype=torch.bfloat16)

    def fn(a, b, c):
        return torch.nn.functional.conv_transpose2d(a, b, c, (3, 2), (1, 2), output_padding, 2, (4, 4))

    with no_fallback():
        run_both(fn, x, w, bias, atol=0, rtol=0)


@pytest.mark.parametrize("where", ["lengths", "targets and lengths"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_loss_takes_cpu_lengths(where, reduction):
    """As on CUDA, the lengths (and the targets) may stay on the CPU: torch
    reads the lengths to the host anyway (they were refused: the mean divided
    the tpu loss by a CPU tensor)."""
    torch.manual_seed(0)
    log_probs = torch.randn(6, 2, 4).log_softmax(2)
    targets, il, tl = torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]), torch.tensor([2, 2])
    lp_cpu, lp_tpu = log_probs.clone().requires_grad_(), log_probs.to("tpu").requires_grad_()
    expected = torch.nn.functional.ctc_loss(lp_cpu, targets, il, tl, reduction=reduction)
    tpu_targets = targets if where == "targets and lengths" else targets.to("tpu")
    with no_fallback():
        got = torch.nn.functional.ctc_loss(lp_tpu, tpu_targets, il, tl, reduction=reduction)
        got.sum().backward()
    expected.sum().backward()
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(lp_tpu.grad.cpu(), lp_cpu.grad)


@pytest.mark.parametrize("shape,kernel,out", [((1, 3, 9, 11), 3, (4, 5)), ((1, 2, 7, 8, 9), (3, 2, 2), (3, 4, 5))])
def test_fractional_max_pool_reads_the_first_rows_of_larger_samples(shape, kernel, out):
    """Samples for a larger batch (a module built with ``_random_samples`` for
    batch 2, called on batch 1): CPU's kernels read the first rows (a LoweringError here)."""
    nd = len(out)
    x, samples = torch.randn(shape), torch.rand(2, shape[1], nd)
    fn = getattr(torch.nn.functional, f"fractional_max_pool{nd}d")
    with no_fallback():
        run_both(lambda t, u: fn(t, kernel, output_size=out, return_indices=True, _random_samples=u), x, samples)


# -- out= through composite kernels, views they write through ---------------------------


def _written_out(d):
    """``out=`` forms whose composite kernels write through ``_unsafe_view`` or
    make a new tensor for a subclass: the out tensor stayed unwritten (zeros)."""
    a, b = torch.tensor([[1.0], [2.0]]).to(d), torch.tensor([[10.0, 20.0, 30.0]]).to(d)
    kron = torch.zeros(2, 3, device=d)
    torch.kron(a, b, out=kron)
    m = torch.eye(4).expand(2, 4, 4).clone()
    m[1, 3, 3] = 0
    ranks = [torch.zeros(2, dtype=torch.int64, device=d) for _ in range(3)]
    torch.linalg.matrix_rank(m.to(d), out=ranks[0])
    torch.linalg.matrix_rank(m.to(d), atol=0.5, rtol=0.0, out=ranks[1])
    torch.linalg.matrix_rank(m.to(d), tol=torch.tensor(0.5).to(d), out=ranks[2])
    base = torch.zeros(6, device=d)
    torch.ops.aten._unsafe_view(base, [2, 3]).add_(1)  # a view of base, as on CPU
    batch, matrix = torch.arange(12.0).reshape(2, 3, 2).to(d), torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(d)
    products = [torch.empty(2, 3, 2, device=d), torch.empty(2, 3, device=d)]  # matmul folds the batch
    torch.matmul(batch, matrix, out=products[0])
    torch.matmul(batch, matrix[0], out=products[1])
    return [t.cpu().tolist() for t in (kron, *ranks, base, *products)]


def test_out_forms_of_composite_kernels_write_their_out_tensor():
    assert _written_out("tpu") == _written_out("cpu")


@pytest.mark.parametrize("out", [torch.zeros(()), torch.zeros(0), torch.zeros((), dtype=torch.int64)])
def test_matrix_rank_into_an_out_tensor_of_another_device_raises_cpus_error(out):
    """It wrote the rank into the CPU tensor (or failed inside lazytpu)."""
    m = torch.eye(3).to("tpu")
    with pytest.raises(
        RuntimeError,
        match="^torch.linalg.matrix_rank: Expected result and input tensors to be on the "
        "same device, but got result on cpu and input on tpu:0$",
    ):
        torch.linalg.matrix_rank(m, out=out)
    assert out.sum().item() == 0


@pytest.mark.parametrize("uplo", ["U", "u", "L", "l"])
def test_eigh_reads_the_triangle_uplo_names_in_either_case(uplo):
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # not symmetric
    expected = torch.linalg.eigvalsh(a, UPLO=uplo)
    torch.testing.assert_close(torch.linalg.eigvalsh(a.to("tpu"), UPLO=uplo).cpu(), expected)
    torch.testing.assert_close(torch.linalg.eigh(a.to("tpu"), UPLO=uplo)[0].cpu(), expected)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("rcond", [-1.0, 0.0, 1e-4, 0.5, 1.0, 2.0])
def test_lstsq_with_an_explicit_rcond(driver, rcond):
    """A given ``rcond`` is lifted to a program input (its comparison failed to
    lower); LAPACK's ranges: gelsd takes one outside (0, 1), any driver a negative
    one, for the precision. gelsy's rank-revealing QR truncates other columns than
    the SVD does, so its solutions are compared where no singular value is dropped."""
    torch.manual_seed(0)
    a, b = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)
    expected = torch.linalg.lstsq(a, b, rcond=rcond, driver=driver)
    got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), rcond=rcond, driver=driver)
    assert got.rank.cpu().tolist() == expected.rank.tolist() or (driver == "gelsy" and rcond == 0.5)
    if driver != "gelsy" or expected.rank.item() == 5:
        torch.testing.assert_close(got.solution.cpu(), expected.solution)


LSTSQ_BAD = {
    "vector_input": (lambda: torch.randn(3), lambda: torch.randn(3), {}),
    "scalar_other": (lambda: torch.randn(3, 2), lambda: torch.tensor(1.0), {}),
    "rows": (lambda: torch.randn(3, 2), lambda: torch.randn(4, 1), {}),
    "vector_rows": (lambda: torch.randn(3, 2), lambda: torch.randn(4), {}),
    "batched_rows": (lambda: torch.randn(2, 3, 2), lambda: torch.randn(2, 4), {}),
    "dtypes": (lambda: torch.randn(3, 2), lambda: torch.randn(3, 1, dtype=torch.float64), {}),
    "other_dims": (lambda: torch.randn(3, 2), lambda: torch.randn(1, 1, 3, 1), {}),
    "driver": (lambda: torch.randn(3, 2), lambda: torch.randn(3, 1), {"driver": "fictitious"}),
}


@pytest.mark.parametrize("name", sorted(LSTSQ_BAD))
def test_lstsq_checks_its_arguments_as_cpu(name):
    """CPU's errors at the call (1-d input and a 0-d other raised ValueError and
    IndexError, rows that do not match failed at the read, a bad driver ran)."""
    a, b, kwargs = LSTSQ_BAD[name]
    with pytest.raises(RuntimeError) as cpu:
        torch.linalg.lstsq(a(), b(), **kwargs)
    with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
        torch.linalg.lstsq(a().to("tpu"), b().to("tpu"), **kwargs)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.linalg.cholesky_ex(a, check_errors=True),
        lambda a: torch.linalg.inv_ex(a, check_errors=True),
        lambda a: torch.linalg.lu_factor_ex(a, check_errors=True),
        lambda a: torch.linalg.solve_ex(a, a, check_errors=True),
        lambda a: torch.linalg.cholesky_ex(torch.stack([torch.eye(3, device=a.device), a]), check_errors=True),
    ],
)
def test_ex_ops_with_check_errors_raise_cpus_error(fn):
    """Note [check_errors] (PyTorch's test_cholesky_ex_non_pd): the error, at the latest at the next read."""
    a = torch.eye(3, dtype=torch.complex64)
    a[-1, -1] = 0
    with pytest.raises(RuntimeError) as expected:
        fn(a)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        fn(a.to("tpu"))[-1].cpu()
    assert fn(a.to("tpu") + torch.eye(3, device="tpu"))[-1].cpu().eq(0).all()


@pytest.mark.parametrize("case", ["rows", "contracted", "columns", "batched", "rows_bfloat16"])
def test_grouped_mm_matches_cpu_without_fallback(case):
    """``torch._grouped_mm`` (transformers' MoE experts on an accelerator), each
    ragged dim, and its gradients; the rows past the last group are CPU's
    unwritten memory, so the groups here end at the last row."""
    gen = torch.Generator().manual_seed(0)
    x, w, g = torch.randn(6, 8, generator=gen), torch.randn(4, 8, 16, generator=gen), torch.randn(6, 16, generator=gen)
    a3, b2 = torch.randn(4, 6, 8, generator=gen), torch.randn(8, 12, generator=gen)
    offs = torch.tensor([1, 3, 3, 6], dtype=torch.int32)
    a, b, offs = {
        "rows": (x, w, offs),
        "contracted": (x.t(), g, offs),
        "columns": (a3, b2, torch.tensor([2, 5, 5, 12], dtype=torch.int32)),
        "batched": (a3, torch.randn(4, 8, 4, generator=gen), None),
        "rows_bfloat16": (x.bfloat16(), w.bfloat16(), offs),
    }[case]
    grad = case != "rows_bfloat16"
    a, b = (t.detach().requires_grad_(grad) for t in (a, b))
    inputs = (a, b) if offs is None else (a, b, offs)
    with no_fallback():
        # squared: CPU's backward refuses the expanded gradient of a plain sum (stride 0)
        run_both(lambda a, b, offs=None: torch._grouped_mm(a, b, offs=offs).pow(2), *inputs, grad=grad)
