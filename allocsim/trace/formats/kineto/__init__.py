"""torch.profiler / Kineto Chrome traces: ``reader`` (reference), ``fast`` (C-speed decoding), ``layout`` (start state)."""
