"""``torch.compile(model, backend="tpu")``: whole FX graphs as single programs.

    import torch, lazytpu
    model = Model().to("tpu")
    step = torch.compile(model, backend="tpu")   # or backend="lazytpu"

Dynamo captures the graph, AOTAutograd splits it into forward and backward
graphs of core ATen ops, and each graph is lowered through lazytpu's
lowering rules into one JAX program, compiled once per input signature and
run on the inputs' device buffers. Graph breaks run in lazytpu's current
eager mode. ``explain()`` says why a compiled graph compiled again.

Importing this package is cheap: the backends are registered when
``torch._dynamo`` loads (Note [Lazy dynamo install]).
"""

from __future__ import annotations

from lazytpu.compile._dynamo_hooks import install_when_dynamo_loads
from lazytpu.compile.explain import clear, explain

__all__ = ["clear", "explain"]

install_when_dynamo_loads()
