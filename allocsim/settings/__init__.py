"""Allocator settings, as a user types them and as a trace records them: their one owner.

``alloc_conf`` parses ``PYTORCH_CUDA_ALLOC_CONF`` / ``--alloc-conf``, ``recorded`` checks a
snapshot's recorded ``allocator_settings`` and ``paddle_flags`` parses Paddle's ``FLAGS_``.
"""
