"""Routes: what an op that is not recorded as one node does (docs/architecture.md)."""
