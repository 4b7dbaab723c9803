"""What the tests build and compare: tiny real checkpoints (BERT, Llama) made with transformers, fine-tunes with known
deltas, adapters made with peft, and the CLI's answers as the tests read them. The fixtures that share them across a
run are in conftest.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    kwargs = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def write_tiny_tokenizer(folder: Path, vocab: int = 64) -> Path:
    """A character-level tokenizer of ``vocab`` ids (the probe text's most common characters, the rest unknown) saved
    into ``folder``: what a tiny model needs to read the probe (``Representation.probe``)."""
    from collections import Counter

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modelvec.represent.probe import probe_text

    chars = [c for c, _ in Counter(probe_text()).most_common(vocab - 1)]
    table = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(table, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def save_state(folder: Path, state: dict[str, torch.Tensor], config: dict | None) -> Path:
    """A checkpoint folder with model.safetensors (+ config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def perturb_layers(model, seed: int, scale: float) -> None:
    """A seeded Gaussian step on every 2-D matrix of ``model``'s layers, in place: a stand-in for training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and ".layer." in name:
                p.add_(scale * torch.randn(p.shape, generator=g))


def peft_adapter(
    parent: Path, out: Path, *, r: int = 2, scale: float = 0.01, seed: int | None = None, names: str | None = None
) -> Path:
    """A real peft LoRA adapter of the BERT in ``parent`` on query and value (random factors, B scaled by ``scale`` to a
    trained adapter's size; ``seed``: torch's, for the same adapter twice), saved at ``out``; its config names
    ``names`` where given (peft writes the folder it was loaded from)."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertModel

    if seed is not None:
        torch.manual_seed(seed)
    model = get_peft_model(
        BertModel.from_pretrained(parent), LoraConfig(init_lora_weights=False, r=r, target_modules=["query", "value"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
    model.save_pretrained(out)
    if names is not None:
        config = out / "adapter_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": names}))
    return out


def int8_round_trip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every layer matrix rounded to 127 levels a row (symmetric absmax) and back, as re-uploaded."""
    out = {}
    for key, w in state.items():
        if w.ndim == 2 and ".layer." in key:
            step = w.abs().amax(dim=1, keepdim=True) / 127
            w = torch.round(w / step) * step
        out[key] = w
    return out


def planted_finetune(
    base: Path,
    out: Path,
    seed: int,
    scale: float = 0.05,
    rank: int = 2,
    prefix: str = "",
    card_datasets: list[str] | None = None,
) -> Path:
    """A fine-tune of ``base``: every layer matrix plus a seeded rank-``rank`` delta."""
    state = load_file(str(base / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    new = {}
    for key, value in state.items():
        if ".layer." in key and key.endswith(".weight") and value.ndim == 2:
            a = torch.randn(value.shape[0], rank, generator=g)
            b = torch.randn(rank, value.shape[1], generator=g)
            value = value + scale * a @ b / rank
        new[prefix + key] = value
    config = json.loads((base / "config.json").read_text())
    save_state(out, new, config)
    if card_datasets is not None:
        lines = "\n".join(f"- {d}" for d in card_datasets)
        (out / "README.md").write_text(f"---\nbase_model: tiny-bert\ndatasets:\n{lines}\n---\n# a fine-tune\n")
    return out


def llama_pair(root, d: int, ff: int, layers: int, dtype: torch.dtype, seed: int = 0, scale: float = 1e-3):
    """A Llama-shaped base and fine-tune (random weights, a small dense delta) in ``root``/base and ``root``/ft."""
    gen = torch.Generator().manual_seed(seed)
    config = {
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 64,
    }
    kv = d // 4
    shapes = {
        "self_attn.q_proj": (d, d),
        "self_attn.k_proj": (kv, d),
        "self_attn.v_proj": (kv, d),
        "self_attn.o_proj": (d, d),
        "mlp.gate_proj": (ff, d),
        "mlp.up_proj": (ff, d),
        "mlp.down_proj": (d, ff),
    }
    base, ft = {}, {}
    for layer in range(layers):
        for name, shape in shapes.items():
            key = f"model.layers.{layer}.{name}.weight"
            w = torch.randn(shape, generator=gen) * 0.02
            base[key] = w.to(dtype)
            ft[key] = (w + torch.randn(shape, generator=gen) * scale).to(dtype)
    return save_state(root / "base", base, config), save_state(root / "ft", ft, config)


LLAMA = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def trained(base: Path, out: Path, directions: list[int], seed: int, size: float = 0.05, shared: float = 1.5) -> Path:
    """A fine-tune of ``base``: every layer matrix moved along the dataset ``directions`` given (each a seeded delta
    shared by the models tuned on it, ``shared`` times its own), plus its own, by ``size`` of the matrix's mean weight
    per entry (a long fine-tune: many bf16 steps); saved in bf16. Siblings (one dataset) are then 0.7 alike."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and ".layers." in name:
                step = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed))
                for d in directions:
                    step += shared * torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 + d))
                p.add_(size * p.abs().mean() * step / (1 + shared**2 * len(directions)) ** 0.5)
    model.to(torch.bfloat16).save_pretrained(out)
    return out


PLANTED_DATASETS = ("imdb", "glue/sst2", "squad")


def planted_dataset_finetune(base: Path, out: Path, dataset: int, model_seed: int, noise: float = 0.2) -> Path:
    """Fine-tune = base + a rank-2 delta specific to the dataset + a model-specific random delta."""
    state = load_file(str(base / "model.safetensors"))
    g_data = torch.Generator().manual_seed(1000 + dataset)
    g_model = torch.Generator().manual_seed(model_seed)
    new = {}
    for key, value in sorted(state.items()):
        if ".layer." in key and key.endswith(".weight") and value.ndim == 2:
            shared = torch.randn(value.shape[0], 2, generator=g_data) @ torch.randn(2, value.shape[1], generator=g_data)
            own = torch.randn(value.shape, generator=g_model)
            value = value + 0.02 * (shared / shared.norm() + noise * own / own.norm())
        new["bert." + key] = value
    save_state(out, new, json.loads((base / "config.json").read_text()))
    (out / "README.md").write_text(f"---\ndatasets:\n- {PLANTED_DATASETS[dataset]}\n---\n")
    return out


TIMINGS = {"seconds_per_model"}  # measured each run: not part of the answer being compared


def as_printed(value):
    """A value as the CLI's --json prints it."""
    from modelvec.core.output import json_text

    return json.loads(json_text(value))


@contextmanager
def maps_not_drawn() -> Iterator[list[list[list[float]]]]:
    """``cluster``'s figures not drawn, its map's coordinates recorded instead (one list a run: each coordinate over
    the map's extent, to 6 digits, no -0.0): for tests that run ``cluster`` many times to compare its answers, not
    its pictures (the figures are drawn and checked in tests/plots and tests/report/test_cluster.py; the per-block
    figure draws what the answer's ``per_block`` holds)."""
    from unittest import mock

    import numpy as np

    from modelvec.report import cluster_parts

    maps: list[list[list[float]]] = []

    def draw(report, coords, *rest) -> None:
        xy = np.asarray(coords, dtype=np.float64)
        maps.append((np.round(xy / (float(np.abs(xy).max()) or 1.0), 6) + 0.0).tolist())

    with (
        mock.patch.object(cluster_parts, "draw", draw),
        mock.patch.object(cluster_parts, "plot_block_scores", lambda *a, **k: ""),
    ):
        yield maps


def cli_json(*args: str):
    """The CLI's --json answer to ``modelvec ARGS``, which must succeed."""
    from typer.testing import CliRunner

    from modelvec.cli import app

    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def shard_in_two(folder: Path, out: Path) -> Path:
    """``folder``'s model.safetensors as two shards with an index in ``out`` (as save_pretrained writes large models)."""
    state = load_file(str(folder / "model.safetensors"))
    keys = sorted(state)
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    for name, part in zip(SHARDS, halves):
        save_file({k: state[k] for k in part}, str(out / name))
    index = {"metadata": {}, "weight_map": {k: SHARDS[i] for i, part in enumerate(halves) for k in part}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def module_inputs(model: torch.nn.Module, modules: list[torch.nn.Module], ids: list[int]) -> list[torch.Tensor]:
    """Each module's input (tokens x width) when ``model`` reads ``ids`` (an encoder-decoder: on both sides)."""
    seen: dict[int, torch.Tensor] = {}

    def keep(module: torch.nn.Module, args: tuple) -> None:
        seen.setdefault(id(module), args[0][0].detach())

    hooks = [m.register_forward_pre_hook(keep) for m in modules]
    batch = torch.tensor([ids])
    extra = {"decoder_input_ids": batch} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        model(input_ids=batch, **extra)
    for h in hooks:
        h.remove()
    return [seen[id(m)] for m in modules]
