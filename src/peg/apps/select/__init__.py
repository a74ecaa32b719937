"""`peg.AutoSelect`: the best post-hoc predictor for a trained model, chosen by cross-fitting on
its validation data only (`auto`), from cross-fitted per-point scores (`cross`, `folds`) with a
report (`report`). Guide: docs/select.md."""

from peg.apps.select import (
    auto,
    builder,  # noqa: F401  (registers "auto-select")
)
from peg.apps.select.auto import AutoSelect

__all__ = ["DEFAULT_CANDIDATES", "AutoSelect"]


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "DEFAULT_CANDIDATES":  # the registry's maps now, not at this import
        return auto.DEFAULT_CANDIDATES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# AutoSelect's examples (its page, help()): added here, auto.py being at the applications' size
AutoSelect.__doc__ = f"""{AutoSelect.__doc__}
    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = 4 * (torch.randn(300, 3, generator=g) + torch.eye(3)[labels])  # saved
        >>> auto = peg.AutoSelect(cv=3, progress=False).fit(logits[:200], labels[:200])
        >>> isinstance(auto.chosen_, str)  # the candidate chosen; `auto.report_`: every score
        True
        >>> auto.predict_proba(logits[200:]).shape
        torch.Size([100, 3])

    See Also:
        peg.compare: every method's costs and metrics side by side, without choosing.
        peg.TemperatureScaling: the one-parameter map most choices end on.
        docs/select.md: the candidates, the one-SE rule and the time budget.
"""
