"""QR, SVD and eigendecompositions, and what is computed from them (the
pseudo-inverse, least squares); the matrix exponential."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax._src.lax.linalg import geqrf as _geqrf  # not exported by jax.lax.linalg

from lazytpu.lowering.linalg_solve import conj_transpose
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    q, r = lax.linalg.qr(a, full_matrices=mode == "complete")
    if mode == "r":
        return jnp.zeros((0,), a.dtype), r
    return q, r


@lowering(aten.geqrf.default)
def geqrf(a):
    return _geqrf(a)


@lowering(aten.linalg_householder_product.default)
def householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@lowering(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    return lax.linalg.ormqr(a, tau, c, left=left, transpose=transpose)


def _svd(a, *, full_matrices=False, compute_uv=True):
    """``lax.linalg.svd`` of ``a`` with its infinities made NaNs: XLA:CPU's SVD
    with vectors never returns for a matrix holding an infinity. Such a
    matrix's SVD fails with CPU's error (Note [Non-finite matrices] in
    lazytpu.frontend.checks.value_checks); least squares gives NaNs."""
    a = jnp.where(jnp.isinf(a), jnp.nan, a)
    return lax.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)


@lowering(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        s = _svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = _svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowering(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):  # noqa: N803 - torch's argument name
    vectors, values = lax.linalg.eigh(a, lower=UPLO.upper() == "L", symmetrize_input=False)
    if not compute_v:
        return values, jnp.zeros((0,), a.dtype)
    return values, vectors


@lowering(aten.linalg_eig.default)
def linalg_eig(a):
    return jnp.linalg.eig(a)  # XLA:CPU only (LAPACK geev, as torch)


@lowering(aten._linalg_eigvals.default, aten.linalg_eigvals.default)
def linalg_eigvals(a):
    return jnp.linalg.eigvals(a)


@lowering(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    x = a.astype(jnp.float32) if a.dtype in (jnp.float16, jnp.bfloat16) else a  # as torch's CPU kernel
    flat = x.reshape((-1,) + x.shape[-2:])
    return jax.vmap(lambda m: jax.scipy.linalg.expm(m, max_squarings=64))(flat).reshape(x.shape)


@lowering(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    m, n = a.shape[-2:]
    if hermitian:  # A = V diag(w) V^H: invert the eigenvalues
        w, v = lax.linalg.eigh(a, symmetrize_input=False)[::-1]
        s, left, right = jnp.abs(w), v, conj_transpose(v)
    else:
        left, s, right = _svd(a)
        w = s
    smax = jnp.max(s, axis=-1, keepdims=True, initial=0)
    zero = jnp.zeros((), s.dtype)
    atol_ = zero if atol is None else jnp.asarray(atol, s.dtype)[..., None]
    if rtol is None:
        eps = jnp.asarray(jnp.finfo(s.dtype).eps * max(m, n), s.dtype)
        rtol_ = eps if atol is None else jnp.where(atol_ > 0, zero, eps)
    else:
        rtol_ = jnp.asarray(rtol, s.dtype)[..., None]
    keep = s > jnp.maximum(atol_, rtol_ * smax)
    w_inv = jnp.where(keep, 1 / jnp.where(keep, w, 1), 0).astype(a.dtype)
    return conj_transpose(right) * w_inv[..., None, :] @ conj_transpose(left)


@lowering(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """Least squares through the SVD, with rank truncation below ``rcond * s_max``.

    Note [lstsq drivers]: LAPACK's drivers reach the same minimum-norm solution
    (gels assumes full rank and solves by QR; gelsy by a rank-revealing QR
    whose rank estimate matches the SVD's away from the threshold). Which
    outputs are empty follows the driver (``metas._lstsq``): gelsy (CPU
    default) reports the rank only, gels the residuals of tall systems,
    gelsd/gelss also the singular values.
    """
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.ndim == 1 or (a.ndim - 1 == b.ndim and b.shape == a.shape[:-1])
    b2 = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    a = jnp.broadcast_to(a, batch + (m, n))
    b2 = jnp.broadcast_to(b2, batch + b2.shape[-2:])
    real = jnp.finfo(a.dtype).dtype
    eps = jnp.finfo(real).eps
    if rcond is None:
        rcond = eps * max(m, n)
    else:  # a lifted number (Note [Scalar lifting]): LAPACK takes one out of its range for the precision
        rcond = jnp.asarray(rcond, real)
        outside = (rcond <= 0) | (rcond >= 1) if driver == "gelsd" else rcond < 0  # dlalsd's range is (0, 1)
        rcond = jnp.where(outside, jnp.asarray(eps, real), rcond)
    if m == 0 or n == 0:
        s = jnp.zeros(batch + (0,), real)
        x = jnp.zeros(batch + (n, b2.shape[-1]), a.dtype)
        rank = jnp.zeros(batch, jnp.int64)
    else:
        u, s, vh = _svd(a)
        keep = s > rcond * s[..., :1]
        if driver == "gelsy":  # its rank-revealing QR keeps the first column of a nonzero matrix
            keep = keep.at[..., 0].set(s[..., 0] > 0)
        s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
        x = conj_transpose(vh) @ (s_inv[..., :, None] * (conj_transpose(u) @ b2))
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    if driver != "gelsy" and m > n:  # gelsd/gelss: emptied unless full rank (handlers.linalg_lstsq)
        residuals = jnp.sum(jnp.abs(b2 - a @ x) ** 2, axis=-2).astype(real)  # real, as torch's, for complex input
    else:
        residuals = jnp.zeros((0,), real)
    if driver == "gels":
        rank = jnp.zeros((0,), jnp.int64)
    sv = s if driver in ("gelsd", "gelss") else jnp.zeros((0,), real)
    return (x[..., 0] if vector else x), residuals, rank, sv
