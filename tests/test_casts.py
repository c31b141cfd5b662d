"""Float -> integer casts give CPU torch's values (Note [Float to integer casts]):
NaN, +-inf and out-of-range values included, at every place a cast happens."""

from __future__ import annotations

import math

import hypothesis
import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import MODES, mode, no_fallback

from lazytpu import _dtypes
from lazytpu.ir import Aval
from lazytpu.lowering.casts import convert
from lazytpu.lowering.to_jax import cast_to

pytestmark = pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part")

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.int64, torch.bool)

# Specials, both sides of every integer width's bounds, and fractions: each
# stored in the source dtype (rounded there) before the cast.
EDGES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.4, -0.7, 1.5, -1.5, -1.0, 127.9, 128.0, -128.9, -129.0]
EDGES += [255.7, 256.0, 300.0, -300.0, 32767.5, 32768.0, -32769.0, 40000.3, 65504.0, -65504.0, 70000.0]
EDGES += [2.0**31 - 128, 2.0**31, -(2.0**31), -(2.0**31) - 1, 2.0**32 + 5, -(2.0**32) - 5, 1e10, -1e10]
EDGES += [2.0**63 - 1024, 2.0**63, -(2.0**63), -(2.0**63) - 4096, 2.0**64, 1e20, -1e20, 1e300, -1e300]


def _values(dtype: torch.dtype, n: int = 1) -> torch.Tensor:
    return torch.tensor(EDGES, dtype=torch.float64).repeat(n).to(dtype)


def _expected(x: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    out = x.to(target)
    # What the rule is measured against: CPU torch's scalar path (one element
    # at a time) gives the same values as its vectorized path (a long tensor).
    per_element = torch.stack([e.clone().to(target) for e in x[: len(EDGES)]])
    assert torch.equal(out[: len(EDGES)], per_element), "CPU torch's scalar and vector paths differ"
    return out


def _to_jax(x: torch.Tensor):
    # float16 and bfloat16 values are exact in float32: numpy carries them there
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return jnp.asarray(wide.numpy()).astype(_dtypes.to_jax(x.dtype))


@pytest.mark.parametrize("target", INTS, ids=str)
@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_convert_matches_cpu_torch(source, target):
    x = _values(source, n=64)  # long and contiguous: CPU torch's vectorized loop
    got = convert(_to_jax(x), _dtypes.to_jax(target))
    assert torch.equal(torch.from_numpy(np.array(got)), _expected(x, target))


@pytest.mark.parametrize("target", INTS, ids=str)
def test_result_cast_of_every_rule_matches_cpu_torch(target):
    """The wrapper around the rules casts a result to the dtype torch's meta kernel inferred."""
    x = _values(torch.float64)
    got = cast_to(_to_jax(x), Aval(tuple(x.shape), target))
    assert torch.equal(torch.from_numpy(np.array(got)), x.to(target))


# Every place a cast happens on tpu: a function of a float source and an integer target.
ENTRY_POINTS = {
    "to": lambda x, t: x.to(t),
    "to_device_and_dtype": lambda x, t: x.cpu().to("tpu" if x.device.type == "tpu" else "cpu", t),
    "copy_": lambda x, t: torch.zeros(x.shape, dtype=t, device=x.device).copy_(x),
    "copy_strided": lambda x, t: torch.zeros((2,) + x.shape, dtype=t, device=x.device)[1].copy_(x.flip(0)),
    "setitem": lambda x, t: _setitem(torch.zeros(x.shape, dtype=t, device=x.device), x),
    "fill_tensor": lambda x, t: torch.zeros(3, dtype=t, device=x.device).fill_(x[1]),
    "complex_real_part": lambda x, t: torch.complex(x, torch.ones_like(x)).to(t),
    "sum_dtype": lambda x, t: x.reshape(-1, 1).sum(1, dtype=t),
    "prod_dtype": lambda x, t: x.reshape(-1, 1).prod(1, dtype=t),
    "cumsum_dtype": lambda x, t: x.cumsum(0, dtype=t),
}


def _setitem(dst, src):
    dst[:] = src
    return dst


@pytest.mark.parametrize("mode_name", MODES)
@pytest.mark.parametrize("target", (torch.uint8, torch.int8, torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_casts_on_tpu_match_cpu_torch(entry, target, mode_name):
    fn = ENTRY_POINTS[entry]
    for source in (torch.float32, torch.float64):
        x = _values(source)
        with mode(mode_name):
            got = fn(x.to("tpu"), target).cpu()
        assert torch.equal(got, fn(x, target)), f"{source} -> {target}"


@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_to_dtype_on_tpu_matches_cpu_torch_for_every_pair(source):
    x = _values(source, n=64)
    got = {t: x.to("tpu").to(t) for t in INTS}  # one program for every target
    for target, value in got.items():
        assert torch.equal(value.cpu(), x.to(target)), target


@pytest.mark.parametrize("mode_name", MODES)
def test_prims_convert_element_type_is_lowered(mode_name):
    """What torch's _refs decompositions cast with: lowered (no CPU fallback), with CPU torch's values."""
    x = _values(torch.float32)
    with mode(mode_name), no_fallback():
        got = {t: torch.ops.prims.convert_element_type(x.to("tpu"), t).cpu() for t in INTS}
    for target, value in got.items():
        assert torch.equal(value, torch.ops.prims.convert_element_type(x, target)), target


def test_compiled_casts_match_cpu_torch():
    def fn(x, dst):
        dst.copy_(x * 2)  # an input mutation, lowered by the graph's copy rule
        return x.to(torch.int32), x.to(torch.uint8), x.double().to(torch.int8), (x * 1j).to(torch.int64)

    x = _values(torch.float32)
    compiled = torch.compile(fn, backend="tpu")
    dst = torch.zeros(x.shape, dtype=torch.int16, device="tpu")
    got = compiled(x.to("tpu"), dst)
    want_dst = torch.zeros(x.shape, dtype=torch.int16)
    want = fn(x, want_dst)
    for g, w in zip(got + (dst,), want + (want_dst,)):
        assert torch.equal(g.cpu(), w)


_WIDE = st.floats(allow_nan=True, allow_infinity=True, width=64)
_NEAR = st.floats(min_value=-(2.0**33), max_value=2.0**33) | st.integers(-(2**64), 2**64).map(float)


@hypothesis.given(
    values=st.lists(_WIDE | _NEAR, min_size=16, max_size=16),
    source=st.sampled_from(FLOATS),
    target=st.sampled_from(INTS),
)
def test_random_floats_cast_as_cpu_torch(values, source, target):
    x = torch.tensor(values, dtype=torch.float64).to(source)
    assert torch.equal(x.to("tpu").to(target).cpu(), x.to(target))


@pytest.mark.parametrize("mode_name", MODES)
@pytest.mark.parametrize("source", FLOATS + (torch.complex64, torch.complex128), ids=str)
def test_subnormals_cast_to_bool_as_nonzero(source, mode_name):
    """XLA:CPU and TPUs treat subnormal inputs as zero; ``bool`` of one is still True, as on CPU."""
    tiny = [5e-324, -5e-324, 1e-310, 1e-40, -1e-45, 6e-8, -6e-8, 0.0, -0.0, math.nan]
    x = torch.tensor(tiny, dtype=torch.float64).to(source)
    if source.is_complex:
        x = torch.complex(torch.zeros_like(x.real), x.real)  # only the imaginary part is nonzero
    with mode(mode_name):
        got = x.to("tpu").bool().cpu()
    assert torch.equal(got, x.bool())
    assert got.any(), "no subnormal survived the source dtype: the test lost its point"
