"""What every reader shares: the builder and its columnar twin, frames, limits, isolation, checks.

``builder`` / ``columnar`` turn address-keyed records into a ``Trace``; ``compiled`` switches the
readers' compiled route; ``limits``, ``isolate``, ``safe_pickle``, ``json_depth`` and
``ipc_check`` keep an untrusted file from making a reader do too much; ``validate`` checks the
result's semantics.
"""
