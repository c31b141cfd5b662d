"""Python errors inside autograd's engine on ``tpu``: raised by ``backward()``, never an abort.

Note [Errors in backward]: torch's device guard for a Python backend
(``torch._C._acc.DeviceGuard``) calls its Python ``type_`` from C++, also
from the destructor of the stream guard that autograd's engine holds around
each backward node, where nothing may throw. A Python error raised inside
the engine by a tpu op (leaving ``__torch_dispatch__``) or by a tensor or
module hook (a failed check, a ``KeyboardInterrupt``) is left set in the
interpreter while the engine unwinds (torch fetches the errors of its custom
Functions, not those): the call of ``type_`` then failed, and the process
aborted ("terminate called without an active exception"). On CPU,
``backward()`` raises the error, and the pass stops there. So on ``tpu``,
``type_`` first makes a call that CPython checks for an error left set (a
builtin of no arguments, a call the interpreter never specializes): such an
error is raised there and taken (``rescue``), and the engine unwinds without
it, then fails with a SystemError ("returned NULL without setting an
exception"); ``backward()`` and ``torch.autograd.grad`` (both call
``torch.autograd.graph._engine_run_backward``, which ``install`` wraps, as
``torch.compiler`` does for tracing) raise the taken error instead, with its
traceback, as CPU raises it: ``optimizer.step()`` after a failed backward
does not run.
"""

from __future__ import annotations

import functools
import gc

import torch
import torch.autograd
import torch.autograd.function
import torch.autograd.graph

# the error a backward pass left set, taken by the device guard: one slot for the
# process (autograd may run tpu backward ops on a thread of its own)
_TAKEN: list[BaseException] = []

# a builtin of no arguments: CPython checks each call of it for an error left set
probe = gc.isenabled


def rescue(exc: BaseException) -> None:
    """Keep the error that ``probe`` raised for the ``backward()`` that fails next."""
    if isinstance(exc, SystemError) and exc.__cause__ is not None:  # "returned a result with an exception set"
        exc = exc.__cause__
    _TAKEN[:] = [exc]


def _raising_taken(run):
    @functools.wraps(run)
    def engine_run_backward(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except SystemError:
            if not _TAKEN:
                raise
            error = _TAKEN.pop()
            raise error.with_traceback(error.__traceback__) from None
        finally:
            _TAKEN.clear()

    engine_run_backward.lazytpu_wrapped = True
    return engine_run_backward


# Note [Gradients of custom Functions]: autograd's engine checks that each
# gradient a node returns is on its input's device ("Function XBackward
# returned an invalid gradient at index 0 - expected device ..."), moving a
# 0-d one there, except where either side is a Python tensor subclass, as a
# tpu tensor is. A custom ``autograd.Function`` whose backward returned a CPU
# gradient for a tpu input then made a CPU ``.grad`` (``optimizer.step()``
# failed later, on another line). Its backward's results are checked here as
# the engine checks those of other devices.
def _checked_gradients(apply):
    @functools.wraps(apply)
    def checked(ctx, *args):
        grads = apply(ctx, *args)
        single = not isinstance(grads, tuple)
        out = [grads] if single else list(grads)
        for i, (grad, edge) in enumerate(zip(out, ctx.next_functions)):
            if not isinstance(grad, torch.Tensor) or edge[0] is None:
                continue
            want = edge[0]._input_metadata[edge[1]].device
            if grad.device != want and "tpu" in (grad.device.type, want.type):
                if grad.dim():
                    raise RuntimeError(
                        f"Function {type(ctx).__name__} returned an invalid gradient at index {i} - expected device "
                        f"{want} but got {grad.device}"
                    )
                out[i] = grad.to(want)
        return out[0] if single else tuple(out)

    checked.lazytpu_wrapped = True
    return checked


def install() -> None:
    """Wrap ``_engine_run_backward`` where ``torch.autograd`` reads it, and
    custom Functions' backward (idempotent)."""
    run = torch.autograd.graph._engine_run_backward
    if not getattr(run, "lazytpu_wrapped", False):
        wrapped = _raising_taken(run)
        torch.autograd.graph._engine_run_backward = wrapped
        torch.autograd._engine_run_backward = wrapped
    node = torch.autograd.function.BackwardCFunction
    for name in ("apply", "apply_boxed"):
        if not getattr(getattr(node, name), "lazytpu_wrapped", False):
            setattr(node, name, _checked_gradients(getattr(node, name)))
