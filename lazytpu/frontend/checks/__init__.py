"""torch's checks that meta kernels skip, raised at the call (docs/architecture.md)."""
