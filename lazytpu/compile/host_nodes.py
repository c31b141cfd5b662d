"""Host nodes: the nodes of an FX graph that run on CPU torch before its
program, and the one generated function that runs them (Note [Host nodes]
in fx_lowering)."""

from __future__ import annotations

import operator

import torch

from lazytpu.compile.graph_rules import lowerable
from lazytpu.lowering import get_rule

aten = torch.ops.aten


# Host ops a run of which runs as one ``_foreach`` call (Note [Host nodes]): an
# optimizer's step counters are a run of ``add`` and one of ``copy_``, as eager's
# single ``_foreach_add_`` call.
# op -> (its ``_foreach`` form, how many leading arguments are per element, how many arguments it takes).
_HOST_FOREACH = {
    aten.add.Scalar: (aten._foreach_add.Scalar, 1, 2),  # add(x, scalar): the scalar is shared
    aten.copy_.default: (aten._foreach_copy_.default, 2, 2),  # copy_(dst, src)
}


def _host_runs(host_nodes: list) -> list[list]:
    """``host_nodes`` in runs: consecutive nodes of one ``_HOST_FOREACH`` op,
    independent of each other, with equal shared arguments."""
    runs: list[list] = []
    for node in host_nodes:
        run = runs[-1] if runs else None
        form = _HOST_FOREACH.get(node.target)
        if (
            run is not None
            and form is not None
            and node.target is run[0].target
            and not node.kwargs
            and len(node.args) == len(run[0].args) == form[2]
            and node.args[form[1] :] == run[0].args[form[1] :]
            and not any(a in run for a in node.all_input_nodes)
        ):
            run.append(node)
        else:
            runs.append([node])
    return runs


def host_function(graph_inputs: list, host_nodes: list):
    """The host nodes as one generated Python function (Note [Host nodes]):
    graph inputs in, the host nodes' results out, in order; a run of equal
    element ops as one ``_foreach`` call."""
    graph = torch.fx.Graph()
    env = {node: graph.placeholder(node.name) for node in graph_inputs}
    for run in _host_runs(host_nodes):
        if len(run) == 1:
            env[run[0]] = graph.node_copy(run[0], env.__getitem__)
            continue
        op, per_element, _ = _HOST_FOREACH[run[0].target]
        lists = tuple([env[n.args[i]] for n in run] for i in range(per_element))
        shared = torch.fx.node.map_arg(run[0].args[per_element:], env.__getitem__)
        out = graph.call_function(op, (*lists, *shared))
        for i, n in enumerate(run):  # an in-place op returns its first argument
            env[n] = env[n.args[0]] if op._schema.is_mutable else graph.call_function(operator.getitem, (out, i))
    graph.output(tuple(env[node] for node in host_nodes))
    return torch.fx.GraphModule(torch.nn.Module(), graph).forward


def on_cpu(meta) -> bool:
    """Whether ``meta`` is CPU tensors (and no other tensor)."""
    if isinstance(meta, torch.Tensor):
        return meta.device.type == "cpu"
    if isinstance(meta, (tuple, list)):
        tensors = [m for m in meta if isinstance(m, torch.Tensor)]
        return bool(tensors) and all(m.device.type == "cpu" for m in tensors)
    return False


def host_nodes(nodes: list, host_inputs: set) -> set:
    """The graph inputs on the host, and the nodes that run on the host
    (Note [Host nodes])."""
    able = set(host_inputs)  # CPU results of CPU inputs only
    for node in nodes:
        if node.op == "call_function" and on_cpu(node.meta.get("val")):
            if all(a in able for a in node.all_input_nodes):
                able.add(node)
    needed = set()
    stack = []
    for node in nodes:
        if node not in able or node.op != "call_function":
            continue
        op = lowerable(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        if op is None or get_rule(op).random or node.target._schema.is_mutable:
            stack.append(node)  # no device rule, draws from torch's CPU generator, or writes a host tensor
    outputs = next(n for n in reversed(nodes) if n.op == "output")
    stack += [a for a in outputs.all_input_nodes if a in able]  # returned on the host
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack += [a for a in node.all_input_nodes if a in able]
    return host_inputs | {n for n in needed if n.op == "call_function"}
