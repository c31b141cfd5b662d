"""The on-disk compile cache across processes, its permissions and integrity."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import stat
import subprocess
import sys
import tempfile
import warnings

import pytest
import torch

import lazytpu
from lazytpu import _config, runtime
from lazytpu.runtime import executor, persistent

SCRIPT = """
import json, warnings, torch, lazytpu
warnings.simplefilter("always")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8).to("tpu")
for _ in range(3):
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
lazytpu.sync()  # the last step's program (Note [Step boundary]) runs here, outside the block below
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loss = model(x).square().mean().item()
snap = lazytpu.metrics.snapshot()
print(json.dumps({"loss": loss, "hits": snap["disk_cache_hits"], "misses": snap["disk_cache_misses"],
                  "compiled": snap["programs_compiled"]}))
"""


def _run(cache_dir, extra_env=None):
    env = dict(os.environ, LAZYTPU_CACHE_DIR=str(cache_dir), **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_second_process_loads_instead_of_compiling(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(cache)
    assert first["misses"] == first["compiled"] > 0 and first["hits"] == 0
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    entries = [p for p in cache.iterdir() if len(p.name) == 64]
    assert entries and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in entries)
    second, _ = _run(cache)
    assert second["misses"] == 0 and second["hits"] == second["compiled"] == first["compiled"]
    assert second["loss"] == first["loss"]


def test_other_compiler_flags_compile_again(tmp_path):
    """An executable built under other XLA flags (here another instruction set: no fused multiply-adds)
    is not loaded (Note [Compiler flags in the key])."""
    cache = tmp_path / "cache"
    first, _ = _run(cache)
    other, _ = _run(cache, {"XLA_FLAGS": "--xla_cpu_max_isa=AVX"})
    assert other["hits"] == 0 and other["misses"] == other["compiled"] == first["compiled"]
    again, _ = _run(cache)
    assert again["misses"] == 0 and again["hits"] == first["compiled"]
    dumped, _ = _run(cache, {"XLA_FLAGS": f"--xla_dump_to={tmp_path / 'dump'}"})  # excluded, as in jax's key
    assert dumped["misses"] == 0


def test_corrupted_or_foreign_entries_are_ignored(tmp_path):
    cache = tmp_path / "cache"
    first, _ = _run(cache)
    entries = sorted(p for p in cache.iterdir() if len(p.name) == 64)
    blob = bytearray(entries[0].read_bytes())
    blob[-10] ^= 0xFF
    entries[0].write_bytes(bytes(blob))
    os.chmod(entries[1], 0o666)  # writable by others: not trusted
    again, stderr = _run(cache)
    assert "ignoring compile-cache entry" in stderr
    assert again["misses"] == 2 and again["loss"] == first["loss"]


def test_cache_off_writes_nothing(tmp_path):
    env = dict(os.environ, LAZYTPU_CACHE_DIR="off", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["hits"] == result["misses"] == 0
    assert not (tmp_path / "xdg").exists()


def test_cache_info_and_clear_caches():
    (torch.ones(3).to("tpu") * 2).cpu()
    info = runtime.cache_info()
    assert {"entries", "hits", "misses", "bytes", "disk_entries"} <= set(info)
    assert info["entries"] > 0 and info["disk_entries"] > 0 and info["bytes"] > 0
    runtime.clear_caches()
    assert runtime.cache_info()["entries"] == 0
    lazytpu.metrics.reset()
    (torch.ones(3).to("tpu") * 2).cpu()
    snap = lazytpu.metrics.snapshot()
    assert snap["programs_compiled"] == 1 and snap["disk_cache_hits"] == 1
    runtime.clear_caches(disk=True)
    assert runtime.cache_info()["disk_entries"] == 0


# -- in-process: what is trusted, and directories that cannot be used (Note [Cache integrity]) ----------------


@pytest.fixture
def cache(tmp_path):
    """A fresh, not yet created cache directory for this test."""
    root = tmp_path / "cache"
    runtime.clear_caches()
    with _config.CACHE_DIR.override(str(root)):
        yield root
    if root.is_dir():
        os.chmod(root, 0o700)
    runtime.clear_caches()


def _fresh_run(n: int) -> dict:
    """Run one program (a shape of its own) with an empty in-memory program
    cache, checked against CPU torch; the metrics of that run."""
    executor._CACHE.clear()
    lazytpu.metrics.reset()
    x = torch.arange(float(n))  # read from a device buffer: a program each time (Note [Constant reads])
    torch.testing.assert_close((x.to("tpu") * 5 + 1).cpu(), x * 5 + 1)
    return lazytpu.metrics.snapshot()


def _entry_of(root, n: int):
    before = set(root.iterdir()) if root.is_dir() else set()
    assert _fresh_run(n)["disk_cache_misses"] == 1
    (entry,) = [p for p in set(root.iterdir()) - before if len(p.name) == 64]
    return entry


def _cache_warnings(caught, text: str) -> list:
    return [w for w in caught if text in str(w.message)]


class _CreatesFile:
    """Unpickling this creates ``path``: what a crafted entry could do."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_crafted_pickle_entry_is_never_executed(cache, tmp_path):
    entry = _entry_of(cache, 401)
    marker = tmp_path / "created-by-the-entry"
    payload = pickle.dumps(_CreatesFile(marker))
    digest = hashlib.sha256(payload).hexdigest().encode()
    entry.write_bytes(persistent._MAGIC + entry.name.encode() + b"\n" + digest + payload)  # a valid header
    with pytest.warns(UserWarning, match="ignoring compile-cache entry"):
        snap = _fresh_run(401)
    assert not marker.exists()
    assert snap["disk_cache_hits"] == 0 and snap["disk_cache_misses"] == 1
    assert _fresh_run(401)["disk_cache_hits"] == 1  # the entry was written again, and loads


UNTRUSTED = ["a symlink", "writable by others"] + (["owned by another user"] if os.getuid() == 0 else [])


@pytest.mark.parametrize("how", UNTRUSTED)
def test_untrusted_entries_are_refused(cache, tmp_path, how):
    entry = _entry_of(cache, 411 + UNTRUSTED.index(how))
    if how == "a symlink":  # to a valid entry of this user's, elsewhere
        elsewhere = tmp_path / "elsewhere"
        os.replace(entry, elsewhere)
        entry.symlink_to(elsewhere)
    elif how == "writable by others":
        os.chmod(entry, 0o666)
    else:
        os.chown(entry, 4321, -1)
    with pytest.warns(UserWarning, match="ignoring compile-cache entry"):
        snap = _fresh_run(411 + UNTRUSTED.index(how))
    assert snap["disk_cache_hits"] == 0 and snap["disk_cache_misses"] == 1


def test_ownership_check_reads_owner_and_mode():
    def stat_of(uid: int, mode: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))

    me = os.getuid()
    assert persistent.written_only_by_this_user(stat_of(me, stat.S_IFREG | 0o600))
    assert persistent.written_only_by_this_user(stat_of(me, stat.S_IFDIR | 0o755))
    assert not persistent.written_only_by_this_user(stat_of(me + 1, stat.S_IFREG | 0o600))
    assert not persistent.written_only_by_this_user(stat_of(me, stat.S_IFREG | 0o620))
    assert not persistent.written_only_by_this_user(stat_of(me, stat.S_IFDIR | 0o777))


BAD_DIRS = ["open to others", "a file"] + (["owned by another user"] if os.getuid() == 0 else [])


@pytest.mark.parametrize("how", BAD_DIRS)
def test_an_untrusted_cache_directory_is_not_used_and_warned_once(cache, how):
    if how == "a file":
        cache.write_text("")
    else:
        cache.mkdir(mode=0o700)
        if how == "open to others":
            os.chmod(cache, 0o777)
        else:
            os.chown(cache, 4321, -1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snaps = [_fresh_run(421 + 3 * BAD_DIRS.index(how) + i) for i in range(3)]
    assert len(_cache_warnings(caught, "compile cache")) == 1
    assert all(s["disk_cache_hits"] == s["disk_cache_misses"] == 0 for s in snaps)
    assert not cache.is_dir() or not [p for p in cache.iterdir() if len(p.name) == 64]


def test_a_read_only_cache_directory_still_serves_its_entries(cache, monkeypatch):
    _fresh_run(431)
    os.chmod(cache, 0o500)

    def read_only(*args, **kwargs):  # what a read-only mount says (root ignores mode bits)
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hit, new, newer = _fresh_run(431), _fresh_run(432), _fresh_run(433)
    assert hit["disk_cache_hits"] == 1
    assert new["disk_cache_misses"] == newer["disk_cache_misses"] == 1
    assert len(_cache_warnings(caught, "cannot write to the compile cache")) == 1


DUMP_DIRS = ["a file", "under a file", "not creatable"]


@pytest.mark.parametrize("how", DUMP_DIRS)
def test_a_bad_dump_dir_warns_once_and_programs_run(tmp_path, how):
    file = tmp_path / "file"
    file.write_text("")
    path = {"a file": file, "under a file": file / "dumps", "not creatable": "/proc/lazytpu-dumps"}[how]
    runtime.clear_caches()
    with _config.DUMP_DIR.override(str(path)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            _fresh_run(441 + 3 * DUMP_DIRS.index(how) + i)
        compiled = torch.compile(lambda x: x * 2 + 1, backend="tpu", dynamic=False)
        torch.testing.assert_close(compiled(torch.ones(3, device="tpu")).cpu(), torch.full((3,), 3.0))
    assert len(_cache_warnings(caught, "LAZYTPU_DUMP_DIR")) == 1
    assert file.read_text() == ""
