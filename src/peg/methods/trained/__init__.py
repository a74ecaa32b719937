"""Methods that train (or keep training) the model: Deep Ensembles, SWA and SWAG (with their
callbacks), and the subspace samplers around a solution or along its iterates (`subspace/`).

The classes are exported by `peg.methods` (and `peg`); this package imports nothing itself, so
its modules import each other in any order."""
