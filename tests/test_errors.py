"""torch's own errors, raised at the line that caused them."""

from __future__ import annotations

import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazytpu


def test_broadcast_error_raised_at_the_line():
    a = torch.randn(2, 3, device="tpu")
    b = torch.randn(4, device="tpu")
    with pytest.raises(RuntimeError) as tpu_err:
        a + b  # the offending line
    with pytest.raises(RuntimeError) as cpu_err:
        torch.randn(2, 3) + torch.randn(4)
    assert str(tpu_err.value) == str(cpu_err.value)
    frames = traceback.extract_tb(tpu_err.tb)
    assert frames[0].line == "a + b  # the offending line"


def test_mixing_cpu_and_tpu_raises_like_cuda():
    a = torch.randn(3, device="tpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.randn(3) * a


def test_scalars_and_zero_dim_cpu_tensors_are_allowed():
    a = torch.tensor([1.0, 2.0]).to("tpu")
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), torch.tensor([3.0, 4.0]))
    torch.testing.assert_close((a * 3).cpu(), torch.tensor([3.0, 6.0]))


def test_error_leaves_state_usable():
    a = torch.randn(2, 3, device="tpu")
    with pytest.raises(RuntimeError):
        a + torch.randn(5, device="tpu")
    torch.testing.assert_close((a + 1).cpu(), a.cpu() + 1)


def test_dtype_error_for_inplace_matches_torch():
    i = torch.ones(3, dtype=torch.int64)
    with pytest.raises(RuntimeError) as cpu_err:
        i.add_(torch.ones(3) * 0.5)
    t = i.to("tpu")
    with pytest.raises(RuntimeError) as tpu_err:
        t.add_(torch.ones(3, device="tpu") * 0.5)
    assert str(tpu_err.value) == str(cpu_err.value)


@pytest.mark.filterwarnings("ignore:lazytpu.*no lowering")
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_tensors_get_a_clear_error_and_the_dense_path_works():
    """tpu tensors are strided: moving a sparse tensor, or an op that returns
    one (to_sparse, to_sparse_csr), raises NotImplementedError that says what
    to do, where it used to fail inside the transfer with "unsupported memory
    format option Contiguous"."""
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    sparse = dense.to_sparse()
    with pytest.raises(NotImplementedError, match="torch.sparse_coo tensor cannot be made or moved to tpu"):
        sparse.to("tpu")
    x = dense.to("tpu")
    before = lazytpu.metrics.snapshot()["bytes_from_device"]
    with pytest.raises(NotImplementedError, match="to_dense"):
        x.to_sparse()
    with pytest.raises(NotImplementedError, match="torch.sparse_csr tensor"):
        x.to_sparse_csr()
    with pytest.raises(NotImplementedError, match="torch.sparse_bsc tensor"):
        x.to_sparse(layout=torch.sparse_bsc, blocksize=(1, 1))
    assert lazytpu.metrics.snapshot()["bytes_from_device"] == before  # refused before reading x
    assert torch.equal(sparse.to_dense().to("tpu").cpu(), dense)
    assert torch.equal(x.cpu(), dense)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize(
    "layout,make",
    [
        (torch.sparse_csr, lambda d: d.to_sparse_csr().to("tpu")),
        (torch.sparse_csc, lambda d: d.to_sparse_csc().to("tpu", torch.float64)),
        (torch.sparse_bsr, lambda d: d.to_sparse_bsr((1, 1)).tpu()),
        (torch.sparse_bsc, lambda d: d.to_sparse_bsc((1, 1)).to(device="tpu")),
        (torch.sparse_csr, lambda d: torch.empty((2, 2), layout=torch.sparse_csr, device="tpu")),
        (torch.sparse_coo, lambda d: torch.zeros((2, 2), layout=torch.sparse_coo, device="tpu")),
    ],
)
def test_compressed_sparse_tensors_are_refused_when_moved(layout, make):
    """torch's own .to() of a CSR/CSC/BSR/BSC tensor moves its members and
    wraps them in C++ (Note [Sparse layouts on tpu]): it returned a tpu tensor
    of that layout on which every op failed ("unsupported tensor layout:
    SparseCsr"); the move itself raises now, and the CPU tensor is untouched."""
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    with pytest.raises(NotImplementedError, match=f"a {layout} tensor cannot be made or moved to tpu"):
        make(dense)
    csr = dense.to_sparse_csr()
    assert torch.equal(csr.to(torch.float64).to_dense(), dense.double())  # CPU's own conversions still run
    assert torch.equal(csr.to_dense().to("tpu").cpu(), dense)


@pytest.mark.filterwarnings("ignore:lazytpu.*no lowering")
def test_quantizing_a_tpu_tensor_gets_a_clear_error():
    """quantize_per_tensor runs on CPU and its quantized result cannot come
    back: NotImplementedError, where it was "TypeError: Got unsupported
    ScalarType QUInt8" from the transfer."""
    x = torch.tensor([0.5, -1.0, 2.0], device="tpu")
    with pytest.raises(NotImplementedError, match=r"no quantized tensors \(torch.quint8\).*dequantize"):
        torch.quantize_per_tensor(x, 0.1, 5, torch.quint8)
    quantized = torch.quantize_per_tensor(x.cpu(), 0.1, 5, torch.quint8)
    assert torch.equal(quantized.dequantize().to("tpu").cpu(), quantized.dequantize())
    assert torch.equal(x.cpu(), torch.tensor([0.5, -1.0, 2.0]))


@pytest.mark.parametrize(
    "name,inplace",
    [
        ("elu_", lambda t: F.elu_(t, alpha=-2.0)),
        ("celu_", lambda t: F.celu_(t, alpha=-2.0)),
        ("leaky_relu_", lambda t: F.leaky_relu_(t, -2.0)),
        ("rrelu_", lambda t: F.rrelu_(t, -5.0, 1.0)),  # eval: leaky_relu_ with slope -2
    ],
)
def test_inplace_activation_with_a_negative_slope_refuses_backward(name, inplace):
    """CPU's backward of these in-place activations with a negative slope
    raises (the input cannot be recovered from the output); tpu computed a
    wrong gradient from the output (elu_ at -1: 1.0 for -0.74)."""
    for device in ("cpu", "tpu"):
        x = torch.tensor([-1.0, 1.0], device=device, requires_grad=True)
        y = inplace(x.clone())
        with pytest.raises(RuntimeError, match="backward calculation is triggered with a negative slope"):
            y.backward(torch.ones(2, device=device))  # raised by backward() (Note [Errors in backward])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros([1] * 65).to("tpu"),
        lambda: torch.ones([1] * 65, device="tpu"),
        lambda: torch.ones([1] * 64, device="tpu").unsqueeze(0) + 1,
    ],
)
def test_more_than_64_dims_get_a_clear_error(make):
    """numpy (so JAX) holds at most 64 dims; CPU torch computes 65-dim elementwise
    ops. A tpu value of 65 dims raises at the line that makes it (was a
    ValueError from numpy at the next read, or a CPU fallback)."""
    with pytest.raises(RuntimeError, match="tpu tensors have at most 64 dims"):
        make().cpu()
    assert torch.ones([1] * 64, device="tpu").sum().item() == 1.0


@pytest.mark.parametrize(
    "inplace",
    [torch.Tensor.pow_, torch.Tensor.atan2_, torch.Tensor.fmod_, torch.Tensor.hypot_, torch.Tensor.clamp_min_],
    ids=lambda f: f.__name__,
)
def test_inplace_op_whose_broadcast_shape_grows_self_raises_cpus_error(inplace):
    """CPU's message, no resize warning, and ``self`` unchanged (tpu raised expand's
    error after a "was resized" warning)."""
    for device in ("cpu", "tpu"):
        x = torch.ones(2, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(
                RuntimeError, match=r"^output with shape \[2\] doesn't match the broadcast shape \[2, 2\]$"
            ):
                inplace(x, torch.ones(2, 1, device=device))
        assert not [str(w.message) for w in caught if "resized" in str(w.message)]
        assert x.cpu().tolist() == [1.0, 1.0]
