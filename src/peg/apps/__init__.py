"""The applications built on the library: the `peg` command line (`peg.apps.cli`), the demo,
the benchmarks (`peg bench`, `peg bench uci`, `peg paper-tables`, `peg bench-perf`) and the
function-space diversity study (`peg diversity`), with their presets in `configs/` (package
data, found by `peg.apps.presets`). The core library never imports this package: `import peg`
loads none of it.
"""
