"""Per-rank capture of distributed scripts: launchers, a process group that answers alone, roles.

The parent side (``launcher``, ``roles``, ``capture_dir``, ``manifest``) needs no torch; the child
side (``rank``, ``process_group``, ``facts``) runs in the script's interpreter. See
docs/distributed.md.
"""
