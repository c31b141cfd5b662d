"""Tensor factories inside ``torch.compile(..., backend="tpu")``: a
``torch.tensor(data, device=x.device)`` in the compiled code is a constant of
the graph, as on CPU (Note [Lifting tpu constants] in lazytpu/compile/constants.py),
and transformers' default ``DynamicCache``, which makes one, compiles."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from conftest import assert_close, programs_compiled
from test_models_hf import VOCAB, llama
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from transformers.cache_utils import DynamicCache
from transformers.utils import logging as hf_logging

import lazytpu

hf_logging.set_verbosity_error()


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


FACTORIES = {
    "add_constant": lambda x: x + torch.tensor([1.0, 2.0], device=x.device),
    "cat_empty": lambda x: torch.cat([torch.tensor([], device=x.device), x]),
    "int_constant": lambda x: x * torch.tensor([3, -1], device=x.device),
    "scalar_constant": lambda x: x - torch.tensor(0.5, device=x.device, dtype=torch.float64),
    "bf16_constant": lambda x: x.bfloat16() * torch.tensor([1.5, 0.25], device=x.device, dtype=torch.bfloat16),
    # a CPU constant moved, then computed with (Note [No tpu constants in fake mode]): Mamba's cache, DETR's loss
    "moved_constant_add_": lambda x: x + torch.tensor(0, dtype=torch.int64).to(x.device).add_(x.shape[-1]),
    "moved_constant_div": lambda x: x * torch.clamp(torch.as_tensor([3.0], device=x.device) / 2, min=1),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_tensor_factory_in_a_compiled_function_matches_cpu(name):
    fn = FACTORIES[name]
    x = torch.tensor([0.25, -2.0])
    expected = fn(x)
    compiled = torch.compile(fn, backend="tpu", fullgraph=True)  # the constant is in the graph: no break
    xt, yt = x.to("tpu"), (x + 1).to("tpu")
    _, first = programs_compiled(lambda a: compiled(a).cpu(), xt)
    assert_close(first, expected)
    again, second = programs_compiled(lambda a: compiled(a).cpu(), yt)
    assert_close(second, fn(x + 1))
    assert again == 0, "a second call of the same signature compiled a program"


def test_tensor_factory_under_fake_mode_is_a_fake_tpu_tensor():
    # torch's contract without a device (Note [Lifting tpu constants]): a fake
    # tensor on the requested device, holding no real tpu tensor.
    with FakeTensorMode():
        t = torch.tensor([1.0, 2.0], device="tpu")
        out = t * 2
    assert type(t) is FakeTensor and type(out) is FakeTensor
    assert t.device == torch.device("tpu", 0) and out.shape == (2,)


def test_real_tpu_tensor_meeting_a_fake_one_says_so():
    real = torch.ones(2, device="tpu")
    with FakeTensorMode():
        fake = torch.empty(2, device="tpu")
        for mixed in (lambda: real + fake, lambda: fake + real, lambda: torch.cat([real, fake])):
            with pytest.raises(RuntimeError, match="a real tpu tensor met a FakeTensor on tpu:0") as info:
                mixed()
            assert "tpu:0 and tpu:0" not in str(info.value)
    with pytest.raises(RuntimeError, match="found at least two devices, tpu:0 and cpu!"):
        real + torch.ones(2)


# -- transformers' default cache -------------------------------------------------


def _prompt(length: int = 8) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))


def test_compiled_llama_forward_with_its_dynamic_cache_matches_cpu():
    model = llama().eval()
    ids = _prompt()
    with torch.no_grad():
        expected = model(ids, use_cache=True)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    with torch.no_grad():
        out = compiled(ids.to("tpu"), use_cache=True)
    assert isinstance(out.past_key_values, DynamicCache)
    assert_close(out.logits.cpu(), expected.logits)
    for layer, ref in zip(out.past_key_values.layers, expected.past_key_values.layers):
        assert_close(layer.keys.cpu(), ref.keys)
        assert_close(layer.values.cpu(), ref.values)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_compiled_llama_greedy_generation_matches_cpu():
    model = llama().eval()
    ids = _prompt()
    options = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=1)
    expected = model.generate(ids, **options)
    dev = copy.deepcopy(model).to("tpu")
    dev.compile(backend="tpu")  # generate() calls the module: its calls run compiled
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tokens = dev.generate(ids.to("tpu"), **options).cpu()
    assert torch.equal(tokens, expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs >= 2  # the prefill and a decode step
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
