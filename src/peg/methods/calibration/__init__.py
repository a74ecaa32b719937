"""The calibrators: maps fitted on a predictor's logits (temperature, vector, matrix and
Dirichlet scaling, binning, isotonic, spline, ensemble temperature, order-preserving), their one
mechanism (`_calibrator.Calibrator`), label-shift reweighting, and a map as a model's last layer
(`composed`).

The classes are exported by `peg.methods` (and `peg`); this package imports nothing itself, so
its modules import each other in any order."""
