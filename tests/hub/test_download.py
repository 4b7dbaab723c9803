"""fetch: the wanted files of a revision in one snapshot_download, checked, through the real huggingface_hub client
against a local Hub. No weights are parsed here: file names, bytes and the requests the Hub saw are what is checked."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from modelvec.core.errors import FetchError
from modelvec.hub.cache import release, snapshot_folder, tree_listing
from modelvec.hub.client import HubSettings
from modelvec.hub.download import fetch
from modelvec.testing.localhub import LocalHub

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
INDEX = "model.safetensors.index.json"
WANTED = sorted(["config.json", INDEX, *SHARDS])


def sharded(extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """A sharded checkpoint's files (the shards are opaque bytes: fetch never parses them) and ``extra``."""
    index = {"metadata": {}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1], "c.weight": SHARDS[1]}}
    return {
        "config.json": b'{"model_type": "bert"}',
        INDEX: json.dumps(index).encode(),
        SHARDS[0]: os.urandom(300_000),
        SHARDS[1]: os.urandom(200_000),
        **(extra or {}),
    }


@pytest.fixture()
def hub(tmp_path):
    return LocalHub(tmp_path / "hub", tree_page_size=3)  # small pages: snapshot_download follows the Link header


@pytest.fixture()
def server(hub):
    with hub.serve() as srv:
        yield srv


@pytest.fixture()
def hub_settings(server, tmp_path):
    return HubSettings(
        endpoint=server.endpoint, cache_dir=str(tmp_path / "cache"), token=False, retries=2, backoff=0.01, timeout=5.0
    )


def snapshot_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def asked(server, repo: str, start: int = 0) -> list[str]:
    """The files of ``repo`` the Hub was asked for (HEAD or GET), in order."""
    return [
        r["path"].split("/resolve/", 1)[1].split("/", 1)[1]
        for r in server.requests[start:]
        if r["path"].startswith(f"/{repo}/resolve/")
    ]


def test_fetch_takes_only_the_wanted_files_each_by_name(hub, server, hub_settings):
    repo = "org/sharded-plus-everything"
    files = sharded(
        {
            "model.gguf": os.urandom(150_000),
            "onnx/model.onnx": os.urandom(100_000),
            "onnx/tokenizer.json": b"{}",
            "flax_model.msgpack": os.urandom(100_000),
            "tf_model.h5": b"tf",
            "training_args.bin": b"never",
            "optimizer.pt": b"never",
            "README.md": b"# card\n",
            "pytorch_model.bin.index.json": b"{}",
        }
    )
    sha = hub.publish(repo, files)
    folder = fetch(repo, sha, sorted(files), hub_settings)
    assert folder.name == sha and folder == snapshot_folder(repo, sha, hub_settings).resolve()
    assert snapshot_files(folder) == WANTED  # no onnx/ folder, no .gguf, no training files
    for name in WANTED:
        assert (folder / name).read_bytes() == files[name]
    # each file asked for by name, pinned to the commit: the weights with their own (guarded) HEAD, the small JSON
    # files (config, index) by one GET each; no tree listed, no repo_info
    assert not [r for r in server.requests if "/tree/" in r["path"] or r["path"] == f"/api/models/{repo}"]
    assert sorted(set(asked(server, repo))) == WANTED
    heads = sorted(r["path"].rsplit("/", 1)[1] for r in server.requests if r["method"] == "HEAD")
    assert heads == [n for n in WANTED if not n.endswith(".json")]
    assert len([r for r in server.requests if r["path"].endswith(".json")]) == len(
        [n for n in WANTED if n.endswith(".json")]
    )
    assert all(f"/resolve/{sha}/" in r["path"] for r in server.requests if "/resolve/" in r["path"])
    # a second fetch asks the Hub nothing: the files of an immutable commit are cached
    before = len(server.requests)
    assert fetch(repo, sha, sorted(files), hub_settings) == folder
    assert len(server.requests) == before
    assert release(repo, sha, hub_settings) > 0 and snapshot_folder(repo, sha, hub_settings) is None


def test_files_not_given_single_file_and_adapter(hub, server, hub_settings):
    single = hub.publish(
        "org/single",
        {"config.json": b"{}", "model.safetensors": b"w" * 1000, "pytorch_model.bin": b"older", "tf_model.h5": b"tf"},
    )
    assert snapshot_files(fetch("org/single", single, None, hub_settings)) == ["config.json", "model.safetensors"]
    adapter = hub.publish(
        "org/adapter",
        {
            "adapter_config.json": b"{}",
            "adapter_model.safetensors": b"a" * 100,
            "adapter_model.bin": b"older",
            "README.md": b"# adapter\n",
        },
    )
    folder = fetch("org/adapter", adapter, None, hub_settings)
    assert snapshot_files(folder) == ["adapter_config.json", "adapter_model.safetensors"]


def test_shard_names_are_matched_literally_not_as_patterns(hub, server, hub_settings):
    repo = "org/glob-shards"
    odd = ["model-*.safetensors", "model-[1].safetensors", "model-?.safetensors"]
    index = {"weight_map": {f"w{i}": name for i, name in enumerate(odd)}}
    files = {
        "config.json": b"{}",
        INDEX: json.dumps(index).encode(),
        **{n: n.encode() for n in odd},
        "model-00001.safetensors": b"not named by the index",
        "model-1.safetensors": b"nor this",
        "model-x.safetensors": b"nor this one",
    }
    sha = hub.publish(repo, files)
    folder = fetch(repo, sha, sorted(files), hub_settings)
    assert snapshot_files(folder) == sorted(["config.json", INDEX, *odd])
    assert all((folder / n).read_bytes() == n.encode() for n in odd)


def test_corrupt_shards_are_all_checked_and_fetched_again(hub, server, hub_settings):
    repo = "org/corrupt-shards"
    files = sharded()
    sha = hub.publish(repo, files)
    for shard in SHARDS:  # both shards arrive with one byte flipped, once
        hub.fail(f"/{repo}/resolve/*/{shard}", kind="corrupt", after_bytes=1000, times=1)
    folder = fetch(repo, sha, sorted(files), hub_settings)
    assert snapshot_files(folder) == WANTED
    assert all((folder / n).read_bytes() == files[n] for n in WANTED)
    gets = [r for r in server.requests if r["method"] == "GET" and "/resolve/" in r["path"]]
    for shard in SHARDS:
        assert [r["fault"] for r in gets if r["path"].endswith(shard)] == ["corrupt", None], shard
    # persistently corrupt: the attempts run out, in one line, and nothing corrupt is left in the snapshot
    repo2 = "org/always-corrupt"
    sha2 = hub.publish(repo2, sharded())
    hub.fail(f"/{repo2}/resolve/*/{SHARDS[1]}", kind="corrupt", after_bytes=10, times=None)
    with pytest.raises(FetchError, match="downloaded bytes do not match their sha256 after 3 tries"):
        fetch(repo2, sha2, WANTED, hub_settings)
    assert not (Path(hub_settings.cache_dir) / "models--org--always-corrupt" / "snapshots" / sha2 / SHARDS[1]).exists()


def test_files_a_killed_fetch_left_unchecked_are_checked_by_the_next(hub, server, hub_settings):
    repo = "org/killed"
    files = sharded()
    sha = hub.publish(repo, files)
    folder = fetch(repo, sha, WANTED, hub_settings)
    blob = Path(os.path.realpath(folder / SHARDS[0]))
    assert blob.name == hashlib.sha256(files[SHARDS[0]]).hexdigest()
    blob.write_bytes(b"x" * len(files[SHARDS[0]]))  # what a corrupting proxy would have left
    # a checked file in the cache is trusted (hashing every cached file at every fetch would cost more than it saves)
    before = len(server.requests)
    assert fetch(repo, sha, WANTED, hub_settings) == folder and len(server.requests) == before
    # one that a killed fetch had not checked yet is hashed, refused and fetched again
    journal = Path(hub_settings.cache_dir) / "models--org--killed" / ".modelvec" / f"{sha}.unverified"
    journal.parent.mkdir(exist_ok=True)
    journal.write_text(json.dumps([SHARDS[0], "some-other-file.bin"]))
    assert fetch(repo, sha, WANTED, hub_settings) == folder
    assert (folder / SHARDS[0]).read_bytes() == files[SHARDS[0]]
    assert asked(server, repo, before) == [SHARDS[0], SHARDS[0]]  # HEAD and GET, of that file only
    assert json.loads(journal.read_text()) == ["some-other-file.bin"]  # another fetch's names stay
    release(repo, sha, hub_settings)
    assert not journal.exists()


def test_a_wanted_file_the_tree_does_not_list_fails_as_missing(hub, server, hub_settings):
    sha = hub.publish("org/no-config", {"model.safetensors": b"w" * 100})
    with pytest.raises(FetchError, match="file not found in the repository"):
        fetch("org/no-config", sha, ["config.json", "model.safetensors"], hub_settings)  # a listing that lied


@pytest.mark.parametrize("sharded_repo", [True, False])
def test_a_corrupt_download_is_fetched_again(hub, server, hub_settings, sharded_repo):
    repo = "org/corrupt-once"
    files = sharded() if sharded_repo else {"config.json": b"{}", "model.safetensors": b"w" * 100, "x.gguf": b"g"}
    wanted = WANTED if sharded_repo else ["config.json", "model.safetensors"]
    weights = SHARDS[1] if sharded_repo else "model.safetensors"
    sha = hub.publish(repo, files)
    hub.fail(f"/{repo}/resolve/*/{weights}", kind="corrupt", after_bytes=5, times=1)
    folder = fetch(repo, sha, sorted(files), hub_settings)
    assert snapshot_files(folder) == wanted and all((folder / n).read_bytes() == files[n] for n in wanted)
    assert [r["fault"] for r in server.requests if r["method"] == "GET" and r["path"].endswith(weights)] == [
        "corrupt",
        None,
    ]


def test_a_branch_is_pinned_to_its_commit_and_found_offline(hub, server, hub_settings, monkeypatch):
    repo = "org/branch"
    files = sharded()
    sha = hub.publish(repo, files)
    folder = fetch(repo, "main", None, hub_settings)
    assert folder.name == sha and snapshot_files(folder) == WANTED
    assert (Path(hub_settings.cache_dir) / "models--org--branch" / "refs" / "main").read_text() == sha
    assert all(f"/resolve/{sha}/" in r["path"] for r in server.requests if "/resolve/" in r["path"])
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    before = len(server.requests)
    assert fetch(repo, "main", None, hub_settings) == folder
    assert fetch(repo, sha, WANTED, hub_settings) == folder
    assert len(server.requests) == before
    other = hub.publish("org/never-fetched", sharded())
    with pytest.raises(FetchError, match="offline"):
        fetch("org/never-fetched", other, WANTED, hub_settings)
    release(repo, sha, hub_settings)
    with pytest.raises(FetchError, match="offline"):
        fetch(repo, sha, WANTED, hub_settings)


def test_a_hostile_tree_listing_is_never_asked_for(hub, server, hub_settings, tmp_path_factory):
    """huggingface_hub names a blob and its lock by a listing's LFS sha256 (and skips the guarded HEAD for a Xet
    file it lists): modelvec lists no tree and caches none, so every file comes by its own, guarded HEAD."""
    outside = tmp_path_factory.getbasetemp()
    repo = "evil/listing"
    files = {"config.json": b"{}", "model.safetensors": b"w" * 1000}
    sha = hub.publish(repo, files)
    hostile = {
        "model.safetensors": {
            "lfs": {"oid": f"{outside}/escape-abs", "size": 1000, "pointerSize": 134},
            "xetHash": "a" * 64,
        },
        "config.json": {"lfs": {"oid": "../../../../escape-up", "size": 2, "pointerSize": 134}, "xetHash": "b" * 64},
    }
    hub.forge(repo, tree=hostile)
    folder = fetch(repo, sha, None, hub_settings)
    assert all((folder / n).read_bytes() == files[n] for n in files)
    assert not list(outside.rglob("escape-*"))
    assert not [r for r in server.requests if "xet" in r["path"] or "/tree/" in r["path"]]
    heads = sorted(r["path"].rsplit("/", 1)[1] for r in server.requests if r["method"] == "HEAD")
    assert heads == sorted(n for n in files if not n.endswith(".json"))  # config.json: one GET, no HEAD
    assert not (folder.parent.parent / "trees").exists()  # no listing left for huggingface_hub to trust later


def test_a_hostile_listing_cached_by_another_tool_is_dropped_before_a_download(
    hub, server, hub_settings, tmp_path_factory
):
    """A listing that someone else's snapshot_download cached from a hostile endpoint (huggingface_hub would name a
    blob and its lock by its LFS sha256, with hf_xet installed) is deleted before modelvec downloads at that commit."""
    outside = tmp_path_factory.getbasetemp()
    files = {"config.json": b"{}", "model.safetensors": b"w" * 1000}
    sha = hub.publish("evil/cached-tree", files)
    listing = tree_listing(Path(hub_settings.cache_dir).resolve() / "models--evil--cached-tree", sha)
    listing.parent.mkdir(parents=True)
    hostile = {"size": 1000, "blob_id": "0" * 40, "lfs_sha256": f"{outside}/escape-cached", "lfs_size": 1000}
    files_json = {
        "model.safetensors": {**hostile, "xet_hash": "c" * 64},
        "config.json": {"size": 2, "blob_id": "1" * 40},
    }
    listing.write_text(json.dumps({"format_version": 1, "files": files_json}))
    folder = fetch("evil/cached-tree", sha, None, hub_settings)
    assert all((folder / n).read_bytes() == files[n] for n in files)
    assert not list(outside.rglob("escape-*")) and not listing.exists()


def test_huggingface_hub_keeps_tree_listings_where_modelvec_checks_them(hub, server, hub_settings):
    """drop_unsafe_listing relies on where huggingface_hub caches a commit's tree listing (a file layout, not an
    API): if a release moves it, this fails loudly instead of the check silently finding nothing."""
    from huggingface_hub import snapshot_download

    sha = hub.publish("org/listed", {"config.json": b"{}", "model.safetensors": b"w" * 1000})
    snapshot_download(
        "org/listed", revision=sha, cache_dir=hub_settings.cache_dir, endpoint=hub_settings.endpoint, token=False
    )
    listing = tree_listing(Path(hub_settings.cache_dir).resolve() / "models--org--listed", sha)
    data = json.loads(listing.read_text())
    assert data["format_version"] == 1 and set(data["files"]) == {"config.json", "model.safetensors"}
