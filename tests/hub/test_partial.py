"""Partial downloads (modelvec.hub.partial), Hub models read by byte ranges: a representation that reads a share of
rows fetches only those bytes, through the real huggingface_hub client against a local Hub that counts what it sends,
and gets the local copy's vector."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from builders import SHARDS, llama_pair, shard_in_two
from modelvec import DeltaEmbedder, Representation, Store, embed
from modelvec.core.spans import merge
from modelvec.hub.client import HubSettings
from modelvec.hub.partial import partial_folder
from modelvec.run.work import WHOLE_BIN, WHOLE_SERVED
from modelvec.testing.localhub import LocalHub

# the weights' own sketch: these checkpoints are matrices only (no model to run on the probe; what the probe's Hub base
# fetches is tests/run/test_probe_inputs.py's)
ROWS = Representation(rows=0.05, projection="countsketch", probe="none")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A Llama-shaped bf16 base (one file) and two fine-tunes (sharded; one file), large enough that 5 % of rows
    is far less than the file (2 layers, width 1024, 58 MB a model)."""
    root = tmp_path_factory.mktemp("llm")
    base, ft = llama_pair(root / "a", 1024, 4096, 2, torch.bfloat16, scale=1e-2)
    _, other = llama_pair(root / "b", 1024, 4096, 2, torch.bfloat16, scale=1e-2, seed=0)
    yield {"base": base, "sharded": shard_in_two(ft, root / "sharded"), "single": other}
    shutil.rmtree(root, ignore_errors=True)  # ~230 MB, for this module only


@pytest.fixture()
def hub(tmp_path, models):
    hub = LocalHub(tmp_path / "hub")
    for repo, key in (("org/base", "base"), ("org/ft-sharded", "sharded"), ("org/ft-single", "single")):
        hub.publish(repo, models[key], link=True)
    return hub


@pytest.fixture()
def server(hub):
    with hub.serve() as srv:
        yield srv


@pytest.fixture()
def hub_settings(server, tmp_path):
    return HubSettings(
        endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=1, backoff=0.01, timeout=10
    )


def weight_gets(server, repo):
    return [
        r for r in server.requests if r["method"] == "GET" and re.match(rf"/{repo}/resolve/.*\.safetensors$", r["path"])
    ]


def spans(gets):
    """The byte ranges [start, stop) the Hub was asked for."""
    return [(int(a), int(b) + 1) for r in gets for a, b in [re.fullmatch(r"bytes=(\d+)-(\d+)", r["range"]).groups()]]


def matrix_bytes(folder):
    files = sorted(folder.glob("*.safetensors"))
    return sum(t.numel() * t.element_size() for f in files for k, t in load_file(str(f)).items() if ".layers." in k)


def embed_both(hub_settings, tmp_path):
    """Both fine-tunes from the local Hub, with ROWS, into a fresh store."""
    return embed(
        "org/base",
        ["org/ft-sharded", "org/ft-single"],
        representation=ROWS,
        hub_settings=hub_settings,
        store=tmp_path / "s.duckdb",
    )


def test_a_hub_model_fetches_only_the_rows_its_vector_reads(models, server, hub_settings, tmp_path):
    result = embed_both(hub_settings, tmp_path)
    assert sorted(result.embedded) == ["org/ft-sharded", "org/ft-single"] and not result.failed and not result.notes
    local = DeltaEmbedder(ROWS).fit(models["base"])
    for i, key in enumerate(("sharded", "single")):
        np.testing.assert_allclose(result.vectors[i], local.embed_one(models[key]), rtol=1e-6, atol=1e-6)
    for repo, key in (("org/ft-sharded", "sharded"), ("org/ft-single", "single"), ("org/base", "base")):
        gets = weight_gets(server, repo)
        assert gets and all(r["range"] and r["status"] == 206 for r in gets)  # no whole-file download
        sent = sum(r["bytes"] for r in gets)
        # the bytes sent are the ranges asked for: none beyond its request's range, and every wanted byte (a
        # request retried under load resumes where the first stopped, so the ranges asked may overlap)
        assert all(r["bytes"] <= b - a for r, (a, b) in zip(gets, spans(gets)))
        files = {r["path"] for r in gets}
        wanted = sum(sum(b - a for a, b in merge(spans([r for r in gets if r["path"] == f]))) for f in files)
        assert sent >= wanted
        assert sent <= 0.08 * matrix_bytes(models[key])  # 5 % of rows: the headers and coalesced gaps cost the rest
    folder = partial_folder("org/ft-sharded", server.hub._state("org/ft-sharded")["refs"]["main"], hub_settings)
    assert sum(f.stat().st_blocks * 512 for f in folder.glob("*.safetensors")) < 0.2 * matrix_bytes(models["sharded"])


def test_each_models_read_plan_is_worked_out_once_a_run(models, server, hub_settings, tmp_path, monkeypatch):
    """One ``embed`` of Hub ids: each model's read plan (which rows, hence which bytes) is worked out once, where its
    headers first come (the byte ranges to fetch), and handed on to what reads it next (the engine's prefetch)."""
    from modelvec.represent import blocks

    planned: dict[str, int] = {}
    read_plan = blocks.read_plan

    def counted(ck, representation, *, base):
        planned[ck.name] = planned.get(ck.name, 0) + 1
        return read_plan(ck, representation, base=base)

    monkeypatch.setattr(blocks, "read_plan", counted)
    result = embed_both(hub_settings, tmp_path)
    assert sorted(result.embedded) == ["org/ft-sharded", "org/ft-single"] and not result.failed
    assert planned == {"org/base": 1, "org/ft-sharded": 1, "org/ft-single": 1}


def test_the_default_reads_every_row_of_a_small_model_and_its_row_budget_of_a_large_one_by_ranges(
    models, server, hub_settings, tmp_path, monkeypatch
):
    """``rows="auto"`` through the Hub: below the size threshold every row of the matrices, by byte ranges (no
    whole file); from it, ``auto_rows`` rows of each matrix. Either way the local copy's vector."""
    from modelvec.represent import representation as rep_module

    auto = Representation(rows="auto", probe="none")
    small = embed(
        "org/base", ["org/ft-single"], representation=auto, hub_settings=hub_settings, store=tmp_path / "a.duckdb"
    )
    local = DeltaEmbedder(auto).fit(models["base"])
    assert all(p.n_selected == p.n_rows for p in local.plans_.values())  # 2 layers of width 1024: under 50M values
    np.testing.assert_allclose(small.vectors[0], local.embed_one(models["single"]), rtol=1e-6, atol=1e-6)
    gets = weight_gets(server, "org/ft-single")
    assert gets and all(r["range"] and r["status"] == 206 for r in gets)
    assert matrix_bytes(models["single"]) <= sum(r["bytes"] for r in gets) < 1.05 * matrix_bytes(models["single"])

    monkeypatch.setattr(rep_module, "AUTO_FROM", 1)  # every model is large: the row budget
    fresh = HubSettings(**{**hub_settings.__dict__, "cache_dir": str(tmp_path / "fresh")})
    start = server.bytes_sent("/org/ft-single/*")
    large = embed("org/base", ["org/ft-single"], representation=auto, hub_settings=fresh, store=tmp_path / "b.duckdb")
    budget = DeltaEmbedder(auto).fit(models["base"])
    assert all(p.n_selected == min(rep_module.AUTO_ROWS, p.n_rows) for p in budget.plans_.values())
    np.testing.assert_allclose(large.vectors[0], budget.embed_one(models["single"]), rtol=1e-6, atol=1e-6)
    planned = sum(p.n_selected * p.n_cols for p in budget.plans_.values()) * 4  # float32 rows
    assert server.bytes_sent("/org/ft-single/*") - start <= 2 * planned + (1 << 20)  # the rows, gaps, headers


def test_narrow_rows_cost_their_share_not_the_gaps_between_them(tmp_path):
    """SmolLM2-135M's widths (rows of 576 bf16 values, 1 KiB): 5 % of them in blocks of a few rows, each block
    closer to the next than the coalescing gap. The gaps are fetched only where no longer than the blocks."""
    base, ft = llama_pair(tmp_path / "narrow", 576, 1536, 4, torch.bfloat16, scale=1e-2)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("org/base", base, link=True)
    hub.publish("org/ft", ft, link=True)
    with hub.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False)
        result = embed(
            "org/base", ["org/ft"], representation=ROWS, hub_settings=hub_settings, store=tmp_path / "s.duckdb"
        )
        assert result.embedded == ["org/ft"]
        np.testing.assert_allclose(result.vectors[0], DeltaEmbedder(ROWS).fit(base).embed_one(ft), rtol=1e-6, atol=1e-6)
        gets = weight_gets(server, "org/ft")
        asked = sum(b - a for a, b in spans(gets))
    assert asked <= 0.10 * matrix_bytes(ft)  # headers included (at 64 KiB coalescing alone: the whole k and v)


def test_another_share_fetches_only_what_is_missing_and_no_keep_weights_deletes_it(
    models, server, hub_settings, tmp_path
):
    store = tmp_path / "s.duckdb"
    embed("org/base", ["org/ft-single"], representation=ROWS, hub_settings=hub_settings, store=store)
    before = server.bytes_sent("/org/ft-single/*")
    first = len(weight_gets(server, "org/ft-single"))
    again = embed(
        "org/base", ["org/ft-single"], representation=ROWS, hub_settings=hub_settings, store=store, force=True
    )
    assert again.embedded == ["org/ft-single"] and len(weight_gets(server, "org/ft-single")) == first  # all held
    wider = Representation(rows=0.1, projection="countsketch", probe="none")
    result = embed(
        "org/base", ["org/ft-single"], representation=wider, hub_settings=hub_settings, store=store, keep_weights=False
    )
    local = DeltaEmbedder(wider).fit(models["base"]).embed_one(models["single"])
    np.testing.assert_allclose(result.vectors[0], local, rtol=1e-6, atol=1e-6)
    fetched_again = server.bytes_sent("/org/ft-single/*") - before
    assert 0 < fetched_again < 0.2 * matrix_bytes(models["single"])  # a share of rows, not the file
    fresh = HubSettings(**{**hub_settings.__dict__, "cache_dir": str(tmp_path / "fresh")})
    start = server.bytes_sent("/org/ft-single/*")
    embed("org/base", ["org/ft-single"], representation=wider, hub_settings=fresh, store=tmp_path / "fresh.duckdb")
    assert fetched_again < 0.9 * (server.bytes_sent("/org/ft-single/*") - start)  # what 5 % held was not fetched again
    sha = server.hub._state("org/ft-single")["refs"]["main"]
    assert not partial_folder("org/ft-single", sha, hub_settings).exists()  # --no-keep-weights
    assert partial_folder(
        "org/base", server.hub._state("org/base")["refs"]["main"], hub_settings
    ).exists()  # the base stays


def test_a_bin_checkpoint_is_downloaded_whole_and_said_once(models, hub, server, hub_settings, tmp_path):
    state = load_file(str(models["single"] / "model.safetensors"))
    folder = tmp_path / "bin"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text((models["single"] / "config.json").read_text())
    hub.publish("org/ft-bin", folder)
    result = embed(
        "org/base",
        ["org/ft-bin", "org/ft-single"],
        representation=ROWS,
        hub_settings=hub_settings,
        store=tmp_path / "s.duckdb",
    )
    assert sorted(result.embedded) == ["org/ft-bin", "org/ft-single"]
    assert result.notes == {WHOLE_BIN: ["org/ft-bin"]}
    np.testing.assert_allclose(result.vectors[0], result.vectors[1], rtol=1e-6, atol=1e-6)  # the same weights


def test_a_server_that_ignores_range_gives_the_same_vector(models, hub, server, hub_settings, tmp_path):
    hub.fail("/org/ft-single/resolve/*/model.safetensors", kind="ignore-range", times=None)
    result = embed(
        "org/base", ["org/ft-single"], representation=ROWS, hub_settings=hub_settings, store=tmp_path / "s.duckdb"
    )
    local = DeltaEmbedder(ROWS).fit(models["base"]).embed_one(models["single"])
    np.testing.assert_allclose(result.vectors[0], local, rtol=1e-6, atol=1e-6)
    assert result.notes == {WHOLE_SERVED: ["org/ft-single"]}


def test_bad_answers_are_recorded_with_their_kind_and_the_run_goes_on(models, hub, server, hub_settings, tmp_path):
    """A wrong Content-Range on every try is the network's fault (transient); a header that claims more bytes than
    the file has is the file's (content); the other model is embedded."""
    raw = (models["single"] / "model.safetensors").read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_text((models["single"] / "config.json").read_text())
    (cut / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    hub.publish("org/ft-cut", cut)
    hub.fail("/org/ft-sharded/resolve/*/" + SHARDS[1], kind="bad-content-range", times=None)
    store = tmp_path / "s.duckdb"
    result = embed(
        "org/base",
        ["org/ft-sharded", "org/ft-cut", "org/ft-single"],
        representation=ROWS,
        hub_settings=hub_settings,
        store=store,
    )
    assert result.embedded == ["org/ft-single"]
    assert "org/ft-sharded: " in result.failed["org/ft-sharded"] and SHARDS[1] in result.failed["org/ft-sharded"]
    assert "claims" in result.failed["org/ft-cut"]
    with Store(store) as db:
        kinds = dict(zip(db.reads.failures()["model"], db.reads.failures()["kind"]))
    assert kinds == {"org/ft-sharded": "transient", "org/ft-cut": "content"}


def test_coalesced_ranges_give_the_vectors_of_ranges_fetched_one_by_one(models, server, monkeypatch, tmp_path):
    """The same model read with every range its own request, with the gaps between its rows fetched and sliced
    away, and with those requests kept under a cap: identical vectors; coalescing makes fewer requests of more
    bytes, the cap more requests, none over it."""
    representation = Representation(rows=0.05, projection="countsketch", probe="none")
    got = {}
    for how, gap, cap in (("one by one", 0, None), ("coalesced", 1 << 20, None), ("capped", 1 << 20, 48 << 10)):
        monkeypatch.setattr("modelvec.hub.partial.GAP", gap)
        monkeypatch.setattr("modelvec.hub.partial.CAP", cap)
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / how), token=False, retries=1)
        first = len(server.requests)
        result = embed(
            "org/base",
            ["org/ft-sharded"],
            representation=representation,
            hub_settings=settings,
            store=tmp_path / f"{how}.duckdb",
        )
        assert result.embedded == ["org/ft-sharded"] and not result.failed
        gets = weight_gets(server, "org/ft-sharded")
        gets = [r for r in gets if r in server.requests[first:]]
        got[how] = (
            result.vectors[0],
            len(gets),
            sum(r["bytes"] for r in gets),
            max(r["bytes"] for r in gets if not r["range"].startswith("bytes=0-")),
        )  # headers: not capped
    (alone, requests, sent, _), (merged, fewer, more, longest), (capped, more_requests, _, most) = got.values()
    assert np.array_equal(alone, merged) and np.array_equal(alone, capped)
    assert fewer < requests and more > sent, (requests, fewer, sent, more)
    assert more_requests > fewer and most <= 48 << 10 < longest, (fewer, more_requests, most, longest)


@pytest.mark.parametrize("damage", ["data", "header", "old marker"])
def test_held_ranges_are_checked_before_they_are_read_again(models, server, hub_settings, tmp_path, damage):
    """A partial download read again by a later run: each held range is checked against the checksum kept when it
    was fetched, and one damaged since (or one a marker without checksums names) is fetched again, never read."""
    store = tmp_path / "s.duckdb"
    embed("org/base", ["org/ft-single"], representation=ROWS, hub_settings=hub_settings, store=store)
    sha = server.hub._state("org/ft-single")["refs"]["main"]
    folder = partial_folder("org/ft-single", sha, hub_settings)
    marker = json.loads((folder / ".modelvec-partial.json").read_text())
    held = marker["files"]["model.safetensors"]
    assert len(marker["sums"]["model.safetensors"]) == len(held)  # a checksum for each held range
    if damage == "old marker":
        del marker["sums"]
        (folder / ".modelvec-partial.json").write_text(json.dumps(marker))
    else:
        a, b = held[0] if damage == "header" else held[len(held) // 2]
        at = a + 9 if damage == "header" else (a + b) // 2  # inside the header's JSON, or a row's bytes
        with open(folder / "model.safetensors", "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x55]))
    before = server.bytes_sent("/org/ft-single/*")
    again = embed(
        "org/base", ["org/ft-single"], representation=ROWS, hub_settings=hub_settings, store=store, force=True
    )
    local = DeltaEmbedder(ROWS).fit(models["base"]).embed_one(models["single"])
    np.testing.assert_allclose(again.vectors[0], local, rtol=1e-6, atol=1e-6)
    fetched = server.bytes_sent("/org/ft-single/*") - before
    if damage == "old marker":
        assert fetched >= sum(b - a for a, b in held)  # nothing unchecked is trusted
    else:
        assert 0 < fetched < sum(b - a for a, b in held) / 2  # the damaged range alone
