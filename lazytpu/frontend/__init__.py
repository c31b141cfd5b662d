"""The recording stage: a torch op on ``tpu`` tensors -> IR nodes in the pending graph.

- ``tensor``: ``LazyTensor``, the tensor type of the device, and its interned descriptors.
- ``windows``: reading and writing a tensor through its window on a shared storage.
- ``hostio``: moving tensors between CPU torch and the device.
- ``metas``: output metas for ops torch has no meta kernel for.
- ``dispatch``: ``__torch_dispatch__`` -> the route of each op, meta inference, ``record``.
- ``routes/``: what an op that is not recorded as one node does (handlers, views,
  in-place and ``out=`` forms, foreach ops, advanced indexing, the CPU fallback).
- ``checks/``: torch's checks that meta kernels skip (kernel dtypes, Python scalars,
  overlapping writes, index bounds, value checks read at the next host read), with
  one CPU-probe helper.

Importing this package imports none of its modules (docs/architecture.md).
"""
