"""Checkpoint formats give identical vectors, and every kind of bad input gives a one-line error naming the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import planted_finetune, save_state
from modelvec import ArchitectureError, Checkpoint, CheckpointError, DeltaEmbedder, IncompatibleError


def _shard(state: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    keys = sorted(state)
    return [{k: state[k] for k in keys[i::n]} for i in range(n)]


def as_sharded_safetensors(src: Path, out: Path, n: int = 3) -> Path:
    out.mkdir(parents=True)
    shutil.copy(src / "config.json", out)
    state = load_file(str(src / "model.safetensors"))
    weight_map = {}
    for i, part in enumerate(_shard(state, n)):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in part.items()}, str(out / name))
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def as_bin(src: Path, out: Path, shards: int = 1) -> Path:
    out.mkdir(parents=True)
    shutil.copy(src / "config.json", out)
    state = load_file(str(src / "model.safetensors"))
    if shards == 1:
        torch.save(state, out / "pytorch_model.bin")
        return out
    weight_map = {}
    for i, part in enumerate(_shard(state, shards)):
        name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, out / name)
        weight_map.update({k: name for k in part})
    (out / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def as_dtype(src: Path, out: Path, dtype: torch.dtype) -> Path:
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(src / "model.safetensors")).items()
    }
    return save_state(out, state, json.loads((src / "config.json").read_text()))


@pytest.fixture(scope="module")
def embedder(tiny_bert) -> DeltaEmbedder:
    return DeltaEmbedder(rank=4).fit(tiny_bert)


@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(lambda s, o: as_sharded_safetensors(s, o), id="sharded-safetensors"),
        pytest.param(lambda s, o: as_bin(s, o), id="bin"),
        pytest.param(lambda s, o: as_bin(s, o, shards=2), id="sharded-bin"),
        pytest.param(lambda s, o: (shutil.copytree(s, o), o / "model.safetensors")[1], id="single-file"),
    ],
)
def test_formats_give_the_same_vector(embedder, tiny_finetunes, tmp_path, convert):
    reference = embedder.embed_one(tiny_finetunes[0])
    converted = convert(tiny_finetunes[0], tmp_path / "converted")
    np.testing.assert_array_equal(embedder.embed_one(converted), reference)


def test_base_in_another_format_gives_the_same_vector(tiny_bert, tiny_finetunes, tmp_path):
    reference = DeltaEmbedder(rank=4).fit(tiny_bert).embed_one(tiny_finetunes[1])
    base_bin = as_bin(tiny_bert, tmp_path / "base-bin")
    np.testing.assert_array_equal(DeltaEmbedder(rank=4).fit(base_bin).embed_one(tiny_finetunes[1]), reference)


def test_single_file_without_config_is_detected_from_tensor_names(embedder, tiny_finetunes, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_finetunes[0] / "model.safetensors", bare / "weights.safetensors")
    ck = Checkpoint(bare / "weights.safetensors")
    assert ck.config is None and ck.architecture().name == "bert"
    np.testing.assert_array_equal(embedder.embed_one(ck), embedder.embed_one(tiny_finetunes[0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_fine_tune_is_computed_in_float32(embedder, tiny_finetunes, tmp_path, dtype):
    """A half-precision upload differs from fp32 only by its rounding, not by orders of magnitude."""
    half = as_dtype(tiny_finetunes[0], tmp_path / "half", dtype)
    ck = Checkpoint(half)
    assert ck.get("encoder.layer.0.attention.self.query.weight").dtype == torch.float32
    v32 = DeltaEmbedder(rank=2, factor="US").fit(embedder.base_).embed_one(tiny_finetunes[0])
    vhalf = DeltaEmbedder(rank=2, factor="US").fit(embedder.base_).embed_one(half)
    assert np.linalg.norm(vhalf - v32) < 0.2 * np.linalg.norm(v32)


def test_pickle_in_bin_is_refused(embedder, tmp_path):
    """weights_only=True: a .bin whose unpickling would run code fails, and the code never runs."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    folder = tmp_path / "evil"
    folder.mkdir()
    shutil.copy(embedder.base_.folder / "config.json", folder)
    torch.save({"encoder.layer.0.attention.self.query.weight": Evil()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as err:
        embedder.embed_one(folder)
    assert str(folder) in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


# --- bad input: one line, naming the model and the cause -----------------------------------------


def _edit(src: Path, out: Path, edit) -> Path:
    state = load_file(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    state, config = edit(state, config)
    return save_state(out, state, config)


def _resized(state, config, key="encoder.layer.1.attention.self.value.weight"):
    state[key] = torch.zeros(48, 32)
    return state, config


def _nan(state, config):
    state["encoder.layer.1.output.dense.weight"][:, 0] = float(
        "nan"
    )  # in every row: in the rows read, whatever the share
    return state, config


def _inf(state, config):
    state["encoder.layer.0.intermediate.dense.weight"][:, 1] = float("inf")
    return state, config


def _missing(state, config):
    del state["encoder.layer.1.attention.output.dense.weight"]
    return state, config


def _unknown(state, config):
    config["model_type"] = "mamba"
    config["architectures"] = ["MambaForCausalLM"]
    return state, config


def _gpt2_family(state, config):
    config["model_type"] = "gpt2"
    config["n_layer"] = 2
    return state, config


def _int_weights(state, config):
    state["encoder.layer.0.attention.self.key.weight"] = torch.zeros(32, 32, dtype=torch.int32)
    return state, config


def _fewer_layers(state, config):
    config["num_hidden_layers"] = 1
    return state, config


@pytest.mark.parametrize(
    "edit, error, needles",
    [
        (_resized, IncompatibleError, ["encoder.layer.1.attention.self.value.weight", "[48, 32]", "[32, 32]"]),
        (_nan, CheckpointError, ["encoder.layer.1.output.dense.weight", "NaN or Inf"]),
        (_inf, CheckpointError, ["encoder.layer.0.intermediate.dense.weight", "NaN or Inf"]),
        (_missing, CheckpointError, ["missing tensor", "encoder.layer.1.attention.output.dense.weight"]),
        (_unknown, ArchitectureError, ["unknown architecture", "mamba", "bert", "gpt2", "llama", "t5"]),
        (_gpt2_family, CheckpointError, ["missing tensor", "h.0.attn.c_attn.weight"]),
        (_int_weights, CheckpointError, ["encoder.layer.0.attention.self.key.weight", "dtype"]),
        (_fewer_layers, IncompatibleError, ["1 layers", "2 layers"]),
    ],
    ids=["shape", "nan", "inf", "missing", "unknown-arch", "other-family", "int-dtype", "fewer-layers"],
)
def test_bad_fine_tune_gives_one_line_error(embedder, tiny_finetunes, tmp_path, edit, error, needles):
    bad = _edit(tiny_finetunes[0], tmp_path / "bad", edit)
    with pytest.raises(error) as err:
        embedder.embed_one(bad)
    message = str(err.value)
    assert message.startswith(str(bad)) and "\n" not in message
    for needle in needles:
        assert needle in message


def test_resized_vocabulary_and_added_head_are_fine(embedder, tiny_finetunes, tmp_path):
    def grow(state, config):
        state["embeddings.word_embeddings.weight"] = torch.randn(80, 32)
        config["vocab_size"] = 80
        return {("bert." + k): v for k, v in state.items()} | {"classifier.weight": torch.randn(3, 32)}, config

    grown = _edit(tiny_finetunes[0], tmp_path / "grown", grow)
    np.testing.assert_array_equal(embedder.embed_one(grown), embedder.embed_one(tiny_finetunes[0]))


def test_other_family_error_when_both_configs_are_known(tmp_path, tiny_bert):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    gpt = tmp_path / "gpt2"
    GPT2Model(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)).save_pretrained(gpt)
    with pytest.raises(IncompatibleError, match=r"family gpt2 does not match the base's family bert"):
        DeltaEmbedder().fit(tiny_bert).embed_one(gpt)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d, "no weights found"),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}"),
            "cannot read model.safetensors",
        ),
        (
            lambda d: (d / "model.safetensors.index.json").write_text(
                '{"weight_map": {"a.weight": "model-2.safetensors"}}'
            ),
            "missing shard model-2.safetensors",
        ),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
    ],
    ids=["empty-folder", "corrupt-safetensors", "missing-shard", "bad-config"],
)
def test_unreadable_checkpoints(embedder, tmp_path, make, needle):
    folder = tmp_path / "broken"
    folder.mkdir()
    if needle == "config.json is not valid JSON":
        shutil.copy(embedder.base_.files[0], folder / "model.safetensors")
    make(folder)
    with pytest.raises(CheckpointError) as err:
        embedder.embed_one(folder)
    assert needle in str(err.value) and str(err.value).startswith(str(folder)) and "\n" not in str(err.value)


def test_config_without_model_type_or_architectures(embedder, tiny_finetunes, tmp_path):
    def strip(state, config):
        config.pop("model_type", None)
        config.pop("architectures", None)
        return state, config

    bad = _edit(tiny_finetunes[0], tmp_path / "anon", strip)
    with pytest.raises(ArchitectureError, match="unknown architecture 'none given'; supported model types: .*bert"):
        embedder.embed_one(bad)


def test_missing_path(embedder, tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder"):
        embedder.embed_one(tmp_path / "nowhere")


def test_planted_finetune_helper_really_changes_every_matrix(tiny_bert, tmp_path):
    """Guards the fixtures: the fine-tunes differ from the base in every used matrix."""
    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=5)
    base, tuned = Checkpoint(tiny_bert), Checkpoint(ft)
    layout = base.layout()
    for ref in layout.refs:
        assert not torch.equal(base.matrix(ref, ""), tuned.matrix(ref, ""))
