"""Allocator settings, as a user types them and as a trace records them: their one owner.

``alloc_conf`` parses ``PYTORCH_CUDA_ALLOC_CONF`` / ``--alloc-conf``; ``recorded`` checks a
snapshot's recorded ``allocator_settings`` and turns them into ``PyTorchPolicy`` arguments;
``divisions`` reads ``roundup_power2_divisions`` in all its spellings; ``paddle_flags`` parses
Paddle's ``FLAGS_``; ``values`` reads the numbers both spell the same way. Policies and readers
import from here; this package imports neither.
"""
