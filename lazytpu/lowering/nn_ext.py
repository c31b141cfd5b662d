"""More neural-network ops: im2col/col2im (``F.unfold``/``F.fold``).

Note [im2col order]: torch's ``im2col`` lays a patch out channel-major, then
kernel row, then kernel column (row ``c * kh * kw + i * kw + j``), and the
blocks in row-major order of their top-left corners. ``col2im`` is its
adjoint: every column entry is added back where ``im2col`` read it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.elementwise import sqrt
from lazytpu.lowering.norms import p_norm
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _blocks(size: int, k: int, d: int, p: int, s: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _taps(spatial, kernel_size, dilation, padding, stride):
    """The blocks' grid ``(oh, ow)`` and, for each kernel tap (i, j), the
    strided 2-d slice of the padded input it reads."""
    (k0, k1), (d0, d1), (s0, s1) = kernel_size, dilation, stride
    o0 = _blocks(spatial[0], k0, d0, padding[0], s0)
    o1 = _blocks(spatial[1], k1, d1, padding[1], s1)
    taps = [
        (slice(i * d0, i * d0 + (o0 - 1) * s0 + 1, s0), slice(j * d1, j * d1 + (o1 - 1) * s1 + 1, s1))
        for i in range(k0)
        for j in range(k1)
    ]
    return (o0, o1), taps


def _pads(x, padding):
    return ((0, 0),) * (x.ndim - 2) + ((padding[0], padding[0]), (padding[1], padding[1]))


@lowering(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    """Note [im2col order]."""
    padded = jnp.pad(x, _pads(x, padding))
    (o0, o1), taps = _taps(x.shape[-2:], kernel_size, dilation, padding, stride)
    stacked = jnp.stack([padded[..., r, c] for r, c in taps], axis=-3)  # (..., C, kh * kw, oh, ow)
    return stacked.reshape(x.shape[:-3] + (x.shape[-3] * len(taps), o0 * o1))


@lowering(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    """The adjoint of ``im2col`` (Note [im2col order])."""
    (o0, o1), taps = _taps(tuple(output_size), kernel_size, dilation, padding, stride)
    lead = cols.shape[:-2]
    channels = cols.shape[-2] // len(taps)
    out = jnp.zeros(lead + (channels, output_size[0] + 2 * padding[0], output_size[1] + 2 * padding[1]), cols.dtype)
    blocks = cols.reshape(lead + (channels, len(taps), o0, o1))
    for t, (r, c) in enumerate(taps):
        out = out.at[..., r, c].add(blocks[..., t, :, :])
    return out[..., padding[0] : out.shape[-2] - padding[0], padding[1] : out.shape[-1] - padding[1]]


# -- margin losses' backward (VJPs of the forward) ---------------------------------


def _positive(z):
    """``max(z, 0)`` with torch's gradient: 0 at ``z == 0``."""
    return jnp.where(z > 0, z, 0)


def _reduce(loss, reduction: int, shape):
    """torch's Reduction enum: 0 none (per-sample losses, shaped ``shape``), 1 mean, 2 sum."""
    if reduction == 1:
        return jnp.mean(loss)
    return jnp.sum(loss) if reduction == 2 else loss.reshape(shape)


def _rows(x):
    """``x`` as (samples, classes); a 0-d input is one sample of one class."""
    return x.reshape((-1, x.shape[-1] if x.ndim else 1))


def _multi_margin(x, target, p, margin, weight, reduction, shape):
    x2 = _rows(x)
    t = target.reshape((-1,))
    picked = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = _positive(margin - picked + x2)
    z = z * z if p == 2 else z
    if weight is not None:
        z = z * weight[t][:, None]
    z = jnp.where(jnp.arange(x2.shape[1]) == t[:, None], 0, z)
    loss = jnp.sum(z, axis=1) / x2.shape[1]
    return _reduce(loss, reduction, shape)


@lowering(aten.multi_margin_loss.default)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    """CPU's kernel: one loss per sample, a 0-d one for a 0-d target (torch's
    decomposition makes it (1,): Note [Meta shape fixes] in frontend/metas)."""
    return _multi_margin(x, target, p, margin, weight, reduction, (_rows(x).shape[0],) if target.ndim else ())


@lowering(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=1):
    _, vjp = jax.vjp(lambda a: _multi_margin(a, target, p, margin, weight, reduction, grad_output.shape), x)
    return vjp(grad_output.astype(x.dtype))[0]


def _multilabel_margin(x, target, reduction, shape):
    x2 = _rows(x)
    t = target.reshape(x2.shape)
    valid = jnp.cumprod(t != -1, axis=1).astype(bool)  # targets end at the first -1
    hits = jnp.zeros(x2.shape, bool).at[jnp.arange(x2.shape[0])[:, None], jnp.where(valid, t, 0)].max(valid)
    picked = jnp.take_along_axis(x2, jnp.where(valid, t, 0), axis=1)  # (N, C): x[target_j]
    z = _positive(1 - picked[:, :, None] + x2[:, None, :])  # [n, j, k]
    z = jnp.where(valid[:, :, None] & ~hits[:, None, :], z, 0)
    loss = jnp.sum(z, axis=(1, 2)) / x2.shape[1]
    return _reduce(loss, reduction, shape), hits.reshape(x.shape)


@lowering(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(x, target, reduction):
    """torch's CPU kernel: a sample's targets end at its first -1 (torch's
    decomposition reads past it)."""
    loss, hits = _multilabel_margin(x, target, reduction, x.shape[:-1] if target.ndim > 1 else ())
    return loss, hits.astype(x.dtype)


@lowering(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    _, vjp = jax.vjp(lambda a: _multilabel_margin(a, target, reduction, grad_output.shape)[0], x)
    return vjp(grad_output.astype(x.dtype))[0]


# -- cdist -------------------------------------------------------------------------


def _uses_mm(compute_mode, rows: int, cols: int) -> bool:
    """torch's choice of the matrix-product form of the Euclidean distance
    (for ``p == 2``): mode 1 always, mode 0 (the default) past 25 rows or
    columns, mode 2 never."""
    return compute_mode == 1 or (compute_mode in (None, 0) and (rows > 25 or cols > 25))


def _euclid_mm(x1, x2):
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
    sq = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=jax.lax.Precision.HIGHEST)
    return sqrt(jnp.maximum(sq, 0))


@lowering(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    def direct(p):
        return p_norm(jnp.abs(x1[..., :, None, :] - x2[..., None, :, :]), p, (-1,), False)

    if not _uses_mm(compute_mode, x1.shape[-2], x2.shape[-2]):
        return direct(p)
    if isinstance(p, (int, float)):
        return _euclid_mm(x1, x2) if p == 2 else direct(p)
    return jax.lax.cond(p == 2, lambda p: _euclid_mm(x1, x2), direct, p)


@lowering(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, dist):
    """The gradient for ``x1`` (torch's formulas: zero where a distance is zero),
    over the broadcast batch; with no distances at all (an empty row count,
    feature count or batch), zeros of ``x1``'s own shape, as CPU's kernel."""
    if 0 in grad.shape or x1.shape[-1] == 0:
        return jnp.zeros_like(x1)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g, r = grad[..., None], dist[..., None]
    safe = jnp.where(r == 0, 1, r)
    branches = (
        lambda p: jnp.zeros_like(diff),
        lambda p: g * jnp.sign(diff),
        lambda p: jnp.where(r == 0, 0, g * diff / safe),
        lambda p: g * jnp.sign(diff) * (jnp.abs(diff) == r),
        # a zero difference contributes zero (below p = 1 its power is infinite)
        lambda p: jnp.where((r == 0) | (diff == 0), 0, g * jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)),
    )
    if isinstance(p, (int, float)):
        terms = branches[{0: 0, 1: 1, 2: 2, float("inf"): 3}.get(p, 4)](p)
    else:
        index = jnp.select([p == 0, p == 1, p == 2, p == jnp.inf], [0, 1, 2, 3], 4)
        terms = jax.lax.switch(index, branches, jnp.asarray(p, diff.dtype))
    return jnp.sum(terms, axis=-2)


# -- rrelu -----------------------------------------------------------------------


@lowering(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    """Training: a non-positive input is scaled by a uniform draw in ``[lower,
    upper)``, which ``noise`` records (1 elsewhere); otherwise a leaky ReLU of
    slope ``(lower + upper) / 2`` and ``noise`` unchanged."""
    if not training:
        return jnp.where(x >= 0, x, x * ((lower + upper) / 2)), noise
    compute = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    draw = lower + (upper - lower) * jax.random.uniform(key, x.shape, compute)
    scale = jnp.where(x <= 0, draw, 1).astype(x.dtype)
    return x * scale, scale


# -- embedding renorm ------------------------------------------------------------------


@lowering(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows that ``indices`` name and whose ``norm_type``-norm (in the weight's
    dtype, as torch's CPU kernel) exceeds ``max_norm`` are scaled by
    ``max_norm / (norm + 1e-7)``; the functional form of ``embedding_renorm_``."""
    compute = jnp.float32 if weight.dtype in (jnp.float16, jnp.bfloat16) else weight.dtype
    w = weight.astype(compute)
    norms = p_norm(jnp.abs(w), norm_type, (1,), False).astype(weight.dtype).astype(compute)
    touched = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True)
    scale = jnp.where(touched & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return w * scale[:, None].astype(compute)


# -- embedding bags ----------------------------------------------------------------------
#
# Note [Embedding bag outputs]: besides the bags, torch's op returns
# ``offset2bag`` (the bag of each index), ``bag_size`` (its indices other than
# ``padding_idx``) and ``max_indices`` (mode max: the row each maximum came
# from). Their shapes are the meta kernel's; their values are what the
# backward rules here read (CPU torch leaves some of them empty or zero).


def _bags(indices, offsets, include_last_offset: bool, padding_idx: int):
    """(bag of each index, whether it counts: inside its bag and not padding, number of bags)."""
    n = indices.shape[0]
    count = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:count]
    last = offsets[count : count + 1] if include_last_offset else jnp.full((1,), n, offsets.dtype)
    ends = jnp.concatenate([offsets[1:count], last])
    pos = jnp.arange(n)
    bag = jnp.clip(jnp.searchsorted(starts, pos, side="right") - 1, 0, max(count - 1, 0))
    member = (pos >= starts[bag]) & (pos < ends[bag]) if count else jnp.zeros(n, bool)
    if padding_idx >= 0:
        member = member & (indices != padding_idx)
    return bag, member, count


def _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    compute = jnp.float32 if weight.dtype in (jnp.float16, jnp.bfloat16) else weight.dtype
    bag, member, count = _bags(indices, offsets, include_last_offset, padding_idx)
    rows = weight[indices].astype(compute)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(compute)
    size = jnp.zeros(count, jnp.int64).at[bag].add(member.astype(jnp.int64))
    if mode == 2:
        low = jnp.asarray(-jnp.inf, compute)
        best = jnp.full((count, weight.shape[1]), low).at[bag].max(jnp.where(member[:, None], rows, low))
        first = (
            jnp.full(best.shape, indices.shape[0])
            .at[bag]
            .min(
                jnp.where(
                    member[:, None] & (rows == best[bag]), jnp.arange(indices.shape[0])[:, None], indices.shape[0]
                )
            )
        )
        which = indices[jnp.clip(first, 0, max(indices.shape[0] - 1, 0))] if indices.shape[0] else first
        out = jnp.where(size[:, None] > 0, best, 0)
        return out, bag, _padded(size, offsets), jnp.where(size[:, None] > 0, which, -1)
    total = jnp.zeros((count, weight.shape[1]), compute).at[bag].add(jnp.where(member[:, None], rows, 0))
    if mode == 1:
        total = total / jnp.maximum(size, 1)[:, None].astype(compute)
    return total, bag, _padded(size, offsets), jnp.zeros((0,), jnp.int64)


def _padded(size, offsets):
    """``bag_size`` has one entry per offset (the meta kernel's shape)."""
    return jnp.concatenate([size, jnp.zeros(offsets.shape[0] - size.shape[0], size.dtype)])


@lowering(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """Note [Embedding bag outputs]."""
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)


@lowering(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    return embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowering(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    """Note [Embedding bag outputs]."""
    g = grad.astype(jnp.float32) if grad.dtype in (jnp.float16, jnp.bfloat16) else grad
    out = jnp.zeros((num_weights, grad.shape[1]), g.dtype)
    if mode == 2:
        filled = bag_size[: maximum_indices.shape[0], None] > 0
        rows = jnp.where(filled, maximum_indices, num_weights)  # empty bags: dropped
        return out.at[rows, jnp.arange(grad.shape[1])].add(g, mode="drop")
    contrib = g[offset2bag]
    if per_sample_weights is not None:
        contrib = contrib * per_sample_weights[:, None].astype(g.dtype)
    if mode == 1:
        contrib = contrib / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if scale_grad_by_freq:
        freq = jnp.zeros(num_weights, g.dtype).at[indices].add(1)
        contrib = contrib / freq[indices][:, None]
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    return out.at[indices].add(jnp.where(keep[:, None], contrib, 0))


@lowering(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    out = jnp.sum(grad[offset2bag] * weight[indices], axis=1)
    return jnp.where(indices != padding_idx, out, 0) if padding_idx >= 0 else out


# -- CTC loss (Note [CTC in log space]) ---------------------------------------------


# Note [CTC in log space]: as torch's CPU kernel (LossCTC.cpp): the extended
# target l' puts the blank between and around the labels;
# alpha[t, s] = lse(alpha[t-1, s], alpha[t-1, s-1],
# alpha[t-1, s-2] when l'[s] is a label unlike l'[s-2]) + log_probs[t, l'[s]],
# one lax.scan step per time step, every batch element at once. The loss is
# -lse of the last two alphas at t = input_length - 1. The log-sum-exp keeps
# an all -inf argument -inf with a zero gradient (a double ``where``), so the
# backward rule is the VJP of the loss plus torch's ``exp(log_probs) * grad``
# term (the kernel's gradient is taken through the log_softmax before it).
# log_alpha past each sequence's input or target length is undefined in torch
# (uninitialized memory); here it is -inf.


def _lse(*xs):
    m = lax.stop_gradient(functools.reduce(jnp.maximum, xs))
    dead = m == -jnp.inf
    m = jnp.where(dead, 0, m)
    total = sum(jnp.exp(x - m) for x in xs)
    return jnp.where(dead, -jnp.inf, jnp.log(jnp.where(dead, 1, total)) + m)


def _ctc_targets(targets, target_lengths, n):
    """Targets as ``(N, max(target_lengths))`` (torch's 1-D form concatenates them)."""
    lengths = jnp.asarray(target_lengths, jnp.int32)
    width = max(target_lengths, default=0)
    if targets.ndim == 1:
        offsets = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(lengths)[:-1]])
        index = jnp.clip(offsets[:, None] + jnp.arange(width), 0, max(targets.shape[0] - 1, 0))
        return (targets[index] if targets.shape[0] else jnp.zeros((n, width), targets.dtype)), lengths
    return targets[:, :width], lengths


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank):
    """(neg_log_likelihood (N,), log_alpha (N, T, 2L+1)) of time-major log_probs."""
    t_max, n, _ = log_probs.shape
    tg, tl = _ctc_targets(targets, target_lengths, n)
    width = 2 * tg.shape[1] + 1
    s = jnp.arange(width)
    ext = jnp.where(
        s % 2 == 0, blank, tg[:, jnp.clip((s - 1) // 2, 0, max(tg.shape[1] - 1, 0))] if tg.shape[1] else blank
    )
    ext = jnp.broadcast_to(ext, (n, width)).astype(jnp.int32)
    valid = s[None, :] < 2 * tl[:, None] + 1
    skip = (s[None, :] % 2 == 1) & (s[None, :] >= 2) & (ext != jnp.roll(ext, 2, axis=1))
    il = jnp.asarray(input_lengths, jnp.int32)
    emit = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (t_max, n, width)), axis=2)  # (T, N, S)
    neg_inf = jnp.asarray(-jnp.inf, log_probs.dtype)
    a0 = jnp.where((s[None, :] < 2) & valid, emit[0], neg_inf)

    def step(prev, xs):
        e, t = xs
        p1 = jnp.concatenate([jnp.full((n, 1), neg_inf), prev], axis=1)[:, :width]  # width 1: no targets
        p2 = jnp.concatenate([jnp.full((n, 2), neg_inf), prev], axis=1)[:, :width]
        new = jnp.where(valid, _lse(prev, p1, jnp.where(skip, p2, neg_inf)) + e, neg_inf)
        new = jnp.where((t < il)[:, None], new, neg_inf)
        return new, new

    _, rest = lax.scan(step, a0, (emit[1:], jnp.arange(1, t_max)))
    alphas = jnp.concatenate([a0[None], rest], axis=0)  # (T, N, S)
    last = alphas[jnp.clip(il - 1, 0, t_max - 1), jnp.arange(n)]  # (N, S)
    end = jnp.take_along_axis(last, jnp.stack([2 * tl, jnp.maximum(2 * tl - 1, 0)], axis=1), axis=1)
    ll = jnp.where(tl == 0, end[:, 0], _lse(end[:, 0], end[:, 1]))
    ll = jnp.where(il == 0, jnp.where(tl == 0, 0, neg_inf), ll)
    log_alpha = jnp.where((jnp.arange(t_max)[:, None] < il[None, :])[..., None], alphas, neg_inf)
    return -ll, jnp.moveaxis(log_alpha, 0, 1)


def _batched(log_probs, targets):
    if log_probs.ndim == 2:  # unbatched: (T, C) with 1-D targets
        return log_probs[:, None], targets[None] if targets.ndim == 1 else targets, True
    return log_probs, targets, False


@lowering(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp, tg, unbatched = _batched(log_probs, targets)
    nll, log_alpha = _ctc_forward(lp, tg, input_lengths, target_lengths, blank)
    return (nll[0], log_alpha[0]) if unbatched else (nll, log_alpha)


@lowering(aten._ctc_loss_backward.default)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity=False
):
    lp, tg, unbatched = _batched(log_probs, targets)
    gr = grad.reshape(-1) if unbatched else grad
    nll = neg_log_likelihood.reshape(-1)
    _, vjp = jax.vjp(lambda x: _ctc_forward(x, tg, input_lengths, target_lengths, blank)[0], lp)
    (g,) = vjp(gr)
    il = jnp.asarray(input_lengths, jnp.int32)
    live = (jnp.arange(lp.shape[0])[:, None] < il[None, :])[..., None]  # (T, N, 1)
    out = jnp.where(live, jnp.exp(lp) * gr[None, :, None] + g, 0)
    inf = jnp.isinf(nll)[None, :, None]
    out = jnp.where(inf, 0 if zero_infinity else jnp.where(live, jnp.nan, 0), out)
    return out[:, 0] if unbatched else out


@lowering(aten.soft_margin_loss.default)
def soft_margin_loss(x, target, reduction=1):
    """torch's CPU kernel: ``neg_out(input).mul_(target).exp_().log1p_()``, each
    step rounded to the input's dtype (a float16 ``exp`` overflows to inf, where
    a decomposition in float32 would not); the barriers keep XLA from fusing the
    steps in float32."""
    x, target = jnp.broadcast_arrays(x, target)
    if x.dtype in (jnp.float16, jnp.bfloat16):
        e = lax.optimization_barrier(jnp.exp(lax.optimization_barrier(-x * target)))
        loss = lax.optimization_barrier(jnp.log1p(e))
        if reduction == 0:
            return loss
        total = jnp.sum(loss.astype(jnp.float32))
        return (total / loss.size if reduction == 1 else total).astype(x.dtype)
    return _reduce(jnp.log1p(jnp.exp(-x * target)), reduction, x.shape)
