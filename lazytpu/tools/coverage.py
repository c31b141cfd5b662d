"""Op coverage over PyTorch's OpInfo ``op_db``: ``python -m lazytpu.tools.coverage``.

Runs every ``op_db`` entry on ``tpu`` against CPU torch (float32 forward and
gradients; every dtype with ``--full``), records every ATen op that reaches
lazytpu's dispatcher, and classifies each one:

- ``lowered``: a native rule (or a view, a dispatch handler, an in-place or
  ``out=`` form of a lowered op);
- ``decomposed``: torch's decompositions or CompositeImplicit, down to lowered ops;
- ``fallback``: it ran on CPU torch in some call;
- ``failing``: a rule that raised while lowering, or only touched by cases
  that fail without any fallback (a wrong result, an error).

Prints a Markdown table and writes it, with the pass rates, as Markdown and
JSON (``docs/coverage.md``, ``docs/coverage.json`` by default). With
``--xfails PATH`` it also rewrites the OpInfo test's expected failures from
the run, each with the reason this run saw.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys
import time
import warnings

import torch

from lazytpu.tools import opinfo

STATUSES = ("lowered", "decomposed", "fallback", "failing")


def route(func) -> str | None:
    """How the dispatcher resolves ``func`` when nothing fails (its route,
    Note [Resolution order]): ``"lowered"``, ``"decomposed"`` or None (CPU fallback)."""
    from lazytpu.frontend import dispatch

    chosen = dispatch.route(func)
    if chosen.kind in ("handler", "view", "inplace_view", "recorded"):
        return "lowered"
    if chosen.kind == "foreach":
        from lazytpu.frontend.routes.foreach import element_op

        return "decomposed" if element_op(func) is not None else None
    if chosen.kind in ("inplace", "out"):
        return route(chosen.functional)
    if chosen.kind == "decomposed":
        return "decomposed"
    return None


def _run(cases, progress) -> tuple[dict, dict, dict]:
    """Run ``cases``; returns failures by case id, touched ops by case id, seconds by case id."""
    failures, touched, seconds = {}, {}, {}
    for i, case in enumerate(cases):
        start = time.perf_counter()
        with warnings.catch_warnings(), opinfo.traced_ops() as seen:
            warnings.simplefilter("ignore")
            try:
                failure = case.run()
            except Exception as exc:  # noqa: BLE001 - the harness itself must not stop
                failure = opinfo.Failure("error", f"{type(exc).__name__}: {exc}"[:300])
        seconds[case.id] = time.perf_counter() - start
        touched[case.id] = {str(f) for f in seen if isinstance(f, torch._ops.OpOverload)}
        if failure is not None:
            failures[case.id] = failure
        if progress:
            status = "ok" if failure is None else str(failure)[:100]
            print(f"[{i + 1}/{len(cases)}] {case.id} ({seconds[case.id]:.1f}s): {status}", file=sys.stderr)
    return failures, touched, seconds


_NAMED = re.compile(r"lowering (aten\.[\w.]+) failed")


def classify(cases, failures: dict, touched: dict) -> dict:
    """Per op: its status, how many cases touched it, and failing examples."""
    from lazytpu import metrics

    ops = {}
    by_name = {}
    for case in cases:
        for name in touched.get(case.id, ()):
            rec = ops.setdefault(name, {"cases": 0, "failing_cases": []})
            rec["cases"] += 1
            failure = failures.get(case.id)
            if failure is not None and failure.kind != "fallback" and not failure.fallbacks:
                rec["failing_cases"].append(case.id)
            if failure is not None and name in failure.fallbacks:
                rec.setdefault("fallback_cases", []).append(case.id)
    for func in _all_overloads(ops):
        by_name[str(func)] = func
    fell_back = set(metrics.snapshot()["cpu_fallbacks"])
    for failure in failures.values():
        fell_back.update(failure.fallbacks)
    named = {m for f in failures.values() for m in _NAMED.findall(f.message)}
    for name, rec in ops.items():
        func = by_name.get(name)
        how = route(func) if func is not None else None
        if name in fell_back or how is None:
            status = "fallback"
        elif name in named or (rec["failing_cases"] and len(rec["failing_cases"]) == rec["cases"]):
            status = "failing"
        else:
            status = how
        rec["status"] = status
        examples = rec.pop("fallback_cases", []) if status == "fallback" else rec["failing_cases"]
        rec.pop("fallback_cases", None)
        rec["failing_cases"] = examples[:5]
    return dict(sorted(ops.items()))


def _all_overloads(ops):
    for name in ops:
        packet_name, _, overload = name.removeprefix("aten.").rpartition(".")
        ns = name.split(".")[0]
        packet = getattr(getattr(torch.ops, ns, None), packet_name if ns == "aten" else name.split(".")[1], None)
        if packet is not None and ns == "aten":
            func = getattr(packet, overload, None)
            if func is not None:
                yield func


def pass_rates(cases, failures: dict) -> dict:
    """Pass rates per (kind, dtype, mode) group of cases."""
    groups = collections.defaultdict(lambda: [0, 0])
    for case in cases:
        key = f"{case.kind} {str(case.dtype).removeprefix('torch.')}" + (" strict" if case.mode == "strict" else "")
        groups[key][1] += 1
        groups[key][0] += case.id not in failures
    return {k: {"passed": p, "total": t, "rate": round(p / t, 4) if t else None} for k, (p, t) in groups.items()}


def totals(ops: dict) -> dict:
    count = collections.Counter(rec["status"] for rec in ops.values())
    packets = collections.defaultdict(set)
    for name, rec in ops.items():
        packets[rec["status"]].add(name.rsplit(".", 1)[0])
    out = {s: {"overloads": count[s], "ops": len(packets[s])} for s in STATUSES}
    out["on_device"] = {
        "ops": len({n.rsplit(".", 1)[0] for n, r in ops.items() if r["status"] in ("lowered", "decomposed")}),
        "overloads": count["lowered"] + count["decomposed"],
    }
    return out


def registered_rules() -> dict:
    from lazytpu.lowering import registered_ops

    aten_ops = [op for op in registered_ops() if not isinstance(op, str)]
    return {"ops": len({str(op).rsplit(".", 1)[0] for op in aten_ops}), "overloads": len(aten_ops)}


def markdown(report: dict) -> str:
    lines = [
        "# Op coverage on `tpu` (PyTorch OpInfo `op_db`)",
        "",
        f"Generated by `python -m lazytpu.tools.coverage{' --full' if report['full'] else ''}` "
        f"(torch {report['torch']}, {report['seconds']:.0f} s). An op is *lowered* (a native rule, view or handler), "
        "*decomposed* (torch's decompositions, down to lowered ops), a CPU *fallback*, or *failing* "
        "(its rule raised, or every case touching it fails without a fallback).",
        "",
        "## Pass rates",
        "",
        "| cases | passed | total | rate |",
        "|---|---|---|---|",
    ]
    for key, r in sorted(report["pass_rates"].items()):
        lines.append(f"| {key} | {r['passed']} | {r['total']} | {r['rate']:.1%} |")
    lines += ["", "## Totals (ATen ops touched by op_db)", "", "| status | ops | overloads |", "|---|---|---|"]
    for status, t in report["totals"].items():
        lines.append(f"| {status} | {t['ops']} | {t['overloads']} |")
    rules = report["registered_rules"]
    lines += ["", f"Lowering rules registered: {rules['ops']} ops ({rules['overloads']} overloads).", ""]
    lines += ["## Ops", "", "| op | status | cases | failing cases (first 5) |", "|---|---|---|---|"]
    for name, rec in report["ops"].items():
        failing = ", ".join(rec["failing_cases"]) if rec["status"] in ("failing", "fallback") else ""
        lines.append(f"| `{name}` | {rec['status']} | {rec['cases']} | {failing} |")
    return "\n".join(lines) + "\n"


def update_xfails(path: pathlib.Path, failures: dict, cases) -> None:
    """Rewrite the expected failures of the run's cases, each with this run's reason."""
    old = json.loads(path.read_text()) if path.exists() else {}
    run = {c.id for c in cases}
    new = {k: v for k, v in old.items() if k not in run}  # cases this run did not cover stay
    for case_id, failure in failures.items():
        new[case_id] = _reason(failure)
    path.write_text(json.dumps(dict(sorted(new.items())), indent=1) + "\n")


def _reason(failure) -> str:
    if failure.fallbacks:
        return "CPU fallback: " + ", ".join(failure.fallbacks)
    return str(failure)[:200]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazytpu.tools.coverage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every case of the full OpInfo run (all dtypes)")
    parser.add_argument("--out", default="docs", help="directory for coverage.md and coverage.json")
    parser.add_argument("--xfails", help="also rewrite this expected-failures JSON file from the run")
    parser.add_argument("--limit", type=int, help="only the first N cases (a quick look)")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress on stderr")
    args = parser.parse_args(argv)

    cases = opinfo.cases(full=True)
    if not args.full:
        cases = [c for c in cases if c.dtype == torch.float32 and c.mode == "defer"]
    if args.limit:
        cases = cases[: args.limit]
    start = time.perf_counter()
    failures, touched, _ = _run(cases, progress=not args.quiet)
    ops = classify(cases, failures, touched)
    report = {
        "torch": torch.__version__,
        "full": args.full,
        "seconds": time.perf_counter() - start,
        "pass_rates": pass_rates(cases, failures),
        "totals": totals(ops),
        "registered_rules": registered_rules(),
        "failures": {k: str(v) for k, v in sorted(failures.items())},
        "ops": ops,
    }
    text = markdown(report)
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coverage.md").write_text(text)
    (out / "coverage.json").write_text(json.dumps(report, indent=1) + "\n")
    if args.xfails:
        update_xfails(pathlib.Path(args.xfails), failures, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
