"""Soak over distinct shapes: thousands of different programs in one process at flat memory.

    python examples/shapes_soak.py [SHAPES]     (make soak runs 3000)

PyTorch's own ``test_index_put_accumulate_duplicate_indices`` loop, made
longer: ``index_put(..., accumulate=True)`` on a new size each iteration,
checked against the same sums on the host. Each iteration compiles new
programs, so the program cache (Note [Program cache bound]) and the
recording memos (Note [Memo bound]) fill up and then evict. Prints resident
memory and memory mappings at the half-way point and at the end; exits
non-zero if memory grows by 5% or more over the second half, the mappings
grow by more than 10%, or a result differs.
"""

from __future__ import annotations

import gc
import sys

import torch
from soak import rss_bytes  # this folder's examples/soak.py

import lazytpu
from lazytpu import _caches


def mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _one(i: int) -> None:
    delta = torch.empty(i, dtype=torch.double, device="tpu").uniform_(-1, 1)
    indices = delta.cumsum(0).long()
    input = torch.randn(int(indices.abs().max()) + 1, device="tpu")
    values = torch.randn(indices.size(0), device="tpu")
    output = input.index_put((indices,), values, accumulate=True)
    expected = input.cpu().index_put((indices.cpu(),), values.cpu(), accumulate=True)
    torch.testing.assert_close(output.cpu(), expected)


def soak(shapes: int) -> dict:
    torch.manual_seed(0)
    figures: dict = {}
    for i in range(1, shapes + 1):
        _one(i)
        if i == shapes // 2 or i == shapes:
            gc.collect()
            at = "half" if i < shapes else "end"
            figures[f"rss_{at}"] = rss_bytes()
            figures[f"maps_{at}"] = mappings()
    figures["shapes"] = shapes
    figures["rss_growth"] = figures["rss_end"] / figures["rss_half"] - 1
    figures["maps_growth"] = figures["maps_end"] / figures["maps_half"] - 1
    m = lazytpu.metrics.snapshot()
    figures["compiled"] = m["programs_compiled"]
    figures["evicted"] = m.get("programs_evicted", 0)
    figures["memos"] = {name: (len(memo), memo.limit, memo.forgotten) for name, memo in _caches.memos().items()}
    return figures


def main() -> int:
    shapes = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    f = soak(shapes)
    print(f"shapes soak: {f['shapes']} distinct sizes, {f['compiled']} programs compiled, {f['evicted']} evicted")
    print(
        f"  resident memory at the half {f['rss_half'] / 2**20:.1f} MiB, at the end {f['rss_end'] / 2**20:.1f} MiB "
        f"({100 * f['rss_growth']:+.2f}%); memory mappings {f['maps_half']} -> {f['maps_end']}"
    )
    for name, (size, limit, forgotten) in sorted(f["memos"].items()):
        print(f"  memo {name}: {size}/{limit} entries, {forgotten} forgotten")
    ok = f["rss_growth"] < 0.05 and f["maps_growth"] < 0.10
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
