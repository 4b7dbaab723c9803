"""Seconds per fine-tune, side by side with the I/O floor measured in the same run.

The floor is what no method can beat: reading the same tensors of both checkpoints and subtracting
them. modelvec reads the base once per run (``fit``), so its per-model cost is compared with the
floor's per-model cost including the base read, as the issue defines it; the floor without the base
read is printed too. Checkpoints: a bert-base-sized random pair (12 layers, d=768, d_ff=3072) and
the demo zoo when it has been built (``make demo``).

Run: ``make bench`` or ``python bench/bench_embed.py [--models 3] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from modelvec import Checkpoint, DeltaEmbedder

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"


def bert_base_pair(n_models: int) -> tuple[Path, list[Path]]:
    """A random bert-base-sized BertModel and fine-tunes = base + low-rank delta + small noise (cached)."""
    from transformers import BertConfig, BertModel

    base = CACHE / "bert-base-random"
    if not (base / "model.safetensors").exists():
        torch.manual_seed(0)
        BertModel(BertConfig()).save_pretrained(base)
    models = []
    state = None
    for i in range(n_models):
        out = CACHE / f"bert-base-ft{i}"
        if not (out / "model.safetensors").exists():
            state = state or load_file(str(base / "model.safetensors"))
            g = torch.Generator().manual_seed(i)
            new = {}
            for key, value in state.items():
                if value.ndim == 2 and ".layer." in key:
                    a = torch.randn(value.shape[0], 16, generator=g)
                    b = torch.randn(16, value.shape[1], generator=g)
                    value = value + 1e-3 * (a @ b) / 16 + 1e-5 * torch.randn(value.shape, generator=g)
                new["bert." + key] = value.contiguous()
            out.mkdir(parents=True, exist_ok=True)
            save_file(new, str(out / "model.safetensors"))
            (out / "config.json").write_text((base / "config.json").read_text())
        models.append(out)
    return base, models


def io_floor(base: Path | dict[str, torch.Tensor], model: Path) -> float:
    """Read the used tensors of both checkpoints and subtract them: the cost no method avoids.

    ``base`` as a dict of tensors already in memory gives the floor of a design that reads the
    base once per run, as modelvec does.
    """
    start = time.perf_counter()
    ft = Checkpoint(model)
    layout = ft.layout()
    b = None if isinstance(base, dict) else Checkpoint(base)
    b_prefix = b.layout().prefix if b is not None else ""
    for ref in layout.refs:
        if ref.part:  # fused tensors are read once
            continue
        w = ft.get(layout.prefix + ref.tensor)
        w - (b.get(b_prefix + ref.tensor) if b is not None else base[ref.tensor])
    return time.perf_counter() - start


def base_in_memory(base: Path) -> dict[str, torch.Tensor]:
    ck = Checkpoint(base)
    layout = ck.layout()
    return {ref.tensor: ck.get(layout.prefix + ref.tensor).clone() for ref in layout.refs if not ref.part}


def per_model(fn, models: list[Path], repeats: int) -> float:
    """Median over repeats of the mean seconds per model."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for m in models:
            fn(m)
        runs.append((time.perf_counter() - start) / len(models))
    return statistics.median(runs)


SETTINGS = {
    "default (sketch + block-norm)": dict(),
    "SVD U (krylov, 4 it)": dict(factor="U", block_norm=False, n_iter=4),
    "SVD U (krylov, 2 it)": dict(factor="U", block_norm=False, n_iter=2),
}


def bench(name: str, base: Path, models: list[Path], repeats: int, exact_models: int) -> dict:
    """Per-model seconds of the floor and of modelvec's settings, measured side by side, plus accuracy."""
    embedders = {label: DeltaEmbedder(rank=8, **kw).fit(base) for label, kw in SETTINGS.items()}
    cached = base_in_memory(base)
    for m in models:  # warm the page cache and the allocator
        io_floor(base, m)
        for e in embedders.values():
            e.embed_one(m)
    row: dict = {"checkpoints": name, "models": len(models), "dim": next(iter(embedders.values())).dim_}
    row["floor_s"] = per_model(lambda m: io_floor(base, m), models, repeats)
    row["floor_base_in_memory_s"] = per_model(lambda m: io_floor(cached, m), models, repeats)
    for label, e in embedders.items():
        row[f"{label} s"] = per_model(e.embed_one, models, repeats)
    start = time.perf_counter()
    DeltaEmbedder(rank=8).fit(base)
    row["base_fit_once_s"] = time.perf_counter() - start
    if exact_models:  # accuracy of the randomized SVD settings against the exact SVD of the same factor
        exact = DeltaEmbedder(rank=8, factor="U", block_norm=False, solver="exact").fit(base)
        start = time.perf_counter()
        reference = {m: exact.embed_one(m) for m in models[:exact_models]}
        row["exact s"] = (time.perf_counter() - start) / len(reference)
        for label, e in embedders.items():
            if e.representation.factor != "U":
                continue
            errors = [np.linalg.norm(e.embed_one(m) - v) / np.linalg.norm(v) for m, v in reference.items()]
            row[f"{label} rel_err_vs_exact_max"] = float(np.max(errors))
            row[f"{label} rel_err_vs_exact_median"] = float(np.median(errors))
    for key in list(row):
        if key.endswith(" s") and key != "exact s":
            row[key.replace(" s", " ratio_to_floor")] = row[key] / row["floor_s"]
    return {k: (round(v, 4) if isinstance(v, float) and abs(v) >= 1e-3 else v) for k, v in row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zoo", type=Path, default=ROOT / ".cache" / "zoo")
    parser.add_argument("--exact-models", type=int, default=1, help="models compared with the slow exact SVD (0: skip)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    rows = []
    base, models = bert_base_pair(args.models)
    rows.append(bench("bert-base-sized random (12x768, ff 3072)", base, models, args.repeats, args.exact_models))
    manifest = args.zoo / "zoo.json"
    if manifest.exists():
        zoo = json.loads(manifest.read_text())
        rows.append(
            bench(
                "demo zoo (all-MiniLM-L6-v2 fine-tunes)",
                Path(zoo["base"]),
                [Path(m["path"]) for m in zoo["models"]],
                args.repeats,
                len(zoo["models"]),
            )
        )
    else:
        print(f"no demo zoo at {args.zoo} (run `make demo`); skipped", file=sys.stderr)
    for row in rows:
        print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
