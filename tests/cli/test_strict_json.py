"""Every ``--json`` answer, and every JSON file a report writes, is strict JSON: an undefined score is ``null``, never
``NaN``, which no parser but Python's reads (JavaScript's ``JSON.parse``, jq)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import modelvec
from builders import planted_finetune
from modelvec.cli import app
from modelvec.testing.localhub import LocalHub


def strict(text: str):
    """``text`` parsed as JSON is, refusing ``NaN``, ``Infinity`` and ``-Infinity``."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def lopsided(tiny_bert, tmp_path_factory):
    """A store where scores are undefined: one dataset of two models, one of one, and a model without a card (no
    clustering score, no author, a dataset too small to score)."""
    root = tmp_path_factory.mktemp("strict-json")
    labelled = [
        planted_finetune(tiny_bert, root / f"ft{i}", seed=80 + i, card_datasets=[d])
        for i, d in enumerate(["imdb", "imdb", "sst2"])
    ]
    lone = planted_finetune(tiny_bert, root / "lone", seed=90)
    store = root / "store.duckdb"
    assert not modelvec.embed(tiny_bert, [*labelled, lone], store=store).failed
    report = modelvec.cluster(tiny_bert, store=store, out=root / "api-map", reduce="pca")
    with pytest.raises(ValueError):  # the answer itself holds undefined scores: what the printer must write as null
        json.dumps(report.as_json(), allow_nan=False)
    return tiny_bert, [*labelled, lone], store, root


def commands(base: Path, models: list[Path], store: Path, out: Path) -> dict[str, list[str]]:
    """Each command with ``--json`` and its arguments on the lopsided store (discover has its own Hub, below)."""
    return {
        "embed": ["embed", "--base", str(base), *map(str, models), "--store", str(store)],
        "show": ["show", "--store", str(store)],
        "cluster": ["cluster", str(base), "--store", str(store), "--reduce", "pca", "--out", str(out / "map")],
        "neighbors": ["neighbors", str(models[-1]), "--store", str(store), "--k", "2"],
        "tree": ["tree", str(base), "--store", str(store), "--out", str(out / "tree")],
        "rank": ["rank", str(models[0]), "--base", str(base), "--of", "delta", "--out", str(out / "rank")],
        "evaluate": ["evaluate", *map(str, models), "--base", str(base), "--store", str(out / "evaluate.duckdb")],
    }


def test_every_json_answer_and_file_is_strict_json(lopsided, tmp_path):
    base, models, store, _ = lopsided
    runs = commands(base, models, store, tmp_path)
    undefined = 0
    for name, args in runs.items():
        result = CliRunner().invoke(app, [*args, "--json"])
        assert result.exit_code == 0, (name, result.output[-2000:])
        answer = strict(result.stdout)
        undefined += result.stdout.count("null")
        assert answer, name
    cluster = strict(CliRunner().invoke(app, [*runs["cluster"], "--json"]).stdout)
    assert cluster["silhouette"] is None and cluster["largest_author_share"] is None  # undefined: null
    assert cluster["n_models"] == len(models)
    ranks = strict((tmp_path / "rank" / "ranks.json").read_text())  # the file rank writes beside its figures
    fits = [fit for law in ranks["laws"] for fit in law["fits"]]
    assert fits and all(fit["r2"] is None or math.isfinite(fit["r2"]) for fit in fits)
    assert undefined


def test_discover_json_is_strict_json(tiny_bert, tmp_path):
    """discover asks a Hub (a local one here), read in a fresh process: huggingface_hub reads HF_ENDPOINT once."""
    hub = LocalHub(tmp_path / "hub")
    hub.publish("google-bert/bert-base-uncased", {p.name: p for p in tiny_bert.iterdir() if p.is_file()})
    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=3)
    card = b"---\nbase_model: google-bert/bert-base-uncased\ndatasets: [imdb]\n---\n"
    hub.publish("alice/bert-imdb", {**{p.name: p for p in ft.iterdir()}, "README.md": card})
    with hub.serve() as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache")}
        args = ["discover", "bert-base-uncased", "--no-search", "--store", str(tmp_path / "s.duckdb"), "--json"]
        out = subprocess.run(
            [sys.executable, "-m", "modelvec.cli", *args], capture_output=True, text=True, env=env, timeout=300
        )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [e["model"] for e in strict(out.stdout)["entries"] if e["kept"]] == ["alice/bert-imdb"]


def test_every_command_with_json_is_checked(tmp_path):
    """A command given ``--json`` later is checked here too: the commands above are every one that has it."""
    group = typer.main.get_command(app)
    with_json = {name for name, cmd in group.commands.items() if any("--json" in p.opts for p in cmd.params)}
    checked = set(commands(tmp_path, [tmp_path], tmp_path, tmp_path)) | {"discover"}
    assert with_json == checked
