"""The deferred IR: immutable nodes and values, and the pending graph.

This stage knows nothing of JAX: a materialized value holds an opaque device
buffer that only the runtime interprets.
"""

from lazytpu.ir.graph import PendingGraph, Storage
from lazytpu.ir.node import Aval, Data, Failed, Node, Output, Scalar, Value

__all__ = ["Aval", "Data", "Failed", "Node", "Output", "Scalar", "Value", "PendingGraph", "Storage"]
