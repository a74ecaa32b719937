"""peg inside the training frameworks users already run, one module per framework, each imported
only when asked for (`import peg` loads neither framework: tests/test_imports.py):

- `peg.integrations.lightning`: `CalibrationCallback`, a Lightning `Callback` fitting a
  calibrator (and a conformal predictor) on the validation logits after `fit` or at every
  validation, logging NLL and ECE before and after through the trainer's loggers.
- `peg.integrations.transformers`: `compute_metrics` for `Trainer(compute_metrics=...)`
  (accuracy, NLL, ECE, Brier) and `CalibrationCallback`, a `TrainerCallback` doing the same
  fit on the evaluation logits.

What both share (the calibrator named or given, the logits gathered on the CPU batch by batch,
the fit and its metrics) is `_common`. docs/integrations.md shows each from a user's side.
"""
