"""Differential fuzzing of bad calls among aliasing programs: CPU torch vs
``tpu`` (defer and strict).

The programs of tests/fuzzprog.py also draw bad calls (tests/fuzzbad.py):
out-of-range dims, index tensors of refused dtypes, shapes that do not fit,
in-place results of another dtype, index values and mask counts that only the
data shows. Each must raise on CPU; on ``tpu`` it must raise the same
exception type at the call (a ``data:`` one no later than the next host
read), the program goes on after catching it, and every other tensor must
end as on CPU, still aliasing its views (Note [Alias probe]). CI runs
FUZZ_ERROR_EXAMPLES (default 100) programs with a fixed seed and every bad
call once in one program; ``make fuzz`` runs a long campaign.
"""

from __future__ import annotations

import os
import subprocess
import sys

import fuzzbad
import hypothesis
import hypothesis.strategies as st
import pytest
import torch
from fuzzprog import assert_same, fuzz_settings, run_program

import lazytpu  # noqa: F401  (registers the tpu device; a subprocess has no conftest)

EXAMPLES = int(os.environ.get("FUZZ_ERROR_EXAMPLES", os.environ.get("FUZZ_EXAMPLES", "100")))
RAN = {"programs": 0, "bad calls": 0}

step = st.tuples(st.integers(0, 4), st.integers(0, 50), st.integers(0, 50), st.integers(0, 100_000))


def _check(program, bad_calls):
    """Run ``program`` on CPU and on tpu in both modes; return CPU's observations."""
    expected = run_program(program, "cpu", bad_calls)
    refused = [(name, error) for kind, *rest in expected if kind == "bad" for name, error in [rest]]
    assert all(error is not None for _, error in refused), [name for name, error in refused if error is None]
    for mode in ("defer", "strict"):
        with torch.tpu.set_eager_mode(mode):
            assert_same(run_program(program, "tpu", bad_calls), expected)
    RAN["programs"] += 1
    RAN["bad calls"] += len(refused)
    return expected


@fuzz_settings(EXAMPLES)
@hypothesis.given(st.lists(step, min_size=4, max_size=30))  # a random campaign draws short lists most
def test_programs_with_bad_calls_match_cpu(program):
    _check(program, fuzzbad.DRAWN)


# Pool tensors the sweep applies the bad calls to (made by the prelude): the
# float base (4, 6) and its transpose, the int base (3, 4) and its row, a row
# of the transpose and a 0-d element of that row. Each bad call takes one of
# each pair, in turn.
PRELUDE = [(0, 0, 0, 10), (0, 1, 0, 2), (0, 2, 0, 2), (0, 4, 0, 2), (1, 0, 0, 0)]
TARGETS = ((0, 2), (1, 3), (4, 5))


def sweep(names) -> None:
    """Each of the bad calls ``names``, on three targets, with pending writes between them, in one program."""
    program = list(PRELUDE)
    for k in range(len(names)):
        for i in (pair[(k + n) // 2 % 2] for n, pair in enumerate(TARGETS)):
            program.append((4, i, i + 1, k + len(names) * (k + i)))
        program.append((1, k, 0, k))  # a pending write to some pool tensor
    expected = _check(program, names)
    drawn = {name for kind, name, *_ in expected if kind == "bad"}
    assert drawn == set(names), set(names) - drawn


def test_every_bad_call_in_one_program():
    sweep(fuzzbad.DRAWN)


def test_data_bad_calls_under_the_bounds_flag():
    """With LAZYTPU_DEBUG=bounds the index values are checked on the host
    (Note [Index bounds]) instead of in the program: the same errors, at the
    latest at the next host read, and nothing else lost."""
    names = tuple(name for name in fuzzbad.DRAWN if name.startswith("data:"))
    script = f"import test_fuzz_errors; test_fuzz_errors.sweep({names!r}); print('swept')"
    env = {**os.environ, "LAZYTPU_DEBUG": "bounds"}
    tests = os.path.dirname(__file__)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tests, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["swept"], proc.stderr[-3000:]


def test_excluded_bad_calls_still_differ():
    """Each excluded bad call still differs from CPU (fixed, it must leave fuzzbad.EXCLUDED), and names a
    bad call of the table. Empty today: the five calls the fuzzer found were fixed (index_add_'s source
    dtype, masked_scatter_'s count, a complex number into a real dtype by fill_, t[...] = and full)."""
    for name in fuzzbad.EXCLUDED:
        assert name in fuzzbad.BAD_CALLS, name
        with pytest.raises(AssertionError):
            _check([(4, i, 0, 0) for i in range(2)], (name,))


def teardown_module(module):
    print(f"\nfuzz errors: {RAN['programs']} programs with {RAN['bad calls']} bad calls, on cpu, tpu defer and strict")
