"""RMM ``logging_resource_adaptor`` CSV logs: ``reader`` (reference) and ``fast`` (columnar route)."""
