"""``torch.Generator(device="tpu")``: a random stream of its own, as a CUDA
generator is (Note [tpu generators] in lazytpu.frontend.generator)."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from conftest import mode, no_fallback

import lazytpu
from lazytpu.lowering.registry import RULES

DRAWS = {
    "randn": lambda g: torch.randn(16, device="tpu", generator=g),
    "rand": lambda g: torch.rand(4, 4, device="tpu", dtype=torch.float64, generator=g),
    "randint": lambda g: torch.randint(0, 1000, (16,), device="tpu", generator=g),
    "randperm": lambda g: torch.randperm(16, device="tpu", generator=g),
    "normal_": lambda g: torch.empty(16, device="tpu").normal_(2, 3, generator=g),
    "uniform_": lambda g: torch.empty(16, device="tpu").uniform_(generator=g),
    "exponential_": lambda g: torch.empty(16, device="tpu").exponential_(generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((64,), 0.5, device="tpu"), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(2, 50, device="tpu"), 10, generator=g),
    "poisson": lambda g: torch.poisson(torch.full((16,), 4.0, device="tpu"), generator=g),  # takes it by position
    "binomial": lambda g: torch.binomial(torch.full((16,), 9.0, device="tpu"), torch.full((16,), 0.5, device="tpu"), g),
    "sample_dirichlet": lambda g: torch._sample_dirichlet(torch.ones(4, 8, device="tpu"), generator=g),
    "rand_out": lambda g: torch.rand(16, generator=g, out=torch.empty(16, device="tpu")),
    "init_normal_": lambda g: torch.nn.init.normal_(torch.empty(16, device="tpu"), generator=g),
    "rand_like": lambda g: torch.rand_like(torch.empty(16, device="tpu"), generator=g),
    "randn_like": lambda g: torch.randn_like(torch.empty(16, device="tpu"), generator=g),
    "randint_like": lambda g: torch.randint_like(torch.empty(16, device="tpu"), 3, 99, generator=g),
    "randint_like_tensor": lambda g: torch.randint_like(torch.empty(16, device="tpu"), torch.tensor(99), generator=g),
}


def test_random_rules_take_the_generator_where_the_schema_puts_it():
    # binomial's and _sample_dirichlet's rules took it by keyword only: any call with a generator failed to lower
    for op in RULES:
        rule = RULES[op]
        names = [a.name for a in op._schema.arguments] if isinstance(op, torch._ops.OpOverload) else []
        if not rule.random or "generator" not in names:
            continue
        params = list(inspect.signature(rule.fn).parameters.values())
        at = names.index("generator")
        if not op._schema.arguments[at].kwarg_only:
            assert params[at].name == "generator" and params[at].kind is params[at].POSITIONAL_OR_KEYWORD, op


def test_a_tpu_generator_is_a_torch_generator_of_the_device():
    for spec in ("tpu", "tpu:0", torch.device("tpu", 0)):
        g = torch.Generator(device=spec)
        assert isinstance(g, torch.Generator) and g.device == torch.device("tpu", 0)
    g = torch.Generator("tpu")
    assert g.initial_seed() == torch.Generator().initial_seed()  # torch's default seed, as a CUDA generator's
    assert g.manual_seed(-1) is g and g.initial_seed() == 2**64 - 1  # torch's wrap of the seed
    with pytest.raises(RuntimeError, match="manual_seed expected a long"):
        g.manual_seed(1.5)
    assert type(torch.Generator()) is torch._C.Generator and torch.Generator("cpu").device.type == "cpu"


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_a_seeded_generator_repeats_whatever_else_draws(name, eager_mode):
    draw = DRAWS[name]
    with mode(eager_mode), no_fallback():
        g, other = torch.Generator("tpu"), torch.Generator("tpu").manual_seed(9)
        g.manual_seed(1234)
        first, second = draw(g).cpu(), draw(g).cpu()
        g.manual_seed(1234)
        torch.randn(8, device="tpu")  # the device's own stream
        draw(other)
        again = draw(g).cpu()
        g.manual_seed(4321)
        different = draw(g).cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, second) and not torch.equal(first, different)


def test_a_generators_draws_leave_the_devices_stream_as_it_was(eager_mode):
    g = torch.Generator("tpu").manual_seed(3)
    with mode(eager_mode):
        torch.manual_seed(5)
        expected = [torch.randn(4, device="tpu").cpu() for _ in range(2)]
        torch.manual_seed(5)
        got = [torch.randn(4, device="tpu").cpu()]
        torch.rand(4, device="tpu", generator=g).cpu()
        got.append(torch.randn(4, device="tpu").cpu())
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_a_sync_between_draws_changes_nothing():
    """The key is a storage's value: a sync computes it and does not donate it to the program that advances it."""
    g = torch.Generator("tpu").manual_seed(11)
    a, b = torch.randn(8, device="tpu", generator=g), torch.randn(8, device="tpu", generator=g)
    expected = torch.cat([a, b]).cpu()
    g.manual_seed(11)
    a = torch.randn(8, device="tpu", generator=g)
    a = a.cpu()
    torch.tpu.synchronize()
    b = torch.randn(8, device="tpu", generator=g).cpu()
    assert torch.equal(torch.cat([a, b]), expected)


def test_get_state_and_set_state_replay_and_check_their_input():
    g = torch.Generator("tpu").manual_seed(2)
    torch.rand(3, device="tpu", generator=g)  # the key is pending when read
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 8
    first = torch.rand(5, device="tpu", generator=g).cpu()
    assert g.set_state(state) is g
    assert torch.equal(torch.rand(5, device="tpu", generator=g).cpu(), first)
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        g.set_state(torch.zeros(8))
    with pytest.raises(RuntimeError, match="of size 8 but found the input RNG state size to be 3"):
        g.set_state(torch.zeros(3, dtype=torch.uint8))
    assert torch.equal(torch.rand(5, device="tpu", generator=g.set_state(state)).cpu(), first)  # unchanged by them


def test_the_device_state_is_checked_as_a_generators():
    """``torch.tpu.set_rng_state`` of a wrong state: torch's errors (numpy's ValueError before), the state kept."""
    state = torch.tpu.get_rng_state()
    first = torch.rand(5, device="tpu").cpu()
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        torch.tpu.set_rng_state(torch.zeros(8))
    with pytest.raises(RuntimeError, match="of size 8 but found the input RNG state size to be 5"):
        torch.tpu.set_rng_state(torch.zeros(5, dtype=torch.uint8))
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), first)


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda g: pickle.loads(pickle.dumps(g))], ids=["deepcopy", "pickle"])
def test_a_copied_generator_continues_where_its_original_is(copier):
    g = torch.Generator("tpu").manual_seed(8)
    torch.randn(4, device="tpu", generator=g)
    twin = copier(g)
    assert isinstance(twin, torch.Generator) and twin.device.type == "tpu" and twin.initial_seed() == 8
    assert torch.equal(
        torch.randn(6, device="tpu", generator=twin).cpu(), torch.randn(6, device="tpu", generator=g).cpu()
    )


def test_generators_share_programs():
    """The generator is not part of an op's program: a step drawing from another one compiles nothing."""

    def step(g):
        return (torch.randn(32, device="tpu", generator=g) * 2 + 1).sum().item()

    step(torch.Generator("tpu").manual_seed(0))
    before = lazytpu.metrics.snapshot()["programs_compiled"]
    values = {step(torch.Generator("tpu").manual_seed(seed)) for seed in range(1, 4)}
    assert lazytpu.metrics.snapshot()["programs_compiled"] == before and len(values) == 3


def _noise(x, g):
    return x * 2 + torch.randn(3, generator=g, device=x.device)


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_generator_passed_to_a_compiled_function_draws_as_in_eager():
    """As a CPU generator: dynamo takes it for an object and breaks the graph at the draw (it took the
    subclass for an opaque script object and failed in its fake-tensor run)."""
    x = torch.zeros(3, device="tpu")
    g = torch.Generator("tpu").manual_seed(4)
    eager = [_noise(x, g).cpu() for _ in range(2)]
    torch.manual_seed(9)
    stream = torch.rand(2, device="tpu").cpu()
    torch.manual_seed(9)
    compiled = [torch.compile(_noise, backend="tpu")(x, g.manual_seed(4) if i == 0 else g).cpu() for i in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled)) and not torch.equal(*compiled)
    assert torch.equal(torch.rand(2, device="tpu").cpu(), stream)  # the device's stream untouched


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_a_cpu_generator_raises_torchs_error(name):
    """As on CUDA: a generator of another device is an error, not silently ignored."""
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        DRAWS[name](torch.Generator().manual_seed(0))


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64 - 1, -(2**63)])
def test_seeds_past_int64_seed_the_device_as_torch_wraps_them(seed):
    """torch takes any seed in [-2**63, 2**64) as 64 unsigned bits (JAX's keys take them signed: it overflowed)."""
    torch.manual_seed(seed)
    assert torch.tpu.initial_seed() == torch.initial_seed() == seed % 2**64
    first = torch.randn(4, device="tpu").cpu()
    torch.manual_seed(seed % 2**64)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), first)
    torch.manual_seed(0)


def test_a_device_that_does_not_exist_is_torchs_error_at_the_call():
    """It was an IndexError inside a deferred program, at the next read."""
    missing = torch.tpu.device_count()
    message = f"tpu:{missing} does not exist: device_count\\(\\) is {missing}"
    for make in (
        lambda: torch.ones(2, device=f"tpu:{missing}"),
        lambda: torch.ones(2).to(f"tpu:{missing}"),
        lambda: torch.Generator(f"tpu:{missing}"),
    ):
        with pytest.raises(RuntimeError, match=message):
            make()


def test_rng_states_are_ordinary_cpu_tensors():
    """A state read from tpu, and one handed to it, stays a CPU tensor like any other: it can grow (numpy()
    had fixed their sizes)."""
    state = torch.tpu.get_rng_state()
    torch.tpu.set_rng_state(state)
    g = torch.Generator(device="tpu")
    mine = g.get_state()
    g.set_state(mine)
    n = state.numel()
    for t in (state, mine, torch.tpu.get_rng_state(), g.get_state()):
        t.resize_(n + 8)
        assert t.numel() == n + 8
