"""Kernel checks: torch's errors for calls its CPU kernels reject and its meta kernels accept (Note [Kernel checks])."""

from __future__ import annotations

import re

import torch

from lazytpu import scalars
from lazytpu.ir import Scalar

# Errors of CPU kernels that meta kernels do not raise, and that do not
# depend on sizes (Note [Kernel checks]).
_KERNEL_ERRORS = re.compile(
    r"not (yet )?implemented for|same dtype|expected scalar type|Dimension out of range|destination dtypes match"
    r"|not supported for complex|p has to be greater than or equal to 1|alpha must not be a floating point"
    r"|only support floating point|Expected a floating point|handle types other than"
)


# Op families whose CPU kernels check what meta kernels skip, and that are
# safe to call on zero-size inputs.
_KERNEL_CHECKED = frozenset(
    {
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "__and__",
        "__or__",
        "__xor__",
        "__lshift__",
        "__rshift__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "cumsum",
        "cumprod",
        "logcumsumexp",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "aminmax",
        "index_put",
        "clamp",
        "clamp_min",
        "clamp_max",
        "threshold",
        "add",  # a float alpha with bool tensors (meta checks it for the other integer dtypes only)
        "sub",
        "addcmul",
        "addcdiv",
        "lerp",
        "var",
        "std",
        "histc",
        "gelu",
        "silu",
        "softplus",
        "glu",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "huber_loss",
        "binary_cross_entropy",
        "soft_margin_loss",
        # linear algebra (LAPACK kernels): floating and complex dtypes only
        "linalg_cholesky_ex",
        "cholesky_solve",
        "cholesky_inverse",
        "linalg_solve_triangular",
        "triangular_solve",
        "linalg_lstsq",
        "linalg_householder_product",
        "geqrf",
        "ormqr",
        # pointwise special functions (lowering/special.py, pointwise_ext.py): dtypes the CPU kernels lack
        "frac",
        "mish",
        "celu",
        "hardshrink",
        "hypot",
        "nextafter",
        "heaviside",
        "logaddexp",
        "logaddexp2",
        "igamma",
        "igammac",
        "gcd",
        "lcm",
        "mvlgamma",
        "special_zeta",
        "special_erfcx",
        "special_log_ndtr",
        "special_ndtri",
        "special_airy_ai",
        "special_bessel_j0",
        "special_bessel_j1",
        "special_bessel_y0",
        "special_bessel_y1",
        "special_modified_bessel_i0",
        "special_modified_bessel_i1",
        "special_modified_bessel_k0",
        "special_modified_bessel_k1",
        "special_scaled_modified_bessel_k0",
        "special_scaled_modified_bessel_k1",
        "special_spherical_bessel_j0",
        *(f"special_{kind}_polynomial_{p}" for kind in ("chebyshev", "shifted_chebyshev") for p in "tuvw"),
        "special_hermite_polynomial_h",
        "special_hermite_polynomial_he",
        "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p",
    }
)


# Families whose CPU kernels return before checking the dtype when the input
# is empty: their check runs on one-element inputs of ones instead.
_KERNEL_CHECKED_ON_ONES = frozenset(
    {"_softmax", "_log_softmax", "round", "cholesky", "_linalg_eigh", "linalg_lu_factor_ex", "linalg_lu"}
)


def _check_kernel_dtypes(func, template, values) -> None:
    """Note [Kernel checks]: meta kernels skip some checks real kernels make
    (dtype support, mixed dtypes in mm, dim wrapping in softmax). Once per call
    signature, the op runs on CPU with every dimension 0 (no work); if that
    raises one of those size-independent errors, raise it now, as the
    backend's (``"bitwise_and_tpu" not implemented for 'Float'``). Kernels
    that return before their dtype check on empty inputs (softmax, eigh)
    run on one-element inputs of ones instead. ``make dtype-sweep`` lists
    the ops still missing (``tests/dtype_sweep.py``)."""

    family = func._schema.name.split("::")[-1]
    ones = family in _KERNEL_CHECKED_ON_ONES
    if family not in _KERNEL_CHECKED and not ones:
        return  # some CPU kernels crash (SIGFPE) on zero-size inputs: only known-safe families run
    tensors = [v for v in values if type(v) is not Scalar]
    if not tensors:
        return
    exact = all(v.numel() == 0 for v in tensors)  # empty inputs: the real call costs nothing

    def empty(v):
        if ones and not exact:
            return torch.ones((1,) * len(v.shape), dtype=v.dtype)
        return torch.empty(tuple(v.shape) if exact else (0,) * len(v.shape), dtype=v.dtype)

    error = scalars.cpu_error(func, template, values, empty)
    if error is not None and (exact or _KERNEL_ERRORS.search(error[1])):
        raise error[0](error[1].replace("_cpu", "_tpu")) from None
