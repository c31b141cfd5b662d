"""Lower one FX graph of ATen ops to one JAX function; call it as one IR node.

A ``GraphProgram`` is made once per FX graph (AOTAutograd's forward,
backward or inference graph). Calling it records one node into the pending
graph (Note [Graphs as nodes]) and returns ``tpu`` tensors of its pending
outputs.

Note [Graphs as nodes]: a call of a compiled graph is recorded like any op:
one node (op ``COMPILED_GRAPH``) whose inputs are the IR values of its
arguments, pending or materialized, and whose static attribute (a
``GraphCall``) is the graph and its input signature; its lowering rule is
the graph's JAX function. So nothing is flushed before a graph runs (the
eager ops that made its inputs, e.g. the loss gradient's seed, fuse with
it), and a training step's forward graph, backward graph and eager
optimizer update become one program at the optimizer's sync, as one
``jax.jit`` of the whole step would be; strict mode runs the node at once,
as it runs every op. Per call, the node's structure comes from a plan made
once per signature (``_CallPlan``): steady state records one node and
allocates the output tensors, nothing else.

Note [FX node resolution] (how each FX node finds its lowering) is in
graph_rules.

Note [Graph signatures]: a program is compiled per (graph code, input
signature). An input tensor's signature is its storage's aval, plus its
window when it is a view (the program reads the window from the base
buffer, so views need no sync of their own); an int input (a size, under
dynamic shapes) is static and in the signature by value; a float input is a
program argument. Graphs whose code is equal share programs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.autograd.graph import increment_version
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from lazytpu import _dtypes
from lazytpu.compile.explain import observe_compile
from lazytpu.compile.graph_rules import ALIASES, CONTROL_FLOW, GRAPH_RULES, is_view_node, lowerable
from lazytpu.compile.host_nodes import host_function, host_nodes, on_cpu
from lazytpu.engine import STEPS_DUE, context, run_due_steps
from lazytpu.frontend import hostio
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides, describe
from lazytpu.frontend.windows import new_tensor_of, view_dtype, write_value
from lazytpu.ir import Aval, Node, Output, Scalar, Storage
from lazytpu.ir.node import RNG_AVAL, op_sig
from lazytpu.ir.template import Slot, Template, fill, flatten
from lazytpu.lowering import apply_op, get_rule, lowering
from lazytpu.lowering.strided import VIEW_READ, fits_box

aten = torch.ops.aten

# lazytpu IR ops: a call of a compiled graph (Note [Graphs as nodes]).
COMPILED_GRAPH = "lazytpu.compiled_graph"
COMPILED_GRAPH_RANDOM = "lazytpu.compiled_graph_random"


class GraphLoweringError(RuntimeError):
    """An FX node could not be lowered; names the op and the node."""


# -- shapes -------------------------------------------------------------------


def _symbolic(x) -> bool:
    if isinstance(x, torch.Tensor):
        return not all(is_concrete_int(d) for d in x.shape)
    return isinstance(x, torch.SymInt) and not is_concrete_int(x)


def _concrete(x, bindings) -> int:
    if isinstance(x, torch.SymInt):
        return int(x.node.expr.xreplace(bindings))
    return int(x)


def _bind(meta, value, bindings: dict) -> None:
    """Bind the size symbols of a placeholder to its runtime value."""
    import sympy

    if isinstance(meta, torch.Tensor):
        for d, s in zip(meta.shape, value.shape):
            if isinstance(s, int) and isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                bindings[d.node.expr] = s
    elif isinstance(meta, torch.SymInt) and isinstance(meta.node.expr, sympy.Symbol):
        bindings[meta.node.expr] = int(value)


def _aval(meta: torch.Tensor, bindings) -> Aval:
    return Aval(tuple(_concrete(d, bindings) for d in meta.shape), meta.dtype)


def _out_layout(meta):
    """(tensor metas, layout): layout None for one tensor, else a tuple of
    positions in the result list (int) or constants."""
    if isinstance(meta, torch.Tensor):
        return (meta,), None
    metas = list(meta)
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    it = iter(range(len(tensors)))
    return tuple(tensors), tuple(next(it) if isinstance(m, torch.Tensor) else ("const", m) for m in metas)


# -- the program ----------------------------------------------------------------

# Note [Host scalars]: a 0-d CPU tensor argument (an optimizer's step count,
# a bias correction computed from it on the host) is passed to the program as
# a Python number, lifted like eager's scalars (Note [Scalar lifting]), and
# cast back to its dtype inside: no host-to-device transfer per call, and a
# new value does not recompile. float64 and int64 hold every value of the
# narrower types exactly.
_HOST_SCALARS = {
    **dict.fromkeys((torch.float16, torch.bfloat16, torch.float32, torch.float64), float),
    **dict.fromkeys((torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64), int),
}


def _window_read(base, base_stride, window, dtype):
    size, stride, offset = window
    rule = get_rule(VIEW_READ).fn
    box = dtype is None and fits_box(base.shape, base_stride, size, stride, offset)  # Note [Box windows]
    return rule(base, base_stride=base_stride, size=size, stride=stride, offset=offset, dtype=dtype, box=box)


def _pick_node(leaf):
    return leaf if isinstance(leaf, torch.fx.Node) else None


def _view_chain(node) -> tuple:
    """(root, [(op, args, kwargs), ...]): ``node`` as view ops applied to
    ``root``; static arguments only (an empty chain when ``node`` is no view)."""
    chain = []
    while (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and is_view_node(node.target)
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and not flatten(node.args[1:], node.kwargs, _pick_node)[1]
    ):
        chain.append((node.target, tuple(node.args[1:]), dict(node.kwargs)))
        node = node.args[0]
    return node, chain[::-1]


def _get_attr(gm, target: str):
    return functools.reduce(getattr, target.split("."), gm)


class _Step:
    """One device node: a graph rule or a lowered op, its call template and
    the nodes filling its slots."""

    __slots__ = ("node", "kind", "fn", "template", "slots", "metas", "layout", "random")

    def __init__(self, node, kind, fn, template, slots, metas=(), layout=None, random=False):
        self.node, self.kind, self.fn, self.template, self.slots = node, kind, fn, template, slots
        self.metas, self.layout, self.random = metas, layout, random


class GraphProgram:
    """One FX graph, lowered to one JAX program per input signature
    (Note [Graph signatures]); called with AOTAutograd's boxed convention.

    Note [Host nodes]: nodes computing CPU tensors from CPU tensors only (an
    optimizer's step counters, which torch keeps on CPU) run on CPU torch
    before the program, as eager runs them, when their result must be on the
    host: written into a CPU input (the counter's ``+= 1``), returned, or
    made by an op with no device rule or a random one; their results are
    program inputs where device nodes use them (0-d ones as Python numbers,
    Note [Host scalars]). The others (e.g. the bias corrections an optimizer
    computes from its counters) are computed in the program: one CPU torch
    call each would cost more than the whole update.
    """

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, *, name: str, family) -> None:
        self.name = name
        self.family = family  # which graph this is, across recompiles (explanations)
        self.code = gm.code
        self.key = ("fx", self.code)
        nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        self.placeholder_metas = [n.meta.get("val") for n in self.placeholders]
        # a ``cond``'s branches are graphs of their own, lowered into its step
        attrs = [n for n in nodes if n.op == "get_attr" and not isinstance(_get_attr(gm, n.target), GraphModule)]
        self.constants = [_get_attr(gm, n.target) for n in attrs]
        self.symbolic = any(_symbolic(m) for m in self.placeholder_metas)
        graph_inputs = self.graph_inputs = self.placeholders + attrs
        host = host_nodes(nodes, {n for n in graph_inputs if on_cpu(n.meta.get("val"))})
        self.host_nodes: list[torch.fx.Node] = []
        self.steps: list[_Step] = []
        self.random = False
        mutations = []
        for node in nodes:
            if node.op == "call_function":
                if node in host:
                    self.host_nodes.append(node)
                    continue
                if node.target is aten.copy_.default:
                    dst = node.args[0]
                    if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder"):
                        raise GraphLoweringError(f"lazytpu.compile: FX node {node.name!r} writes {dst}, not an input")
                    mutations.append(node)
                self.steps.append(self._call_step(node, gm))
            elif node.op == "output":
                self._outputs(node, host)
            elif node.op not in ("placeholder", "get_attr"):
                raise GraphLoweringError(f"lazytpu.compile: FX node {node.name!r} ({node.op}) is not supported")
        # Note [Input mutations]: a graph compiled with its input mutations kept
        # (``copy_`` of a placeholder: the optimizer step's parameters and
        # state) re-binds the input tensors to the node's results, as
        # lazytpu's ``copy_`` would, without making output tensors for them
        # (a CPU input written from the device is copied to, a sync).
        placeholder_position = {n: i for i, n in enumerate(self.placeholders)}
        self.mutated: list[tuple[int, int, bool]] = []  # (input position, program output, on the host)
        for node in mutations:
            self.program_outputs.append(node)
            self.output_strides.append(None)
            on_host = on_cpu(node.args[0].meta.get("val"))
            self.mutated.append((placeholder_position[node.args[0]], len(self.program_outputs) - 1, on_host))
        self.made_outputs = len(self.program_outputs) - len(mutations)  # outputs that become new tensors
        used = {a for step in self.steps for a in step.slots} | set(self.program_outputs)
        # The program's inputs: graph inputs and host results that device nodes read.
        self.feeds = [n for n in graph_inputs if n in used] + [n for n in self.host_nodes if n in used]
        self.feed_names = [n.name for n in self.feeds]
        # Per call, the values are the graph inputs followed by the host results: an
        # index into them says where each feed (and each host output) comes from.
        position = {n: i for i, n in enumerate(graph_inputs + self.host_nodes)}
        self.feed_sources = [position[n] for n in self.feeds]
        self.outputs = [("host", position[o[1]] - len(graph_inputs)) if o[0] == "host" else o for o in self.outputs]
        self._host_fn = host_function(graph_inputs, self.host_nodes) if self.host_nodes else None
        self.plans: dict = {}  # call signature -> _CallPlan
        self._last: tuple | None = None  # (signature, plan) of the last call: steady state's lookup

    def _call_step(self, node, gm) -> _Step:
        if node.target in CONTROL_FLOW:  # Note [Control flow] in graph_rules
            kind, split = CONTROL_FLOW[node.target]
            graphs, values = split(*node.args)
            template, slots = flatten(values, {}, _pick_node)
            branches = tuple(self._branch(_get_attr(gm, g.target)) for g in graphs)
            return _Step(node, kind, branches, template, tuple(slots))
        template, slots = flatten(node.args, node.kwargs, _pick_node)
        rule = GRAPH_RULES.get(node.target)
        if rule is not None:
            return _Step(node, "graph", rule, template, tuple(slots))
        op = lowerable(node.target)
        if op is None:
            raise GraphLoweringError(f"lazytpu.compile: no lowering for {node.target} (FX node {node.name!r})")
        metas, layout = _out_layout(node.meta["val"])
        random = get_rule(op).random
        if random:
            self.random = True
            template = Template(template.args + (Slot(len(slots)),), template.kwargs)
        return _Step(node, "op", op, template, tuple(slots), metas, layout, random)

    def _branch(self, gm) -> tuple:
        """(placeholders, steps, outputs) of a ``cond``'s branch or a ``while_loop``'s function."""
        nodes = list(gm.graph.nodes)
        steps = [self._call_step(n, gm) for n in nodes if n.op == "call_function"]
        out = nodes[-1].args[0]
        return (
            [n for n in nodes if n.op == "placeholder"],
            steps,
            tuple(out) if isinstance(out, (list, tuple)) else (out,),
        )

    def _outputs(self, node, host: set) -> None:
        """Plan how each graph output is returned (Note [Graph outputs])."""
        # Note [Graph outputs]: an output that is an input tensor, or a view of
        # one (AOTAutograd saves inputs and e.g. transposed weights for the
        # backward), is returned as that tensor or as the same view of it,
        # made by torch's view op on the input: no copy, as in eager. Host
        # results are returned as they are (Note [Host nodes]). Other tensors
        # are program outputs, each computed once (an alias of one is the
        # same tensor); sizes and constants are returned as values.
        position = {n: i for i, n in enumerate(self.placeholders)}
        self.program_outputs: list[torch.fx.Node] = []
        self.output_strides: list[tuple | None] = []  # per program output: its strides, None if contiguous
        self.outputs: list[tuple] = []
        for out in node.args[0]:
            if not (isinstance(out, torch.fx.Node) and isinstance(out.meta.get("val"), torch.Tensor)):
                self.outputs.append(("value", out.meta.get("val") if isinstance(out, torch.fx.Node) else out))
                continue
            root, chain = _view_chain(out)
            if root in position:
                self.outputs.append(("input", position[root], tuple(chain)))
                continue
            if out in host:
                self.outputs.append(("host", out))
                continue
            root = out
            while root.target in ALIASES:
                root = root.args[0]
            meta = root.meta["val"]
            if root not in self.program_outputs:
                self.program_outputs.append(root)
                stride = None
                if not _symbolic(meta) and all(is_concrete_int(s) for s in meta.stride()):
                    if is_non_overlapping_and_dense(meta):
                        stride = tuple(int(s) for s in meta.stride())
                self.output_strides.append(stride)
            to_host = meta.device.type == "cpu"  # e.g. ``.cpu()`` in the graph: returned on the host
            self.outputs.append(("tensor", self.program_outputs.index(root), to_host))

    # -- tracing (once per signature) --------------------------------------

    def make_fn(self, parts: tuple, bindings: dict):
        """The JAX function of this graph for inputs of signature ``parts``
        (and, in a dynamic graph, sizes ``bindings``)."""
        steps, feeds, program_outputs = self.steps, self.feeds, self.program_outputs

        def run(*inputs):
            env, cursor = {}, 0
            for node, part in zip(feeds, parts):
                kind = part[0]
                if kind == "static":
                    env[node] = part[1]
                    continue
                x = inputs[cursor]
                cursor += 1
                if kind == "view":
                    x = _window_read(x, part[2], part[3], part[4])
                elif kind == "cpu_scalar":
                    x = jnp.asarray(x, _dtypes.to_jax(part[1]))
                env[node] = x
            key = inputs[cursor] if cursor < len(inputs) else None
            key = self._run(steps, env, key, bindings)
            outs = tuple(env[n] for n in program_outputs)
            return outs + (key,) if key is not None else outs

        return run

    def _run(self, steps, env: dict, key, bindings: dict):
        """Compute ``steps`` into ``env``; returns the PRNG key after them."""
        for step in steps:
            args = [env[n] for n in step.slots]
            try:
                flow = self._CONTROL_FLOW.get(step.kind)
                if flow is not None:
                    values, _ = fill(step.template, args)
                    env[step.node] = flow(self, step.fn, *values, bindings)
                    continue
                if step.kind == "graph":
                    call_args, call_kwargs = fill(step.template, args)
                    env[step.node] = step.fn(step.node.target, *call_args, **call_kwargs)
                    continue
                avals = tuple(_aval(m, bindings) for m in step.metas)
                if step.random:
                    args.append(key)
                    avals += (RNG_AVAL,)
                results = apply_op(step.fn, step.template, args, avals)
            except Exception as exc:
                raise GraphLoweringError(
                    f"lazytpu.compile: lowering {step.node.target} (FX node {step.node.name!r} of the "
                    f"{self.name} graph) failed: {exc}"
                ) from exc
            if step.random:
                key, results = results[-1], results[:-1]
            if step.layout is None:
                env[step.node] = results[0]
            else:
                env[step.node] = tuple(results[e] if type(e) is int else e[1] for e in step.layout)
        return key

    def _cond(self, branches, pred, operands, bindings: dict):
        """A ``cond`` as ``lax.cond`` of its branches (one of them for a constant predicate)."""
        fns = [functools.partial(self._call_branch, branch, bindings) for branch in branches]
        if isinstance(pred, (bool, int)):
            return fns[0 if pred else 1](*operands)
        return jax.lax.cond(jnp.reshape(pred, ()).astype(bool), *fns, *operands)

    def _while(self, fns, carried, extra, bindings: dict) -> tuple:
        """A ``while_loop`` as ``lax.while_loop``; ``extra``: the functions' other inputs."""
        cond_fn, body_fn = fns

        def cond(carry):
            return jnp.reshape(self._call_branch(cond_fn, bindings, *carry, *extra)[0], ()).astype(bool)

        return jax.lax.while_loop(cond, lambda carry: self._call_branch(body_fn, bindings, *carry, *extra), carried)

    def _scan(self, fns, init, xs, extra, bindings: dict) -> tuple:
        """A ``scan`` as ``lax.scan``: the final carry, then the combine function's other outputs, stacked."""
        (combine,) = fns
        n = len(init)

        def step(carry, x):
            out = self._call_branch(combine, bindings, *carry, *x, *extra)
            # the carry keeps its types (torch checks them; a weak type of JAX's must not differ)
            return tuple(jax.lax.convert_element_type(o, c.dtype) for o, c in zip(out[:n], carry)), out[n:]

        carry, ys = jax.lax.scan(step, tuple(jnp.asarray(c) for c in init), tuple(xs))
        return (*carry, *ys)

    def _map(self, fns, xs, extra, bindings: dict) -> tuple:
        """A ``map`` as ``lax.map``: the function's outputs for each slice of ``xs``, stacked."""
        (fn,) = fns
        return jax.lax.map(lambda x: self._call_branch(fn, bindings, *x, *extra), tuple(xs))

    _CONTROL_FLOW = {"cond": _cond, "while": _while, "scan": _scan, "map": _map}

    def _call_branch(self, branch, bindings: dict, *operands) -> tuple:
        placeholders, steps, outputs = branch
        env = dict(zip(placeholders, operands))
        self._run(steps, env, None, bindings)
        return tuple(env[o] for o in outputs)

    # -- calling -----------------------------------------------------------

    def _call_key(self, values: list, index: int) -> tuple[tuple, list]:
        """(signature parts, IR input values) of the call (Note [Graph signatures])."""
        parts, inputs = [], []
        for s in self.feed_sources:
            v = values[s]
            t = type(v)
            if t is LazyTensor:
                storage = v._lt_storage
                value = storage.value  # pending or not: the graph is a node of the pending graph
                inputs.append(value)
                d = v._lt_desc
                if not v._lt_windowed:  # the desc's aval is interned: the signature compares by identity
                    parts.append(("buffer", d.aval))
                else:
                    parts.append(("view", value.aval, storage.stride, (d.shape, d.stride, d.offset), view_dtype(v)))
            elif isinstance(v, torch.Tensor):
                kind = _HOST_SCALARS.get(v.dtype) if v.dim() == 0 else None
                if kind is not None:  # e.g. an optimizer's step count: no transfer (Note [Host scalars])
                    inputs.append(Scalar(kind(v.item())))
                    parts.append(("cpu_scalar", v.dtype))
                    continue
                data = hostio.data_from_cpu(v, index)
                inputs.append(data)
                parts.append(("cpu", data.aval))
            elif t is float or isinstance(v, torch.SymFloat):
                inputs.append(Scalar(float(v)))
                parts.append(("scalar", float))
            else:
                parts.append(("static", int(v) if isinstance(v, torch.SymInt) else v))
        return tuple(parts), inputs

    def _plan(self, parts: tuple, bindings: dict) -> _CallPlan:
        """The node structure of calls of signature ``parts`` (made once per signature)."""
        call = GraphCall(self, parts, bindings)
        out_avals = tuple(_aval(n.meta["val"], bindings) for n in self.program_outputs)
        descs = []
        for aval, stride in zip(out_avals, self.output_strides):
            shape = aval.shape
            descs.append(describe(shape, stride or contiguous_strides(shape), 0, math.prod(shape), aval.dtype))
        n_inputs = sum(p[0] != "static" for p in parts) + self.random
        op = COMPILED_GRAPH_RANDOM if self.random else COMPILED_GRAPH
        if self.random:
            out_avals += (RNG_AVAL,)
        template = Template(tuple(Slot(i) for i in range(n_inputs)), (("graph", call),))
        call.recompile_explained = observe_compile(self, parts)  # Note [Recompiles explained elsewhere] in debug
        return _CallPlan(op, template, out_avals, op_sig(op, template, out_avals), tuple(descs))

    @torch.compiler.disable  # Note [Dynamo hooks], 3: nothing below is user code
    def __call__(self, args: list):
        """Record the graph as one node of the pending graph (Note [Graphs as nodes])."""
        if STEPS_DUE:
            run_due_steps()  # Note [Step boundary] in engine
        values = args if not self.constants else [*args, *self.constants]
        index = next((v._lt_storage.graph.index for v in values if type(v) is LazyTensor), 0)
        ctx = context(index)
        passthrough = [args[o[1]] for o in self.outputs if o[0] == "input"]
        targets = [args[m[0]] for m in self.mutated]
        if self._host_fn is not None:  # Note [Host nodes]
            values = [*values, *self._host_fn(*values)]
        bindings = self._bindings(values) if self.symbolic else {}
        lane = ctx.lane()
        graph = lane.graph
        ctx.note_task(lane)  # a backward graph's call ends the forward's segment (Note [Step segments])
        with graph.lock:
            parts, inputs = self._call_key(values, index)
            host = values[len(self.graph_inputs) :] if self._host_fn is not None else ()
            args.clear()
            del values  # (strict mode runs the node below: inputs nothing else holds are donated)
            signature = (parts, tuple(sorted(bindings.items(), key=str))) if bindings else parts
            last = self._last
            if last is not None and last[0] == signature:  # equal elements are mostly the same objects: no hashing
                plan = last[1]
            else:
                plan = self.plans.get(signature)
                if plan is None:
                    plan = self.plans[signature] = self._plan(parts, bindings)
                self._last = (signature, plan)
            if self.random:
                inputs.append(ctx.rng_value())
            node = Node(plan.op, plan.template, tuple(inputs), plan.out_avals, static=plan.static)
            if self.random:
                graph.rng = Output(node, len(plan.out_avals) - 1)
            descs = plan.descs
            made = [
                LazyTensor(Storage(Output(node, k), graph, descs[k].stride), descs[k], True)
                for k in range(self.made_outputs)
            ]
            copies = []
            for t, (_, k, on_host) in zip(targets, self.mutated):
                if on_host:
                    copies.append((t, new_tensor_of(Output(node, k), descs[k], index)))
                elif not t._lt_windowed:
                    t._lt_storage.bind(Output(node, k), graph)  # write_value's fast path
                else:
                    write_value(t, Output(node, k))
            ctx.recorded(node, task=False, lane=lane)  # strict mode runs it now; its task was noted above
        if copies:
            with torch.no_grad():
                for t, value in copies:
                    t.copy_(value)
        if targets:
            increment_version([t for t, m in zip(targets, self.mutated) if not m[2]])
        return self._wrap(made, passthrough, host, bindings)

    def _bindings(self, values) -> dict:
        bindings: dict = {}
        for meta, value in zip(self.placeholder_metas, values):
            _bind(meta, value, bindings)
        return bindings

    def _wrap(self, made: list, passthrough: list, host, bindings: dict) -> list:
        result = []
        it = iter(passthrough)
        on_host: dict[int, torch.Tensor] = {}
        for out in self.outputs:
            kind = out[0]
            if kind == "input":
                t = next(it)
                for op, args, kwargs in out[2]:
                    t = op(t, *args, **kwargs)
                result.append(t)
            elif kind == "tensor":
                k = out[1]
                if out[2]:  # e.g. ``.cpu()`` in the graph: returned on the host (a sync)
                    if k not in on_host:
                        on_host[k] = hostio.to_cpu(made[k], reason="compiled_graph_output")
                    result.append(on_host[k])
                else:
                    result.append(made[k])
            elif kind == "host":
                result.append(host[out[1]])
            else:
                value = out[1]
                result.append(_concrete(value, bindings) if isinstance(value, torch.SymInt) else value)
        return result


class _CallPlan:
    """How calls of one signature are recorded: the node's op, call template,
    output avals and static key, and the output tensors' layouts."""

    __slots__ = ("op", "template", "out_avals", "static", "descs")

    def __init__(self, op, template, out_avals, static, descs) -> None:
        self.op, self.template, self.out_avals, self.static, self.descs = op, template, out_avals, static, descs


class GraphCall:
    """The static attribute of a compiled-graph node: the graph and the
    signature it is called with. Equal (and hashed) by the graph's code and
    the signature, so graphs with equal code share programs."""

    __slots__ = ("program", "parts", "bindings", "key", "_hash", "recompile_explained")

    def __init__(self, program: GraphProgram, parts: tuple, bindings: dict) -> None:
        self.program, self.parts, self.bindings = program, parts, bindings
        self.recompile_explained = False  # the compile side explained this signature (a recompile)
        self.key = (program.key, parts, tuple(sorted(bindings.items(), key=str)))
        self._hash = hash(self.key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is GraphCall and self.key == other.key)

    def __repr__(self) -> str:
        return f"<compiled {self.program.name} graph>"


@lowering(COMPILED_GRAPH)
def _compiled_graph(*inputs, graph: GraphCall):
    return graph.program.make_fn(graph.parts, graph.bindings)(*inputs)


@lowering(COMPILED_GRAPH_RANDOM, random=True)
def _compiled_graph_random(*inputs, key, graph: GraphCall):
    return graph.program.make_fn(graph.parts, graph.bindings)(*inputs, key)[:-1]  # apply_op threads the key
