"""The model tree inferred from the weights, on the tree evidence zoos: parent and kind accuracy per kind.

    python demo/evidence_tree.py [--zoos encoder,decoder] [--choose | --choose-trimmed]

The zoos are ``demo/build_tree_zoo.py``'s (``.cache/tree-encoder``, ``.cache/tree-decoder``): direct fine-tunes and
adapters, chains three deep, adapters on fine-tunes, merges of two and three models, int8 and 4-bit round trips,
siblings of one dataset and unrelated weights, each with its true parent and kind and a half (selection, report).
Every member is embedded with the defaults (an adapter on a fine-tune on its parent, as ``embed`` does for a
local adapter naming its parent's folder); the tree is inferred from the stored traces alone, without what cards
declare. ``--choose`` searches the rule's thresholds on the selection half (both zoos together) and prints the
choice (``--choose-trimmed``: the trimmed merges' two alone); the report half is scored with the defaults of
:class:`modelvec.analyse.tree.rule.TreeRule`. Writes ``.cache/evidence-out/tree.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

from scipy.stats import binomtest

from modelvec import DeltaEmbedder, embed
from modelvec.analyse.tree import Tree
from modelvec.analyse.tree.lineage import infer_tree
from modelvec.analyse.tree.rule import TreeRule
from modelvec.report.tree import STATISTICS
from modelvec.represent import Representation
from modelvec.store import Store

ZOOS = {
    "encoder": ".cache/tree-encoder",
    "encoder-long": ".cache/tree-encoder-long",  # full fine-tunes at 10x the learning rate: a long fine-tune's size
    "decoder": ".cache/tree-decoder",
    "decoder-long": ".cache/tree-decoder-long",  # full fine-tunes at 10x the learning rate: deltas beyond bf16's step
}


def traces_of(folder: Path, representation: Representation, force: bool = False) -> tuple[dict, dict]:
    """The zoo's truth and its stored traces (embedded here first, cached in the zoo's store; ``force``: embedded
    again, after a change of the code that the key does not name)."""
    truth = json.loads((folder / "tree.json").read_text())
    store = folder.with_suffix(".duckdb")
    paths = [m["path"] for m in truth["models"]]
    result = embed(truth["base"], paths, store=store, load=False, representation=representation, force=force)
    if result.failed:
        print(f"{folder.name}: failed {result.failed}")
    with Store(store, read_only=True) as db:
        base = db.con.execute("SELECT base FROM vectors LIMIT 1").fetchone()[0]
        traces = db.reads.traces(base, representation.key())
        adapters = set(db.con.execute("SELECT model FROM vectors WHERE adapter").df()["model"])
        quantized = set(db.con.execute("SELECT model FROM vectors WHERE quantized IS NOT NULL").df()["model"])
    return truth, {
        "traces": traces.frame,
        "sketches": traces.sketches,
        "adapters": adapters,
        "quantized": quantized,
        "read": read_share(truth["base"], representation),
    }


def read_share(base: str, representation: Representation) -> float:
    """The share of the base's weight files' bytes that the representation (so the trace) reads of a model."""
    embedder = DeltaEmbedder(representation).fit(base)
    ck = embedder.base_
    read = sum(
        p.n_selected * p.n_cols * ck.get_stored(p.tensor, whole=False).element_size() for p in embedder.plans_.values()
    )
    files = sum(f.stat().st_size for f in Path(base).glob("*.safetensors"))
    return read / files


def infer(data: dict, rule: TreeRule, truth: dict | None = None) -> Tree:
    """The tree from the traces alone, or (``truth``) with what the cards declare (a merge's named parents are
    fitted first, and every card is checked)."""
    traces = data["traces"]
    levels = [None if v != v else float(v) for v in traces["levels"]]
    adapters = {
        m: (p if isinstance(p, str) else None)
        for m, p in zip(traces["model"], traces["parent"])
        if m in data["adapters"]
    }
    sketches = data["sketches"]
    return infer_tree(
        "base",
        list(traces["model"]),
        sketches,
        float(traces["scale"].iloc[0]),
        levels,
        adapters=adapters,
        rule=rule,
        declared=declared_of(truth) if truth is not None else None,
        statistics={name: list(traces[name]) for name in STATISTICS},
        quantized=data["quantized"],
    )


def declared_of(truth: dict) -> dict[str, tuple[str | None, list[str]]]:
    """What each member's card declares, its parents named as the store names them (paths; the base: "base")."""
    path = {m["model"]: m["path"] for m in truth["models"]}
    return {
        m["path"]: (m["declared"]["relation"], [path.get(p, p) for p in m["declared"]["parents"]])
        for m in truth["models"]
    }


def flags(truth: dict, tree: Tree) -> str:
    """Which declared edges the weights contradict, against the two the zoo declares wrong."""
    wrong = {m["path"] for m in truth["models"] if m.get("declared_wrong")}
    flagged = {n.model for n in tree.nodes if not n.agrees}
    name = {m["path"]: m["model"] for m in truth["models"]}
    return (
        f"cards the weights contradict: {len(flagged & wrong)} of the {len(wrong)} declared wrong flagged "
        f"({', '.join(sorted(name[m] for m in flagged & wrong)) or 'none'}); "
        f"{len(flagged - wrong)} of the {len(name) - len(wrong)} declared right flagged "
        f"({', '.join(sorted(name[m] for m in flagged - wrong)) or 'none'})"
    )


def outcomes(truth: dict, tree: Tree, half: str | None) -> list[dict]:
    """Per model of the half: its kind, whether its parent(s) and kind were found."""
    by_path = {m["path"]: m for m in truth["models"]}
    name_of = {m["path"]: m["model"] for m in truth["models"]}
    rows = []
    for node in tree.nodes:
        true = by_path[node.model]
        if half is not None and true["half"] != half:
            continue
        parents = {name_of.get(p, p) for p in node.parents}
        if true["kind"] == "merge":
            right_parent = parents == set(true["parents"])
        elif true["kind"] == "unrelated":
            right_parent = node.parent is None
        else:
            right_parent = name_of.get(node.parent, node.parent) == true["parent"]
        said = node.method if true["kind"] == "merge" and node.kind == "merge" else node.kind
        rows.append(
            {
                "kind": f"{true['kind']} ({true['method']})" if true.get("method") else true["kind"],
                "parent": right_parent,
                "kind_ok": node.kind == true["kind"],
                "method": true.get("method"),
                "said": said,
                "model": true["model"],
            }
        )
    return rows


#: mergekit's method as the tree names it (what the weights can tell).
TOLD = {
    "linear": "linear",
    "task_arithmetic": "task_arithmetic",
    "ties": "ties",
    "dare_ties": "dare",
    "dare_linear": "dare",
    "slerp": "slerp",
}


def methods(rows: list[dict]) -> str:
    """How often a found merge's method is named right, per mergekit method."""
    out = []
    for method in sorted({r["method"] for r in rows if r["kind"].startswith("merge")}):
        sel = [r for r in rows if r["kind"].startswith("merge") and r["method"] == method]
        right = sum(r["said"] == TOLD.get(method, method) for r in sel)
        untold = sum(r["said"] is None for r in sel)
        out.append(f"{method} {right}/{len(sel)}" + (f" ({untold} found, method not told)" if untold else ""))
    return "merge methods named right: " + (", ".join(out) or "none")


def dare(truth: dict, rows: list[dict]) -> str:
    """Each DARE merge of the half (density, weights, saved dtype): merge with exactly its parents, or what it was
    named."""
    by_name = {m["model"]: m for m in truth["models"]}
    out = []
    for r in rows:
        m = by_name[r["model"]]
        if m["kind"] != "merge" or not str(m["method"]).startswith("dare"):
            continue
        how = f"d{m.get('density')} {'/'.join(f'{w:g}' for w in m['weights'])} {m.get('dtype') or 'bfloat16'}"
        out.append(f"{m['method']} {how}: {'found' if r['parent'] and r['kind_ok'] else r['said']}")
    return "DARE merges: " + ("; ".join(out) or "none")


def summary(rows: list[dict]) -> list[tuple[str, int, str, str]]:
    table = []
    for kind in [*sorted({r["kind"] for r in rows}), "all"]:
        sel = [r for r in rows if kind in ("all", r["kind"])]
        cells = []
        for field in ("parent", "kind_ok"):
            k = sum(r[field] for r in sel)
            ci = binomtest(k, len(sel)).proportion_ci(method="wilson")
            cells.append(f"{k / len(sel):.2f} [{ci.low:.2f}, {ci.high:.2f}]")
        table.append((kind, len(sel), *cells))
    return table


def _score(zoos: dict[str, tuple[dict, dict]], rule: TreeRule) -> float:
    """Parents, kinds and merge methods right on the selection half of every zoo (a share)."""
    rows = [r for truth, data in zoos.values() for r in outcomes(truth, infer(data, rule), "selection")]
    merges = [r for r in rows if r["kind"].startswith("merge")]
    right = sum(r["parent"] + r["kind_ok"] for r in rows) + sum(r["said"] == TOLD.get(r["method"]) for r in merges)
    return right / (2 * len(rows) + len(merges))


def choose(zoos: dict[str, tuple[dict, dict]]) -> TreeRule:
    """The thresholds that get most parents, kinds and merge methods right on the selection half of every zoo: the
    size, levels and merge thresholds first, then the merge methods' (trimmed zeros, ratio and gain, TIES against
    DARE, SLERP's excess) given them; ties keep the earlier (the default's order first)."""
    best, best_score = TreeRule(), _score(zoos, TreeRule())
    grid = itertools.product((0.5, 0.7, 0.9), (0.6, 0.75, 0.9), (0.2, 0.3, 0.5), ((0.7, 1.6), (0.8, 1.6), (0.9, 2.0)))
    for size, levels, ratio, beyond in grid:
        rule = replace(best, unrelated_size=size, quantized_levels=levels, merge_ratio=ratio, beyond=beyond)
        if (score := _score(zoos, rule)) > best_score:
            best, best_score = rule, score
    methods = itertools.product(
        (0.04, 0.08, 0.06, 0.02),
        (0.9, 0.8, 0.95),
        (0.15, 1.0, 0.4, 0.3, 0.2, 0.1),
        (0.75, 0.6, 0.9),
        (1e-4, 1e-5, 1e-3),
    )
    for zeros, trimmed, gain, ties, excess in methods:
        rule = replace(
            best, trimmed_zeros=zeros, trimmed_ratio=trimmed, trimmed_gain=gain, ties_ratio=ties, slerp_excess=excess
        )
        if (score := _score(zoos, rule)) > best_score:
            best, best_score = rule, score
    print(f"chosen on the selection half ({best_score:.3f}; the default {_score(zoos, TreeRule()):.3f}): {best}")
    return best


def choose_trimmed(zoos: dict[str, tuple[dict, dict]]) -> TreeRule:
    """The trimmed merges' thresholds alone (``trimmed_zeros``, ``trimmed_gain``; 1.0: no gain route) that get most
    right on the selection half of every zoo, every other threshold the default's; each scored, ties keeping the
    stricter (the earlier)."""
    best, best_score = TreeRule(), -1.0
    for zeros, gain in itertools.product((0.04, 0.03, 0.02), (1.0, 0.4, 0.3, 0.2, 0.15, 0.1)):  # strict first
        rule = replace(TreeRule(), trimmed_zeros=zeros, trimmed_gain=gain)
        score = _score(zoos, rule)
        print(f"trimmed_zeros {zeros}, trimmed_gain {gain}: selection {score:.3f}")
        if score > best_score:
            best, best_score = rule, score
    print(f"chosen on the selection half ({best_score:.3f}): {best}")
    return best


def over_seeds(names: list[str], rows: str, auto_rows: int | str, seeds: list[int], force: bool) -> list[str]:
    """Parents and kinds right per half and seed (which rows are read), with their means: what a budget does to
    the tree, beside what the seed alone does (the default rule, the weights alone)."""
    lines = [f"rows {rows}, auto rows {auto_rows}: parents / kinds right per half, seeds {seeds}", ""]
    lines += [
        "| zoo | half | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
        "|---|---|" + "---|" * (len(seeds) + 1),
    ]
    for name in names:
        per_seed = []
        for seed in seeds:
            representation = Representation(
                rows=rows if rows == "auto" else float(rows), auto_rows=auto_rows, seed=seed
            )
            truth, data = traces_of(Path(ZOOS[name]), representation, force)
            tree = infer(data, TreeRule())
            per_seed.append({half: outcomes(truth, tree, half) for half in ("selection", "report")})
        for half in ("selection", "report"):
            cells = [
                (sum(r["parent"] for r in s[half]), sum(r["kind_ok"] for r in s[half]), len(s[half])) for s in per_seed
            ]
            mean_p = sum(c[0] / c[2] for c in cells) / len(cells)
            mean_k = sum(c[1] / c[2] for c in cells) / len(cells)
            shown = " | ".join(f"{p}/{n}, {k}/{n}" for p, k, n in cells)
            lines.append(f"| {name} | {half} | {shown} | {mean_p:.3f}, {mean_k:.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoos", default="encoder,decoder")
    parser.add_argument("--choose", action="store_true")
    parser.add_argument("--choose-trimmed", action="store_true", help="choose the trimmed merges' thresholds alone")
    parser.add_argument("--rows", default="auto", help="the representation's share of rows (auto: the default)")
    parser.add_argument(
        "--auto-rows", default=str(Representation.auto_rows), help="rows of each large matrix read (share: 5 %%)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the representation's seed (which rows are read)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds: parents and kinds per seed, and means")
    parser.add_argument("--force", action="store_true", help="embed again what the store holds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    auto_rows = args.auto_rows if args.auto_rows == "share" else int(args.auto_rows)
    if args.seeds:
        names = [z for z in args.zoos.split(",") if (Path(ZOOS[z]) / "tree.json").exists()]
        seeds = [int(x) for x in args.seeds.split(",")]
        print("\n".join(over_seeds(names, args.rows, auto_rows, seeds, args.force)))
        return
    representation = Representation(
        rows=args.rows if args.rows == "auto" else float(args.rows), auto_rows=auto_rows, seed=args.seed
    )
    zoos = {
        z: traces_of(Path(ZOOS[z]), representation, args.force)
        for z in args.zoos.split(",")
        if (Path(ZOOS[z]) / "tree.json").exists()
    }
    rule = choose(zoos) if args.choose else choose_trimmed(zoos) if args.choose_trimmed else TreeRule()
    lines = [f"rule: {rule}", f"representation: {representation.key()}", ""]
    for name, (truth, data) in zoos.items():
        tree, carded = infer(data, rule), infer(data, rule, truth)  # the weights alone; with the cards: their flags
        lines += [flags(truth, carded), ""]
        lines += [f"{name}: the traces read {data['read']:.1%} of the weight files' bytes", ""]
        for half in ("selection", "report"):
            rows = outcomes(truth, tree, half)
            lines += [
                f"### {name}, {half} half",
                "",
                "| kind | models | parent right | kind right |",
                "|---|---|---|---|",
            ]
            lines += [f"| {k} | {n} | {p} | {q} |" for k, n, p, q in summary(rows)]
            lines += ["", methods(rows), "", dare(truth, rows)]
            wrong = [r for r in rows if not (r["parent"] and r["kind_ok"])]
            lines += ["", f"wrong: {wrong}" if wrong else "wrong: none", ""]
    out = args.out or Path(f".cache/evidence-out/tree-rows-{args.rows}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
