"""The local Hub server, driven only through the real ``huggingface_hub`` client."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import get_session
from safetensors.numpy import save_file

from modelvec.testing.localhub import LocalHub

TOKEN = "hf_local_secret"


def card(**fields) -> bytes:
    return ("---\n" + json.dumps(fields) + "\n---\n# model card\n").encode()


def safetensors_file(path: Path, tensors: dict[str, tuple[int, ...]]) -> Path:
    save_file({name: np.zeros(shape, dtype=np.float32) for name, shape in tensors.items()}, str(path))
    return path


BERT = b'{"model_type": "bert", "architectures": ["BertModel"]}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One hub (page_size=2) with seven repos, served for the whole module."""
    tmp = tmp_path_factory.mktemp("localhub")
    weights = safetensors_file(tmp / "model.safetensors", {"embed.weight": (8, 4), "layer.0.weight": (4, 4)})
    hub = LocalHub(tmp / "root", tokens=[TOKEN], page_size=2)
    shas = {
        "org/base": hub.publish(
            "org/base",
            {
                "README.md": card(license="mit", language=["en", "fr"], tags=["tiny"]),
                "config.json": BERT,
                "model.safetensors": weights,
            },
            downloads=100,
            likes=9,
            created_at="2023-01-01T00:00:00Z",
        ),
        "org/ft-imdb": hub.publish(
            "org/ft-imdb",
            {
                "README.md": card(base_model="org/base", datasets=["imdb"]),
                "config.json": BERT,
                "model.safetensors": weights,
            },
            downloads=50,
            likes=1,
            created_at="2024-01-01T00:00:00Z",
        ),
        "org/ft-sst2": hub.publish(
            "org/ft-sst2",
            {
                "README.md": card(base_model="org/base", datasets="glue/sst2"),
                "config.json": BERT,
                "pytorch_model.bin": b"not really",
            },
            downloads=70,
            likes=1,
            created_at="2024-06-01T00:00:00Z",
        ),
        "org/adapter": hub.publish(
            "org/adapter", {"README.md": card(base_model="org/base"), "adapter_config.json": b"{}"}, downloads=10
        ),
        "other/unrelated": hub.publish(
            "other/unrelated", {"config.json": b'{"model_type": "gpt2"}'}, downloads=5, tags=["extra-tag"]
        ),
        "org/gated": hub.publish(
            "org/gated", {"config.json": BERT, "weights.bin": b"gated bytes"}, downloads=2, gated="auto"
        ),
        "org/private": hub.publish("org/private", {"config.json": BERT}, downloads=1000, private=True),
    }
    with hub.serve() as server:
        yield hub, server, shas


@pytest.fixture
def hub(world):
    hub, _, _ = world
    yield hub
    hub.clear_faults()  # a failed test must not leave faults behind for the next one


@pytest.fixture
def server(world, hub):
    return world[1]


@pytest.fixture
def shas(world):
    return world[2]


@pytest.fixture
def fresh(tmp_path):
    """An empty hub of its own, for tests that publish (the module's hub stays as the listing tests expect)."""
    hub = LocalHub(tmp_path / "fresh-root")
    with hub.serve() as server:
        yield hub, server


@pytest.fixture
def anon(server) -> HfApi:
    return HfApi(endpoint=server.endpoint, token=False)


@pytest.fixture
def authed(server) -> HfApi:
    return HfApi(endpoint=server.endpoint, token=TOKEN)


PUBLIC_BY_DOWNLOADS = ["org/base", "org/ft-sst2", "org/ft-imdb", "org/adapter", "other/unrelated", "org/gated"]


def test_filter_on_tags_derived_from_the_card(anon):
    assert {m.id for m in anon.list_models(filter="base_model:finetune:org/base")} == {"org/ft-imdb", "org/ft-sst2"}
    assert [m.id for m in anon.list_models(filter=["BASE_MODEL:finetune:org/base", "dataset:imdb"])] == ["org/ft-imdb"]
    assert [m.id for m in anon.list_models(filter="dataset:glue/sst2")] == ["org/ft-sst2"]
    assert [m.id for m in anon.list_models(filter="base_model:adapter:org/base")] == ["org/adapter"]
    assert [m.id for m in anon.list_models(filter=["license:mit", "fr", "tiny", "safetensors"])] == ["org/base"]
    assert [m.id for m in anon.list_models(filter="pytorch")] == ["org/ft-sst2", "org/gated"]
    assert [m.id for m in anon.list_models(filter="extra-tag")] == ["other/unrelated"]
    assert list(anon.list_models(filter="no-such-tag")) == []


def test_search_and_author(anon):
    assert [m.id for m in anon.list_models(search="FT-")] == ["org/ft-sst2", "org/ft-imdb"]
    assert [m.id for m in anon.list_models(author="other")] == ["other/unrelated"]
    assert [m.id for m in anon.list_models(author="org", search="imdb")] == ["org/ft-imdb"]


def test_sort_limit_and_pagination(anon, server):
    start = len(server.requests)
    models = list(anon.list_models(sort="downloads"))
    assert [m.id for m in models] == PUBLIC_BY_DOWNLOADS  # every public model, once, most downloaded first
    assert [m.downloads for m in models] == [100, 70, 50, 10, 5, 2]
    pages = [r for r in server.requests[start:] if r["path"] == "/api/models"]
    assert len(pages) == 3  # 6 models, 2 per page
    assert [r["query"].get("cursor") for r in pages] == [None, ["2"], ["4"]]
    assert all(r["query"]["sort"] == ["downloads"] for r in pages)  # the Link keeps the original params

    start = len(server.requests)
    assert [m.id for m in anon.list_models(sort="downloads", limit=3)] == PUBLIC_BY_DOWNLOADS[:3]
    assert len([r for r in server.requests[start:] if r["path"] == "/api/models"]) == 2

    assert [m.id for m in anon.list_models(sort="likes", limit=2)] == ["org/base", "org/ft-imdb"]  # tie: by id
    assert [m.id for m in anon.list_models(sort="created_at", filter="bert")][-3:] == [
        "org/ft-sst2",
        "org/ft-imdb",
        "org/base",
    ]


def test_default_and_full_listing_fields(anon, shas):
    (m,) = anon.list_models(search="ft-imdb")
    assert (m.id, m.downloads, m.likes, m.private, m.library_name) == ("org/ft-imdb", 50, 1, False, "transformers")
    assert m.created_at.year == 2024 and m.sha is None and m.siblings is None and m.card_data is None
    (m,) = anon.list_models(search="ft-imdb", full=True, cardData=True, fetch_config=True)
    assert m.sha == shas["org/ft-imdb"] and m.author == "org" and m.gated is False and m.last_modified is not None
    assert sorted(s.rfilename for s in m.siblings) == ["README.md", "config.json", "model.safetensors"]
    assert m.card_data.datasets == ["imdb"]
    assert m.config == {"model_type": "bert", "architectures": ["BertModel"]}


def test_expand_fields_parse_into_model_info(anon, shas):
    expand = ["author", "sha", "siblings", "cardData", "createdAt", "downloads", "tags"]
    (m,) = anon.list_models(filter="dataset:glue/sst2", expand=expand)
    assert m.author == "org" and m.sha == shas["org/ft-sst2"] and m.downloads == 70
    assert sorted(s.rfilename for s in m.siblings) == ["README.md", "config.json", "pytorch_model.bin"]
    assert m.card_data.base_model == "org/base" and m.card_data.datasets == "glue/sst2"
    assert m.created_at.isoformat().startswith("2024-06-01")
    assert {
        "transformers",
        "pytorch",
        "bert",
        "dataset:glue/sst2",
        "base_model:org/base",
        "base_model:finetune:org/base",
    } == set(m.tags)
    assert m.likes is None and m.private is None and m.library_name is None  # not expanded => not sent

    info = anon.model_info("org/ft-sst2", expand=["downloads", "likes"])
    assert (info.downloads, info.likes, info.sha, info.tags) == (70, 1, None, None)


def test_model_info_at_main(anon, shas):
    info = anon.model_info("org/base", files_metadata=True)
    assert info.sha == shas["org/base"] and info.author == "org" and info.private is False
    assert info.downloads == 100 and info.likes == 9 and info.gated is False and info.disabled is False
    assert info.config == {"model_type": "bert", "architectures": ["BertModel"]}
    assert info.card_data.license == "mit" and info.card_data.language == ["en", "fr"]
    assert info.tags == ["transformers", "safetensors", "bert", "license:mit", "en", "fr", "tiny"]
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes["config.json"] == len(BERT) and all(s.blob_id and s.lfs is None for s in info.siblings)
    assert anon.model_info("org/base", revision=shas["org/base"]).sha == shas["org/base"]


def test_revisions_persistence_and_meta(tmp_path):
    hub = LocalHub(tmp_path / "root")
    (tmp_path / "v1" / "sub").mkdir(parents=True)
    (tmp_path / "v1" / "weights.bin").write_bytes(b"old weights")
    (tmp_path / "v1" / "sub" / "notes.txt").write_bytes(b"nested")
    (tmp_path / "v1" / "README.md").write_bytes(card(datasets=["old"]))
    copied = hub.publish("org/copied", tmp_path / "v1", message="first")  # default: copies, sources stay free
    assert copied and not any(
        p.stat().st_ino == (tmp_path / "v1" / "weights.bin").stat().st_ino
        for p in (tmp_path / "root" / "org" / "copied" / "blobs").iterdir()
    )
    v1 = hub.publish("org/evolving", tmp_path / "v1", message="first", link=True)
    blob = tmp_path / "root" / "org" / "evolving" / "blobs"
    assert any(p.stat().st_ino == (tmp_path / "v1" / "weights.bin").stat().st_ino for p in blob.iterdir())
    with hub.serve() as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        assert api.model_info("org/evolving").sha == v1
        v2 = hub.publish(
            "org/evolving",
            {"weights.bin": b"new weights", "README.md": card(datasets=["new"])},
            message="second",
            downloads=3,
        )
        assert len({v1, v2}) == 2 and len(v2) == 40
        main = api.model_info("org/evolving")
        old = api.model_info("org/evolving", revision=v1)
        assert (main.sha, old.sha) == (v2, v1)
        assert main.card_data.datasets == ["new"] and old.card_data.datasets == ["old"]
        assert [s.rfilename for s in old.siblings] == ["README.md", "sub/notes.txt", "weights.bin"]
        assert "dataset:new" in main.tags and main.downloads == 3
        kw = dict(endpoint=server.endpoint, token=False)
        assert (
            Path(hf_hub_download("org/evolving", "weights.bin", cache_dir=tmp_path / "c1", **kw)).read_bytes()
            == b"new weights"
        )
        assert (
            Path(
                hf_hub_download("org/evolving", "weights.bin", revision=v1, cache_dir=tmp_path / "c1", **kw)
            ).read_bytes()
            == b"old weights"
        )
        assert (
            Path(
                hf_hub_download("org/evolving", "sub/notes.txt", revision=v1, cache_dir=tmp_path / "c2", **kw)
            ).read_bytes()
            == b"nested"
        )
        with pytest.raises(RemoteEntryNotFoundError):  # the file is gone from main
            hf_hub_download("org/evolving", "sub/notes.txt", cache_dir=tmp_path / "c3", **kw)
        hub.set_meta("org/evolving", downloads=42, tags=["later"])
        info = api.model_info("org/evolving")
        assert info.downloads == 42 and "later" in info.tags and info.sha == v2

    reopened = LocalHub(tmp_path / "root")
    with reopened.serve() as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        assert api.model_info("org/evolving").sha == v2
        assert api.model_info("org/evolving", revision=v1).card_data.datasets == ["old"]
        assert api.model_info("org/evolving").downloads == 42


def test_safetensors_metadata_through_range_requests(anon, fresh, tmp_path):
    meta = anon.get_safetensors_metadata("org/base")
    assert {k: v.shape for k, v in meta.files_metadata["model.safetensors"].tensors.items()} == {
        "embed.weight": [8, 4],
        "layer.0.weight": [4, 4],
    }
    # a header over 100 kB makes the client fetch it with a second range request
    names = {f"encoder.layer.{i}.attention.self.a_rather_long_tensor_name.weight": (1, 2) for i in range(1500)}
    hub, server = fresh
    big = safetensors_file(tmp_path / "big.safetensors", names)
    header_size = int.from_bytes(big.read_bytes()[:8], "little")
    assert header_size > 100_000
    hub.publish("org/many-tensors", {"model.safetensors": big})
    start = len(server.requests)
    api = HfApi(endpoint=server.endpoint, token=False)
    parsed = api.parse_safetensors_file_metadata("org/many-tensors", "model.safetensors")
    assert len(parsed.tensors) == 1500 and all(t.shape == [1, 2] for t in parsed.tensors.values())
    ranges = [(r["range"], r["status"]) for r in server.requests[start:] if r["method"] == "GET"]
    assert ranges == [("bytes=0-100000", 206), (f"bytes=8-{header_size + 7}", 206)]


def test_suffix_and_unsatisfiable_ranges(server):
    url = hf_hub_url("org/ft-sst2", "pytorch_model.bin", endpoint=server.endpoint)
    r = get_session().get(url, headers={"Range": "bytes=-6"})
    assert (r.status_code, r.content, r.headers["Content-Range"]) == (206, b"really", "bytes 4-9/10")
    r = get_session().get(url, headers={"Range": "bytes=4-"})
    assert (r.status_code, r.content) == (206, b"really")
    r = get_session().get(url, headers={"Range": "bytes=10-20"})
    assert r.status_code == 416 and r.headers["Content-Range"] == "bytes */10"
    r = get_session().head(url)
    assert r.status_code == 200 and r.headers["Content-Length"] == "10" and r.content == b""
    assert not any(k.lower().startswith("x-xet") for k in r.headers)


def test_file_exists(anon):
    assert anon.file_exists("org/base", "config.json")
    assert not anon.file_exists("org/base", "nope.json")
    assert not anon.file_exists("org/missing", "config.json")
    assert not anon.file_exists("org/base", "config.json", revision="f" * 40)


def test_not_found_errors(anon, server, tmp_path):
    kw = dict(endpoint=server.endpoint, token=False, cache_dir=tmp_path)
    with pytest.raises(RepositoryNotFoundError) as err:
        anon.model_info("org/missing")
    assert type(err.value) is RepositoryNotFoundError and err.value.response.status_code == 404
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json", **kw)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("org/base", "nope.json", **kw)
    with pytest.raises(RevisionNotFoundError):
        anon.model_info("org/base", revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/base", "config.json", revision="no-such-branch", **kw)


def test_gated_repo(anon, server, tmp_path):
    assert anon.model_info("org/gated").gated == "auto"  # info is public
    with pytest.raises(GatedRepoError) as err:
        hf_hub_download("org/gated", "weights.bin", endpoint=server.endpoint, token=False, cache_dir=tmp_path)
    assert err.value.response.status_code == 401
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "weights.bin", endpoint=server.endpoint, token="wrong", cache_dir=tmp_path)
    path = hf_hub_download("org/gated", "weights.bin", endpoint=server.endpoint, token=TOKEN, cache_dir=tmp_path)
    assert Path(path).read_bytes() == b"gated bytes"
    assert server.requests[-1]["auth"] is True and server.requests[-1]["status"] == 200


def test_private_repo(anon, authed):
    assert "org/private" not in {m.id for m in anon.list_models()}
    assert [m.id for m in authed.list_models(sort="downloads", limit=1)] == ["org/private"]
    with pytest.raises(RepositoryNotFoundError) as err:
        anon.model_info("org/private")
    assert type(err.value) is RepositoryNotFoundError
    assert authed.model_info("org/private").private is True
    assert not anon.file_exists("org/private", "config.json")
    assert authed.file_exists("org/private", "config.json")


def test_server_errors_on_listing_are_retried(anon, hub, server):
    hub.fail("/api/models", status=500, times=2)
    start = len(server.requests)
    assert [m.id for m in anon.list_models(sort="downloads")] == PUBLIC_BY_DOWNLOADS
    first_page = [
        r["status"] for r in server.requests[start:] if r["path"] == "/api/models" and "cursor" not in r["query"]
    ]
    assert first_page == [500, 500, 200]


def test_rate_limit_on_model_info_is_not_retried(anon, hub, server):
    hub.fail("/api/models/org/ba*", status=429, times=1, retry_after=7)
    with pytest.raises(HfHubHTTPError) as err:
        anon.model_info("org/base")
    assert err.value.response.status_code == 429 and err.value.response.headers["Retry-After"] == "7"
    assert anon.model_info("org/base").id == "org/base"
    assert [r["status"] for r in server.requests[-2:]] == [429, 200]


def test_dropped_connection_under_one_chunk_restarts_from_zero(fresh, tmp_path):
    # huggingface_hub reads bodies in 10 MiB chunks (constants.DOWNLOAD_CHUNK_SIZE): bytes of an unfinished chunk
    # are lost with the connection, so a small file is fetched again in full, without a Range header
    hub, server = fresh
    payload = os.urandom(50_000)
    hub.publish("org/flaky", {"model.safetensors": payload})
    hub.truncate("*/org/flaky/resolve/*/model.safetensors", keep=100, times=1)
    start = len(server.requests)
    path = hf_hub_download("org/flaky", "model.safetensors", endpoint=server.endpoint, token=False, cache_dir=tmp_path)
    assert Path(path).read_bytes() == payload
    gets = [(r["range"], r["status"]) for r in server.requests[start:] if r["method"] == "GET"]
    assert gets == [(None, 200), (None, 200)]


def test_dropped_connection_after_a_chunk_resumes_with_a_range_request(fresh, tmp_path):
    hub, server = fresh
    chunk = 10 * 1024 * 1024
    payload = os.urandom(chunk + 300_000)
    sha = hub.publish("org/flaky-big", {"model.safetensors": payload})
    hub.truncate("/org/flaky-big/resolve/*", keep=chunk + 100, times=1)
    start = len(server.requests)
    path = hf_hub_download(
        "org/flaky-big", "model.safetensors", endpoint=server.endpoint, token=False, cache_dir=tmp_path
    )
    assert Path(path).read_bytes() == payload
    gets = [(r["range"], r["status"]) for r in server.requests[start:] if r["method"] == "GET"]
    assert gets == [(None, 200), (f"bytes={chunk}-", 206)]
    (sibling,) = (
        HfApi(endpoint=server.endpoint, token=False)
        .model_info("org/flaky-big", revision=sha, files_metadata=True)
        .siblings
    )
    assert sibling.size == len(payload) and sibling.lfs is not None and sibling.lfs.size == len(payload)
    assert sibling.lfs.pointer_size == 134 and len(sibling.lfs.sha256) == 64


def test_repo_tree_lists_what_model_info_says_paged_and_by_folder(tmp_path, world):
    hub = LocalHub(tmp_path / "root", tree_page_size=2)
    big = os.urandom(10 * 1024 * 1024 + 1)  # at least LFS_THRESHOLD: listed with its lfs sha256
    files = {
        "config.json": BERT,
        "model.safetensors": big,
        "onnx/model.onnx": b"onnx",
        "onnx/sub/notes.txt": b"n",
        "model.gguf": b"gguf",
    }
    v1 = hub.publish("org/tree", files, message="first\n\nbody")
    v2 = hub.publish("org/tree", {**files, "config.json": b"{}"}, message="second")
    with hub.serve() as server:
        api = HfApi(endpoint=server.endpoint, token=False)
        start = len(server.requests)
        tree = list(api.list_repo_tree("org/tree", recursive=True, revision=v1))
        pages = [r for r in server.requests[start:] if r["path"] == f"/api/models/org/tree/tree/{v1}"]
        assert [r["query"].get("cursor") for r in pages] == [None, ["2"], ["4"], ["6"]]  # 7 entries, 2 per page
        assert all(r["query"]["recursive"] == ["true"] for r in pages)  # the Link keeps the original params
        assert [e.path for e in tree] == [
            "config.json",
            "model.gguf",
            "model.safetensors",
            "onnx",
            "onnx/model.onnx",
            "onnx/sub",
            "onnx/sub/notes.txt",
        ]
        assert [e.path for e in tree if isinstance(e, RepoFolder)] == ["onnx", "onnx/sub"]
        siblings = api.model_info("org/tree", revision=v1, files_metadata=True).siblings
        listed = {e.path: (e.size, e.blob_id, e.lfs and e.lfs.sha256) for e in tree if isinstance(e, RepoFile)}
        assert listed == {s.rfilename: (s.size, s.blob_id, s.lfs and s.lfs.sha256) for s in siblings}
        assert listed["model.safetensors"][2] == hashlib.sha256(big).hexdigest()
        assert sorted(api.list_repo_files("org/tree", revision=v1)) == sorted(files)
        # one folder, not recursive; at main by default
        assert [e.path for e in api.list_repo_tree("org/tree")] == [
            "config.json",
            "model.gguf",
            "model.safetensors",
            "onnx",
        ]
        assert [e.path for e in api.list_repo_tree("org/tree", path_in_repo="onnx")] == ["onnx/model.onnx", "onnx/sub"]
        # expand: the last commit that changed each entry
        last = {e.path: e.last_commit for e in api.list_repo_tree("org/tree", recursive=True, expand=True)}
        assert (last["config.json"].oid, last["config.json"].title) == (v2, "second")
        assert (last["onnx"].oid, last["onnx/model.onnx"].oid, last["onnx"].title) == (v1, v1, "first")
        with pytest.raises(RemoteEntryNotFoundError):
            list(api.list_repo_tree("org/tree", path_in_repo="nope"))
        with pytest.raises(RevisionNotFoundError):
            list(api.list_repo_tree("org/tree", revision="0" * 40))
        with pytest.raises(RepositoryNotFoundError):
            list(api.list_repo_tree("org/missing"))
        # a listing that fails is retried by the client; the fault rules apply as to any request
        hub.fail("/api/models/org/tree/tree/*", status=503, times=1)
        start = len(server.requests)
        assert len(list(api.list_repo_tree("org/tree", recursive=True))) == 7
        assert [r["status"] for r in server.requests[start:]][:2] == [503, 200]
    # private repos need the token; a gated repo's tree is public (only its files are gated)
    _, server, shas = world
    anon = HfApi(endpoint=server.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        list(anon.list_repo_tree("org/private"))
    assert [e.path for e in HfApi(endpoint=server.endpoint, token=TOKEN).list_repo_tree("org/private")] == [
        "config.json"
    ]
    assert [e.path for e in anon.list_repo_tree("org/gated", revision=shas["org/gated"])] == [
        "config.json",
        "weights.bin",
    ]


def test_command_runner_sets_hf_endpoint_and_returns_status(tmp_path):
    LocalHub(tmp_path / "root").publish("someone/model", {"config.json": BERT})
    child = (
        "import os, sys; from huggingface_hub import HfApi; "
        "print(os.environ['HF_ENDPOINT']); print([m.id for m in HfApi(token=False).list_models()]); sys.exit(3)"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_ENDPOINT"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelvec.testing.localhub",
            str(tmp_path / "root"),
            "--token",
            "t",
            "--",
            sys.executable,
            "-c",
            child,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    endpoint, models = done.stdout.splitlines()
    assert endpoint.startswith("http://127.0.0.1:") and models == "['someone/model']"


# --- bytes sent, bandwidth, latency and range misbehaviour -------------------------------------------------------


def _get(url: str, **headers: str):
    """One GET on a fresh connection: (status, headers, body); a body cut short gives what arrived."""
    from modelvec.hub.http import httpx2

    body = bytearray()
    with httpx2.Client() as client, client.stream("GET", url, headers=headers) as r:
        try:
            for chunk in r.iter_raw():
                body += chunk
        except httpx2.TransportError:
            pass
        return r.status_code, r.headers, bytes(body)


@pytest.fixture
def payload_repo(fresh):
    hub, server = fresh
    payload = os.urandom(300_000)
    hub.publish("org/bytes", {"model.safetensors": payload})
    return hub, server, payload, hf_hub_url("org/bytes", "model.safetensors", endpoint=server.endpoint)


def test_bytes_sent_are_counted_for_full_range_and_head_answers(payload_repo):
    hub, server, payload, url = payload_repo
    start = len(server.requests)
    assert _get(url)[2] == payload
    assert _get(url, Range="bytes=10-19")[2] == payload[10:20]
    assert get_session().head(url).status_code == 200
    assert _get(hf_hub_url("org/bytes", "nope.json", endpoint=server.endpoint))[0] == 404
    records = [(r["method"], r["range"], r["status"], r["bytes"]) for r in server.requests[start:]]
    assert records[:3] == [("GET", None, 200, 300_000), ("GET", "bytes=10-19", 206, 10), ("HEAD", None, 200, 0)]
    assert records[3][3] > 0  # the JSON body of the 404 is counted in its record
    assert server.bytes_sent("/org/bytes/resolve/*/model.safetensors") == 300_010
    assert server.bytes_sent("/org/bytes/*") == 300_010 + records[3][3]
    assert server.bytes_sent("*/other/*") == 0
    hub.fail("*/model.safetensors", kind="short", after_bytes=1234, times=1)
    assert len(_get(url)[2]) == 1234 and server.requests[-1]["bytes"] == 1234


def test_bandwidth_parsing_and_the_command_line_flag(tmp_path):
    from modelvec.testing.localhub import main, parse_bandwidth

    assert parse_bandwidth("1gbit") == 125e6 and parse_bandwidth("100mbit") == 12.5e6
    assert parse_bandwidth("50MB") == 50e6 and parse_bandwidth("20MiB/s") == 20 * 2**20
    assert parse_bandwidth("8e6") == parse_bandwidth("64 Mbps") == 8e6
    for bad in ("fast", "0", "-1", "1 XB"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "root"), "--bandwidth", "fast"])
    assert exit_.value.code == 2


def test_bandwidth_is_one_link_shared_by_parallel_downloads(tmp_path):
    import threading
    import time

    hub = LocalHub(tmp_path / "root")
    payload = os.urandom(2_000_000)
    hub.publish("org/paced", {"a.bin": payload[:1_000_000], "b.bin": payload[1_000_000:], "c.bin": payload})
    with hub.serve(bandwidth="8MB") as server:
        assert server.bandwidth == 8e6
        url = lambda name: hf_hub_url("org/paced", name, endpoint=server.endpoint)
        began = time.monotonic()
        assert _get(url("c.bin"))[2] == payload
        assert time.monotonic() - began >= 0.2  # 2 MB at 8 MB/s: 0.25 s, less one 64 KiB burst
        bodies = {}
        threads = [threading.Thread(target=lambda n=n: bodies.update({n: _get(url(n))[2]})) for n in ("a.bin", "b.bin")]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - began >= 0.2  # 2 x 1 MB share the 8 MB/s: 0.25 s together, not 0.125
        assert bodies == {"a.bin": payload[:1_000_000], "b.bin": payload[1_000_000:]}
        assert server.bytes_sent("*/org/paced/*") == 4_000_000


def test_latency_delays_every_answer(tmp_path):
    import time

    hub = LocalHub(tmp_path / "root")
    hub.publish("org/far", {"config.json": BERT})
    with hub.serve(latency=0.15) as server:
        began = time.monotonic()
        assert get_session().head(hf_hub_url("org/far", "config.json", endpoint=server.endpoint)).status_code == 200
        assert HfApi(endpoint=server.endpoint, token=False).model_info("org/far").id == "org/far"
        assert time.monotonic() - began >= 0.3


def test_ignore_range_answers_the_whole_file(payload_repo):
    hub, server, payload, url = payload_repo
    hub.fail("*/model.safetensors", kind="ignore-range", times=1)
    assert _get(url)[2] == payload and server.requests[-1]["fault"] is None  # no Range: the rule waits
    status, headers, body = _get(url, Range="bytes=10-19")
    assert (status, body, headers.get("Content-Range")) == (200, payload, None)
    assert int(headers["Content-Length"]) == len(payload)
    assert (server.requests[-1]["fault"], server.requests[-1]["bytes"]) == ("ignore-range", len(payload))
    assert _get(url, Range="bytes=10-19")[:1] == (206,)  # times=1: used up


def test_wrong_range_lies_with_honest_looking_headers(payload_repo):
    hub, server, payload, url = payload_repo
    size = len(payload)
    hub.fail("*/model.safetensors", kind="wrong-range", times=2)
    status, headers, body = _get(url, Range="bytes=10-19")
    assert (status, headers["Content-Range"], body) == (206, f"bytes 10-19/{size}", payload[11:21])
    assert server.requests[-1]["fault"] == "wrong-range"
    status, headers, body = _get(url, Range=f"bytes={size - 10}-")  # kept inside the file: nothing to shift to
    assert (headers["Content-Range"], body) == (f"bytes {size - 10}-{size - 1}/{size}", payload[-10:])
    hub.fail("*/model.safetensors", kind="wrong-range", value=-7, times=1)
    assert _get(url, Range="bytes=100-149")[2] == payload[93:143]


def test_bad_content_range_names_another_range(payload_repo):
    hub, server, payload, url = payload_repo
    hub.fail("*/model.safetensors", kind="bad-content-range", value=5, times=1)
    status, headers, body = _get(url, Range="bytes=10-19")
    assert (status, headers["Content-Range"], body) == (206, f"bytes 15-24/{len(payload)}", payload[10:20])
    assert server.requests[-1]["fault"] == "bad-content-range"


def test_body_faults_work_on_range_answers(payload_repo):
    hub, server, payload, url = payload_repo
    hub.fail("*/model.safetensors", kind="short", after_bytes=4, times=1)
    status, headers, body = _get(url, Range="bytes=100-199")
    assert (status, headers["Content-Length"], body) == (206, "100", payload[100:104])
    assert server.requests[-1]["bytes"] == 4
    hub.fail("*/model.safetensors", kind="reset", after_bytes=30, times=1)
    status, _, body = _get(url, Range="bytes=100-199")
    assert status == 206 and payload[100:130].startswith(body) and server.requests[-1]["bytes"] == 30
    hub.fail("*/model.safetensors", kind="corrupt", after_bytes=150, times=2)  # an offset in the file
    body = _get(url, Range="bytes=100-199")[2]
    assert body[:50] == payload[100:150] and body[50] == payload[150] ^ 0xFF and body[51:] == payload[151:200]
    assert _get(url, Range="bytes=0-99")[2] == payload[:100]  # the offset is not in this range: intact
    hub.fail("*/model.safetensors", kind="slow", after_bytes=10, delay=0.1, times=1)
    assert _get(url, Range="bytes=100-199")[2] == payload[100:200]
    assert server.requests[-1]["fault"] == "slow" and server.requests[-1]["bytes"] == 100


def test_a_malformed_request_line_is_answered_400_without_a_traceback(server, capfd):
    """A client that sends garbage gets the standard library's 400 page; the server logs it and prints nothing."""
    import socket

    host, port = server.endpoint.split("://", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"GARBAGE\r\n\r\n")
        answer = conn.recv(200)
    assert b"400" in answer or b"Bad request" in answer
    assert "Traceback" not in capfd.readouterr().err
