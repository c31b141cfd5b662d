"""Indexing lowerings against CPU torch, forward and backward, both modes."""

from __future__ import annotations

import pytest
import torch
from conftest import run_both

import lazytpu


def _idx(*values):
    return torch.tensor(values)


CASES = {
    "index_rows": (lambda x, i: x[i], lambda: (torch.randn(5, 4, requires_grad=True), _idx(4, 0, -1, 0))),
    "index_cols_2d": (
        lambda x, i: x[:, i],
        lambda: (torch.randn(3, 6, requires_grad=True), _idx([1, 2], [0, -1])),
    ),
    "index_two": (lambda x, i: x[i, i.flip(0)], lambda: (torch.randn(4, 4, requires_grad=True), _idx(0, 3, 1))),
    "gather": (
        lambda x, i: x.gather(1, i),
        lambda: (torch.randn(3, 4, requires_grad=True), _idx([0, 3], [1, 1], [2, 0])),
    ),
    "scatter_src": (
        lambda x, i: x.scatter(1, i, x[:, :2] * 2),
        lambda: (torch.randn(3, 4, requires_grad=True), _idx([0, 3], [1, 2], [2, 0])),
    ),
    "scatter_add": (
        lambda x, i: x.scatter_add(0, i, x.new_ones(2, 4)),
        lambda: (torch.randn(3, 4, requires_grad=True), _idx([0, 1, 2, 0], [2, 2, 2, 2])),
    ),
    "index_put_acc": (
        lambda x, i: x.index_put((i,), x.new_ones(3, 2), accumulate=True),
        lambda: (torch.randn(4, 2, requires_grad=True), _idx(1, 1, 3)),
    ),
    "index_copy": (
        lambda x, i: x.index_copy(0, i, x.new_zeros(2, 3)),
        lambda: (torch.randn(4, 3, requires_grad=True), _idx(3, 0)),
    ),
    "index_fill": (lambda x, i: x.index_fill(1, i, 2.5), lambda: (torch.randn(2, 5, requires_grad=True), _idx(4, 0))),
    "index_select": (lambda x, i: x.index_select(0, i), lambda: (torch.randn(4, 3, requires_grad=True), _idx(2, 2, 0))),
    "take": (lambda x, i: x.take(i), lambda: (torch.randn(3, 3, requires_grad=True), _idx(0, 8, -2))),
    "embedding_like": (
        lambda x, i: torch.nn.functional.embedding(i, x),
        lambda: (torch.randn(6, 3, requires_grad=True), _idx([1, 5], [0, 1])),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_indexing_matches_cpu(name, mode):
    fn, make = CASES[name]
    x, i = make()
    lazytpu.metrics.reset()
    run_both(fn, x, i, mode_name=mode, grad=True)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_boolean_mask_indexing_matches_cpu():
    x = torch.randn(4, 3)
    run_both(lambda t: t[t > 0] * 2, x)

    def assign(t):
        t = t.clone()
        t[t > 0] = 0.5
        return t

    run_both(assign, x)


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_masked_assignment_forms(mode):
    def assign(t):
        t = t.clone()
        t[t[:, 0] > 0] = t.new_tensor([9.0, 8.0, 7.0])  # broadcast row
        t[t < -0.5] = 0.0
        m = t > 1
        t[m] = t[m] * 10  # one value per True position (a host sync computes t[m])
        t.index_put_((t < 0,), t.new_tensor(1.0), accumulate=True)
        return t

    lazytpu.metrics.reset()
    run_both(assign, torch.randn(5, 3), mode_name=mode)
    assert set(lazytpu.metrics.snapshot()["cpu_fallbacks"]) <= {"aten.index.Tensor"}


DATA_DEPENDENT_CASES = {
    "nonzero": lambda t: t.nonzero(),
    "unique": lambda t: torch.unique(t),
    "unique_counts": lambda t: torch.unique(t, return_counts=True)[1],
    "unique_consecutive": lambda t: torch.unique_consecutive(t),
    "masked_select": lambda t: torch.masked_select(t, t > 0),
    "bool_mask": lambda t: t[t > 0] * 2,
    "repeat_interleave": lambda t: torch.repeat_interleave((t > 0).long() + 1),
}


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT_CASES))
def test_data_dependent_ops_sync_and_continue(name):
    """They sync (reason "data_dependent"), are not CPU fallbacks, and work
    with the fallback turned off; recording continues on their results."""
    from lazytpu import _config

    x = torch.tensor([0.0, 1.5, 0.0, -2.0, 3.0, 1.5])
    with _config.CPU_FALLBACK.override(False):
        lazytpu.metrics.reset()
        out = run_both(lambda t: DATA_DEPENDENT_CASES[name](t + 0) + 1, x)
    snap = lazytpu.metrics.snapshot()
    assert snap["cpu_fallbacks"] == {}
    assert snap["syncs"].get("data_dependent", 0) >= 1
    assert out.device.type == "tpu"


NONZERO_STATIC = {
    "padded": (torch.tensor([[0.0, 1.0], [2.0, 0.0]]), 4, -1),
    "cut": (torch.tensor([[0.0, 1.0], [2.0, 0.0]]), 1, 7),
    "transposed": (torch.tensor([[0.0, 1.0], [2.0, 3.0]]).t(), 3, -1),
    "bool_3d": (torch.arange(24).reshape(2, 3, 4) % 3 == 0, 5, 0),
    "complex": (torch.tensor([1 + 1j, 0j, 2j]), 3, -2),
    "scalar": (torch.tensor(3.0), 2, -1),
    "empty": (torch.zeros(2, 0, 3), 2, 5),
}


@pytest.mark.parametrize("name", sorted(NONZERO_STATIC))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_nonzero_static_is_lowered(name, mode):
    """Its size is given, so it is recorded (no sync, no CPU run), with CPU's
    values, fill rows and contiguous layout."""
    x, size, fill = NONZERO_STATIC[name]
    lazytpu.metrics.reset()
    out = run_both(lambda t: torch.nonzero_static(t * 1, size=size, fill_value=fill), x, mode_name=mode)
    assert out.stride() == torch.nonzero_static(x, size=size).stride()
    snap = lazytpu.metrics.snapshot()
    assert snap["cpu_fallbacks"] == {} and "data_dependent" not in snap["syncs"]


CPU_INDEXING = {
    "index": lambda x, i, m: x[i],
    "index_mask": lambda x, i, m: x[m],
    "index_2d": lambda x, i, m: x.reshape(2, 3)[torch.tensor([1, 0]), torch.tensor([2, 0])],
    "setitem": lambda x, i, m: _set(x.clone(), i, 5.0),
    "setitem_mask": lambda x, i, m: _set(x.clone(), m, -1.0),
    "index_put_accumulate": lambda x, i, m: x.clone().index_put_((i,), x[:2] + 8.0, accumulate=True),
}


def _set(x, index, value):
    x[index] = value
    return x


@pytest.mark.parametrize("name", list(CPU_INDEXING))
def test_advanced_indexing_takes_cpu_index_tensors(name):
    """``x[idx]`` and ``x[idx] = v`` take index tensors on the CPU, as torch
    does for CUDA tensors (``x[torch.randperm(n)]`` ports unchanged)."""
    fn = CPU_INDEXING[name]
    x = torch.arange(6.0)
    i, m = torch.tensor([0, 2]), torch.tensor([True, False, True, False, False, True])
    expected = fn(x, i, m)
    got = fn(x.to("tpu"), i, m)
    assert got.device.type == "tpu"
    assert torch.equal(got.cpu(), expected)


def test_index_select_with_a_cpu_index_raises_torchs_device_error():
    """Only advanced indexing takes CPU indices; ``index_select`` and ``gather`` raise as on CUDA."""
    x = torch.arange(6.0).to("tpu")
    for fn in (lambda: torch.index_select(x, 0, torch.tensor([0])), lambda: x.gather(0, torch.tensor([0]))):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fn()


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, i: x[i],
        lambda x, i: x[:, torch.tensor([0, 1]), None, i],
        lambda x, i: x.__setitem__(i, 1.0),
        lambda x, i: x.index_put_((i,), torch.tensor(2.0)),
    ],
    ids=["index", "index_mixed", "setitem", "index_put_"],
)
def test_a_cpu_tensor_indexed_by_tpu_indices_raises_torchs_error(fn):
    """torch's message for indices on a device the indexed tensor is not on (CUDA's, and
    PyTorch's test_torch.py test_advancedindex_mixed_devices_error); the tensor keeps its values."""
    x = torch.zeros(3, 4, 4)
    with pytest.raises(RuntimeError, match=r"^indices should be either on cpu or on the same device as the indexed"):
        fn(x, torch.tensor([0, 2]).to("tpu"))
    assert torch.equal(x, torch.zeros(3, 4, 4))


SUMS = {
    "index_add": lambda x, i, s, dim: x.index_add(dim, i, s),
    "scatter_add": lambda x, i, s, dim: x.scatter_add(dim, _along(i, s, dim), s),
    "scatter_reduce_sum": lambda x, i, s, dim: x.scatter_reduce(dim, _along(i, s, dim), s, "sum", include_self=False),
}


def _along(index, src, dim):
    shape = [1, 1]
    shape[dim] = -1
    return index.reshape(shape).expand(src.shape)


@pytest.mark.parametrize("name", sorted(SUMS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [0, 1])
def test_sums_of_half_updates_add_them_in_float32_as_cpu(name, dtype, dim):
    # many updates of one row: a scatter in the half dtype rounded each add (8.5% off at 16k updates in bfloat16)
    gen = torch.Generator().manual_seed(0)
    x, src = torch.randn(4, 16, generator=gen), torch.randn(2000, 16, generator=gen)
    index = torch.randint(0, 4, (2000,), generator=gen)
    if dim == 1:
        x, src = x.T.contiguous(), src.T.contiguous()
    out = run_both(lambda x, i, s: SUMS[name](x, i, s, dim), x.to(dtype), index, src.to(dtype), atol=0, rtol=0)
    assert out.dtype == dtype


def _layouts(device):
    """Bases of several layouts: contiguous, transposed, at an offset with a step, expanded."""
    base = torch.arange(240.0, device=device)
    return {
        "contiguous": base.view(4, 5, 12),
        "transposed": base.view(4, 5, 12).transpose(0, 2),
        "offset_step": base[7:].view(233)[::2][:60].view(5, 12),
        "expanded": base[:12].view(1, 12).expand(3, 12),
    }


def _outcome(fn):
    try:
        v = fn()
    except Exception as exc:  # noqa: BLE001 - the error is compared
        return type(exc), str(exc)
    return tuple(v.shape), v.stride(), v.storage_offset(), v.cpu().tolist()


def test_select_and_slice_of_every_index_are_cpus_windows():
    """(Note [Index windows]) ``select`` and ``slice`` of ints compute their window without the
    meta kernel: every dim, index, bound and step (in range or not) gives CPU's size, strides,
    offset and values, or its error."""
    cpu, tpu = _layouts("cpu"), _layouts("tpu")
    bounds = (None, -9, -2, 0, 3, 9, 2**63 - 1)
    for name in cpu:
        ndim = cpu[name].dim()
        for dim in range(-ndim - 1, ndim + 1):
            for index in (-13, -5, -1, 0, 2, 4, 11, 12):
                calls = [lambda t: torch.select(t, dim, index)]  # noqa: B023
                calls += [
                    lambda t, a=a, b=b, s=s: torch.ops.aten.slice.Tensor(t, dim, a, b, s)  # noqa: B023
                    for a in bounds
                    for b in bounds
                    for s in (1, 2, 0)
                    if index == 0
                ]
                for call in calls:
                    want = _outcome(lambda: call(cpu[name]))  # noqa: B023
                    assert _outcome(lambda: call(tpu[name])) == want, (name, dim, index)  # noqa: B023


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.int8])
def test_reading_a_window_reads_its_values(dtype):
    """A contiguous window of a larger base is copied to the host alone (``to_cpu``): its
    values, of every kind of storage dtype, are CPU's; a window of a base laid out with
    strides (a transpose's storage) is read through the base."""
    cpu = torch.arange(60.0).view(3, 4, 5).to(dtype)
    tpu = cpu.to("tpu")
    tpu.cpu()  # computed: the windows are read from the device's buffer
    for window in (lambda t: t[1], lambda t: t[2, 1:3], lambda t: t[0, 3, 4], lambda t: t.view(-1)[7:9]):
        got = window(tpu).cpu()
        assert torch.equal(got, window(cpu)) and got.is_contiguous()
    moved = cpu.permute(2, 0, 1).contiguous().to("tpu").permute(1, 2, 0)  # storage strides not contiguous
    assert torch.equal(moved.contiguous()[1].cpu(), cpu[1])
    assert torch.equal(moved[1].cpu(), cpu[1])


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool, torch.int8, torch.int64]
    + [torch.uint64, torch.complex64, torch.complex32],
)
def test_an_elements_item_is_cpus(dtype):
    """``item()`` reads the element from the host copy of its storage (``hostio.item``): the
    Python number of CPU's ``item()``, its type, sign of zero and NaN, for an element of a
    window, of a base laid out with strides, of a dtype view and of a conjugate."""
    values = [0.0, -0.0, 1.5, -2.25, float("inf"), float("nan"), 3e38, 1e-40, 2.0**63 - 1024, 7.0]
    cpu = torch.tensor(values, dtype=torch.float64).to(dtype).view(2, 5)
    if dtype is torch.uint64:
        cpu = torch.tensor([0, 1, 2**64 - 1, 2**63, 5] * 2, dtype=dtype).view(2, 5)
    tpu = cpu.to("tpu")
    tpu.cpu()
    reads = [lambda t, i=i: t.view(-1)[i] for i in range(10)] + [lambda t: t.t()[3, 1], lambda t: t[1:, 2:3]]
    reads.append(lambda t: t.t().contiguous().t()[0, 4])  # storage strides not contiguous
    if dtype.itemsize == 4 and not dtype.is_complex:
        reads.append(lambda t: t.view(torch.int32)[1, 2])  # a dtype view
    if dtype.is_complex:
        reads.append(lambda t: t.conj()[1, 1])
    for read in reads:
        want = read(cpu).item()
        got = read(tpu).item()
        assert (type(got), repr(got)) == (type(want), repr(want))
