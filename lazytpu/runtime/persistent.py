"""The on-disk cache of compiled programs (``LAZYTPU_CACHE_DIR``).

An entry is keyed by the SHA-256 of the program's StableHLO text, the call's
signature, the device, and the compiler's versions and flags (Note [Compiler
flags in the key]), so the same program in a fresh process loads instead of
compiling.

Note [Cache integrity]: an entry holds XLA's own serialized executable (the
bytes of the PJRT client's ``serialize``, compressed as JAX's own persistent
cache compresses them) behind a header naming its key and the SHA-256 of the
payload. Nothing in it is unpickled: ``jax.experimental.serialize_executable``
pickles (its ``deserialize_and_load`` would run whatever a crafted entry
names), so it is not used. A loaded executable still runs machine code that
the entry holds, so an entry is trusted only when nobody but this user can
have written it: the directory must be owned by this user and not writable
by group or others (it is created 0700), and an entry must be a regular file
(symlinks are refused: opened with ``O_NOFOLLOW``), owned by this user, not
writable by others, with the expected key and digest (entries are written
0600). Anything else is ignored with a warning and compiled again. An
unusable directory, or one that cannot be written (read-only: its entries
are still loaded), gives one warning and the process carries on without that
part of the cache.

Note [Loading through jax]: the Python side of a compiled program (its
input and output shardings, layouts, pruned inputs, the C++ dispatch path)
is rebuilt by jax itself from the ``Lowered`` this process made anyway:
``lowered.compile()`` runs with jax's persistent-cache hook (the module
global ``jax._src.compilation_cache._cache``) set, for this one compile on
this thread, to an object that hands jax the verified entry; jax then calls
the PJRT client's ``deserialize_executable`` instead of compiling. The hook
is restored right after, so jax's own cache (``jax_compilation_cache_dir``)
and other threads' compiles are untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path

import attrs
import jax
import jaxlib
from jax._src import cache_key as jax_cache_key
from jax._src import compilation_cache as jax_cache

from lazytpu import _caches, _config, metrics
from lazytpu.ir.source import user_stacklevel

_MAGIC = b"LAZYTPU-XLA-2\n"
_HEADER = len(_MAGIC) + 64 + 1 + 64  # magic, key, "\n", payload digest
# What the payload is compressed with (jax_cache.compress_executable): part of the key.
_COMPRESSION = "zstd" if jax_cache.zstd or jax_cache.zstandard else "zlib"


def cache_dir() -> Path | None:
    """The cache directory, or None when disabled (``LAZYTPU_CACHE_DIR=off``)."""
    raw = _config.CACHE_DIR.get()
    if raw is not None and raw.strip().lower() in ("off", "0", "none", "false"):
        return None
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lazytpu"


def written_only_by_this_user(info: os.stat_result) -> bool:
    """Whether ``info`` (a file's or directory's stat) says that nobody but
    this user can have written it (Note [Cache integrity])."""
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@attrs.define
class _Directory:
    """What this process found out about one cache directory (once)."""

    path: Path
    usable: bool
    writable: bool = True


class _Directories:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.known: dict[Path, _Directory] = {}

    def clear(self) -> None:
        with self.lock:
            self.known.clear()


_DIRECTORIES = _caches.table("compile_cache_directories", _Directories)


def _open_directory(path: Path) -> _Directory:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        warnings.warn(f"lazytpu: compile cache disabled: cannot create {path}: {exc}", stacklevel=user_stacklevel())
        return _Directory(path, usable=False)
    if not stat.S_ISDIR(info.st_mode) or not written_only_by_this_user(info):
        warnings.warn(
            f"lazytpu: compile cache {path} is not a directory private to this user "
            "(owned by this user, not writable by group or others); not using it",
            stacklevel=user_stacklevel(),
        )
        return _Directory(path, usable=False)
    return _Directory(path, usable=True)


def _directory() -> _Directory | None:
    root = cache_dir()
    if root is None:
        return None
    with _DIRECTORIES.lock:
        found = _DIRECTORIES.known.get(root)
        if found is None:
            found = _DIRECTORIES.known[root] = _open_directory(root)
    return found if found.usable else None


# Note [Rounding per op]: CPU torch rounds each op's result to its dtype; a
# chain of bfloat16 or float16 ops rounds after every op (``(x @ y) + z``:
# the product is rounded, then the sum). XLA by default may keep a fused
# chain's intermediates in float32 ("excess precision") and drop a convert
# pair that rounds (bf16 -> f32 of f32 -> bf16), so a deferred program gave
# other numbers than CPU (1,156 of 4,096 elements of that sum; Muon's bf16
# Newton-Schulz steps moved parameters by up to 6e-4). Every program is
# compiled without it, as CUDA's kernels round too; float32 programs compile
# as before.
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}


def compile_program(lowered):
    """``lowered`` compiled as every lazytpu program is (Note [Rounding per op])."""
    return lowered.compile(compiler_options=COMPILER_OPTIONS)


def _compiler_flags() -> tuple[str, ...]:
    """The XLA flags a program was compiled under (Note [Compiler flags in the key])."""
    raw = f"{os.environ.get('XLA_FLAGS', '')} {os.environ.get('LIBTPU_INIT_ARGS', '')}".split()
    ignored = set(getattr(jax_cache_key, "xla_flags_to_exclude_from_cache_key", ()))
    options = (f"{name}={value}" for name, value in sorted(COMPILER_OPTIONS.items()))
    return (*sorted(f for f in raw if f.split("=")[0] not in ignored), *options)


# Note [Compiler flags in the key]: an executable depends on more than its
# program: on the XLA flags it was compiled under (``XLA_FLAGS``: the CPU's
# instruction set, fast math; ``LIBTPU_INIT_ARGS``) and on the compiler's
# version (jaxlib's, and the platform's: libtpu's on TPU). All are in the key,
# as in jax's own cache key (the same flags excluded: dump options, the host
# device count), so a process that changes them compiles again instead of
# loading an executable built for other settings.
def _entry_key(text: str, device, signature: str) -> str:
    h = hashlib.sha256()
    parts = (_MAGIC.decode(), _COMPRESSION, jax.__version__, jaxlib.__version__, device.client.platform_version)
    parts += (device.platform, device.device_kind, str(device.id), *_compiler_flags())
    for part in (*parts, signature, text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _read_entry(path: Path, key: str) -> bytes:
    """The verified payload of the entry at ``path``; raises ValueError
    (FileNotFoundError when there is none) for anything untrusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise  # no entry: not news
    except OSError as exc:  # ELOOP: a symlink
        raise ValueError(f"cannot open it without following links: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if not written_only_by_this_user(info):
            raise ValueError("not owned by this user, or writable by others")
        blob = f.read()
    if not blob.startswith(_MAGIC) or len(blob) < _HEADER:
        raise ValueError("bad header")
    header, payload = blob[len(_MAGIC) : _HEADER], blob[_HEADER:]
    if header[:64].decode(errors="replace") != key:
        raise ValueError("key mismatch")
    if hashlib.sha256(payload).hexdigest() != header[65:].decode(errors="replace"):
        raise ValueError("payload digest mismatch (corrupted)")
    return payload


class _ServedEntry(jax_cache.CacheInterface):
    """Jax's persistent-cache hook for one compile (Note [Loading through
    jax]): the first lookup on the compiling thread gets the entry; every
    other lookup goes to the hook that was there before."""

    def __init__(self, payload: bytes, previous) -> None:
        self._path = Path()
        self.payload = payload
        self.previous = previous
        self.thread = threading.get_ident()
        self.served = False

    def get(self, key: str):
        if threading.get_ident() == self.thread and not self.served:
            self.served = True
            return self.payload
        return None if self.previous is None else self.previous.get(key)

    def put(self, key: str, value: bytes) -> None:
        if threading.get_ident() != self.thread and self.previous is not None:
            self.previous.put(key, value)


_HOOK_LOCK = threading.Lock()
_JAX_READ_ERROR = "Error reading persistent compilation cache entry"


@contextlib.contextmanager
def _serving(payload: bytes):
    with _HOOK_LOCK:
        previous = jax_cache._cache
        entry = jax_cache._cache = _ServedEntry(payload, previous)
        try:
            yield entry
        finally:
            jax_cache._cache = previous


def _load(lowered, path: Path, payload: bytes):
    """``lowered.compile()`` with the entry's executable, and whether it was
    loaded (else jax compiled it: XLA refused the entry, or jax's cache hook
    is off, ``jax_enable_compilation_cache=False``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _serving(payload) as entry:
            compiled = compile_program(lowered)
    loaded = entry.served
    for w in caught:
        if str(w.message).startswith(_JAX_READ_ERROR):
            loaded = False
            warnings.warn(
                f"lazytpu: ignoring compile-cache entry {path.name}: {w.message}", stacklevel=user_stacklevel()
            )
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return compiled, loaded


def _store(root: _Directory, path: Path, key: str, compiled, seconds: float) -> None:
    try:
        serialized = compiled.runtime_executable().serialize()
    except Exception:  # some executables cannot be serialized: just don't cache them
        return
    payload = jax_cache.compress_executable(jax_cache.combine_executable_and_time(serialized, int(seconds)))
    header = key.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=root.path, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + header + payload)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        with _DIRECTORIES.lock:
            first, root.writable = root.writable, False
        if first:
            warnings.warn(
                f"lazytpu: cannot write to the compile cache {root.path} ({exc}): new programs are compiled "
                "but not stored; entries already there are still loaded",
                stacklevel=user_stacklevel(),
            )


def load_or_compile(lowered, device, signature: str):
    """``lowered.compile()``, through the disk cache when it is enabled.

    ``signature`` describes the call (input avals, donation): the StableHLO
    text alone does not, since jit prunes unused inputs from it.
    """
    root = _directory()
    if root is None:
        return compile_program(lowered)
    key = _entry_key(lowered.as_text(), device, signature)
    path = root.path / key
    try:
        payload = _read_entry(path, key)
    except FileNotFoundError:
        payload = None
    except (OSError, ValueError) as exc:  # never load what does not verify
        warnings.warn(f"lazytpu: ignoring compile-cache entry {path.name}: {exc}", stacklevel=user_stacklevel())
        payload = None
    start = time.monotonic()
    if payload is not None:
        compiled, loaded = _load(lowered, path, payload)
        if loaded:
            metrics.add("disk_cache_hits")
            return compiled
    else:
        compiled = compile_program(lowered)
    metrics.add("disk_cache_misses")
    if root.writable:
        _store(root, path, key, compiled, time.monotonic() - start)
    return compiled


def _entries(root: Path) -> list[Path]:
    return [e for e in root.iterdir() if len(e.name) == 64 and e.is_file() and not e.is_symlink()]


def clear() -> None:
    """Delete every entry of the disk cache."""
    root = cache_dir()
    if root is None or not root.is_dir():
        return
    for entry in _entries(root):
        entry.unlink(missing_ok=True)


def disk_usage() -> tuple[int, int]:
    """(entries, bytes) of the disk cache."""
    root = cache_dir()
    if root is None or not root.is_dir():
        return 0, 0
    files = _entries(root)
    return len(files), sum(e.stat().st_size for e in files)
