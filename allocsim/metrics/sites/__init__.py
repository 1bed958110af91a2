"""Which code holds the memory: group bytes by code site (``rows``), by a user's rule (``rule``).

``report`` formats a run's sites for ``allocsim run``, ``timeline`` gives live bytes over time by
site and ``waste`` finds the sites behind the waste at the reserved peak.
"""
