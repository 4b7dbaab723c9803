"""Discovery, download and embedding through the real huggingface_hub client against a local Hub.

The world: a tiny BERT published as google-bert/bert-base-uncased, and fine-tunes modelled on the
shapes real Hub repos have (no card at all, Trainer cards with model-index, .bin only, sharded,
gated, wrong family found by name, TensorFlow only, mismatched shapes, a flaky server, a file
truncated on the Hub and one truncated in transfer). Nothing of modelvec's is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import planted_finetune, tiny_bert_config
from modelvec.analyse.scores import Scoring
from modelvec.core.files import formats, weight_format
from modelvec.hub.cache import release, snapshot_folder
from modelvec.hub.client import HubSettings, transient, with_retries
from modelvec.hub.download import fetch
from modelvec.hub.ids import resolve_base
from modelvec.read import Checkpoint
from modelvec.read.matching import config_match
from modelvec.represent import DeltaEmbedder, Representation
from modelvec.run import discover, embed, embed_discovered
from modelvec.store import Store
from modelvec.testing.localhub import LocalHub

BASE = "google-bert/bert-base-uncased"
TOKEN = "hf_local_test_token"


def card(meta: dict | None, body: str = "# model\n") -> bytes:
    import yaml

    if meta is None:
        return body.encode()
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + body).encode()


def trainer_card(name: str, task_config: str, *, base: str | None = "bert-base-uncased", key: str = "args") -> dict:
    """A card as transformers' Trainer writes it (datasets: glue, model-index with the GLUE config)."""
    meta = {
        "license": "apache-2.0",
        "tags": ["generated_from_trainer"],
        "datasets": ["glue"],
        "metrics": ["accuracy"],
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"name": "Text Classification", "type": "text-classification"},
                        "dataset": {"name": "glue", "type": "glue", key: task_config},
                        "metrics": [{"name": "Accuracy", "type": "accuracy", "value": 0.91}],
                    }
                ],
            }
        ],
    }
    if base:
        meta["base_model"] = base
    return meta


def folder_files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file() and p.name != "README.md"}


def to_bin(folder: Path, out: Path) -> Path:
    """The same weights as a pytorch_model.bin (how 2020-era models were uploaded)."""
    out.mkdir(parents=True, exist_ok=True)
    torch.save(load_file(str(folder / "model.safetensors")), out / "pytorch_model.bin")
    (out / "config.json").write_text((folder / "config.json").read_text())
    return out


def to_sharded(folder: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(folder / "model.safetensors"))
    keys = sorted(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for i, part in enumerate(halves, 1):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(out / name))
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text((folder / "config.json").read_text())
    return out


@pytest.fixture(scope="module")
def world(tiny_bert, tmp_path_factory):
    """The local Hub's repos, and the local folders they were made from (for reference vectors)."""
    root = tmp_path_factory.mktemp("hub-world")
    src = root / "src"
    hub = LocalHub(root / "hub", tokens=[TOKEN], page_size=3)
    made: dict[str, Path] = {}

    def ft(name: str, seed: int) -> Path:
        made[name] = planted_finetune(tiny_bert, src / name.replace("/", "__"), seed=seed)
        return made[name]

    base_files = folder_files(tiny_bert)
    base_files["tokenizer.json"] = b"{}"
    base_files["tf_model.h5"] = b"not read"
    hub.publish(
        BASE,
        {**base_files, "README.md": card({"license": "apache-2.0", "datasets": ["bookcorpus", "wikipedia"]})},
        author="google-bert",
        downloads=10_000_000,
    )
    # 1. a 2020 upload: no card, .bin only, no base declared: found by name search + config
    hub.publish(
        "textattack/bert-base-uncased-SST-2",
        folder_files(to_bin(ft("textattack/bert-base-uncased-SST-2", 1), src / "ta-bin")),
        downloads=5000,
    )
    # 2. a Trainer card: base declared, glue + model-index config
    hub.publish(
        "alice/bert-finetuned-sst2",
        {
            **folder_files(ft("alice/bert-finetuned-sst2", 2)),
            "training_args.bin": b"never fetched",
            "optimizer.pt": b"never fetched",
            "README.md": card(trainer_card("bert-finetuned-sst2", "sst2")),
        },
        downloads=900,
        pipeline_tag="text-classification",
    )
    # 3. sharded, declared, newer model-index form (config:)
    hub.publish(
        "bob/bert-base-uncased-mnli",
        {
            **folder_files(to_sharded(ft("bob/bert-base-uncased-mnli", 3), src / "bob-sh")),
            "README.md": card(trainer_card("bert-base-uncased-mnli", "mnli", key="config")),
        },
        downloads=800,
    )
    # 4. no datasets anywhere: the name is all there is
    hub.publish(
        "carol/bert-base-uncased-imdb",
        {**folder_files(ft("carol/bert-base-uncased-imdb", 4)), "README.md": card({"license": "mit"})},
        downloads=700,
    )
    # 5. same family by name, other sizes: rejected by config
    other = planted_finetune(tiny_bert, src / "wide", seed=5)
    cfg = json.loads((other / "config.json").read_text())
    cfg["intermediate_size"] = 128
    hub.publish(
        "dave/bert-base-uncased-wide",
        {"config.json": json.dumps(cfg).encode(), "model.safetensors": other / "model.safetensors"},
        downloads=600,
    )
    # 6. declared base but mismatched shapes: kept by its tag, fails at embed with the tensor named
    wrong = {
        k: (torch.zeros(v.shape[0], v.shape[1] + 1) if "layer.0.attention.self.query.weight" in k else v)
        for k, v in load_file(str(tiny_bert / "model.safetensors")).items()
    }
    save_file(wrong, str(src / "wrong.safetensors"))
    hub.publish(
        "erin/bert-mismatched",
        {
            "config.json": (tiny_bert / "config.json").read_bytes(),
            "model.safetensors": src / "wrong.safetensors",
            "README.md": card({"base_model": BASE, "datasets": ["imdb"]}),
        },
        downloads=500,
    )
    # 7. gated
    hub.publish(
        "gina/bert-base-uncased-gated-rte",
        {
            **folder_files(ft("gina/bert-base-uncased-gated-rte", 7)),
            "README.md": card({"base_model": BASE, "datasets": ["glue"], "tags": ["rte"]}),
        },
        gated="manual",
        downloads=400,
    )
    # 7b. private: invisible without a token
    hub.publish(
        "lena/bert-private-qnli",
        {
            **folder_files(ft("lena/bert-private-qnli", 12)),
            "README.md": card(
                {
                    "base_model": BASE,
                    "datasets": ["glue"],
                    "model-index": [{"name": "x", "results": [{"dataset": {"type": "glue", "config": "qnli"}}]}],
                }
            ),
        },
        private=True,
        downloads=350,
    )
    # 8. a substring hit of another family: rejected by model_type
    from transformers import DistilBertConfig

    hub.publish(
        "frank/distilbert-base-uncased-finetuned-sst-2-english",
        {
            "config.json": json.dumps(
                DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64).to_dict()
            ).encode(),
            "model.safetensors": tiny_bert / "model.safetensors",
        },
        downloads=100_000,
    )
    # 9. TensorFlow only
    hub.publish(
        "henry/bert-base-uncased-tf-only",
        {
            "config.json": (tiny_bert / "config.json").read_bytes(),
            "tf_model.h5": b"x" * 100,
            "README.md": card({"base_model": BASE, "datasets": ["squad"]}),
        },
        downloads=300,
    )
    # 10. a flaky server in front of a good model
    hub.publish(
        "ivan/bert-base-uncased-flaky-cola",
        {
            **folder_files(ft("ivan/bert-base-uncased-flaky-cola", 10)),
            "README.md": card(
                {
                    "base_model": BASE,
                    "datasets": ["glue"],
                    "model-index": [
                        {"name": "x", "results": [{"dataset": {"type": "glue", "config": "cola", "name": "GLUE COLA"}}]}
                    ],
                }
            ),
        },
        downloads=200,
    )
    # 11. a file truncated on the Hub itself (a broken upload)
    good = ft("judy/bert-base-uncased-truncated", 11)
    data = (good / "model.safetensors").read_bytes()
    hub.publish(
        "judy/bert-base-uncased-truncated",
        {
            "config.json": (good / "config.json").read_bytes(),
            "model.safetensors": data[: len(data) // 2],
            "README.md": card({"base_model": BASE, "datasets": ["imdb"]}),
        },
        downloads=100,
    )
    return hub, made


@pytest.fixture()
def server(world):
    hub, _ = world
    with hub.serve() as srv:
        yield srv


@pytest.fixture()
def hub_settings(server, tmp_path):
    return HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf-cache"), token=False, backoff=0.01)


# --- ids and small pieces -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, canonical",
    [
        ("bert-base-uncased", "google-bert/bert-base-uncased"),
        ("google-bert/bert-base-uncased", BASE),
        ("roberta-base", "FacebookAI/roberta-base"),
        ("FacebookAI/roberta-base", "FacebookAI/roberta-base"),
        ("t5-base", "google-t5/t5-base"),
        ("google-t5/t5-base", "google-t5/t5-base"),
        ("gpt2-medium", "openai-community/gpt2-medium"),
        ("openai-community/gpt2-medium", "openai-community/gpt2-medium"),
        ("someone/custom-bert", "someone/custom-bert"),
    ],
)
def test_base_ids_short_and_canonical(given, canonical):
    assert resolve_base(given).canonical == canonical
    assert resolve_base(given) == resolve_base(canonical)


def test_formats_prefer_safetensors_and_never_other_frameworks():
    files = [
        "config.json",
        "tf_model.h5",
        "flax_model.msgpack",
        "pytorch_model.bin",
        "model.safetensors",
        "model.onnx",
        "optimizer.pt",
        "training_args.bin",
    ]
    assert formats(files) == ("safetensors", "bin", "tf", "flax", "onnx")
    assert weight_format(files) == "safetensors"
    assert weight_format(["pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin"]) == "bin-sharded"
    assert weight_format(["tf_model.h5", "config.json"]) is None


def test_config_match_names_the_difference():
    base = tiny_bert_config().to_dict()
    ok, why = config_match(base, {**base, "vocab_size": 999, "architectures": ["BertForSequenceClassification"]})
    assert ok and why == "config matches the base (bert, 4 sizes)"
    ok, why = config_match(base, {**base, "num_attention_heads": 8})
    assert not ok and "num_attention_heads 8" in why
    ok, why = config_match(base, {**base, "model_type": "roberta"})
    assert not ok and "roberta" in why


def test_retries_back_off_on_transient_errors_only():
    from huggingface_hub.errors import HfHubHTTPError

    from modelvec.hub.http import httpx2

    def http_error(status: int, retry_after: str | None = None) -> HfHubHTTPError:
        request = httpx2.Request("GET", "http://127.0.0.1/x")
        headers = {"Retry-After": retry_after} if retry_after else {}
        return HfHubHTTPError(f"{status}", response=httpx2.Response(status, request=request, headers=headers))

    waits: list[float] = []
    calls = iter([http_error(503), http_error(429, "0.5"), "ok"])

    def call():
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    assert with_retries(call, HubSettings(backoff=0.1), "x", sleep=waits.append) == "ok"
    assert len(waits) == 2 and 0.1 <= waits[0] <= 0.125 and waits[1] == 0.5
    assert transient(httpx2.ReadTimeout("slow")) and not transient(http_error(404)) and not transient(ValueError())
    with pytest.raises(HfHubHTTPError):
        with_retries(
            lambda: (_ for _ in ()).throw(http_error(500)),
            HubSettings(retries=2, backoff=0.01),
            "x",
            sleep=waits.append,
        )
    assert len(waits) == 4  # two more waits, then the third failure is raised


# --- discovery ------------------------------------------------------------------------------------


def test_discovery_keeps_declared_and_config_matched_and_says_why(server, hub_settings):
    found = discover("bert-base-uncased", hub_settings=hub_settings)
    by = {e.model: e for e in found.entries}
    assert found.base == BASE and len(found.base_sha) == 40
    assert BASE not in by  # the base is never its own fine-tune
    kept = {e.model for e in found.kept}
    assert kept == {
        "textattack/bert-base-uncased-SST-2",
        "alice/bert-finetuned-sst2",
        "bob/bert-base-uncased-mnli",
        "carol/bert-base-uncased-imdb",
        "erin/bert-mismatched",
        "gina/bert-base-uncased-gated-rte",
        "ivan/bert-base-uncased-flaky-cola",
        "judy/bert-base-uncased-truncated",
    }
    assert by["alice/bert-finetuned-sst2"].reason.startswith("declares base_model:finetune:")
    assert "config matches the base" in by["textattack/bert-base-uncased-SST-2"].reason
    assert "intermediate_size 128 differs" in by["dave/bert-base-uncased-wide"].reason
    assert "model_type 'distilbert'" in by["frank/distilbert-base-uncased-finetuned-sst-2-english"].reason
    assert "no PyTorch weights (has: tf)" in by["henry/bert-base-uncased-tf-only"].reason
    # catalogue fields
    alice = by["alice/bert-finetuned-sst2"]
    assert alice.author == "alice" and alice.downloads == 900 and len(alice.sha) == 40
    assert alice.pipeline_tag == "text-classification" and alice.created_at
    assert alice.formats == ["safetensors"] and "base_model:finetune:bert-base-uncased" in alice.tags
    assert "dataset:glue" in alice.tags
    assert by["textattack/bert-base-uncased-SST-2"].formats == ["bin"]
    assert by["bob/bert-base-uncased-mnli"].formats == ["safetensors-sharded"]
    assert by["gina/bert-base-uncased-gated-rte"].gated == "manual"
    # labels and where they came from
    assert alice.datasets == ["glue/sst2"] and alice.label_source == "model-index+card"
    assert by["bob/bert-base-uncased-mnli"].datasets == ["glue/mnli"]
    assert by["textattack/bert-base-uncased-SST-2"].datasets == ["glue/sst2"]
    assert by["textattack/bert-base-uncased-SST-2"].label_source == "name"
    assert (
        by["carol/bert-base-uncased-imdb"].datasets == ["imdb"]
        and by["carol/bert-base-uncased-imdb"].label_source == "name"
    )
    assert by["ivan/bert-base-uncased-flaky-cola"].datasets == ["glue/cola"]
    # most downloaded first within each route
    declared = [e.downloads for e in found.entries if e.reason.startswith("declares")]
    assert declared == sorted(declared, reverse=True)


def test_discovery_limit_sort_and_only_small_files(server, hub_settings):
    found = discover(BASE, limit=2, hub_settings=hub_settings)
    assert [e.model for e in found.kept] == ["alice/bert-finetuned-sst2", "bob/bert-base-uncased-mnli"]
    fetched = [r["path"] for r in server.requests if "/resolve/" in r["path"] and r["method"] == "GET"]
    assert fetched and all(p.endswith("config.json") for p in fetched), fetched  # no weights to discover


def test_discovery_refresh_keeps_vectors_and_updates_labels(server, hub_settings, tmp_path):
    db = Store(tmp_path / "s.duckdb")
    found = discover(BASE, limit=3, hub_settings=hub_settings)
    db.writes.put_catalogue(found.base, found.base_sha, found.entries)
    result = embed(BASE, found.kept[:1], store=db, hub_settings=hub_settings)
    assert len(result.embedded) == 1
    again = discover(BASE, hub_settings=hub_settings)
    db.writes.put_catalogue(again.base, again.base_sha, again.entries)
    assert len(db.reads.catalogue(BASE)) == len(again.entries) and db.reads.metadata().shape[0] == 1
    db.close()


def test_a_discovery_that_cannot_start_leaves_no_empty_store_behind(server, hub_settings, tmp_path):
    """A new store is made once the Hub has answered: a base the Hub does not have is one error and no store; the
    same store is then made and filled by a discovery that starts, and discovered into again as it is."""
    from modelvec.core.errors import ModelvecError

    store = tmp_path / "new.duckdb"
    with pytest.raises(ModelvecError):
        discover("nobody/no-such-base", store=store, hub_settings=hub_settings)
    assert not list(tmp_path.iterdir())
    found = discover(BASE, store=store, hub_settings=hub_settings)
    with Store(store, read_only=True) as db:
        assert len(db.reads.catalogue(BASE)) == len(found.entries) > 0
    again = discover(BASE, store=store, hub_settings=hub_settings)
    assert [e.model for e in again.entries] == [e.model for e in found.entries]


# --- download ---------------------------------------------------------------------------------------


def test_fetch_downloads_only_config_and_the_best_weights(server, hub_settings, world):
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    alice = found["alice/bert-finetuned-sst2"]
    folder = fetch(alice.model, alice.sha, alice.files, hub_settings)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    bob = found["bob/bert-base-uncased-mnli"]
    shards = sorted(p.name for p in fetch(bob.model, bob.sha, bob.files, hub_settings).iterdir())
    assert shards == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    got = [r["path"].rsplit("/", 1)[-1] for r in server.requests if "/resolve/" in r["path"]]
    assert not {"training_args.bin", "optimizer.pt", "tf_model.h5", "tokenizer.json", "README.md"} & set(got)
    # each file by name, pinned to the discovered commit; no tree is listed
    assert not [r for r in server.requests if "/tree/" in r["path"]]
    for e in (alice, bob):
        mine = [r["path"] for r in server.requests if r["path"].startswith(f"/{e.model}/resolve/")]
        assert mine and all(p.startswith(f"/{e.model}/resolve/{e.sha}/") for p in mine)
    freed = release(alice.model, alice.sha, hub_settings)
    assert freed > 0 and snapshot_folder(alice.model, alice.sha, hub_settings) is None
    assert snapshot_folder(bob.model, bob.sha, hub_settings) is not None  # other repos untouched


def test_revision_pinning_uses_the_discovered_sha(tmp_path, tiny_bert):
    hub = LocalHub(tmp_path / "hub")
    hub.publish(BASE, folder_files(tiny_bert))
    repo = "kim/bert-base-uncased-pinned-imdb"
    first = planted_finetune(tiny_bert, tmp_path / "v1", seed=21)
    second = planted_finetune(tiny_bert, tmp_path / "v2", seed=22)
    sha1 = hub.publish(repo, {**folder_files(first), "README.md": card({"base_model": BASE, "datasets": ["imdb"]})})
    with hub.serve() as server:
        hub_settings = HubSettings(
            endpoint=server.endpoint, cache_dir=str(tmp_path / "hf-cache"), token=False, backoff=0.01
        )
        found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
        assert found[repo].sha == sha1
        sha2 = hub.publish(
            repo, {**folder_files(second), "README.md": card({"base_model": BASE, "datasets": ["imdb"]})}
        )
        assert sha2 != sha1
        db = Store(tmp_path / "s.duckdb")
        pinned = embed(BASE, [found[repo]], store=db, hub_settings=hub_settings)
        local = embed(tiny_bert, [first, second], store=db)
        assert np.array_equal(pinned.vectors[0], local.vectors[0])
        assert not np.array_equal(pinned.vectors[0], local.vectors[1])
        fetched = [r["path"] for r in server.requests if "/resolve/" in r["path"] and repo in r["path"]]
        assert fetched and all(f"/resolve/{sha1}/" in p for p in fetched)
        # a refreshed discovery moves to the new revision and the vector is recomputed, not skipped
        latest = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}[repo]
        moved = embed(BASE, [latest], store=db, hub_settings=hub_settings)
        assert latest.sha == sha2 and moved.embedded == [repo]
        assert np.array_equal(moved.vectors[0], local.vectors[1])
        db.close()


# --- the whole pipeline ------------------------------------------------------------------------------


def test_discover_embed_cluster_end_to_end(server, hub_settings, world, tmp_path, tiny_bert):
    from modelvec.report import cluster

    hub, made = world
    hub.fail("/ivan/bert-base-uncased-flaky-cola/resolve/*", status=500, times=2)
    hub.fail("/ivan/bert-base-uncased-flaky-cola/resolve/*/model.safetensors", status=429, times=1, retry_after=0)
    db = Store(tmp_path / "s.duckdb")
    result = embed_discovered("bert-base-uncased", store=db, hub_settings=hub_settings, keep_weights=False)
    failed = result.failed
    assert set(failed) == {
        "erin/bert-mismatched",
        "gina/bert-base-uncased-gated-rte",
        "judy/bert-base-uncased-truncated",
    }
    assert "layer.0.attention.self.query" in failed["erin/bert-mismatched"]
    assert "gated" in failed["gina/bert-base-uncased-gated-rte"]
    assert failed["judy/bert-base-uncased-truncated"].startswith("judy/bert-base-uncased-truncated: ")
    for reason in failed.values():
        assert "\n" not in reason
    statuses = [r["status"] for r in server.requests if "ivan/" in r["path"]]
    assert statuses.count(500) == 2 and statuses.count(429) == 1
    assert "ivan/bert-base-uncased-flaky-cola" in result.embedded
    # vectors equal the ones computed from the local folders the repos were made from
    embedder = DeltaEmbedder.from_representation(Representation(), "cpu").fit(Checkpoint(tiny_bert))
    for name in result.embedded:
        row = list(result.metadata["model"]).index(name)
        assert np.allclose(result.vectors[row], embedder.embed_one(Checkpoint(made[name])), atol=1e-6), name
    # --no-keep-weights: fine-tunes are gone from the cache, the base stays
    for name in result.embedded:
        assert not list(Path(hub_settings.cache_dir).glob(f"models--{name.replace('/', '--')}/snapshots/*/model*"))
    base_repo = Path(hub_settings.cache_dir) / f"models--{BASE.replace('/', '--')}"
    assert list(base_repo.glob(".modelvec/partial/*/model.safetensors"))  # the default reads a share of rows
    # labels, sources and authors reach the store
    meta = result.metadata.set_index("model")
    assert list(meta.loc["textattack/bert-base-uncased-SST-2", "datasets"]) == ["glue/sst2"]
    assert meta.loc["textattack/bert-base-uncased-SST-2", "label_source"] == "name"
    assert meta.loc["alice/bert-finetuned-sst2", "author"] == "alice"
    # a second run downloads nothing and recomputes nothing
    before = len(server.requests)
    again = embed_discovered("bert-base-uncased", store=db, hub_settings=hub_settings)
    assert sorted(again.skipped) == sorted(result.embedded)
    # content failures of the same revisions are not fetched again; the gated one (access may change) is
    assert again.failed["erin/bert-mismatched"] == failed["erin/bert-mismatched"]
    assert again.failed["judy/bert-base-uncased-truncated"] == failed["judy/bert-base-uncased-truncated"]
    assert not [
        r
        for r in server.requests[before:]
        if "/resolve/" in r["path"]
        and "model" in r["path"].rsplit("/", 1)[-1]
        and r["method"] == "GET"
        and BASE not in r["path"]
    ]
    # and the analysis runs on it
    report = cluster("bert-base-uncased", store=db, out=tmp_path / "out", reduce="pca", hub_settings=hub_settings)
    assert report.n_models == len(result.embedded) and report.n_authors == len(result.embedded)
    # the blocks laid out from the headers of the base's rows in the Hub cache, offline
    assert report.per_block and report.per_block_note is None and Path(report.files["blocks"]).is_file()
    elsewhere = HubSettings(endpoint=hub_settings.endpoint, cache_dir=str(tmp_path / "empty-cache"), token=False)
    bare = cluster("bert-base-uncased", store=db, out=tmp_path / "bare", reduce="pca", hub_settings=elsewhere)
    assert bare.per_block is None and "not on this machine" in bare.per_block_note
    # glue/sst2 is the only dataset with two models (textattack's, guessed from its name, and alice's)
    assert report.n_scored == 2
    declared = cluster("bert-base-uncased", store=db, out=tmp_path / "out2", reduce="pca", label_sources=["declared"])
    assert declared.n_scored == 0 and {p["model"] for p in declared.predictions} >= {
        "textattack/bert-base-uncased-SST-2"
    }
    db.close()


def test_gated_and_private_models_need_the_token(server, hub_settings, tmp_path):
    from dataclasses import replace

    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    assert "lena/bert-private-qnli" not in found
    gated = found["gina/bert-base-uncased-gated-rte"]
    db = Store(tmp_path / "s.duckdb")
    assert "gated" in embed(BASE, [gated], store=db, hub_settings=hub_settings).failed[gated.model]
    assert (
        "not found"
        in embed(BASE, ["lena/bert-private-qnli"], store=db, hub_settings=hub_settings).failed["lena/bert-private-qnli"]
    )
    logged_in = replace(hub_settings, token=TOKEN)
    found = {e.model: e for e in discover(BASE, hub_settings=logged_in).entries}
    assert found["lena/bert-private-qnli"].kept and found["lena/bert-private-qnli"].datasets == ["glue/qnli"]
    ok = embed(BASE, [gated, found["lena/bert-private-qnli"]], store=db, hub_settings=logged_in)
    assert sorted(ok.embedded) == ["gina/bert-base-uncased-gated-rte", "lena/bert-private-qnli"] and not ok.failed
    db.close()


def test_truncated_transfer_is_resumed(world, server, hub_settings, tmp_path):
    hub, made = world
    hub.truncate("/alice/bert-finetuned-sst2/resolve/*/model.safetensors", keep=200, times=1)
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    db = Store(tmp_path / "s.duckdb")
    result = embed(BASE, [found["alice/bert-finetuned-sst2"]], store=db, hub_settings=hub_settings)
    assert result.embedded == ["alice/bert-finetuned-sst2"], result.failed
    db.close()


def test_neighbors_of_a_hub_model_not_in_the_store(world, server, hub_settings, tmp_path):
    """A Hub id that is not stored is fetched, embedded on the fly against the stored base revision,
    compared and not stored; its vector is the one of the local folder its repo was made from."""
    from modelvec.report import neighbors

    hub, made = world
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    db = Store(tmp_path / "s.duckdb")
    stored = [
        found["textattack/bert-base-uncased-SST-2"],
        found["carol/bert-base-uncased-imdb"],
        made["alice/bert-finetuned-sst2"],
    ]
    assert not embed(BASE, stored, store=db, hub_settings=hub_settings).failed
    before = len(db.reads.metadata())
    result = neighbors("alice/bert-finetuned-sst2", store=db, hub_settings=hub_settings, scoring=Scoring(k=2))
    assert result.on_the_fly and result.base == BASE and len(db.reads.metadata()) == before
    assert result.nearest["model"][0] == str(made["alice/bert-finetuned-sst2"].resolve())
    assert result.nearest["distance"][0] < 1e-6
    db.close()


def test_offline_mode_works_from_the_cache(server, hub_settings, tmp_path):
    store = tmp_path / "s.duckdb"
    env = {
        **os.environ,
        "HF_ENDPOINT": server.endpoint,
        "HF_HUB_CACHE": hub_settings.cache_dir,
        "MODELVEC_HUB_BACKOFF": "0.01",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "COLUMNS": "250",
    }
    env.pop("HF_TOKEN", None)

    def cli(*args: str, offline: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "modelvec.cli", *args, "--store", str(store)],
            capture_output=True,
            text=True,
            env={**env, "HF_HUB_OFFLINE": "1"} if offline else env,
            timeout=300,
        )

    out = cli("discover", "bert-base-uncased", "--limit", "2")
    assert out.returncode == 0, out.stderr
    assert "alice/bert-finetuned-sst2" in out.stdout and "kept 2" in out.stdout
    out = cli("embed", "bert-base-uncased")
    assert out.returncode == 0 and "embedded 2" in out.stdout, out.stdout + out.stderr
    out = cli("embed", "bert-base-uncased", "--force", offline=True)
    assert out.returncode == 0 and "embedded 2" in out.stdout, out.stdout + out.stderr
    out = cli("discover", "bert-base-uncased", offline=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "offline" in out.stderr.lower()
    # the embedding read a share of rows (partial downloads); the rank study reads whole files: once fetched, it
    # works offline from the cache
    out = cli("rank", "--over-finetunes", "bert-base-uncased", "--out", str(tmp_path / "rank"))
    assert out.returncode == 0 and "mean rank of ΔW across depth" in out.stdout, out.stdout + out.stderr
    out = cli("rank", "--over-finetunes", "bert-base-uncased", "--out", str(tmp_path / "rank"), offline=True)
    assert out.returncode == 0 and "mean rank of ΔW across depth" in out.stdout, out.stdout + out.stderr
    # a cache that holds the base but not the fine-tunes: offline, the study says why it has nothing to study
    bare = tmp_path / "bare-cache"
    shutil.copytree(
        Path(hub_settings.cache_dir) / "models--google-bert--bert-base-uncased",
        bare / "models--google-bert--bert-base-uncased",
    )
    env["HF_HUB_CACHE"] = str(bare)
    out = cli("rank", "--over-finetunes", "bert-base-uncased", "--out", str(tmp_path / "rank"), offline=True)
    said = out.stderr.strip()
    assert out.returncode == 2 and len(said.splitlines()) == 1 and "Traceback" not in said, said
    assert said.startswith("error: bert-base-uncased: none of its 2 stored fine-tunes could be fetched")
    assert "offline" in said.lower()


def test_candidates_without_config_are_checked_from_the_safetensors_header(tmp_path, tiny_bert):
    hub = LocalHub(tmp_path / "hub")
    hub.publish(BASE, folder_files(tiny_bert))
    good = planted_finetune(tiny_bert, tmp_path / "good", seed=31)
    hub.publish("nocfg/bert-base-uncased-headers-only", {"model.safetensors": good / "model.safetensors"})
    state = load_file(str(tiny_bert / "model.safetensors"))
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(65, 32)
    save_file(state, str(tmp_path / "odd.safetensors"))
    hub.publish("nocfg/bert-base-uncased-odd-headers", {"model.safetensors": tmp_path / "odd.safetensors"})
    with hub.serve() as server:
        hub_settings = HubSettings(
            endpoint=server.endpoint, cache_dir=str(tmp_path / "hf-cache"), token=False, backoff=0.01
        )
        found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
        assert found["nocfg/bert-base-uncased-headers-only"].kept
        assert (
            "safetensors header matches the base (12 matrices)" in found["nocfg/bert-base-uncased-headers-only"].reason
        )
        odd = found["nocfg/bert-base-uncased-odd-headers"]
        assert not odd.kept and "encoder.layer.1.intermediate.dense.weight is (65, 32)" in odd.reason
        # only headers were read: range requests, never a whole weights file
        weight_gets = [
            r
            for r in server.requests
            if r["method"] == "GET" and r["path"].endswith(".safetensors") and "nocfg/" in r["path"]
        ]
        assert weight_gets and all(r["range"] for r in weight_gets)
        db = Store(tmp_path / "s.duckdb")
        result = embed(BASE, [found["nocfg/bert-base-uncased-headers-only"]], store=db, hub_settings=hub_settings)
        local = embed(tiny_bert, [good], store=db)
        assert np.array_equal(result.vectors[0], local.vectors[0])
        db.close()
