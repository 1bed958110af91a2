"""One reader per trace format, reference and compiled route side by side: add a format here.

``detect`` recognises a file's format from its first bytes; ``kineto/``, ``snapshot/`` and ``rmm/``
hold each format's reference reader (``reader.py``) beside its compiled route's wrapper
(``fast.py``); ``paddle`` and ``native`` are one module each. ``allocsim.trace.read_trace`` picks
the reader.
"""
