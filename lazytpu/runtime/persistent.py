"""The on-disk cache of compiled programs (``LAZYTPU_CACHE_DIR``).

An entry is keyed by the SHA-256 of the program's StableHLO text, the JAX
version and the device kind, so the same program in a fresh process loads
instead of compiling. Note [Cache integrity]: the directory is created 0700
and entries 0600; an entry is loaded only if it is owned by this user, not
writable by others, and its header names the expected key and the SHA-256 of
its payload. Anything else is ignored with a warning (and recompiled) —
never executed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import tempfile
import warnings
from pathlib import Path

import jax
from jax.experimental import serialize_executable

from lazytpu import _config, metrics

_MAGIC = b"LAZYTPU-XLA-1\n"


def cache_dir() -> Path | None:
    """The cache directory, or None when disabled (``LAZYTPU_CACHE_DIR=off``)."""
    raw = _config.CACHE_DIR.get()
    if raw is not None and raw.strip().lower() in ("off", "0", "none", "false"):
        return None
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lazytpu"


def _ensure_dir(path: Path) -> bool:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        warnings.warn(f"lazytpu: compile cache disabled: cannot create {path}: {exc}", stacklevel=4)
        return False
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        warnings.warn(f"lazytpu: compile cache {path} is not private to this user; not using it", stacklevel=4)
        return False
    return True


def _entry_key(text: str, device, signature: str) -> str:
    h = hashlib.sha256()
    for part in (jax.__version__, device.platform, device.device_kind, str(device.id), signature, text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _load(path: Path, key: str, device):
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError("entry is not owned by this user or is writable by others")
        blob = path.read_bytes()
        if not blob.startswith(_MAGIC):
            raise ValueError("bad header")
        header, payload = blob[len(_MAGIC) : len(_MAGIC) + 129], blob[len(_MAGIC) + 129 :]
        entry_key, digest = header[:64].decode(), header[65:129].decode()
        if entry_key != key:
            raise ValueError("key mismatch")
        if hashlib.sha256(payload).hexdigest() != digest:
            raise ValueError("payload digest mismatch (corrupted)")
        serialized, in_tree, out_tree = pickle.loads(payload)
        return serialize_executable.deserialize_and_load(serialized, in_tree, out_tree, execution_devices=[device])
    except FileNotFoundError:
        return None
    except Exception as exc:  # never execute what does not verify
        warnings.warn(f"lazytpu: ignoring compile-cache entry {path.name}: {exc}", stacklevel=4)
        return None


def _store(path: Path, key: str, compiled) -> None:
    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception:  # some executables cannot be serialized: just don't cache them
        return
    header = key.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + header + payload)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def load_or_compile(lowered, device, signature: str):
    """``lowered.compile()``, through the disk cache when it is enabled.

    ``signature`` describes the call (input avals, donation): the StableHLO
    text alone does not, since jit prunes unused inputs from it.
    """
    root = cache_dir()
    if root is None or not _ensure_dir(root):
        return lowered.compile()
    key = _entry_key(lowered.as_text(), device, signature)
    path = root / key
    compiled = _load(path, key, device)
    if compiled is not None:
        metrics.add("disk_cache_hits")
        return compiled
    metrics.add("disk_cache_misses")
    compiled = lowered.compile()
    _store(path, key, compiled)
    return compiled


def clear() -> None:
    """Delete every entry of the disk cache."""
    root = cache_dir()
    if root is None or not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.is_file() and len(entry.name) == 64:
            entry.unlink(missing_ok=True)


def disk_usage() -> tuple[int, int]:
    """(entries, bytes) of the disk cache."""
    root = cache_dir()
    if root is None or not root.is_dir():
        return 0, 0
    files = [e for e in root.iterdir() if e.is_file() and len(e.name) == 64]
    return len(files), sum(e.stat().st_size for e in files)
