"""Lowering: aten ops to JAX, one pure rule per op, in per-family files."""

from lazytpu.lowering import (  # noqa: F401  (importing registers the rules)
    amp,
    attention,
    barrier,
    checks,
    conv,
    distributions,
    elementwise,
    factories,
    fft,
    incomplete_gamma,
    indexing,
    linalg,
    linalg_solve,
    linalg_spectral,
    misc,
    nn,
    nn_ext,
    normalization,
    norms,
    optimizers,
    pointwise_ext,
    pooling,
    powers,
    quantize,
    random,
    reduction,
    reduction_ext,
    rnn,
    scatter_ext,
    shape,
    sorting,
    special,
    strided,
    upsample,
)
from lazytpu.lowering.registry import get_rule, lowering, registered_ops
from lazytpu.lowering.to_jax import LoweringError, apply_op, lower_program, program_args

__all__ = ["LoweringError", "apply_op", "get_rule", "lower_program", "lowering", "program_args", "registered_ops"]
