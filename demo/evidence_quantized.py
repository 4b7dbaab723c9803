"""Quantizations on the Hub placed by their own bytes, on a tree evidence zoo: how many land under the model they round.

    python demo/evidence_quantized.py [--zoo .cache/tree-encoder] [--out .cache/evidence-out]

The zoo is ``demo/build_tree_zoo.py``'s (real fine-tunes of the packaged base, chains, mergekit merges; ``tree.json``
their truth). Each of its full models and the base is quantized the way the Hub's quantizers write files: GGUF
(``Q8_0``, ``Q5_0``, ``Q4_0`` by the gguf package's own quantizers, written as llama.cpp's converter writes them;
some repositories hold two types, as the Hub's often do), GPTQ and AWQ 4-bit (group 128) and bitsandbytes nf4
(double quantization) and int8, packed as their quantizers pack them (:mod:`modelvec.testing.quantized`). Each quantization's card names its true parent, a sibling (a lie), or
the base alone (a level skipped), in turn. Everything is published on a local Hub that serves byte ranges and
counts what it sends, embedded by Hub id with the defaults, and the tree is inferred.

Scored per quantization: placed under the model it rounds (kind ``quantization``), its card's agreement flagged
right (a lie ``agrees: false``, the truth ``agrees: true``); with Clopper-Pearson 95 % intervals, on each half (the
zoo's halves: the parent's). Nothing here is tuned: the rule's defaults were fixed before this zoo was scored; the
selection half is where a change would be chosen. Bytes: the share of each quantized file the Hub sent.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from modelvec import embed
from modelvec.hub.client import HubSettings
from modelvec.report.tree import model_tree
from modelvec.testing.gguf import Q, write_gguf
from modelvec.testing.localhub import LocalHub

#: Each quantization made: a name, the files it writes into a folder from a float model's folder.
Maker = Callable[[Path, Path, str], dict[str, Path]]


def gguf_maker(*types: Any) -> Maker:
    def make(parent: Path, folder: Path, arch: str) -> dict[str, Path]:
        out = {}
        for qtype in types:
            path = write_gguf(parent, folder / f"model-{qtype.name}.gguf", arch, qtype)
            out[path.name] = path
        return out

    return make


def makers(only: str | None = None) -> dict[str, Maker]:
    """The quantizations made of each model: GGUF (the gguf package's quantizers), GPTQ, AWQ and bitsandbytes
    (:func:`modelvec.testing.quantized.write_quantized`, packed as auto-gptq, autoawq and bitsandbytes pack);
    ``only``: those whose name starts so."""
    from modelvec.testing.quantized import write_quantized

    out: dict[str, Maker] = {
        "gguf-Q8_0": gguf_maker(Q.Q8_0),
        "gguf-Q4_0": gguf_maker(Q.Q4_0),
        "gguf-Q5_0-and-Q4_0": gguf_maker(Q.Q5_0, Q.Q4_0),
        "gptq-4bit": _folder_maker(lambda src, dst: write_quantized(src, dst, "gptq", bits=4, group=128)),
        "awq-4bit": _folder_maker(lambda src, dst: write_quantized(src, dst, "awq", group=128)),
        "bnb-nf4": _folder_maker(lambda src, dst: write_quantized(src, dst, "nf4", nested=True)),
        "bnb-int8": _folder_maker(lambda src, dst: write_quantized(src, dst, "int8")),
    }
    return {k: v for k, v in out.items() if only is None or k.startswith(tuple(only.split(",")))}


def _folder_maker(write: Callable[[Path, Path], Any]) -> Maker:
    def make(parent: Path, folder: Path, arch: str) -> dict[str, Path]:
        write(parent, folder)
        return {p.name: p for p in folder.iterdir() if p.is_file() and p.name != "README.md"}  # its own card below

    return make


def card(parent: str) -> bytes:
    return f"---\nbase_model: {parent}\nbase_model_relation: quantized\n---\n".encode()


def build(zoo: Path, work: Path, only: str | None) -> tuple[LocalHub, list[dict], list[str]]:
    """The zoo's full models and their quantizations on a local Hub; the quantizations' truth, the models to embed."""
    truth = json.loads((zoo / "tree.json").read_text())
    arch = "bert" if truth["base_kind"] == "encoder" else "llama"
    full = [m for m in truth["models"] if m["kind"] in ("fine-tune", "merge") and Path(m["path"]).is_dir()]
    hub = LocalHub(work / "hub")
    hub.publish("zoo/base", truth["base"], link=True)
    for m in full:
        hub.publish(f"zoo/{m['model']}", m["path"], link=True)
    parents = [{"model": "base", "path": truth["base"], "half": "selection"}, *full]
    siblings = [m["model"] for m in full if m["kind"] == "fine-tune"]
    made: list[dict] = []
    kinds = makers(only)
    for i, parent in enumerate(parents):
        for j, (kind, make) in enumerate(kinds.items()):
            folder = work / "q" / f"{parent['model']}-{kind}"
            folder.mkdir(parents=True, exist_ok=True)
            files = make(Path(parent["path"]), folder, arch)
            said = ("truth", "sibling", "base")[(i + j) % 3]
            named = {
                "truth": parent["model"],
                "sibling": next(s for s in [*siblings[i % len(siblings) :], *siblings] if s != parent["model"]),
                "base": "base",
            }[said]
            repo = f"zoo/{parent['model']}-{kind}"
            hub.publish(repo, {**files, "README.md": card(f"zoo/{named}")}, link=True)
            made.append(
                {
                    "repo": repo,
                    "kind": kind,
                    "parent": f"zoo/{parent['model']}",
                    "card": said,
                    "half": parent.get("half", "report"),
                    "bytes": {n: p.stat().st_size for n, p in files.items()},
                }
            )
    return hub, made, ["zoo/" + m["model"] for m in full] + [q["repo"] for q in made]


def fetched(requests: list[dict], repo: str) -> dict[str, int]:
    """Bytes the Hub sent of each file of ``repo`` (ranges as asked; a whole GET as the file's size, -1)."""
    out: dict[str, int] = {}
    for r in requests:
        if r["method"] != "GET" or f"/{repo}/resolve/" not in r["path"]:
            continue
        name = r["path"].rsplit("/", 1)[-1]
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.get("range") or "")
        out[name] = out.get(name, 0) + (int(m.group(2)) - int(m.group(1)) + 1 if m else -(10**18))
    return out


def interval(k: int, n: int) -> str:
    if n == 0:
        return "-"
    ci = binomtest(k, n).proportion_ci(0.95)
    return f"{k}/{n} = {k / n:.3f} [{ci.low:.2f}, {ci.high:.2f}]"


def score(made: list[dict], nodes: dict[str, Any], requests: list[dict]) -> list[str]:
    lines = [
        "| half | kind | placed under what it rounds | card flagged right | max share of a file fetched | requests a repo |"
    ]
    lines.append("|---|---|---|---|---|---|")
    for half in ("selection", "report", "all"):
        for kind in [*sorted({q["kind"] for q in made}), "every kind"]:
            rows = [q for q in made if half in (q["half"], "all") and kind in (q["kind"], "every kind")]
            placed = [q for q in rows if _placed(nodes.get(q["repo"]), q)]
            flagged = [q for q in rows if _flag_right(nodes.get(q["repo"]), q)]
            shares = [
                got / q["bytes"][name]
                for q in rows
                for name, got in fetched(requests, q["repo"]).items()
                if name in q["bytes"] and got >= 0
            ]
            whole = any(got < 0 for q in rows for got in fetched(requests, q["repo"]).values())
            share = "a file whole" if whole else f"{max(shares):.1%}" if shares else "-"
            asked = [sum(1 for r in requests if f"/{q['repo']}/" in r["path"]) for q in rows]
            lines.append(
                f"| {half} | {kind} | {interval(len(placed), len(rows))} | {interval(len(flagged), len(rows))} | "
                f"{share} | {sum(asked) / max(1, len(asked)):.1f} |"
            )
    return lines


def _placed(node: Any, q: dict) -> bool:
    return node is not None and node.kind == "quantization" and node.parent == q["parent"]


def _flag_right(node: Any, q: dict) -> bool:
    if node is None:
        return False
    lying = q["card"] == "sibling" or (q["card"] == "base" and q["parent"] != "zoo/base")
    return node.agrees is not lying


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, default=Path(".cache/tree-encoder"))
    ap.add_argument("--out", type=Path, default=Path(".cache/evidence-out"))
    ap.add_argument("--only", default=None, help="the quantizations made: names' starts, comma-separated (gguf,gptq)")
    ap.add_argument("--name", default="quantized", help="the report's name (OUT/NAME.md) and work folder")
    args = ap.parse_args()
    work = args.out / f"{args.name}-hub"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    hub, made, models = build(args.zoo.resolve(), work, args.only)
    with hub.serve() as srv:
        settings = HubSettings(endpoint=srv.endpoint, cache_dir=str(work / "cache"), token=False, retries=1)
        result = embed("zoo/base", models, hub_settings=settings, store=work / "s.duckdb", load=False)
        requests = list(srv.requests)
    nodes = {n.model: n for n in model_tree("zoo/base", store=work / "s.duckdb").nodes}
    wrong = [
        f"- {q['repo']} (card: {q['card']}): {n.kind} of {n.parent} ({n.confidence:.2f}), agrees {n.agrees}"
        for q in made
        if not _placed(n := nodes.get(q["repo"]), q) or not _flag_right(n, q)
        if n is not None
    ]
    lines = [
        f"# Quantizations placed by their bytes ({args.zoo.name}: {len(made)} quantizations of "
        f"{len(models) - len(made)} models and the base)",
        "",
        *score(made, nodes, requests),
        "",
        f"Failed: {len(result.failed)}" + "".join(f"\n- {m}: {e}" for m, e in sorted(result.failed.items())),
        "",
        "Misplaced or misflagged:" + ("".join(f"\n{w}" for w in wrong) if wrong else " none"),
        "",
        f"({time.perf_counter() - t0:.0f} s)",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
