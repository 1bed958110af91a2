"""PyTorch memory snapshots: ``reader`` (reference) and ``fast`` (the compiled route's entry columns)."""
