"""`with_output`: use a model whose forward returns a tuple, a dict or an object, not logits.

Everything in peg calls `model(x)` (`model(**inputs)` for mapping batches, `peg.source.batches`) and
expects logits `[B, C]` (Gaussian heads `[B, 2]` for regression). A HuggingFace-style output, a
mapping or `ModelOutput` with a `logits` entry, is understood as it is. A model that returns
something else — a `(logits, features)` tuple, logits under another key — is wrapped once, and the
wrapper is used wherever a model is accepted (PEG/PEP, `Ensemble` with loop or vmap, `train`,
Deep Ensembles, SWA/SWAG, MC dropout, temperature scaling, `evaluate`, archives):

    net = peg.with_output(model, "logits")                 # out["logits"] (or out.logits)
    net = peg.with_output(model, 0)                        # out[0] of a tuple or list
    net = peg.with_output(model, lambda out: out[0][:, -1])  # anything else
    ens = peg.PEG(n_members=10).fit(net, (X_val, y_val))

The wrapper is an ordinary `nn.Module` holding the model as its child `model`, so its state-dict
keys are the model's with a `model.` prefix (`fc.weight` becomes `model.fc.weight`). An archive
saved from a wrapped model is loaded with a wrapped model, `peg.load(path,
peg.with_output(Net(), "logits"))`; `peg.load` says so when given the bare model. Keys and
indices (str, int) are plain data, so the wrapper deep-copies and pickles like the model; a
lambda deep-copies but does not pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from peg.errors import OutputFnError

OutputFn = str | int | Callable[[Any], Tensor]
PREFIX = "model."  # state-dict prefix of a wrapped model's entries


def _describe(out: Any) -> str:
    """A short description of a forward output that is not a Tensor."""
    if isinstance(out, Mapping):
        return f"{type(out).__name__} with keys {list(out)[:6]}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} of {len(out)}"
    return type(out).__name__


def output_example(out: Any) -> str:
    """A `peg.with_output(...)` call that would pick the logits out of `out`, for messages."""
    if isinstance(out, Mapping):
        key = "logits" if "logits" in out else next(iter(out), "logits")
        return f"peg.with_output(model, {key!r})"
    if isinstance(out, (tuple, list)):
        return "peg.with_output(model, 0) for the first element"
    if hasattr(out, "logits"):
        return "peg.with_output(model, 'logits')"
    return "peg.with_output(model, lambda out: ...)"


def logits_of(out: Any) -> Any:
    """The logits of a forward output: a tensor as it is; a mapping's `"logits"` entry or an
    object's `logits` attribute (HuggingFace's `ModelOutput` is both); anything else as it is."""
    if isinstance(out, Tensor):
        return out
    if isinstance(out, Mapping):
        return out.get("logits", out)
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, Tensor) else out


def model_output(out: Any, where: str, shaped: bool = False) -> Tensor:
    """Check that a forward pass returned logits `[B, C]` and return them: a tensor, or a
    mapping / object with a `logits` entry (HuggingFace's convention; no `with_output` needed).
    `shaped`: logits `[B, *]` of any shape (`peg.source._kinds`: binary scores `[B]`, dense
    `[B, C, *S]`), as the members' outputs of a predictor are read.
    """
    out = logits_of(out)
    if not isinstance(out, Tensor):
        raise TypeError(
            f"{where}: the model's forward must return a Tensor of logits [B, C] (or a mapping "
            f"with 'logits'), got {_describe(out)}; pick the logits with the output_fn hook, "
            f"e.g. {output_example(out)}"
        )
    if (out.ndim < 1) if shaped else (out.ndim != 2):
        raise ValueError(
            f"{where}: the model's forward must return logits [B, C], got shape {tuple(out.shape)}"
        )
    return out


def _check_output_fn(output_fn: Any) -> OutputFn:
    if isinstance(output_fn, bool) or not (
        isinstance(output_fn, (str, int)) or callable(output_fn)
    ):
        raise TypeError(
            "output_fn: expected a key (str), an index (int) or a callable(output) -> Tensor, "
            f"got {type(output_fn).__name__}"
        )
    return output_fn


def select_output(out: Any, output_fn: OutputFn) -> Tensor:
    """Apply `output_fn` (a key, an index or a callable) to a forward output."""
    if isinstance(output_fn, str):
        if isinstance(out, Mapping):
            if output_fn not in out:
                raise OutputFnError(
                    f"output_fn: the model's output has no key {output_fn!r}; keys: {list(out)}"
                )
            picked = out[output_fn]
        elif hasattr(out, output_fn) and not isinstance(out, Tensor):
            picked = getattr(out, output_fn)
        else:
            raise OutputFnError(
                f"output_fn: cannot take {output_fn!r} from the model's output, a "
                f"{_describe(out)} (expected a dict or an object with that attribute)"
            )
    elif isinstance(output_fn, int):
        if isinstance(out, Tensor) or not isinstance(out, Sequence):
            raise OutputFnError(
                f"output_fn: cannot take element {output_fn} of the model's output, a "
                f"{_describe(out)} (expected a tuple or a list)"
            )
        if not -len(out) <= output_fn < len(out):
            raise OutputFnError(
                f"output_fn: index {output_fn} is out of range for the model's output, a "
                f"{_describe(out)}"
            )
        picked = out[output_fn]
    else:
        picked = output_fn(out)
    if not isinstance(picked, Tensor):
        raise OutputFnError(
            f"output_fn: must give a Tensor of logits [B, C], got {_describe(picked)} "
            f"from the model's output ({_describe(out)})"
        )
    return picked


class WithOutput(nn.Module):
    """`model` whose forward output goes through `output_fn`: made by `peg.with_output`.

    Args:
        model: the wrapped module (a child: state-dict keys gain the prefix `model.`).
        output_fn: a key (`out[key]` of a dict, or `out.key` of an object), an index (`out[i]`
            of a tuple or list), or a callable `output_fn(out) -> Tensor`.

    `forward(*args, **kwargs)` is `select(model(*args, **kwargs))`; train/eval modes, devices,
    `functional_call` and `vmap` all go through to the wrapped model.
    """

    def __init__(self, model: nn.Module, output_fn: OutputFn) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        self.model = model
        self.output_fn = _check_output_fn(output_fn)
        self.training = model.training  # the wrapper starts in the model's mode

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return select_output(self.model(*args, **kwargs), self.output_fn)

    def extra_repr(self) -> str:
        fn = self.output_fn
        shown = repr(fn) if isinstance(fn, (str, int)) else getattr(fn, "__name__", "callable")
        return f"output_fn={shown}"


def with_output(model: nn.Module, output_fn: OutputFn) -> WithOutput:
    """Wrap `model` so that its forward returns `output_fn` applied to the model's output.

    The `output_fn` hook for models whose forward returns a tuple, a dict or an object:

        peg.with_output(hf_model, "logits")        # {"logits": ...} or an object with .logits
        peg.with_output(model, 0)                  # (logits, features) -> logits
        peg.with_output(model, lambda out: out["logits"][:, 0])

    Returns a `WithOutput` module (see its docstring and `peg.output` for the state-dict prefix
    `model.` this adds). The model is wrapped, not copied: the wrapper shares its weights.
    """
    return WithOutput(model, output_fn)


__all__ = [
    "OutputFn",
    "OutputFnError",
    "WithOutput",
    "logits_of",
    "model_output",
    "select_output",
    "with_output",
]
