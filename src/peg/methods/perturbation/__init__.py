"""PEG and PEP: members made by perturbing one model's weights (gradient steps or noise), the
directions and their preconditioners, how the members are held (stacked, lazy, recipes), and
the search for the scale (PEG's η, PEP's σ) on held-out points.

The classes are exported by `peg.methods` (and `peg`); this package imports nothing itself, so
its modules import each other in any order."""
