"""The pipeline's stages import down only: the import-linter contracts in pyproject.toml hold, and break
when a low stage imports a high one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


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
