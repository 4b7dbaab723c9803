"""Publish the demo zoo on a local Hub, shaped like the real Hub's fine-tunes, so the demo walks the
same path a user with internet walks: discover -> embed -> cluster through huggingface_hub.

The base goes up as sentence-transformers/all-MiniLM-L6-v2. Each fine-tune gets one of the card
shapes found in the wild (rotating over the seeds of a dataset):

  0, 1  card declares base_model and datasets          -> found by its base_model tag, labels "card"
  2     card lists datasets but no base_model          -> found by name search + config match
  3     Trainer-style card: base_model and model-index  -> labels "model-index"
  4     no card at all                                  -> name search; label guessed from the name

Authors are uneven on purpose: one uploader owns every run of one dataset (the original study's
"798 of 829 mnli models from one uploader"), so the report's same-author kNN score has something
to show. Two distractors are found by name and rejected: another depth, and TensorFlow only.
Re-running republishes only models whose weights changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from modelvec.testing.localhub import LocalHub

BASE_ID = "sentence-transformers/all-MiniLM-L6-v2"
AUTHORS = ("alice-nlp", "bob-ml", "carol-ai", "dave-lab")
PROLIFIC = {"bbc-news-topic": "newsroom-lab"}  # one uploader owns a whole dataset
SKIP = {"README.md"}


def front_matter_and_body(readme: Path) -> tuple[dict, str]:
    text = readme.read_text() if readme.exists() else ""
    if text.startswith("---"):
        end = text.find("\n---", 3)
        return yaml.safe_load(text[3:end]) or {}, text[end + 4 :].lstrip("\n")
    return {}, text


def card(meta: dict | None, body: str) -> bytes:
    if not meta:
        return body.encode()
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + body).encode()


def shaped(model: dict, index: int, order: int) -> tuple[str, dict, bytes]:
    """(repo id, publish metadata, README bytes) for the ``index``-th seed of a dataset."""
    folder = Path(model["path"])
    meta, body = front_matter_and_body(folder / "README.md")
    dataset = model["dataset"]
    author = PROLIFIC.get(dataset, AUTHORS[(order + index) % len(AUTHORS)])
    variant = index % 5
    publish = {
        "author": author,
        "downloads": 50 + (index * 37 + order * 101) % 900,
        "likes": index % 3,
        "pipeline_tag": meta.get("pipeline_tag"),
    }
    if variant in (0, 1):
        return f"{author}/minilm-{dataset}-s{index}", publish, card({**meta, "license": "apache-2.0"}, body)
    if variant == 2:
        trimmed = {k: v for k, v in meta.items() if k != "base_model"}
        return f"{author}/all-MiniLM-L6-v2-{dataset}-s{index}", publish, card(trimmed, body)
    if variant == 3:
        trainer = {
            "license": "apache-2.0",
            "base_model": meta.get("base_model", BASE_ID),
            "tags": ["generated_from_trainer"],
            "model-index": [
                {
                    "name": folder.name,
                    "results": [
                        {
                            "task": {"type": model.get("task", "text-classification")},
                            "dataset": {"name": dataset, "type": dataset},
                            "metrics": [{"type": "loss", "value": 0.0, "name": "Loss"}],
                        }
                    ],
                }
            ],
        }
        return f"{author}/minilm-{dataset}-trainer-s{index}", publish, card(trainer, body)
    return f"{author}/all-MiniLM-L6-v2-{dataset}-s{index}", publish, card(None, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, required=True, help="folder with zoo.json (demo/build_zoo.py)")
    parser.add_argument("--hub", type=Path, required=True, help="the local Hub's root folder")
    args = parser.parse_args()
    zoo = json.loads((args.zoo / "zoo.json").read_text())
    hub = LocalHub(args.hub)
    marker = args.hub / "published.json"
    done = json.loads(marker.read_text()) if marker.exists() else {}

    def publish(repo: str, files: dict, stamp_of: Path, **meta) -> None:
        stat = stamp_of.stat()
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        if done.get(repo) == stamp and repo in hub.repos():
            return
        hub.publish(repo, files, message="upload", link=True, **meta)
        done[repo] = stamp
        marker.write_text(json.dumps(done, indent=1))

    base = Path(zoo["base"])
    base_files = {p.name: p for p in base.iterdir() if p.is_file() and p.name not in SKIP}
    publish(
        BASE_ID,
        {
            **base_files,
            "README.md": card(
                {
                    "license": "apache-2.0",
                    "library_name": "sentence-transformers",
                    "pipeline_tag": "sentence-similarity",
                },
                "# all-MiniLM-L6-v2\n",
            ),
        },
        base / "model.safetensors",
        author="sentence-transformers",
        downloads=90_000_000,
    )
    datasets = sorted({m["dataset"] for m in zoo["models"]})
    seen: dict[str, int] = {}
    for model in zoo["models"]:
        index = seen.get(model["dataset"], 0)
        seen[model["dataset"]] = index + 1
        repo, meta, readme = shaped(model, index, datasets.index(model["dataset"]))
        folder = Path(model["path"])
        files = {p.name: p for p in folder.iterdir() if p.is_file() and p.name not in SKIP}
        publish(repo, {**files, "README.md": readme}, folder / "model.safetensors", **meta)
    # distractors found by the name search and rejected: another depth, and TensorFlow weights only
    config = json.loads((base / "config.json").read_text())
    shallow = {**config, "num_hidden_layers": 3}
    publish(
        "pruning-lab/all-MiniLM-L6-v2-pruned-3-layers",
        {"config.json": json.dumps(shallow).encode(), "model.safetensors": base / "model.safetensors"},
        base / "config.json",
        downloads=40,
    )
    publish(
        "keras-user/all-MiniLM-L6-v2-keras",
        {"config.json": json.dumps(config).encode(), "tf_model.h5": b"\x89HDF\r\n\x1a\n" + bytes(64)},
        base / "config.json",
        downloads=30,
    )
    print(f"local Hub at {args.hub}: {len(hub.repos())} repositories")


if __name__ == "__main__":
    main()
