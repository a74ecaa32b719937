"""The Laplace approximation through laplace-torch (`laplace`), its import and backends
(`_torch`), the predictive variance peg computes (`_variance`) and what an archive keeps of the
posterior (`_state`).

The classes are exported by `peg.methods` (and `peg`); this package imports nothing itself, so
its modules import each other in any order."""
