"""Each delta at its top singular directions (``delta_rank``): the block is the CountSketch of Y = dW·H^T truncated
by its SVD, checked against the change of each module's output in transformers' own model on the base's inputs; a
delta of at most that rank is kept whole; an adapter on a fine-tune is truncated as its merged model is (the sum
first); the trace is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builders import module_inputs, write_tiny_tokenizer
from modelvec import DeltaEmbedder
from modelvec.represent import Representation
from modelvec.represent.probe import probe_ids

pytest.importorskip("transformers")

from tiny_families import _slice

TOKENS = 16
EXACT = dict(pooling="concat", block_norm=False, size="none", head="none")


def _sketched(projection, y: np.ndarray) -> np.ndarray:
    """The CountSketch of a change of outputs ``y`` (tokens x features) by ``projection``'s tables."""
    sketch = projection.sketch
    size = projection.size
    out = np.zeros(size)
    bucket = (sketch.h_out[:, None] + sketch.h_tok[None, :]) % size
    sign = sketch.s_out[:, None] * sketch.s_tok[None, :]
    np.add.at(out, bucket.numpy().ravel(), (sign.numpy() * y.T).ravel())
    return out


def _top(y: np.ndarray, r: int) -> np.ndarray:
    u, s, vh = np.linalg.svd(y, full_matrices=False)
    return (u[:, :r] * s[:r]) @ vh[:r]


@pytest.mark.parametrize("name", ["bert-cls", "gpt2-lm", "llama-lm", "phi3-lm"])
def test_block_is_the_top_directions_of_each_layer_change_on_the_base_inputs(zoo, name):
    """A rank-3 delta at 2 directions: each block is the CountSketch of the module's change of output on the probe,
    truncated to rank 2 by numpy's SVD (Conv1D's and fused layouts included)."""
    case = zoo.case(name, rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    embedder = DeltaEmbedder(probe=TOKENS, delta_rank=2, **EXACT).fit(base_dir)
    vector = embedder.embed_one(case.folder("ft"))
    ids = probe_ids(base_dir, TOKENS, name)
    items_b = [(s, layer, it) for s, layer, items in case.spec.items(case.base) for it in items]
    items_f = [it for _, _, items in case.spec.items(case.ft) for it in items]
    inputs = module_inputs(case.base, [it[1] for _, _, it in items_b], ids)
    truncated = 0
    for block, (stack, layer, (kind, mod_b, n_parts, part)), mod_f, x in zip(
        embedder.blocks_, items_b, [it[1] for it in items_f], inputs, strict=True
    ):
        with torch.no_grad():
            y = (mod_f(x) - mod_b(x)).double()[:, _slice(mod_b, n_parts, part)].numpy()
        expected = _sketched(embedder.projections_[(stack, layer, kind)], _top(y, 2))
        whole = _sketched(embedder.projections_[(stack, layer, kind)], y)
        truncated += not np.allclose(expected, whole, atol=1e-3 * np.abs(whole).max())
        got = vector[block.start : block.stop]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    assert truncated > 0  # rank 2 of a rank-3 change is not the change: the comparison can fail


@pytest.mark.parametrize("probe", [TOKENS, "none"])
def test_a_delta_of_at_most_that_rank_is_kept_whole(zoo, probe):
    """A rank-3 delta at 3 directions is its vector at every direction (through the probe: the probe's own vector);
    at 2 it is not."""
    case = zoo.case("llama-lm", rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    ft = case.folder("ft")
    fields = dict(probe=probe, **EXACT)
    at3 = DeltaEmbedder(delta_rank=3, **fields).fit(base_dir).embed_one(ft)
    at2 = DeltaEmbedder(delta_rank=2, **fields).fit(base_dir).embed_one(ft)
    whole = DeltaEmbedder(delta_rank=512, **fields).fit(base_dir).embed_one(ft)
    np.testing.assert_allclose(at3, whole, atol=1e-6 * np.abs(whole).max())
    assert not np.allclose(at2, whole, atol=1e-3 * np.abs(whole).max())
    if probe != "none":
        plain = DeltaEmbedder(**fields).fit(base_dir).embed_one(ft)
        np.testing.assert_allclose(at3, plain, atol=1e-6 * np.abs(plain).max())


def test_an_adapter_on_a_fine_tune_is_truncated_as_its_merged_model(family):
    """The parent's change and the adapter's are summed before the truncation: the merged model's vector; the trace
    is the delta's own sketch, as without ``delta_rank``."""
    embedder = DeltaEmbedder(delta_rank=2).fit(family / "base")
    on_parent = embedder.embed_traced(family / "adapter-on-a", parent=family / "a")
    merged = embedder.embed_traced(family / "merged-on-a")
    np.testing.assert_allclose(on_parent.vector, merged.vector, atol=2e-5 * np.abs(merged.vector).max())
    plain = DeltaEmbedder().fit(family / "base").embed_traced(family / "merged-on-a")
    np.testing.assert_allclose(merged.trace.sketch, plain.trace.sketch, atol=1e-6 * np.abs(plain.trace.sketch).max())
    assert not np.allclose(merged.vector, plain.vector, atol=1e-2 * np.abs(plain.vector).max())


def test_delta_rank_is_a_setting_of_the_countsketch():
    """Declared once: in the key where used (``top8``), absent at its default (stored keys keep their vectors)."""
    assert Representation(delta_rank=8).key().endswith("-top8")
    assert "top" not in Representation().key()
    assert Representation(delta_rank=8, projection="gaussian").truncates is False
    with pytest.raises(ValueError):
        Representation(delta_rank=0)
