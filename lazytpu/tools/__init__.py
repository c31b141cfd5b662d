"""Developer tools, not imported by ``import lazytpu``.

- ``opinfo``: runs PyTorch's OpInfo ``op_db`` samples on ``tpu`` against CPU
  torch (used by ``tests/test_opinfo.py``).
- ``coverage``: the op coverage report, ``python -m lazytpu.tools.coverage``
  (``make coverage``; writes ``docs/coverage.md`` and ``docs/coverage.json``).

Imports: the tools may import any part of lazytpu (they run on top of it);
no module of lazytpu outside this package may import them (docs/architecture.md).
"""
