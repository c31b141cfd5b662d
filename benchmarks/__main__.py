"""``python -m benchmarks``: see ``benchmarks/README.md`` and ``--help``.

The thread and cache environment must be set before torch, JAX or lazytpu is
imported, so this module parses the command line first and imports the runner
afterwards.
"""

from __future__ import annotations

import sys

from benchmarks import settings


def main(argv: list[str] | None = None) -> int:
    args = settings.parse_args(argv)
    if args.workloads == ["generate"]:
        from benchmarks import generate  # noqa: PLC0415

        return generate.main(["--threads", str(args.threads), "--out", args.out])
    env = settings.configure_environment(args.threads, warm_cache=args.warm_cache)
    from benchmarks import runner  # noqa: PLC0415 (after the environment is set)

    return runner.main(args, env)


if __name__ == "__main__":
    sys.exit(main())
