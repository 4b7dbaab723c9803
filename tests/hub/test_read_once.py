"""One Hub model's embed by byte ranges works each thing out once (issue 50): its checkpoint opened once, each weight
file's header parsed once (where it comes from the Hub, not again from the local copy), its read plan computed once
(the base's too) and converted to byte ranges once, and handed down to what reads it next (the fetch, the prefetch, the embedder)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from builders import SHARDS, llama_pair, shard_in_two
from modelvec import Representation, embed
from modelvec.hub import partial
from modelvec.hub.client import HubSettings
from modelvec.read import checkpoint
from modelvec.represent import blocks, embedder
from modelvec.testing.localhub import LocalHub

ROWS = Representation(rows=0.05, projection="countsketch", probe="none")
FT = "org/ft"


def test_one_hub_model_is_opened_parsed_and_planned_once(tmp_path, monkeypatch):
    base, ft = llama_pair(tmp_path / "m", 256, 1024, 2, torch.bfloat16, scale=1e-2)
    hub = LocalHub(tmp_path / "hub")
    hub.publish("org/base", base, link=True)
    hub.publish(FT, shard_in_two(ft, tmp_path / "sharded"), link=True)

    opens: Counter[str] = Counter()
    parses: Counter[str] = Counter()  # by weight file of the model: from the Hub, and from the local copy
    plans: Counter[str] = Counter()
    spans: Counter[str] = Counter()

    init = checkpoint.Checkpoint.__init__

    def counted_init(self, path, name=None):
        opens[str(name)] += 1
        init(self, path, name)

    local_parse = checkpoint.header_of

    def counted_local(file):
        if "models--org--ft" in str(file):
            parses[Path(file).name] += 1
        return local_parse(file)

    remote_parse = partial.fetch_safetensors_header

    def counted_remote(repo_id, revision, filename, hub_settings):
        if repo_id == FT:
            parses[filename] += 1
        return remote_parse(repo_id, revision, filename, hub_settings)

    budget = blocks._budget  # every plan of a checkpoint's matrices (read_plan, plans_of, head_floats) comes from it

    def counted_plan(ck, layout, representation):
        plans[ck.name] += 1
        return budget(ck, layout, representation)

    byte_ranges = checkpoint.Checkpoint.byte_ranges

    def counted_spans(self, rows):
        spans[self.name] += 1
        return byte_ranges(self, rows)

    monkeypatch.setattr(checkpoint.Checkpoint, "__init__", counted_init)
    monkeypatch.setattr(checkpoint, "header_of", counted_local)
    monkeypatch.setattr(partial, "fetch_safetensors_header", counted_remote)
    monkeypatch.setattr(blocks, "_budget", counted_plan)
    monkeypatch.setattr(checkpoint.Checkpoint, "byte_ranges", counted_spans)
    if hasattr(embedder.DeltaEmbedder, "_plans_in"):  # the embedder's own plan of a model's rows (today's code)
        plans_in = embedder.DeltaEmbedder._plans_in

        def counted_plans_in(self, layout):
            plans[FT] += 1
            return plans_in(self, layout)

        monkeypatch.setattr(embedder.DeltaEmbedder, "_plans_in", counted_plans_in)

    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=1)
        result = embed("org/base", [FT], representation=ROWS, hub_settings=settings, store=tmp_path / "s.duckdb")
    assert result.embedded == [FT] and not result.failed

    assert opens[FT] == 1, opens
    assert parses == {name: 1 for name in SHARDS}, parses
    assert plans == {FT: 1, "org/base": 1}, plans  # the base's too: the fetch's read plan, the fit's plans, its head
    assert spans[FT] == 1, spans
