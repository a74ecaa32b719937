"""The keys of the classification metrics, as `peg.metrics.classification_metrics`,
`peg.metrics.streaming.StreamingMetrics` and `peg.evaluate` select and return them."""

from __future__ import annotations

from collections.abc import Iterable

# what is computed when no selection is given ("gibbs_nll" for member logits only)
DEFAULT_METRICS = ("nll", "error", "brier", "ece", "mce", "gibbs_nll")
CLASSIFICATION_METRICS = (*DEFAULT_METRICS, "adaptive_ece", "classwise_ece", "aurc", "augrc")
# the metrics that need every point's confidence and correctness (a global sort), streamed by
# keeping those O(N) scalars
RANKED = frozenset({"adaptive_ece", "aurc", "augrc"})


def check_metrics(metrics: str | Iterable[str] | None, name: str = "metrics") -> tuple[str, ...]:
    """The selected keys in the given order without repeats (None: `DEFAULT_METRICS`), or a
    ValueError naming `name` and listing the known keys."""
    if metrics is None:
        return DEFAULT_METRICS
    if isinstance(metrics, str):
        metrics = (metrics,)
    try:
        keys = tuple(dict.fromkeys(metrics))
    except TypeError:
        raise ValueError(
            f"{name}: expected a list of metric names, got {type(metrics).__name__}"
        ) from None
    unknown = [k for k in keys if k not in CLASSIFICATION_METRICS]
    if unknown or not keys:
        problem = f"unknown {unknown}" if unknown else "an empty selection"
        raise ValueError(f"{name}: {problem}; known: {list(CLASSIFICATION_METRICS)}")
    return keys
