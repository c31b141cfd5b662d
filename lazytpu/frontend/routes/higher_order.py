"""Higher-order operators (``torch.cond``, ``while_loop``, ``scan``, ``map``, ...) on ``tpu`` tensors.

Note [Higher-order operators]: a higher-order operator (HOP) takes functions
as arguments. Below autograd, it finds a tensor subclass's kernel in its own
table (``python_key_table``), not through ``__torch_dispatch__``, and raises
"There was no rule registered for HOP cond and subclass LazyTensor" when it
has none. On CPU it runs its dense kernel (``CompositeExplicitAutograd``),
which calls the functions on the operands: ``cond`` reads its predicate and
calls one branch, ``while_loop`` reads its condition at every iteration.
Each HOP here runs that same kernel for a ``LazyTensor``: the functions' ops
are recorded like any other, so a branch fuses into the program around it,
and a predicate is read as ``bool(tensor)`` reads it on any device (a sync,
as CPU's kernel waits for its value). The HOPs made later (a module of
torch's imported after lazytpu) get the rule when ``torch._dynamo`` loads,
since eager ``torch.cond`` and friends compile themselves with dynamo first
(``_hop_compile_and_call``).

A ``torch.cond`` inside a ``torch.compile``d function is lowered with its
graph instead, reading nothing (Note [Control flow] in lazytpu.compile.graph_rules); a
graph that cannot lower runs op by op, this rule included.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from lazytpu.frontend.tensor import LazyTensor


def register_dense_kernels() -> int:
    """Give every HOP that has a dense kernel and no ``LazyTensor`` rule that
    kernel as its rule; returns how many were added (idempotent)."""
    added = 0
    for hop in list(torch._ops._higher_order_ops.values()):
        dense = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        if dense is None or LazyTensor in hop.python_key_table:
            continue
        hop.py_impl(LazyTensor)(dense)
        added += 1
    return added


register_dense_kernels()
