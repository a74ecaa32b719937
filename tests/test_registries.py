"""Every registry of peg is one `peg.utils.registry.Registry`: one idiom to add to it (`add`,
`@register(key)`, or `add` from a class's `__init_subclass__`), one refusal of a key taken
twice, one error for a key unknown."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import peg
from peg.utils.registry import Registry, UnknownKeyError

SRC = Path(peg.__file__).resolve().parent
# a module-level name that reads as a registry (a `FORMATS` tuple of choices is no mapping)
NAMED_LIKE = re.compile(
    r"\w*(REGISTRY|REBUILDERS|WRAPPERS|FORMATS|ESTIMATORS|BUILDERS|CALIBRATORS)"
)
# the registries of peg (module, name): each must be found by the scan below
KNOWN = {
    ("peg.loading", "CALIBRATORS"),
    ("peg.loading", "FORMATS"),
    ("peg.recipe", "REBUILDERS"),
    ("peg._wrappers", "WRAPPERS"),
    ("peg.methods.estimation.estimators", "ESTIMATORS"),
    ("peg.models", "REGISTRY"),
    ("peg.apps.registry", "REGISTRY"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _assignments() -> list[tuple[str, str, ast.expr | None, ast.expr | None]]:
    """(module, name, annotation, value) of every module-level assignment in src/peg."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                found += [(_module(path), n, None, node.value) for n in names]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.append((_module(path), node.target.id, node.annotation, node.value))
    return found


def _is_dict(annotation: ast.expr | None, value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return True
    call = value.func if isinstance(value, ast.Call) else None
    if isinstance(call, (ast.Name, ast.Attribute)):
        name = call.id if isinstance(call, ast.Name) else call.attr
        if name in ("dict", "defaultdict", "OrderedDict"):
            return True
    text = ast.unparse(annotation) if annotation is not None else ""
    return re.match(r"(dict|Dict|defaultdict|MutableMapping)\b", text) is not None


def _is_registry(value: ast.expr | None) -> bool:
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "Registry"
    )


def test_no_registry_is_a_plain_dict():
    dicts = [
        f"{module}.{name}"
        for module, name, annotation, value in _assignments()
        if NAMED_LIKE.fullmatch(name) and not _is_registry(value) and _is_dict(annotation, value)
    ]
    assert not dicts, f"registries kept as plain dicts (make each a Registry): {dicts}"


def test_the_dict_scan_would_catch_one():
    tree = ast.parse("X_REGISTRY: dict[str, int] = {}\nESTIMATORS = {k: 1 for k in 'ab'}")
    first, second = tree.body
    assert isinstance(first, ast.AnnAssign) and isinstance(second, ast.Assign)
    assert _is_dict(first.annotation, first.value) and _is_dict(None, second.value)
    assert not _is_dict(None, ast.parse("FORMATS = ('md', 'csv')").body[0].value)


def test_every_registry_of_peg_is_a_registry():
    importlib.import_module("peg.methods")  # the definitions that fill them
    found = {(m, n) for m, n, _, value in _assignments() if _is_registry(value)}
    assert found >= KNOWN, f"registries not found by the scan: {KNOWN - found}"
    for module, name in sorted(found):
        registry = getattr(importlib.import_module(module), name)
        assert isinstance(registry, Registry), f"{module}.{name}"
        assert registry.what and len(registry) > 0, f"{module}.{name} is empty"
        assert all(isinstance(k, str) for k in registry), f"{module}.{name}"


def test_the_registries_hold_what_they_held():
    from peg import _wrappers, loading, models, recipe
    from peg.apps import registry as apps
    from peg.methods.estimation import ESTIMATORS

    assert loading.CALIBRATORS["temperature"] == peg.TemperatureScaling._from_archive
    assert list(loading.FORMATS) == ["peg-laplace"] and {"PEG", "PEP"} <= set(recipe.REBUILDERS)
    assert list(ESTIMATORS)[:3] == ["ac", "doc", "atc-mc"] and list(ESTIMATORS)[-1] == "auto"
    assert models.build("mlp", in_features=2, num_classes=3) is not None
    assert {"base", "peg", "temperature"} <= set(apps.REGISTRY)
    assert set(_wrappers.WRAPPERS) == {"Scaled", "CalibratedModel"}


def test_a_key_taken_twice_is_refused_naming_both():
    colours = Registry("colour")
    colours.add("red", "#f00")

    @colours.register("green")
    def green() -> str:
        return "#0f0"

    assert green() == "#0f0" and colours["green"] is green  # the decorator returns its argument
    with pytest.raises(ValueError, match=r"colour 'green' is registered already \(green\)"):
        colours.add("green", lambda: "#0f1")
    with pytest.raises(ValueError, match=r"colour 'red' is registered already \('#f00'\)"):
        colours.add("red", "#e00")
    assert colours["red"] == "#f00" and list(colours) == ["red", "green"]


def test_the_same_definition_again_replaces_the_first():
    """A module reloaded defines its classes anew: the registry takes the new one."""
    shapes = Registry("shape")

    def define() -> type:
        class Square:
            pass

        return Square

    first, again = define(), define()
    shapes.add("square", first)
    shapes.add("square", first)  # the same object: nothing to refuse
    shapes.add("square", again)  # same module and qualified name
    assert shapes["square"] is again and len(shapes) == 1


def test_an_unknown_key_names_what_and_the_known_keys():
    colours = Registry("colour")
    colours.add("red", 1)
    colours.add("blue", 2)
    with pytest.raises(KeyError) as caught:
        colours["mauve"]
    assert str(caught.value) == "colour: unknown 'mauve'; known: ['red', 'blue']"
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, UnknownKeyError)
    assert colours.get("mauve") is None and "mauve" not in colours and ["x"] not in colours
    with pytest.raises(KeyError, match="unknown 'mauve'"):
        colours.remove("mauve")


def test_a_registry_reads_as_a_read_only_mapping():
    colours = Registry("colour")
    colours.add("red", 1)
    assert dict(colours) == {"red": 1} and list(colours.items()) == [("red", 1)]
    assert list(colours.keys()) == ["red"] and len(colours) == 1 and "red" in colours
    with pytest.raises(TypeError):
        colours["blue"] = 2
    with pytest.raises(TypeError, match="key: a colour is registered under a non-empty str"):
        colours.add("", 3)
    colours.remove("red")
    assert len(colours) == 0
