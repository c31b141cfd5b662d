"""Random aliasing programs for differential fuzzing (CPU torch vs ``tpu``).

A program is a list of integer tuples; ``run_program`` interprets it on one
device, so the same program replays identically on CPU and on ``tpu`` (shapes
and aliasing follow torch's semantics on both). The interpreter keeps a pool
of tensors: views of each other, results of ops; every step reads and writes
members of the pool. It returns everything observable: the tensors held at the
end, values printed (synced) along the way, and the types of errors raised.
Given bad calls (tests/fuzzbad.py), a program also makes calls that CPU
torch refuses and goes on after each (tests/test_fuzz_errors.py).
"""

from __future__ import annotations

import os

import fuzzbad
import hypothesis
import torch

# -- view steps: take a view of a pool tensor ---------------------------------


def _v_transpose(t, a):
    return t.transpose(a % t.dim(), (a // 7) % t.dim()) if t.dim() >= 2 else None


def _v_slice(t, a):
    if t.dim() == 0 or t.shape[0] == 0:
        return None
    n = t.shape[0]
    start, step = a % n, 1 + (a // 5) % 2
    return t[start::step]


def _v_select(t, a):
    if t.dim() == 0 or t.shape[a % t.dim()] == 0:
        return None
    d = a % t.dim()
    return t.select(d, (a // 3) % t.shape[d])


def _v_flat(t, a):
    return t.view(-1) if t.is_contiguous() else None


def _v_diag(t, a):
    return t.diagonal() if t.dim() == 2 else None


def _v_unsqueeze(t, a):
    return t.unsqueeze(a % (t.dim() + 1)) if t.dim() < 4 else None


def _v_narrow(t, a):
    if t.dim() == 0 or t.shape[-1] < 2:
        return None
    return t.narrow(-1, a % (t.shape[-1] - 1), 1 + (a // 3) % 2 if t.shape[-1] > 2 else 1)


def _v_detach(t, a):
    return t.detach()


def _v_chunk(t, a):
    return t.chunk(2, dim=-1)[a % 2] if t.dim() >= 1 and t.shape[-1] >= 2 else None


def _v_permute(t, a):
    return t.permute(*reversed(range(t.dim()))) if t.dim() >= 2 else None


VIEWS = [_v_transpose, _v_slice, _v_select, _v_flat, _v_diag, _v_unsqueeze, _v_narrow, _v_detach, _v_chunk, _v_permute]

# -- in-place writes ------------------------------------------------------------


def _w_add(t, o, a):
    t.add_(float(a % 5) - 2.0)


def _w_mul(t, o, a):
    t.mul_(0.5 + (a % 3))


def _w_zero(t, o, a):
    t.zero_()


def _w_fill(t, o, a):
    t.fill_(float(a % 9))


def _w_clamp(t, o, a):
    t.clamp_(min=float(a % 7) - 3.0)


def _w_copy(t, o, a):
    t.copy_(o)  # broadcast o into t (errors when not broadcastable, as on CPU)


def _w_setitem_int(t, o, a):
    if t.dim() and t.shape[0]:
        t[a % t.shape[0]] = float(a % 11)


def _w_setitem_slice(t, o, a):
    if t.dim():
        t[..., ::2] = -float(a % 4)


def _w_setitem_mask(t, o, a):
    t[t > float(a % 6)] = 100.0


def _w_setitem_index(t, o, a):
    if t.dim() and t.shape[0]:
        idx = torch.tensor([a % t.shape[0], 0], device=t.device)
        t[idx] = 1.5


def _w_add_tensor(t, o, a):
    t.add_(o, alpha=2)


def _w_index_add(t, o, a):
    if t.dim() and t.shape[0]:
        idx = torch.tensor([a % t.shape[0]], device=t.device)
        t.index_add_(0, idx, torch.ones((1,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device))


def _w_t_(t, o, a):
    if t.dim() == 2:
        t.t_()


WRITES = [
    _w_add,
    _w_mul,
    _w_zero,
    _w_fill,
    _w_clamp,
    _w_copy,
    _w_setitem_int,
    _w_setitem_slice,
    _w_setitem_mask,
    _w_setitem_index,
    _w_add_tensor,
    _w_index_add,
    _w_t_,
]

# Writes whose operand o may alias t in another layout: CPU torch reads o while
# it writes t (elements already written are read again: p.add_(base.diagonal())
# with p = base.t() gives an order-dependent result), tpu reads o before. Not
# drawn where o and t share a storage and are not the same tensor.
READS_OTHER = {_w_copy: "copy_ from an overlapping view", _w_add_tensor: "add_ of an overlapping view"}

# -- new tensors ----------------------------------------------------------------


def _n_binary(t, o, a):
    return t + o * 0.5 if a % 2 else t * o


def _n_unary(t, o, a):
    return [torch.tanh, torch.sin, torch.abs, torch.neg][a % 4](t)


def _n_reduce(t, o, a):
    if t.dim() == 0:
        return t.sum()
    return [lambda x: x.sum(-1), lambda x: x.mean(0), lambda x: x.amax(-1), lambda x: x.sum()][a % 4](t)


def _n_clone(t, o, a):
    return t.clone() if a % 2 else t.contiguous()


NEWS = [_n_binary, _n_unary, _n_reduce, _n_clone]


def run_program(program, device: str, bad_calls=()):
    """Interpret ``program`` on ``device``; return what it observed.

    With ``bad_calls`` (names in fuzzbad.BAD_CALLS) the pool also holds an
    int64 tensor, a step of kind 4 makes one of those calls, recording
    ``("bad", name, error type or None)``, and at the end every pool tensor
    is written through once more and read again (Note [Alias probe])."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6).to(device) - 8
    pool = [base]
    if bad_calls:
        pool.append(torch.arange(12).reshape(3, 4).to(device) - 5)
    storages = [object() for _ in pool]  # which storage each pool tensor is a view of (by identity)
    observed = []
    for kind, i, j, a in program:
        t, o = pool[i % len(pool)], pool[j % len(pool)]
        same_storage = storages[i % len(pool)] is storages[j % len(pool)] and o is not t
        if bad_calls and kind % 5 == 4:
            name = bad_calls[a % len(bad_calls)]
            call = fuzzbad.BAD_CALLS[name](t, o, a // len(bad_calls))
            if call is not None:
                observed.append(("bad", name, _raised(call, read=name.startswith("data:"))))
            continue
        try:
            if kind % 4 == 0:
                out = VIEWS[a % len(VIEWS)](t, a // len(VIEWS))
                if out is not None:
                    pool.append(out)
                    storages.append(storages[i % len(storages)])
            elif kind % 4 == 1:
                write = WRITES[a % len(WRITES)]
                if not (same_storage and write in READS_OTHER):
                    write(t, o, a // len(WRITES))
            elif kind % 4 == 2:
                out = NEWS[a % len(NEWS)](t, o, a // len(NEWS))
                pool.append(out)
                storages.append(storages[i % len(storages)] if out is t else object())
            else:
                observed.append(("sync", t.cpu().clone()))
        except Exception as exc:  # noqa: BLE001 - compared with CPU's, whatever it is
            observed.append(("error", type(exc).__name__))
        if len(pool) > 12:
            pool.pop(1 + bool(bad_calls))
            storages.pop(1 + bool(bad_calls))
    observed += [("final", t.cpu().clone()) for t in pool]
    if bad_calls:
        observed += _probe(pool)
    return observed


# Note [Alias probe]: values alone do not show that views still alias after
# the errors (a view that lost its base reads the same until written). Each
# pool tensor k is incremented by 2**k in place, then all are read: an element
# holds the sum over the tensors that alias it, which names that set.
def _probe(pool):
    observed = []
    for k, t in enumerate(pool):
        try:
            t.add_(2**k)
        except Exception as exc:  # noqa: BLE001 - compared with CPU's
            observed.append(("error", type(exc).__name__))
    return observed + [("probe", t.cpu().clone()) for t in pool]


def _raised(call, read: bool):
    """The name of the exception type ``call()`` raises, else None; with
    ``read`` an error may come at the host read of its result made at once."""
    try:
        out = call()
        if read:
            (out[0] if isinstance(out, tuple) else out).cpu()
    except Exception as exc:  # noqa: BLE001 - compared with CPU's, whatever it is
        return type(exc).__name__
    return None


def _scale(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)] if t.is_floating_point() else t
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def assert_same(actual, expected) -> None:
    """The observations of ``run_program`` on tpu and CPU agree, up to the first difference.

    The programs test aliasing, not numerics: an alias lost or gained changes values by at least
    0.5 (a write adds or multiplies by such numbers), where XLA's ``tanh`` and ``sin``, a few ulps
    off CPU's, can cancel in a later difference to an error of an ulp of the tensor's largest value
    (``64 * tanh(-8) + 64``). The absolute tolerance scales with that value."""
    for n, (got, want) in enumerate(zip(actual, expected)):
        assert got[0] == want[0], (n, got, want)
        if isinstance(want[-1], torch.Tensor):
            va, ve = got[-1], want[-1]
            assert va.shape == ve.shape and va.dtype == ve.dtype, (n, want[0], va.shape, ve.shape, va.dtype, ve.dtype)
            torch.testing.assert_close(
                va,
                ve,
                rtol=1.3e-6,
                atol=1e-5 * _scale(ve),
                equal_nan=True,
                msg=lambda m, n=n, k=want[0]: f"observation {n} ({k}): {m}",
            )
        else:
            assert got == want, (n, got, want)
    assert len(actual) == len(expected), (actual[len(expected) :], expected[len(actual) :])


def fuzz_settings(examples: int) -> hypothesis.settings:
    """The fuzzers' settings: ``examples`` programs, derandomized unless FUZZ_RANDOM is set (``make fuzz``)."""
    return hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=not os.environ.get("FUZZ_RANDOM"),
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
