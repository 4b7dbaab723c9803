"""DARE merges across density, weights and saved dtype, found entry by entry: an evidence zoo and its figures.

The zoo: SmolLM2-135M-Instruct (dequantized from its packaged GGUF, as the decoder evidence zoos' base) and eight
long fine-tunes of it on eight datasets, planted, not trained: every layer matrix moved by ``size`` (0.04 or 0.06)
of its mean weight per entry, about ten to fifteen bf16 steps, heavy-tailed, a low-rank part and a dataset
direction; saved in bf16 as the Hub's fine-tunes are. Each of the 28 pairs of them is merged once by mergekit
itself: 24 DARE-TIES merges (density 0.45, 0.6, 0.75, 0.9; weights 0.5/0.5 and 0.3/0.7 with ``normalize``, 1/1
without; saved in float32 and in bf16), two TIES, a linear and a task arithmetic merge; a sibling of one
fine-tune (its dataset) and a child of another are the controls. Every model is in a selection or a report half
(each density and weights in both, as each dtype).

``dropped_share`` is chosen on the selection half (the most models right: a merge named a merge of exactly its
parents, every other model its parent and kind; ties: the middle of the best range of the grid); both halves are
scored before (the entry fit off: ``dropped_share`` 1) and with it, with Wilson 95 % intervals, and the merges'
methods counted.

    python demo/evidence_dare.py --out DIR [--threads 2]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse
import itertools
import json
import shutil
import zlib

import torch

DENSITIES = (0.45, 0.6, 0.75, 0.9)
SETTINGS = (((0.5, 0.5), True), ((0.3, 0.7), True), ((1.0, 1.0), False))
DTYPES = ("float32", "bfloat16")
GRID = (0.02, 0.03, 0.05, 0.08, 0.12, 0.2)


def planted(base: Path, out: Path, dataset: int, seed: int, size: float) -> Path:
    """A long fine-tune of ``base`` (cached): each layer matrix moved along its dataset's direction and its own,
    heavy-tailed, with a rank-8 part, by ``size`` of the matrix's mean weight per entry; saved in bf16."""
    from transformers import LlamaForCausalLM

    if out.is_dir():
        return out
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 2 or ".layers." not in name:
                continue
            gen = lambda s: torch.Generator().manual_seed(zlib.crc32(f"{s} {name}".encode()))  # noqa: B023
            own = torch.randn(p.shape, generator=gen(seed)) * (1 + torch.rand(p.shape, generator=gen(seed + 1)))
            shared = torch.randn(p.shape, generator=gen(1000 + dataset))
            low = torch.randn(p.shape[0], 8, generator=gen(seed + 2)) @ torch.randn(
                8, p.shape[1], generator=gen(seed + 3)
            )
            step = own + 1.5 * shared + 0.5 * low / 8**0.5
            p.add_(size * p.abs().mean() * step / step.std())
    tmp = out.with_name(out.name + ".tmp")
    model.to(torch.bfloat16).save_pretrained(tmp)
    tmp.rename(out)
    return out


def merged(out: Path, method: str, parents, base: Path, dtype: str, seed: int, **parameters) -> Path:
    """A merge made by mergekit itself (cached); ``parents``: (folder, parameters) each."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    if out.is_dir():
        return out
    config = {
        "merge_method": method,
        "dtype": dtype,
        "models": [{"model": str(m), **({"parameters": p} if p else {})} for m, p in parents],
        "parameters": parameters,
    }
    if method != "linear":
        config["base_model"] = str(base)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run_merge(MergeConfiguration.model_validate(config), str(tmp), MergeOptions(quiet=True, random_seed=seed))
    tmp.rename(out)
    return out


def build(out: Path) -> tuple[Path, dict[str, dict]]:
    """The zoo (cached, folder by folder) and each model's truth: kind, parents, half, and a merge's settings."""
    import build_llm_evidence as dec_ev

    base = dec_ev.build_base(out)
    truth: dict[str, dict] = {}
    tuned = {f"ft{k}": planted(base, out / f"ft{k}", k + 1, 10 + k, 0.04 if k % 2 else 0.06) for k in range(8)}
    for k in range(8):
        truth[f"ft{k}"] = {"kind": "fine-tune", "parents": ["base"], "half": k % 2}
    planted(base, out / "sibling0", 1, 30, 0.05)
    truth["sibling0"] = {"kind": "fine-tune", "parents": ["base"], "half": 0}
    planted(tuned["ft1"], out / "child1", 20, 31, 0.03)
    truth["child1"] = {"kind": "fine-tune", "parents": ["ft1"], "half": 1}
    pairs = iter(itertools.combinations(sorted(tuned), 2))
    for (i, density), (j, (weights, normalize)), (k, dtype) in itertools.product(
        enumerate(DENSITIES), enumerate(SETTINGS), enumerate(DTYPES)
    ):
        pair = next(pairs)
        name = f"dare-{density}-{weights[0]}-{weights[1]}-{dtype}"
        models = [(tuned[p], {"weight": w, "density": density}) for p, w in zip(pair, weights)]
        merged(out / name, "dare_ties", models, base, dtype, seed=i * 10 + j * 2 + k, normalize=normalize)
        truth[name] = {"kind": "merge", "parents": list(pair), "half": (i + j + k) % 2, "density": density,
                       "weights": list(weights), "dtype": dtype, "method": "dare"}  # fmt: skip
    others = [
        ("ties-0.5", "ties", (0.5, 0.5), 0.5, "bfloat16", {"normalize": True}),
        ("ties-0.7", "ties", (0.3, 0.7), 0.7, "float32", {"normalize": True}),
        ("linear", "linear", (0.5, 0.5), None, "bfloat16", {}),
        ("task_arithmetic", "task_arithmetic", (0.6, 0.6), None, "bfloat16", {}),
    ]
    for h, (name, method, weights, density, dtype, parameters) in enumerate(others):
        pair = next(pairs)
        extra = {"density": density} if density is not None else {}
        models = [(tuned[p], {"weight": w, **extra}) for p, w in zip(pair, weights)]
        merged(out / name, method, models, base, dtype, seed=100 + h, **parameters)
        truth[name] = {"kind": "merge", "parents": list(pair), "half": h % 2, "method": method}
    return base, truth


def right(node, truth: dict) -> bool:
    """A merge named a merge of exactly its parents; any other model its kind and parent."""
    names = sorted(Path(p).name for p in node.parents)
    return node.kind == truth["kind"] and names == sorted(truth["parents"])


def score(nodes: dict, truth: dict[str, dict], half: int | None) -> tuple[int, int]:
    wanted = [m for m, t in truth.items() if half is None or t["half"] == half]
    return sum(right(nodes[m], truth[m]) for m in wanted), len(wanted)


def wilson(k: int, n: int) -> str:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(method="wilson") if n else None
    return f"{k}/{n} [{ci.low:.2f}, {ci.high:.2f}]" if ci else "0/0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="zoo folder (created if missing)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    import modelvec
    from modelvec.analyse.tree.rule import TreeRule
    from modelvec.report.tree import model_tree

    base, truth = build(args.out)
    store = args.out / "s.duckdb"
    if not store.exists():
        result = modelvec.embed(base, [args.out / m for m in truth], store=store, load=False)
        assert result.failed == {}, result.failed
    trees = {}
    for share in (1.0, *GRID):
        found = model_tree(base, store=store, rule=TreeRule(dropped_share=share))
        trees[share] = {Path(n.model).name: n for n in found.nodes}
    selection = {share: score(trees[share], truth, 0)[0] for share in GRID}
    top = [s for s in GRID if selection[s] == max(selection.values())]
    chosen = top[len(top) // 2]  # ties: the middle of the best range, the farthest from both its edges
    print(f"selection half, models right by dropped_share: {selection}; chosen {chosen}")
    lines = ["| | before (entry fit off) | after (dropped_share " + f"{chosen}) |", "|---|---|---|"]
    for label, half in (("selection half", 0), ("report half", 1)):
        lines.append(f"| {label}: every model | {wilson(*score(trees[1.0], truth, half))} | "
                     f"{wilson(*score(trees[chosen], truth, half))} |")  # fmt: skip
    for label, keep in (
        *((f"DARE-TIES d={d}", lambda t, d=d: t.get("density") == d and t.get("method") == "dare") for d in DENSITIES),
        *((f"DARE-TIES {dt}", lambda t, dt=dt: t.get("dtype") == dt and t.get("method") == "dare") for dt in DTYPES),
        ("TIES, linear, task arithmetic", lambda t: t["kind"] == "merge" and t["method"] != "dare"),
        ("fine-tunes, sibling, child", lambda t: t["kind"] == "fine-tune"),
    ):
        sub = {m: t for m, t in truth.items() if keep(t) and t["half"] == 1}
        lines.append(f"| report half: {label} | {wilson(*score(trees[1.0], sub, None))} | "
                     f"{wilson(*score(trees[chosen], sub, None))} |")  # fmt: skip
    print("\n".join(lines))
    for share, label in ((1.0, "before"), (chosen, "after")):
        merges = [m for m, t in truth.items() if t["kind"] == "merge" and t["half"] == 1]
        told = sum(trees[share][m].method == truth[m]["method"] for m in merges if right(trees[share][m], truth[m]))
        print(f"report half, merges with their parents and method {label}: {wilson(told, len(merges))}")
    wrong = {m: (n.kind, sorted(Path(p).name for p in n.parents), n.method) for m, n in trees[chosen].items()
             if m in truth and not right(n, truth[m])}  # fmt: skip
    methods = {m: trees[chosen][m].method for m, t in truth.items() if t["kind"] == "merge"}
    print("wrong after:", wrong)
    summary = {"selection": selection, "chosen": chosen, "table": lines, "wrong": wrong, "methods": methods}
    (args.out / "evidence_dare.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
