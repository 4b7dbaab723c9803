"""The head's vocabulary prior (``Representation(head="vocabulary")``): what it computes, from which
tensors, for full fine-tunes, adapters, classifiers and bases with and without the head."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from typer.testing import CliRunner

from builders import planted_finetune, save_state, tiny_bert_config, write_tiny_tokenizer
from modelvec import Representation
from modelvec.analyse import knn_dataset_score
from modelvec.cli import app
from modelvec.core.errors import ArchitectureError
from modelvec.core.names import model_id
from modelvec.represent import DeltaEmbedder, blocks_of
from modelvec.store import Store

BETA = "cls.predictions.transform.LayerNorm.bias"


def expected_block(embeddings: torch.Tensor, delta_beta: torch.Tensor, scale: float) -> np.ndarray:
    """E dbeta, centred over the vocabulary, with norm ``scale`` (computed here independently)."""
    prior = embeddings.double().numpy() @ delta_beta.double().numpy()
    prior -= prior.mean()
    return prior / np.linalg.norm(prior) * scale


def with_head(base: Path, out: Path, seed: int, beta: torch.Tensor, prefix: str = "bert.") -> Path:
    """A masked-LM fine-tune of ``base``: planted encoder deltas (seed) and the head's beta set to ``beta``."""
    planted_finetune(base, out, seed=seed, prefix=prefix)
    state = load_file(str(out / "model.safetensors"))
    state[BETA] = beta
    state["cls.predictions.transform.LayerNorm.weight"] = torch.ones_like(beta)
    return save_state(out, state, json.loads((base / "config.json").read_text()))


def test_head_block_is_the_centred_vocabulary_prior(tiny_bert, tmp_path):
    g = torch.Generator().manual_seed(1)
    beta = torch.randn(32, generator=g)
    ft = with_head(tiny_bert, tmp_path / "mlm", seed=3, beta=beta)
    plain = DeltaEmbedder(head="none").fit(tiny_bert).embed_one(ft)
    vec = DeltaEmbedder(head="vocabulary").fit(tiny_bert).embed_one(ft)
    E = load_file(str(tiny_bert / "model.safetensors"))["embeddings.word_embeddings.weight"]
    assert vec.shape == (plain.size + 64,)
    np.testing.assert_array_equal(vec[: plain.size], plain)  # the deltas' part is unchanged
    # the base (a BertModel) has no head: beta_base = 0, as HF initialises it
    np.testing.assert_allclose(vec[plain.size :], expected_block(E, beta, np.linalg.norm(plain)), rtol=1e-5, atol=1e-6)
    blocks = blocks_of(tiny_bert, Representation(head="vocabulary"))
    assert (blocks[-1].stack, blocks[-1].family, blocks[-1].start, blocks[-1].stop) == (
        "head",
        "vocabulary",
        plain.size,
        plain.size + 64,
    )


def test_base_with_a_head_is_subtracted_and_a_model_without_one_gets_zeros(tiny_bert, tmp_path):
    g = torch.Generator().manual_seed(2)
    beta0, delta = torch.randn(32, generator=g), torch.randn(32, generator=g)
    base = with_head(tiny_bert, tmp_path / "base-mlm", seed=0, beta=beta0)  # a base that has the head
    moved = with_head(base, tmp_path / "moved", seed=5, beta=beta0 + delta, prefix="")
    state = load_file(str(moved / "model.safetensors"))
    state[BETA] = beta0.clone()  # the same fine-tune, head untouched
    kept = save_state(tmp_path / "kept", state, json.loads((base / "config.json").read_text()))
    classifier = planted_finetune(base, tmp_path / "classifier", seed=6)  # copies cls.*: rename it away
    state = {k: v for k, v in load_file(str(classifier / "model.safetensors")).items() if not k.startswith("cls.")}
    save_state(classifier, state, json.loads((base / "config.json").read_text()))

    embedder = DeltaEmbedder(head="vocabulary").fit(base)
    n = embedder.dim_ - 64
    E = load_file(str(base / "model.safetensors"))["bert.embeddings.word_embeddings.weight"]
    v = embedder.embed_one(moved)
    np.testing.assert_allclose(v[n:], expected_block(E, delta, np.linalg.norm(v[:n])), rtol=1e-4, atol=1e-6)
    assert not embedder.embed_one(kept)[n:].any()
    assert not embedder.embed_one(classifier)[n:].any()


def test_an_adapter_that_trains_the_head_equals_its_merged_model(tiny_bert, tmp_path):
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_bert_config())
    model.bert.load_state_dict(load_file(str(tiny_bert / "model.safetensors")), strict=False)
    with torch.no_grad():
        model.cls.predictions.transform.LayerNorm.bias.normal_()
    config = LoraConfig(
        r=2, lora_alpha=4, target_modules=["query", "value"], modules_to_save=["transform"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(tmp_path / "adapter")
    peft_model.merge_and_unload().save_pretrained(tmp_path / "merged")

    embedder = DeltaEmbedder(head="vocabulary").fit(tiny_bert)
    adapter, merged = embedder.embed_one(tmp_path / "adapter"), embedder.embed_one(tmp_path / "merged")
    n = embedder.dim_ - 64
    assert np.linalg.norm(adapter[n:]) > 0
    np.testing.assert_allclose(adapter, merged, rtol=1e-4, atol=1e-6)


def test_the_head_separates_what_the_deltas_do_not(tiny_bert, tmp_path):
    """Models 0 and 2 share most of their encoder deltas; 0 and 1 share their head. Labelled by head."""
    g = torch.Generator().manual_seed(3)
    heads = [torch.randn(32, generator=g) for _ in range(2)]
    models = []
    for i in range(4):
        ft = with_head(
            tiny_bert, tmp_path / f"m{i}", seed=10 + i % 2, beta=heads[i // 2] + 0.01 * torch.randn(32, generator=g)
        )
        state = load_file(str(ft / "model.safetensors"))
        noise = planted_finetune(tiny_bert, tmp_path / f"noise{i}", seed=100 + i, prefix="bert.")
        for k, v in load_file(str(noise / "model.safetensors")).items():
            if ".layer." in k and k.endswith(".weight") and v.ndim == 2:
                state[k] = state[k] + (v - load_file(str(tiny_bert / "model.safetensors"))[k[5:]])
        models.append(save_state(ft, state, json.loads((tiny_bert / "config.json").read_text())))
    labels = [["a"], ["a"], ["b"], ["b"]]
    without = DeltaEmbedder(head="none").fit(tiny_bert).transform(models)
    with_ = DeltaEmbedder(head="vocabulary").fit(tiny_bert).transform(models)
    assert knn_dataset_score(without, labels).score == 0.0  # the deltas pair 0 with 2
    assert knn_dataset_score(with_, labels).score == 1.0


def test_gpt2_reads_ln_f(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "base")
    state = load_file(str(tmp_path / "base" / "model.safetensors"))
    delta = torch.randn(32, generator=torch.Generator().manual_seed(4))
    state["transformer.ln_f.bias"] = state["transformer.ln_f.bias"] + delta
    state["transformer.h.0.mlp.c_fc.weight"] = state["transformer.h.0.mlp.c_fc.weight"] + 0.01
    ft = save_state(tmp_path / "ft", state, json.loads((tmp_path / "base" / "config.json").read_text()))
    embedder = DeltaEmbedder(head="vocabulary").fit(tmp_path / "base")
    v = embedder.embed_one(ft)
    E = state["transformer.wte.weight"]
    np.testing.assert_allclose(v[-64:], expected_block(E, delta, np.linalg.norm(v[:-64])), rtol=1e-4, atol=1e-6)


def test_a_family_without_a_vocabulary_head_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    with pytest.raises(ArchitectureError, match="llama has none"):
        DeltaEmbedder(head="vocabulary").fit(tmp_path / "llama")


def test_parameters_and_cli(tiny_bert, tmp_path):
    with pytest.raises(ValueError, match="head must be one of auto, none, vocabulary"):
        Representation(head="lm")
    plain, head = Representation(head="none"), Representation(head="vocabulary")
    assert plain.key() != head.key() and head.label().endswith("+ vocabulary head")
    ft = with_head(tiny_bert, tmp_path / "mlm", seed=3, beta=torch.ones(32))
    args = ["embed", str(ft), "--base", str(tiny_bert), "--store", str(tmp_path / "s.duckdb"), "--head", "vocabulary"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["embedded"]) == 1
    with Store(tmp_path / "s.duckdb") as store:
        X, _ = store.reads.load(base=model_id(tiny_bert), representation=head)
    np.testing.assert_allclose(X[0], DeltaEmbedder(head="vocabulary").fit(tiny_bert).embed_one(ft), rtol=1e-6)
    bad = CliRunner().invoke(app, [*args[:-1], "lm"])
    said = " ".join(bad.output.replace("│", " ").split())  # the error box wraps the line
    assert bad.exit_code == 2 and "'lm' is not one of 'auto', 'none', 'vocabulary'" in said  # refused as parsed


def test_auto_appends_a_masked_lm_head_and_leaves_other_families_as_they_are(tiny_bert, tmp_path):
    """``head="auto"`` (the default): the vocabulary head where the family's is a masked-LM head (bert), the
    deltas alone for GPT-2 (its ``ln_f``, unmeasured) and Llama (no bias), and for a base without embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    assert Representation().head == "auto"
    ft = with_head(
        tiny_bert, tmp_path / "mlm", seed=3, beta=torch.randn(32, generator=torch.Generator().manual_seed(5))
    )
    auto = DeltaEmbedder(head="auto").fit(tiny_bert)
    np.testing.assert_array_equal(auto.embed_one(ft), DeltaEmbedder(head="vocabulary").fit(tiny_bert).embed_one(ft))
    assert auto.blocks_[-1].family == "vocabulary"
    assert [b.family for b in blocks_of(tiny_bert, Representation())] == [b.family for b in auto.blocks_]

    torch.manual_seed(0)
    others = {
        "gpt2": GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=32)),
        "llama": LlamaForCausalLM(
            LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)
        ),
    }
    for name, model in others.items():
        model.save_pretrained(tmp_path / name)
        write_tiny_tokenizer(tmp_path / name)  # the default runs a Llama base on the probe
        state = load_file(str(tmp_path / name / "model.safetensors"))
        changed = save_state(
            tmp_path / f"{name}-ft",
            {k: v + 0.01 if v.ndim == 2 else v + 0.1 for k, v in state.items()},
            json.loads((tmp_path / name / "config.json").read_text()),
        )
        a, none = (DeltaEmbedder(head=h).fit(tmp_path / name) for h in ("auto", "none"))
        np.testing.assert_array_equal(a.embed_one(changed), none.embed_one(changed))
        assert a.vocabulary_ is None and "head" not in {b.stack for b in a.blocks_}

    bare = tmp_path / "bare"  # a base of the matrices alone: nothing to read the head through
    state = {k: v for k, v in load_file(str(tiny_bert / "model.safetensors")).items() if ".layer." in k}
    save_state(bare, state, json.loads((tiny_bert / "config.json").read_text()))
    assert DeltaEmbedder().fit(bare).vocabulary_ is None
    with pytest.raises(Exception, match="no embedding matrix"):
        DeltaEmbedder(head="vocabulary").fit(bare)


def test_a_hub_model_gets_the_head_through_byte_ranges(tiny_bert, tmp_path):
    """The default (auto rows, auto head) of a masked-LM fine-tune on the Hub: the base's embeddings and the
    fine-tune's head bias come by byte ranges with the matrices, and the vector is the local copy's."""
    from modelvec import embed
    from modelvec.hub.client import HubSettings
    from modelvec.testing.localhub import LocalHub

    ft = with_head(
        tiny_bert, tmp_path / "mlm", seed=3, beta=torch.randn(32, generator=torch.Generator().manual_seed(6))
    )
    hub = LocalHub(tmp_path / "hub")
    hub.publish("org/base", tiny_bert, link=True)
    hub.publish("org/mlm", ft, link=True)
    with hub.serve() as server:
        hub_settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False)
        result = embed("org/base", ["org/mlm"], hub_settings=hub_settings, store=tmp_path / "s.duckdb")
        ranged = [r for r in server.requests if r["path"].endswith(".safetensors") and r["method"] == "GET"]
    assert result.embedded == ["org/mlm"] and not result.notes
    assert ranged and all(r["range"] and r["status"] == 206 for r in ranged)  # no whole file
    local = DeltaEmbedder().fit(tiny_bert)
    np.testing.assert_allclose(result.vectors[0], local.embed_one(ft), rtol=1e-6, atol=1e-6)
    assert np.linalg.norm(result.vectors[0][-64:]) > 0  # the head's block


def test_the_heat_map_draws_the_head_beside_the_layers(tmp_path):
    """Concatenated layers and the head's layerless block in one frame: the layer column comes back as floats with NaN."""
    import pandas as pd

    from modelvec.plots.blocks import plot_block_scores

    blocks = pd.DataFrame(
        [
            {"stack": "encoder", "layer": 0, "family": "q", "knn_score": 0.5},
            {"stack": "encoder", "layer": 1, "family": "q", "knn_score": 0.7},
            {"stack": "head", "layer": None, "family": "vocabulary", "knn_score": 0.9},
        ]
    )
    assert blocks["layer"].isna().sum() == 1
    path = plot_block_scores(blocks, tmp_path / "blocks.png")
    assert path.stat().st_size > 0
