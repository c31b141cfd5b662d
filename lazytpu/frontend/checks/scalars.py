"""Python numbers in recorded calls: torch's checks of their values.

Note [Python integers wrap] in ``_dtypes`` says what torch does with a
Python number that meets a narrower dtype; this module makes the checks
torch's CPU kernels make of such numbers, at the call: once per call
signature when a plan is made (``check_at_plan``), and at every call where a
number is lifted to a program input, so that its value is not in the
signature (``per_call_check``, ``random_check``: ``_Plan.scalar_check`` in
``dispatch``). Each check runs the op on CPU stand-ins and re-raises only the
errors it is about.
"""

from __future__ import annotations

import functools
import math
import re

import torch

from lazytpu import _caches
from lazytpu.frontend.checks.probe import cpu_error, split
from lazytpu.ir import Scalar
from lazytpu.ir.template import fill

# Ops that take a Python number as an operand, whose CPU kernels check it
# against the dtype it meets (Note [Python integers wrap] in _dtypes).
_SCALAR_OPS = frozenset(
    """add sub rsub mul div true_divide floor_divide remainder fmod eq ne lt le gt ge bitwise_and bitwise_or
    bitwise_xor bitwise_left_shift bitwise_right_shift __and__ __or__ __xor__ __lshift__ __rshift__ fill full
    full_like new_full masked_fill where clamp clamp_min clamp_max index_fill addcmul addcdiv lerp threshold
    hardtanh scatter constant_pad_nd pad pow""".split()
)

# Of those, the ones whose kernels convert their number with an overflow
# check (``uint8.fill_(300)``, ``half.fill_(1e6)``; ``uint8.clamp(min=-2.7)``
# is fine but ``uint8.fill_(-2.7)`` is not); a number is lifted (Note [Scalar
# lifting]), so its value is checked per call, against the op's dtype.
_CHECKED_CONVERSION_OPS = frozenset(
    "fill full_like new_full masked_fill index_fill clamp clamp_min clamp_max addcmul scatter threshold hardtanh"
    " add sub constant_pad_nd pad".split()
)

# What those checks raise.
_SCALAR_ERRORS = re.compile(
    r"without overflow|with a bool tensor is not supported|Promotion for uint16, uint32, uint64"
    r"|negative integer powers|Boolean alpha|alpha must not be"
)

_INTEGER_DIVISION = frozenset({"floor_divide", "remainder", "fmod"})


def _family(func) -> str:
    name = func._schema.name.split("::")[-1]
    return name if name.startswith("__") else name.removesuffix("_")


def check_at_plan(func, args, kwargs, template, values, meta_out) -> None:
    """A Python int operand that torch's CPU kernel rejects
    (``uint8.fill_(300)``, ``bool - 1``, ``bool + 2**63``, ``int // 0``,
    ``int ** -1``, ``add(ints, ints, alpha=True)``)
    raises torch's error here, at the call, once per call signature (the
    int's value is part of it); an int that passes is wrapped by the lowering
    as torch wraps it (Note [Python integers wrap] in _dtypes)."""
    name = _family(func)
    if name not in _SCALAR_OPS or not any(_int_or_bool(a) for a in (*args, *kwargs.values())):
        return
    modulus = _division_modulus(func, kwargs, meta_out)
    if modulus is not None and len(args) > 1:
        _check_divisor(modulus, _int_value(args[1]))
    _run_on_stand_ins(func, template, values)


def _run_on_stand_ins(func, template, values) -> None:
    """Run ``func`` on CPU with zero tensors standing in for the tensors and
    the actual scalars; re-raise only what torch's kernels check of the
    scalars. A stand-in has the tensor's shape when small, else every size
    above 2 cut to 2 (broadcasting keeps working, the kernel still reaches its
    conversion: torch skips the check for some one-element and no zero-size
    calls, so those sizes are kept); zeros, so that nothing divides by garbage."""

    error = cpu_error(func, template, values, _stand_in)
    if error is not None and _SCALAR_ERRORS.search(error[1]):
        raise error[0](error[1]) from None


def _stand_in(v):
    return torch.zeros(v.shape if v.numel() <= 64 else tuple(min(n, 2) for n in v.shape), dtype=v.dtype)


# Ops whose CPU kernels check a number's value where their meta kernels do
# not (``celu``'s alpha, ``smooth_l1_loss``'s beta), or do once per call
# signature, which a lifted number's value is not part of (``cdist``'s p,
# ``renorm``'s maxnorm, ``huber_loss``'s delta, ``softshrink``'s lambda,
# ``isclose``'s tolerances, the backward of an in-place ``leaky_relu`` or
# ``elu`` with a negative slope): what each raises.
_VALUE_CHECKED = {
    name: re.compile(errors)
    for name, errors in {
        "_cdist_forward": "only supports non-negative p",
        "renorm": "maxnorm|non-positive-norm",
        "leaky_relu_backward": "with a negative slope",
        "elu_backward": "with a negative slope",
        "celu": "alpha cannot be 0",
        "huber_loss": "non-positive values for delta",
        "softshrink": "lambda must be in range",
        "isclose": "must be greater than or equal to zero",
        "smooth_l1_loss": "negative values for beta",
        "smooth_l1_loss_backward": "negative values for beta",
    }.items()
}


_DECOMPOSED_PASSED = _caches.memo("decomposed_value_checks")


def value_checked(func) -> bool:
    return _family(func) in _VALUE_CHECKED


def check_decomposed_values(func, args, kwargs) -> None:
    """``_check_values`` of a ``value_checked`` op that is decomposed, not
    recorded (``smooth_l1_loss``): its numbers are in its template."""
    template, values = split(args, kwargs)
    passed = _DECOMPOSED_PASSED.setdefault((func, template), set())
    _check_values(func, template, _VALUE_CHECKED[_family(func)], passed, values)


def _check_values(func, template, errors: re.Pattern, passed: set, values) -> None:
    """torch's error for a number ``func`` refuses, at every call; each distinct
    set of numbers runs on CPU stand-ins once."""
    key = _numbers(values)
    if key not in passed:
        _probe_numbers(func, template, values, _stand_in, errors)
        _passed(passed, key)


def _numbers(values) -> tuple:
    return tuple(v.value for v in values if type(v) is Scalar)


def _probe_numbers(func, template, values, stand_in, errors: re.Pattern) -> None:
    """Run ``func`` with its numbers on CPU stand-ins; raise what it raises that ``errors`` matches."""
    error = cpu_error(func, template, values, stand_in)
    if error is not None and errors.search(error[1]):
        raise error[0](error[1]) from None


def _passed(passed: set, key: tuple) -> None:
    if len(passed) >= 64:  # a number that changes every call: keep the set small
        passed.clear()
    passed.add(key)


def _int_value(a) -> int | None:
    """A Python int argument's value, static or lifted."""
    if type(a) is Scalar:
        a = a.value
    return a if type(a) is int else None


def _int_or_bool(a) -> bool:
    return type(a.value if type(a) is Scalar else a) in (int, bool)


def _division_modulus(func, kwargs, meta_out) -> int | None:
    """2**bits of the dtype an integer division computes in, when the call
    has elements (torch's kernels raise for a zero divisor per element),
    else None: a Python int divisor raises if it wraps to 0 there."""
    name = _family(func)
    if name not in _INTEGER_DIVISION and not (name == "div" and kwargs.get("rounding_mode") is not None):
        return None
    out = meta_out if isinstance(meta_out, torch.Tensor) else next(iter(meta_out), None)
    if not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.dtype.is_complex:
        return None
    if out.dtype is torch.bool or out.numel() == 0:
        return None
    return 1 << torch.iinfo(out.dtype).bits


def _check_divisor(modulus: int, divisor: int | None) -> None:
    if divisor is not None and divisor % modulus == 0:
        raise RuntimeError("ZeroDivisionError")


def _check_lifted_divisor(modulus: int, values) -> None:
    _check_divisor(modulus, _int_value(values[1]))


def per_call_check(func, kwargs, template, values, meta_out):
    """The check a call's lifted numbers need at every call (``_Plan.scalar_check``),
    or None (Note [Python integers wrap]): an int divisor of an integer
    division must not wrap to 0; a number converted with an overflow check
    must fit the op's dtype, else torch's kernel decides, on stand-ins."""
    name = _family(func)
    out = meta_out if isinstance(meta_out, torch.Tensor) else next(iter(meta_out), None)
    if not isinstance(out, torch.Tensor) or out.dtype.is_complex:
        return None
    checks = []
    if name in _VALUE_CHECKED:
        checks.append(functools.partial(_check_values, func, template, _VALUE_CHECKED[name], set()))
    if name in _CHECKED_CONVERSION_OPS and any(type(v) is Scalar and v.kind is complex for v in values):
        checks.append(functools.partial(_check_complex, func, template))  # into a real dtype
    if out.dtype is torch.float64:
        return checks[0] if checks else None
    modulus = _division_modulus(func, kwargs, meta_out)
    if modulus is not None and len(values) > 1 and type(values[1]) is Scalar:
        checks.append(functools.partial(_check_lifted_divisor, modulus))
    lifted = any(type(v) is Scalar and v.kind is not complex for v in values)
    if name in _CHECKED_CONVERSION_OPS and lifted and out.dtype is not torch.bool:  # bool converts unchecked
        info = torch.finfo(out.dtype) if out.dtype.is_floating_point else torch.iinfo(out.dtype)
        checks.append(functools.partial(_check_range, func, template, info.min, info.max))
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else lambda vals: [check(vals) for check in checks]


def _check_complex(func, template, values) -> None:
    """A complex number converted to a real dtype must have no imaginary part
    (torch's checked conversion); torch's kernel words the error, on stand-ins."""
    if any(type(v) is Scalar and v.kind is complex and v.value.imag != 0 for v in values):
        _run_on_stand_ins(func, template, values)


# Random ops whose CPU kernels check their parameters' values (``from <= to``,
# ``p`` in [0, 1], ``std >= 0``); a zero-size CPU call makes those checks and
# draws nothing.
_RANDOM_CHECKED = frozenset(
    {"uniform", "bernoulli", "random", "normal", "geometric", "log_normal", "cauchy", "exponential"}
)


# ``normal expects std >= 0.0``; ``random_``'s bounds of the tensor's dtype and dtypes
_RANDOM_ERRORS = re.compile(r"expects|is out of bounds for|handles only integral")


def random_check(func, template):
    """The per-call check of a random op's parameter values (``_Plan.scalar_check``), or None."""
    if _family(func) == "multinomial":
        return functools.partial(_check_multinomial, template)
    if _family(func) == "randint_like" and not func._overloadname.startswith("Tensor"):
        return functools.partial(_check_randint_like, template)  # a Tensor high is not known before it runs
    if _family(func) not in _RANDOM_CHECKED:
        return None
    return functools.partial(_check_random_parameters, func, template, set())


def _check_random_parameters(func, template, passed: set, values) -> None:
    """torch's error for a random op's bad parameter values, at every call
    (a lifted float's value is not in the call signature); each distinct
    set of values is checked on CPU once."""
    key = _numbers(values)
    if key in passed:
        return
    # zero-size stand-ins, a 0-d tensor included (a 0-d one would hold an uninitialised
    # parameter and draw from the CPU generator); they broadcast with one another
    _probe_numbers(func, template, values, lambda v: torch.empty((0,) * max(v.dim(), 1), dtype=v.dtype), _RANDOM_ERRORS)
    if _family(func) == "random" and _past_exact_integers(template, values):
        return  # CPU's kernel warns at every such call ("from is out of bounds [-(2^24), 2^24]"): so does the probe
    _passed(passed, key)


def _check_multinomial(template, values) -> None:
    """torch's check that its meta kernel skips (its lowering failed at the sync)."""
    replacement = template.args[2] if len(template.args) > 2 else dict(template.kwargs).get("replacement", False)
    if template.args[1] <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and template.args[1] > values[0].shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")


def _check_randint_like(template, values) -> None:
    """torch's check of ``randint_like``'s bounds, which its meta kernel skips (it drew ``low`` alone)."""
    args = [getattr(a, "value", a) for a in fill(template, values)[0]]
    low, high = (0, args[1]) if len(args) == 2 else args[1:3]
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")


def _past_exact_integers(template, values) -> bool:
    """``random_(from, to)`` of a float tensor with a bound (a static or a
    lifted number) past the integers its dtype holds exactly."""
    target = next(v for v in values if type(v) is not Scalar)
    if not target.dtype.is_floating_point:
        return False
    exact = 2 ** (round(-math.log2(torch.finfo(target.dtype).eps)) + 1)  # 2**24 for float32
    bounds = [v.value for v in values if type(v) is Scalar] + [a for a in template.args if type(a) is int]
    return any(not -exact <= b - 1 < exact for b in bounds)


def _check_range(func, template, lo, hi, values) -> None:
    """A lifted number outside ``[lo, hi]`` (or NaN): torch's kernel decides."""
    for v in values:
        if type(v) is Scalar and v.kind is not complex and not lo <= v.value <= hi:
            _run_on_stand_ins(func, template, values)
            return
