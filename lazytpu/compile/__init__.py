"""``torch.compile(model, backend="tpu")``: whole FX graphs as single programs.

    import torch, lazytpu
    model = Model().to("tpu")
    step = torch.compile(model, backend="tpu")   # or backend="lazytpu"

Dynamo captures the graph, AOTAutograd splits it into forward and backward
graphs of core ATen ops, and each graph is lowered through lazytpu's
lowering rules into one JAX function. A call of a compiled graph is recorded
as one node of the pending graph, so a training step (compiled forward, its
backward, the optimizer update, compiled or eager) runs as one program at
the optimizer's sync, compiled once per input signature; strict mode runs
each graph at its call. Graph breaks run in lazytpu's current eager mode.
``explain()`` says why a compiled graph compiled again.

Importing this package is cheap: the backends are registered when
``torch._dynamo`` loads (Note [Lazy dynamo install]).
"""

from __future__ import annotations

from lazytpu.compile import constants  # noqa: F401  (registers lift_fresh's handler: Note [Lifting tpu constants])
from lazytpu.compile._dynamo_hooks import install_when_dynamo_loads
from lazytpu.compile.explain import clear, explain

__all__ = ["clear", "explain"]

install_when_dynamo_loads()
