"""Re-saves and copies among real fine-tunes: every one found, with its original, and no fine-tune taken for one.

    python demo/evidence_copies.py [--zoo .cache/zoo] [--out .cache/evidence-copies]

On the demo's zoo (real fine-tunes of all-MiniLM-L6-v2, float32, ``make demo`` builds it): each fine-tune re-saved in
float16 and in bfloat16 (its weights loaded and saved again in that dtype, a day later than the original, as
re-uploads are), a byte copy of every fifth one (``cp -p``: the same time), and the base re-saved in float16 and
bfloat16. All are embedded into one store with the fine-tunes; the population's copies (the rule every report reads,
:mod:`modelvec.analyse.tree.copies`) are compared with the truth: each re-save and copy named a copy of its own original,
and no fine-tune named a copy. Also each re-save's distance to its original against the rounding it may leave
(``rule.rounding`` x its expected size), and the nearest two fine-tunes' distance against the same: the margin on
each side. The rule's thresholds were chosen before (``rounding`` on the tree zoos' selection halves; ``resaved`` as
the exact check it is); nothing here is chosen, so the whole zoo is the report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import binomtest

from modelvec import embed
from modelvec.analyse.tree.rule import TreeRule
from modelvec.store import Population, Store


def resave(src: Path, dst: Path, dtype: torch.dtype, *, card: bool = False) -> Path:
    """``src`` loaded and saved again in ``dtype`` (its config and card kept; ``card``: a card naming ``src``, as a
    quantization of it), a day after it."""
    if not (dst / "model.safetensors").exists():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"), dirs_exist_ok=True)
        state = load_file(str(src / "model.safetensors"))
        save_file({k: v.to(dtype).contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    if card:
        (dst / "README.md").write_text(f"---\nbase_model: {src}\nbase_model_relation: quantized\n---\n")
    when = (src / "model.safetensors").stat().st_mtime + 86400
    os.utime(dst / "model.safetensors", (when, when))
    return dst


def interval(hits: int, n: int) -> str:
    ci = binomtest(hits, n).proportion_ci(method="wilson") if n else None
    return f"{hits}/{n}" + (f" [{ci.low:.2f}, {ci.high:.2f}]" if ci else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, default=Path(".cache/zoo"))
    parser.add_argument("--out", type=Path, default=Path(".cache/evidence-copies"))
    args = parser.parse_args()
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    base, models = Path(zoo["base"]).resolve(), [Path(m["path"]).resolve() for m in zoo["models"]]
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    truth: dict[str, str] = {}  # copy -> its original
    for k, m in enumerate(models):  # fp16 re-saves; bf16 ones, half with a card naming the fine-tune (the issue's)
        truth[str(resave(m, args.out / f"{m.name}-fp16", torch.float16))] = str(m)
        named = k % 2 == 0
        truth[str(resave(m, args.out / f"{m.name}-{'bf16' if named else 'nocard'}", torch.bfloat16, card=named))] = str(
            m
        )
    for m in models[::5]:
        copy = args.out / f"{m.name}-copy"
        if not copy.exists():
            shutil.copytree(m, copy)  # copy2: the same times, a mirror
        truth[str(copy)] = str(m)
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        truth[str(resave(base, args.out / f"base-{name}", dtype))] = str(base)
    store = args.out / "s.duckdb"
    result = embed(base, [*models, *map(Path, truth)], store=store, load=False)
    assert not result.failed, result.failed
    rule = TreeRule()
    with Store(store, read_only=True) as db:
        pop = Population(db, base)
        traces = db.reads.traces(pop.name, pop.representation.key(), pop.base_hash)
    found = {m: c.original for m, c in pop.copies.items()}
    for what, kind in (
        ("fp16 re-saves, their card the fine-tune's", "-fp16"),
        ("bf16 re-saves, a card naming it", "-bf16"),
        ("bf16 re-saves, the fine-tune's own card (a limit: these deltas are within bf16's rounding)", "-nocard"),
        ("byte copies", "-copy"),
    ):
        mine = {c: o for c, o in truth.items() if c.endswith(kind) and "/base-" not in c}
        right = sum(found.get(c) == o for c, o in mine.items())
        print(f"{what}: copies of their own original {interval(right, len(mine))}")
    base_ones = {c: o for c, o in truth.items() if "/base-" in c}
    print(
        f"the base's re-saves: copies of the base {interval(sum(found.get(c) == pop.name for c in base_ones), len(base_ones))}"
    )
    wrong = [m for m in map(str, models) if m in found]
    print(f"fine-tunes named copies (wrongly): {interval(len(wrong), len(models))} {wrong}")
    at = {m: i for i, m in enumerate(traces.frame["model"])}
    t, frame = traces.sketches.astype(np.float64), traces.frame
    allowed = lambda m: rule.rounding * float(frame["rounding"].iloc[at[m]]) * float(frame["scale"].iloc[at[m]])
    ratios = {  # of the fine-tunes' re-saves (the base's: its distance is its norm)
        kind: [
            float(np.linalg.norm(t[at[c]] - (t[at[o]] if o in at else 0.0))) / allowed(c)
            for c, o in truth.items()
            if c.endswith(kind)
        ]
        for kind in ("fp16", "bf16", "nocard")
    }
    for kind, values in ratios.items():
        print(f"{kind} re-saves: distance / what a re-save may leave, {min(values):.2f}-{max(values):.2f}")
    fine = [at[str(m)] for m in models]
    nearest = min(float(np.linalg.norm(t[i] - t[j])) for i in fine for j in fine if i < j)
    print(
        f"nearest two fine-tunes: {nearest / max(allowed(c) for c in truth if 'bf16' in c):.1f}x what a bf16 re-save may leave"
    )


if __name__ == "__main__":
    main()
