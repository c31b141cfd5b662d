"""The one module that touches ``torch._dynamo``'s internals (Note [Dynamo hooks]).

Note [Dynamo hooks]: four things make ``torch.compile`` work on ``tpu``
tensors, installed together right after ``torch._dynamo`` is imported
(Note [Lazy dynamo install]):

1. Dynamo wraps a tensor subclass that overrides ``__torch_dispatch__`` as an
   opaque Python object, so every op on it would be a graph break. A
   ``LazyTensor`` is a device tensor to tracing (its dispatch is the device's
   kernels, not a tensor-like protocol), so ``VariableBuilder`` wraps it as a
   plain tensor: fake tensors on ``tpu`` in the graph, TENSOR_MATCH guards,
   and no subclass type (``infer_subclass_type``), so it is a
   ``TensorVariable``, not a ``TensorWithTFOverrideVariable``: ``torch.cond``
   takes only the former as its predicate (eager ``torch.cond`` compiles
   itself, Note [Higher-order operators]). A ``TpuGenerator`` is wrapped as
   dynamo wraps a CPU generator, a user object whose draws break the graph
   (as a subclass it was taken for an opaque script object, which failed).
2. AOTAutograd expects the tangents of the backward to be plain tensors (the
   forward's fake outputs were); a ``LazyTensor`` tangent is one, so it says
   so with ``__coerce_same_metadata_as_tangent__``.
3. Fake tensors on ``tpu`` take the output metas of lazytpu's recording
   where torch's meta kernel is CUDA's and refuses what the device computes:
   ``_grouped_mm`` of float32 (transformers' MoE layers call it on tpu in
   every dtype, so Mixtral under ``torch.compile`` or
   ``lazytpu.generation.decode`` failed in float32). Shapes must be concrete
   (a symbolic call keeps torch's kernel).
4. lazytpu's own files, and JAX's, are skipped by dynamo
   (``trace_rules.add``): after a graph break the eager ops run through
   lazytpu's dispatcher and into JAX, which dynamo must not try to compile as
   user code (skipping is per frame: a skipped lazytpu function calling JAX
   would otherwise have JAX's frames traced). The dispatcher, the way in from
   torch's C++ (``__torch_dispatch__``), is skipped with every frame under it:
   Python's ``logging``, which JAX's compiler calls, was compiled as user code,
   one more graph break after each data-dependent branch. Compiled graphs run with dynamo
   disabled outright (``torch.compiler.disable``). One module is traced:
   ``lazytpu.generation``, whose step functions are plain torch code written
   to be compiled (Note [Static generation] in lazytpu.generation).

Then the backends ``"tpu"`` and ``"lazytpu"`` are registered; the compiler
itself (``lazytpu.compile.backend``, which imports AOTAutograd) loads on the
first compile. ``torch.compile``'s default backend is the tpu device's too, as
inductor is CUDA's: inductor's entry (``torch._TorchCompileInductorWrapper``,
what ``torch.compile(model)`` and its ``mode=``/``options=`` make) hands a
graph with a ``tpu`` tensor among its inputs to lazytpu's compiler (inductor
took ``tpu`` for Google's ``torch_tpu`` and failed importing it); inductor's
options do not apply to it. Graphs without one go to inductor as before.

Note [Lazy dynamo install]: importing ``torch._dynamo`` costs about 3 s, more
than the rest of ``import lazytpu``. So nothing here runs at import unless
dynamo is already loaded; otherwise a one-shot import hook runs ``install``
right after ``torch._dynamo`` finishes loading (``torch.compile`` imports it
before looking up the backend name). The hook removes itself on first use.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading

_DYNAMO = "torch._dynamo"
_BACKEND_NAMES = ("tpu", "lazytpu")
_SKIPPED = ("jax", "jaxlib", "ml_dtypes")
_TRACED = ("generation",)  # lazytpu's modules of torch code for dynamo to trace


def _skipped_modules() -> list[str]:
    """The libraries dynamo skips, and every module of lazytpu's but ``_TRACED``."""
    import pkgutil
    from pathlib import Path

    package = Path(__file__).resolve().parents[1]  # lazytpu/, found without importing it from below
    ours = [f"lazytpu.{m.name}" for m in pkgutil.iter_modules([str(package)]) if m.name not in _TRACED]
    return [*ours, *_SKIPPED]


class _State:
    """Whether the hooks are installed (once per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed = False


_STATE = _State()


def compile_backend(gm, example_inputs):
    """The registered backend: loads the compiler on first use."""
    from lazytpu.compile.backend import backend

    return backend(gm, example_inputs)


def _coerce_same_metadata_as_tangent(self, expected_metadata, expected_type=None):
    return self


def _fake_kernel(meta_of):
    """A fake-tensor kernel that gives ``tpu`` calls the metas ``meta_of``
    infers on meta tensors of the same layouts (Note [Dynamo hooks], 3)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def kernel(fake_mode, func, *args, **kwargs):
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sizes = [s for t in tensors for s in (*t.shape, *t.stride())]
        if not any(t.device.type == "tpu" for t in tensors) or any(isinstance(s, torch.SymInt) for s in sizes):
            return NotImplemented

        def meta(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

        with unset_fake_temporarily():
            margs, mkwargs = torch.utils._pytree.tree_map_only(torch.Tensor, meta, (args, kwargs))
            out = meta_of(*margs, **mkwargs)
        with fake_mode:
            return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=tensors[0].device)

    return kernel


def _register_fake_kernels() -> None:
    import torch
    from torch._subclasses import fake_impls

    from lazytpu.frontend import metas

    op = torch.ops.aten._grouped_mm.default
    if op not in fake_impls.op_implementations_dict:
        fake_impls.register_op_impl(op)(_fake_kernel(metas.SHAPES[op]))


def _route_default_backend() -> None:
    """``torch.compile``'s default backend compiles tpu graphs with lazytpu's (Note [Dynamo hooks])."""
    import torch

    inductor = torch._TorchCompileInductorWrapper.__call__

    def __call__(self, model_, inputs_, **kwargs):
        from lazytpu.compile.backend import backend, on_tpu

        if on_tpu(inputs_):
            return backend(model_, inputs_)
        return inductor(self, model_, inputs_, **kwargs)

    torch._TorchCompileInductorWrapper.__call__ = __call__


def install() -> None:
    """Install the hooks and register the backends (idempotent)."""
    with _STATE.lock:
        if _STATE.installed:
            return
        _STATE.installed = True
    from torch._dynamo import trace_rules
    from torch._dynamo.backends.registry import register_backend
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy
    from torch._dynamo.variables import builder

    from lazytpu.frontend.generator import TpuGenerator
    from lazytpu.frontend.routes.higher_order import register_dense_kernels
    from lazytpu.frontend.tensor import LazyTensor

    wrap = builder.VariableBuilder._wrap

    def _wrap(self, value):
        if type(value) is LazyTensor:
            return self.wrap_tensor(value)
        if type(value) is TpuGenerator:
            return self.wrap_user_defined(value)
        return wrap(self, value)

    builder.VariableBuilder._wrap = _wrap
    infer = builder.infer_subclass_type

    def _infer_subclass_type(value):
        return None if type(value) is LazyTensor else infer(value)

    builder.infer_subclass_type = _infer_subclass_type
    LazyTensor.__coerce_same_metadata_as_tangent__ = _coerce_same_metadata_as_tangent
    register_dense_kernels()  # the HOPs of torch's modules imported since (Note [Higher-order operators])
    for package in _skipped_modules():
        trace_rules.add(package)
    skip_all_below = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    set_code_exec_strategy(LazyTensor.__torch_dispatch__.__func__.__code__, skip_all_below)
    for name in _BACKEND_NAMES:
        register_backend(compiler_fn=compile_backend, name=name)
    _route_default_backend()
    _register_fake_kernels()


class _ThenCall(importlib.abc.Loader):
    """A loader that runs ``callback`` after ``loader`` executed the module."""

    def __init__(self, loader, callback) -> None:
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.callback()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after the module ``name`` is imported."""

    def __init__(self, name: str, callback) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.callback)
        return spec


def install_when_dynamo_loads() -> None:
    """``install`` now if dynamo is loaded, else right after it is."""
    if _DYNAMO in sys.modules:
        install()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_DYNAMO, install))
