"""``allocsim advise``: which setting of the allocator makes a trace fit, best first, with the line to paste.

Modules, one idea each: ``knobs`` (the knobs of each preset and how a setting is said back),
``search`` (baseline, one knob at a time, pruning, the full product, on the sweep machinery),
``rank`` (what makes two runs the same, what fits, the order), ``capacity`` (the smallest capacity
at which a setting still fits, by bisection over capacities), ``why`` (the waste a setting removed,
from the attribution), ``report`` (text and JSON).
"""
