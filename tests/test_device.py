"""The ``tpu`` device: registration, moves, host reads, torch.tpu."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import no_fallback

import lazytpu


def test_readme_example_prints_product_and_device():
    code = (
        "import torch, lazytpu\n"
        "x = torch.randn(2, 2, device='tpu'); y = torch.randn(2, 2, device='tpu')\n"
        "z = x @ y\n"
        "print(z); print(z.device)\n"
        "torch.testing.assert_close(z.cpu(), x.cpu() @ y.cpu())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "device='tpu:0'" in out.stdout
    assert out.stdout.strip().endswith("tpu:0")


def test_device_objects():
    assert torch.device("tpu").type == "tpu"
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    x = torch.ones(3).to("tpu")
    assert x.device == torch.device("tpu", 0)
    assert isinstance(x, lazytpu.LazyTensor)


def test_round_trip_keeps_values_and_dtypes():
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16):
        cpu = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
        back = cpu.to("tpu").cpu()
        assert back.dtype == dtype
        torch.testing.assert_close(back, cpu)
        assert cpu.to("tpu").to("cpu").dtype == dtype


def test_host_reads():
    x = torch.tensor([1.5, 2.5]).to("tpu")
    assert (x * 2).tolist() == [3.0, 5.0]
    assert (x.sum()).item() == 4.0
    assert isinstance(x[0].item(), float)
    assert bool(x.sum() > 3) is True
    assert torch.tensor(7).to("tpu").item() == 7


def test_repr_matches_cuda_style():
    x = torch.tensor([[1.0, 2.0]]).to("tpu")
    assert repr(x) == "tensor([[1., 2.]], device='tpu:0')"
    i = torch.tensor([1, 2], dtype=torch.int32).to("tpu")
    assert repr(i) == "tensor([1, 2], device='tpu:0', dtype=torch.int32)"
    g = torch.ones(2).to("tpu").requires_grad_()
    assert repr(g) == "tensor([1., 1.], device='tpu:0', requires_grad=True)"
    assert "grad_fn=<MulBackward0>" in repr(g * 2)
    p = torch.nn.Parameter(torch.ones(1).to("tpu"))
    assert repr(p) == "Parameter containing:\ntensor([1.], device='tpu:0', requires_grad=True)"


def test_a_0d_tensor_formats_as_its_number():
    """torch's ``__format__`` (f-strings, ``format``) for ``type(self) is Tensor`` only:
    ``f"expert_{idx}"`` was ``expert_tensor(0, device='tpu:0')`` (SwitchTransformers'
    KeyError) and ``f"{loss:.4f}"`` raised TypeError."""
    for d in ("cpu", "tpu"):
        i, x = torch.tensor(3).to(d), torch.tensor(2.5).to(d)
        assert (f"expert_{i}", f"{x:.3f}", f"{i:>3}", format(x > 1)) == ("expert_3", "2.500", "  3", "True")
        assert f"{torch.nn.Parameter(x)}".startswith("Parameter containing:\ntensor(2.5000")
        with pytest.raises(TypeError, match="unsupported format string passed to"):
            f"{torch.ones(2).to(d):.2f}"


def test_numpy_fails_as_on_cuda():
    x = torch.ones(2).to("tpu")
    with pytest.raises(TypeError, match="can't convert tpu:0 device type tensor to numpy"):
        x.numpy()


def test_numpy_with_force_copies_as_on_cuda():
    """``force=True``: detached, on the host, math bits resolved (it raised)."""
    makes = (
        lambda d: torch.arange(3.0, device=d, requires_grad=True),
        lambda d: torch.tensor([1 + 2j], device=d).conj(),
        lambda d: torch._neg_view(torch.tensor([1.0, -2.0], device=d)),
    )
    for make in makes:
        expected = make("cpu").numpy(force=True)
        got = make("tpu").numpy(force=True)
        assert got.dtype == expected.dtype and (got == expected).all()


def test_dlpack_export_is_refused():
    """A capsule would carry a stand-in pointer: numpy and torch read garbage
    from it (torch.from_dlpack of the capsule made a tensor no op could use)."""
    import numpy as np

    x = torch.ones(2).to("tpu")
    exports = [x.__dlpack__, lambda: np.from_dlpack(x), x.__dlpack_device__, lambda: torch.from_dlpack(x)]
    # the legacy capsule export never asked the tensor (Note [DLPack on tpu])
    exports += [lambda: torch.to_dlpack(x), lambda: torch.utils.dlpack.to_dlpack(x)]
    for export in exports:
        with pytest.raises(BufferError, match="can't export a tpu:0 device type tensor through DLPack"):
            export()
    assert torch.from_dlpack(x.cpu()).tolist() == [1.0, 1.0]
    assert torch.from_dlpack(torch.to_dlpack(x.cpu())).tolist() == [1.0, 1.0]
    assert x.cpu().tolist() == [1.0, 1.0]


def test_manual_seed_reproducible():
    torch.manual_seed(123)
    a = torch.randn(4, 4, device="tpu").cpu()
    b = torch.randn(4, 4, device="tpu").cpu()
    torch.manual_seed(123)
    c = torch.randn(4, 4, device="tpu").cpu()
    torch.testing.assert_close(a, c)
    assert not torch.equal(a, b)
    torch.tpu.manual_seed(5)
    d = torch.randn(3, device="tpu").cpu()
    torch.tpu.manual_seed_all(5)
    torch.testing.assert_close(d, torch.randn(3, device="tpu").cpu())


def test_rng_state_roundtrip():
    state = torch.tpu.get_rng_state()
    a = torch.randn(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(a, torch.randn(5, device="tpu").cpu())


def test_torch_tpu_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    name = torch.tpu.get_device_name()
    assert "cpu" in name.lower() or "gpu" in name.lower() or "tpu" in name.lower()
    torch.tpu.synchronize()
    assert set(torch.tpu.__all__) >= {
        "is_available",
        "device_count",
        "current_device",
        "synchronize",
        "manual_seed",
        "manual_seed_all",
        "get_device_name",
        "EagerMode",
    }


def test_module_to_tpu_trains():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    assert all(p.device.type == "tpu" for p in model.parameters())
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
    x = torch.randn(8, 4)
    for m, inp in ((model, x.to("tpu")), (ref, x)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
    torch.testing.assert_close(model.weight.detach().cpu(), ref.weight.detach())
    torch.testing.assert_close(model.bias.detach().cpu(), ref.bias.detach())


def test_platform_choice_errors_name_what_is_present():
    code = "import torch, lazytpu; torch.ones(1, device='tpu').cpu()"
    env = {"LAZYTPU_PLATFORM": "tpu", "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0
    assert "RuntimeError" in out.stderr and "present: cpu" in out.stderr


def test_tensor_constructors_on_tpu():
    t = torch.tensor([[1, 2], [3, 4]], device="tpu")
    assert t.device.type == "tpu" and t.dtype == torch.int64
    assert t.tolist() == [[1, 2], [3, 4]]
    assert torch.as_tensor([1.5], device="tpu").item() == 1.5
    assert t.new_tensor([7.0]).device.type == "tpu"
    assert torch.tensor(3.0, device="tpu", dtype=torch.float64).cpu().dtype == torch.float64


def test_save_and_load_state_dict(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).to("tpu")
    model.weight.data.mul_(2)  # pending work must be synced by the save
    path = tmp_path / "ckpt.pt"
    torch.save(model.state_dict(), path)
    for weights_only in (True, False):
        state = torch.load(path, weights_only=weights_only)
        assert all(v.device.type == "tpu" for v in state.values())
        other = torch.nn.Linear(5, 3).to("tpu")
        other.load_state_dict(state)
        x = torch.randn(2, 5).to("tpu")
        assert torch.equal(model(x).cpu(), other(x).cpu())
    on_cpu = torch.load(path, map_location="cpu", weights_only=True)
    torch.testing.assert_close(on_cpu["weight"], model.weight.detach().cpu())


def test_copies_between_host_and_device_do_not_share_memory():
    """``.to("tpu")`` and ``.cpu()`` copy: a later in-place write on either side
    does not show through on the other (as between CPU and CUDA)."""
    host = torch.zeros(64, 64)
    on_device = host.to("tpu")
    host.add_(1)  # right after the upload, before anything syncs
    assert on_device.sum().item() == 0.0
    back = (on_device + 2).cpu()
    back.add_(5)
    assert on_device.sum().item() == 0.0 and (on_device + 2).sum().item() == 2 * 64 * 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_a_tensor_copied_to_the_device_stays_resizable(dtype):
    """The CPU tensor a ``.to("tpu")`` read is the user's as it was: resizable afterwards (QAT's per-channel
    observer statistics are resized in place; reading it through ``numpy()`` had frozen its size)."""
    host = torch.ones(3, dtype=dtype)
    on_device = host.to("tpu")
    host.resize_(5)
    assert host.shape == (5,) and torch.equal(on_device.cpu(), torch.ones(3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
def test_a_tensor_read_back_is_resizable(dtype):
    """``.cpu()`` gives a CPU tensor like any other: it can grow (``resize_``, an ``out=`` that must grow)."""
    back = torch.ones(3, dtype=dtype).to("tpu").cpu()
    back.resize_(4)
    assert back.shape == (4,)
    part, out = (torch.ones(2, dtype=dtype).to("tpu") * 2).cpu(), torch.zeros(2, dtype=dtype).to("tpu").cpu()
    with pytest.warns(UserWarning, match="was resized"):
        torch.cat([part, part], out=out)
    assert torch.equal(out, torch.full((4,), 2, dtype=dtype))


def test_has_same_storage_numel_reads_metadata_only():
    """``_has_same_storage_numel`` (torch's C++ asks it, e.g. in bicubic
    upsampling) compares storage sizes as CPU does, without the CPU fallback."""

    def run(d):
        a, b = torch.zeros(6, device=d), torch.zeros(2, 3, device=d)
        others = (
            b,
            a[1:],
            torch.zeros(5, dtype=torch.float64, device=d),
            torch.zeros(12, dtype=torch.float16, device=d),
        )
        return [torch.ops.aten._has_same_storage_numel(a, o) for o in others]

    with no_fallback():
        assert run("tpu") == run("cpu") == [True, True, False, False]


def test_is_same_size_compares_sizes_across_devices():
    """``is_same_size`` of a CPU and a tpu tensor compares sizes (it raised a
    device-mix error); forward AD's ``copy_`` of a tpu dual into a CPU tensor asks it."""
    a, b = torch.ones(2, 1), torch.ones(2, 1, device="tpu")
    assert a.is_same_size(b) and b.is_same_size(a) and not b.is_same_size(torch.ones(1, 2))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(b * 3, b * 5)
        target = torch.zeros(2, 1)
        target.copy_(dual)
        primal, tangent = torch.autograd.forward_ad.unpack_dual(target)
        assert primal.tolist() == [[3.0], [3.0]] and tangent.cpu().tolist() == [[5.0], [5.0]]


def test_forward_ad_tangent_of_a_view_is_laid_out_as_its_primal():
    """A tangent that is not laid out as its primal (a view's) is made by
    ``_new_zeros_with_same_feature_meta`` from metadata, as CPU's (it ran on
    CPU with a fallback warning); with batch dims (vmap over jvp) in front."""
    make = torch.ops.aten._new_zeros_with_same_feature_meta

    def run(d):
        base = torch.randn(5, 6, device=d)
        cases = [(2, 3, base[1:3, 2:5], 0), (4, 2, 3, base[1:3, 2:5], 1), (4, 7, 2, 3, base.t()[1:3, 2:5], 2)]
        made = [make(torch.randn(c[:-2], device=d), c[-2], self_num_batch_dims=c[-1]) for c in cases]
        with fwAD.dual_level():
            dual = fwAD.make_dual(base[:, 1:3], torch.ones(5, 2, device=d))
            tangent = fwAD.unpack_dual(dual * 2).tangent
        layout = [
            (t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes(), t.count_nonzero().item())
            for t in made
        ]
        return layout, tangent.stride(), tangent.sum().item()

    with no_fallback():
        assert run("tpu") == run("cpu")


def test_tensor_of_a_tpu_storage_reads_its_values():
    """``torch.tensor(storage)`` sets a tensor to the storage inside torch's C++
    (the Python key excluded): it failed an internal assert."""
    t = torch.arange(6.0, device="tpu") * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        host, on_tpu = torch.tensor(t.storage()), torch.tensor(t[2:].storage(), device="tpu")
    assert host.device.type == "cpu" and host.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert on_tpu.device.type == "tpu" and on_tpu.cpu().tolist() == host.tolist()


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_a_tensors_storage_copies_clones_and_fills_as_on_cpu():
    """A tpu tensor's storage has no data pointer: torch's byte copies raised
    "invalid python storage" for ``storage.cpu()``, ``clone()``,
    ``copy.deepcopy`` and ``fill_`` (Note [Storage bytes])."""

    def run(d):
        t = torch.arange(6.0, device=d) + 1
        other = torch.zeros(6, device=d)
        host = t.untyped_storage().cpu().tolist()  # on CPU, the storage itself
        clone, deep, typed = t.untyped_storage().clone(), copy.deepcopy(t.untyped_storage()), t.storage().clone()
        other.untyped_storage().copy_(t.untyped_storage())  # between two tpu storages
        t.untyped_storage().fill_(0)  # seen by the tensor; not by the copies
        with pytest.raises(RuntimeError, match="size does not match, self was 24 bytes but src was 8 bytes"):
            t.untyped_storage().copy_(torch.zeros(2).untyped_storage())
        return [host, clone.cpu().tolist(), deep.cpu().tolist(), typed.tolist(), other.tolist(), t.tolist()]

    assert run("tpu") == run("cpu")


def test_a_bool_tensors_storage_reads_and_writes_its_bytes_as_on_cpu():
    """A byte window on a bool tensor's storage, as ``view(torch.uint8)`` of it is: raised NotImplementedError."""

    def run(d):
        t = torch.tensor([True, False, True], device=d)
        host = bytes(t.untyped_storage().cpu())
        window = torch.empty(0, dtype=torch.uint8, device=d).set_(t.untyped_storage())
        t.untyped_storage().fill_(1)
        return [host, window.tolist(), t.tolist()]

    assert run("tpu") == run("cpu") == [b"\x01\x00\x01", [1, 1, 1], [True, True, True]]


def test_is_set_to_compares_storage_offset_sizes_and_strides():
    """``is_set_to`` answers from metadata as CPU does (the CPU fallback
    compared two host copies and always said False)."""

    def run(d):
        t = torch.arange(6.0, device=d)
        s = torch.empty(0, device=d).set_(t.untyped_storage(), 0, (6,))
        tail = torch.empty(0, device=d).set_(t.untyped_storage(), 1, (5,))
        return [
            s.is_set_to(t),
            torch.empty(0, device=d).set_(t).is_set_to(t),
            tail.is_set_to(t[1:]),
            t[1:].is_set_to(t),
            t.view(2, 3).is_set_to(t),
            t.is_set_to(t.clone()),
        ]

    with no_fallback():
        assert run("tpu") == run("cpu") == [True, True, True, False, False, False]
        t = torch.ones(3, device="tpu")
        assert not t.is_set_to(t.cpu())


def test_layout_queries_of_a_strided_tensor():
    with no_fallback():
        t = torch.ones(2, 3, device="tpu")
        assert (t.dense_dim(), t.sparse_dim()) == (2, 0)
        with pytest.raises(RuntimeError, match="is_coalesced expected sparse coordinate tensor layout"):
            t.is_coalesced()


_MADE_LIKE = {
    "empty_like": lambda x, d: torch.empty_like(x, device=d),
    "zeros_like": lambda x, d: torch.zeros_like(x, device=d),
    "ones_like": lambda x, d: torch.ones_like(x, device=d, dtype=torch.int32),
    "full_like": lambda x, d: torch.full_like(x, 3, device=d),
    "rand_like": lambda x, d: torch.rand_like(x, device=d),
    "randint_like": lambda x, d: torch.randint_like(x, 5, device=d),
    "new_zeros": lambda x, d: x.new_zeros((2,), device=d),
    "new_full": lambda x, d: x.new_full((2,), 3.0, device=d),
    "new_empty_strided": lambda x, d: x.new_empty_strided((2, 2), (1, 2), device=d),
    "to": lambda x, d: x.to(d, torch.float16),
}


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", sorted(_MADE_LIKE))
def test_made_like_a_tpu_tensor_on_another_device(name, device):
    """``torch.zeros_like(t, device="cpu")``, ``t.new_empty(n, device="meta")``
    and ``t.to("meta")`` make their result on that device, with CPU's layout
    and values (Note [Made elsewhere] in lazytpu.frontend.dispatch): they
    made tpu tensors."""
    make = _MADE_LIKE[name]
    x = torch.arange(6.0).view(2, 3).t()
    torch.manual_seed(0)
    got = make(x.to("tpu"), device)
    torch.manual_seed(0)
    expected = make(x, device)
    assert (got.device, got.dtype, got.shape, got.stride()) == (
        expected.device,
        expected.dtype,
        expected.shape,
        expected.stride(),
    )
    if device == "cpu" and name not in ("empty_like", "new_empty_strided"):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("op", ["add", "batch_norm_out"])
def test_an_out_tensor_on_the_cpu_is_refused_with_tpu_inputs(op):
    """torch's error, and the out tensor untouched, for ops with a lowering
    and for those that run on CPU (which accepted it: test_ops' test_out)."""
    x = torch.randn(5, 5, 5, device="tpu")
    stats = [torch.rand(5, device="tpu") + 0.5 for _ in range(4)]
    outs = [torch.zeros(5, 5, 5), torch.zeros(5), torch.zeros(5)]
    with pytest.raises(RuntimeError, match="Expected out tensor to be on tpu, but found it on cpu"):
        if op == "add":
            torch.add(x, 1, out=outs[0])
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # runs on CPU
                torch.ops.aten._native_batch_norm_legit.out(
                    x, *stats, True, 0.5, 0.6, out=outs[0], save_mean=outs[1], save_invstd=outs[2]
                )
    assert all(not o.any() for o in outs)
