"""The crawl streams: discovery stored page by page and resumed from its cursor, few requests per model, and a Hub
that refuses connections found once per run (a local Hub with small listing pages; fine-tunes hard-linked)."""

from __future__ import annotations

import socket
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from builders import planted_finetune
from modelvec.hub.client import HubSettings
from modelvec.hub.discovery import Scope
from modelvec.run import embed, embed_discovered
from modelvec.run.discover import discover_pages
from modelvec.store import Store
from modelvec.testing.localhub import LocalHub

BASE = "google-bert/bert-base-uncased"
N = 12
PAGE = 4  # models per listing page: three pages of declared fine-tunes


def _files(folder: Path, meta: dict) -> dict[str, bytes | Path]:
    out: dict[str, bytes | Path] = {p.name: p for p in folder.iterdir() if p.is_file()}
    out["README.md"] = f"---\n{yaml.safe_dump(meta)}---\n# model\n".encode()
    return out


@pytest.fixture(scope="module")
def hub(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    ft = planted_finetune(tiny_bert, root / "ft", seed=5)
    hub = LocalHub(root / "hub", page_size=PAGE)
    hub.publish(BASE, _files(tiny_bert, {"license": "apache-2.0"}), downloads=10**6)
    for i in range(N):
        hub.publish(f"u{i:02d}/ft", _files(ft, {"base_model": BASE}), downloads=1000 - i, link=True)
    return hub


def _settings(server, tmp_path: Path) -> HubSettings:
    return HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)


def _listings(server) -> list[tuple]:
    """The listing requests answered: (query items) each, to see which were asked again."""
    return [
        tuple(sorted((k, tuple(v)) for k, v in r["query"].items()))
        for r in server.requests
        if r["path"] == "/api/models" and r["status"] == 200
    ]


def test_discovery_stopped_mid_listing_goes_on_from_its_stored_cursor(hub, tmp_path):
    store = tmp_path / "s.duckdb"
    scope = Scope(search=False)
    with hub.serve() as server, Store(store) as db:
        settings = _settings(server, tmp_path)
        pages = discover_pages(BASE, scope, db, hub_settings=settings)
        first = next(pages)  # the first page judged and stored, then the run stops (an exception, a kill)
        pages.close()
        assert len(first.entries) == PAGE and len(db.reads.catalogue(BASE)) == PAGE
        asked = _listings(server)
        *_, last = discover_pages(BASE, scope, db, hub_settings=settings)
    assert last.done and {e.model for e in last.entries} == {f"u{i:02d}/ft" for i in range(N)}
    resumed = _listings(server)[len(asked) :]
    # no listing page answered before the stop is asked for again, beyond the page each listing had in hand
    repeated = [q for q in resumed if q in asked]
    assert len(repeated) <= 2, repeated  # the base's two names: at most the page each was on
    assert len(_listings(server)) <= len(asked) + 2 * (N // PAGE) + 2


def test_requests_per_model_against_the_local_hub(hub, tmp_path):
    with hub.serve() as server:
        result = embed_discovered(BASE, store=tmp_path / "s.duckdb", hub_settings=_settings(server, tmp_path))
        per_repo = Counter(
            r["path"].split("/resolve/")[0].strip("/") for r in server.requests if "/resolve/" in r["path"]
        )
        total = len(server.requests)
    assert sorted(result.embedded) == [f"u{i:02d}/ft" for i in range(N)]
    # a full fine-tune: config.json (one GET), its safetensors header, its rows: no model info, no listing of its own
    assert all(per_repo[f"u{i:02d}/ft"] <= 3 for i in range(N)), per_repo
    assert total <= 3 * N + 12, Counter(r["path"] for r in server.requests)  # the base and the listings besides


def test_a_hub_that_refuses_connections_is_found_once_and_every_model_recorded_transient(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = HubSettings(
        endpoint=f"http://127.0.0.1:{port}", cache_dir=str(tmp_path / "hf"), token=False, backoff=1.0
    )
    models = [f"lab/ft-{i:02d}" for i in range(31)]
    start = time.monotonic()
    with Store(tmp_path / "s.duckdb") as db:
        result = embed(BASE, models, store=db, hub_settings=settings)
        kinds = Counter(db.reads.failures()["kind"])
    seconds = time.monotonic() - start
    assert seconds < 10, seconds  # not a retry with backoff per model (that was minutes)
    assert sorted(result.failed) == models and kinds == {"transient": len(models)}
    assert len(result.notes) == 1 and "refuses connections" in next(iter(result.notes))
    assert all("\n" not in line and "refuses connections" in line for line in result.failed.values())
