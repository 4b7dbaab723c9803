"""The delta through the base's inputs (``probe``): each block is the CountSketch of dW·H, where H holds the base's
own inputs to the matrix on the probe, checked against the change of each module's output in transformers' own
model with the base's inputs held; an adapter's vector is its merged model's; the kept inputs are made again when
the base or the probe changes, and when they are damaged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builders import module_inputs, write_tiny_tokenizer
from modelvec import DeltaEmbedder
from modelvec.read import open_checkpoint
from modelvec.represent import Representation
from modelvec.represent.probe import compute_inputs, probe_ids

pytest.importorskip("transformers")
from tiny_families import _slice

TOKENS = 16
#: every family's layout: fused qkv along the columns (GPT-2's Conv1D c_attn) and along the rows (Phi-3), tied
#: embeddings, grouped-query attention, an encoder-decoder with cross-attention, task heads with prefixes
FAMILIES = ["bert-cls", "distilbert-cls", "gpt2-lm", "llama-lm", "phi3-lm", "gemma2-lm", "t5-gated"]
EXACT = dict(probe=TOKENS, pooling="concat", block_norm=False, size="none", head="none")


@pytest.mark.parametrize("name", FAMILIES)
def test_block_is_the_change_of_each_layer_output_on_the_base_inputs(zoo, name):
    case = zoo.case(name, rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    embedder = DeltaEmbedder(**EXACT).fit(base_dir)
    vector = embedder.embed_one(case.folder("ft"))
    ids = probe_ids(base_dir, TOKENS, name)
    items_b = [(s, layer, it) for s, layer, items in case.spec.items(case.base) for it in items]
    items_f = [it for _, _, items in case.spec.items(case.ft) for it in items]
    inputs = module_inputs(case.base, [it[1] for _, _, it in items_b], ids)
    assert len(embedder.blocks_) == len(items_b)
    checked = 0
    for block, (stack, layer, (family, mod_b, n_parts, part)), mod_f, x in zip(
        embedder.blocks_, items_b, [it[1] for it in items_f], inputs, strict=True
    ):
        assert (block.stack, block.layer, block.family) == (stack, layer, family)
        with torch.no_grad():  # the change of the module's output, the base's input held (biases cancel)
            y = (mod_f(x) - mod_b(x)).double()[:, _slice(mod_b, n_parts, part)]
        projection = embedder.projections_[(stack, layer, family)]
        size = projection.size
        expected = np.zeros(size)
        bucket = (projection.h_out[:, None] + projection.h_tok[None, :]) % size
        sign = projection.s_out[:, None] * projection.s_tok[None, :]
        np.add.at(expected, bucket.numpy().ravel(), (sign * y.T).numpy().ravel())
        got = vector[block.start : block.stop]
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
        checked += 1
    assert checked == len(items_b)


def test_inputs_are_the_base_own(zoo):
    """H differs from model to model: the inputs of another model give another block (the test above can fail)."""
    case = zoo.case("llama-lm", rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    ft_dir = write_tiny_tokenizer(case.folder("ft"))
    ck = open_checkpoint(base_dir)
    own = compute_inputs(base_dir, ck.layout(), TOKENS, "base")
    other = compute_inputs(ft_dir, ck.layout(), TOKENS, "ft")
    first = ck.layout().refs[4].tensor  # layer 0's gate: its input went through the fine-tune's attention
    assert own.for_tensor(first).shape == (TOKENS, 32)
    assert not np.allclose(own.for_tensor(first), other.for_tensor(first))
    v_own = DeltaEmbedder(**EXACT).fit(base_dir, own).embed_one(ft_dir)
    v_other = DeltaEmbedder(**EXACT).fit(base_dir, other).embed_one(ft_dir)
    assert not np.allclose(v_own, v_other)


def test_probe_is_a_setting_of_the_sketch():
    r = Representation(probe=32)
    assert r.probe_tokens() == 32 and "probe32" in r.key() and "probe" in r.label()
    assert r.probe_tokens(64) == 32  # a number is the number, whatever the family says
    assert Representation(probe="none").probe_tokens(64) is None and "probe" not in Representation(probe="none").key()
    assert Representation(probe=32, projection="gaussian").probe_tokens() is None  # the CountSketch's only
    auto = Representation(probe="auto")
    assert auto.probe_tokens(64) == 64 and auto.probe_tokens(None) is None and "probe-auto" in auto.key()
    with pytest.raises(ValueError, match="probe"):
        Representation(probe=4)
    with pytest.raises(ValueError, match="probe"):
        Representation(probe=4096)


def test_the_trace_is_the_delta_own_sketch_whatever_the_vector_goes_through(zoo):
    """The tree reads traces, measured on the delta's own CountSketch: the probe changes the vector, not the trace."""
    case = zoo.case("llama-lm", rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    plain = DeltaEmbedder(probe="none").fit(base_dir).embed_traced(case.folder("ft"))
    probed = DeltaEmbedder(probe=TOKENS).fit(base_dir).embed_traced(case.folder("ft"))
    assert not np.allclose(plain.vector, probed.vector)
    np.testing.assert_array_equal(probed.trace.sketch, plain.trace.sketch)
    for name in ("levels", "scale", "zeros", "along", "rounding"):
        assert getattr(probed.trace, name) == getattr(plain.trace, name), name


@pytest.mark.parametrize("name, tokens", [("llama-lm", 32), ("bert-cls", None), ("gpt2-lm", None)])
def test_the_default_takes_each_family_choice(zoo, name, tokens):
    """``probe="auto"`` (the default): the Llama family through 32 probe tokens, the others' deltas themselves."""
    case = zoo.case(name, rank=3)
    base_dir = write_tiny_tokenizer(case.folder("base"))
    assert Representation().probe == "auto"
    default = DeltaEmbedder().fit(base_dir)
    chosen = DeltaEmbedder(probe=tokens if tokens is not None else "none").fit(base_dir)
    np.testing.assert_array_equal(default.embed_one(case.folder("ft")), chosen.embed_one(case.folder("ft")))
    assert (getattr(default, "inputs_", None) is not None) == (tokens is not None)


def test_the_probe_reads_the_rows_the_delta_reads(zoo):
    """The bytes a fine-tune costs do not change: the read plan is the same with and without the probe."""
    from modelvec.represent.blocks import read_plan

    case = zoo.case("llama-lm", rank=3)
    ck = open_checkpoint(case.folder("ft"))
    for rows in (1.0, 0.25, "auto"):
        plain = read_plan(ck, Representation(rows=rows, probe="none"), base=False)
        assert read_plan(ck, Representation(rows=rows, probe=32), base=False) == plain
        assert read_plan(ck, Representation(rows=rows), base=False) == plain  # the default: auto, 32 for Llama


def test_a_base_that_lacks_tensors_its_forward_needs_is_refused_never_run_on_random_weights(tmp_path):
    """A checkpoint of matrices only (no embeddings, no norms): transformers would fill them with random values, so
    the probe refuses it in one line naming the model and what it lacks, and the delta itself still embeds it."""
    from builders import llama_pair
    from modelvec.core.errors import CheckpointError

    base, ft = llama_pair(tmp_path, 64, 128, 2, torch.bfloat16)
    write_tiny_tokenizer(base)
    with pytest.raises(CheckpointError, match=r"lacks 6 of the tensors .*embed_tokens.weight.*--probe none") as err:
        DeltaEmbedder(probe=16).fit(base)
    assert "\n" not in str(err.value)
    assert np.abs(DeltaEmbedder(probe="none").fit(base).embed_one(ft)).max() > 0
