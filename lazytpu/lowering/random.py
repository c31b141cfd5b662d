"""Random ops: each takes an explicit ``key`` (the device's PRNG state).

Note [Random entry points]: what torch's random entry points arrive as:

- ``torch.randn`` / ``x.normal_``: ``normal_`` -> ``normal_functional``;
- ``torch.rand`` / ``x.uniform_``: ``uniform_`` -> ``uniform``;
- ``torch.randint`` / ``x.random_``: ``random_.from|to|default`` -> ``random``;
- ``x.bernoulli_(p)``: ``bernoulli_.float|Tensor`` -> ``bernoulli.p|Tensor``;
- ``torch.randperm``: ``randperm.generator_out`` -> ``randperm.generator``;
- ``torch.*_like``: the ``*_like`` ops themselves.

Values cannot equal CPU torch's (different generators); distributions,
ranges and reproducibility under ``torch.manual_seed`` do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_INT64_MAX = 2**63 - 1


def sampling_dtype(dtype):
    """Sample in float32 at least: half-precision sampling is coarse."""
    dtype = jnp.dtype(dtype)
    return dtype if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize >= 4 else jnp.dtype(jnp.float32)


def _like_dtype(x, dtype):
    return x.dtype if dtype is None else _dtypes.to_jax(dtype)


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, sampling_dtype(dtype))


def _uniform(key, shape, dtype):
    return jax.random.uniform(key, shape, sampling_dtype(dtype))


def _integers(key, shape, low: int, high: int):
    """Integers in ``[low, high)`` (Python bounds; int64 range)."""
    return jax.random.randint(key, shape, low, min(high, _INT64_MAX), dtype=jnp.int64)


def _top(dtype) -> int:
    """torch's largest ``random_()`` value of ``dtype``: 2**mantissa for floats."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


# -- normal and uniform ------------------------------------------------------------


@lowering(aten.normal_functional, random=True)
def normal(x, mean=0.0, std=1.0, *, generator=None, key):
    return mean + std * _normal(key, x.shape, x.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal_tensor(mean, std=1.0, *, generator=None, key):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = jnp.result_type(mean, std)
    return mean + std * _normal(key, shape, dtype)


@lowering(aten.normal.float_float, random=True)
def normal_sized(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return mean + std * _normal(key, tuple(size), _dtypes.to_jax(dtype or _dtypes.default_float()))


@lowering(aten.log_normal.default, random=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(mean + std * _normal(key, x.shape, x.dtype))


@lowering(aten.uniform.default, random=True)
def uniform(x, low=0.0, high=1.0, *, generator=None, key):
    return low + (high - low) * _uniform(key, x.shape, x.dtype)


@lowering(aten.randn_like.default, aten.randn_like.generator, random=True)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return _normal(key, x.shape, _like_dtype(x, dtype))


@lowering(aten.rand_like.default, aten.rand_like.generator, random=True)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key):
    return _uniform(key, x.shape, _like_dtype(x, dtype))


@lowering(aten.exponential.default, random=True)
def exponential(x, lambd=1.0, *, generator=None, key):
    return jax.random.exponential(key, x.shape, sampling_dtype(x.dtype)) / lambd


@lowering(aten.cauchy.default, random=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    return median + sigma * jax.random.cauchy(key, x.shape, sampling_dtype(x.dtype))


@lowering(aten.geometric.default, random=True)
def geometric(x, p, *, generator=None, key):
    # The number of trials up to the first success: ceil(log(u) / log(1 - p)).
    u = 1.0 - _uniform(key, x.shape, x.dtype)  # in (0, 1]
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1)


# -- integers ------------------------------------------------------------------


@lowering(aten.random.default, random=True)
def random_(x, *, generator=None, key):
    return _integers(key, x.shape, 0, _top(x.dtype) + 1)


@lowering(aten.random.to, random=True)
def random_to(x, to, *, generator=None, key):
    return _integers(key, x.shape, 0, to)


@lowering(getattr(aten.random, "from"), random=True)
def random_from(x, low, high, *, generator=None, key):
    return _integers(key, x.shape, low, _top(x.dtype) + 1 if high is None else high)


@lowering(aten.randint_like.default, aten.randint_like.generator, random=True)
def randint_like(
    x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _integers(key, x.shape, 0, high)


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def randint_like_low(
    x, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return _integers(key, x.shape, low, high)


@lowering(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, random=True)
def randint_like_tensor(
    x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, key
):
    return jax.random.randint(key, x.shape, 0, high.astype(jnp.int64), dtype=jnp.int64)


@lowering(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n)


# -- bernoulli -----------------------------------------------------------------


@lowering(aten.bernoulli.default, aten.bernoulli.Tensor, aten.bernoulli.p, random=True)
def bernoulli(x, p=None, *, generator=None, key):
    p = x if p is None else p
    return _uniform(key, x.shape, jnp.float64 if x.dtype == jnp.float64 else jnp.float32) < p


@lowering(aten.multinomial.default, random=True)
def multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    logits = jnp.log(probs.astype(sampling_dtype(probs.dtype)))
    if replacement:
        shape = (num_samples,) + probs.shape[:-1]
        return jnp.moveaxis(jax.random.categorical(key, logits, shape=shape), 0, -1)
    # Without replacement: the top ``num_samples`` of Gumbel-perturbed logits.
    perturbed = logits + jax.random.gumbel(key, probs.shape, logits.dtype)
    return jax.lax.top_k(perturbed, num_samples)[1]
