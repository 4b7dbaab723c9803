"""GPTQ, AWQ and bitsandbytes repositories on the Hub read by their own bytes, through the real huggingface_hub client
against a local Hub that counts what it sends: the headers, the quantizer's config, bitsandbytes' quantization states
and exactly the pieces of the rows a vector reads (no gap filled: ``GAP = 0``), the vector the local folder's; and
quantizations placed under what they round, whatever their card says, a lying card flagged."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from builders import llama_pair
from modelvec import DeltaEmbedder, Representation, embed
from modelvec.core.spans import merge, missing
from modelvec.hub import partial
from modelvec.hub.client import HubSettings
from modelvec.hub.partial import partial_folder
from modelvec.read import open_checkpoint
from modelvec.read.headers import header_of
from modelvec.run.work import plan_of
from modelvec.testing.localhub import LocalHub
from modelvec.testing.quantized import write_quantized

ROWS = Representation(rows=0.05, projection="countsketch", probe="none")
MADE = {
    "gptq": ("gptq", {"bits": 4, "group": 64, "desc_act": True}),
    "autogptq": ("gptq", {"bits": 8, "group": 128, "quantize_config": True}),
    "awq": ("awq", {"group": 64}),
    "nf4": ("nf4", {"nested": True}),
    "int8": ("int8", {}),
}


def needs(method: str) -> None:
    if method in ("nf4", "fp4", "int8"):
        pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A float32 Llama-shaped base and fine-tune (width 256, 1 layer), the fine-tune in each format of :data:`MADE`."""
    root = tmp_path_factory.mktemp("quantized-hub")
    base, ft = llama_pair(root / "a", 256, 512, 1, torch.float32, scale=1e-2)
    yield {"base": base, "ft": ft, "root": root}
    shutil.rmtree(root, ignore_errors=True)


def settings_of(srv, tmp_path: Path) -> HubSettings:
    return HubSettings(
        endpoint=srv.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=1, backoff=0.01, timeout=10
    )


def spans(server, repo: str, name: str) -> list[tuple[int, int]]:
    asked = [
        r
        for r in server.requests
        if r["method"] == "GET" and f"/{repo}/" in r["path"] and r["path"].endswith(f"/{name}")
    ]
    assert asked and all(r["status"] == 206 for r in asked)
    return [(int(a), int(b) + 1) for r in asked for a, b in [re.fullmatch(r"bytes=(\d+)-(\d+)", r["range"]).groups()]]


@pytest.mark.parametrize("name", list(MADE))
def test_a_quantized_repository_is_read_by_the_bytes_of_its_rows(models, name, tmp_path, monkeypatch):
    method, options = MADE[name]
    needs(method)
    folder = write_quantized(models["ft"], models["root"] / name, method, **options)
    monkeypatch.setattr(partial, "GAP", 0)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("u/base", models["base"], link=True)
    hub.publish(f"u/ft-{name}", folder, link=True)
    with hub.serve() as srv:
        settings = settings_of(srv, tmp_path)
        result = embed(
            "u/base", [f"u/ft-{name}"], representation=ROWS, hub_settings=settings, store=tmp_path / "s.duckdb"
        )
    assert result.embedded == [f"u/ft-{name}"] and not result.failed, result.failed
    np.testing.assert_array_equal(result.vectors[0], DeltaEmbedder(ROWS).fit(models["base"]).embed_one(folder))
    got = partial_folder(f"u/ft-{name}", srv.hub._state(f"u/ft-{name}")["refs"]["main"], settings)
    assert (got / ("quantize_config.json" if options.get("quantize_config") else "config.json")).is_file()
    ck = open_checkpoint(got)
    assert ck.quantized_types() and result.metadata["quantized"][0] == ",".join(ck.quantized_types())
    planned = ck.plan_reads(plan_of(ck, ROWS, base=False))[ck.path / "model.safetensors"]
    start, _ = header_of(folder / "model.safetensors")
    states = [
        (start + p.offset, start + p.offset + p.nbytes)
        for q in ck.linears.values()
        for k, p in q.parts.items()
        if k == "state"
    ]
    asked = spans(srv, f"u/ft-{name}", "model.safetensors")
    head = [s for s in asked if s[0] < start]  # the header (its first range: its data is not kept)
    assert len(head) == 1 and head[0][1] >= start
    assert merge(s for s in asked if s not in head) == missing([*states, *planned], [(0, start)])  # nothing else
    size = (folder / "model.safetensors").stat().st_size
    rows = (start + sum(b - a for a, b in asked if (a, b) not in head)) / size  # the header's probe is 128 KiB
    print(f"{name}: its header and rows {rows:.1%} of {size:,} bytes, {len(asked)} requests")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A float16 Llama-shaped base and fine-tune of width 1024 (ff 2816, 1 layer: files of 6-11 MB quantized)."""
    root = tmp_path_factory.mktemp("quantized-wide")
    base, ft = llama_pair(root / "a", 1024, 2816, 1, torch.float16, scale=1e-3)
    yield {"base": base, "ft": ft, "root": root}
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", ["gptq", "awq", "nf4", "int8"])
def test_the_share_of_a_quantized_file_fetched_at_5_percent_of_its_rows(wide, name, tmp_path):
    """At the fetcher's own gaps: bitsandbytes' rows are ranges of their own, at most 10 % of the file (the header, the
    quantization states and the rows' bytes); GPTQ's and AWQ's are a piece of every packed row (5.8 % and 8 % of the
    file, in 9,443 and 59,869 pieces), which would cost hundreds of times the file in requests: fetched whole, in a
    few requests."""
    method, options = MADE[name]
    needs(method)
    folder = write_quantized(wide["ft"], wide["root"] / name, method, **options)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("u/base", wide["base"], link=True)
    hub.publish("u/q", folder, link=True)
    with hub.serve() as srv:
        result = embed(
            "u/base", ["u/q"], representation=ROWS, hub_settings=settings_of(srv, tmp_path), store=tmp_path / "s.duckdb"
        )
    assert result.embedded == ["u/q"], result.failed
    asked = spans(srv, "u/q", "model.safetensors")
    share = sum(b - a for a, b in asked) / (folder / "model.safetensors").stat().st_size
    print(f"{name}: {share:.1%} of the file fetched in {len(asked)} requests")
    if method in ("gptq", "awq"):
        assert share > 0.99 and len(asked) <= 3
    else:
        assert share <= 0.10 and len(asked) < 200


def card(parent: str) -> bytes:
    return f"---\nbase_model: {parent}\nbase_model_relation: quantized\n---\n".encode()


@pytest.fixture(scope="module")
def placed(llama_family, tmp_path_factory):
    """The tiny Llama family on the Hub with quantizations of its models (the default representation): of a, cards
    naming its sibling b (a lie) and a truthful one; of b, truthful; of the base, naming it; and a GPTQ whose qweight
    does not fit its scales beside them."""
    base, a, b, _ = llama_family
    root = tmp_path_factory.mktemp("quantized-tree")
    hub = LocalHub(root / "hub")
    for repo, folder in (("u/base", base), ("u/a", a), ("u/b", b)):
        hub.publish(repo, folder, link=True)
    have_bnb = __import__("importlib").util.find_spec("bitsandbytes") is not None
    made = {
        "u/a-gptq": (a, "gptq", {}, "u/b"),
        "u/a-awq": (a, "awq", {}, "u/b"),
        "u/b-gptq": (b, "gptq", {"bits": 8}, "u/b"),
        "u/b-awq": (b, "awq", {}, "u/b"),
        "u/base-gptq": (base, "gptq", {"desc_act": True}, "u/base"),
    }
    if have_bnb:
        made |= {
            "u/a-nf4": (a, "nf4", {"nested": True}, "u/b"),
            "u/a-int8": (a, "int8", {}, "u/a"),
            "u/base-fp4": (base, "fp4", {}, "u/base"),
        }
    for repo, (folder, method, options, said) in made.items():
        out = write_quantized(folder, root / repo.split("/")[1], method, **options)
        (out / "README.md").write_bytes(card(said))
        hub.publish(repo, out, link=True)
    from safetensors.torch import load_file, save_file

    bad = shutil.copytree(root / "a-gptq", root / "bad-gptq")
    state = load_file(str(bad / "model.safetensors"))
    del state["model.layers.0.mlp.down_proj.scales"]
    save_file(state, str(bad / "model.safetensors"))
    hub.publish("u/bad-gptq", bad, link=True)
    store = root / "s.duckdb"
    with hub.serve() as srv:
        result = embed("u/base", ["u/a", "u/b", *made, "u/bad-gptq"], hub_settings=settings_of(srv, root), store=store)
    return store, result, made


def test_each_hub_quantization_is_placed_under_what_it_rounds_and_a_lying_card_is_flagged(placed):
    from modelvec.report.tree import model_tree

    store, result, made = placed
    assert sorted(result.embedded) == sorted(["u/a", "u/b", *made])
    assert list(result.failed) == ["u/bad-gptq"] and len(result.failed["u/bad-gptq"].splitlines()) == 1
    assert "missing tensor model.layers.0.mlp.down_proj.scales" in result.failed["u/bad-gptq"]
    nodes = {n.model: n for n in model_tree("u/base", store=store).nodes}
    rounds = {repo: "u/" + repo.split("/")[1].split("-")[0] for repo in made}
    for repo, parent in rounds.items():
        node = nodes[repo]
        assert node.kind == "quantization" and node.parent == parent, (repo, node.kind, node.parent)
        assert node.agrees == (made[repo][3] == parent), (repo, node.agrees)
