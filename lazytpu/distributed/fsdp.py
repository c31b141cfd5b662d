"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on ``tpu``.

Note [FSDP2 on tpu]: FSDP2 runs on ``tpu`` as torch wrote it, with nothing of
its own replaced; this module only says how, since the pieces it needs are
the device's and live where their stage does:

- Its all-gathers and reduce-scatters are the ``tpu_dist`` group's
  ``all_gather_single`` and ``reduce_scatter_single``. Over a mesh of the
  whole world they are recorded into the pending program (Note [In-graph
  collectives] in lazytpu.distributed.ingraph), so a training step is the
  programs of the same step of the unsharded model on one device (the step's
  segments, Note [Step segments] in lazytpu.engine), each one SPMD program
  holding its collectives.
- It frees each module's gathered parameters after use and allocates them
  again before the next, with ``untyped_storage().resize_(0)`` and
  ``resize_(nbytes)``: the unsharded parameter and the views autograd saved
  keep their storage, which drops its buffer (Note [Storage resize] in
  lazytpu.frontend.storages). Between uses each rank holds its shard of each
  parameter and of its optimizer state (``torch.tpu.memory_allocated()``
  counts 1/world of the unsharded model's).
- Its streams and per-layer events name the device's one queue (Note [One
  queue] in lazytpu.device.streams), and recording an event dispatches
  nothing, so they do not cut the step (Note [Deferred events] there);
  ``record_stream`` has nothing to record.
- Its custom ops ``fsdp.all_gather_copy_in``, ``fsdp.split_with_sizes_copy``
  and ``fsdp.chunk_cat`` run their Python kernels for PrivateUse1 (Note
  [Resolution order] in lazytpu.frontend.dispatch, step 6), whose torch ops
  are recorded like any: the copies in and out of the flat collective
  buffers are part of the step's program. ``fsdp.copy_``, which only
  compiled FSDP2 graphs call, has no such kernel and runs on the CPU fallback.
- A ``MixedPrecisionPolicy`` casts with ordinary recorded ops (bf16
  parameters gathered and used in forward and backward, gradients cast to
  the reduce dtype before the reduce-scatter).

Importing ``torch.distributed.fsdp`` costs 0.15-0.3 s, so nothing here is
imported by ``import lazytpu``. A mesh that is not the whole world (HSDP's
replicate dimension, a sub-mesh) runs each collective as a program of its own
(``ProcessGroupTPU._apply``), which is correct but cuts the step there.
"""
