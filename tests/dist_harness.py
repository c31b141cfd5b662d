"""Multi-process test harness for torch.distributed on ``tpu``: ranks on 127.0.0.1.

A test file declares its ``JOBS`` (``Job``: sections run in order in every
rank of one launch) and a ``Harness`` over itself; the tests call
``harness.assert_section(job, section)``, and the file's ``__main__`` calls
``harness.main()``, which runs one rank. Ranks are launched as
``python <file> JOB`` with a torchrun-style environment. The launcher kills
every rank at a deadline, and each worker dumps its stacks and exits on its
own watchdog, so a hung or dead rank fails the test instead of hanging CI.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

WATCHDOG_S = 90  # a worker running longer dumps its stacks and exits
LAUNCH_TIMEOUT_S = 150  # the launcher kills whatever still runs after this
GRACE_S = 20  # after one rank fails, the others get this long to fail too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, scenario: str, world: int = 2, env: dict | None = None, timeout: float = LAUNCH_TIMEOUT_S):
    """Run ``scenario`` of ``script`` on ``world`` ranks; returns ``[(returncode, output), ...]``.

    A rank still running at the deadline (or ``GRACE_S`` after another rank
    failed) is killed and reported with return code ``None``.
    """
    port = _free_port()
    procs, logs = [], []
    for rank in range(world):
        log = tempfile.TemporaryFile(mode="w+")
        rank_env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        procs.append(
            subprocess.Popen([sys.executable, script, scenario], env=rank_env, stdout=log, stderr=subprocess.STDOUT)
        )
        logs.append(log)
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.monotonic() + GRACE_S)
        time.sleep(0.1)
    results = []
    for p, log in zip(procs, logs):
        if p.poll() is None:
            p.kill()
            p.wait()
            code = None
        else:
            code = p.returncode
        log.seek(0)
        results.append((code, log.read()))
        log.close()
    return results


def report(results) -> str:
    """Every rank's exit code and the tail of its output."""
    return "\n".join(f"--- rank {r} (exit {code}) ---\n{out[-6000:]}" for r, (code, out) in enumerate(results))


class Job:
    """Sections run in order in every rank of one launch, after ``setup``.

    Each section prints ``OK <name>`` or its traceback; a failing section does
    not stop the next (unless it leaves the ranks out of step: the watchdog
    then ends them). ``backend=None``: no process group (one process, or ranks
    that start it themselves).
    """

    def __init__(
        self,
        env: dict,
        sections: list[Callable],
        backend: str | None = "tpu_dist",
        world: int = 2,
        timeout: float = LAUNCH_TIMEOUT_S,
    ):
        self.env, self.sections, self.backend, self.world, self.timeout = env, sections, backend, world, timeout


class Harness:
    """The jobs of one test file (``script``), each launched once per test session."""

    def __init__(self, script: str, jobs: dict[str, Job]):
        self.script, self.jobs = script, jobs
        self.results: dict[str, object] = {}

    def run_job(self, job: str) -> list[tuple[int | None, str]]:
        """The results of ``job`` (launched once per test session)."""
        if job not in self.results:
            spec = self.jobs[job]
            self.results[job] = launch(self.script, job, spec.world, env=spec.env, timeout=spec.timeout)
        return self.results[job]

    def assert_section(self, job: str, section: str, ranks=None) -> list[str]:
        """Every rank of ``job`` (or those in ``ranks``) reported ``section`` OK."""
        results = self.run_job(job)
        for rank, (_, out) in enumerate(results):
            if ranks is None or rank in ranks:
                assert f"OK {section}\n" in out, f"section {section!r} of job {job!r} failed:\n" + report(results)
        return [out for _, out in results]

    def assert_alone(self, job: str, section: str) -> None:
        """``section`` of ``job`` passed, run in one process (no launcher environment)."""
        if job not in self.results:
            spec = self.jobs[job]
            proc = subprocess.run(
                [sys.executable, self.script, job],
                env=dict(os.environ, PYTHONUNBUFFERED="1", **spec.env),
                capture_output=True,
                text=True,
                timeout=spec.timeout,
            )
            self.results[job] = proc.stdout + proc.stderr
        assert f"OK {section}\n" in self.results[job], self.results[job]

    def main(self) -> None:
        """One rank: the sections of the job named by ``sys.argv[1]``."""
        job = self.jobs[sys.argv[1]]
        watchdog_s = float(os.environ.get("DIST_TEST_WATCHDOG_S", WATCHDOG_S))
        # Start-up (imports, the process group) gets the default watchdog at least: a job's short
        # one (the hang test's 12 s) is for its sections, and a loaded machine imports slowly.
        faulthandler.dump_traceback_later(max(watchdog_s, WATCHDOG_S), exit=True)
        import traceback

        import torch.distributed as dist

        import lazytpu.distributed

        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if job.backend is not None:
            lazytpu.distributed.options().heartbeat_timeout_s = int(os.environ.get("DIST_TEST_HEARTBEAT_S", 100))
            dist.init_process_group(backend=job.backend)
            rank, world = dist.get_rank(), dist.get_world_size()
        # Re-armed once the ranks are up: a slow start (a loaded machine) must not
        # use up the sections' time.
        faulthandler.dump_traceback_later(watchdog_s, exit=True)
        for section in job.sections:
            name = section.__name__.removeprefix("_section_")
            try:
                section(rank, world)
                print(f"OK {name}", flush=True)
            except Exception:
                print(f"FAILED {name}:\n{traceback.format_exc()}", flush=True)
        if job.backend is not None:
            dist.barrier()
            dist.destroy_process_group()


def tiny_llama(seed: int = 0, **config):
    """The distributed tests' small transformers Llama (vocab 256, width 64, 2
    layers, 4 heads, 2 KV heads, MLP 128), initialized from ``seed`` on CPU;
    ``config`` overrides ``LlamaConfig`` fields."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    sizes = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(LlamaConfig(**sizes, intermediate_size=128, attention_dropout=0.0, **config))
