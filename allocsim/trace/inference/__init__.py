"""What a trace proves about the real run, inferred once here and used everywhere.

``recorded`` (the recorded peaks and totals), ``start_state`` and ``final_state`` (the blocks held
when recording began and ended) and ``stats`` (counts, span and live-byte peaks).
"""
