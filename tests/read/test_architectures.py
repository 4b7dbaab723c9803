"""Architecture tables against real (tiny, random) ``transformers`` models.

Every test builds small random checkpoints with ``transformers`` and checks modelvec against code
written from the definition, never against modelvec itself (tests/tiny_families.py: which module of
each family plays which role, planted low-rank deltas, the reference vector walked over the modules):

- the vector equals the reference, family by family, and a planted rank-2 delta is recovered;
- orientation is checked by running the modules themselves: x @ W + b == module(x);
- GPT-2's fused q|k|v split, T5's encoder-decoder and its two feed-forwards, task-head prefixes,
  detection, and the model types that share a family table.

The randomized solver, against the same reference, is tested in tests/represent/test_solver.py.
"""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import modelvec  # noqa: E402
from modelvec import ArchitectureError, Checkpoint, DeltaEmbedder, detect  # noqa: E402
from tiny_families import (  # noqa: E402
    _BERT_KW,
    _T5_KW,
    DESCRIBED,
    SPECS,
    T,
    _slice,
    bias,
    embed,
    oriented,
    reference_blocks,
    reference_vector,
)

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

ATOL = 1e-4

HEADED_WITH_BARE = ["bert-cls", "roberta-cls", "distilbert-cls", "gpt2-lm", "llama-lm"]


def block_u(e: DeltaEmbedder, vec: np.ndarray, block) -> np.ndarray:
    """A block of the vector back as its n x r factor."""
    return vec[block.start : block.stop].reshape(e.representation.rank, block.n).T


# --- 1. the vector equals the definition, family by family -------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_vector_matches_reference(zoo, name):
    case = zoo.case(name)
    r = 4  # planted rank 3: the 4th column of every block is a null direction, zeroed
    e, vec = embed(case, rank=r)
    assert e.layout_.arch.name == case.spec.arch
    assert vec.dtype == np.float32
    expected_blocks = reference_blocks(case.spec, case.base)
    assert [(b.stack, b.layer, b.family, b.n) for b in e.blocks_] == expected_blocks
    assert vec.shape == (sum(n for *_, n in expected_blocks) * r,) == (e.dim_,)
    np.testing.assert_allclose(vec, reference_vector(case.spec, case.base, case.ft, r), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert-cls", "t5-gated", "gpt2-lm", "llama-lm"])
@pytest.mark.parametrize("factor,pooling", [("US", "mean"), ("U", "concat"), ("US", "concat")])
def test_vector_matches_reference_other_choices(zoo, name, factor, pooling):
    case = zoo.case(name)
    e, vec = embed(case, rank=4, factor=factor, pooling=pooling)
    assert [(b.stack, b.layer, b.family, b.n) for b in e.blocks_] == reference_blocks(case.spec, case.base, pooling)
    expected = reference_vector(case.spec, case.base, case.ft, 4, factor, pooling)
    np.testing.assert_allclose(vec, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert-cls", "llama-lm"])
def test_full_rank_delta_is_zero_padded_beyond_min_dim(zoo, name):
    """rank > min(n, m) = 16 or 32: every column up to min(n, m) is live, the rest are zero padding."""
    case = zoo.case(name, rank=None)  # full-rank planted deltas, well-separated singular values
    r = 40
    e, vec = embed(case, rank=r, pooling="concat")
    np.testing.assert_allclose(
        vec, reference_vector(case.spec, case.base, case.ft, r, pooling="concat"), atol=ATOL, rtol=0
    )
    shapes = {
        (stack, layer, fam): oriented(mod, n_parts, part).shape
        for stack, layer, items in case.spec.items(case.base)
        for fam, mod, n_parts, part in items
    }
    assert any(min(shape) == 16 for shape in shapes.values()) == (name == "llama-lm")  # GQA k, v: 32 x 16
    for b in e.blocks_:
        u = block_u(e, vec, b)
        k = min(shapes[(b.stack, b.layer, b.family)])
        assert k < r
        assert np.all(u[:, k:] == 0), b
        np.testing.assert_allclose(u[:, :k].T @ u[:, :k], np.eye(k), atol=1e-4)


# --- 2. GPT-2: Conv1D orientation and the fused q|k|v split -------------------------------------------


def _refs(layout, layer=0, stack=None):
    return {r.family: r for r in layout.refs if r.layer == layer and (stack is None or r.stack == stack)}


def test_gpt2_split_qkv_matches_c_attn(zoo):
    case = zoo.case("gpt2-lm")
    ck = Checkpoint(case.folder("base"))
    layout = ck.layout()
    assert layout.prefix == "transformer."
    d = 32
    torch.manual_seed(3)
    x = torch.randn(2, 5, d)
    for layer, block in enumerate(case.base.transformer.h):
        refs = _refs(layout, layer)
        with torch.no_grad():
            qkv = block.attn.c_attn(x).split(d, dim=-1)  # what GPT2Attention does
            b_q, b_k, b_v = block.attn.c_attn.bias.split(d)
            for fam, want, b in zip("qkv", qkv, (b_q, b_k, b_v)):
                w = ck.matrix(refs[fam], layout.prefix)
                assert w.shape == (d, d)
                torch.testing.assert_close(x @ w + b, want, atol=1e-5, rtol=1e-5)
            for fam, mod, shape in (
                ("o", block.attn.c_proj, (d, d)),
                ("ff1", block.mlp.c_fc, (d, 4 * d)),
                ("ff2", block.mlp.c_proj, (4 * d, d)),
            ):
                w = ck.matrix(refs[fam], layout.prefix)
                assert w.shape == shape  # Conv1D is [in, out]: used as is
                xin = torch.randn(2, 5, shape[0])
                torch.testing.assert_close(xin @ w + mod.bias, mod(xin), atol=1e-5, rtol=1e-5)


def test_gpt2_split_parts_differ_and_are_in_qkv_order(zoo):
    """Planted deltas: the k part of the fused delta must be recovered as k, not q or v."""
    case = zoo.case("gpt2-lm", rank=2)
    e, vec = embed(case, rank=2, pooling="concat")
    for b in e.blocks_:
        a = case.planted[(b.stack, b.layer, b.family)].a.numpy()
        u = block_u(e, vec, b)
        np.testing.assert_allclose(np.linalg.svd(a.T @ u, compute_uv=False), 1.0, atol=1e-4)


# --- 3. every matrix read by modelvec is the module's x @ W + b ---------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("bare", [False, True], ids=["headed", "bare"])
def test_matrices_are_in_x_at_w_orientation(zoo, name, bare):
    case = zoo.case(name)
    if bare and case.spec.core(case.base) is case.base:
        pytest.skip("no task head around this model")
    ck = Checkpoint(case.folder("base", bare))
    layout = ck.layout()
    assert layout.prefix == ("" if bare else case.spec.prefix)
    mods = {
        (stack, layer, fam): (mod, n_parts, part)
        for stack, layer, items in case.spec.items(case.base)
        for fam, mod, n_parts, part in items
    }
    assert [r.key for r in layout.refs] == list(mods)
    gen = torch.Generator().manual_seed(5)
    for ref in layout.refs:
        mod, n_parts, part = mods[ref.key]
        w = ck.matrix(ref, layout.prefix)
        x = torch.randn(2, 3, w.shape[0], generator=gen)
        with torch.no_grad():
            want = mod(x)[..., _slice(mod, n_parts, part)]
        b = bias(mod, n_parts, part)
        got = x @ w + (0 if b is None else b)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{ref.key}: {m}")


def test_linear_shapes_bert_and_llama_gqa(zoo):
    bert = Checkpoint(zoo.case("bert-cls").folder("base"))
    lb = bert.layout()
    refs = _refs(lb)
    shapes = {f: tuple(bert.matrix(refs[f], lb.prefix).shape) for f in refs}
    assert shapes == {"q": (32, 32), "k": (32, 32), "v": (32, 32), "o": (32, 32), "ff1": (32, 64), "ff2": (64, 32)}
    with torch.no_grad():
        x = torch.randn(2, 3, 32)
        query = zoo.case("bert-cls").base.bert.encoder.layer[0].attention.self.query
        torch.testing.assert_close(x @ bert.matrix(refs["q"], lb.prefix) + query.bias, query(x))

    llama = Checkpoint(zoo.case("llama-lm").folder("base"))
    ll = llama.layout()
    refs = _refs(ll)
    shapes = {f: tuple(llama.matrix(refs[f], ll.prefix).shape) for f in refs}
    kv = 2 * (32 // 4)  # num_key_value_heads * head_dim
    assert shapes == {
        "q": (32, 32), "k": (32, kv), "v": (32, kv), "o": (32, 32),
        "ff_gate": (32, 64), "ff1": (32, 64), "ff2": (64, 32),
    }  # fmt: skip


def test_t5_shapes_with_inner_dim_different_from_d_model(zoo):
    ck = Checkpoint(zoo.case("t5-gated").folder("base"))
    lay = ck.layout()
    inner = 4 * 6  # num_heads * d_kv = 24 != d_model = 32
    for stack in ("encoder", "decoder"):
        refs = _refs(lay, 0, stack)
        shapes = {f: tuple(ck.matrix(refs[f], lay.prefix).shape) for f in refs}
        want = {
            "q": (32, inner),
            "k": (32, inner),
            "v": (32, inner),
            "o": (inner, 32),
            "ff_gate": (32, 64),
            "ff1": (32, 64),
            "ff2": (64, 32),
        }
        if stack == "decoder":
            want.update({f"cross_{f}": want[f] for f in "qkvo"})
        assert shapes == want


# --- 4. T5: encoder-decoder, cross-attention, the two feed-forward variants -----------------------------

T5_FAMILIES = {
    "t5-relu": ["q", "k", "v", "o", "ff1", "ff2"],
    "t5-gated": ["q", "k", "v", "o", "ff_gate", "ff1", "ff2"],
}


@pytest.mark.parametrize("name", list(T5_FAMILIES))
def test_t5_family_sets_and_layer_counts(zoo, name):
    case = zoo.case(name)
    e, vec = embed(case, rank=2)
    enc = [b.family for b in e.blocks_ if b.stack == "encoder"]
    dec = [b.family for b in e.blocks_ if b.stack == "decoder"]
    attn, ff = T5_FAMILIES[name][:4], T5_FAMILIES[name][4:]
    assert enc == attn + ff
    assert dec == attn + ["cross_q", "cross_k", "cross_v", "cross_o"] + ff
    assert [b.stack for b in e.blocks_] == ["encoder"] * len(enc) + ["decoder"] * len(dec)  # encoder first
    layers = {}
    for ref in e.layout_.refs:
        layers.setdefault(ref.stack, set()).add(ref.layer)
    assert layers == {"encoder": {0, 1}, "decoder": {0, 1, 2}}  # num_layers=2, num_decoder_layers=3


@pytest.mark.parametrize("name", list(T5_FAMILIES))
@pytest.mark.parametrize("touched", ["encoder", "decoder"])
def test_t5_vector_is_encoder_then_decoder(zoo, name, touched):
    full = zoo.case(name)
    part = zoo.case(name, where=touched)  # same base, same planted deltas, only one stack touched
    r = 4
    e, vec_full = embed(full, rank=r)
    _, vec_part = embed(part, rank=r)
    split = max(b.stop for b in e.blocks_ if b.stack == "encoder")
    assert split == min(b.start for b in e.blocks_ if b.stack == "decoder")
    enc_full, dec_full = vec_full[:split], vec_full[split:]
    enc_part, dec_part = vec_part[:split], vec_part[split:]
    if touched == "decoder":
        assert np.all(enc_part == 0)
        np.testing.assert_array_equal(dec_part, dec_full)
    else:
        assert np.all(dec_part == 0)
        np.testing.assert_array_equal(enc_part, enc_full)
    assert np.abs(vec_part).max() > 0.1
    np.testing.assert_allclose(vec_part, reference_vector(part.spec, part.base, part.ft, r), atol=ATOL, rtol=0)


def test_t5_config_without_feed_forward_proj_is_relu(zoo, tmp_path):
    """Original t5-base config.json has no feed_forward_proj; the default is the relu FFN (wi)."""
    case = zoo.case("t5-relu")
    folders = {}
    for which in ("base", "ft"):
        dst = tmp_path / which
        shutil.copytree(case.folder(which), dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg.pop("feed_forward_proj", None)
        cfg.pop("dense_act_fn", None)
        cfg.pop("is_gated_act", None)
        (dst / "config.json").write_text(json.dumps(cfg))
        folders[which] = dst
    e = DeltaEmbedder(rank=4, solver="exact", **DESCRIBED).fit(folders["base"])
    assert {b.family for b in e.blocks_ if b.stack == "encoder"} == {"q", "k", "v", "o", "ff1", "ff2"}
    np.testing.assert_array_equal(e.embed_one(folders["ft"]), embed(case, rank=4)[1])


# --- 5. task-head prefixes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADED_WITH_BARE)
def test_prefixed_and_unprefixed_names_align(zoo, name):
    case = zoo.case(name)
    prefixes = {}
    vectors = {}
    for base_bare, ft_bare in itertools.product([True, False], repeat=2):
        e, vec = embed(case, base_bare=base_bare, ft_bare=ft_bare, rank=4)
        prefixes[base_bare] = e.layout_.prefix
        vectors[(base_bare, ft_bare)] = vec
    assert prefixes == {True: "", False: case.spec.prefix}
    ref = vectors[(True, True)]
    assert np.abs(ref).max() > 0.1
    for key, vec in vectors.items():
        np.testing.assert_array_equal(vec, ref, err_msg=f"base_bare, ft_bare = {key}")
    np.testing.assert_allclose(ref, reference_vector(case.spec, case.base, case.ft, 4), atol=ATOL, rtol=0)


def test_bare_checkpoint_really_has_no_prefix(zoo):
    """Guards the test above: the bare and headed folders do differ in their tensor names."""
    case = zoo.case("bert-cls")
    bare = Checkpoint(case.folder("base", bare=True)).keys()
    headed = Checkpoint(case.folder("base")).keys()
    assert "encoder.layer.0.attention.self.query.weight" in bare
    assert "bert.encoder.layer.0.attention.self.query.weight" in headed
    assert any(k.startswith("classifier.") for k in headed) and not any(k.startswith("bert.") for k in bare)


# --- 6. a planted rank-2 delta is recovered ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert-cls", "distilbert-cls", "t5-gated", "gpt2-lm", "llama-lm"])
def test_planted_rank2_is_recovered(zoo, name):
    case = zoo.case(name, rank=2)
    r = 8
    e, vec = embed(case, rank=r, pooling="concat")
    assert len(e.blocks_) == len(case.planted)
    for b in e.blocks_:
        u = block_u(e, vec, b)
        assert u.shape == (b.n, r)
        assert np.all(u[:, 2:] == 0), f"{b}: columns beyond the planted rank are not zero"
        np.testing.assert_allclose(u[:, :2].T @ u[:, :2], np.eye(2), atol=1e-5)
        a = case.planted[(b.stack, b.layer, b.family)].a.numpy()
        cosines = np.linalg.svd(a.T @ u[:, :2], compute_uv=False)  # cosines of the principal angles
        np.testing.assert_allclose(cosines, 1.0, atol=1e-5, err_msg=str(b))
        # max-abs signs: each column's largest-magnitude entry is positive
        cols = u[:, :2]
        assert np.all(cols[np.abs(cols).argmax(0), [0, 1]] > 0)

    # U S: column norms are the planted singular values
    e, vec_us = embed(case, rank=r, pooling="concat", factor="US")
    for b in e.blocks_:
        us = block_u(e, vec_us, b)
        planted = case.planted[(b.stack, b.layer, b.family)].s.numpy()
        np.testing.assert_allclose(np.linalg.norm(us, axis=0), np.r_[planted, np.zeros(r - 2)], atol=1e-5)

    # mean pooling keeps the null columns at zero
    e, vec_mean = embed(case, rank=r)
    for b in e.blocks_:
        assert np.all(block_u(e, vec_mean, b)[:, 2:] == 0)


def test_untouched_matrix_gives_zero_block(zoo):
    case = zoo.case("t5-relu", where="encoder")
    e, vec = embed(case, rank=4, pooling="concat")
    for b in e.blocks_:
        block = vec[b.start : b.stop]
        assert np.all(block == 0) if b.stack == "decoder" else np.abs(block).max() > 0.1


# --- 7. detection ----------------------------------------------------------------------------------------

MODEL_TYPES = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "distilbert": "distilbert",
    "t5": "t5",
    "mt5": "t5",
    "gpt2": "gpt2",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma": "gemma",
    "gemma2": "gemma",
    "phi3": "phi3",
}
ARCH_CLASSES = {
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForMaskedLM": "roberta",
    "DistilBertForSequenceClassification": "distilbert",
    "T5ForConditionalGeneration": "t5",
    "MT5ForConditionalGeneration": "t5",
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi3",
}


@pytest.mark.parametrize("model_type,arch", list(MODEL_TYPES.items()))
def test_detect_from_model_type(model_type, arch):
    assert detect({"model_type": model_type}).name == arch
    # model_type wins over a misleading architectures entry
    assert detect({"model_type": model_type, "architectures": ["SomethingElse"]}).name == arch


@pytest.mark.parametrize("cls,arch", list(ARCH_CLASSES.items()))
def test_detect_from_architectures_when_model_type_absent(cls, arch):
    assert detect({"architectures": [cls]}).name == arch


@pytest.mark.parametrize("name", ["bert-cls", "t5-gated", "gpt2-lm", "mistral-lm", "qwen2-lm"])
def test_detect_from_saved_config_with_and_without_model_type(zoo, tmp_path, name):
    case = zoo.case(name)
    assert Checkpoint(case.folder("base")).architecture().name == case.spec.arch
    folders = {}
    for which in ("base", "ft"):
        dst = tmp_path / which
        shutil.copytree(case.folder(which), dst)
        cfg = json.loads((dst / "config.json").read_text())
        del cfg["model_type"]
        assert cfg["architectures"]
        (dst / "config.json").write_text(json.dumps(cfg))
        folders[which] = dst
    assert Checkpoint(folders["base"]).architecture().name == case.spec.arch
    e = DeltaEmbedder(rank=4, solver="exact", **DESCRIBED).fit(folders["base"])
    np.testing.assert_array_equal(e.embed_one(folders["ft"]), embed(case, rank=4)[1])


def _assert_lists_supported(err: ArchitectureError) -> None:
    msg = str(err)
    assert "supported model types" in msg
    for model_type in MODEL_TYPES:
        assert model_type in msg


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "mamba"},
        {"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
        {"architectures": ["MambaForCausalLM"]},
        {"model_type": "bart", "architectures": ["BartForConditionalGeneration"]},
    ],
)
def test_unknown_architecture_is_an_error_listing_supported_types(config):
    with pytest.raises(ArchitectureError) as info:
        detect(config, model="some/model")
    assert str(info.value).startswith("some/model: ")
    _assert_lists_supported(info.value)


@pytest.mark.parametrize(
    "model_type,cls",
    [
        ("qwen2_moe", "Qwen2MoeForCausalLM"),  # experts, no mlp.gate_proj: not the Llama table
        ("t5gemma", "T5GemmaForConditionalGeneration"),  # not T5's tensor layout
        ("mistral3", "Mistral3ForConditionalGeneration"),
    ],
)
def test_unknown_model_type_is_not_rescued_by_a_class_name_prefix(model_type, cls):
    """model_type is given and unknown: architectures is only consulted when model_type is absent.

    A class name that merely starts with a supported prefix ("Qwen2Moe...", "T5Gemma...") belongs
    to another model type; it must give the ArchitectureError that lists the supported types, not
    a family whose tensors are then missing.
    """
    with pytest.raises(ArchitectureError) as info:
        detect({"model_type": model_type, "architectures": [cls]}, model="m")
    _assert_lists_supported(info.value)


def test_unknown_model_type_in_a_checkpoint_folder(zoo, tmp_path):
    case = zoo.case("bert-cls")
    dst = tmp_path / "weird"
    shutil.copytree(case.folder("base"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = "weirdformer"
    cfg["architectures"] = ["WeirdformerModel"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArchitectureError) as info:
        DeltaEmbedder(rank=2).fit(dst)
    assert "weirdformer" in str(info.value)
    _assert_lists_supported(info.value)
    assert isinstance(info.value, modelvec.ModelvecError)


# --- 6. how deltas are batched does not change the vector ---------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("factor", ["sketch", "U"])
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 200], ids=["one-chunk", "many-chunks"])
def test_family_batching_and_streamed_chunks_give_the_layer_vector(zoo, name, factor, chunk_bytes, monkeypatch):
    """Per layer (CPU; the sketch streamed in chunks, here also forced to many tiny chunks) and per
    family over all layers (the GPU path, run here on the CPU) compute the same vector by different
    code: the chunked sums against one batched product, nn.Linear and Conv1D storage, fused c_attn."""
    from modelvec.represent import sketching as representation
    from modelvec.represent.linalg import sketch_matrix

    monkeypatch.setattr(representation, "_CHUNK_BYTES", chunk_bytes)
    case = zoo.case(name)
    kw = dict(rank=4, factor=factor, solver="exact", block_norm=factor == "sketch", projection="shared", rows=1)
    by_layer, by_family = (DeltaEmbedder(**kw, batching=b).fit(case.folder("base", False)) for b in ("layer", "family"))
    assert not by_layer.by_family and by_family.by_family
    a, b = (e.embed_one(case.folder("ft", False)) for e in (by_layer, by_family))
    assert np.abs(a).max() > 0
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if factor == "sketch":  # and both equal the definition: (dW @ Omega)^T of every matrix, block-normalised
        e = DeltaEmbedder(**{**kw, "block_norm": False}, pooling="concat").fit(case.folder("base", False))
        vec = e.embed_one(case.folder("ft", False))
        ck, base = Checkpoint(case.folder("ft", False)), Checkpoint(case.folder("base", False))
        for ref, block in zip(e.layout_.refs, e.blocks_):
            d = ck.matrix(ref, ck.layout().prefix) - base.matrix(ref, base.layout().prefix)
            expected = (d @ sketch_matrix(d.shape[1], 4, 0)).T.reshape(-1)
            np.testing.assert_allclose(vec[block.start : block.stop], expected.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("factor", ["sketch", "U"])
def test_cuda_vector_equals_cpu_vector(zoo, name, factor):
    case = zoo.case(name)
    kw = dict(rank=4, factor=factor, block_norm=factor == "sketch")
    cpu = DeltaEmbedder(**kw).fit(case.folder("base", False))
    gpu = DeltaEmbedder(**kw, device="cuda").fit(case.folder("base", False))
    assert gpu.by_family and gpu.device.type == "cuda"
    np.testing.assert_allclose(
        gpu.embed_one(case.folder("ft", False)), cpu.embed_one(case.folder("ft", False)), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "model_type, parent, make",
    [
        ("xlm-roberta", "roberta", lambda: T.XLMRobertaModel(T.XLMRobertaConfig(**_BERT_KW))),
        ("camembert", "roberta", lambda: T.CamembertModel(T.CamembertConfig(**_BERT_KW))),
        ("mt5", "t5", lambda: T.MT5Model(T.MT5Config(**_T5_KW))),
    ],
)
def test_model_types_that_share_a_family_table(tmp_path, model_type, parent, make):
    """The model types the README lists beside a family are read by that family's table: a real
    tiny model of the type embeds to a non-zero vector, the same as with its config saying the
    parent type (same tensors, same roles)."""
    torch.manual_seed(0)
    model = make()
    model.save_pretrained(tmp_path / "base")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "ft")
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model_type"] == model_type
    e = DeltaEmbedder(rank=2).fit(tmp_path / "base")
    assert e.layout_.arch.name == parent
    vec = e.embed_one(tmp_path / "ft")
    relabelled = tmp_path / "relabelled"
    shutil.copytree(tmp_path / "ft", relabelled)
    config = json.loads((relabelled / "config.json").read_text())
    config["model_type"] = parent
    (relabelled / "config.json").write_text(json.dumps(config))
    assert np.abs(vec).sum() > 0
    np.testing.assert_array_equal(vec, e.embed_one(relabelled))
