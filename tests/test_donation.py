"""Buffer donation: a buffer nothing needs after a program is reused by it
(Note [Donation]); a buffer another tensor still reads is never donated."""

from __future__ import annotations

import gc

import jax
import torch

import lazytpu


def _buffer(t):
    lazytpu.sync()
    return t._lt_storage.value.buffer


def _train(steps: int, model, opt, x):
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    lazytpu.sync()


def test_updated_parameter_buffer_is_donated():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 64).to("tpu")
    _train(2, model, opt, x)
    old = _buffer(model.weight)
    _train(1, model, opt, x)
    assert old.is_deleted()  # its memory went to the new weight


def test_live_buffers_stay_flat_across_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("tpu")
    _train(3, model, opt, x)
    counts = []
    for _ in range(5):
        _train(1, model, opt, x)
        torch.tpu.synchronize()
        gc.collect()
        counts.append((len(jax.live_arrays()), sum(a.nbytes for a in jax.live_arrays())))
    assert len(set(counts)) == 1, counts


def test_buffer_still_read_elsewhere_is_not_donated():
    a = torch.arange(4.0).to("tpu")
    b = torch.zeros(4).to("tpu")
    lazytpu.sync()
    b.copy_(a)  # b now holds a's buffer
    lazytpu.sync()
    shared = a._lt_storage.value.buffer
    a.add_(1)
    lazytpu.sync()
    assert not shared.is_deleted()
    assert b.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert a.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_alias_of_updated_tensor_sees_new_value():
    p = torch.ones(3).to("tpu")
    alias = p.detach()
    lazytpu.sync()
    p.mul_(3)
    lazytpu.sync()
    assert alias.cpu().tolist() == [3.0, 3.0, 3.0]
