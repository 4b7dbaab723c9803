"""The dependency floors that ``make test-floors`` installs are the ones pyproject.toml states, every one of them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _floors_script():
    spec = importlib.util.spec_from_file_location("floors", ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _make_floors_extras() -> list[str]:
    """The extras the Makefile's test-floors installs (its call of .ci/floors.py)."""
    found = re.findall(r"\.ci/floors\.py ([\w ]+?) >", (ROOT / "Makefile").read_text())
    assert len(found) == 1, "the Makefile pins the floors with one call of .ci/floors.py"
    return found[0].split()


def test_every_dependency_states_one_floor_and_the_constraints_pin_it():
    project = _project()
    extras = [name for name in project["optional-dependencies"] if name != "dev"]
    assert sorted(_make_floors_extras()) == sorted(extras), "test-floors installs every extra but dev at its floors"
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]
    stated = {}
    for requirement in requirements:
        floors = [s.version for s in requirement.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{requirement} states one floor (>=)"
        stated[requirement.name] = floors[0]
    assert _floors_script().floors(extras) == stated
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "floors.py"), *extras], capture_output=True, text=True, check=True
    ).stdout
    pinned = dict(line.split("==") for line in out.split())
    assert pinned == {name: floor for name, floor in stated.items() if name != "torch"}


def test_the_python_floor_is_the_one_the_lint_checks_the_code_against():
    """requires-python's floor is the grammar ruff checks (``target-version``) and the typing mypy checks
    (``python_version``) on every ``make test``: code needing a newer Python fails the lint, not a user's install."""
    floor = re.fullmatch(r">=(\d+)\.(\d+)", _project()["requires-python"])
    assert floor is not None, "requires-python states one floor"
    major, minor = floor.groups()
    tools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert tools["ruff"]["target-version"] == f"py{major}{minor}"
    assert tools["mypy"]["python_version"] == f"{major}.{minor}"
    assert sys.version_info[:2] >= (int(major), int(minor))
