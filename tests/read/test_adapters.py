"""PEFT LoRA adapters embedded from their factors, against the merged model embedded as a full fine-tune.

Every adapter here is made by peft itself on a tiny transformers model (random non-zero lora_B:
``init_lora_weights=False``), saved, and merged with ``merge_and_unload``; its vector must equal
the merged model's vector against the same base, for the sketch and for the SVD factors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

import modelvec
from builders import tiny_bert_config, write_tiny_tokenizer
from modelvec import Checkpoint, DeltaEmbedder, ModelvecError
from modelvec.core.errors import CheckpointError
from modelvec.core.files import adapter_files, is_adapter
from modelvec.read import open_checkpoint
from modelvec.read.adapter_config import AdapterConfig
from modelvec.read.adapters import AdapterCheckpoint
from modelvec.represent import low_rank_svd

TINY = dict(vocab_size=64, max_position_embeddings=32)


def _bert(head: bool = False, **config):
    from transformers import BertForSequenceClassification, BertModel

    return (BertForSequenceClassification if head else BertModel)(tiny_bert_config(**config))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=64, bos_token_id=0, eos_token_id=0)
    )


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **TINY,
        )
    )


#: name -> (model factory, LoraConfig arguments). Between them: fused c_attn with fan_in_fan_out, a
#: task head (prefix "bert."), FFN matrices, rank_pattern / alpha_pattern (regex too), use_rslora,
#: layers_to_transform, and untouched matrices.
CASES = {
    "bert-qv-patterns": (
        _bert,
        dict(
            r=4,
            lora_alpha=8,
            target_modules=["query", "value"],
            rank_pattern={"layer.1.attention.self.query": 2},
            alpha_pattern={"value": 16},
        ),
    ),
    "bert-all-linear-rslora-head": (
        lambda: _bert(head=True),
        dict(r=6, lora_alpha=3, target_modules="all-linear", use_rslora=True, task_type="SEQ_CLS"),
    ),
    "gpt2-fused-fan-in-fan-out": (
        _gpt2,
        dict(r=4, lora_alpha=16, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True),
    ),
    "llama-layers-patterns": (
        _llama,
        dict(
            r=3,
            lora_alpha=5,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            layers_to_transform=[1],
            layers_pattern="layers",
            rank_pattern={r"mlp\.(up|down)_proj": 4},
        ),
    ),
}


def make_adapter(build, lora: dict, root: Path, seed: int = 0) -> tuple[Path, Path, Path]:
    """(base, adapter, merged): a base model, a peft adapter of it, and the adapter merged and saved.

    The base is saved without its task head (BertModel, GPT2Model, LlamaModel), so its tensor names
    lack the prefix ("bert.", "transformer.", "model.") that the adapter's and the merged model's have.
    """
    torch.manual_seed(seed)
    model = build()
    model.base_model.save_pretrained(root / "base")
    write_tiny_tokenizer(root / "base")  # what the probe is read with
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora))
    peft_model.save_pretrained(root / "adapter")
    peft_model.merge_and_unload().save_pretrained(root / "merged")
    return root / "base", root / "adapter", root / "merged"


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    build, lora = CASES[request.param]
    return make_adapter(build, lora, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def bert_case(tmp_path_factory):
    build, lora = CASES["bert-qv-patterns"]
    return make_adapter(build, lora, tmp_path_factory.mktemp("bert"))


def assert_same_vector(adapter_vec: np.ndarray, merged_vec: np.ndarray) -> None:
    scale = np.abs(merged_vec).max()
    assert scale > 0
    np.testing.assert_allclose(adapter_vec, merged_vec, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize(
    "params",
    [
        {},  # the default: sketch, rank 8 (above every adapter's r), mean, block_norm
        {"factor": "sketch", "rank": 3, "pooling": "concat", "block_norm": False, "seed": 5},
        {"factor": "U", "rank": 2},
        {"factor": "U", "rank": 2, "solver": "exact", "pooling": "concat"},
        {"factor": "US", "rank": 2, "block_norm": False},
        {"factor": "S", "rank": 2, "pooling": "concat"},
        {"projection": "gaussian", "rows": 0.3, "pooling": "concat"},
        {"projection": "countsketch", "rows": 0.3, "pooling": "concat"},
        {"projection": "countsketch", "rank": 4},
        {"probe": 16},  # through the base's inputs on the probe: L (R^T H)
        {"probe": 16, "rows": 0.3, "pooling": "concat"},
    ],
    ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()) or "default",
)
def test_adapter_vector_equals_merged_model_vector(case, params):
    base, adapter, merged = case
    emb = DeltaEmbedder(**params).fit(base)
    adapter_vec, merged_vec = emb.embed_one(adapter), emb.embed_one(merged)
    assert_same_vector(adapter_vec, merged_vec)
    if params.get("pooling") == "concat":  # untouched matrices: exactly zero in both
        zero = [b.stop for b in emb.blocks_ if not merged_vec[b.start : b.stop].any()]
        assert zero == [b.stop for b in emb.blocks_ if not adapter_vec[b.start : b.stop].any()]


def test_factors_multiply_to_the_merged_delta(case):
    """dW = L R^T per matrix (fused parts split, orientation canonical), and nothing else changed."""
    base, adapter, merged = case
    base_ck, merged_ck = Checkpoint(base), Checkpoint(merged)
    layout = base_ck.layout()
    assert layout.prefix == ""  # the adapter's names carry the task model's prefix (but for BertModel)
    shapes = {ref.key: tuple(base_ck.matrix(ref, layout.prefix).shape) for ref in layout.refs}
    deltas = AdapterCheckpoint(adapter).low_rank_deltas(layout, shapes)
    assert deltas
    for ref in layout.refs:
        dense = merged_ck.matrix(ref, merged_ck.layout().prefix) - base_ck.matrix(ref, layout.prefix)
        if ref.key not in deltas:
            assert not dense.any(), ref
            continue
        left, right = deltas[ref.key]
        assert left.shape[0] == shapes[ref.key][0] and right.shape[0] == shapes[ref.key][1]
        assert left.shape[1] == right.shape[1] <= 6  # thin: n x r and m x r
        np.testing.assert_allclose((left @ right.T).numpy(), dense.double().numpy(), atol=1e-6)


@pytest.mark.parametrize("n, m, r", [(40, 30, 5), (6, 50, 9), (50, 4, 7), (20, 20, 1)])
def test_low_rank_svd_matches_numpy(n, m, r):
    g = torch.Generator().manual_seed(n + m + r)
    left = torch.randn(n, r, generator=g, dtype=torch.float64)
    right = torch.randn(m, r, generator=g, dtype=torch.float64)
    u, s = low_rank_svd(left, right, rank=4)
    k = min(4, n, m, r)
    expected_u, expected_s, _ = np.linalg.svd((left @ right.T).numpy())
    assert u.shape == (n, k) and s.shape == (k,)
    np.testing.assert_allclose(s.numpy(), expected_s[:k], rtol=1e-10)
    # the same singular vectors, each up to its sign
    np.testing.assert_allclose(np.abs(np.sum(u.numpy() * expected_u[:, :k], axis=0)), 1, rtol=1e-10)


def test_bin_weights_and_checkpoint_objects(bert_case, tmp_path):
    base, adapter, _ = bert_case
    copy = tmp_path / "bin-adapter"
    copy.mkdir()
    shutil.copy(adapter / "adapter_config.json", copy)
    torch.save(load_file(str(adapter / "adapter_model.safetensors")), copy / "adapter_model.bin")
    emb = DeltaEmbedder().fit(base)
    assert is_adapter(copy) and isinstance(open_checkpoint(copy), AdapterCheckpoint)
    np.testing.assert_array_equal(emb.embed_one(copy), emb.embed_one(AdapterCheckpoint(adapter)))
    assert adapter_files(["README.md", "adapter_config.json", "adapter_model.bin", "adapter_model.safetensors"]) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert adapter_files(["adapter_config.json"]) is None


def test_matching_follows_peft():
    """target_modules, exclude_modules, layers_to_transform and the pattern maps, against peft's own functions."""
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    keys = [f"model.layers.{i}.{m}" for i in range(3) for m in ("self_attn.q_proj", "mlp.up_proj", "mlp.down_proj")]
    keys += ["bert.encoder.layer.1.attention.self.query", "bert.pooler.dense", "classifier", "q_proj"]
    configs = [
        dict(target_modules=["q_proj", "up_proj"], layers_to_transform=[0, 2], layers_pattern="layers"),
        dict(target_modules=["q_proj", "down_proj"], layers_to_transform=1, exclude_modules=["layers.1.mlp.down_proj"]),
        dict(
            target_modules=r".*\.(q_proj|query)",
            rank_pattern={"up_proj": 2, r"layers\.1\..*": 5},
            alpha_pattern={"q_proj": 3},
        ),
        dict(
            target_modules=["dense", "classifier", "query"],
            modules_to_save=["classifier"],
            exclude_modules="bert.pooler.*",
        ),
    ]
    for kwargs in configs:
        peft_config = LoraConfig(r=8, lora_alpha=16, **kwargs)
        saved = json.loads(json.dumps(peft_config.to_dict(), default=sorted))  # as save_pretrained writes it
        ours = AdapterConfig.from_config(saved | {"peft_type": "LORA"}, "x")
        for key in keys:
            assert ours.targets(key) == bool(check_target_module_exists(peft_config, key)), (kwargs, key)
            r = peft_config.rank_pattern.get(get_pattern_key(peft_config.rank_pattern.keys(), key), peft_config.r)
            alpha = peft_config.alpha_pattern.get(get_pattern_key(peft_config.alpha_pattern.keys(), key), 16)
            assert ours.rank_alpha(key) == (r, alpha), (kwargs, key)


def test_embed_stores_adapter_and_full_finetune(bert_case, tmp_path):
    base, adapter, merged = bert_case
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(base, [adapter, merged], store=store)
    assert not result.failed and len(result.embedded) == 2
    meta = result.metadata.set_index("model")
    assert (meta["architecture"] == "bert").all()
    rows = {m: i for i, m in enumerate(result.metadata["model"])}
    assert_same_vector(result.vectors[rows[str(adapter.resolve())]], result.vectors[rows[str(merged.resolve())]])
    # a re-run skips both; a new alpha is a new delta, so the adapter is embedded again
    again = modelvec.embed(base, [adapter, merged], store=store)
    assert len(again.skipped) == 2
    original = (adapter / "adapter_config.json").read_text()
    (adapter / "adapter_config.json").write_text(json.dumps({**json.loads(original), "lora_alpha": 32}))
    try:
        third = modelvec.embed(base, [adapter, merged], store=store)
    finally:
        (adapter / "adapter_config.json").write_text(original)
    assert third.embedded == [str(adapter.resolve())] and third.skipped == [str(merged.resolve())]


DROP = object()


def _edited(adapter: Path, out: Path, changes: dict) -> Path:
    """A copy of ``adapter`` with its config changed (keys set to DROP removed)."""
    shutil.copytree(adapter, out)
    config = json.loads((adapter / "adapter_config.json").read_text()) | changes
    (out / "adapter_config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not DROP}))
    return out


@pytest.mark.parametrize(
    "changes, cause",
    [
        ({"lora_alpha": DROP, "target_modules": DROP}, "adapter_config.json: lacks lora_alpha, target_modules"),
        ({"peft_type": "IA3"}, "peft_type IA3 is not supported: only LoRA adapters are (IA3 learns rescalings"),
        ({"peft_type": "PREFIX_TUNING"}, "peft_type PREFIX_TUNING is not supported"),
        ({"use_dora": True}, "DoRA (use_dora) is not supported"),
        ({"target_modules": "(query"}, "target_modules holds '(query', not a valid regular expression"),
        ({"init_lora_weights": "pissa_niter_4"}, "init_lora_weights 'pissa_niter_4' changes the base weights"),
        ({"r": 8, "rank_pattern": {}}, "lora_A has rank 4, adapter_config.json gives r=8"),
        (
            {"target_modules": ["query", "value", "key"]},
            "target_modules selects encoder.layer.0.attention.self.key, but",
        ),
        (
            {"target_modules": ["output.dense"]},
            "selects encoder.layer.0.attention.output.dense, but the adapter has no",
        ),
        (
            {"target_modules": ["word_embeddings"]},
            "target_modules (word_embeddings) match none of the base's bert matrices",
        ),
    ],
)
def test_bad_adapter_configs_give_one_line_errors(bert_case, tmp_path, changes, cause):
    base, adapter, _ = bert_case
    bad = _edited(adapter, tmp_path / "bad", changes)
    with pytest.raises(ModelvecError) as err:
        DeltaEmbedder().fit(base).embed_one(bad)
    message = str(err.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message and cause in message, message


def test_bad_adapters_give_one_line_errors(bert_case, tmp_path):
    base, adapter, _ = bert_case
    emb = DeltaEmbedder().fit(base)

    def error(path: Path) -> str:
        with pytest.raises(ModelvecError) as err:
            emb.embed_one(path)
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
        return str(err.value).split(": ", 1)[1]

    no_weights = shutil.copytree(adapter, tmp_path / "no-weights")
    (no_weights / "adapter_model.safetensors").unlink()
    assert error(no_weights).startswith("no adapter weights in")
    _, gpt2, _ = make_adapter(_gpt2, dict(r=2, target_modules=["c_attn"]), tmp_path / "gpt2")
    assert error(gpt2) == "is an adapter of a gpt2 model, the base is bert"
    _, wide, _ = make_adapter(
        lambda: _bert(intermediate_size=128), dict(r=2, target_modules=["intermediate.dense"]), tmp_path / "wide"
    )
    assert "intermediate.dense: lora_A is [2, 32] and lora_B [128, 2], but the base's" in error(wide)
    _, saved, _ = make_adapter(
        _bert, dict(r=2, target_modules=["value"], modules_to_save=["query"]), tmp_path / "saved"
    )
    assert error(saved) == (
        "stores the whole of encoder.layer.0.attention.self.query.weight (modules_to_save), "
        "a matrix of the representation: not supported"
    )
    _, pooler, _ = make_adapter(_bert, dict(r=2, target_modules=["pooler.dense"]), tmp_path / "pooler")
    assert (
        error(pooler) == "target_modules (pooler.dense) match none of the base's bert matrices (adapted: pooler.dense)"
    )
    with pytest.raises(ModelvecError, match="adapts no attention or feed-forward matrix"):
        AdapterCheckpoint(pooler).layout()


def test_an_adapter_given_as_the_base_names_the_model_it_adapts(bert_case, tmp_path):
    base, adapter, _ = bert_case
    said = "is a LoRA adapter, not a base model: use the model it adapts as the base"
    with pytest.raises(CheckpointError) as err:
        DeltaEmbedder().fit(adapter)
    assert str(err.value) == f"{adapter}: {said}"  # its config names no base
    named = shutil.copytree(adapter, tmp_path / "named")
    config = json.loads((named / "adapter_config.json").read_text())
    (named / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "org/the-base"}))
    with pytest.raises(CheckpointError) as err:
        DeltaEmbedder().fit(named)
    assert str(err.value) == f"{named}: {said} (adapter_config.json names org/the-base)"
    with pytest.raises(CheckpointError, match=f"{said} \\(adapter_config.json names org/the-base\\)"):
        modelvec.embed(named, [base], store=tmp_path / "s.duckdb")


def test_discovery_keeps_declared_adapters(tiny_bert, bert_case, tmp_path):
    import yaml

    from modelvec.hub.client import HubSettings
    from modelvec.run import discover
    from modelvec.testing.localhub import LocalHub

    base_name = "google-bert/bert-base-uncased"
    _, adapter, _ = bert_case
    card = ("---\n" + yaml.safe_dump({"base_model": base_name, "library_name": "peft"}) + "---\n").encode()
    hub = LocalHub(tmp_path / "hub")
    hub.publish(base_name, {p.name: p for p in tiny_bert.iterdir() if p.is_file()})
    hub.publish(
        "zoe/bert-lora",
        {
            "adapter_config.json": adapter / "adapter_config.json",
            "adapter_model.safetensors": adapter / "adapter_model.safetensors",
            "README.md": card,
        },
    )
    hub.publish(
        "yan/bert-lora-config-only", {"adapter_config.json": adapter / "adapter_config.json", "README.md": card}
    )
    with hub.serve() as server:
        hub_settings = HubSettings(
            endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False, backoff=0.01
        )
        found = {e.model: e for e in discover(base_name, search=False, hub_settings=hub_settings).entries}
        # fetched from the Hub (its two files only) and embedded: the vector of the local adapter
        result = modelvec.embed(
            base_name, [found["zoe/bert-lora"]], store=tmp_path / "s.duckdb", hub_settings=hub_settings
        )
    assert result.embedded == ["zoe/bert-lora"], result.failed
    assert_same_vector(result.vectors[0], DeltaEmbedder().fit(tiny_bert).embed_one(adapter))
    fetched = {r["path"].rsplit("/", 1)[-1] for r in server.requests if "/zoe/bert-lora/resolve/" in r["path"]}
    assert fetched == {"adapter_config.json", "adapter_model.safetensors"}
    kept, rejected = found["zoe/bert-lora"], found["yan/bert-lora-config-only"]
    assert kept.kept and kept.reason.startswith("declares base_model:adapter:") and kept.formats == ["adapter"]
    assert not rejected.kept and rejected.reason.endswith("but no PyTorch weights (has: adapter)")


@pytest.mark.parametrize("params", [{}, {"factor": "U", "rank": 2}], ids=["sketch", "U"])
def test_an_adapter_is_embedded_without_reading_the_base(case, params, monkeypatch):
    """After fit, an adapter's vector needs only its own factors and the base's shapes: no base matrix is read."""
    base, adapter, merged = case
    emb = DeltaEmbedder(**params).fit(base)
    expected = emb.embed_one(adapter)

    def refuse(key, **_):
        raise AssertionError(f"read the base's {key}")

    monkeypatch.setattr(emb.base_, "get_stored", refuse)
    np.testing.assert_array_equal(emb.embed_one(adapter), expected)
    if params:  # SVD factors of a full fine-tune need the base's matrices to form the delta...
        with pytest.raises(AssertionError, match="read the base's"):
            emb.embed_one(merged)
    else:  # ...the sketch does not: the base's part W_base·Ω was made once, at fit
        assert np.abs(emb.embed_one(merged)).max() > 0
