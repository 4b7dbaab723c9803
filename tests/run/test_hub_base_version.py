"""A Hub base's version is its weights': a commit that changes only its card keeps every stored vector current."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file, save_file

import modelvec
from builders import planted_finetune
from modelvec.hub.client import HubSettings
from modelvec.hub.download import weights_identity
from modelvec.store import Population, Store
from modelvec.testing.localhub import LocalHub


def _files(folder):
    return {p.name: p for p in folder.iterdir() if p.is_file()}


def test_a_card_only_commit_of_the_base_keeps_its_vectors_and_new_weights_do_not(tiny_bert, tmp_path):
    fts = [planted_finetune(tiny_bert, tmp_path / f"ft{i}", seed=i) for i in range(2)]
    hub = LocalHub(tmp_path / "hub")
    first = hub.publish("org/base", _files(tiny_bert))
    for i, ft in enumerate(fts):
        hub.publish(f"u/ft{i}", _files(ft))
    store = tmp_path / "s.duckdb"
    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        run = lambda: modelvec.embed("org/base", ["u/ft0", "u/ft1"], store=store, hub_settings=settings, rank=4)
        assert sorted(run().embedded) == ["u/ft0", "u/ft1"]
        card = hub.publish("org/base", {**_files(tiny_bert), "README.md": b"# base\n\nA better card.\n"})
        assert weights_identity("org/base", card, settings) == weights_identity("org/base", first, settings)
        again = run()
        assert again.embedded == [] and sorted(again.skipped) == ["u/ft0", "u/ft1"]
        with Store(store, read_only=True) as db:
            assert db.versions.base_now("org/base") == f"git:{first}"
            assert len(Population(db, "org/base", modelvec.Representation(rank=4)).selection) == 2
        weights = load_file(str(tiny_bert / "model.safetensors"))
        key = next(k for k in weights if k.endswith("query.weight"))
        weights[key] = weights[key] + np.float32(1e-2)
        changed = tmp_path / "changed"
        changed.mkdir()
        save_file(weights, str(changed / "model.safetensors"))
        moved = hub.publish("org/base", {**_files(tiny_bert), "model.safetensors": changed / "model.safetensors"})
        assert weights_identity("org/base", moved, settings) != weights_identity("org/base", first, settings)
        third = run()
        assert sorted(third.embedded) == ["u/ft0", "u/ft1"]  # new weights: embedded again against them
        with Store(store, read_only=True) as db:
            assert db.versions.base_now("org/base") == f"git:{moved}"


def test_a_discovered_commit_with_the_weights_of_the_last_is_read_as_it(tiny_bert, tmp_path):
    """``base_now`` after a discovery recorded the card-only commit (no embed since): the version recorded with it."""
    store = tmp_path / "s.duckdb"
    with Store(store) as db:
        db.versions.record_base("org/base", "git:" + "a" * 40, "git:" + "a" * 40)
        db.writes.put_catalogue("org/base", "b" * 40, [])
        assert db.versions.base_now("org/base") == "git:" + "b" * 40  # nothing says it holds the same weights
        # what embed records once it has asked
        db.versions.record_base("org/base", "git:" + "b" * 40, "git:" + "a" * 40)
        assert db.versions.base_now("org/base") == "git:" + "a" * 40
