"""lazytpu's benchmark suite: ``python -m benchmarks`` (see ``benchmarks/README.md``).

Importing the package is light (no torch, JAX or lazytpu): ``benchmarks.workloads``
and ``benchmarks.jax_workloads`` hold the workload definitions that the suite and
``tests/test_bench_structure.py`` share.
"""
