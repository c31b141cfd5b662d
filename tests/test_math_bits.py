"""The conjugate and negative bits (Note [Math bits] in lazytpu.frontend.tensor):
``x.conj()`` of a complex tensor is a view whose values are the conjugate of its
base's, read and written through it, and ``.imag`` of such a view carries the
negative bit. Each case runs on CPU torch and on ``tpu`` in both modes; every
tensor it returns must match in values, dtype, layout and bits."""

from __future__ import annotations

import copy
import io

import pytest
import torch


def _z(device):
    real = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return torch.complex(real, 0.5 - real).to(device)


def _base_write_seen_by_conj(d):
    x = _z(d)
    c = x.conj()
    x.add_(1j)
    return [x, c]


def _write_through_conj(d):
    x = _z(d)
    c = x.conj()
    c.mul_(2 + 1j)
    c[0, 1] = 5 - 3j
    return [x, c]


def _views_of_conj(d):
    x = _z(d)
    c = x.conj()
    t, row, flat = c.t(), c[1], c.reshape(-1)
    t[0].zero_()
    return [x, c, t, row, flat, c.real]


def _imag_of_conj_is_negative(d):
    x = _z(d)
    c = x.conj()
    im = c.imag
    im.add_(10)  # writes the negation into x's imaginary parts
    return [x, c, im, c.imag.t()]


def _ops_on_bits(d):
    x = _z(d)
    c = x.conj()
    y = _z(d) * (1 - 2j)
    return [c + y, c @ y.t(), c.t() @ y, torch.sin(c), c.sum(1), (c.imag * 2).exp(), c.resolve_conj(), c.clone()]


def _double_conj_and_neg_view(d):
    x = _z(d)
    cc = x.conj().conj()
    n = x.real._neg_view()
    nn = n._neg_view()
    n.sub_(1)
    return [x, cc, n, nn]


def _copies(d):
    x = _z(d)
    c = x.conj()
    deep, shallow = copy.deepcopy(c), copy.copy(c)
    x.add_(1)
    return [deep, shallow, c]


def _prims_views(d):
    """PrimTorch's views (``torch._refs``, Note [Prims views] in
    lazytpu.frontend.routes.handlers): the same aliases and bits as the aten ones."""
    prims = torch.ops.prims
    x = _z(d)
    conj, imag, real = prims.conj.default(x), prims.imag.default(x.conj()), prims.real.default(x.conj())
    strided = prims.as_strided.default(x, (2, 2), (1, 4), 1)
    strided.mul_(2)  # written through to x
    return [x, conj, imag, real, strided, torch._refs.conj(x), torch._refs.imag(x.conj())]


def _in_place_metadata_changes_keep_the_bits(d):
    """In-place views, ``set_`` and ``resize_`` change sizes, strides or storage
    only (PyTorch's test_ops TestMathBits: as_strided_ dropped the bits)."""
    x = _z(d)
    views = [x.conj(), x.conj()._neg_view(), x[:1].conj(), x.conj(), x.conj(), x.conj()]
    views[0].as_strided_((2, 3), (1, 2), 1)
    views[1].t_()
    views[2].squeeze_(0).unsqueeze_(1)
    views[3].transpose_(0, 1).mul_(2)  # written through to x
    views[4].set_(_z(d)[1])
    views[5].resize_(2, 2)
    return [x, *views]


CASES = [
    _in_place_metadata_changes_keep_the_bits,
    _prims_views,
    _base_write_seen_by_conj,
    _write_through_conj,
    _views_of_conj,
    _imag_of_conj_is_negative,
    _ops_on_bits,
    _double_conj_and_neg_view,
    _copies,
]


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_math_bits_match_cpu(case, mode):
    expected = case("cpu")
    with torch.tpu.set_eager_mode(mode):
        actual = case("tpu")
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert (a.shape, a.stride(), a.dtype) == (e.shape, e.stride(), e.dtype)
            assert (a.is_conj(), a.is_neg()) == (e.is_conj(), e.is_neg())
            torch.testing.assert_close(a.cpu(), e)


def test_prims_conj_of_a_real_tensor_raises_as_on_cpu():
    with pytest.raises(RuntimeError, match="Expected complex dtype in prims.conj"):
        torch.ops.prims.conj.default(torch.ones(2, device="tpu"))


@pytest.mark.parametrize(
    "view, message",
    [
        (torch.view_as_real, "view_as_real doesn't work on unresolved conjugated tensors"),
        (lambda c: c.view(torch.float32), "not supported for conjugate view tensors"),
        (lambda c: c.view(torch.complex64), "not supported for conjugate view tensors"),
        (lambda c: c.imag.view(torch.int32), "not supported for tensors with negative bit set"),
    ],
    ids=["view_as_real", "view_dtype", "view_same_dtype", "view_of_negative"],
)
def test_views_that_cannot_carry_a_bit_raise_as_on_cpu(view, message):
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match=message):
            view(_z(device).conj())
    resolved = torch.view_as_real(_z("tpu").conj().resolve_conj())
    assert torch.equal(resolved.cpu(), torch.view_as_real(_z("cpu").conj().resolve_conj()))


def test_gradients_through_conjugate_views():
    def grads(d):
        x = _z(d).requires_grad_()
        w = (_z(d) * 1j + 0.25).requires_grad_()
        loss = (x.conj().t() @ w).abs().sum() + (x.conj().imag * w.real).sum()
        loss.backward()
        return x.grad, w.grad

    for a, e in zip(grads("tpu"), grads("cpu")):
        torch.testing.assert_close(a.cpu(), e)


def test_saved_conjugate_view_loads_with_its_values():
    x = _z("tpu")
    buf = io.BytesIO()
    torch.save({"c": x.conj(), "n": x.conj().imag}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["c"].device.type == "tpu"
    torch.testing.assert_close(loaded["c"].cpu(), _z("cpu").conj().resolve_conj())
    torch.testing.assert_close(loaded["n"].cpu(), _z("cpu").conj().imag.resolve_neg())


def test_data_assignment_takes_the_bits_of_the_new_value():
    t = torch.zeros(3, 4, dtype=torch.complex64, device="tpu")
    t.data = _z("tpu").conj()
    assert t.is_conj()
    torch.testing.assert_close(t.cpu(), _z("cpu").conj())
    t.data = _z("tpu")
    assert not t.is_conj()
    torch.testing.assert_close(t.cpu(), _z("cpu"))
