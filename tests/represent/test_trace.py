"""A model's trace (what the tree is inferred from) and adapters trained on a fine-tune, on real peft adapters.

The trace is linear in the weights (a merge's is its parents' weighted sum; an adapter on a fine-tune's is the
fine-tune's plus its own), its size against the base's says unrelated weights, and its levels say a quantization's
round trip; an adapter on a fine-tune is embedded as the model merged onto that fine-tune would be.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from modelvec import DeltaEmbedder, embed
from modelvec.core.errors import CheckpointError
from modelvec.store import Store


@pytest.fixture(scope="module")
def embedder(family):
    return DeltaEmbedder().fit(family / "base")


def test_an_adapter_on_a_fine_tune_is_the_model_merged_onto_it(family, embedder):
    on_parent = embedder.embed_traced(family / "adapter-on-a", parent=family / "a")
    merged = embedder.embed_traced(family / "merged-on-a")
    alone = embedder.embed_one(family / "adapter-on-a")
    np.testing.assert_allclose(on_parent.vector, merged.vector, atol=2e-5 * np.abs(merged.vector).max())
    np.testing.assert_allclose(
        on_parent.trace.sketch, merged.trace.sketch, atol=1e-6 * np.abs(merged.trace.sketch).max()
    )
    cosine = alone @ merged.vector / np.linalg.norm(alone) / np.linalg.norm(merged.vector)
    assert cosine < 0.9  # the adapter alone lacks its parent's delta: the difference is not rounding
    with pytest.raises(CheckpointError, match="only a LoRA adapter is embedded on a parent"):
        embedder.embed_traced(family / "b", parent=family / "a")


def test_a_parent_is_read_once_for_all_its_adapters_in_a_run(family, embedder, tmp_path, monkeypatch):
    """Three adapters on one fine-tune, in one ``embed``: the fine-tune's rows are read once (kept by its version for
    the next adapter, never pickled), and each adapter's vector is the one it has alone."""
    import shutil

    from modelvec.represent.embedder import DeltaEmbedder as Embedder

    adapters = [shutil.copytree(family / "adapter-on-a", tmp_path / f"adapter-{i}") for i in range(3)]
    read: list[str] = []
    raw_blocks = Embedder._raw_blocks

    def counted(self, ck):
        read.append(ck.name)
        return raw_blocks(self, ck)

    monkeypatch.setattr(Embedder, "_raw_blocks", counted)
    result = embed(family / "base", adapters, store=tmp_path / "s.duckdb")
    assert result.failed == {} and len(result.embedded) == 3
    assert read.count(str(family / "a")) == 1  # the parent, once; each adapter's own factors are read as theirs
    expected = embedder.embed_traced(family / "adapter-on-a", parent=family / "a").vector
    for vector in result.vectors:
        np.testing.assert_array_equal(vector, expected)
    assert "_parents" in embedder.__dict__ and "_parents" not in embedder.__getstate__()  # what Ray would ship


def test_traces_are_linear_in_the_weights_and_say_size_and_levels(family, embedder):
    trace = {name: embedder.embed_traced(family / name).trace for name in ("a", "b", "merge", "a-int8", "unrelated")}
    expected = 0.7 * trace["a"].sketch + 0.3 * trace["b"].sketch
    np.testing.assert_allclose(trace["merge"].sketch, expected, atol=1e-6 * np.abs(expected).max())
    scale = trace["a"].scale
    assert scale > 0 and all(t.scale == scale for t in trace.values())
    size = {name: np.linalg.norm(t.sketch) / scale for name, t in trace.items()}
    assert size["a"] < 0.3 and size["b"] < 0.3 and 1.0 < size["unrelated"] < 2.0  # about sqrt(2): two draws
    assert trace["a"].levels == pytest.approx(1.0, abs=0.05) and trace["unrelated"].levels > 0.9
    assert trace["a-int8"].levels < 0.8 * trace["a"].levels
    assert embedder.embed_traced(family / "adapter-on-a").trace.levels is None  # an adapter's factors hold no weights


def test_embed_stores_traces_and_embeds_a_local_adapter_on_the_fine_tune_it_names(family, embedder, tmp_path):
    store = tmp_path / "s.duckdb"
    result = embed(family / "base", [family / "a", family / "adapter-on-a"], store=store)
    assert result.failed == {}
    expected = embedder.embed_traced(family / "adapter-on-a", parent=family / "a")
    with Store(store, read_only=True) as db:
        base, key = db.con.execute("SELECT base, params FROM vectors LIMIT 1").fetchone()
        stored = db.reads.traces(base, key)
    traces = stored.frame.assign(sketch=list(stored.sketches)).set_index("model")
    adapter, parent = str(family / "adapter-on-a"), str(family / "a")
    got = result.vectors[list(result.metadata["model"]).index(adapter)]
    np.testing.assert_array_equal(got, expected.vector)
    np.testing.assert_allclose(traces.loc[adapter, "sketch"], expected.trace.sketch, rtol=1e-6)
    assert traces.loc[adapter, "parent"] == parent and pd.isna(traces.loc[parent, "parent"])
    # re-embedded (its old bytes left behind), then compacted: the traces move with the vectors
    embed(family / "base", [family / "a"], store=store, force=True, load=False)
    with Store(store) as db:
        before, after = db.writes.compact()
        again = db.reads.traces(base, key)
    assert after < before
    np.testing.assert_array_equal(again.sketches, stored.sketches)
