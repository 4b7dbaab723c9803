"""Write the constraints that pin every dependency of modelvec to its floor (``pkg==floor``), read from pyproject.toml.

``make test-floors`` installs the package with these constraints into a venv of its own and runs the tests that reach
each dependency's API, so that a floor stated in pyproject.toml is one that was run, not a guess. The runtime
dependencies and the extras named on the command line (``ray``, ``gguf``) are pinned; torch is left out (the Makefile
installs the local CPU build first: its floor is not checked here). Run: ``python .ci/floors.py [extra ...]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
UNPINNED = {"torch"}  # installed first from the local build; any other version pulls GBs of CUDA wheels
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def floors(extras: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Each dependency's name and its ``>=`` floor: the runtime ones and those of ``extras``."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    found: dict[str, str] = {}
    for requirement in requirements:
        match = _FLOOR.match(requirement)
        if match is None:
            raise ValueError(f"cannot read the requirement {requirement!r}")
        name, spec = match.group(1), match.group(2)
        floor = [s.strip()[2:].strip() for s in spec.split(",") if s.strip().startswith(">=")]
        if len(floor) != 1:
            raise ValueError(f"{requirement!r} states no single floor (>=)")
        found[name] = floor[0]
    return found


def main(argv: list[str]) -> None:
    for name, floor in floors(argv).items():
        if name not in UNPINNED:
            print(f"{name}=={floor}")


if __name__ == "__main__":
    main(sys.argv[1:])
