"""The tabular half of `benchmarks/label_free.py` (`--dataset tabular`): a model of another kind
than the image CNNs, so that nothing is tuned to them. UCI protein (45,730 rows, 9 features;
`peg.data.uci`, standard split 0, read from `--data-root`): the target (RMSD) cut at the
training split's quartiles into 4 classes; scikit-learn's `HistGradientBoostingClassifier`
(100 iterations, seed 0) fitted on the first `FIT_ROWS` training rows; the source is
`SOURCE_ROWS` other training rows; its logits are the log-probabilities (clipped at 1e-6).
Targets from the 4,573 test rows:
  - "label shift": Dirichlet(0.3) class priors (10 draws);
  - "covariate shift": the rows resampled with weights exp(λ · z_j) on a standardised
    feature j (3 features × λ ∈ {1, 2}): p(x) moves, p(y | x) does not;
  - "feature noise": Gaussian noise of σ ∈ {0.25, 0.5, 1, 1.5, 2} training standard
    deviations on every feature (the tabular kind of corruption);
  - "missing feature": one feature replaced by its training mean (each of the 9);
  - "feature noise + label shift": σ 0.5 and 1 with a Dirichlet(0.3) draw (3 each).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

FIT_ROWS, SOURCE_ROWS = 25_000, 5_000
NOISE = (0.25, 0.5, 1.0, 1.5, 2.0)


class TabularSets:
    def __init__(self, root: str | None) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        from peg.data.uci import load_uci

        X, t = (a.numpy().astype(np.float64) for a in load_uci("protein", "train", root))
        Xt, tt = (a.numpy().astype(np.float64) for a in load_uci("protein", "test", root))
        edges = np.quantile(t, [0.25, 0.5, 0.75])
        y, self.y = np.digitize(t, edges), np.digitize(tt, edges)
        self.mean, self.std = X.mean(0), X.std(0)
        self.model = HistGradientBoostingClassifier(max_iter=100, random_state=0)
        self.model.fit(X[:FIT_ROWS], y[:FIT_ROWS])
        rest = slice(FIT_ROWS, FIT_ROWS + SOURCE_ROWS)
        self.V, self.VL, self.X = self.logits(X[rest]), y[rest], Xt

    def logits(self, X: np.ndarray) -> np.ndarray:
        return np.log(np.clip(self.model.predict_proba(X), 1e-6, 1)).astype(np.float32)

    def source(self) -> tuple[np.ndarray, np.ndarray]:
        return self.V, self.VL

    def sets(self) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
        """(family, name, logits, labels) of every target set."""
        rng, X, y = np.random.default_rng(0), self.X, self.y

        def resample(labels: np.ndarray) -> np.ndarray:
            counts = rng.multinomial(len(labels), rng.dirichlet(np.full(4, 0.3)))
            picks = [rng.choice(np.nonzero(labels == c)[0], k) for c, k in enumerate(counts)]
            return np.concatenate(picks)

        def noisy(sigma: float) -> np.ndarray:
            return X + sigma * self.std * rng.standard_normal(X.shape)

        clean = self.logits(X)
        yield "clean", "clean", clean, y
        for d in range(10):
            idx = resample(y)
            yield "label shift", f"dirichlet {d}", clean[idx], y[idx]
        z = (X - self.mean) / self.std
        for j in (0, 3, 6):
            for lam in (1.0, 2.0):
                w = np.exp(lam * np.clip(z[:, j], -4, 4))
                idx = rng.choice(len(y), len(y), True, w / w.sum())
                yield "covariate shift", f"feature {j} tilt {lam}", clean[idx], y[idx]
        for sigma in NOISE:
            yield "feature noise", f"noise {sigma}", self.logits(noisy(sigma)), y
        for j in range(X.shape[1]):
            Xm = X.copy()
            Xm[:, j] = self.mean[j]
            yield "missing feature", f"feature {j} missing", self.logits(Xm), y
        for sigma in (0.5, 1.0):
            for d in range(3):
                idx = resample(y)
                logits = self.logits(noisy(sigma)[idx])
                yield (
                    "feature noise + label shift",
                    f"noise {sigma} + dirichlet {d}",
                    logits,
                    y[idx],
                )
