"""The pipeline's stages import down only: the import-linter contracts in pyproject.toml hold, and break
when a low stage imports a high one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [LINT, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    result.stdout = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)  # import-linter 2.6 (beside rich 13.8) colours a pipe
    return result


def test_the_package_keeps_every_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    names = tmp_path / "src" / "modelvec" / "core" / "names.py"
    names.write_text(names.read_text() + "\nfrom ..store import Store  # noqa: E402  (core reaching up to the store)\n")
    engine = tmp_path / "src" / "modelvec" / "run" / "local.py"
    engine.write_text(engine.read_text() + "\nfrom . import ray_engine  # noqa: E402  (one engine importing another)\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "Stages import down the pipeline only BROKEN" in result.stdout
    assert "modelvec.core.names -> modelvec.store" in result.stdout
    assert "never imported by each other BROKEN" in result.stdout


def _imports(src: Path) -> dict[str, set[str]]:
    """Each module of the package and the modules it imports anywhere: at the top, in a function, or only for the
    type checker (under ``TYPE_CHECKING``); a package and its own modules left out of each other's."""
    import ast

    modules = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                up = here[: len(here) - node.level + 1] if node.level else []
                start = ".".join([*up, node.module or ""]).strip(".")
                targets = [f"{start}.{a.name}" for a in node.names]  # a name that is no module: its module, below
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and not (target.startswith(name + ".") or name.startswith(target + ".") or target == name):
                    found.add(target)
        graph[name] = found
    return graph


def test_no_modules_import_each_other_not_even_for_the_type_checker():
    """No circle among the package's modules, whether the imports run or only the type checker reads them (the
    representation and its read plans, the local Hub and its server, the tree and its merges once were)."""
    import graphlib

    graph = _imports(ROOT / "src" / "modelvec")
    assert "modelvec.represent.plans" in graph["modelvec.represent.projection"]  # the scan sees relative imports
    assert "modelvec.store.formats.lock" in graph["modelvec.store.store"]
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import circle: {' -> '.join(exc.args[1])}") from None


def _house(src: Path) -> list[str]:
    """Where the package breaks its own rules (docs/layout.md): a module over 400 lines, a function over 80, a module
    docstring over 25 lines, a date in the source (history belongs in CHANGELOG.md)."""
    import ast

    date = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!T)")  # a dated note; an ISO timestamp's example is no history
    broken = []
    for path in sorted(src.rglob("*.py")):
        if "testing" in path.relative_to(src).parts:  # the loopback Hub: a test server outside the library's path
            continue
        text, name = path.read_text(), path.relative_to(src)
        tree = ast.parse(text)
        if len(text.splitlines()) > 400:
            broken.append(f"{name}: {len(text.splitlines())} lines")
        doc = ast.get_docstring(tree, clean=False)
        if doc and len(doc.splitlines()) > 25:
            broken.append(f"{name}: a module docstring of {len(doc.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 80:
                    broken.append(f"{name}:{node.lineno} {node.name}: {length} lines")
        broken += [f"{name}: the date {d}" for d in date.findall(text)]
    return broken


def test_the_package_keeps_its_house_rules(tmp_path):
    assert _house(ROOT / "src" / "modelvec") == []
    made = tmp_path / "modelvec"
    made.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (made / "long.py").write_text('"""Made 2026-01-01."""\n\n\ndef f():\n' + body + "\n" + "\n" * 320)
    assert _house(made) == ["long.py: 405 lines", "long.py:4 f: 82 lines", "long.py: the date 2026-01-01"]
