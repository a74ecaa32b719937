"""How a method shows itself in a notebook (`Display`, a base of every `peg.methods.base.Method`):
its class, whether it is fitted, its arguments (those set away from their defaults marked) and,
once fitted, its fitted values (the trailing-underscore attributes: the temperature `T`, PEG's
`eta_`, a conformal `quantile_`, the priors of `LabelShift`, ...), as HTML (`_repr_html_`,
`peg.utils.html`: every name and value escaped, CSS scoped to the block) and as markdown
(`_repr_markdown_`); `repr` stays the plain-text form (the constructor call).

A value is summarised, never dumped: numbers to 4 significant digits, a tensor or array of up
to `SHOWN` numbers in full and a larger one by its shape, dtype and range, a module or an
ensemble by its class and size.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor, nn

from peg.utils import html as _html

SHOWN = 10  # numbers of a tensor or list shown in full
LONGEST = 160  # characters of a value's text shown
HIDDEN = ("meta_",)  # what a fitted value's row would only repeat (`meta_`: the rest, as JSON)


def _number(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.4g}"


def _scalar(x: Any) -> bool:
    return isinstance(x, (int, float, np.number, np.bool_, str)) or x is None


def summary(value: Any) -> str:
    """One line saying what `value` is (see the module doc)."""
    if isinstance(value, Tensor) and value.device.type != "meta" and not value.is_complex():
        dtype = str(value.dtype).removeprefix("torch.")  # bfloat16 has no NumPy dtype: as float64
        wide = value.detach().cpu()
        return _numbers(wide.double().numpy() if wide.is_floating_point() else wide.numpy(), dtype)
    if isinstance(value, Tensor):  # on the meta device, or complex: by its shape
        return f"tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return _numbers(value, str(value.dtype))
    if isinstance(value, (int, float, np.number, np.bool_)):
        finite = isinstance(value, (int, np.integer, np.bool_)) or math.isfinite(value)
        return _number(value) if finite else str(float(value))
    if _scalar(value):
        return _cut(value if isinstance(value, str) else repr(value))
    if isinstance(value, (list, tuple)):
        if len(value) <= SHOWN and all(_scalar(v) for v in value):
            return _cut("[" + ", ".join(summary(v) for v in value) + "]")
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        if len(value) <= 6 and all(_scalar(v) for v in value.values()):
            return _cut(", ".join(f"{summary(k)}: {summary(v)}" for k, v in value.items()))
        return f"dict of {len(value)} entries"
    if isinstance(value, nn.Module):
        count = sum(p.numel() for p in value.parameters())
        return f"{type(value).__name__} ({count:,} parameters)"
    size = _length(value)
    return type(value).__name__ + ("" if size is None else f" ({size} members)")


def _numbers(value: np.ndarray, dtype: str) -> str:
    """An array in full (up to `SHOWN` numbers), else its shape, dtype and finite range."""
    if value.size <= SHOWN:
        flat = [_number(v) for v in value.reshape(-1).tolist()]
        return "[" + ", ".join(flat) + "]" if value.ndim else flat[0]
    finite = value[np.isfinite(value)] if value.dtype.kind == "f" else value
    spread = f", {_number(finite.min())} … {_number(finite.max())}" if finite.size else ""
    return f"array {list(value.shape)} {dtype}{spread}"


def doc_page(cls: type) -> str | None:
    """The reference page of `cls` (its name) where it is public (`peg.<name>`), else None."""
    public = sys.modules.get("peg")
    try:
        return cls.__name__ if getattr(public, cls.__name__, None) is cls else None
    except Exception:  # a lazy attribute of peg that cannot import here
        return None


def _length(value: Any) -> int | None:
    try:
        return len(value)
    except Exception:  # no length, or one that needs a fit first
        return None


def _cut(text: str) -> str:
    return text if len(text) <= LONGEST else text[: LONGEST - 1] + "…"


class Display:
    """`_repr_html_` and `_repr_markdown_` of a method (see the module doc); the class asks
    `get_params`, `_non_defaults` and `__sklearn_is_fitted__` of `Params` / `Method`."""

    # what `Params` and `Method` give the classes this is a base of
    get_params: Callable[..., dict[str, Any]]
    _non_defaults: Callable[[], set[str]]
    __sklearn_is_fitted__: Callable[[], bool]

    def _display_fitted(self) -> list[tuple[str, str]]:
        """(name, summary) of each fitted value, numbers first; none before `fit`."""
        if not self.__sklearn_is_fitted__():
            return []
        names = [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]
        names = [k for k in names if k not in HIDDEN]
        simple = [k for k in names if _scalar(vars(self)[k])]
        rows = [(k, summary(vars(self)[k])) for k in simple + [k for k in names if k not in simple]]
        size = _length(self)  # an ensemble's members (a calibrator's one is not worth a row)
        return rows + ([("members", str(size))] if size is not None and size > 1 else [])

    def _display_params(self) -> list[tuple[str, str, bool]]:
        """(name, value, set away from its default) of each constructor argument."""
        changed = self._non_defaults()
        params = self.get_params(deep=False)
        return [(k, _cut(repr(v)), k in changed) for k, v in params.items()]

    def _display_state(self) -> tuple[str, bool]:
        fitted = bool(self.__sklearn_is_fitted__())
        return ("fitted" if fitted else "not fitted"), fitted

    def _repr_html_(self) -> str:
        state, fitted = self._display_state()
        badge = "peg-badge " + ("peg-fitted" if fitted else "peg-unfitted")
        head = _html.join(
            [
                _html.element("span", type(self).__name__, "peg-name"),
                _html.element("span", state, badge),
                *([_html.doc_link(page)] if (page := doc_page(type(self))) else []),
            ]
        )
        parts: list[Any] = [_html.element("div", head, "peg-head")]
        params = self._display_params()
        changed = [[k, v] for k, v, set_ in params if set_]
        if changed:
            parts.append(_html.table(["argument", "value"], changed, caption="Arguments set"))
        if params:  # every argument, folded: a method may take twenty
            table = _html.table(["argument", "value"], [[k, v] for k, v, _ in params])
            summary = _html.element("summary", f"All {len(params)} arguments")
            parts.append(_html.element("details", _html.join([summary, table])))
        fitted_rows = self._display_fitted()
        if fitted_rows:
            parts.append(_html.table(["fitted", "value"], fitted_rows, caption="Fitted"))
        elif not fitted:
            parts.append(_html.element("p", "Not fitted: call fit(...) first.", "peg-note"))
        return str(_html.block(parts))

    def _repr_markdown_(self) -> str:
        state, _ = self._display_state()
        lines = [f"**{_html.md(type(self).__name__)}** ({state}; bold: arguments set)", ""]
        params = self._display_params()
        if params:
            lines += ["| argument | value |", "|---|---|"]
            lines += [
                f"| {'**' + k + '**' if s else k} | {_html.md_code(v)} |" for k, v, s in params
            ]
            lines.append("")
        fitted_rows = self._display_fitted()
        if fitted_rows:
            lines += ["| fitted | value |", "|---|---|"]
            lines += [f"| {_html.md(k)} | {_html.md(v)} |" for k, v in fitted_rows]
        return "\n".join(lines).rstrip() + "\n"


class RecordDisplay:
    """`__repr__`, `_repr_html_` and `_repr_markdown_` of a result record (a dataclass such as
    `peg.methods.estimation.Estimate`): its fields, numbers to 4 significant digits (never a
    16-digit float), mappings of numbers as a table of their own; `_doc` names the reference
    page the "?" links to."""

    _doc: str | None = None

    def _display_lead(self) -> tuple[str, str] | None:
        """(a sentence, its CSS class) shown above the fields, or None (a record's verdict)."""
        return None

    def _display_fields(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __repr__(self) -> str:
        said = ", ".join(f"{k}={_short(v)}" for k, v in self._display_fields().items())
        return f"{type(self).__name__}({said})"

    def _display_split(self) -> tuple[list[tuple[str, str]], dict[str, dict[str, Any]]]:
        """(name, summary) of each plain field; the mappings of numbers apart."""
        rows, tables = [], {}
        for k, v in self._display_fields().items():
            if isinstance(v, dict) and v and all(_scalar(x) for x in v.values()):
                tables[k] = v
            else:
                rows.append((k, summary(v)))
        return rows, tables

    def _repr_html_(self) -> str:
        name = type(self).__name__
        head = [_html.element("span", name, "peg-name")]
        head += [_html.doc_link(self._doc)] if self._doc else []
        rows, tables = self._display_split()
        parts: list[Any] = [_html.element("div", _html.join(head), "peg-head")]
        if (lead := self._display_lead()) is not None:
            parts.append(_html.element("div", lead[0], lead[1]))
        parts.append(_html.table(["field", "value"], rows))
        for k, v in tables.items():
            values = [[str(n), summary(x)] for n, x in v.items()]
            parts.append(_html.table([k, "value"], values, numeric=[False, True], caption=k))
        return str(_html.block(parts))

    def _repr_markdown_(self) -> str:
        rows, tables = self._display_split()
        lines = [f"**{_html.md(type(self).__name__)}**", ""]
        if (lead := self._display_lead()) is not None:
            lines += [_html.md(lead[0]), ""]
        lines += ["| field | value |", "|---|---|"]
        lines += [f"| {_html.md(k)} | {_html.md(v)} |" for k, v in rows]
        for k, v in tables.items():
            lines += ["", f"| {_html.md(k)} | value |", "|---|---:|"]
            lines += [f"| {_html.md(n)} | {_html.md(summary(x))} |" for n, x in v.items()]
        return "\n".join(lines) + "\n"


def _short(value: Any) -> str:
    """`value` in a repr: numbers rounded (4 significant digits), containers element-wise."""
    if isinstance(value, (float, np.floating)):
        return _number(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        if len(value) > SHOWN:
            return f"[{', '.join(_short(v) for v in value[:SHOWN])}, … ({len(value)} in all)]"
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_short(v)}" for k, v in value.items()) + "}"
    return repr(value)
