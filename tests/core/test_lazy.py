"""One lazy-import mechanism: every package that exports names of its submodules on first use does it through
core.lazy.lazy_exports, and the names it lists for type checkers (under TYPE_CHECKING) are exactly those."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import modelvec


def _lazy_packages():
    for info in pkgutil.walk_packages(modelvec.__path__, "modelvec."):
        if info.ispkg:
            yield info.name
    yield "modelvec"


def _declared(tree: ast.Module) -> tuple[set[str], set[str], set[str]]:
    """(names imported under TYPE_CHECKING, lazy names given to lazy_exports, its eager names)."""
    typing, lazy, eager = set(), set(), set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom):
                    typing |= {alias.asname or alias.name for alias in imp.names}
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "lazy_exports":
                mapping = ast.literal_eval(call.args[1])
                lazy |= {name for names in mapping.values() for name in names}
                for kw in call.keywords:
                    if kw.arg == "eager":
                        eager |= set(ast.literal_eval(kw.value))
    return typing, lazy, eager


def test_every_lazy_package_lists_the_same_names_for_type_checkers():
    seen = 0
    for name in _lazy_packages():
        module = importlib.import_module(name)
        source = Path(module.__file__).read_text()
        tree = ast.parse(source)
        assert "def __getattr__" not in source, f"{name}: a hand-written __getattr__ (use core.lazy.lazy_exports)"
        typing, lazy, eager = _declared(tree)
        if not lazy:
            continue
        seen += 1
        assert typing == lazy, f"{name}: TYPE_CHECKING imports {sorted(typing ^ lazy)} differ from the lazy names"
        assert set(module.__all__) == lazy | eager
        for attr in lazy:  # each resolves, to the object its submodule defines
            assert getattr(module, attr) is not None
    assert seen >= 4


def test_import_modelvec_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, modelvec; modelvec.Representation; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
