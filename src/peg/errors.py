"""Every exception of peg's own, in one place (the rest are Python's: ValueError, TypeError, ...).

Each subclasses the built-in error a caller would otherwise catch, so `except ValueError` keeps
working: a bad archive is a bad value, an unfitted estimator a missing attribute.
"""

from __future__ import annotations

__all__ = [
    "ArchiveError",
    "InvalidParameterError",
    "NonFiniteError",
    "NotFittedError",
    "NotFoldable",
    "NotStreamable",
    "OutputFnError",
    "RankFailure",
    "SpecError",
]


class InvalidParameterError(ValueError, TypeError):
    """A bad argument of a peg class: the message names it, says what was expected and what was
    given (`peg.methods._constraints`; every refusal of `Params._check_params`, at construction,
    in `set_params` and at `fit`).

    Both a ValueError and a TypeError, as scikit-learn's: a wrong type and a wrong value are one
    mistake, and `except ValueError` or `except TypeError` written for either keeps catching it.
    """


class NotFittedError(RuntimeError, AttributeError):
    """A fitted attribute (trailing underscore) or a prediction was asked for before `fit`.

    Also an AttributeError, as in scikit-learn, so `hasattr(method, "eta_")` is False before
    `fit` and `getattr(method, "eta_", None)` works.
    """


class ArchiveError(ValueError):
    """A file is not a peg archive, is damaged, or does not fit the model or data given to load
    it (a recipe rebuilt from other validation data, or by other code)."""


class NonFiniteError(FloatingPointError):
    """A loss, gradient or member weight became NaN or infinite."""


class NotFoldable(ValueError):
    """The model cannot run its members folded into the batch (the reason says why)."""


class NotStreamable(TypeError):
    """A predictor cannot give its member logits batch by batch without holding them all (a
    lazy PEG/PEP: chunks of members outside the batches); `member_logits` still works."""


class OutputFnError(ValueError):
    """`output_fn` cannot pick a Tensor out of the model's output (missing key, bad index...)."""


class SpecError(ValueError):
    """A benchmark spec is invalid; the message names the field."""


class RankFailure(RuntimeError):
    """Raised on every rank when some rank failed inside `peg.distributed.guarded`.

    Attributes:
        failures: rank → "what it was doing: ExceptionType: message".
    """

    def __init__(self, failures: dict[int, str], size: int) -> None:
        self.failures = dict(failures)
        if len(failures) == 1:
            ((rank, message),) = failures.items()
            said = f"rank {rank} of {size} failed ({message})"
        else:
            details = "; ".join(f"rank {r}: {m}" for r, m in failures.items())
            said = f"ranks {', '.join(map(str, failures))} of {size} failed ({details})"
        super().__init__(f"{said}; every rank stopped")
