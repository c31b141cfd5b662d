"""lazytpu._registry.Registry: the one decorator registry (lowerings, handlers, ...)."""

from __future__ import annotations

import pytest
import torch

from lazytpu._registry import Registry
from lazytpu.lowering import registry as lowering_registry

aten = torch.ops.aten


def test_register_fills_the_dict_and_returns_the_function():
    reg = Registry("thing")

    def fn():
        pass

    assert reg.register("a", "b")(fn) is fn
    assert reg.get("a") is fn and reg["b"] is fn and "a" in reg and "c" not in reg
    assert reg.get("c") is None and list(reg) == ["a", "b"] and list(reg.keys()) == ["a", "b"] and len(reg) == 2
    assert reg.get == reg.entries.get  # the plain dict's own lookup


def test_a_duplicate_raises_naming_the_registry_the_key_and_the_owner():
    reg = Registry("collective rule")

    @reg.register("sum")
    def first():
        pass

    with pytest.raises(ValueError, match=r"duplicate collective rule for 'sum': .*first has it"):
        reg.register("sum")(lambda: None)
    assert reg["sum"] is first


def test_wrap_and_expand():
    reg = Registry("lowering", expand=lowering_registry.expand)
    reg.register(aten.add, wrap=lowering_registry.Rule)(max)
    assert aten.add.Tensor in reg and aten.add.Scalar in reg
    assert aten.add.out not in reg and aten.add_.Tensor not in reg  # a packet gives its functional overloads
    assert reg[aten.add.Tensor] == lowering_registry.Rule(max)
    with pytest.raises(ValueError, match=r"duplicate lowering for aten\.add\.Tensor: max has it"):
        reg.register(aten.add.Tensor)(min)
    with pytest.raises(TypeError, match="not an aten op"):
        reg.register(3)(min)


def test_the_lowering_registry_rejects_a_second_rule():
    with pytest.raises(ValueError, match=r"duplicate lowering for aten\.exp\.default"):
        lowering_registry.lowering(aten.exp.default)(lambda x: x)
    assert lowering_registry.get_rule(aten.exp.default).fn.__name__ != "<lambda>"
