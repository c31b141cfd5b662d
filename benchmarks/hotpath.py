"""Where the microseconds of one recorded op go (issue 5, hot path).

    python -m benchmarks.hotpath

Prints the per-op recording cost of a defer-mode loop (cache hit: the
program and every call signature are already known), the floor torch itself
imposes on any ``__torch_dispatch__`` subclass (dispatch round trip plus
wrapper allocation), and the cost of each step of lazytpu's record path.
"""

from __future__ import annotations

import statistics
import time
import timeit

import torch

import lazytpu
from lazytpu import engine
from lazytpu.frontend import dispatch, record, windows
from lazytpu.fusion import build_program
from lazytpu.ir import Node, Output
from lazytpu.ir.source import location

N = 20_000
# CPU time of this thread: on a shared machine, robust to time spent descheduled
# (XLA runs programs on its own threads, which this does not count).
_TIMER = time.thread_time


class _Floor(torch.Tensor):
    """The cheapest possible tpu subclass: allocate a wrapper, nothing else."""

    @staticmethod
    def __new__(cls, shape, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("tpu", 0))

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _Floor(args[0].shape, args[0].dtype)


def _per_op(fn, ops_per_call: int, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        start = _TIMER()
        fn()
        samples.append((_TIMER() - start) / ops_per_call * 1e6)
        lazytpu.sync()
    return statistics.median(samples)


def main() -> None:
    x, y = torch.randn(16, 16, device="tpu"), torch.randn(16, 16, device="tpu")
    lazytpu.sync()

    def loop():
        z = x
        for _ in range(500):
            z = z * y + 1.0

    loop()
    lazytpu.sync()
    print(f"recorded op, defer loop (cache hit):  {_per_op(loop, 1000):6.2f} us/op")

    def inplace_loop():
        for _ in range(500):
            x.mul_(0.5)

    def view_loop():
        for _ in range(500):
            x.t()

    for fn in (inplace_loop, view_loop):
        fn()
        lazytpu.sync()
    print(f"in-place op (x.mul_(0.5)):            {_per_op(inplace_loop, 500):6.2f} us/op")
    print(f"view op (x.t()):                      {_per_op(view_loop, 500):6.2f} us/op")
    rows, mask = torch.randn(1 << 16, 4, device="tpu"), torch.arange(1 << 20, device="tpu") >= 0
    lazytpu.sync()
    start = iter(range(0, 1 << 16, 500))

    def new_index_loop():  # each call indexes 500 rows not indexed before (Note [Index windows])
        first = next(start)
        for i in range(first, first + 500):
            rows[i]

    def element_read_loop():
        for i in range(100):
            bool(mask[i])

    print(f"view of a new index (x[i]):           {_per_op(new_index_loop, 500):6.2f} us/op")
    loss = x.sum()

    def item_loop():  # a loss read each step
        for _ in range(100):
            loss.item()

    print(f"element read of 2**20 (bool(m[i])):   {_per_op(element_read_loop, 100):6.2f} us/read")
    print(f"item of a computed scalar (loss):     {_per_op(item_loop, 100):6.2f} us/read")
    fx, fy = _Floor((16, 16), torch.float32), _Floor((16, 16), torch.float32)

    def floor_loop():
        z = fx
        for _ in range(500):
            z = z * fy + 1.0

    print(f"torch floor (dispatch + wrapper):     {_per_op(floor_loop, 1000):6.2f} us/op")
    func = torch.ops.aten.mul.Tensor
    key, values = record.plan_key(func, (x, y), {})
    x * y  # make sure the plan exists
    plan = record.PLANS[key]
    inputs = tuple(v._lt_storage.value for v in values)
    node = Node(func, plan.template, inputs, plan.out_avals, None, plan.static)
    steps = {
        "call signature (plan key)": lambda: record.plan_key(func, (x, y), {}),
        "plan lookup": lambda: record.PLANS.get(key),
        "node": lambda: Node(func, plan.template, inputs, plan.out_avals, None, plan.static),
        "output tensor (storage + wrapper)": lambda: windows.new_tensor_of(Output(node, 0), plan.descs[0], 0),
        "source location (user file:line)": lambda: location(1),
        "dispatch() total": lambda: dispatch.dispatch(func, (x, y), {}),
    }
    for name, fn in steps.items():
        print(f"  {name:<34s} {timeit.timeit(fn, number=N, timer=_TIMER) / N * 1e6:6.2f} us")
    lazytpu.sync()
    # what a sync of an already compiled 1000-op program does before PJRT: key and inputs
    z = x
    for _ in range(1000):
        z = z * y
    roots = engine.context(0).graph.roots()
    per_node = timeit.timeit(lambda: build_program(roots), number=20, timer=_TIMER) / 20 / 1000 * 1e6
    print(f"  {'program key + inputs, per node':<34s} {per_node:6.2f} us")
    del z
    lazytpu.sync()


if __name__ == "__main__":
    main()
