"""Scatters into views, diagonals, rotations, masked/indexed reductions,
running extrema, histograms, range factories and host-read comparisons
against CPU torch, with no CPU fallback."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import assert_close, no_fallback, run_both, to_cpu, to_tpu

import lazytpu

NAN = float("nan")


def _idx(*values):
    return torch.tensor(values)


def _ties(*shape):
    """Small integers: many equal values, whose reported indices follow torch's selection algorithms."""
    return torch.randint(0, 3, shape)


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


# (fn, inputs) pairs; float inputs that require grad are also checked backward.
CASES = {
    "select_scatter": (lambda x, s: torch.select_scatter(x, s, 1, -1), lambda: (_x(3, 4), _x(3))),
    "diagonal_scatter": (lambda x, s: torch.diagonal_scatter(x, s, 1, 0, 2), lambda: (_x(3, 2, 4), _x(2, 3))),
    "as_strided_scatter": (
        lambda x, s: torch.as_strided_scatter(x, s, (2, 2), (1, 3), 1),
        lambda: (_x(3, 3), _x(2, 2)),
    ),
    "diag_embed": (lambda x: torch.diag_embed(x, offset=-1, dim1=0, dim2=2), lambda: (_x(2, 3),)),
    "diag": (lambda x: torch.diag(x, 2), lambda: (_x(3),)),
    "diagflat": (lambda x: torch.diagflat(x, -1), lambda: (_x(2, 2),)),
    "block_diag_mixed_dtypes": (
        lambda x, i: torch.block_diag(x, i, torch.tensor(7.0)),
        lambda: (_x(2, 3), torch.tensor([1, 2])),
    ),
    "rot90": (lambda x: [torch.rot90(x, k, (2, 0)) for k in (-1, 0, 2, 3)], lambda: (_x(2, 3, 4),)),
    "unfold": (lambda x: x.unfold(1, 3, 2) * 2, lambda: (_x(2, 7, 2),)),
    # CPU broadcasts the gradient in the other dims and reads only its own windows (torch._refs.istft)
    "unfold_backward_broadcast": (
        lambda g: [
            torch.ops.aten.unfold_backward(g, [10, 15], 1, 10, 1),
            torch.ops.aten.unfold_backward(g[0, :, None, :4], [6, 9], 1, 4, 2),
        ],
        lambda: (_x(1, 6, 10),),
    ),
    "masked_scatter": (
        lambda x, m, s: x.masked_scatter(m, s),
        lambda: (_x(3, 4), torch.tensor([True, False, True, True]), _x(4, 4)),
    ),
    "index_reduce_amax": (
        lambda x, s, i: x.index_reduce(0, i, s, "amax", include_self=False),
        lambda: (_x(4, 2), _x(3, 2), _idx(3, 0, 3)),
    ),
    "index_reduce_mean": (
        lambda x, s, i: x.index_reduce(1, i, s, "mean"),
        lambda: (_x(2, 3), _x(2, 4), _idx(0, 2, 2, 0)),
    ),
    "index_reduce_prod_int": (
        lambda x, s, i: x.index_reduce(0, i, s, "prod", include_self=False),
        lambda: (torch.arange(1, 7).reshape(3, 2), torch.tensor([[2, 3], [4, 5]]), _idx(1, 1)),
    ),
    "cummax_ties_nan": (
        lambda x: torch.cummax(x * 1, 0),
        lambda: (torch.tensor([1.0, 3.0, 3.0, 2.0, NAN, 5.0, NAN, 1.0], requires_grad=True),),
    ),
    "cummin_int_ties": (lambda x: torch.cummin(x, 1), lambda: (torch.tensor([[3, 1, 1, 2, 0, 0]]),)),
    "cummax_bool": (lambda x: torch.cummax(x, 0), lambda: (torch.tensor([False, True, False, True]),)),
    "bool_scatter_add": (
        lambda x, i: (x.scatter_add(0, i, x.clone()), x.index_put((i[:1],), x[:1], accumulate=True)),
        lambda: (torch.tensor([True, False, False]), _idx(2, 2, 0)),
    ),
    "bool_scatter_reduce": (
        lambda x, i: [x.scatter_reduce(0, i, x, r, include_self=False) for r in ("amax", "amin", "prod", "sum")],
        lambda: (torch.tensor([True, False, True]), _idx(1, 1, 0)),
    ),
    "histc_half": (lambda x: torch.histc(x, 100, -10, 0), lambda: (torch.linspace(-10, 0, 125).half(),)),
    "histogram": (
        lambda x, w: torch.histogram(x, 4, weight=w, density=True),
        lambda: (torch.tensor([0.0, 1.0, 1.5, 2.0, 2.0, 3.0]), torch.rand(6)),
    ),
    "histogram_empty": (lambda x: torch.histogram(x, 3), lambda: (torch.empty(0),)),
    # bin edges as a tensor: the kernel check's one-element stand-in of the edges raised "bins must be > 0"
    "histogram_edges": (
        lambda x, e: [torch.histogram(x, e), torch.histogram(x[0, 0], e, density=True)],
        lambda: (torch.randn(4, 25), torch.linspace(-2, 2, 9)),
    ),
    # an empty index of any dtype is taken (torch checks the dtype of a non-empty one); the complex kernel
    # check's one-element stand-in of the index raised "Expected dtype int32/int64 for index"
    "gather_empty_byte_index_complex": (
        lambda x, i: torch.gather(x, 0, i),
        lambda: (torch.randn(2, 4, 3, dtype=torch.complex64), torch.empty(0, 4, 3, dtype=torch.uint8)),
    ),
    "scatter_empty_byte_index_complex": (
        lambda x, i: [x.scatter(1, i, x), x.scatter_add(0, i, x), x.scatter(0, i, 2.0)],
        lambda: (torch.randn(2, 4, 3, dtype=torch.complex64), torch.empty(0, 4, 3, dtype=torch.uint8)),
    ),
    "histogramdd": (
        lambda x: torch.histogramdd(x, [2, 3], range=[0.0, 1.0, -1.0, 1.0]),
        lambda: (torch.rand(20, 2) * 2 - 0.5,),
    ),
    "kthvalue_ties": (lambda x: [torch.kthvalue(x, k, 1) for k in (1, 3, 7)], lambda: (_ties(4, 9),)),
    # k > 1 of a 1-d input: the kernel check's empty stand-in raised
    # "Expected reduction dim 0 to have non-zero size"
    "kthvalue_1d": (
        lambda x: [
            torch.kthvalue(x.to(dtype), k, 0, keepdim)
            for dtype in (torch.float32, torch.uint8, torch.int16)
            for k in (2, 5)
            for keepdim in (False, True)
        ],
        lambda: (torch.tensor([5, 1, 6, 5, 6]),),
    ),
    "topk_ties": (
        lambda x: [torch.topk(x, k, 1, largest, True) for k in (2, 5) for largest in (True, False)],
        lambda: (_ties(4, 10),),
    ),
    "mode_ties": (lambda x: [torch.mode(x, 1), torch.mode(x[:, :9], 1)], lambda: (_ties(3, 40),)),
    "topk_unsorted_nan_ties": (
        lambda x: torch.topk(x, 4, 0, True, False),
        lambda: (torch.tensor([1.0, NAN, 2.0, 2.0, NAN, 1.0, 2.0, 0.0, 2.0]),),
    ),
    "bincount": (
        lambda x, w: (torch.bincount(x), torch.bincount(x, w, minlength=9)),
        lambda: (_idx(1, 3, 3, 0), torch.rand(4)),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_matches_cpu_without_fallback(name, mode):
    fn, make = CASES[name]
    torch.manual_seed(0)
    inputs = make()
    lazytpu.metrics.reset()
    run_both(fn, *inputs, mode_name=mode, grad=any(t.requires_grad for t in inputs))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


FACTORIES = {
    "linspace_int_truncates": lambda d: torch.linspace(4.3, 1, 50, dtype=torch.int64, device=d),
    "linspace_int32_up": lambda d: torch.linspace(4.3, 50, 50, dtype=torch.int32, device=d),
    "logspace_int": lambda d: torch.logspace(4.3, 4, 4, 2.0, dtype=torch.int64, device=d),
    "logspace_one_step_bf16": lambda d: torch.logspace(4.3, 1, 1, 5.0, dtype=torch.bfloat16, device=d),
    "logspace_float64": lambda d: torch.logspace(4.3, 4, 4, 3.0, dtype=torch.float64, device=d),
    "arange_int32_size_in_double": lambda d: torch.arange(3.1, dtype=torch.int32, device=d),
    "arange_int64_size_in_integers": lambda d: torch.arange(0.1, -7.9, -4.0, dtype=torch.int64, device=d),
    "tril_indices_int32": lambda d: torch.tril_indices(4, 3, -1, dtype=torch.int32, device=d),
    "triu_indices": lambda d: torch.triu_indices(3, 5, 2, device=d),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_match_cpu(name):
    lazytpu.metrics.reset()
    assert_close(to_cpu(FACTORIES[name]("tpu")), FACTORIES[name]("cpu"))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_equal_and_allclose_are_host_reads_not_fallbacks():
    a = torch.tensor([1.0, NAN, 3.0])
    b = torch.tensor([1.0, NAN, 3.0 + 1e-6])
    lazytpu.metrics.reset()
    for x, y in [(a, a), (a, b), (a[:2], a), (a[::2], a[::2].double())]:
        assert torch.equal(to_tpu(x), to_tpu(y)) is torch.equal(x, y)
    for kwargs in [{}, {"equal_nan": True}, {"rtol": 0, "atol": 0, "equal_nan": True}]:
        assert torch.allclose(to_tpu(a), to_tpu(b), **kwargs) is torch.allclose(a, b, **kwargs)
    assert torch.allclose(to_tpu(_idx(1, 2)), to_tpu(_idx(1, 3)), atol=1) is True
    with pytest.raises(RuntimeError, match="Float did not match Double"):
        torch.allclose(to_tpu(a), to_tpu(a.double()))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_resize_keeps_storage_contents():
    x = torch.arange(12.0)
    t = to_tpu(x)
    t.resize_(3, 3)
    assert_close(t.cpu(), x.clone().resize_(3, 3))
    t.resize_(2, 8)  # grows: old contents first
    assert t.shape == (2, 8) and torch.equal(t.cpu().flatten()[:12], x)
    r = torch.empty(2, 6, device="tpu").resize_as_(torch.empty(3, 4)).copy_(torch.ones(3, 4))
    assert_close(r.cpu(), torch.ones(3, 4))


def _resizes(device):
    """(strides, values) after resize_ and resize_as_ with and without a memory format."""
    out = []
    flat = torch.arange(120.0, device=device)
    flat.resize_((2, 3, 4, 5), memory_format=torch.channels_last)
    out.append(flat.stride())
    channels_last = torch.zeros(2, 3, 4, 5, device=device).contiguous(memory_format=torch.channels_last)
    for memory_format in (None, torch.preserve_format, torch.contiguous_format):
        flat = torch.arange(120.0, device=device)
        flat.resize_as_(channels_last, **({} if memory_format is None else {"memory_format": memory_format}))
        out += [flat.stride(), flat.flatten()[:8].tolist()]
    for memory_format in (None, torch.contiguous_format):
        t = torch.arange(6.0, device=device).view(2, 3).t()
        t.resize_((3, 2), **({} if memory_format is None else {"memory_format": memory_format}))
        out += [t.stride(), t.tolist()]
    t = torch.arange(6.0, device=device).view(2, 3).t()
    out.append(t.resize_as_(t).stride())
    small = torch.arange(8.0, device=device)
    small.resize_((2, 2, 1, 2), memory_format=torch.channels_last)
    out += [small.stride(), small.tolist()]
    return out


def test_resize_with_a_memory_format_restrides_as_on_cpu():
    """resize_(memory_format=torch.channels_last) and resize_as_(...,
    memory_format=torch.preserve_format) give channels_last strides; the same
    sizes without a format keep the strides (a transposed tensor stays
    transposed). Found by PyTorch's test_view_ops.py test_memory_format_resize_*."""
    assert _resizes("tpu") == _resizes("cpu")
    for fmt in (torch.preserve_format, torch.channels_last):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.empty(6).resize_((2, 3), memory_format=fmt)
        with pytest.raises(type(cpu_error.value), match=re.escape(str(cpu_error.value))):
            torch.empty(6, device="tpu").resize_((2, 3), memory_format=fmt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.int8, torch.uint8])
def test_median_of_no_elements_is_cpus(dtype):
    """CPU's median of an empty tensor is NaN cast to its dtype (int64's
    smallest value, 0 for uint8); tpu gave 0."""
    empty = torch.tensor([], dtype=dtype)
    ops = [torch.median] + ([torch.nanmedian] if dtype.is_floating_point else [])
    for op in ops:
        expected, actual = op(empty), op(empty.to("tpu")).cpu()
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected) or (actual.isnan() and expected.isnan())


def test_empty_strided_with_overlapping_strides_reads_back():
    t = torch.empty_strided((5, 5, 5), (2, 0, 1), device="tpu")
    assert t.cpu().shape == (5, 5, 5) and t.stride() == (2, 0, 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_counts_integers_as_cuda_does(dtype):
    """transformers' MoE layers count tokens per expert with (Note [CUDA's histc])
    an int32 histc on devices other than CPU (which refuses it): CUDA's counts,
    in the input's dtype, with integer bin arithmetic."""
    x = torch.tensor([0, 1, 1, 3, 2, 7, 5, 5, 200, 9]).to(dtype)
    for bins, lo, hi in [(4, 0, 3), (3, 0, 0), (8, 0, 7), (7, 1, 200)]:
        got = torch.histc(x.to("tpu"), bins=bins, min=lo, max=hi)
        expected = torch.histc(x.double(), bins=bins, min=lo, max=hi)  # exact here
        assert got.dtype == dtype
        assert got.cpu().tolist() == expected.long().tolist()


def test_bincount_errors_match_cpu():
    for bad, kind in [
        (_idx(-1, 2), RuntimeError),
        (_idx([1]), RuntimeError),
        (torch.tensor([1.0]), NotImplementedError),
    ]:
        with pytest.raises(kind) as cpu_err:
            torch.bincount(bad)
        with pytest.raises(kind) as tpu_err:
            torch.bincount(to_tpu(bad))
        assert str(tpu_err.value).replace("_tpu", "_cpu") == str(cpu_err.value)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i, s: x.scatter(0, i, s),
        lambda x, i, s: x.scatter(0, i, 1.5),
        lambda x, i, s: x.scatter_add(0, i, s),
        lambda x, i, s: x.scatter_reduce(0, i, s, "amax"),
        lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False),
    ],
)
def test_scatters_of_an_empty_index_of_another_rank_leave_self(fn):
    """torch checks no shapes for an empty index (PyTorch's test_scatter_gather: test_empty_index)."""
    run_both(fn, torch.arange(4.0).view(2, 2), torch.tensor((), dtype=torch.long), torch.ones(2, 2))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_scatter_reduce_is_cpus_bit_for_bit(reduce, include_self, dtype):
    """A complex mean divides as ``div`` does (c10::complex's division): PyTorch's test_scatter_reduce_mean
    compares with no tolerance; without ``self``, complex sums and products raised."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen, dtype=dtype)
    index = torch.randint(0, 6, (9, 5), generator=gen)
    src = torch.randn(9, 5, generator=gen, dtype=dtype)
    expected = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
    actual = x.to("tpu").scatter_reduce(0, index.to("tpu"), src.to("tpu"), reduce, include_self=include_self)
    if reduce == "prod" and dtype == torch.complex64:  # a product's FMA contraction: an ulp
        torch.testing.assert_close(actual.cpu(), expected)
    else:
        assert torch.equal(actual.cpu(), expected)


SEGMENT_DATA = [[1.0, 1.0], [NAN, 1.0], [3.0, NAN], [4.0, 1.0], [4.0, 2.0], [2.0, -3.0]]


@pytest.mark.parametrize("reduce", ["max", "min", "amax", "amin"])
@pytest.mark.parametrize("initial", [None, 3.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segment_max_min_gradients_are_cpus(reduce, initial, dtype):
    """CPU's backward gives a run's gradient to its elements equal to the result or NaN, and
    divides the positive ones among ties (PyTorch's test_segment_reductions: test_simple_1d).
    ``amax`` and ``amin`` are torch's other names of ``max`` and ``min`` (what PyG's
    ``segment(x, ptr, reduce="max")`` passes): ``amax`` computed a minimum."""

    def fn(data, lengths, grad):
        out = torch._segment_reduce(data, reduce, lengths=lengths, axis=0, unsafe=True, initial=initial)
        return torch.autograd.grad(out, data, grad)[0]

    data = torch.tensor(SEGMENT_DATA, dtype=dtype).requires_grad_()
    grad = torch.tensor([[2.0, -1.0], [1.0, 1.0], [-2.0, 4.0], [1.0, 1.0]], dtype=dtype)
    run_both(fn, data, torch.tensor([1, 2, 3, 0], dtype=torch.int), grad)


@pytest.mark.parametrize("reduce", ["max", "min", "amax", "amin", "sum", "prod", "mean"])
def test_segment_reduce_with_offsets_is_cpus(reduce):
    data = torch.tensor([[1.0, 2.0], [5.0, -1.0], [3.0, 0.5], [2.0, 4.0], [-4.0, 1.0]])
    run_both(
        lambda data, offsets: torch._segment_reduce(data, reduce, offsets=offsets), data, torch.tensor([0, 3, 3, 5])
    )


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "prod", "mean"])
@pytest.mark.parametrize("initial", [None, 0])
def test_segment_reduce_of_no_elements_is_cpus(reduce, initial):
    run_both(
        lambda data, lengths: torch._segment_reduce(data, reduce, lengths=lengths, axis=0, initial=initial),
        torch.ones(0),
        torch.tensor([0, 0]),
    )


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
@pytest.mark.parametrize("rows, size", [([0, 0, 2, 2, 2, 4], 6), ([], 3), ([1, 2], 3)])
def test_csr_row_pointers_are_cpus(rows, size, out_int32, transpose):
    """A CSR row pointer from sorted COO rows and back (PyG's ``EdgeIndex``: they ran on CPU)."""
    rows = torch.tensor(rows, dtype=torch.long)
    with no_fallback():
        crow = run_both(lambda r: torch._convert_indices_from_coo_to_csr(r, size, out_int32=out_int32), rows)
        cols = torch.arange(rows.numel(), dtype=crow.dtype)
        to_coo = torch._convert_indices_from_csr_to_coo
        run_both(lambda c, col: to_coo(c, col, out_int32=out_int32, transpose=transpose), crow.cpu(), cols)
