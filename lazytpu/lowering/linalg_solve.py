"""Linear algebra by triangular factorization: LU, Cholesky and LDL^T, and
the solves, inverses and determinants computed from them.

torch's ``linalg.*`` functions are mostly CompositeImplicit: ``linalg.inv``
arrives as ``linalg_inv_ex``, ``linalg.solve`` as ``_linalg_solve_ex``,
``linalg.svd``/``svdvals`` as ``_linalg_svd`` (in linalg_spectral),
``linalg.det`` as ``_linalg_det``. Their backward formulas call these ops
again (and ``linalg_lu_solve``, ``triangular_solve``), so forward and
backward share rules.

Note [LAPACK info]: torch's ``*_ex`` ops return LAPACK's ``info`` (0 on
success, ``k`` when the ``k``-th pivot or leading minor fails) next to the
result; they never raise. The rules compute the same ``info`` from the
factorization (a zero pivot of LU; a NaN in a Cholesky factor).

Note [Pivots]: torch's LU pivots are LAPACK's, 1-based and int32; JAX's are
0-based. ``A = P @ L @ U`` in torch, where JAX factors ``A[perm] = L @ U``.

Note [Transposed LU]: for a real input, ``_linalg_det`` and
``_linalg_slogdet`` factor ``A^T`` when ``A`` is contiguous (LAPACK wants
column-major), and their backward formulas solve with ``adjoint`` chosen by
``A.is_contiguous()``. A rule cannot see strides, so real inputs are always
factored transposed: exact for contiguous ``A`` (the usual case); for a
non-contiguous real ``A`` the forward result is right but the gradient
through the returned LU is not.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def conj_transpose(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _broadcast_batch(a, b):
    """``a`` and ``b`` (both matrices) with their batch dims broadcast."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _is_vector_rhs(a, b) -> bool:
    """torch's ``linalg_solve_is_vector_rhs``: ``b`` is a (batch of) vector(s)."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


# -- LU ------------------------------------------------------------------------


def _lu(a):
    """``(lu, torch pivots, perm)`` of ``a`` (Note [Pivots])."""
    lu, pivots, perm = lax.linalg.lu(a)
    return lu, pivots + 1, perm


def _torch_lu(a):
    """``(lu, pivots, perm, adjoint)``: the factorization torch returns for
    ``a`` (Note [Transposed LU]); solving ``A x = b`` with it takes ``adjoint``."""
    if jnp.iscomplexobj(a):
        return (*_lu(a), False)
    return (*_lu(_mT(a)), True)


def _lu_info(lu):
    """The first zero pivot of ``U`` (1-based), else 0 (Note [LAPACK info])."""
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0
    if diag.shape[-1] == 0:
        return jnp.zeros(diag.shape[:-1], jnp.int32)
    return jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)


def _perm_of(pivots, m: int):
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _permutation_matrix(perm, dtype):
    """``P`` with ``A = P @ L @ U`` for JAX's ``A[perm] = L @ U``."""
    return _mT(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype))


def _lu_solve(lu, perm, b, *, adjoint: bool = False):
    """Solve ``A x = b`` (or ``A^H x = b``) for matrices ``b`` from ``A[perm] = L U``."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        x = jnp.take_along_axis(b, perm[..., None], axis=-2)
        x = lax.linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, x, left_side=True, lower=False)
    conj = jnp.iscomplexobj(lu)
    x = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    x = lax.linalg.triangular_solve(
        lu, x, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=conj
    )
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(x, inverse[..., None], axis=-2)


@lowering(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, pivots, _ = _lu(a)
    return lu, pivots, _lu_info(lu)


@lowering(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    lu, _, perm = _lu(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return _permutation_matrix(perm, a.dtype), lower, upper


@lowering(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_data:
        lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        upper = jnp.triu(lu[..., :k, :])
    else:
        lower = upper = jnp.zeros((0,), lu.dtype)
    if unpack_pivots:
        p = _permutation_matrix(_perm_of(pivots, m), lu.dtype)
    else:
        p = jnp.zeros((0,), lu.dtype)
    return p, lower, upper


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    perm = _perm_of(pivots, lu.shape[-1])
    if left:
        return _lu_solve(lu, perm, b, adjoint=adjoint)
    # X A = B  <=>  A^H X^H = B^H  (and X A^H = B  <=>  A X^H = B^H)
    return conj_transpose(_lu_solve(lu, perm, conj_transpose(b), adjoint=not adjoint))


@lowering(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, pivots, perm = _lu(a)
    adjoint = False
    vector = _is_vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    if left:
        x = _lu_solve(lu, perm, rhs, adjoint=adjoint)
    else:  # X A = B  <=>  A^H X^H = B^H
        x = conj_transpose(_lu_solve(lu, perm, conj_transpose(rhs), adjoint=not adjoint))
    return (x[..., 0] if vector else x), lu, pivots, _lu_info(lu)


@lowering(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    lu, _, perm = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, perm, eye), _lu_info(lu)


def _lu_det(lu, pivots):
    """``(sign, log|det|, det)`` from an LU factorization."""
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    n = diag.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(lu.dtype)
    absdiag = jnp.abs(diag)
    unit = jnp.where(absdiag == 0, jnp.ones_like(diag), diag / jnp.where(absdiag == 0, 1, absdiag).astype(diag.dtype))
    sign = parity * jnp.prod(unit, axis=-1)
    sign = jnp.where(jnp.any(absdiag == 0, axis=-1), jnp.zeros_like(sign), sign)
    logabs = jnp.sum(jnp.log(absdiag), axis=-1)
    return sign, logabs, parity * jnp.prod(diag, axis=-1)


@lowering(aten._linalg_det.default)
def linalg_det(a):
    lu, pivots, _, _ = _torch_lu(a)
    return _lu_det(lu, pivots)[2], lu, pivots


@lowering(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    lu, pivots, _, _ = _torch_lu(a)
    sign, logabs, _ = _lu_det(lu, pivots)
    return sign, logabs, lu, pivots


# -- Cholesky, triangular solves -------------------------------------------------


def _cholesky(a, upper: bool):
    lower = lax.linalg.cholesky(a, symmetrize_input=False)
    return conj_transpose(lower) if upper else lower


def _first_bad_minor(a):
    """The order of ``a``'s first non-positive leading minor (lower triangle
    read), by an unblocked outer-product Cholesky; 0 when there is none."""
    n = a.shape[-1]
    rows = jnp.arange(n)

    def step(k, state):
        m, info = state
        d = jnp.real(m[..., k, k])
        bad = ~(d > 0)
        info = jnp.where((info == 0) & bad, k + 1, info)
        col = m[..., :, k] / jnp.sqrt(jnp.where(bad, 1, d))[..., None]
        col = jnp.where(rows > k, col, 0)
        return m - col[..., :, None] * jnp.conj(col[..., None, :]), info

    return lax.fori_loop(0, n, step, (a, jnp.zeros(a.shape[:-2], jnp.int32)))[1]


def _cholesky_info(a, factor):
    """The order of the first non-positive leading minor (Note [LAPACK info]).
    XLA's factor is all NaN when any minor fails, so the order is found by a
    second, unblocked factorization, run only then."""
    if a.shape[-1] == 0:
        return jnp.zeros(a.shape[:-2], jnp.int32)
    failed = jnp.any(jnp.isnan(factor))
    return lax.cond(failed, _first_bad_minor, lambda m: jnp.zeros(m.shape[:-2], jnp.int32), a)


@lowering(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    factor = _cholesky(a, upper)
    return factor, _cholesky_info(conj_transpose(a) if upper else a, factor)


@lowering(aten.cholesky.default)
def cholesky(a, upper=False):
    return _cholesky(a, upper)


def _cholesky_solve(factor, b, upper: bool):
    """Solve ``A x = b`` for ``A = L L^H`` (or ``U^H U``)."""
    factor, b = _broadcast_batch(factor, b)
    conj = jnp.iscomplexobj(factor)
    if upper:
        y = lax.linalg.triangular_solve(factor, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
        return lax.linalg.triangular_solve(factor, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(factor, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=conj)


@lowering(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    return _cholesky_solve(factor, b, upper)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(factor, eye, upper)


def _triangular(a, b, *, upper: bool, left: bool, unit: bool, transpose: bool = False):
    a, b = _broadcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, transpose_a=transpose, unit_diagonal=unit)


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if b.dtype != a.dtype:  # CPU solves in A's dtype (a complex B loses its imaginary part, with torch's warning)
        b = (b if jnp.iscomplexobj(a) else jnp.real(b)).astype(a.dtype)
    return _triangular(a, b, upper=upper, left=left, unit=unitriangular)


@lowering(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    return _triangular(a, b, upper=upper, left=True, unit=unitriangular, transpose=transpose), a


# -- LDL^T (Note [Bunch-Kaufman]) ---------------------------------------------------


# Note [Bunch-Kaufman]: ``linalg_ldl_factor_ex`` replays LAPACK's unblocked
# ``?sytf2`` (lower), which ``?sytrf`` runs for matrices narrower than its
# block size: the same pivot tests (alpha = (1 + sqrt(17)) / 8), the same
# symmetric interchanges of the trailing block only, the same rank-1 and rank-2
# updates, one ``lax.while_loop`` step per pivot. The factor is LAPACK's
# compact form (L below the diagonal, D on it and on the subdiagonal of 2x2
# blocks; the upper triangle zero, as torch's ``tril`` before the call), pivots
# 1-based and negative for 2x2 blocks. ``linalg_ldl_solve`` replays ``?sytrs``.


def _sytf2(a, herm: bool):
    """``?sytf2``, or ``?hetf2`` for ``herm``: the Hermitian factorization
    ``L D L^H``, whose diagonal is real and whose updates conjugate."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    alpha = (1 + 17**0.5) / 8
    a = jnp.tril(a)
    conj = jnp.conj if herm else (lambda v: v)
    diag = idx[:, None] == idx[None, :]

    def sym(m):
        m = jnp.tril(m) + conj(jnp.tril(m, -1)).T
        return jnp.where(diag, m.real.astype(m.dtype), m) if herm else m

    def size(v):  # a diagonal entry's: ``?hetf2`` reads its real part only
        return jnp.abs(v.real) if herm else cabs1(v)

    def cabs1(v):  # LAPACK's size of a pivot candidate: |re| + |im| for complex (``csytf2``)
        return jnp.abs(v.real) + jnp.abs(v.imag) if jnp.iscomplexobj(v) else jnp.abs(v)

    def first_argmax(v, mask):
        v = jnp.where(mask, cabs1(v), -1)
        return jnp.argmax(v), jnp.max(v)

    def body(state):
        a, ipiv, k, info = state
        m = sym(a)
        absakk = size(m[k, k])
        imax, colmax = first_argmax(m[:, k], idx > k)
        colmax = jnp.where(k < n - 1, colmax, 0)
        jmax, rowmax = first_argmax(m[imax], (idx >= k) & (idx != imax))
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        one_k = singular | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        one_imax = ~one_k & (size(m[imax, imax]) >= alpha * rowmax)
        kstep = jnp.where(one_k | one_imax, 1, 2)
        kp = jnp.where(one_k, k, imax)
        kk = k + kstep - 1
        # the symmetric interchange of kk and kp in the trailing block
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trail = (idx[:, None] >= k) & (idx[None, :] >= k)
        m = jnp.where(trail, m[perm][:, perm], m)
        a = jnp.where(trail, jnp.tril(m), a)
        below = idx > k
        # 1x1 pivot: A22 -= x (d11 x)^T, x *= d11
        d11 = 1 / (m[k, k].real if herm else m[k, k])
        x = jnp.where(below, m[:, k], 0)
        upd1 = a - x[:, None] * conj(d11 * x)[None, :]
        col1 = x * d11
        # 2x2 pivot
        rows2 = idx > k + 1
        ck, ck1 = m[:, k], m[:, jnp.minimum(k + 1, n - 1)]
        if herm:
            d = jnp.abs(m[k + 1, k])
            e11, e22 = m[k + 1, k + 1].real / d, m[k, k].real / d
            d21, scale = m[k + 1, k] / d, 1 / (e11 * e22 - 1) / d
            wk = jnp.where(rows2, scale * (e11 * ck - d21 * ck1), 0)
            wkp1 = jnp.where(rows2, scale * (e22 * ck1 - jnp.conj(d21) * ck), 0)
        else:
            d21 = m[k + 1, k]
            e11, e22 = m[k + 1, k + 1] / d21, m[k, k] / d21
            scale = 1 / (e11 * e22 - 1) / d21
            wk = jnp.where(rows2, scale * (e11 * ck - ck1), 0)
            wkp1 = jnp.where(rows2, scale * (e22 * ck1 - ck), 0)
        upd2 = (
            a
            - jnp.where(rows2, ck, 0)[:, None] * conj(wk)[None, :]
            - jnp.where(rows2, ck1, 0)[:, None] * conj(wkp1)[None, :]
        )
        block1 = (idx[:, None] > k) & (idx[None, :] > k)
        block2 = (idx[:, None] > k + 1) & (idx[None, :] > k + 1)
        new1 = jnp.where(block1, jnp.tril(upd1), a)
        new1 = new1.at[:, k].set(jnp.where(below, col1, a[:, k]))
        new2 = jnp.where(block2, jnp.tril(upd2), a)
        new2 = new2.at[:, k].set(jnp.where(rows2, wk, a[:, k]))
        new2 = new2.at[:, jnp.minimum(k + 1, n - 1)].set(jnp.where(rows2, wkp1, a[:, jnp.minimum(k + 1, n - 1)]))
        a = jnp.where(singular, a, jnp.where(kstep == 1, new1, new2))
        if herm:  # the diagonal stays real (``?hetf2``)
            a = jnp.where(diag, a.real.astype(a.dtype), a)
        info = jnp.where(singular & (info == 0), k + 1, info)
        piv = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        ipiv = jnp.where((idx == k) | ((kstep == 2) & (idx == k + 1)), piv, ipiv)
        return a, ipiv, k + kstep, info

    state = (a, jnp.zeros(n, jnp.int32), jnp.int32(0), jnp.int32(0))
    a, ipiv, _, info = lax.while_loop(lambda s: s[2] < n, body, state)
    return a, ipiv, info


@lowering(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0:
        return a, jnp.zeros(batch + (0,), jnp.int32), jnp.zeros(batch, jnp.int32)
    flat = a.reshape((-1, n, n))
    herm = hermitian and jnp.iscomplexobj(a)
    ld, piv, info = jax.vmap(functools.partial(_sytf2, herm=herm))(flat)
    return ld.reshape(a.shape), piv.reshape(batch + (n,)), info.reshape(batch)


def _sytrs(ld, ipiv, b, herm: bool):
    """``?sytrs`` (lower): solve ``L D L^T P X = P B`` with LAPACK's pivots;
    ``?hetrs`` for ``herm`` (``L D L^H``)."""
    n = ld.shape[-1]
    idx = jnp.arange(n)
    conj = jnp.conj if herm else (lambda v: v)

    def swap(b, i, j):
        perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return b[perm]

    def forward(state):
        b, k = state
        two = ipiv[k] < 0
        kp = jnp.abs(ipiv[k]) - 1
        k1 = jnp.minimum(k + 1, n - 1)
        b = swap(b, jnp.where(two, k1, k), kp)
        # 1x1
        below = (idx > k)[:, None]
        b1 = b - jnp.where(below, ld[:, k][:, None], 0) * b[k][None, :]
        b1 = b1.at[k].set(b1[k] * (1 / ld[k, k]))
        # 2x2
        below2 = (idx > k + 1)[:, None]
        b2 = b - jnp.where(below2, ld[:, k][:, None], 0) * b[k][None, :]
        b2 = b2 - jnp.where(below2, ld[:, k1][:, None], 0) * b2[k1][None, :]
        akm1k = ld[k1, k]
        akm1, ak = ld[k, k] / conj(akm1k), ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = b2[k] / conj(akm1k), b2[k1] / akm1k
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, b2, b1), k + jnp.where(two, 2, 1)

    def backward(state):
        b, k = state
        two = ipiv[k] < 0
        kp = jnp.abs(ipiv[k]) - 1
        below = (idx > k)[:, None]
        b = b.at[k].add(-jnp.sum(jnp.where(below, conj(ld[:, k])[:, None] * b, 0), axis=0))
        km1 = jnp.maximum(k - 1, 0)
        b = jnp.where(two, b.at[km1].add(-jnp.sum(jnp.where(below, conj(ld[:, km1])[:, None] * b, 0), axis=0)), b)
        return swap(b, k, kp), k - jnp.where(two, 2, 1)

    b, _ = lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.int32(0)))
    b, _ = lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.int32(n - 1)))
    return b


@lowering(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False):
    n = ld.shape[-1]
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    if n == 0 or b.shape[-1] == 0:
        return jnp.zeros(batch + b.shape[-2:], b.dtype)
    ld = jnp.broadcast_to(ld, batch + ld.shape[-2:]).reshape((-1, n, n))
    pivots = jnp.broadcast_to(pivots, batch + (n,)).reshape((-1, n))
    k = b.shape[-1]
    bb = jnp.broadcast_to(b, batch + (n, k)).reshape((-1, n, k))
    herm = hermitian and jnp.iscomplexobj(ld)
    return jax.vmap(functools.partial(_sytrs, herm=herm))(ld, pivots, bb).reshape(batch + (n, k))
