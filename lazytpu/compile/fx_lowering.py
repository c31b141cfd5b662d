"""Lower one FX graph of ATen ops to one JAX program; run it on tpu buffers.

A ``GraphProgram`` is made once per FX graph (AOTAutograd's forward,
backward or inference graph). Calling it gathers the device buffers of its
inputs, runs the program compiled for their signature through the runtime
(the same compile cache, metrics and persistent cache as a sync) and wraps
the results as ``tpu`` tensors owning fresh storages, as a sync re-binds
pending tensors.

Note [FX node resolution]: a ``call_function`` node resolves, in order, to

1. a graph rule (``_GRAPH_RULES``): structure an FX graph carries that eager
   never records (``getitem``, aliases, size queries, Python arithmetic on
   sizes, the functional ``copy``);
2. the op's lowering rule, applied with ``apply_op``: the rules, result
   casting and PRNG-key threading of eager, unchanged;
3. for a view op (functional in an AOTAutograd graph): its ``*_copy`` rule.

Any other node is reported by ``missing_ops`` before anything is compiled.

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
import operator

import jax.numpy as jnp
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from lazytpu import _caches, hostio, runtime
from lazytpu.aliasing import contiguous_strides, new_tensor_of
from lazytpu.compile.explain import observe_compile
from lazytpu.engine import MODE, RNG_AVAL, EagerMode, context
from lazytpu.ir import Aval, Data
from lazytpu.ir.template import Slot, Template, fill, flatten
from lazytpu.lowering import apply_op, get_rule
from lazytpu.lowering.views import VIEW_READ
from lazytpu.tensor import LazyTensor, describe

aten = torch.ops.aten


class GraphLoweringError(RuntimeError):
    """An FX node could not be lowered; names the op and the node."""


# -- graph rules (Note [FX node resolution], step 1) ---------------------------

_GRAPH_RULES: dict = {}


def graph_rule(*targets):
    """Register ``fn`` for FX call targets that are structure, not math."""

    def register(fn):
        for target in targets:
            if target in _GRAPH_RULES:
                raise ValueError(f"duplicate graph rule for {target}")
            _GRAPH_RULES[target] = fn
        return fn

    return register


# Python arithmetic and comparisons on sizes (dynamic shapes), and getitem.
_PYTHON_OPS = tuple(getattr(operator, name) for name in "getitem add sub mul floordiv truediv mod neg pow".split())
_PYTHON_OPS += tuple(getattr(operator, name) for name in "eq ne lt le gt ge".split())
_PYTHON_OPS += (torch.sym_max, torch.sym_min, torch.sym_not, math.ceil, math.floor)
graph_rule(*_PYTHON_OPS)(lambda fn, *args: fn(*args))


_ALIASES = (aten.alias.default, aten.detach.default, aten.lift_fresh.default)


@graph_rule(*_ALIASES)
def _identity(fn, x):
    return x


@graph_rule(aten.sym_size.int)
def _sym_size(fn, x, dim):
    return x.shape[dim]


@graph_rule(aten.sym_numel.default)
def _sym_numel(fn, x):
    return math.prod(x.shape)


@graph_rule(aten.copy.default)
def _copy(fn, x, src, non_blocking=False):
    return jnp.broadcast_to(src, x.shape).astype(x.dtype)


def _is_view(op) -> bool:
    returns, args = op._schema.returns, op._schema.arguments
    return bool(returns and args) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


_LOWERABLE: dict = {}
_caches.register("compile_lowerable", _LOWERABLE.clear)


def lowerable(op):
    """The op whose lowering rule computes ``op`` (itself or its ``*_copy``
    form), or None."""
    if op not in _LOWERABLE:
        found = op if get_rule(op) is not None else None
        if found is None and isinstance(op, torch._ops.OpOverload) and _is_view(op):
            packet = getattr(aten, op._schema.name.split("::")[-1] + "_copy", None)
            overload = getattr(packet, op._overloadname, None) if packet is not None else None
            found = overload if overload is not None and get_rule(overload) is not None else None
        _LOWERABLE[op] = found
    return _LOWERABLE[op]


def missing_ops(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(op, FX node name) of every node with no way to lower it."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target not in _GRAPH_RULES and lowerable(node.target) is None:
                out.append((str(node.target), node.name))
        elif node.op not in ("placeholder", "get_attr", "output"):
            out.append((f"{node.op} {node.target}", node.name))
    return out


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


def _window_read(base, base_stride, window):
    size, stride, offset = window
    return get_rule(VIEW_READ).fn(base, base_stride=base_stride, size=size, stride=stride, offset=offset)


def _pick_node(leaf):
    return leaf if isinstance(leaf, torch.fx.Node) else None


def _view_chain(node) -> tuple:
    """(root, [(op, args, kwargs), ...]): ``node`` as view ops applied to
    ``root``; static arguments only (an empty chain when ``node`` is no view)."""
    chain = []
    while (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and _is_view(node.target)
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


def _on_cpu(meta) -> bool:
    """Whether ``meta`` is CPU tensors (and no other tensor)."""
    if isinstance(meta, torch.Tensor):
        return meta.device.type == "cpu"
    if isinstance(meta, (tuple, list)):
        tensors = [m for m in meta if isinstance(m, torch.Tensor)]
        return bool(tensors) and all(m.device.type == "cpu" for m in tensors)
    return False


class GraphProgram:
    """One FX graph, lowered to one JAX program per input signature
    (Note [Graph signatures]); called with AOTAutograd's boxed convention.

    Note [Host nodes]: nodes computing CPU tensors from CPU tensors only (an
    optimizer's step counters, which torch keeps on CPU) run on CPU torch
    before the program, as eager runs them: their results stay on the host
    (no device round trip for the counter written back) and are program
    inputs where device nodes use them.
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
        attrs = [n for n in nodes if n.op == "get_attr"]
        self.constants = [_get_attr(gm, n.target) for n in attrs]
        self.symbolic = any(_symbolic(m) for m in self.placeholder_metas)
        graph_inputs = self.graph_inputs = self.placeholders + attrs
        host = {n for n in graph_inputs if _on_cpu(n.meta.get("val"))}
        self.host_nodes: list[torch.fx.Node] = []
        self.steps: list[_Step] = []
        self.random = False
        for node in nodes:
            if node.op == "call_function":
                if _on_cpu(node.meta.get("val")) and all(a in host for a in node.all_input_nodes):
                    host.add(node)
                    self.host_nodes.append(node)
                else:
                    self.steps.append(self._call_step(node))
            elif node.op == "output":
                self._outputs(node, host)
            elif node.op not in ("placeholder", "get_attr"):
                raise GraphLoweringError(f"lazytpu.compile: FX node {node.name!r} ({node.op}) is not supported")
        used = {a for step in self.steps for a in step.slots} | set(self.program_outputs)
        # The program's inputs: graph inputs and host results that device nodes read.
        self.feeds = [n for n in graph_inputs if n in used] + [n for n in self.host_nodes if n in used]
        self.feed_names = [n.name for n in self.feeds]
        position = {n: i for i, n in enumerate(graph_inputs)}
        self.feed_sources = [position.get(n, n) for n in self.feeds]  # int: graph input; Node: host result

    def _call_step(self, node) -> _Step:
        template, slots = flatten(node.args, node.kwargs, _pick_node)
        rule = _GRAPH_RULES.get(node.target)
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
            while root.target in _ALIASES:
                root = root.args[0]
            if root not in self.program_outputs:
                self.program_outputs.append(root)
            meta = root.meta["val"]
            stride = None
            if not _symbolic(meta) and all(is_concrete_int(s) for s in meta.stride()):
                if is_non_overlapping_and_dense(meta):
                    stride = tuple(int(s) for s in meta.stride())
            on_cpu = meta.device.type == "cpu"  # e.g. ``.cpu()`` in the graph: returned on the host
            self.outputs.append(("tensor", self.program_outputs.index(root), meta.dtype, stride, on_cpu))

    # -- tracing (once per signature) --------------------------------------

    def make_fn(self, parts: tuple, bindings: dict):
        """The JAX function of this graph for inputs of signature ``parts``
        (and, in a dynamic graph, sizes ``bindings``)."""
        steps, feeds, program_outputs, name = self.steps, self.feeds, self.program_outputs, self.name

        def run(*inputs):
            env, cursor = {}, 0
            for node, part in zip(feeds, parts):
                kind = part[0]
                if kind == "static":
                    env[node] = part[1]
                    continue
                x = inputs[cursor]
                cursor += 1
                env[node] = _window_read(x, part[2], part[3]) if kind == "view" else x
            key = inputs[cursor] if cursor < len(inputs) else None
            for step in steps:
                args = [env[n] for n in step.slots]
                try:
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
                        f"{name} graph) failed: {exc}"
                    ) from exc
                if step.random:
                    key, results = results[-1], results[:-1]
                if step.layout is None:
                    env[step.node] = results[0]
                else:
                    env[step.node] = tuple(results[e] if type(e) is int else e[1] for e in step.layout)
            outs = tuple(env[n] for n in program_outputs)
            return outs + (key,) if key is not None else outs

        return run

    # -- calling -----------------------------------------------------------

    def _run_host(self, values: list) -> dict:
        """Run the host nodes on CPU torch (Note [Host nodes])."""
        env = dict(zip(self.graph_inputs, values))
        for node in self.host_nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            env[node] = node.target(*args, **kwargs)
        return env

    def _signature(self, values: list, host: dict, ctx) -> tuple[tuple, list]:
        """(signature parts, program inputs) of the call (Note [Graph signatures])."""
        feeds = [values[s] if type(s) is int else host[s] for s in self.feed_sources]
        for v in feeds:
            if type(v) is LazyTensor and type(v._lt_storage.value) is not Data:
                ctx.flush("compiled_graph")
                break
        parts, inputs = [], []
        for v in feeds:
            t = type(v)
            if t is LazyTensor:
                storage = v._lt_storage
                data = storage.value
                inputs.append(data.buffer)
                window = v._lt_window
                parts.append(("buffer", data.aval) if window is None else ("view", data.aval, storage.stride, window))
            elif isinstance(v, torch.Tensor):
                data = hostio.data_from_cpu(v, ctx.index)
                inputs.append(data.buffer)
                parts.append(("cpu", data.aval))
            elif t is float or isinstance(v, torch.SymFloat):
                inputs.append(float(v))
                parts.append(("scalar", float))
            else:
                parts.append(("static", int(v) if isinstance(v, torch.SymInt) else v))
        return tuple(parts), inputs

    @torch.compiler.disable  # Note [Dynamo hooks], 3: nothing below is user code
    def __call__(self, args: list):
        values = args if not self.constants else [*args, *self.constants]
        index = next((v._lt_index for v in values if type(v) is LazyTensor), 0)
        ctx = context(index)
        passthrough = [args[o[1]] for o in self.outputs if o[0] == "input"]
        host = self._run_host(values) if self.host_nodes else {}
        bindings = self._bindings(values) if self.symbolic else {}
        with ctx.graph.lock:
            parts, inputs = self._signature(values, host, ctx)
            if self.random:
                rng = ctx.rng_value()
                if type(rng) is not Data:
                    ctx.flush("compiled_graph")
                    rng = ctx.graph.rng
                inputs.append(rng.buffer)
            args.clear()
            del values
            signature = (parts, tuple(sorted(bindings.items(), key=str))) if bindings else parts
            outs = runtime.execute(
                (self.key, signature, self.random),
                lambda: self.make_fn(parts, bindings),
                inputs,
                index=index,
                blocking=MODE.current is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
                on_compile=lambda lowered: observe_compile(self, parts, lowered),
            )
            if self.random:
                ctx.graph.rng = Data(outs[-1], RNG_AVAL)
        return self._wrap(outs, passthrough, host, bindings, index)

    def _bindings(self, values) -> dict:
        bindings: dict = {}
        for meta, value in zip(self.placeholder_metas, values):
            _bind(meta, value, bindings)
        return bindings

    def _wrap(self, outs, passthrough: list, host: dict, bindings: dict, index: int) -> list:
        made: dict[int, LazyTensor] = {}
        result = []
        it = iter(passthrough)
        for out in self.outputs:
            kind = out[0]
            if kind == "input":
                t = next(it)
                for op, args, kwargs in out[2]:
                    t = op(t, *args, **kwargs)
                result.append(t)
            elif kind == "tensor":
                k = out[1]
                t = made.get(k)
                if t is None:
                    buf = outs[k]
                    shape = tuple(buf.shape)
                    stride = out[3] if out[3] is not None else contiguous_strides(shape)
                    desc = describe(shape, stride, 0, math.prod(shape), out[2])
                    t = new_tensor_of(Data(buf, desc.aval), desc, index)
                    t = made[k] = hostio.to_cpu(t, reason="compiled_graph_output") if out[4] else t
                result.append(t)
            elif kind == "host":
                result.append(host[out[1]])
            else:
                value = out[1]
                result.append(_concrete(value, bindings) if isinstance(value, torch.SymInt) else value)
        return result
