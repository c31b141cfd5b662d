"""``_foreach_*`` ops on ``tpu`` (Note [Foreach nodes]): one recorded node
per foreach call, the numbers of CPU torch's per-element loop, torch's
errors, and the element-by-element path wherever order or casts matter."""

from __future__ import annotations

import pytest
import torch
from conftest import MODES, tolerance
from torch.optim.optimizer import _default_to_fused_or_foreach

import lazytpu

SHAPES = [(3, 4), (5,), (), (2, 0)]


def _lists(dtype=torch.float32, seed=0, positive=False):
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES]
    return [t.abs() + 0.5 for t in out] if positive else out


def _scalar_tensor():
    return torch.tensor(0.75)


# name -> fn(torch module-level foreach op on lists a, b, c) returning a list or None (in-place: a is the result)
CASES = {
    "add_list_alpha": lambda a, b, c: torch._foreach_add(a, b, alpha=0.5),
    "add_scalar": lambda a, b, c: torch._foreach_add(a, 1.5),
    "add_int": lambda a, b, c: torch._foreach_add(a, 2),
    "add__int": lambda a, b, c: torch._foreach_add_(a, 1),  # torch's optimizers count their steps so
    "pow_int": lambda a, b, c: torch._foreach_pow(c, 3),
    "mul_scalarlist": lambda a, b, c: torch._foreach_mul(a, [0.5, 2.0, -1.0, 3.0]),
    "div_list": lambda a, b, c: torch._foreach_div(a, c),
    "sqrt": lambda a, b, c: torch._foreach_sqrt(c),
    "exp": lambda a, b, c: torch._foreach_exp(a),
    "neg": lambda a, b, c: torch._foreach_neg(a),
    "maximum_list": lambda a, b, c: torch._foreach_maximum(a, b),
    "clamp_min_scalar": lambda a, b, c: torch._foreach_clamp_min(a, 0.1),
    "pow_scalar": lambda a, b, c: torch._foreach_pow(c, 2.5),
    "pow_scalar_and_tensor": lambda a, b, c: torch._foreach_pow(2.0, a),
    "lerp_scalar": lambda a, b, c: torch._foreach_lerp(a, b, 0.3),
    "addcmul_value": lambda a, b, c: torch._foreach_addcmul(a, b, c, value=-0.5),
    "addcdiv_scalars": lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, 0.2, 0.3, 0.4]),
    "norm": lambda a, b, c: torch._foreach_norm(a),
    "add__list": lambda a, b, c: torch._foreach_add_(a, b, alpha=2.0),
    "mul__tensor": lambda a, b, c: torch._foreach_mul_(a, _scalar_tensor().to(a[0].device)),
    "div__cpu_tensor": lambda a, b, c: torch._foreach_div_(a, _scalar_tensor()),  # torch.optim's tensor lr
    "mul_cpu_tensor": lambda a, b, c: torch._foreach_mul(a, _scalar_tensor()),
    "lerp__list": lambda a, b, c: torch._foreach_lerp_(a, b, c),
    "addcdiv__value": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, value=0.25),
    "sqrt_": lambda a, b, c: torch._foreach_sqrt_(c),
    "zero_": lambda a, b, c: torch._foreach_zero_(a),
    "copy_": lambda a, b, c: torch._foreach_copy_(a, b),
}


def _run(fn, device):
    a, b, c = _lists(seed=0), _lists(seed=1), _lists(seed=2, positive=True)
    a, b, c = ([t.to(device) for t in lst] for lst in (a, b, c))
    lazytpu.metrics.reset()
    out = fn(a, b, c)
    recorded = lazytpu.metrics.snapshot()["ops_recorded"]
    return [t.cpu() for t in [*(out or []), *a, *b, *c]], recorded  # results, and the lists in-place ops wrote


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_foreach_op_is_one_node_and_matches_cpu(name, mode):
    fn = CASES[name]
    expected, _ = _run(fn, "cpu")
    with torch.tpu.set_eager_mode(mode):
        got, recorded = _run(fn, "tpu")
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **tolerance(e.dtype))
    # one node; a Tensor scalar operand is one more (its upload), never one per element
    assert recorded <= 2, f"{name}: {recorded} nodes recorded for one foreach call"


def test_mixed_dtypes_in_one_list():
    lists = [[torch.randn(3), torch.randn(2, dtype=torch.float64)] for _ in range(2)]
    expected = torch._foreach_add(lists[0], lists[1], alpha=3.0)
    got = torch._foreach_add([t.to("tpu") for t in lists[0]], [t.to("tpu") for t in lists[1]], alpha=3.0)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g.cpu(), e)


@pytest.mark.parametrize("mode", MODES)
def test_writes_through_views_and_repeated_targets_keep_torchs_order(mode):
    """Targets that are views of one base, or one tensor twice: each element
    sees the writes of the elements before it, as in torch's loop."""

    def program(device):
        base = torch.arange(12.0).reshape(3, 4).to(device)
        rows = list(base.unbind(0))
        torch._foreach_add_(rows, [base[1], base[2], base[0]])  # row 2 adds the new row 0
        x = torch.ones(3).to(device)
        torch._foreach_mul_([x, x], 3.0)  # x *= 3 twice
        v = torch.zeros(2, 3).to(device)
        torch._foreach_add_([v[0], v[1]], [torch.ones(3).to(device), 2 * torch.ones(3).to(device)])
        return [base.cpu(), x.cpu(), v.cpu()]

    with torch.tpu.set_eager_mode(mode):
        got = program("tpu")
    for g, e in zip(got, program("cpu"), strict=True):
        torch.testing.assert_close(g, e)


def test_inplace_cast_errors_are_torchs():
    ints = [torch.arange(3), torch.arange(4)]
    with pytest.raises(RuntimeError) as cpu_err:
        torch._foreach_mul_(ints, 0.5)
    tpu_ints = [t.to("tpu") for t in ints]
    with pytest.raises(RuntimeError) as tpu_err:
        torch._foreach_mul_(tpu_ints, 0.5)
    assert str(tpu_err.value) == str(cpu_err.value)
    assert torch.equal(tpu_ints[0].cpu(), ints[0])  # nothing was written


def test_inplace_into_lower_precision_casts_like_torch():
    """A float16 target updated with float32 operands: the element path's cast."""
    a = [torch.randn(4, dtype=torch.float16), torch.randn(3, dtype=torch.float16)]
    b = [torch.randn(4), torch.randn(3)]
    ta, tb = [t.to("tpu") for t in a], [t.to("tpu") for t in b]
    torch._foreach_add_(a, b)
    torch._foreach_add_(ta, tb)
    for g, e in zip(ta, a, strict=True):
        assert g.dtype == torch.float16
        torch.testing.assert_close(g.cpu(), e, **tolerance(torch.float16))


def test_optimizers_default_to_foreach_on_tpu():
    params = list(torch.nn.Linear(3, 2).to("tpu").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (False, True)


def test_adamw_step_is_a_few_nodes_and_changing_lr_compiles_nothing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)]).to("tpu")  # 12 parameters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    x = torch.randn(4, 8).to("tpu")
    for step in range(6):
        opt.zero_grad()
        model(x).square().mean().backward()
        lazytpu.sync()
        opt.param_groups[0]["lr"] = 1e-3 * (step + 1)  # a warm-up: a new float each step
        before = lazytpu.metrics.snapshot()
        opt.step()
        after = lazytpu.metrics.snapshot()
        if step >= 2:
            assert after["programs_compiled"] == before["programs_compiled"]
    # torch's foreach AdamW: about a dozen foreach calls, whatever the number of parameters
    assert after["ops_recorded"] - before["ops_recorded"] <= 16


OUT_CASES = {
    "add.List_out": lambda a, b, out: torch.ops.aten._foreach_add.List_out(a, b, alpha=2.0, out=out),
    "mul.Scalar_out": lambda a, b, out: torch.ops.aten._foreach_mul.Scalar_out(a, 0.5, out=out),
    "pow.Scalar_out": lambda a, b, out: torch.ops.aten._foreach_pow.Scalar_out(b, 2.5, out=out),
    "pow.List_out": lambda a, b, out: torch.ops.aten._foreach_pow.List_out(b, a, out=out),
    "exp.out": lambda a, b, out: torch.ops.aten._foreach_exp.out(a, out=out),
}


@pytest.mark.parametrize("name", sorted(OUT_CASES))
def test_out_variants_write_their_out_lists(name):
    def run(device):
        gen = torch.Generator().manual_seed(3)
        a = [torch.randn(3, generator=gen).to(device), torch.randn(2, 2, generator=gen).to(device)]
        b = [t.abs() + 0.5 for t in a]
        out = [torch.empty_like(t) for t in a]
        assert OUT_CASES[name](a, b, out) is None
        return [t.cpu() for t in out]

    for g, e in zip(run("tpu"), run("cpu"), strict=True):
        torch.testing.assert_close(g, e)


def test_norm_out_variant():
    a = [torch.randn(3), torch.randn(2, 2)]
    out, tpu_out = [torch.empty(()), torch.empty(())], [torch.empty(()).to("tpu") for _ in range(2)]
    torch.ops.aten._foreach_norm.Scalar_out(a, 2, out=out)
    torch.ops.aten._foreach_norm.Scalar_out([t.to("tpu") for t in a], 2, out=tpu_out)
    for g, e in zip(tpu_out, out, strict=True):
        torch.testing.assert_close(g.cpu(), e)


_INF = float("inf")
_ELEMENT_WISE = {
    "maximum_list_": lambda a, b: torch._foreach_maximum_(a, b),
    "minimum_list_": lambda a, b: torch._foreach_minimum_(a, b),
    "maximum_scalar": lambda a, b: torch._foreach_maximum(a, 1),
    "minimum_scalars_": lambda a, b: torch._foreach_minimum_(a, [1.0, 2, 0, -1]),
    "addcmul_tensor_scalars": lambda a, b: torch._foreach_addcmul(a[2:], b[2:], b[2:], torch.tensor([0.5, 2])),
    "norm_dtype": lambda a, b: torch._foreach_norm(a[:3], 2, dtype=torch.float64),
}


@pytest.mark.parametrize("name", sorted(_ELEMENT_WISE))
def test_foreach_forms_torch_loops_over_match_cpu(name):
    """Forms with no batched rule match CPU (PyTorch's test_foreach): in-place
    maximum/minimum left their targets unchanged (a CPU fallback that wrote
    nothing back; Adam(amsgrad=True) takes them), their scalar forms raised,
    a CPU tensor of scalars raised a device mix, norm's dtype went into dim."""

    def run(d):
        a = [
            torch.tensor([_INF, 1.0, -2.0]),
            torch.tensor([-_INF, 5.0]),
            torch.tensor([0.5, -7.0]),
            torch.tensor([3.0]),
        ]
        b = [torch.tensor([-_INF, 4.0, -1.0]), torch.tensor([_INF, 9.0]), torch.tensor([0.0, 9.0]), torch.tensor([2.0])]
        a, b = [t.to(d) for t in a], [t.to(d) for t in b]
        result = _ELEMENT_WISE[name](a, b)
        return [t.cpu() for t in (result if result is not None else a)]

    for got, expected in zip(run("tpu"), run("cpu"), strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("scalars", [[], [1.0], [1.0, 2.0, 3.0]])
def test_foreach_scalar_list_of_another_length_raises_as_on_cpu(scalars):
    tensors = [torch.ones(2, device="tpu"), torch.ones(3, device="tpu")]
    for op in (
        torch._foreach_add,
        torch._foreach_mul_,
        torch._foreach_maximum,
        torch._foreach_pow,
        torch._foreach_pow_,
    ):
        with pytest.raises(RuntimeError, match="Tensor list must have same number of elements as scalar list"):
            op(tensors, scalars)


@pytest.mark.parametrize("scalars", [torch.tensor(10.0), torch.tensor([1.0, 2.0, 3.0]), torch.ones(1, 2)], ids=str)
def test_foreach_packed_scalars_of_another_shape_raise_as_on_cpu(scalars):
    """addcmul/addcdiv's ``scalars`` tensor: one dimension, one scalar per element (tpu broadcast a 0-d one)."""
    for op in (torch._foreach_addcmul, torch._foreach_addcdiv, torch._foreach_addcmul_, torch._foreach_addcdiv_):
        errors = []
        for device in ("cpu", "tpu"):
            tensors = [torch.ones(2, device=device), torch.ones(1, device=device)]
            with pytest.raises(RuntimeError) as error:
                op(tensors, tensors, tensors, scalars)
            errors.append(str(error.value))
            assert torch.equal(tensors[0].cpu(), torch.ones(2))
        assert errors[0] == errors[1]


def test_adam_amsgrad_foreach_matches_cpu():
    def run(d):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).to(d)
        opt = torch.optim.Adam(model.parameters(), lr=0.1, amsgrad=True, foreach=True)
        for step in range(4):
            opt.zero_grad()
            model(torch.full((2, 4), 1.0 - step, device=d)).pow(2).sum().backward()
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    for got, expected in zip(run("tpu"), run("cpu"), strict=True):
        torch.testing.assert_close(got, expected)


def test_cpu_fallback_writes_back_mutated_tensor_lists():
    """A foreach op run on CPU writes its ``Tensor(a!)[]`` targets back to tpu
    (only single tensors were written back: the targets kept their values)."""
    from lazytpu.frontend.routes.fallback import cpu_fallback

    a = [torch.tensor([1.0, 5.0], device="tpu"), torch.tensor([3.0], device="tpu")]
    b = [torch.tensor([2.0, 2.0], device="tpu"), torch.tensor([4.0], device="tpu")]
    cpu_fallback(torch.ops.aten._foreach_maximum_.List, (a, b), {})
    assert [t.cpu().tolist() for t in a] == [[2.0, 5.0], [4.0]]
