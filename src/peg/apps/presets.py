"""The presets: YAML files shipped inside the package (`peg/apps/configs/*.yaml`, package data),
so `peg bench quick` works from an installed wheel as from a checkout."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def folder() -> Path:
    """The folder of the presets (`importlib.resources`: wherever the package is installed)."""
    return Path(str(resources.files("peg.apps").joinpath("configs")))


def names() -> list[str]:
    """Every preset's name, sorted (`quick`, `fashion-mnist`, ..., `diversity`)."""
    return sorted(p.stem for p in folder().glob("*.yaml"))


def find(name_or_path: str | Path) -> Path:
    """A spec file: the path itself when it is a file, else the preset of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = folder() / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    raise FileNotFoundError(
        f"spec: {str(name_or_path)!r} is neither a file nor a preset; presets: {names()}"
    )
