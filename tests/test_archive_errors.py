"""Bad input to peg.load: archives that are not what it expects: each case raises the documented
error, before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

import peg
from bad_inputs import (
    _fitted_peg,
    _mlp,
    _TupleOut,
    _val,
    raises_test,
    retensor,
    tamper,
)
from peg.archive import ArchiveError


def _not_an_archive(tmp: Path) -> None:
    path = tmp / "notes.txt"
    path.write_text("not a peg archive")
    peg.load(path, _mlp())


def _truncated_archive(tmp: Path) -> None:
    path = tmp / "a.peg"
    peg.Ensemble.from_models([_mlp()]).save(str(path))
    path.write_bytes(path.read_bytes()[:-40])
    peg.load(path, _mlp())


def _archive(tmp: Path, model: nn.Module | None = None) -> str:
    return peg.Ensemble.from_models([model if model is not None else _mlp()]).save(
        str(tmp / "members.peg")
    )


def _calibrated(tmp: Path, calibration: dict[str, object]) -> str:
    meta = {"calibration": calibration}
    return peg.Ensemble.from_models([_mlp()], meta=meta).save(str(tmp / "calibrated.peg"))


def _recipe(tmp: Path) -> str:
    return _fitted_peg().save(str(tmp / "recipe.peg"))  # the default: base weights + recipe


# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "load",
        "a file that is not a peg archive",
        _not_an_archive,
        ArchiveError,
        "not a peg archive",
    ),
    ("load", "a truncated archive", _truncated_archive, ArchiveError, "archive"),
    (
        "load",
        "no file at the path",
        lambda tmp: peg.load(tmp / "missing.peg", _mlp()),
        FileNotFoundError,
        "no peg archive",
    ),
    ("load", "a folder", lambda tmp: peg.load(tmp, _mlp()), FileNotFoundError, "no peg archive"),
    ("load", "model of the wrong type", lambda tmp: peg.load(tmp, "mlp"), TypeError, "model"),
    (
        "load",
        "Laplace.load of an ensemble archive",
        lambda tmp: peg.Laplace.load(_archive(tmp), _mlp()),
        ArchiveError,
        "an ensemble archive, not a saved peg.Laplace",
    ),
    (
        "load",
        "a model of another architecture",
        lambda tmp: peg.load(_archive(tmp), nn.Linear(2, 3)),
        ArchiveError,
        "does not match the archive's architecture",
    ),
    (
        "load",
        "the bare model for an archive of a wrapped one",
        lambda tmp: peg.load(_archive(tmp, peg.with_output(_TupleOut(), 0)), _TupleOut()),
        ArchiveError,
        r"peg\.with_output",
    ),
    (
        "load",
        "a PEG recipe (PEG/PEP's default save) without val",
        lambda tmp: peg.load(_recipe(tmp), _mlp()),
        ArchiveError,
        r"val: .* is a PEG-2 recipe .*validation points.*materialize=True",
    ),
    (
        "load",
        "a PEG recipe with other validation data",
        lambda tmp: peg.load(_recipe(tmp), _mlp(), val=(_val()[0] + 1, _val()[1])),
        ArchiveError,
        "not the validation data",
    ),
    (
        "load",
        "a calibrated archive of an unknown calibrator",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "platt"}), _mlp()),
        ArchiveError,
        "calibration: unknown kind 'platt'",
    ),
    (
        "load",
        "a temperature-scaled archive without a valid temperature",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "temperature", "temperature": -1}), _mlp()
        ),
        ArchiveError,
        "calibration: expected a temperature > 0",
    ),
    (
        "load",
        "a Dirichlet-calibrated archive without its weights",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "dirichlet", "params": {}}), _mlp()),
        ArchiveError,
        "calibration: the archive has no 'bias' tensor",
    ),
    (
        "load",
        "a calibrated archive with arguments the calibrator refuses",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "histogram-binning", "params": {"n_bins": 0}}), _mlp()
        ),
        ArchiveError,
        "calibration: the archive's arguments do not fit HistogramBinning: n_bins",
    ),
]



# --- tampered archives: the header is untrusted input (issue 32) --------------------------------
# Each probe rewrites one thing of a good archive; every one is an ArchiveError naming the file
# and the field, raised before any work (no raw KeyError/TypeError/RecursionError).
def _members(tmp: Path, change: object) -> None:
    path = _archive(tmp)
    tamper(path, change)  # type: ignore[arg-type]
    peg.load(path, _mlp())


def _in_recipe(tmp: Path, change: Callable[[dict], object]) -> None:
    path = _recipe(tmp)

    def changed(header: dict) -> None:
        change(header["meta"]["recipe"])

    tamper(path, changed)
    peg.load(path, _mlp(), val=_val())


def _laplace(tmp: Path, change: Callable[[dict], object] | None) -> None:
    path = str(tmp / "laplace.peg")
    peg.Laplace(prior_optimization=None).fit(_mlp(), _val()).save(path)

    def entries(tree: dict) -> object:
        found = dict(tree["__dict__"])
        change(found)
        tree["__dict__"] = [[k, v] for k, v in found.items()]

    tamper(path, entries if change is not None else lambda _: "[" * 100_000, key="peg-tree")
    peg.load(path, _mlp())


def _tensors(tmp: Path, change: Callable[[str, object], object], model: nn.Module | None = None):
    path = _archive(tmp)
    retensor(path, change)  # type: ignore[arg-type]
    peg.load(path, model if model is not None else _mlp())


def _nan_map(tmp: Path) -> None:
    path = str(tmp / "vector.peg")
    peg.VectorScaling().fit(_mlp(), _val()).save(path)
    retensor(path, lambda k, t: t * float("nan") if k.startswith("calibration/") else t)
    peg.load(path, _mlp())


def _pop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key) and None


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda d: d.update({key: value})


def _options(key: str, value: object) -> Callable[[dict], None]:
    return lambda r: r["options"].update({key: value})


LOAD = "load (tampered)"
TAMPERED: list[tuple[str, Callable[[Path], object], str]] = [
    ("the header is a JSON list", lambda t: _members(t, lambda h: []),
     r"members\.peg: header: expected a JSON object, got list"),
    ("the header nests 100,000 brackets", lambda t: _members(t, lambda h: "[" * 100_000),
     r"members\.peg: header: JSON nested too deeply"),
    ("the header is not JSON", lambda t: _members(t, lambda h: "{not json"),
     r"members\.peg: header: not valid JSON"),
    ("format_version is the string '2'", lambda t: _members(t, _set("format_version", "2")),
     r"members\.peg: header field 'format_version': expected an integer >= 1, got str '2'"),
    ("format_version is newer", lambda t: _members(t, _set("format_version", 99)),
     r"members\.peg: archive format version 99 is newer"),
    ("no 'stacked'", lambda t: _members(t, _pop("stacked")),
     r"members\.peg: header field 'stacked': expected a non-empty list of names, got nothing"),
    ("'stacked' holds a number", lambda t: _members(t, _set("stacked", [1])),
     r"header field 'stacked': expected a non-empty list of names"),
    ("'shared' is a string", lambda t: _members(t, _set("shared", "0.weight")),
     r"header field 'shared': expected a list of names"),
    ("a name both stacked and shared",
     lambda t: _members(t, lambda h: h.update(shared=h["stacked"][:1])),
     r"header field 'stacked': expected names that appear once"),
    ("'members' is a string", lambda t: _members(t, _set("members", "1")),
     r"header field 'members': expected an integer >= 1"),
    ("'members' disagrees with the tensors", lambda t: _members(t, _set("members", 5)),
     r"members\.peg: damaged peg archive \(stacked tensors .* do not hold the header's 5 members"),
    ("'meta' is a list", lambda t: _members(t, _set("meta", [])),
     r"header field 'meta': expected a JSON object, got list"),
    ("meta 'calibration' is a string",
     lambda t: _members(t, lambda h: h["meta"].update(calibration="temperature")),
     r"header field 'meta\.calibration': expected a JSON object"),
    ("a recipe without 'options'", lambda t: _in_recipe(t, _pop("options")),
     r"recipe\.peg: header field 'meta\.recipe\.options': expected a JSON object, got nothing"),
    ("recipe options with 'progress'", lambda t: _in_recipe(t, _options("progress", True)),
     r"recipe\.peg: recipe field 'meta\.recipe\.options': unknown options \['progress'\]"),
    ("recipe options with an unknown name", lambda t: _in_recipe(t, _options("lr", 1)),
     r"recipe\.peg: recipe field 'meta\.recipe\.options': unknown options \['lr'\]"),
    ("a negative recipe eta", lambda t: _in_recipe(t, _set("scale", -0.1)),
     r"recipe\.peg: header field 'meta\.recipe\.scale': expected a finite number > 0, "
     r"got float -0\.1"),
    ("a recipe scale named 'seed'", lambda t: _in_recipe(t, _set("scale_name", "seed")),
     r"recipe\.peg: recipe field 'meta\.recipe\.scale_name': expected 'eta' for PEG, got 'seed'"),
    ("recipe params '../../etc'", lambda t: _in_recipe(t, _options("params", "../../etc")),
     r"recipe\.peg: recipe field 'meta\.recipe\.options\.params'"),
    ("recipe options the constructor refuses", lambda t: _in_recipe(t, _options("bn", "sometimes")),
     r"recipe\.peg: recipe field 'meta\.recipe\.options': bn"),
    ("recipe n_members 20000 for 2 members",
     lambda t: _in_recipe(t, _options("n_members", 20_000)),
     r"recipe\.peg: recipe field 'meta\.recipe\.members': 2 members recorded where "
     r"options\.n_members = 20000"),
    ("recipe n_members 2,000,000 for 2 members",
     lambda t: _in_recipe(t, _options("n_members", 2_000_000)),
     r"the recipe's counts disagree"),
    ("recipe n_members a string", lambda t: _in_recipe(t, _options("n_members", "2")),
     r"recipe field 'meta\.recipe\.options\.n_members': expected an integer >= 1"),
    ("recipe fingerprints fewer than members",
     lambda t: _in_recipe(t, lambda r: r["fingerprints"].pop()),
     r"header field 'meta\.recipe\.fingerprints': expected a list of 2 \[projection, norm\] pairs"),
    ("recipe fingerprints hold a string",
     lambda t: _in_recipe(t, lambda r: r["fingerprints"][0].__setitem__(0, "x")),
     r"header field 'meta\.recipe\.fingerprints'"),
    ("recipe 'members' negative", lambda t: _in_recipe(t, _set("members", -1)),
     r"header field 'meta\.recipe\.members': expected an integer >= 1"),
    ("recipe 'searched' a string", lambda t: _in_recipe(t, _set("searched", "no")),
     r"header field 'meta\.recipe\.searched': expected true or false"),
    ("recipe of an unknown method", lambda t: _in_recipe(t, _set("method", "os.system")),
     r"recipe\.peg: recipe of an unknown kind 'os\.system'"),
    ("recipe of a newer version", lambda t: _in_recipe(t, _set("recipe_version", 9)),
     r"recipe\.peg: recipe of an unknown kind 'PEG' \(known: .*\) or a newer version \(9"),
    ("F64 weights where F32 was saved", lambda t: _tensors(t, lambda k, v: v.double()),
     r"members\.peg: tensors of another dtype than the model's: "
     r"\['0\.weight \(torch\.float64 in the archive, torch\.float32"),
    ("I32 weights where F32 was saved", lambda t: _tensors(t, lambda k, v: v.int()),
     r"tensors of another dtype than the model's: .*torch\.int32"),
    ("BOOL weights where F32 was saved", lambda t: _tensors(t, lambda k, v: v.bool()),
     r"tensors of another dtype than the model's: .*torch\.bool"),
    ("NaN weights", lambda t: _tensors(t, lambda k, v: v * float("nan")),
     r"members\.peg: damaged peg archive \(stacked tensor '0\.weight' holds NaN or inf"),
    ("Laplace file without 'params'", lambda t: _laplace(t, _pop("params")),
     r"laplace\.peg: Laplace file field 'params': expected a JSON object, got nothing"),
    ("Laplace file with unknown params",
     lambda t: _laplace(t, lambda d: d["params"]["__dict__"].append(["lr", 1])),
     r"laplace\.peg: Laplace file field 'params': .*lr"),
    ("Laplace file naming tensor '99'",
     lambda t: _laplace(t, _set("weights", {"__tensor__": "99"})),
     r"laplace\.peg: not a readable peg checkpoint \(damaged structure, KeyError: '99'\)"),
    ("Laplace file whose weights are a number", lambda t: _laplace(t, _set("weights", 3)),
     r"laplace\.peg: Laplace file field 'weights': expected a state dict of tensors"),
    ("Laplace file without its posterior", lambda t: _laplace(t, _pop("laplace")),
     r"laplace\.peg: Laplace file field 'laplace': expected a JSON object"),
    ("Laplace file of a newer version", lambda t: _laplace(t, _set("format_version", 2)),
     r"laplace\.peg: Laplace file field 'format_version': expected an integer >= 1 and <= 1"),
    ("Laplace file whose meta is a string", lambda t: _laplace(t, _set("meta", "x")),
     r"laplace\.peg: Laplace file field 'meta': expected a JSON object"),
    ("Laplace file nesting 100,000 lists", lambda t: _laplace(t, None),
     r"laplace\.peg: not a peg archive"),
    ("a vector scaling whose map holds NaN", _nan_map,
     r"calibration: 'bias' holds NaN"),
]  # fmt: skip
FILE_ERROR_CASES += [(LOAD, what, call, ArchiveError, regex) for what, call, regex in TAMPERED]


test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
