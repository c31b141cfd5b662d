#!/usr/bin/env bash
# Issue 21 item 6: the suite's workloads on an accelerator, through JAX's PJRT (CUDA GPU, or TPU).
#
# One short prepared run (under 10 minutes), from the repository root of the device machine:
#
#     bash benchmarks/device_check.sh [OUT_DIR]      # OUT_DIR defaults to $OUT, else benchmarks/results/device
#
# It installs nothing (the device machine has no network): it runs this checkout from source
# (PYTHONPATH) with whatever torch and jax the machine has, and writes to OUT_DIR:
#   env.txt        versions, devices, the platform lazytpu picked
#   smoke.txt      a tpu matmul, a backward and an optimizer step against CPU torch (or why lazytpu cannot run)
#   suite_*.txt    python -m benchmarks per workload: defer vs defer_whole vs strict vs jax.jit (and CPU torch),
#                  interleaved in one process, medians of 20 steps; suite_*/results.json has every step time
#   steps_*.txt    python -m benchmarks.steps: host CPU vs wait per step, what of the device time hides behind
#                  host work (defer with step segments, and defer_whole)
#   summary.txt    the ratio lines of every table, and the failures
# Each part has its own time limit, so one failing or slow workload does not lose the others.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-benchmarks/results/device}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# An accelerator's programs compile for it: keep its compile cache out of the checkout.
export LAZYTPU_CACHE_DIR=${LAZYTPU_CACHE_DIR:-$(mktemp -d)}
start=$(date +%s)

run() {  # run LIMIT_S FILE CMD...: CMD with a time limit, output to FILE, a line in summary.txt
    local limit=$1 file=$2
    shift 2
    timeout "$limit" "$@" >"$out/$file" 2>&1
    local rc=$?
    echo "$(date +%T) rc=$rc $file" >>"$out/summary.txt"
    return $rc
}

: >"$out/summary.txt"
run 120 env.txt "$py" -c "
import sys, platform
print('python', sys.version.split()[0], platform.machine())
import torch, jax
print('torch', torch.__version__, '| jax', jax.__version__, '| jax devices', jax.devices())
import lazytpu
from lazytpu.runtime import platform as p
print('lazytpu platform', p.platform_name(), '| tpu devices', torch.tpu.device_count())
"
nvidia-smi -L >>"$out/env.txt" 2>&1 || true

if ! run 180 smoke.txt "$py" - <<'EOF'
import torch, lazytpu
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
ref = [p.detach().clone() for p in model.parameters()]
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
results = {}
for device in ("cpu", "tpu"):
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to(device)
    with torch.no_grad():
        for p, r in zip(m.parameters(), ref):
            p.copy_(r)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    results[device] = (losses, [p.detach().cpu() for p in m.parameters()])
print("losses cpu", results["cpu"][0])
print("losses tpu", results["tpu"][0])
for a, b in zip(results["cpu"][1], results["tpu"][1]):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
print("smoke: tpu training equals CPU torch on", lazytpu.runtime.platform.platform_name())
EOF
then
    echo "lazytpu cannot run on this machine: see $out/smoke.txt" | tee -a "$out/summary.txt"
    tail -n 30 "$out/smoke.txt"
    exit 1
fi

# The workloads of issue 21's targets. All threads (--threads 0): the host is not the 2-core reference machine.
for w in mlp_b32 transformer llama; do
    run 150 "suite_$w.txt" "$py" -m benchmarks --workloads "$w" --variants defer,defer_whole,strict,jax,cpu \
        --steps 20 --warmup 3 --threads 0 --pipeline 0 --no-chart --no-progress --out "$out/suite_$w"
done
for mode in defer defer_whole; do
    run 90 "steps_$mode.txt" "$py" -m benchmarks.steps --workloads llama,transformer --steps 20 --mode "$mode"
done

{
    echo
    echo "== the suite per workload: tables, ratios (medians of per-round ratios), targets =="
    grep -hvE "^(wrote|\s*$)" "$out"/suite_*.txt
    echo
    echo "== host vs device per step (benchmarks.steps) =="
    grep -hvE "^\s*$" "$out"/steps_*.txt
    echo
    echo "elapsed $(($(date +%s) - start)) s"
} >>"$out/summary.txt"
cat "$out/summary.txt"
