"""The README's quick start, run as written on tiny models laid out where it expects the demo's zoo.

``make demo`` runs it on the real zoo and checks its output line by line (demo/check_docs.py); this test runs the
same commands in CI, where there is no zoo: a tiny BERT as ``.cache/zoo/base`` and planted fine-tunes under the
zoo's folder names, each with its dataset in its card.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from builders import planted_finetune

ROOT = Path(__file__).resolve().parents[2]


def quick_start() -> list[str]:
    """The ``$ `` commands of the console block under the README's quick start heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Quick start") :]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None, "the quick start has no console block"
    return [line[2:] for line in block.group(1).splitlines() if line.startswith("$ ")]


def test_the_readme_quick_start_runs_as_written(tiny_bert, tmp_path):
    commands = quick_start()
    assert [c.split()[1] for c in commands] == ["embed", "cluster", "neighbors"]
    zoo = tmp_path / ".cache" / "zoo"
    zoo.mkdir(parents=True)
    (zoo / "base").symlink_to(tiny_bert, target_is_directory=True)
    expanded = [subprocess.check_output(["bash", "-c", f"echo {c}"], text=True).split() for c in commands]
    embedded = [Path(w).name for w in expanded[0] if w.startswith(".cache/zoo/minilm-")]
    asked = [Path(w).name for w in expanded[2] if w.startswith(".cache/zoo/minilm-")]
    assert len(embedded) >= 4 and len(asked) == 1 and asked[0] not in embedded, (embedded, asked)
    for i, name in enumerate(embedded + asked):
        dataset = re.sub(r"^minilm-|-s\d+$", "", name)
        planted_finetune(tiny_bert, zoo / name, seed=100 + i, card_datasets=[dataset])
    env = {k: v for k, v in os.environ.items() if k not in ("MODELVEC_STORE", "HF_ENDPOINT")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", COLUMNS="80", HF_HUB_OFFLINE="1")
    said = []
    for command in commands:
        ran = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        out = ran.stdout + ran.stderr
        assert ran.returncode == 0, (command, out[-2000:])
        assert "Traceback" not in out and "error:" not in out, out[-2000:]
        said.append(out)
    assert f"embedded {len(embedded)}, skipped 0 (already stored), failed 0" in said[0], said[0][-2000:]
    printed = re.search(r"│ all\s+│ \d+\s+│ ([01]\.\d{3})", said[1])  # the kNN dataset score of all
    assert printed is not None, said[1][-2000:]
    again = subprocess.run(
        ["bash", "-c", commands[1] + " --json"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert printed.group(1) == f"{json.loads(again.stdout)['knn_score']:.3f}"  # the score it computed, as computed
    assert list((tmp_path / "my-map").glob("clusters-*.png")), "cluster drew no map"
    assert "predicted dataset:" in said[2] and "is not in the store: embedded now" in said[2], said[2][-2000:]
