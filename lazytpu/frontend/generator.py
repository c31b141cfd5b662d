"""tpu generators: ``torch.Generator(device="tpu")``.

Note [tpu generators]: torch makes a device's generator in C++, through the
backend's ``PrivateUse1HooksInterface.getNewGenerator``, which a Python
backend cannot provide (torch's Python ``PrivateUse1Hooks`` has no such
method): ``torch.Generator(device="tpu")`` raised. ``TpuGenerator`` is a
Python subclass of ``torch.Generator`` with a random state of its own on its
device, a JAX PRNG key as the device's (Note [Random state] in
lazytpu.ir.graph): a random op given it (``generator=g``) draws from its key
and advances it, not the device's, so that it repeats after
``g.manual_seed(s)`` whatever else draws in between, and the device's own
sequence is as if the op had not drawn. The key is held by a storage of its
own, as a kept checkpoint state is (Note [Recomputed random ops] in
lazytpu.device.checkpoint): pending until a sync computes it with the
program that advances it, and never donated to that program.
``lazytpu.device.registration`` makes ``torch.Generator(device="tpu")``
construct one. The object is a ``torch.Generator`` (``isinstance`` holds and
torch's argument parsing takes it) over a CPU generator that torch's C++ sees:
a CPU op given a tpu generator draws from that CPU generator instead of
raising as CUDA's would, the one difference.
"""

from __future__ import annotations

import weakref

import torch

from lazytpu import engine, runtime
from lazytpu.frontend.tensor import tpu_device
from lazytpu.ir import Failed, Storage
from lazytpu.runtime import keys
from lazytpu.runtime.transfer import failed

# torch's C++ passes a generator on as a new ``torch.Generator`` of the same
# C generator (its ``_cdata``), not the Python object: each TpuGenerator by its C generator.
_GENERATORS: weakref.WeakValueDictionary[int, TpuGenerator] = weakref.WeakValueDictionary()


def check_state(new_state) -> None:
    """torch's errors for an RNG state that is not a generator's (a CPU generator words its own)."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("RNG state must be a torch.ByteTensor")
    if new_state.numel() != keys.STATE_BYTES:
        raise RuntimeError(
            f"Expected a tpu generator state of size {keys.STATE_BYTES} but found the input RNG state "
            f"size to be {new_state.numel()}"
        )


class TpuGenerator(torch.Generator):
    """A generator of a tpu device (Note [tpu generators])."""

    def __new__(cls, device):
        self = super().__new__(cls, "cpu")
        self._lt_index = runtime.platform.index_or_current(torch.device(device).index)
        self._lt_key = None
        self.manual_seed(engine.DEFAULT_SEED)
        _GENERATORS[self._cdata] = self
        return self

    @property
    def device(self) -> torch.device:
        return tpu_device(self._lt_index)

    def manual_seed(self, seed) -> TpuGenerator:
        super().manual_seed(seed)  # torch's checks of the seed, and its wrap to 64 bits
        self._reseed()
        return self

    def seed(self) -> int:
        seed = super().seed()
        self._reseed()
        return seed

    def _reseed(self) -> None:
        ctx = engine.context(self._lt_index)
        with ctx.lock:
            self._lt_key = Storage(keys.seed_key(self.initial_seed(), self._lt_index), ctx.graph, (1,))

    def _lost(self) -> bool:
        """Whether the key failed with its program, as it was made or as it ran (Note [Failed buffers])."""
        return type(self._lt_key.value) is Failed or failed(self._lt_key.value)

    def key(self, ctx, lane):
        """The key a random op reads (the seed's again if a failed program lost it: as the device's).
        An op on another tpu device draws from it too, as CUDA's generators serve any index of their
        type: the key moves to that device (through the host: 8 bytes) and stays there."""
        if self._lost():
            self._reseed()
        if self._lt_key.graph.index != ctx.index:
            self._lt_key = Storage(keys.bytes_key(self._host_key(), ctx.index), ctx.graph, (1,))
        if self._lt_key.graph is not lane.graph:
            ctx.lane_for(self._lt_key, lane, False)  # another thread's lane runs first if the key is pending there
        return self._lt_key.value

    def advance(self, value, graph) -> None:
        """The key after a random op drew from it (``value``, recorded in ``graph``)."""
        self._lt_key.bind(value, graph)

    def _host_key(self):
        """The key's bytes, computed (a sync of the device that holds it when it is pending)."""
        ctx = engine.context(self._lt_key.graph.index)
        with ctx.lock:
            if self._lt_key.pending:
                ctx.flush_all("generator_state")
            if self._lost():
                self._reseed()
            return keys.key_bytes(self._lt_key.value)

    def get_state(self) -> torch.Tensor:
        return torch.from_numpy(self._host_key()).clone()  # resizable, as a CPU state is

    def set_state(self, new_state) -> TpuGenerator:
        check_state(new_state)
        ctx = engine.context(self._lt_index)
        with ctx.lock:
            self._lt_key = Storage(keys.bytes_key(new_state.cpu().clone().numpy(), self._lt_index), ctx.graph, (1,))
        return self

    def get_offset(self) -> int:
        raise RuntimeError("tpu Generator does not use offset")

    def set_offset(self, offset: int) -> TpuGenerator:
        raise RuntimeError("tpu Generator does not use offset")

    def clone_state(self) -> TpuGenerator:
        return self.__deepcopy__({})

    def __reduce__(self):
        return (torch.Generator, (self.device,), (self.initial_seed(), None, self.get_state()))

    def __setstate__(self, state) -> None:
        seed, _, key = state
        self.manual_seed(seed)
        self.set_state(key)

    def __deepcopy__(self, memo) -> TpuGenerator:
        new = TpuGenerator(self.device).manual_seed(self.initial_seed())
        return new.set_state(self.get_state())

    def __repr__(self) -> str:
        return f"<torch.Generator on {self.device} (lazytpu) at {hex(id(self))}>"


def own_generator(args: tuple, kwargs: dict) -> tuple[tuple, dict, TpuGenerator | None]:
    """A random op's arguments without its tpu generator (``None`` in its
    place), and the generator; torch's error for a generator of another
    device (``check_generator``). A few ops take it by position (``poisson``)."""
    generator = kwargs.get("generator")
    if generator is not None:
        kwargs = {k: None if k == "generator" else v for k, v in kwargs.items()}
    else:
        at = next((i for i, a in enumerate(args) if isinstance(a, torch.Generator)), None)
        if at is None:
            return args, kwargs, None
        generator = args[at]
        args = (*args[:at], None, *args[at + 1 :])
    tpu = _GENERATORS.get(generator._cdata)
    if tpu is None:
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")
    return args, kwargs, tpu
