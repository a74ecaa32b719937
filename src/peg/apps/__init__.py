"""The applications built on the library: the `peg` command line (`peg.apps.cli`), the demo,
the benchmarks (`peg bench`, `peg bench uci`, `peg paper-tables`, `peg bench-perf`) and the
function-space diversity study (`peg diversity`).

They share one method registry (`peg.apps.registry`: a method key such as "peg" or "packed" →
how it is built and fitted), one subsampling helper (`peg.apps.data`), one results writer
(`peg.apps.results`) and the presets in `configs/` (package data, found by `peg.apps.presets`).
The core library never imports this package: `import peg` loads none of it.
"""
