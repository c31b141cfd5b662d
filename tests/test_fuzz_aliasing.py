"""Differential fuzzing of aliasing programs: CPU torch vs ``tpu`` (defer and
strict). CI runs FUZZ_EXAMPLES (default 500) programs with a fixed seed;
``make fuzz`` runs a long campaign."""

from __future__ import annotations

import os

import hypothesis
import hypothesis.strategies as st
import torch
from fuzzprog import assert_same, fuzz_settings, run_program

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "500"))
RAN = {"programs": 0}

step = st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 50), st.integers(0, 10_000))


@fuzz_settings(EXAMPLES)
@hypothesis.given(st.lists(step, min_size=1, max_size=30))
def test_programs_match_cpu(program):
    expected = run_program(program, "cpu")
    for mode in ("defer", "strict"):
        with torch.tpu.set_eager_mode(mode):
            assert_same(run_program(program, "tpu"), expected)
    RAN["programs"] += 1


def teardown_module(module):
    print(f"\nfuzz: {RAN['programs']} programs ran, each on cpu, tpu defer and tpu strict")
