"""The representation variants the clustering evidence compares: singular values, sketch, block normalisation; and
the values a stored representation takes for the settings added after it was stored."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builders import planted_finetune
from modelvec import Checkpoint, DeltaEmbedder, Representation
from modelvec.core.settings import settings_of
from modelvec.represent import sketch_matrix
from modelvec.represent.representation import UNTIL_ADDED


def _delta(base, ft, ref):
    return Checkpoint(ft).matrix(ref, "") - Checkpoint(base).matrix(ref, "")


def test_singular_values_alone(tiny_bert, tiny_finetunes):
    emb = DeltaEmbedder(rank=4, factor="S", pooling="concat", solver="exact", block_norm=False, head="none").fit(
        tiny_bert
    )
    vec = emb.embed_one(tiny_finetunes[0])
    assert emb.dim_ == 4 * len(emb.layout_.refs)
    for ref, block in zip(emb.layout_.refs, emb.blocks_):
        expected = torch.linalg.svdvals(_delta(tiny_bert, tiny_finetunes[0], ref).double())[:4]
        expected[2:] = 0  # planted rank 2: the rest is numerically zero and zeroed
        np.testing.assert_allclose(vec[block.start : block.stop], expected.numpy(), rtol=1e-4, atol=1e-6)


def test_sketch_is_the_delta_times_a_shared_gaussian(tiny_bert, tiny_finetunes):
    emb = DeltaEmbedder(
        rank=4, factor="sketch", pooling="concat", seed=3, block_norm=False, projection="shared", rows=1
    ).fit(tiny_bert)
    vec = emb.embed_one(tiny_finetunes[1])
    for ref, block in zip(emb.layout_.refs, emb.blocks_):
        d = _delta(tiny_bert, tiny_finetunes[1], ref)
        expected = (d @ sketch_matrix(d.shape[1], 4, 3)).T.reshape(-1)
        np.testing.assert_allclose(vec[block.start : block.stop], expected.numpy(), rtol=1e-5, atol=1e-7)


def test_sketch_is_linear_in_the_delta(tiny_bert, tmp_path):
    """Twice the delta gives twice the vector: sketches of different models live in one linear space."""
    small = planted_finetune(tiny_bert, tmp_path / "a", seed=4, scale=0.05)
    large = planted_finetune(tiny_bert, tmp_path / "b", seed=4, scale=0.10)
    emb = DeltaEmbedder(rank=4, factor="sketch", block_norm=False).fit(tiny_bert)
    np.testing.assert_allclose(emb.embed_one(large), 2 * emb.embed_one(small), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("factor", ["U", "US", "S", "sketch"])
def test_block_normalisation_gives_unit_blocks(tiny_bert, tiny_finetunes, factor):
    emb = DeltaEmbedder(rank=4, factor=factor, pooling="concat", block_norm=True, head="none").fit(tiny_bert)
    vec = emb.embed_one(tiny_finetunes[2])
    norms = [np.linalg.norm(vec[b.start : b.stop]) for b in emb.blocks_]
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    plain = (
        DeltaEmbedder(rank=4, factor=factor, pooling="concat", block_norm=False, head="none")
        .fit(tiny_bert)
        .embed_one(tiny_finetunes[2])
    )
    for b in emb.blocks_:  # same direction, only the scale differs
        x, y = vec[b.start : b.stop], plain[b.start : b.stop]
        assert np.dot(x, y) == pytest.approx(np.linalg.norm(y), rel=1e-5)


def test_block_normalisation_keeps_untouched_blocks_zero(tiny_bert):
    vec = DeltaEmbedder(rank=4, block_norm=True).fit(tiny_bert).embed_one(tiny_bert)
    assert not vec.any() and np.isfinite(vec).all()


def test_keys_name_what_changes_the_vector():
    keys = {Representation(factor=f, block_norm=b).key() for f in ("U", "US", "S", "sketch") for b in (False, True)}
    assert len(keys) == 8
    assert Representation(factor="sketch").key() == Representation(factor="sketch", solver="exact", sign="none").key()
    assert "bn" in Representation(block_norm=True).key()


def test_settings_added_later_take_the_value_their_declaration_leaves_out_of_the_key():
    """``UNTIL_ADDED`` (what ``from_stored`` fills in for a setting a store lacks) is each field's one ``omit`` value:
    the value that computes what was computed before the setting existed."""
    omitted = {field.name: meta.omit for field, meta in settings_of(Representation) if meta.omit}
    assert omitted == {
        "projection": ("shared",),
        "rows": (1.0,),
        "auto_rows": ("share",),
        "size": ("none",),
        "head": ("none",),
        "probe": ("none",),
        "delta_rank": ("none",),
    }
    assert UNTIL_ADDED == {
        "projection": "shared",
        "rows": 1.0,
        "auto_rows": "share",
        "head": "none",
        "size": "none",
        "probe": "none",
        "delta_rank": "none",
    }
    assert type(UNTIL_ADDED["rows"]) is float


def test_a_bounded_vector_fits_its_size_and_its_inner_products_are_unbiased(tiny_bert, tiny_finetunes):
    """``size`` shrinks every block (the head's too) by one share: the vector holds at most ``size`` floats, and
    its inner products stay exact in expectation over seeds (each block an independent CountSketch of its matrix):
    the mean of the sketched products over 300 seeds is within four standard errors of the exact one, concat
    pooling (every block's delta) and mean pooling (each layer's deltas, 1/L^2 of their products)."""
    a, b = tiny_finetunes[0], tiny_finetunes[1]
    for pooling in ("concat", "mean"):
        plain = dict(rows=1, block_norm=False, head="none", pooling=pooling)
        full = DeltaEmbedder(**plain).fit(tiny_bert)
        refs = full.layout_.refs
        layers = len({(r.stack, r.layer) for r in refs})
        exact = sum(float((_delta(tiny_bert, a, r).double() * _delta(tiny_bert, b, r).double()).sum()) for r in refs)
        exact /= 1 if pooling == "concat" else layers**2
        size = full.dim_ // 8
        products = []
        for seed in range(300):
            e = DeltaEmbedder(**plain, size=size, seed=seed).fit(tiny_bert)
            assert e.dim_ <= size and e.dim_ > size * 0.9
            u, v = e.embed_one(a).astype(np.float64), e.embed_one(b).astype(np.float64)
            products.append(float(u @ v))
        mean, stderr = np.mean(products), np.std(products) / np.sqrt(len(products))
        assert abs(mean - exact) < 4 * stderr, (pooling, mean, exact, stderr)
        assert np.std(products) > 0  # the seeds do draw different sketches


def test_a_size_the_vector_fits_changes_nothing(tiny_bert, tiny_finetunes):
    """Where the vector already fits, the budget leaves it as it is: the same numbers as without one."""
    plain = DeltaEmbedder().fit(tiny_bert)
    roomy = DeltaEmbedder(size=plain.dim_ + 10).fit(tiny_bert)
    np.testing.assert_array_equal(plain.embed_one(tiny_finetunes[0]), roomy.embed_one(tiny_finetunes[0]))
    assert Representation(size=plain.dim_ + 10).key() != Representation().key()  # a key of its own, all the same
