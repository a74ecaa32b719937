"""Benchmarks: the papers' tables reproduced on the bundled data (`peg paper-tables`)."""
