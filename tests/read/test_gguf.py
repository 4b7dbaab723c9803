"""GGUF checkpoints in the rank study: tiny transformers models written as GGUF the way llama.cpp's converter does.

The writer below names tensors with gguf's own ``TensorNameMap`` and applies the converter's two
changes (Llama's Q/K row permutation, GPT-2's Conv1D transpose); an F32 file must then give exactly
the ranks of the safetensors folder, and a Q8_0 one close singular values, ranks at least as high
and a warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from builders import save_state
from modelvec.cli import app
from modelvec.core.errors import CheckpointError
from modelvec.read import Checkpoint, open_checkpoint
from modelvec.read.checkpoint import QuantizationWarning
from modelvec.read.gguf import GGUFCheckpoint
from modelvec.spectra import energy_rank_table as rank_table
from modelvec.studies.depth import depth_study as rank_study
from modelvec.studies.depth import spectra_of as spectra
from modelvec.testing.gguf import write_gguf

THRESHOLDS = (0.5, 0.9, 0.99, 0.999, 1.0)
Q = gguf.GGMLQuantizationType


def _planted(w: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A matrix of ``w``'s shape and norm with singular values decaying like e^{-i/3}: ranks well below full."""
    n, m = w.shape
    u, _ = torch.linalg.qr(torch.randn(n, min(n, m), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(m, min(n, m), generator=g, dtype=torch.float64))
    s = torch.exp(-torch.arange(min(n, m), dtype=torch.float64) / 3)
    out = (u * s) @ v.T
    return (out * w.double().norm() / out.norm()).float()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny seeded Llama (3 layers, grouped-query attention) whose layer matrices have decaying spectra."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    folder = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    state = {k: _planted(v, g) if ".layers." in k and v.ndim == 2 else v for k, v in state.items()}
    return save_state(folder, state, json.loads((folder / "config.json").read_text()))


def _model(kind: str, folder: Path) -> Path:
    torch.manual_seed(0)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=32)).save_pretrained(
            folder
        )
    elif kind == "bert":
        from transformers import BertModel

        from builders import tiny_bert_config

        BertModel(tiny_bert_config()).save_pretrained(folder)
    else:
        from transformers import T5Config, T5ForConditionalGeneration

        T5ForConditionalGeneration(
            T5Config(
                vocab_size=64,
                d_model=32,
                d_ff=64,
                d_kv=8,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                feed_forward_proj="gated-gelu",
            )
        ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gguf_files(llama, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {
        name: write_gguf(llama, root / f"llama-{name}.gguf", "llama", qtype)
        for name, qtype in (("f32", Q.F32), ("f16", Q.F16), ("q8_0", Q.Q8_0))
    }


def _ranks(items) -> dict:
    table = rank_table(items, THRESHOLDS)
    return {(r.stack, r.layer, r.family, r.threshold): r.rank for r in table.itertuples()}


def test_f32_llama_gguf_gives_exactly_the_safetensors_tensors_and_ranks(llama, gguf_files):
    ck, ref = open_checkpoint(gguf_files["f32"]), Checkpoint(llama)
    assert isinstance(ck, GGUFCheckpoint) and ck.architecture().name == "llama"
    assert {k: ck.config[k] for k in ("num_hidden_layers", "hidden_size", "num_key_value_heads")} == {
        "num_hidden_layers": 3,
        "hidden_size": 64,
        "num_key_value_heads": 2,
    }
    layout = ck.layout()
    assert ck.gguf_name("layers.1.self_attn.q_proj.weight") == "blk.1.attn_q.weight"
    assert "token_embd.weight" in ck.keys()  # noqa: SIM118  (a checkpoint, not a dict)
    for r in layout.refs:  # the converter's Q/K permutation is undone: the very same tensors
        torch.testing.assert_close(ck.get(r.tensor), ref.get("model." + r.tensor), rtol=0, atol=0)
        assert ck.shape(r.tensor) == ref.shape("model." + r.tensor)
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)  # F32: nothing to warn about
        exact, got = spectra(llama), spectra(ck)
    assert ck.quantized_types() == []
    for a, b in zip(exact, got):
        assert (a.stack, a.layer, a.family, a.shape) == (b.stack, b.layer, b.family, b.shape)
        np.testing.assert_array_equal(a.singular_values, b.singular_values)
    assert _ranks(exact) == _ranks(got)


@pytest.mark.parametrize("kind", ["gpt2", "bert", "t5"])
def test_f32_gguf_of_other_families_gives_the_safetensors_ranks(kind, tmp_path):
    folder = _model(kind, tmp_path / kind)
    path = write_gguf(folder, tmp_path / f"{kind}.gguf", kind)
    exact, got = spectra(folder), spectra(path)
    assert [(s.stack, s.layer, s.family, s.shape) for s in exact] == [
        (s.stack, s.layer, s.family, s.shape) for s in got
    ]
    for a, b in zip(exact, got):
        np.testing.assert_allclose(b.singular_values, a.singular_values, rtol=1e-6, atol=1e-7)
    assert _ranks(exact) == _ranks(got)
    if kind == "gpt2":  # the fused c_attn, transposed back to Conv1D's [in, out]
        assert {s.family for s in got} >= {"qkv", "q", "k", "v"} and got[0].shape == (32, 96)


def test_q8_0_gguf_warns_and_its_ranks_are_at_least_the_exact_ones(llama, gguf_files):
    exact = spectra(llama)
    with pytest.warns(
        QuantizationWarning, match=r"quantized weights \(Q8_0\): .*quantization noise raises the measured rank"
    ):
        got = spectra(gguf_files["q8_0"])
    worst = 0.0
    for a, b in zip(exact, got):
        assert a.shape == b.shape
        worst = max(worst, float(np.abs(b.singular_values - a.singular_values).max() / a.singular_values[0]))
    assert worst < 5e-3  # Q8_0: 8-bit blocks of 32, relative to the largest singular value
    exact_r, got_r = _ranks(exact), _ranks(got)
    assert all(got_r[k] >= exact_r[k] for k in exact_r if k[3] >= 0.99)
    assert all(got_r[k] == exact_r[k] for k in exact_r if k[3] <= 0.9)
    # at t = 1 the noise fills every direction: full rank where the planted spectrum has ~1e-9 of the energy left
    assert sum(got_r[k] > exact_r[k] for k in exact_r if k[3] == 1.0) > 0


def test_f16_gguf_does_not_warn(gguf_files, llama):
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)  # plain floats are not quantized
        got = spectra(gguf_files["f16"])
    exact_r, got_r = _ranks(spectra(llama)), _ranks(got)
    assert all(got_r[k] == exact_r[k] for k in exact_r if k[3] <= 0.99)


def test_cli_rank_of_a_gguf_prints_the_warning(gguf_files, tmp_path):
    result = CliRunner().invoke(
        app, ["rank", str(gguf_files["q8_0"]), "--threshold", "0.9", "--out", str(tmp_path / "r"), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "Q8_0" in result.stderr and "raises the measured rank" in result.stderr
    records = json.loads(result.stdout)
    assert len(records) == 3 * 7 and {r["family"] for r in records} == {"q", "k", "v", "o", "ff_gate", "ff1", "ff2"}
    assert (tmp_path / "r" / "rank-0.9.png").exists() and (tmp_path / "r" / "ranks.csv").exists()
    study = rank_study(gguf_files["f32"], thresholds=(0.9,))
    assert study.table["rank"].tolist() == [r["rank"] for r in records]  # Q8_0 at 0.9: the exact ranks


def test_delta_is_exact_between_float_files_and_refused_when_quantized(llama, gguf_files, tmp_path):
    state = load_file(str(llama / "model.safetensors"))
    g = torch.Generator().manual_seed(7)
    ft = {
        k: v + 0.01 * torch.randn(v.shape[0], 2, generator=g) @ torch.randn(2, v.shape[1], generator=g)
        if ".layers." in k and v.ndim == 2
        else v
        for k, v in state.items()
    }
    ft_folder = save_state(tmp_path / "ft", ft, json.loads((llama / "config.json").read_text()))
    ft_gguf = write_gguf(ft_folder, tmp_path / "ft.gguf", "llama")
    exact = spectra(ft_folder, base=llama, of="delta")
    got = spectra(ft_gguf, base=gguf_files["f32"], of="delta")
    mixed = spectra(ft_gguf, base=llama, of="delta")  # a GGUF fine-tune against a safetensors base lines up
    assert _ranks(exact) == _ranks(got) == _ranks(mixed)
    assert {r for k, r in _ranks(exact).items() if k[3] == 0.999} == {2}
    with pytest.raises(
        CheckpointError, match=r"quantized weights \(Q8_0\): --of delta needs unquantized weights"
    ) as info:
        spectra(ft_gguf, base=gguf_files["q8_0"], of="delta")
    assert "\n" not in str(info.value) and str(info.value).startswith(str(gguf_files["q8_0"]))


def test_corrupt_truncated_and_unknown_gguf_give_one_line_errors(gguf_files, tmp_path):
    data = gguf_files["q8_0"].read_bytes()
    corrupt, foreign = "is truncated or corrupt", "is not a GGUF file (no GGUF magic)"
    cases = {
        "truncated.gguf": (data[: len(data) // 2], corrupt),
        "tail-cut.gguf": (data[:-10], corrupt),
        "header-only.gguf": (data[:40], corrupt),
        "garbage.gguf": (b"not a gguf file at all" * 10, foreign),
        "empty.gguf": (b"", foreign),
    }
    for name, (content, why) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError) as info:
            spectra(tmp_path / name)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{tmp_path / name}: cannot read {name}: it {why} ("), message
    unknown = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(unknown, "mamba")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.ssm_in.weight", np.ones((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        CheckpointError, match=r"mamba.gguf: unsupported GGUF architecture 'mamba' in mamba.gguf \(supported: bert, "
    ):
        spectra(unknown)
    result = CliRunner().invoke(app, ["rank", str(unknown), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "unsupported GGUF architecture" in result.stderr
    result = CliRunner().invoke(app, ["rank", str(tmp_path / "truncated.gguf"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "cannot read truncated.gguf: it is truncated or corrupt" in result.stderr


def test_a_split_gguf_is_one_model_from_any_part_and_a_part_lost_or_misnamed_is_one_line(llama, gguf_files, tmp_path):
    """``gguf-split``'s parts read as the one file they were cut from: the same tensors and ranks, each tensor's bytes
    asked of the part holding it; a part missing, or a part of another set under its name, is one line."""
    first = write_gguf(llama, tmp_path / "llama-q8_0.gguf", "llama", Q.Q8_0, split=6)
    parts = sorted(first.parent.glob("llama-q8_0-*-of-*.gguf"))
    assert len(parts) >= 3 and parts[0] == first
    whole, split = open_checkpoint(gguf_files["q8_0"]), open_checkpoint(parts[-1])  # any part opens the set
    assert split.files == parts and split.keys() == whole.keys()
    for key in sorted(whole.keys()):
        assert torch.equal(split.get(key), whole.get(key)), key
    key = next(k for k in sorted(split.keys()) if k.endswith("layers.1.mlp.down_proj.weight"))
    (holder,) = split.byte_ranges({key: [(2, 5)]})
    assert holder in parts and holder != first and split.byte_ranges({key: [(2, 5)]})[holder]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizationWarning)
        assert _ranks(spectra(first)) == _ranks(spectra(gguf_files["q8_0"]))
    parts[1].rename(tmp_path / "aside.gguf")
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(first)
    assert str(info.value) == f"{first}: a GGUF split in {len(parts)} files lacks {parts[1].name}"
    parts[2].rename(parts[1])  # another part under the lost one's name
    (tmp_path / "aside.gguf").rename(parts[2])
    with pytest.raises(CheckpointError, match=rf"{parts[1].name} says it is part 3 of {len(parts)}, its name part 2"):
        open_checkpoint(first)
