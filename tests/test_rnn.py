"""nn.LSTM, nn.GRU, nn.RNN and their cells on tpu against CPU torch, forward and backward.

On tpu, ATen runs LSTM and GRU cells through ``_thnn_fused_lstm_cell`` and
``_thnn_fused_gru_cell`` (Note [Fused RNN cells] in lazytpu.lowering.rnn),
which CPU torch cannot run: every test also checks that nothing fell back.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_close, mode, no_fallback, to_cpu
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lazytpu.device.autocast import policy_of

aten = torch.ops.aten

SEQ, BATCH, FEATURES, HIDDEN = 4, 3, 3, 5

RNNS = {
    "lstm": lambda **kw: nn.LSTM(FEATURES, HIDDEN, **kw),
    "gru": lambda **kw: nn.GRU(FEATURES, HIDDEN, **kw),
    "rnn_tanh": lambda **kw: nn.RNN(FEATURES, HIDDEN, nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: nn.RNN(FEATURES, HIDDEN, nonlinearity="relu", **kw),
}
CELLS = {
    "lstm_cell": lambda **kw: nn.LSTMCell(FEATURES, HIDDEN, **kw),
    "gru_cell": lambda **kw: nn.GRUCell(FEATURES, HIDDEN, **kw),
    "rnn_tanh_cell": lambda **kw: nn.RNNCell(FEATURES, HIDDEN, nonlinearity="tanh", **kw),
    "rnn_relu_cell": lambda **kw: nn.RNNCell(FEATURES, HIDDEN, nonlinearity="relu", **kw),
}


def _flat(out) -> list:
    """The tensors of a (nested) module output, a PackedSequence as its data."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, nn.utils.rnn.PackedSequence):
        return [out.data]
    return [t for o in out for t in _flat(o)]


def _loss(out, weights):
    """A sum over every output with fixed weights, so that each output's gradient differs."""
    return sum((o * w.to(o.device)).sum() for o, w in zip(_flat(out), weights))


def _compare(module: nn.Module, run, inputs: list, eager_mode: str) -> None:
    """``run(module, *inputs)`` on CPU and on tpu: outputs, input and parameter gradients are CPU's."""
    dev = copy.deepcopy(module)  # before the CPU run's gradients exist
    cpu_inputs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    expected = run(module, *cpu_inputs)
    weights = [torch.randn(o.shape) for o in _flat(expected)]
    _loss(expected, weights).backward()
    with mode(eager_mode), no_fallback():
        dev = dev.to("tpu")
        tpu_inputs = [x.detach().to("tpu").requires_grad_(x.is_floating_point()) for x in inputs]
        actual = run(dev, *tpu_inputs)
        _loss(actual, weights).backward()
        assert_close(to_cpu(_flat(actual)), _flat(expected))
        for c, t in zip(cpu_inputs, tpu_inputs):
            if c.requires_grad:
                assert_close(t.grad.cpu(), c.grad)
        for (name, p), q in zip(module.named_parameters(), dev.parameters()):
            assert q.grad is not None, name
            assert_close(q.grad.cpu(), p.grad)


def _fresh(make, **kw) -> nn.Module:
    torch.manual_seed(0)
    return make(**kw)


# Strict mode runs the same rules one op at a time, and compiles each op of a bigger
# network separately (slow): it is checked on one layer; defer on both shapes.
@pytest.mark.parametrize("name", list(RNNS))
@pytest.mark.parametrize(
    "layers,bidirectional,batch_first,eager_mode",
    [(1, False, False, "defer"), (1, False, False, "strict"), (2, True, True, "defer")],
    ids=["1layer-defer", "1layer-strict", "2layers_bidir_bf-defer"],
)
def test_rnn_matches_cpu(name, layers, bidirectional, batch_first, eager_mode):
    module = _fresh(RNNS[name], num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    x = torch.randn((BATCH, SEQ, FEATURES) if batch_first else (SEQ, BATCH, FEATURES))
    _compare(module, lambda m, x: m(x), [x], eager_mode)


@pytest.mark.parametrize("name", list(RNNS))
def test_rnn_with_initial_state(name, eager_mode):
    """Given states get gradients too; two layers, bidirectional."""
    module = _fresh(RNNS[name], num_layers=2, bidirectional=True)
    x = torch.randn(SEQ, BATCH, FEATURES)
    h0 = torch.randn(4, BATCH, HIDDEN)
    if name == "lstm":
        c0 = torch.randn(4, BATCH, HIDDEN)
        _compare(module, lambda m, x, h, c: m(x, (h, c)), [x, h0, c0], eager_mode)
    else:
        _compare(module, lambda m, x, h: m(x, h), [x, h0], eager_mode)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_rnn_without_bias(name, eager_mode):
    """No bias: the fused cells get none and return no bias gradients."""
    module = _fresh(RNNS[name], bias=False, num_layers=2)
    _compare(module, lambda m, x: m(x), [torch.randn(SEQ, BATCH, FEATURES)], eager_mode)


def test_lstm_output_only_and_projections(eager_mode):
    """Only ``output`` used: the last cell's ``c`` gets no gradient (``grad_cy`` undefined); with
    ``proj_size`` the hidden state is projected after each cell."""
    x = torch.randn(SEQ, BATCH, FEATURES)
    _compare(_fresh(RNNS["lstm"]), lambda m, x: m(x)[0], [x], eager_mode)
    _compare(_fresh(RNNS["lstm"], proj_size=2, num_layers=2), lambda m, x: m(x), [x], eager_mode)


def test_unbatched_input(eager_mode):
    x = torch.randn(SEQ, FEATURES)
    _compare(_fresh(RNNS["lstm"]), lambda m, x: m(x), [x], eager_mode)
    _compare(_fresh(RNNS["gru"]), lambda m, x: m(x), [x], eager_mode)


@pytest.mark.parametrize("name", list(RNNS))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidir"])
@pytest.mark.parametrize("eager_mode", ["defer"])  # strict: test_rnn_matches_cpu
def test_packed_sequences(name, bidirectional, eager_mode):
    """Unequal lengths, not sorted: outputs padded back, final states, gradients."""
    module = _fresh(RNNS[name], num_layers=2, bidirectional=bidirectional, batch_first=True)
    lengths = torch.tensor([2, SEQ, 3])

    def run(m, x):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, state = m(packed)
        padded, out_lengths = pad_packed_sequence(out, batch_first=True)
        assert out_lengths.tolist() == lengths.tolist()
        return padded, state

    _compare(module, run, [torch.randn(BATCH, SEQ, FEATURES)], eager_mode)


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_cell_steps_match_cpu(name, bias, eager_mode):
    """A cell unrolled by hand over a few steps from a given state."""
    cell = _fresh(CELLS[name], bias=bias)
    xs = torch.randn(3, BATCH, FEATURES)
    h0 = torch.randn(BATCH, HIDDEN)
    if name == "lstm_cell":

        def run(m, xs, h, c):
            outs = []
            for x in xs:
                h, c = m(x, (h, c))
                outs.append(h)
            return torch.stack(outs), c

        _compare(cell, run, [xs, h0, torch.randn(BATCH, HIDDEN)], eager_mode)
    else:

        def run(m, xs, h):
            outs = []
            for x in xs:
                h = m(x, h)
                outs.append(h)
            return torch.stack(outs)

        _compare(cell, run, [xs, h0], eager_mode)


@pytest.mark.parametrize("name", list(CELLS))
def test_cell_unbatched_without_state(name):
    """A 1-D input and no state: the cell starts from zeros."""
    _compare(_fresh(CELLS[name]), lambda m, x: m(x), [torch.randn(FEATURES)], "defer")


@pytest.mark.parametrize("name", ["lstm_cell", "gru_cell"])
def test_cell_double_backward(name):
    """``create_graph=True``: autograd differentiates the cells' backward itself
    (``_thnn_differentiable_*_cell_backward``, decomposed by torch)."""

    def run(m, x):
        out = m(x)
        h = out[0] if isinstance(out, tuple) else out
        (grad,) = torch.autograd.grad(h.square().sum(), x, create_graph=True)
        return grad

    _compare(_fresh(CELLS[name]), run, [torch.randn(BATCH, FEATURES)], "defer")


def test_fused_cell_ops_match_their_formulas():
    """The fused ops called directly, outputs and workspaces, against the formulas of
    Note [Fused RNN cells] computed with CPU torch ops (CPU has no kernel for them)."""
    torch.manual_seed(0)
    n, h = 3, 4
    ig, hg, cx = torch.randn(n, 4 * h), torch.randn(n, 4 * h), torch.randn(n, h)
    bi, bh = torch.randn(4 * h), torch.randn(4 * h)
    with no_fallback():
        hy, cy, ws = (t.cpu() for t in aten._thnn_fused_lstm_cell(*(t.to("tpu") for t in (ig, hg, cx, bi, bh))))
    i, f, g, o = (ig + hg + bi + bh).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    assert_close([hy, cy, ws], [o * (f * cx + i * g).tanh(), f * cx + i * g, torch.cat([i, f, g, o], 1)])

    ig, hg, hx = torch.randn(n, 3 * h), torch.randn(n, 3 * h), torch.randn(n, h)
    with no_fallback():
        hy, ws = (t.cpu() for t in aten._thnn_fused_gru_cell(*(t.to("tpu") for t in (ig, hg, hx))))
    (xr, xz, xn), (hr, hz, hn) = ig.chunk(3, 1), hg.chunk(3, 1)
    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
    new = (xn + r * hn).tanh()
    assert_close([hy, ws], [new + z * (hx - new), torch.cat([r, z, new, hx, hn], 1)])
    with no_fallback():
        grads = aten._thnn_fused_gru_cell_backward(torch.ones(n, h).to("tpu"), ws.to("tpu"), False)
    assert [None if t is None else tuple(t.shape) for t in grads] == [(n, 3 * h), (n, 3 * h), (n, h), None, None]


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_autocast_float16(name):
    """torch's CUDA autocast policy (lazytpu.device.autocast) runs the fused cells in
    float16: the states come out in float16, gradients reach the float32
    parameters, and the numbers are close to CPU's float32 ones."""
    assert policy_of(aten._thnn_fused_lstm_cell.default) == policy_of(aten._thnn_fused_gru_cell.default) == "lower"
    module = _fresh(RNNS[name])
    x = torch.randn(SEQ, BATCH, FEATURES)
    expected, _ = module(x)
    with no_fallback():
        dev = copy.deepcopy(module).to("tpu")
        with torch.autocast("tpu", dtype=torch.float16):
            out, state = dev(x.to("tpu"))
        assert out.dtype == torch.float16
        assert all(s.dtype == torch.float16 for s in _flat(state))
        out.float().sum().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in dev.parameters())
        torch.testing.assert_close(out.float().cpu(), expected.detach(), rtol=0, atol=5e-3)


def test_lstm_backward_with_every_output_gradient_undefined():
    """gradcheck's undefined-gradient check: the fused cell's backward gets no
    gradients and returns none (an IndexError planning the call of no outputs)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4).double()
    x0 = torch.rand(1, 3, 4, dtype=torch.double)
    for device in ("cpu", "tpu"):
        x = x0.to(device).requires_grad_()
        out, (h, c) = lstm.to(device)(x)
        outs = [torch._C._functions.UndefinedGrad()(o) for o in (out, h, c)]
        grads = torch.autograd.grad(outs, x, [torch.ones_like(o) for o in outs], allow_unused=True)
        assert grads == (None,)
