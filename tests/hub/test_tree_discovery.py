"""The Hub's model tree, followed from a base down through the local Hub: every relation, to any depth (bounded),
each model once (a cycle in declared bases ends, a model naming itself is skipped), and what each relation means
for embedding (an adapter on a fine-tune and a quantization are said, never mapped as fine-tunes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from builders import peft_adapter, planted_finetune
from modelvec.hub.client import HubSettings
from modelvec.run import discover
from modelvec.store import Store
from modelvec.testing.localhub import LocalHub

BASE = "google-bert/bert-base-uncased"


def files(folder: Path, meta: dict) -> dict[str, bytes | Path]:
    out: dict[str, bytes | Path] = {p.name: p for p in folder.iterdir() if p.is_file()}
    out["README.md"] = f"---\n{yaml.safe_dump(meta)}---\n# model\n".encode()
    return out


@pytest.fixture(scope="module")
def tree(tiny_bert, tmp_path_factory):
    """base -> a (fine-tune) -> b (its fine-tune) -> c (b's) -> d (c's: 4 deep); base -> lora (adapter);
    a -> lora-on-a (an adapter on a fine-tune); base + a -> merged (a merge); a -> a-gguf (a GGUF quantization, its
    file four bytes), a -> a-gptq (a GPTQ one, kept: read by its bytes), a -> a-exl2 (an EXL2 one: not read);
    base -> selfish (names itself too); a -> cyc1 -> cyc2 -> cyc1 (a cycle of declared bases)."""
    root = tmp_path_factory.mktemp("tree")
    hub = LocalHub(root / "hub")
    made = {name: planted_finetune(tiny_bert, root / name, seed=i) for i, name in enumerate("abcdxy")}
    hub.publish(BASE, files(tiny_bert, {"license": "apache-2.0"}))
    hub.publish("u/a", files(made["a"], {"base_model": BASE, "datasets": ["imdb"]}))
    hub.publish("u/b", files(made["b"], {"base_model": "u/a", "datasets": ["imdb"]}))
    hub.publish("u/c", files(made["c"], {"base_model": "u/b"}))
    hub.publish("u/d", files(made["d"], {"base_model": "u/c"}))
    adapter = {
        "adapter_config.json": b'{"peft_type": "LORA"}',
        "adapter_model.safetensors": made["x"] / "model.safetensors",
    }
    hub.publish("u/lora", {**adapter, "README.md": f"---\nbase_model: {BASE}\n---\n".encode()})
    hub.publish("u/lora-on-a", {**adapter, "README.md": b"---\nbase_model: u/a\n---\n"})
    hub.publish("u/merged", files(made["y"], {"base_model": [BASE, "u/a"]}))
    hub.publish("u/a-gguf", {"model.Q4_K_M.gguf": b"GGUF", "README.md": b"---\nbase_model: u/a\n---\n"})
    gptq = {"quantize_config.json": b'{"bits": 4}', "model.safetensors": made["x"] / "model.safetensors"}
    hub.publish("u/a-gptq", {**gptq, "README.md": b"---\nbase_model: u/a\nbase_model_relation: quantized\n---\n"})
    exl2 = b"---\nbase_model: u/a\nbase_model_relation: quantized\ntags: [exl2]\n---\n"
    hub.publish("u/a-exl2", {"model.safetensors": made["x"] / "model.safetensors", "README.md": exl2})
    hub.publish("u/lora-on-gguf", {**adapter, "README.md": b"---\nbase_model: u/a-gguf\n---\n"})
    hub.publish("u/selfish", files(made["y"], {"base_model": [BASE, "u/selfish"], "base_model_relation": "finetune"}))
    # a cycle of declared bases: cyc1 names a and cyc2, cyc2 names cyc1
    hub.publish("u/cyc1", files(made["y"], {"base_model": ["u/a", "u/cyc2"], "base_model_relation": "finetune"}))
    hub.publish("u/cyc2", files(made["y"], {"base_model": "u/cyc1", "base_model_relation": "finetune"}))
    return hub


def test_the_whole_tree_is_found_with_each_relation_level_and_parents(tree, tmp_path):
    with tree.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        found = discover(BASE, hub_settings=hub_settings, search=False, depth=5, store=tmp_path / "s.duckdb")
        shallow = discover(BASE, hub_settings=hub_settings, search=False, depth=1)
    by = {e.model: e for e in found.entries}
    assert [e.model for e in found.entries].count("u/a") == 1  # each model once, at its first level
    assert {m: (by[m].relation, by[m].depth) for m in ("u/a", "u/b", "u/c", "u/d", "u/lora", "u/merged")} == {
        "u/a": ("finetune", 1),
        "u/b": ("finetune", 2),
        "u/c": ("finetune", 3),
        "u/d": ("finetune", 4),
        "u/lora": ("adapter", 1),
        "u/merged": ("merge", 1),
    }
    assert by["u/b"].parents == ["u/a"] and sorted(by["u/merged"].parents) == sorted([BASE, "u/a"])
    assert all(by[m].kept for m in ("u/a", "u/b", "u/c", "u/d", "u/lora", "u/merged", "u/cyc1", "u/cyc2"))
    assert (by["u/cyc1"].depth, by["u/cyc2"].depth) == (2, 3)  # the cycle ended where it came back
    assert found.notes == [
        "u/cyc1: a cycle of declared bases (u/cyc1 -> u/cyc2 -> u/cyc1); followed once, stopped there"
    ]
    gptq = by["u/a-gptq"]  # kept: read by byte ranges, placed by its weights
    assert gptq.kept and gptq.reason.endswith("gptq (declares u/a): read by byte ranges, placed by its weights")
    exl2 = by["u/a-exl2"]
    assert not exl2.kept and exl2.reason.startswith("a quantization of u/a (exl2): recorded, not mapped")
    gguf = by["u/a-gguf"]  # kept: read by byte ranges, placed by its weights
    assert gguf.relation == "quantized" and gguf.kept
    assert gguf.reason.endswith("GGUF (declares u/a): read by byte ranges, placed by its weights")
    on_a = by["u/lora-on-a"]
    assert on_a.relation == "adapter" and on_a.kept and "an adapter on u/a: embedded on its delta" in on_a.reason
    assert not by["u/selfish"].kept and "names itself as its base" in by["u/selfish"].reason
    assert {e.model for e in shallow.entries} == {"u/a", "u/lora", "u/merged", "u/selfish"}  # one level
    on_gguf = by["u/lora-on-gguf"]  # an adapter on a quantization is not mapped: its delta is not a fine-tune's
    assert not on_gguf.kept and "an adapter on u/a-gguf (a quantization)" in on_gguf.reason
    with Store(tmp_path / "s.duckdb", read_only=True) as db:
        stored = db.reads.catalogue(base=BASE).set_index("model")
    assert stored.loc["u/d", "depth"] == 4 and stored.loc["u/d", "relation"] == "finetune"
    assert list(stored.loc["u/b", "parents"]) == ["u/a"]


def test_a_tree_deeper_than_asked_stops_at_the_depth(tree, tmp_path):
    with tree.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        found = discover(BASE, hub_settings=hub_settings, search=False, depth=2)
    assert max(e.depth for e in found.entries) == 2 and "u/c" not in {e.model for e in found.entries}
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        discover(BASE, hub_settings=hub_settings, search=False, depth=0)


def test_the_command_indents_the_tree_and_says_the_cycle_once(tree, tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf"), "MODELVEC_HUB_BACKOFF": "0.01", "COLUMNS": "200"}
    env.pop("HF_TOKEN", None)
    with tree.serve() as server:
        out = subprocess.run(
            [sys.executable, "-m", "modelvec.cli", "discover", BASE, "--depth", "5", "--no-search"]
            + ["--store", str(tmp_path / "s.duckdb")],
            capture_output=True,
            text=True,
            env={**env, "HF_ENDPOINT": server.endpoint},
            timeout=300,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("a cycle of declared bases") == 1
    assert "1 quantization recorded, not mapped (--rejected lists them)" in out.stdout
    names = [line.split("│")[1].rstrip()[1:] for line in out.stdout.splitlines() if line.count("│") > 2]
    assert names == [
        "u/a",
        "  u/a-gguf",  # kept: its bytes are read (and found to be no GGUF)
        "  u/a-gptq",
        "  u/b",
        "    u/c",
        "      u/d",
        "  u/cyc1",
        "    u/cyc2",
        "  u/lora-on-a",
        "u/lora",
        "u/merged",
    ]


def test_a_hub_adapter_on_a_fine_tune_is_embedded_on_its_parent(tiny_bert, tmp_path):
    """base -> u/ft (a fine-tune) -> u/lora-on-ft (a real peft adapter trained on it): embedded from the Hub as the
    fine-tune's delta plus its own, the parent named in its trace."""
    from modelvec import DeltaEmbedder
    from modelvec.run import embed_discovered

    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=3, scale=0.01)
    peft_adapter(ft, tmp_path / "adapter")
    hub = LocalHub(tmp_path / "hub")
    hub.publish(BASE, files(tiny_bert, {"license": "apache-2.0"}))
    hub.publish("u/ft", files(ft, {"base_model": BASE}))
    hub.publish("u/lora-on-ft", files(tmp_path / "adapter", {"base_model": "u/ft"}))
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        result = embed_discovered(BASE, store=store, hub_settings=hub_settings)
    assert result.failed == {} and sorted(result.embedded) == ["u/ft", "u/lora-on-ft"]
    expected = DeltaEmbedder().fit(tiny_bert).embed_traced(tmp_path / "adapter", parent=ft)
    got = result.vectors[list(result.metadata["model"]).index("u/lora-on-ft")]
    np.testing.assert_allclose(got, expected.vector, atol=1e-6 * np.abs(expected.vector).max())
    with Store(store, read_only=True) as db:
        key = db.con.execute("SELECT params FROM vectors LIMIT 1").fetchone()[0]
        traces = db.reads.traces(BASE, key).frame.set_index("model")
    assert traces.loc["u/lora-on-ft", "parent"] == "u/ft"


def test_an_adapter_whose_parent_is_gone_is_one_line_and_the_rest_goes_on(tiny_bert, tmp_path):
    """base -> u/ft -> u/lora-on-ft, and u/other; u/ft deleted after discovery: the adapter's failure names its
    parent, u/other is embedded."""
    from modelvec.run import discover as find
    from modelvec.run import embed_discovered

    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=3)
    other = planted_finetune(tiny_bert, tmp_path / "other", seed=4)
    hub = LocalHub(tmp_path / "hub")
    hub.publish(BASE, files(tiny_bert, {"license": "apache-2.0"}))
    hub.publish("u/ft", files(ft, {"base_model": BASE}))
    hub.publish("u/other", files(other, {"base_model": BASE}))
    hub.publish("u/lora-on-ft", files(peft_adapter(ft, tmp_path / "adapter"), {"base_model": "u/ft"}))
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        found = find(BASE, hub_settings=hub_settings, search=False, store=store)
        assert {e.model for e in found.kept} == {"u/ft", "u/other", "u/lora-on-ft"}
        hub.delete("u/ft")
        result = embed_discovered(BASE, store=store, hub_settings=hub_settings)
    assert result.embedded == ["u/other"]
    assert result.failed["u/lora-on-ft"].startswith("u/lora-on-ft: its parent u/ft: ")
    assert all("\n" not in why for why in result.failed.values()) and "u/ft" in result.failed


def test_a_stored_catalogue_is_put_in_the_order_asked_and_cut_at_the_limit():
    """``embed BASE --sort likes --limit 2`` reads the stored catalogue: by likes (or creation), most first; by
    downloads or last modification it keeps discovery's own order (declared fine-tunes first)."""
    from modelvec.hub.discovery import CatalogueEntry, Scope

    entries = [
        CatalogueEntry(model=m, base="b", kept=True, reason="", likes=likes, created_at=created)
        for m, likes, created in (("a", 1, "2024-01"), ("b", None, "2025-01"), ("c", 9, None))
    ]
    assert [e.model for e in Scope(sort="likes").ordered(entries)] == ["c", "a", "b"]
    assert [e.model for e in Scope(sort="created_at", limit=2).ordered(entries)] == ["b", "a"]
    for kept_order in ("downloads", "last_modified"):
        assert [e.model for e in Scope(sort=kept_order).ordered(entries)] == ["a", "b", "c"]


def test_a_quantization_nobody_read_is_placed_where_its_card_says_and_marked_not_read(tree, tmp_path):
    """u/a-gguf (a GGUF repository on the Hub whose file is no GGUF: four bytes) stands in the tree under the parent
    its card declares, marked as not read, with why; the models that were read are placed by their weights."""
    from modelvec.report.tree import model_tree
    from modelvec.run import embed_discovered

    store = tmp_path / "s.duckdb"
    with tree.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        embed_discovered(BASE, store=store, hub_settings=hub_settings, depth=2, search=False, limit=None)
    nodes = {n.model: n for n in model_tree(BASE, store=store).nodes}
    gguf = nodes["u/a-gguf"]
    assert gguf.kind == "quantization" and gguf.parents == ["u/a"] and gguf.confidence == 0.0
    assert gguf.note is not None and gguf.note.startswith(
        "not read (u/a-gguf: model.Q4_K_M.gguf: truncated: the file (4 bytes) ends inside its header)"
    )
    assert "u/a" in nodes and nodes["u/a"].note is None  # read: placed by its weights
