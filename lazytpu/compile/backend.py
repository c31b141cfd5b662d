"""The ``torch.compile`` backend: dynamo graph -> AOTAutograd -> one JAX
program per FX graph.

AOTAutograd traces the dynamo graph to ATen with the decomposition table of
``decompositions()``, functionalizes it (mutated inputs come back as extra
outputs and its runtime copies them into the ``tpu`` tensors, through
lazytpu's ``copy_``, as eager would write them) and partitions the joint
graph into a forward and a backward graph. Each FX graph becomes a
``GraphProgram``.

Note [Graphs that cannot lower]: an FX node with no lowering (Note [FX node
resolution]) fails at compile time, naming the op and the node; with
``LAZYTPU_CPU_FALLBACK`` on (the default) the graph instead runs as eager
does: op by op through lazytpu's dispatcher in the current mode, which
decomposes the op or runs it on CPU.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch._decomp import core_aten_decompositions, decomposition_table
from torch._functorch.aot_autograd import aot_module_simplified
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from lazytpu import _caches, _config
from lazytpu.compile.fx_lowering import GraphProgram
from lazytpu.compile.graph_rules import lowerable, missing_ops
from lazytpu.frontend.dispatch import run_foreach

__all__ = ["backend", "decompositions"]

_TABLE: dict = _caches.table("compile_decompositions")


def _foreach_decomposition(op):
    """``_foreach_op`` as one element op per list entry (as eager runs it)."""

    def decompose(*args, **kwargs):
        out = run_foreach(op, args, kwargs)
        return NotImplemented if out is None else out

    return decompose


def decompositions() -> dict:
    """The decomposition table AOTAutograd traces with.

    torch's core-ATen table, plus torch's ATen-level decompositions and the
    per-element form of ``_foreach_*`` ops, for every op that has no lowering
    rule; an op with a rule is never decomposed (its rule is the better
    program).
    """
    if not _TABLE:
        table = dict(core_aten_decompositions())
        for op, fn in decomposition_table.items():
            if op not in table and not fn.__module__.startswith("torch._refs"):
                table[op] = fn
        for name in dir(torch.ops.aten):
            if name.startswith("_foreach_") and not name.endswith("_"):
                packet = getattr(torch.ops.aten, name)
                for overload in packet.overloads():
                    op = getattr(packet, overload)
                    if "out" not in overload:
                        table.setdefault(op, _foreach_decomposition(op))
        _TABLE.update({op: fn for op, fn in table.items() if lowerable(op) is None})
    return _TABLE


def _frame_id():
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else compile_id.frame_id


def _alias_checker() -> type:
    # imported when used: before torch._dynamo has loaded, this module is in an import cycle of torch's
    from torch._functorch._aot_autograd.runtime_wrappers import _AnalyzeCustomOpInputOutputMode

    return _AnalyzeCustomOpInputOutputMode


class _Eager:
    """An FX graph run op by op through lazytpu's dispatcher (Note [Graphs
    that cannot lower])."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    @torch.compiler.disable  # Note [Dynamo hooks], 3: runs eagerly, nothing here to capture
    def __call__(self, args: list):
        values = list(args)
        args.clear()
        mode = _get_current_dispatch_mode()
        if mode is None or not isinstance(mode, _alias_checker()):
            return self.gm(*values)
        # AOTAutograd's first run of a graph checks custom ops' aliasing under a
        # mode that declines every tpu tensor, and a higher-order op (a
        # ``torch.cond`` left in the graph) returns its ``NotImplemented`` as the
        # op's result (torch's HOP dispatch); it checks nothing here, so it is off
        with _disable_current_modes():
            return self.gm(*values)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, *, name: str, frame):
    missing = missing_ops(gm)
    if missing:
        listed = ", ".join(f"{op} (FX node {node!r})" for op, node in missing)
        if not _config.CPU_FALLBACK.get():
            raise NotImplementedError(
                f"lazytpu.compile: the {name} graph has no lowering for {listed}; "
                "set LAZYTPU_CPU_FALLBACK=1 to run such graphs op by op"
            )
        warnings.warn(f"lazytpu.compile: the {name} graph has no lowering for {listed}; it runs op by op", stacklevel=2)
        return _Eager(gm)
    return GraphProgram(gm, example_inputs, name=name, family=(frame, name))


def on_tpu(example_inputs) -> bool:
    """Whether a graph's inputs hold a ``tpu`` tensor (the graphs lazytpu compiles)."""
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in example_inputs)


def backend(gm: torch.fx.GraphModule, example_inputs):
    """The ``torch.compile`` backend ``"tpu"`` (also ``"lazytpu"``).

    Args:
        gm: the graph dynamo captured.
        example_inputs: its fake inputs.

    Returns:
        A callable running the forward (and, through autograd, the backward)
        as compiled programs; a graph with no ``tpu`` tensor runs as captured.
    """
    if not on_tpu(example_inputs):
        return gm.forward
    frame = _frame_id()
    compilers = {
        kind: functools.partial(_compile_graph, name=kind, frame=frame) for kind in ("forward", "backward", "inference")
    }
    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=compilers["forward"],
        bw_compiler=compilers["backward"],
        inference_compiler=compilers["inference"],
        decompositions=decompositions(),
        keep_inference_input_mutations=True,  # Note [Input mutations] in fx_lowering
    )
