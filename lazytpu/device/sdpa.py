"""``F.scaled_dot_product_attention`` on ``tpu`` as one fused op (Note [SDPA on PrivateUse1]);
``flex_attention`` let through its device check (Note [FlexAttention on tpu]).

``register`` (called from ``registration.register``) installs ``scaled_dot_product_attention``
for AutogradPrivateUse1: it does what torch's C++ does for a PrivateUse1
backend whose kernel choice is "overrideable", except that calls without
dropout take ``_scaled_dot_product_efficient_attention`` (Note [Attention
dropout]). Autograd records the fused op, and its backward op, as one node each.
``torch.nn.attention.sdpa_kernel`` chooses as on CPU: the fused op while a fused
backend is on (it stands for each of CUDA's), torch's math kernel while math is,
torch's error with neither. The math kernel gets an additive mask, as torch's C++
converts a boolean one before calling it.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


# How torch's C++ messages name a dtype (its TypeMeta name).
_CPP_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
    torch.int16: "short int",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.bool: "bool",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def _name(dtype: torch.dtype) -> str:
    return _CPP_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _validate(query, key, value, attn_mask) -> None:
    """torch's ``validate_sdpa_input``: its checks and messages, before any kernel choice."""
    q, k, v = query, key, value
    if not q.dtype == k.dtype == v.dtype:
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{_name(q.dtype)} key.dtype: {_name(k.dtype)} and value.dtype: {_name(v.dtype)} instead."
        )
    if not q.device == k.device == v.device:
        raise RuntimeError(
            "Expected query, key, and value to have the same device type, but got query.device: "
            f"{q.device} key.device: {k.device} and value.device: {v.device} instead."
        )
    if min(q.dim(), k.dim(), v.dim()) < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
            f"{q.dim()} key.dim: {k.dim()} and value.dim: {v.dim()} instead."
        )
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
            f"{_name(attn_mask.dtype)} and  query.dtype: {_name(q.dtype)} instead."
        )


def _fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether the fused ops take these inputs as CPU's kernels would: (B, H, S, E)
    of matching sizes and a mask broadcast to the scores' shape. Other ranks and
    sizes go to torch's math kernel, which raises CPU's errors (or broadcasts as
    CPU does), and so does a mask with ``is_causal`` where CPU would not take its
    flash kernel (no dropout, equal head dims, unit last strides), whose math
    kernel refuses them. CPU runs (H, S, E) inputs through its math kernel too:
    so does tpu, for its outputs' and gradients' layouts (Note [Attention layouts])."""
    q, k, v = query, key, value
    if not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if k.shape[:-1] != v.shape[:-1] or q.size(-1) != k.size(-1) or q.shape[:-3] != k.shape[:-3]:
        return False
    if q.size(-3) != k.size(-3) and not enable_gqa:
        return False
    if 0 in (q.size(-2), k.size(-2)):
        return False
    if attn_mask is not None:
        scores = (*q.shape[:-1], k.size(-2))
        if attn_mask.dim() > q.dim() or any(m not in (1, n) for m, n in zip(attn_mask.shape[::-1], scores[::-1])):
            return False
        flash = dropout_p == 0 and v.size(-1) == q.size(-1)
        if is_causal and not (flash and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1):
            return False
    return True


def _enabled_kernels() -> tuple[bool, bool]:
    """Whether ``torch.nn.attention.sdpa_kernel`` leaves the fused op on (any of the fused backends
    CUDA has: the tpu op stands for each) and torch's math kernel."""
    c = torch._C
    fused = c._get_flash_sdp_enabled() or c._get_mem_efficient_sdp_enabled() or c._get_cudnn_sdp_enabled()
    return fused or c._get_overrideable_sdp_enabled(), c._get_math_sdp_enabled()


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """torch's ``scaled_dot_product_attention`` for ``tpu`` tensors."""
    _validate(query, key, value, attn_mask)
    fused, math = _enabled_kernels()
    if not (fused and _fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)):
        if not math:
            raise RuntimeError(
                "No viable backend for scaled_dot_product_attention was found. This is likely due to turning "
                "off both the math kernel and the fused kernels."
            )
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # torch's convert_boolean_attn_mask
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )[0]
    if enable_gqa and key.size(-3) != query.size(-3):
        if query.size(-3) % key.size(-3):
            raise RuntimeError("Number of heads in key and value must divide the number of heads in ")  # sic, as CPU
        key = key.repeat_interleave(query.size(-3) // key.size(-3), dim=-3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), dim=-3)
    if dropout_p == 0:
        # The dropout-free op compiles much faster (Note [Attention dropout] in
        # lowering/attention).
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, False, 0.0, is_causal, scale=scale
        )[0]
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale
    )[0]


# Note [FlexAttention on tpu]: ``flex_attention`` refuses, before anything
# runs, a device outside its list (CUDA, CPU, XPU, HPU, MPS). On tpu its
# higher-order op runs its dense kernel (Note [Higher-order operators] in
# frontend/routes/higher_order): the scores materialized, ``score_mod`` and the
# block mask applied, gradients through its autograd function, as CUDA's eager
# path computes them; under ``torch.compile`` its graph is lowered. So tpu joins
# that list: the check's code gets a copy of the list's constant with tpu in it.
# The check stays torch's own function (a wrapper of ours would be a frame
# dynamo skips, a graph break inside ``torch.compile(flex_attention,
# fullgraph=True)``), and keeps its errors for the other devices. A torch whose
# check has no such constant keeps refusing tpu, with its own error.
def _allow_flex_attention() -> None:
    from torch.nn.attention import flex_attention

    code = flex_attention._validate_device.__code__
    consts = tuple(c | {"tpu"} if isinstance(c, frozenset) and {"cuda", "cpu"} <= c else c for c in code.co_consts)
    flex_attention._validate_device.__code__ = code.replace(co_consts=consts)


def register(lib: torch.library.Library) -> None:
    """Install the kernel in ``lib`` (an ``aten`` IMPL library)."""
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
    _allow_flex_attention()
