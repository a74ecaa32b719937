"""peg packages: a wheel builds offline, holds the package, its type marker and the presets of
the applications only, asks for a torch range (never the exact pin the set-up script installs),
and the README states that range."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _torch_requirement(requirements: list[str]) -> Requirement:
    torch = [r for r in map(Requirement, requirements) if r.name == "torch" and not r.marker]
    assert len(torch) == 1, requirements
    return torch[0]


def _lower_bound(req: Requirement) -> Version:
    """The `>=` bound of a torch requirement that is a range: no `==`, `===` or `~=` pin."""
    ops = {s.operator for s in req.specifier}
    assert not ops & {"==", "===", "~="}, f"torch is pinned: {req}"
    lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(lower) == 1, f"torch needs one lower bound: {req}"
    return lower[0]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    """A wheel built from a copy of the sources (the work tree gets no build/ or egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "peg-src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "LICENSE", "setup.cfg"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "src", src / "src", ignore=ignore)
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation"]
    cmd += ["--no-index", "--disable-pip-version-check", "-q", "-w", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("peg-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (entry,) = [n for n in wheel.namelist() if re.fullmatch(rf"peg-[^/]+\.dist-info/{name}", n)]
    return wheel.read(entry).decode()


def test_wheel_holds_the_package_and_its_type_marker(wheel):
    names = set(wheel.namelist())
    assert "peg/__init__.py" in names
    assert "peg/py.typed" in names
    assert "peg/methods/perturbation/peg.py" in names  # subpackages too
    assert "peg/apps/cli.py" in names  # the applications, with the `peg` command


def test_wheel_holds_every_preset(wheel):
    """`peg bench quick` from an installed wheel: the presets are package data."""
    presets = sorted((ROOT / "src" / "peg" / "apps" / "configs").glob("*.yaml"))
    assert {p.stem for p in presets} >= {"quick", "fashion-mnist", "uci", "diversity"}
    names = set(wheel.namelist())
    for preset in presets:
        name = f"peg/apps/configs/{preset.name}"
        assert name in names, name
        assert wheel.read(name) == preset.read_bytes()


def test_the_presets_load_from_an_installed_wheel_outside_the_checkout(wheel, tmp_path):
    """The wheel unpacked as pip installs it, run from a folder with no configs/ beside it."""
    site = tmp_path / "site-packages"
    wheel.extractall(site)
    code = (
        "import sys, peg, peg.apps.presets as p\n"
        "from peg.apps.bench.spec import find_spec, load_specs\n"
        "assert peg.__file__.startswith(sys.argv[1]), peg.__file__\n"
        "assert str(find_spec('quick')).startswith(sys.argv[1]), find_spec('quick')\n"
        "assert [s.data for s in load_specs(find_spec('quick'))] == ['two-moons', 'digits']\n"
        "print(p.names())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "'quick'" in done.stdout and "'diversity'" in done.stdout


def test_wheel_holds_nothing_but_the_package(wheel):
    stray = [
        n
        for n in wheel.namelist()
        if not (n.startswith("peg/") or re.match(r"peg-[^/]+\.dist-info/", n))
    ]
    assert not stray  # no tests/, results/, benchmarks/, conftest.py ...
    assert not [n for n in wheel.namelist() if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_asks_for_a_torch_range_not_the_pin(wheel):
    meta = Parser().parsestr(_dist_info(wheel, "METADATA"))
    req = _torch_requirement(meta.get_all("Requires-Dist"))
    _lower_bound(req)
    assert req.specifier.contains("2.13.0")  # the version the tests run on is in range


def test_wheel_declares_the_peg_command(wheel):
    entry_points = _dist_info(wheel, "entry_points.txt")
    section = entry_points.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^peg\s*=\s*peg\.apps\.cli:main\s*$", section, flags=re.M)


def test_the_exact_torch_pin_lives_in_the_setup_script_only():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r'torch_pin="torch==\d+\.\d+\.\d+"', setup)
    project = _pyproject()["project"]
    every = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        every += extra
    _lower_bound(_torch_requirement(project["dependencies"]))
    assert not [r for r in every if Requirement(r).name == "torch" and "==" in r]


def test_readme_states_the_supported_torch_range():
    found = re.findall(r"torch\s*>=\s*(\d+(?:\.\d+)*)", (ROOT / "README.md").read_text())
    assert found, "README.md states no supported torch range (`torch>=X.Y`)"
    required = _lower_bound(_torch_requirement(_pyproject()["project"]["dependencies"]))
    assert {Version(v) for v in found} == {required}
