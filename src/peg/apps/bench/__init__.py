"""Benchmarks: `peg bench SPEC.yaml` (runner, specs, bases, tables), the PEG paper's tables
(`peg paper-tables`) and the UCI regression benchmark (`peg bench uci`)."""
