"""Every environment variable lazytpu reads is checked at ``import lazytpu``:
a bad value is an error there, naming the variable and the valid values."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lazytpu import _config


def _import_lazytpu(env: dict, code: str = "") -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAZYTPU_", "TORCHTPU_", "TORCH_TPU_"))}
    full["LAZYTPU_CACHE_DIR"] = os.environ["LAZYTPU_CACHE_DIR"]  # the session's private cache (conftest)
    full.update(env)
    script = "import lazytpu\nprint('imported')\n" + code
    return subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=300)


def _not_a_dir(tmp_path) -> str:
    path = tmp_path / "a-file"
    path.write_text("")
    return str(path)


POSITIVE = ": expected a positive integer"
BOOLEAN = ": expected one of 1, true, yes, on, 0, false, no, off"
NOT_A_DIR = ": expected a directory path ({f} is not a directory)"

# (variable, value, the error message after "variable='value'"); {f} is a path to a plain file
BAD = [
    ("LAZYTPU_MAX_PENDING_OPS", "0", POSITIVE),
    ("LAZYTPU_MAX_PENDING_OPS", "-5", POSITIVE),
    ("LAZYTPU_MAX_PENDING_OPS", "1e4", POSITIVE),
    ("LAZYTPU_MAX_PENDING_DEPTH", "0", POSITIVE),
    ("LAZYTPU_PROGRAM_CACHE_SIZE", "0", POSITIVE),
    ("LAZYTPU_PROGRAM_CACHE_SIZE", "many", POSITIVE),
    (
        "LAZYTPU_DEBUG",
        "recompile,bonds",
        ": unknown item 'bonds'; expected a comma-separated list of bounds, recompile",
    ),
    ("LAZYTPU_PLATFORM", "tpux", ": expected one of tpu, gpu, cpu"),
    ("LAZYTPU_PLATFORM", "cuda", ": expected one of tpu, gpu, cpu"),
    ("LAZYTPU_CPU_FALLBACK", "maybe", BOOLEAN),
    ("LAZYTPU_SYNC_ON_OPTIMIZER_STEP", "2", BOOLEAN),
    ("LAZYTPU_STEP_SEGMENTS", "sometimes", BOOLEAN),
    ("LAZYTPU_GC_FREEZE", "later", BOOLEAN),
    ("TORCH_TPU_DEFER_AND_FUSE", "defer", BOOLEAN),
    ("LAZYTPU_VALUE_CHECKS", "no-thanks", BOOLEAN),
    ("TORCHTPU_EAGER_MODE", "turbo", " is not valid: expected one of defer, strict, strict-blocking"),
    ("LAZYTPU_DUMP_DIR", "{f}", NOT_A_DIR),
    ("LAZYTPU_DUMP_DIR", "{f}/sub", NOT_A_DIR),
    ("LAZYTPU_CACHE_DIR", "{f}", NOT_A_DIR + ", or one of off, 0, none, false to disable the cache"),
]


FLAG_OF = {flag.env: flag for flag in _config.FLAGS}


@pytest.mark.parametrize(("env", "value", "error"), BAD, ids=[f"{e}={v}" for e, v, _ in BAD])
def test_bad_value_is_an_error_naming_the_variable_and_the_valid_values(tmp_path, env, value, error):
    f = _not_a_dir(tmp_path)
    value = value.format(f=f)
    expected = f"{env}={value!r}{error.format(f=f)}"
    if env == _config.EAGER_MODE.env:  # parsed by the engine at import (the mode enum lives there)
        out = _import_lazytpu({env: value})
        assert out.stderr.strip().splitlines()[-1] == f"ValueError: {expected}"
        return
    with pytest.raises(ValueError) as info:
        FLAG_OF[env].parse(env, value)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("LAZYTPU_MAX_PENDING_OPS", "0"),
        ("LAZYTPU_DEBUG", "bonds"),
        ("LAZYTPU_PLATFORM", "tpux"),
        ("LAZYTPU_DUMP_DIR", "{f}"),
    ],
)
def test_bad_value_fails_at_import(tmp_path, env, value):
    value = value.format(f=_not_a_dir(tmp_path))
    out = _import_lazytpu({env: value})
    assert out.returncode != 0 and "imported" not in out.stdout
    assert out.stderr.strip().splitlines()[-1].startswith(f"ValueError: {env}={value!r}: ")
    assert 'File "<string>", line 1, in <module>' in out.stderr  # raised by `import lazytpu`


@pytest.mark.parametrize(
    ("platform", "env", "present"), [("tpu", {}, "cpu"), ("gpu", {}, "cpu"), ("cpu", {"JAX_PLATFORMS": "tpu"}, "none")]
)
def test_absent_platform_fails_at_import_naming_what_is_present(platform, env, present):
    """On this machine (XLA:CPU only) tpu and gpu are absent, and JAX_PLATFORMS=tpu leaves
    nothing (Note [Platform at import])."""
    from lazytpu.runtime.platform import possible_platforms

    assert possible_platforms() == ("cpu",)  # the machine these expectations are for
    out = _import_lazytpu({"LAZYTPU_PLATFORM": platform, **env})
    assert out.returncode != 0 and "imported" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert (
        last == f"RuntimeError: LAZYTPU_PLATFORM='{platform}' but no {platform} device is present; present: {present}"
    )
    assert 'File "<string>", line 1, in <module>' in out.stderr


def test_valid_values_import_and_start_no_device(tmp_path):
    """Every flag set to a valid value: the import succeeds, the values are parsed, and no PJRT
    client is started at import (Note [Platform at import])."""
    code = (
        "from lazytpu import _config\n"
        "from jax._src import xla_bridge\n"
        "print(sorted(_config.DEBUG.get()), _config.MAX_PENDING_OPS.get(), _config.PROGRAM_CACHE_SIZE.get(),\n"
        "      _config.PLATFORM.get(),\n"
        "      _config.CPU_FALLBACK.get(), _config.SYNC_ON_OPTIMIZER_STEP.get(), _config.DEFER_AND_FUSE.get(),\n"
        "      _config.DUMP_DIR.get(), _config.CACHE_DIR.get(), xla_bridge.backends_are_initialized())\n"
    )
    env = {
        "LAZYTPU_DEBUG": " bounds, recompile ,",
        "LAZYTPU_MAX_PENDING_OPS": " 7 ",
        "LAZYTPU_PROGRAM_CACHE_SIZE": "3",
        "LAZYTPU_PLATFORM": "CPU",
        "LAZYTPU_CPU_FALLBACK": "Off",
        "LAZYTPU_SYNC_ON_OPTIMIZER_STEP": "yes",
        "TORCH_TPU_DEFER_AND_FUSE": "0",
        "LAZYTPU_DUMP_DIR": str(tmp_path / "not" / "yet"),
        "LAZYTPU_CACHE_DIR": "off",
    }
    out = _import_lazytpu(env, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        f"['bounds', 'recompile'] 7 3 cpu False True False {tmp_path / 'not' / 'yet'} off False"
    )


def test_every_flag_has_a_bad_value_in_the_table():
    checked = {env for env, _, _ in BAD} | {"LAZYTPU_PLATFORM"}
    assert {flag.env for flag in _config.FLAGS} <= checked


def test_empty_value_counts_as_unset(monkeypatch):
    for flag in _config.FLAGS:
        monkeypatch.setenv(flag.env, "")
    try:
        _config.load_all()
        assert all(flag.get() == flag.default for flag in _config.FLAGS)
    finally:
        monkeypatch.undo()
        _config.load_all()


@pytest.mark.parametrize("value, frozen", [("1", True), ("0", False)])
def test_import_freezes_the_libraries_objects(value, frozen):
    """torch's and JAX's objects leave the garbage collector's full collections (Note [Frozen imports]);
    objects made afterwards are collected as always."""
    code = (
        "import gc\n"
        "class Cycle:\n"
        "    pass\n"
        "c = Cycle(); c.self = c; del c\n"
        "print(gc.get_freeze_count(), gc.collect() >= 1)\n"
    )
    proc = _import_lazytpu({"LAZYTPU_GC_FREEZE": value}, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, collected = proc.stdout.split()[-2:]
    assert (int(count) > 100_000) is frozen and collected == "True"
