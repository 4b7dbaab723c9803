"""Every ``MODELVEC_*`` environment variable is read in one module, core/constants.py, and documented in
docs/commands.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from modelvec.core import constants

SRC = Path(constants.__file__).resolve().parents[1]
DOCS = SRC.parents[1] / "docs" / "commands.md"


def test_only_the_constants_module_names_an_environment_variable_of_modelvecs():
    """A string ``MODELVEC_...`` in code (not in a docstring or a message's words) outside core/constants.py would be
    a variable read somewhere else."""
    found = []
    for path in SRC.rglob("*.py"):
        if path == Path(constants.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if named and re.fullmatch(r"MODELVEC_[A-Z_]+", node.value):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
    names = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}
    assert names == set(constants.ENVIRONMENT)


def test_each_environment_variable_is_in_the_table_of_the_commands_docs():
    text = DOCS.read_text()
    for name, (meaning, default) in constants.ENVIRONMENT.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert meaning in row and default in row, row


def test_the_store_wait_is_read_when_asked_and_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("MODELVEC_STORE_WAIT", raising=False)
    assert constants.store_wait() is None
    monkeypatch.setenv("MODELVEC_STORE_WAIT", "inf")
    assert constants.store_wait() == float("inf")
    for bad, said in (("soon", "not a number of seconds"), ("-1", "give a number of seconds >= 0")):
        monkeypatch.setenv("MODELVEC_STORE_WAIT", bad)
        with pytest.raises(ValueError, match=f"MODELVEC_STORE_WAIT='{bad}': {said}"):
            constants.store_wait()
