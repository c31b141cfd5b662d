"""Chains of bfloat16 and float16 ops round after every op, as CPU torch's
kernels do, also fused in one program (Note [Rounding per op] in
lazytpu/runtime/persistent.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODES, mode

BF16, F16 = torch.bfloat16, torch.float16

# name -> (the chain, its dtypes); a float16 matmul is an ulp off CPU's in an
# element or so even alone (its sum's order), so the matmul chains are bfloat16's
CHAINS = {
    "matmul_add": (lambda x, y, z: (x @ y) + z, [BF16]),
    "addmm_chain": (lambda x, y, z: torch.addmm(z, x, y, beta=-0.5, alpha=2.0) @ y + x, [BF16]),
    "mul_add_tanh": (lambda x, y, z: (x * y + z).tanh() * x, [BF16, F16]),
    "widened_product": (lambda x, y, z: (x * y).float() + z.float(), [BF16, F16]),
    "softmax_of_a_sum": (lambda x, y, z: (x + y).softmax(-1) * z, [BF16, F16]),
}


@pytest.mark.parametrize("eager_mode", MODES)
@pytest.mark.parametrize(("name", "dtype"), [(n, d) for n, (_, ds) in sorted(CHAINS.items()) for d in ds], ids=str)
def test_a_low_precision_chain_is_bitwise_cpus(name, dtype, eager_mode):
    chain = CHAINS[name][0]
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(32, 32, generator=gen).to(dtype) for _ in range(3))
    expected = chain(x, y, z)
    with mode(eager_mode):
        got = chain(x.to("tpu"), y.to("tpu"), z.to("tpu")).cpu()
    assert torch.equal(got, expected), f"{(got != expected).sum().item()} elements differ"
