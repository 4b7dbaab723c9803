"""The CLI is a thin shell: for every command with ``--json``, what it prints is what the API returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import modelvec
from builders import TIMINGS, as_printed, cli_json, planted_finetune
from modelvec.analyse.scores import Scoring
from modelvec.cli import app
from modelvec.hub.client import HubSettings
from modelvec.store import Store, overview
from modelvec.testing.localhub import LocalHub

DATASETS = ["imdb", "imdb", "imdb", "sst2", "sst2", "sst2"]


@pytest.fixture(scope="module")
def zoo(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-json")
    models = [
        planted_finetune(
            tiny_bert, root / f"ft{i}", seed=40 + (i % 3) + 10 * (d == "sst2"), scale=0.05 + 0.01 * i, card_datasets=[d]
        )
        for i, d in enumerate(DATASETS)
    ]
    return tiny_bert, models, root


def test_embed_show_cluster_neighbors_rank_evaluate_print_the_api_answer(zoo, tmp_path):
    base, models, _ = zoo
    api_store, cli_store = tmp_path / "api.duckdb", tmp_path / "cli.duckdb"
    api = modelvec.embed(base, models, store=api_store).as_json()
    cli = cli_json("embed", "--base", str(base), *map(str, models), "--store", str(cli_store))
    assert {**cli, "store": None} == as_printed({**api, "store": None}) and cli["embedded"]

    with Store(api_store) as db:
        api_show = as_printed(overview(db).as_json())
    cli_show = cli_json("show", "--store", str(api_store))
    assert cli_show == api_show and cli_show["models"]

    report = modelvec.cluster(base, store=api_store, out=tmp_path / "a", reduce="pca")
    cli_cluster = cli_json(
        "cluster", str(base), "--store", str(api_store), "--out", str(tmp_path / "a"), "--reduce", "pca"
    )
    assert cli_cluster == as_printed(report.as_json())
    voters = modelvec.cluster(base, store=api_store, out=tmp_path / "k", reduce="pca", k=3)  # Scoring's k, by name
    assert voters.k == 3 and voters.reduce == "pca" and report.k == 5

    found = modelvec.neighbors(str(models[0]), store=api_store, scoring=Scoring(k=3))
    assert cli_json("neighbors", str(models[0]), "--store", str(api_store), "--k", "3") == as_printed(found.as_json())
    one_by_one = modelvec.neighbors(str(models[0]), store=api_store, k=3)  # as the README's example writes it
    assert as_printed(one_by_one.as_json()) == as_printed(found.as_json())

    study = modelvec.depth_report(models[1], base=base, of="delta", thresholds=(0.5, 0.9), out=tmp_path / "r")
    cli_rank = cli_json(
        "rank",
        str(models[1]),
        "--base",
        str(base),
        "--of",
        "delta",
        "--threshold",
        "0.5,0.9",
        "--out",
        str(tmp_path / "r"),
    )
    assert cli_rank == as_printed(study.records())

    from modelvec.studies.grid import variants

    table = modelvec.evaluate(base, models, store=api_store, variants=variants())
    rows = cli_json("evaluate", *map(str, models), "--base", str(base), "--store", str(api_store))
    drop = lambda rs: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rs]
    assert drop(rows) == drop(as_printed(table.to_dict(orient="records")))


def test_discover_prints_the_api_answer(tiny_bert, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    files = {p.name: p for p in tiny_bert.iterdir() if p.is_file()}
    hub.publish("google-bert/bert-base-uncased", files, author="google-bert")
    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=3)
    card = b"---\nbase_model: google-bert/bert-base-uncased\ndatasets: [imdb]\n---\n"
    hub.publish("alice/bert-imdb", {**{p.name: p for p in ft.iterdir()}, "README.md": card})
    with hub.serve() as server:  # huggingface_hub reads HF_ENDPOINT once, at import: the CLI runs in a fresh process
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache")}
        api = modelvec.discover("bert-base-uncased", hub_settings=HubSettings(endpoint=server.endpoint), search=False)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "modelvec.cli",
                "discover",
                "bert-base-uncased",
                "--no-search",
                "--store",
                str(tmp_path / "s.duckdb"),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    cli = json.loads(out.stdout)
    assert cli == as_printed(api.as_json())
    assert [e["model"] for e in cli["entries"] if e["kept"]] == ["alice/bert-imdb"]


def test_help_and_show_do_not_import_torch(tmp_path):
    code = (
        "import sys\nfrom modelvec.cli import main\nsys.argv = ['modelvec', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    for args in (["--help"], ["show", "--store", str(tmp_path / "s.duckdb")]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "False", (args, out.stdout[-500:])


def test_help_is_printed_as_written_and_rewrapped():
    """Square brackets in help are text, not console markup, and a docstring paragraph is rewrapped whole."""
    embed = CliRunner().invoke(app, ["embed", "--help"])
    assert embed.exit_code == 0 and "'modelvec[ray]'" in embed.output  # the extra, not eaten as a style tag
    found = CliRunner().invoke(app, ["neighbors", "--help"])
    assert "the same representation against the stored base" in " ".join(found.output.split())
    lines = [line.strip() for line in found.output.splitlines()]
    assert "stored base, compared, and not stored." not in lines  # not broken where the docstring's source breaks
