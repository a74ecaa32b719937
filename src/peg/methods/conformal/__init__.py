"""Conformal prediction: split conformal sets (`classifier`) and intervals (`regressor`), the
pure functions they are made of (`_split`), what both share (`_base`), and weighted conformal
under covariate or label shift (`_shift`).

The classes are exported by `peg.methods` (and `peg`); this package imports nothing itself, so
its modules import each other in any order."""
