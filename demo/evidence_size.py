"""The vector's size budget on both evidence zoos: today's default (no limit) against the same representation held
to at most D floats, for each D asked, four seeds each, scored on the selection half and the report half.

    python demo/evidence_size.py [--sizes 100000,65536,32768,16384] [--zoos encoder,decoder]

The zoos are ``make evidence``'s (``demo/build_evidence.py --unique-seeds`` and ``demo/build_llm_evidence.py``), and
their selection halves the Makefile's (``SELECTION``, ``LLM_SELECTION``): a size is chosen on the selection half
alone, then reported on the other (docs/evidence.md). Vectors are cached in the zoos' stores, as ``make evidence``
caches them. Writes ``.cache/evidence-out/size-<zoo>.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ZOOS = {
    "encoder": (
        ".cache/evidence-unique",
        ".cache/evidence-unique.duckdb",
        "tweet-sentiment,tweet-simcse,chat-qa,chat-topic",
    ),
    "decoder": (".cache/llm-evidence", ".cache/llm-evidence.duckdb", "chat-clm,chat-qa,tweet-sentiment"),
    "demo": (".cache/zoo", ".cache/demo-size.duckdb", "bbc-news-topic,tweet-simcse"),  # make demo's 20 full fine-tunes
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,65536,32768,16384")
    parser.add_argument("--zoos", default="encoder,decoder")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--out", type=Path, default=Path(".cache/evidence-out"))
    args = parser.parse_args()
    from modelvec import Representation
    from modelvec.studies import evaluate

    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.zoos.split(","):
        folder, store, selection = ZOOS[name]
        zoo = json.loads((Path(folder) / "zoo.json").read_text())
        unbounded = Representation(size="none")  # the default before the size budget: what the budget is held to
        variants = {unbounded.label(): unbounded}
        for size in (int(x) for x in args.sizes.split(",")):
            bounded = Representation(size=size)
            variants[bounded.label()] = bounded
        table = evaluate(
            zoo["base"],
            [m["path"] for m in zoo["models"]],
            variants=variants,
            seeds=tuple(int(s) for s in args.seeds.split(",")),
            store=store,
            selection=selection.split(","),
            mutual_proximity=True,
            progress=lambda line: print(line, flush=True),
        )
        columns = [
            c
            for c in (
                "method",
                "half",
                "dim",
                "knn_score",
                "knn_lo",
                "knn_hi",
                "knn_spread",
                "knn_full",
                "knn_full_spread",
                "knn_adapters",
                "adapter_to_full",
                "ref_corr",
            )
            if c in table.columns
        ]
        text = table[columns].to_markdown(index=False, floatfmt=".3f")
        (args.out / f"size-{name}.md").write_text(text + "\n")
        print(text, flush=True)


if __name__ == "__main__":
    main()
