"""The on-disk compile cache across processes, its permissions and integrity."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import torch

import lazytpu
from lazytpu import runtime

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
