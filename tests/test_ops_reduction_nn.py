"""Reductions, scans, softmax, losses, embedding, layer/group norm and dropout on ``tpu``.

Two tables of cases, compared against CPU torch (values, dtypes, gradients) in
both eager modes (each example draws one). Hypothesis draws shapes from a small set (each new program
shape compiles once), dims (negative, lists, ``None``), ``keepdim``, dtypes and
values (ties, and inf/nan where a case allows). Where CPU torch raises (e.g. an
empty ``amax``), ``tpu`` must raise the same error type. Dropout cannot match
CPU's random stream, so it is checked by its statistics.
"""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Callable

import attrs
import pytest
import torch
import torch.nn.functional as F
from conftest import MODES, mode, no_fallback, run_both, tolerance
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lazytpu

F32, F64, I64, B = torch.float32, torch.float64, torch.int64, torch.bool
FLOATS = (F32, F64)
WITH_HALVES = (F32, F64, torch.float16, torch.bfloat16)  # halves accumulate in float32
REALS = (F32, F64, I64)
ALL = (F32, F64, I64, B)
SHAPES = ((2, 3), (), (0,), (3, 0), (2, 3, 4))
SPECIAL = (math.inf, -math.inf, math.nan)
TIES = (0.0, 1.0, -1.0)


def _no_tiny(v: float) -> float:
    """XLA (like TPUs) flushes subnormals to zero; keep values and their
    products in the normal range so results are comparable."""
    return 0.0 if abs(v) < 1e-6 else v


def _values(draw, shape, dtype, special: bool):
    """A tensor of ``shape``/``dtype`` with hypothesis-drawn elements."""
    n = math.prod(shape)
    if dtype == B:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=B).reshape(shape)
    if dtype == I64:
        return torch.tensor(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), dtype=I64).reshape(shape)
    element = st.one_of(st.floats(-4, 4, width=32).map(_no_tiny), st.sampled_from(TIES + (SPECIAL if special else ())))
    return torch.tensor(draw(st.lists(element, min_size=n, max_size=n)), dtype=dtype).reshape(shape)


def check(fn, *inputs, mode_name: str, grad: bool = False, late_error: bool = False):
    """``run_both``, or: CPU torch raises, so ``tpu`` raises the same error type.

    ``late_error``: torch's meta kernel misses this error, so ``tpu`` only fails
    when the program is lowered (any error type).
    """
    try:
        fn(*[x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
    except Exception as exc:
        error = tpu_error(fn, *inputs, mode_name=mode_name)
        assert error is not None, f"CPU raised {exc!r}, tpu did not"
        assert late_error or error is type(exc), (error, exc)
        return
    run_both(fn, *inputs, mode_name=mode_name, grad=grad)


def tpu_error(fn, *inputs, mode_name: str) -> type | None:
    """The type of the error ``fn`` raises on tpu (values synced), or None.

    Only the type escapes: the exception's traceback would keep the failed
    op's pending outputs alive, and every later sync would retry them.
    """
    with mode(mode_name):
        tpu_inputs = [x.detach().to("tpu") if isinstance(x, torch.Tensor) else x for x in inputs]
        try:
            out = fn(*tpu_inputs)
            try:
                lazytpu.sync()
            finally:
                del out
        except Exception as exc:
            error = type(exc)
        else:
            error = None
        gc.collect()
        lazytpu.sync()  # the failed op left nothing pending behind
    return error


# -- reductions ------------------------------------------------------------------

# How a case takes its ``dim``: a list of dims, one int, an optional int, or none.
MULTI, SINGLE, OPTIONAL, NONE = "multi", "single", "optional", "none"


@attrs.frozen
class Reduction:
    """``fn(x, dim, keepdim, **options)``; each option is drawn from its choices."""

    fn: Callable
    dims: str = MULTI
    dtypes: tuple = FLOATS
    grad: bool = True
    special: bool = True
    options: dict = attrs.field(factory=dict)


def _dim_kw(dim):
    return {} if dim is None else {"dim": dim}


DTYPE = {"dtype": (None, F64)}
CORRECTION = {"correction": (None, 0, 2, 0.5)}

REDUCTIONS = {
    "sum": Reduction(lambda x, d, k, **o: x.sum(**_dim_kw(d), keepdim=k, **o), dtypes=ALL, options=DTYPE),
    "nansum": Reduction(lambda x, d, k: torch.nansum(x, **_dim_kw(d), keepdim=k), dtypes=REALS),
    "mean": Reduction(lambda x, d, k, **o: x.mean(**_dim_kw(d), keepdim=k, **o), dtypes=REALS, options=DTYPE),
    "mean_halves": Reduction(lambda x, d, k: x.mean(**_dim_kw(d), keepdim=k), dtypes=WITH_HALVES),
    "prod": Reduction(lambda x, d, k: x.prod() if d is None else x.prod(d, keepdim=k), OPTIONAL, ALL),
    "amax": Reduction(lambda x, d, k: x.amax(d or (), keepdim=k), dtypes=ALL),
    "amin": Reduction(lambda x, d, k: x.amin(d or (), keepdim=k), dtypes=ALL),
    "max": Reduction(lambda x, d, k: x.max() if d is None else x.max(d, keepdim=k), OPTIONAL, ALL),
    "min": Reduction(lambda x, d, k: x.min() if d is None else x.min(d, keepdim=k), OPTIONAL, ALL),
    "aminmax": Reduction(lambda x, d, k: torch.aminmax(x, dim=d, keepdim=k), OPTIONAL, REALS, grad=False),
    "argmax": Reduction(lambda x, d, k: x.argmax(d, keepdim=k), OPTIONAL, REALS, grad=False),
    "argmin": Reduction(lambda x, d, k: x.argmin(d, keepdim=k), OPTIONAL, REALS, grad=False),
    "var": Reduction(lambda x, d, k, **o: x.var(d, keepdim=k, **o), options=CORRECTION),
    "std": Reduction(lambda x, d, k, **o: x.std(d, keepdim=k, **o), options=CORRECTION),
    # CPU's Welford loop gives an order-dependent mean (inf or nan) when the input holds inf: no specials.
    "var_mean": Reduction(lambda x, d, k, **o: torch.var_mean(x, d, keepdim=k, **o), special=False, options=CORRECTION),
    "std_mean": Reduction(lambda x, d, k, **o: torch.std_mean(x, d, keepdim=k, **o), special=False, options=CORRECTION),
    "any": Reduction(lambda x, d, k: x.any() if d is None else x.any(d, keepdim=k), OPTIONAL, ALL, grad=False),
    "all": Reduction(lambda x, d, k: x.all() if d is None else x.all(d, keepdim=k), dtypes=ALL, grad=False),
    "count_nonzero": Reduction(lambda x, d, k: torch.count_nonzero(x, d), dtypes=ALL, grad=False),
    "logsumexp": Reduction(lambda x, d, k: torch.logsumexp(x, d or [0], keepdim=k), dtypes=REALS),
    "cumsum": Reduction(lambda x, d, k, **o: x.cumsum(d, **o), SINGLE, ALL, options=DTYPE),
    "cumprod": Reduction(lambda x, d, k: x.cumprod(d), SINGLE, REALS, special=False),
    "logcumsumexp": Reduction(lambda x, d, k: torch.logcumsumexp(x, d), SINGLE),
    "softmax": Reduction(lambda x, d, k, **o: torch.softmax(x, d, **o), SINGLE, options=DTYPE),
    "softmax_halves": Reduction(lambda x, d, k: torch.softmax(x, d), SINGLE, WITH_HALVES),
    "log_softmax": Reduction(lambda x, d, k, **o: F.log_softmax(x, d, **o), SINGLE, options=DTYPE),
}


@st.composite
def _dim(draw, ndim: int, kind: str):
    if kind == NONE:
        return None
    one = st.integers(-max(ndim, 1), max(ndim, 1) - 1)
    if kind == SINGLE:
        return draw(one)
    if kind == OPTIONAL:
        return draw(st.none() | one)
    return draw(st.none() | st.lists(one, min_size=1, max_size=2, unique_by=lambda d: d % max(ndim, 1)))


# Each example runs in one drawn mode (not both): half the compiles, and every
# case still meets both modes over its examples.
@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")  # CPU torch's, for correction >= n
@pytest.mark.parametrize("name", REDUCTIONS)
@given(data=st.data())
def test_reduction(name, data):
    case = REDUCTIONS[name]
    mode_name = data.draw(st.sampled_from(MODES), label="mode")
    shape = data.draw(st.sampled_from(SHAPES), label="shape")
    dtype = data.draw(st.sampled_from(case.dtypes), label="dtype")
    grad = case.grad and dtype.is_floating_point and data.draw(st.booleans(), label="grad")
    special = case.special and not grad and data.draw(st.booleans(), label="special")
    x = _values(data.draw, shape, dtype, special)
    dim = data.draw(_dim(len(shape), case.dims), label="dim")
    keepdim = data.draw(st.booleans(), label="keepdim")
    options = {k: data.draw(st.sampled_from(v), label=k) for k, v in case.options.items()}
    check(
        lambda t: case.fn(t, dim, keepdim, **options),
        x.requires_grad_(grad),
        mode_name=mode_name,
        grad=grad,
    )


# Ops whose meta kernel accepts an empty input that CPU torch rejects (IndexError
# from max.dim): lazytpu re-checks empty calls on CPU when it records them
# (Note [Kernel checks] in lazytpu.frontend.checks.kernel_checks), so the error comes at the call.
@pytest.mark.parametrize("name", ["max", "min"])
def test_empty_reduction_error_type(name, eager_mode):
    assert tpu_error(lambda t: REDUCTIONS[name].fn(t, 0, False), torch.empty(0), mode_name=eager_mode) is IndexError


# -- losses and layers -----------------------------------------------------------


@st.composite
def _cross_entropy(draw):
    shape = draw(st.sampled_from(((3, 4), (4,), (2, 3, 2, 2), (0, 4))))
    classes = shape[0] if len(shape) == 1 else shape[1]
    target_shape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    x = _values(draw, shape, F32, special=False)
    n = math.prod(target_shape)
    target = torch.tensor(draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n)), dtype=I64)
    target = target.reshape(target_shape)
    weight = draw(st.none() | st.just(torch.linspace(0.5, 2.0, classes)))
    kw = dict(
        ignore_index=draw(st.sampled_from((-100, 1))),
        reduction=draw(st.sampled_from(("none", "mean", "sum"))),
        label_smoothing=draw(st.sampled_from((0.0, 0.1))),
    )
    return (x.requires_grad_(), target, weight), lambda x, t, w: F.cross_entropy(x, t, w, **kw)


@st.composite
def _cross_entropy_probs(draw):
    shape = draw(st.sampled_from(((3, 4), (2, 3, 2, 2))))
    x, target = _values(draw, shape, F32, False), torch.softmax(_values(draw, shape, F32, False), 1)
    reduction = draw(st.sampled_from(("none", "mean", "sum")))
    return (x.requires_grad_(), target), lambda x, t: F.cross_entropy(x, t, reduction=reduction)


@st.composite
def _nll_loss(draw):
    (x, target, weight), _ = draw(_cross_entropy())
    kw = dict(ignore_index=draw(st.sampled_from((-100, 0))), reduction=draw(st.sampled_from(("none", "mean", "sum"))))
    return (x, target, weight), lambda x, t, w: F.nll_loss(F.log_softmax(x, 1 if x.ndim > 1 else 0), t, w, **kw)


def _pair(draw, shapes, dtype=F32, special=False):
    shape = draw(st.sampled_from(shapes))
    return _values(draw, shape, dtype, special), _values(draw, shape, dtype, special)


@st.composite
def _mse(draw):
    x, y = _pair(draw, ((2, 3), (), (0,)), draw(st.sampled_from(FLOATS)))
    reduction = draw(st.sampled_from(("none", "mean", "sum")))
    assume(not (x.numel() == 0 and reduction == "mean"))  # test_empty_mse_loss_backward
    return (x.requires_grad_(), y.requires_grad_()), lambda x, y: F.mse_loss(x, y, reduction=reduction)


@st.composite
def _bce(draw):
    x, y = _pair(draw, ((2, 3), ()))
    x, y = torch.sigmoid(x).clamp(1e-3, 1 - 1e-3), torch.sigmoid(y)
    weight = draw(st.none() | st.just(torch.full(x.shape, 0.7)))
    reduction = draw(st.sampled_from(("none", "mean", "sum")))
    return (x.requires_grad_(), y, weight), lambda x, y, w: F.binary_cross_entropy(x, y, w, reduction=reduction)


@st.composite
def _bce_logits(draw):
    x, y = _pair(draw, ((2, 3), ()))
    y = torch.sigmoid(y)
    weight = draw(st.none() | st.just(torch.full(x.shape, 0.7)))
    pos_weight = draw(st.none() | st.just(torch.full(x.shape[-1:], 1.5)))
    reduction = draw(st.sampled_from(("none", "mean", "sum")))
    return (x.requires_grad_(), y, weight, pos_weight), lambda x, y, w, pw: F.binary_cross_entropy_with_logits(
        x, y, w, reduction=reduction, pos_weight=pw
    )


@st.composite
def _embedding(draw):
    index_shape = draw(st.sampled_from(((4,), (2, 3), (), (0,))))
    n = math.prod(index_shape)
    indices = torch.tensor(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), dtype=I64).reshape(index_shape)
    weight = _values(draw, (5, 3), draw(st.sampled_from(FLOATS)), False)
    padding_idx = draw(st.sampled_from((None, 1, -1)))
    freq = draw(st.booleans())
    return (indices, weight.requires_grad_()), lambda i, w: F.embedding(
        i, w, padding_idx=padding_idx, scale_grad_by_freq=freq
    )


@st.composite
def _layer_norm(draw):
    shape = draw(st.sampled_from(((2, 3), (2, 3, 4), (0, 4), (4,))))
    dtype = draw(st.sampled_from(WITH_HALVES))
    normalized = shape[-draw(st.integers(1, min(2, len(shape)))) :]
    x = _values(draw, shape, dtype, False)
    affine = draw(st.booleans())
    weight = _values(draw, normalized, dtype, False).requires_grad_() if affine else None
    bias = _values(draw, normalized, dtype, False).requires_grad_() if affine else None
    eps = draw(st.sampled_from((1e-5, 0.1)))
    return (x.requires_grad_(), weight, bias), lambda x, w, b: F.layer_norm(x, normalized, w, b, eps)


@st.composite
def _huber(draw):
    x, y = _pair(draw, ((2, 3), (), (0,)))
    reduction = draw(st.sampled_from(("none", "mean", "sum")))
    assume(not (x.numel() == 0 and reduction == "mean"))  # the same meta gap as test_empty_mse_loss_backward
    delta = draw(st.sampled_from((1.0, 0.5)))
    return (x.requires_grad_(), y.requires_grad_()), lambda x, y: F.huber_loss(x, y, reduction, delta)


@st.composite
def _group_norm(draw):
    shape = draw(st.sampled_from(((2, 4, 3), (2, 4), (0, 4, 2), (1, 6, 2, 2))))
    groups = draw(st.sampled_from((1, 2)))
    dtype = draw(st.sampled_from(WITH_HALVES))
    x = _values(draw, shape, dtype, False)
    affine = draw(st.booleans())
    weight = _values(draw, shape[1:2], dtype, False).requires_grad_() if affine else None
    bias = _values(draw, shape[1:2], dtype, False).requires_grad_() if affine else None
    return (x.requires_grad_(), weight, bias), lambda x, w, b: F.group_norm(x, groups, w, b)


LOSSES_AND_LAYERS = {
    "cross_entropy": _cross_entropy(),
    "cross_entropy_probs": _cross_entropy_probs(),
    "nll_loss": _nll_loss(),
    "mse_loss": _mse(),
    "binary_cross_entropy": _bce(),
    "binary_cross_entropy_with_logits": _bce_logits(),
    "embedding": _embedding(),
    "layer_norm": _layer_norm(),
    "group_norm": _group_norm(),
    "huber_loss": _huber(),
}


@pytest.mark.parametrize("name", LOSSES_AND_LAYERS)
@given(data=st.data())
def test_loss_or_layer(name, data):
    mode_name = data.draw(st.sampled_from(MODES), label="mode")
    inputs, fn = data.draw(LOSSES_AND_LAYERS[name], label="case")
    check(fn, *inputs, mode_name=mode_name, grad=True)


def test_empty_mse_loss_backward():
    """torch's meta mse_loss_backward divides by numel(); CPU returns an empty
    grad, and CPU semantics win (the call runs where the data is)."""
    x, grad = torch.empty(0), torch.tensor(1.0)
    expected = torch.ops.aten.mse_loss_backward(grad, x, x, 1)
    actual = torch.ops.aten.mse_loss_backward(grad.to("tpu"), x.to("tpu"), x.to("tpu"), 1)
    torch.testing.assert_close(actual.cpu(), expected)


# -- dropout ---------------------------------------------------------------------


def _dropout(p: float, seed: int, shape=(64, 64)):
    """Seeded dropout of ones on tpu and the input's gradient (upstream gradient 2), on CPU."""
    torch.manual_seed(seed)
    x = torch.ones(shape, device="tpu", requires_grad=True)
    y = F.dropout(x, p, training=True)
    y.backward(torch.full(shape, 2.0, device="tpu"))
    return y.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("p", (0.0, 0.2, 0.5, 0.9))
def test_dropout_statistics_scale_and_grad(eager_mode, p):
    with mode(eager_mode):
        y, grad = _dropout(p, seed=0)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.03
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    torch.testing.assert_close(grad, y * 2.0)  # the gradient uses the forward mask and scale


def test_dropout_p1_and_eval_and_reproducibility(eager_mode):
    with mode(eager_mode):
        assert torch.count_nonzero(_dropout(1.0, seed=0)[0]) == 0
        x = torch.randn(5, 5).to("tpu")
        torch.testing.assert_close(F.dropout(x, 0.5, training=False).cpu(), x.cpu())
        first, again, other = _dropout(0.5, seed=3), _dropout(0.5, seed=3), _dropout(0.5, seed=4)
    torch.testing.assert_close(first, again)
    assert not torch.equal(first[0], other[0])


@settings(max_examples=10)
@given(p=st.floats(0.0, 0.95))
def test_native_dropout_returns_mask(p):
    x = torch.randn(8, 8).to("tpu")
    y, mask = torch.ops.aten.native_dropout(x, p, True)
    assert mask.dtype == torch.bool
    torch.testing.assert_close(y.cpu(), x.cpu() * mask.cpu() / (1 - p))


# -- no CPU fallback -------------------------------------------------------------


def _training_step():
    """Every op family of this file, forward and backward."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, device="tpu", requires_grad=True)
    weight = torch.randn(10, 6, device="tpu", requires_grad=True)
    tokens = torch.tensor([1, 2, 0, 9], device="tpu")
    target = torch.tensor([0, 5, -100, 3], device="tpu")
    h = F.layer_norm(F.embedding(tokens, weight) + x, (6,))
    h = F.dropout(h, 0.1)
    losses = [
        F.cross_entropy(h, target),
        F.cross_entropy(h, target, label_smoothing=0.1),
        F.nll_loss(torch.log_softmax(h, -1), target, reduction="sum"),
        F.mse_loss(h, x) + F.huber_loss(h, x, delta=0.5),
        F.group_norm(h.reshape(2, 2, 6), 2).square().sum(),
        F.cross_entropy(h.reshape(2, 3, 2, 2), target.reshape(2, 2, 1).expand(2, 2, 2).clamp(0, 2)),  # nll_loss2d
        F.binary_cross_entropy(torch.sigmoid(h), x.sigmoid().detach()),
        F.binary_cross_entropy_with_logits(h, x.sigmoid().detach(), pos_weight=torch.ones(6, device="tpu")),
        h.prod(1).sum() + h.cumprod(1).sum() + h.min() + h.min(1).values.sum() + h.amin(0).sum(),
        torch.softmax(h, 0).sum(),
        h.mean() + h.std() + h.var(0).sum() + h.logsumexp(1).sum() + h.cumsum(1).sum(),
        h.amax(1).sum() + h.max() + h.max(0).values.sum() + torch.var_mean(h, 1)[0].sum(),
    ]
    total = sum(losses)
    total.backward()
    return total.item() + (h.argmax(1).sum() + h.any() + h.all()).item()


def test_no_cpu_fallbacks():
    with mode("defer"):  # dispatch resolves ops the same way in every mode
        lazytpu.sync()
        lazytpu.metrics.reset()
        _training_step()
        assert dict(lazytpu.metrics.snapshot()["cpu_fallbacks"]) == {}


def test_anomaly_mode_checks_gradients_on_the_device():
    """detect_anomaly's NaN check (``_is_any_true`` of ``isnan``) runs in the program, not on CPU."""
    torch.manual_seed(0)
    x = torch.rand(5) + 0.5
    with no_fallback(), torch.autograd.detect_anomaly(check_nan=True):
        t = x.to("tpu").requires_grad_()
        (t.sqrt() * t).sum().backward()
        c = x.clone().requires_grad_()
        (c.sqrt() * c).sum().backward()
        torch.testing.assert_close(t.grad.cpu(), c.grad)
        assert torch._is_all_true(t > 0).item() and not torch._is_any_true(t > 9).item()


@pytest.mark.parametrize(
    "call",
    [
        lambda x: x.std(1),  # valid: no warning (the dtype check's one-element stand-in warned)
        lambda x: x.var(1, correction=0),
        lambda x: x[:1].var(),  # one element: warns
        lambda x: x[:, :2].std(1, correction=2),
        lambda x: x[:, :2].var(1, correction=1.5),
        lambda x: torch.var_mean(x[:1, :1]),
        lambda x: torch.std_mean(x, 0, correction=4),
        lambda x: x[:0].var(0, correction=0),  # empty: warns
    ],
)
def test_degrees_of_freedom_warnings_as_on_cpu(call, eager_mode):
    """The same warnings as CPU's kernels, at the same calls (Note [Degrees of freedom])."""
    x = torch.randn(4, 6)

    def messages(t):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(t)
        return [str(w.message).split(" (Triggered internally")[0] for w in caught]

    assert messages(x.to("tpu")) == messages(x)


def test_mean_into_a_float64_out_tensor_sums_in_float64_as_cpu():
    """CPU's mean.out computes in its out tensor's dtype; tpu computed in the
    input's float32 and cast (1e-7 off CPU's float64 mean)."""
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    want = torch.mean(x, 1, out=torch.empty(0, dtype=torch.float64))
    out = torch.empty(0, dtype=torch.float64, device="tpu")
    torch.mean(x.to("tpu"), 1, out=out)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-15, atol=0)


def test_the_degrees_of_freedom_warning_names_the_users_line():
    """As CPU torch's (a C++ warning, shown at the Python line that called)."""
    x = torch.ones(2, 3).to("tpu")
    with pytest.warns(UserWarning, match="degrees of freedom is <= 0") as caught:
        torch.var(x, dim=1, correction=5)
    assert {w.filename for w in caught if "degrees of freedom" in str(w.message)} == {__file__}


@pytest.mark.parametrize("shape", [(4, 3), (3,)], ids=["batched", "unbatched"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_nll_loss_of_a_uint8_target_is_recorded_as_cpus(shape, reduction, ignore_index):
    """CPU's nll_loss takes a uint8 target; the meta kernel refused it, so it fell back to CPU
    (Note [Meta shape fixes]). nll_loss2d refuses it on CPU as here."""
    x = torch.randn(*shape)
    target = torch.tensor([2, 0, 1, 2][: shape[0]] if len(shape) > 1 else 1, dtype=torch.uint8)
    weight = torch.rand(3)

    def loss(x, t, w):
        return F.nll_loss(F.log_softmax(x, -1), t, w, reduction=reduction, ignore_index=ignore_index)

    with no_fallback():
        run_both(loss, x.requires_grad_(), target, weight, grad=True)
    with pytest.raises(RuntimeError, match="expected scalar type Long but found Byte"):
        F.nll_loss(torch.randn(2, 3, 4, device="tpu"), torch.zeros(2, 4, dtype=torch.uint8, device="tpu"))


_DOUBLE_ACCUMULATED = {
    "cumsum": lambda t: t.cumsum(-1),
    "cumsum_dim0": lambda t: t.cumsum(0),
    "cumsum_complex": lambda t: torch.complex(t, t * 0.5).cumsum(-1),
    "cumprod": lambda t: (t.abs() + 0.5).cumprod(-1),
    "logcumsumexp": lambda t: t.logcumsumexp(-1),
    "var_dim": lambda t: t.var(-1),
    "std_dim": lambda t: t.std(0, correction=0),
    "var_mean_dim": lambda t: torch.stack(torch.var_mean(t, -1)),
    "std_mean_all": lambda t: torch.stack(torch.std_mean(t)),
}


@pytest.mark.parametrize("name", sorted(_DOUBLE_ACCUMULATED))
def test_float32_scans_and_moments_are_cpus_roundings_of_double(name):
    """CPU accumulates these float32 kernels in double (Note [Double accumulation]): their results
    were an ulp off CPU's on about half the elements (a cumprod's error grew with its length); with
    float64 native on XLA:CPU they are CPU's bit for bit."""
    fn = _DOUBLE_ACCUMULATED[name]
    x = torch.randn(6, 500, generator=torch.Generator().manual_seed(0)) * 3 - 10
    want, got = fn(x), fn(x.to("tpu")).cpu()
    assert torch.equal(got, want), f"{(got != want).sum().item()} of {want.numel()} differ"


def test_variance_of_everything_centers_on_the_float32_mean_as_cpu():
    """CPU's var and std reducing to one element center on the float32 mean (a deviation of data far
    from zero depends on it), then accumulate in double."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 1e-3 - 100
    for fn in (torch.var, torch.std, lambda t: t.reshape(10, 100).var(dim=(0, 1), correction=0)):
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), rtol=2e-7, atol=0)


# CPU's layer norm of a half input rounds the float32 gradients of its float32
# parameters to the input's precision (the bias gradient, a sum of bfloat16
# values, comes out a bfloat16 number); tpu sums them in float32, as CUDA's
# kernel accumulates: 1.6e-7 from the float64 gradients, CPU's 4e-3.
_HALF_INPUT_NORMS = {
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), False),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (3,), w[:3], b[:3]), True),
    "batch_norm_training": (
        lambda x, w, b: F.batch_norm(x, b.detach().clone(), w.detach().abs(), w, b, training=True),
        False,
    ),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, b.detach(), w.detach().abs(), w, b), False),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), False),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(_HALF_INPUT_NORMS))
def test_norms_of_a_half_input_take_float_parameters(name, dtype, eager_mode):
    """CPU's norms take float32 parameters with a bfloat16 or float16 input
    (and refuse other mixes: test_error_parity's ``*_norm_*`` cases), and save
    float32 statistics: the backward's parameter gradients are float32 ones
    (Note [CPU norm statistics]; tpu rounded the statistics to the input's
    dtype, and the weight gradients were 7.5e-3 off)."""
    norm, cpu_rounds = _HALF_INPUT_NORMS[name]
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3).to(dtype).requires_grad_()
    w, b = torch.randn(4).requires_grad_(), torch.randn(4).requires_grad_()
    with no_fallback():
        run_both(norm, x, w, b, mode_name=eager_mode, grad=True, **(tolerance(dtype) if cpu_rounds else {}))


@pytest.mark.parametrize("parameters", [None, torch.bfloat16, torch.float32])
def test_norm_statistics_of_a_bfloat16_input_are_cpus(parameters):
    """The saved mean and inverse std: bfloat16 ones, and float32 ones beside
    float32 parameters (Note [CPU norm statistics])."""
    x = torch.randn(2, 4, 3).bfloat16()
    w = None if parameters is None else torch.randn(4).to(parameters)
    stats = parameters or torch.float32

    def statistics(d):
        wd = None if w is None else w.to(d)
        return [
            torch.native_group_norm(x.to(d), wd, None, 2, 4, 3, 2, 1e-5),
            torch.native_layer_norm(x.to(d), (3,), None if w is None else w[:3].to(d), None, 1e-5),
            torch.native_batch_norm(x.to(d), wd, None, None, None, True, 0.1, 1e-5),
            # outside training: empty statistics, float32 ones beside float32 running statistics
            torch.native_batch_norm(
                x.to(d),
                None,
                None,
                torch.zeros(4, dtype=stats).to(d),
                torch.ones(4, dtype=stats).to(d),
                False,
                0.1,
                1e-5,
            ),
        ]

    with no_fallback():
        on_tpu = statistics("tpu")
    for tpu_out, cpu_out in zip(on_tpu, statistics("cpu"), strict=True):
        for t, c in zip(tpu_out, cpu_out, strict=True):
            assert t.dtype == c.dtype
            torch.testing.assert_close(t.cpu(), c, **tolerance(torch.bfloat16))
