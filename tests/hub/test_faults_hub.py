"""Hostile files and network faults, through the real huggingface_hub client against a local Hub.

A. Hostile files: pickles that would run code, remote code in config.json, repository ids, revisions, file names
   and response headers meant to escape the cache. Nothing runs, nothing outside the cache is created or deleted,
   such models are recorded as failed with a one-line reason, and the run goes on.
B. Network faults (LocalHub.fail kinds): 5xx, 429 with Retry-After, stalls past the client timeout, connections
   reset or closed mid-body, HEADs announcing a wrong size or ETag, corrupted bodies, a download killed midway.
   Transient ones are retried and give the vector of the local folder; persistent ones fail the model with the
   reason in one line; no partly written file is ever read as a checkpoint.

Nothing of modelvec's is mocked; huggingface_hub's download timeout (a module constant it reads at each call) is
lowered so that stalls are quick to provoke.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import constants as hf_constants
from safetensors.torch import load_file, save_file

from builders import planted_finetune
from modelvec.core.errors import FetchError
from modelvec.hub.cache import release
from modelvec.hub.client import HubSettings
from modelvec.hub.download import fetch
from modelvec.read import Checkpoint
from modelvec.represent import DeltaEmbedder, Representation
from modelvec.run import discover, embed
from modelvec.store import Store
from modelvec.testing.localhub import LocalHub

#: These faults hit whole-file downloads (what a representation reading every row fetches); the byte ranges of the
#: default's partial downloads meet the same faults in tests/hub/test_ranges.py.
WHOLE = Representation(rows=1)

BASE = "google-bert/bert-base-uncased"
SRC = Path(__file__).resolve().parents[2] / "src" / "modelvec"
BIG = 10 * 1024 * 1024 + 300_000  # over huggingface_hub's 10 MiB read chunk, so a resumed download shows a Range


def card(base: str = BASE) -> bytes:
    return f"---\nbase_model: {base}\ndatasets:\n- imdb\n---\n# a fine-tune\n".encode()


def files_of(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file() and p.name != "README.md"}


class Evil:
    """A pickle that calls ``func(*args)`` when loaded."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


# --- the world ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tiny_bert, tmp_path_factory):
    """Hub repos (good ones, one per fault case, and hostile ones) and what was published in each."""
    root = tmp_path_factory.mktemp("faults-world")
    hub = LocalHub(root / "hub")
    markers = root / "markers"
    markers.mkdir()
    made: dict[str, Path] = {}  # repo -> the local folder its weights came from
    published: dict[str, dict[str, bytes | Path]] = {}

    def pub(repo: str, files: dict, **kw) -> str:
        published[repo] = files
        return hub.publish(repo, files, **kw)

    pub(BASE, files_of(tiny_bert), downloads=10**6)
    for i, name in enumerate(
        ["ok", *(f"t{n}" for n in range(1, 11)), *(f"p{n}" for n in range(1, 6)), "remote-code-ok"]
    ):
        repo = f"good/ft-{name}"
        made[repo] = planted_finetune(tiny_bert, root / "src" / name, seed=100 + i)
        pub(repo, {**files_of(made[repo]), "README.md": card()}, downloads=1000 - i)
    # big files: a read chunk of huggingface_hub is 10 MiB, resuming shows only past it
    state = load_file(str(made["good/ft-ok"] / "model.safetensors"))
    state["cls.extra.weight"] = torch.arange(BIG // 4, dtype=torch.float32).reshape(-1, 4)
    big = root / "src" / "big"
    big.mkdir()
    save_file(state, str(big / "model.safetensors"))
    (big / "config.json").write_bytes((tiny_bert / "config.json").read_bytes())
    for name in ("big-stall", "big-reset", "big-short", "big-killed"):
        made[f"good/ft-{name}"] = big
        pub(f"good/ft-{name}", {**files_of(big), "README.md": card()}, link=True, downloads=10)

    # A1: pickles that run code when loaded without weights_only
    weights = load_file(str(made["good/ft-ok"] / "model.safetensors"))
    evil_dir = root / "evil"
    evil_dir.mkdir()
    torch.save({**weights, "evil": Evil(open, str(markers / "pickle-open"), "w")}, evil_dir / "open.bin")
    torch.save(
        {**weights, "evil": Evil(os.system, f"touch {markers / 'pickle-system'}")},
        evil_dir / "legacy.bin",
        _use_new_zipfile_serialization=False,
    )
    (evil_dir / "raw.bin").write_bytes(pickle.dumps(Evil(os.system, f"touch {markers / 'pickle-raw'}"), protocol=2))
    config = (tiny_bert / "config.json").read_bytes()
    for name in ("open", "legacy", "raw"):
        pub(
            f"mallory/ft-pickle-{name}",
            {"config.json": config, "pytorch_model.bin": evil_dir / f"{name}.bin", "README.md": card()},
        )

    # A3: custom code in config.json's auto_map, which would leave a marker if it were ever imported
    remote = json.loads(config)
    remote["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}
    code = f"open({str(markers / 'remote-code')!r}, 'w').write('ran')\n".encode()
    pub(
        "good/ft-remote-code-ok",
        {
            "config.json": json.dumps(remote).encode(),
            "model.safetensors": made["good/ft-remote-code-ok"] / "model.safetensors",
            "modeling_evil.py": code,
            "configuration_evil.py": code,
            "README.md": card(),
        },
    )
    return hub, made, published, markers


@pytest.fixture()
def server(world):
    hub = world[0]
    with hub.serve() as srv:
        yield srv
    hub.clear_faults()


@pytest.fixture()
def hub_settings(server, tmp_path, monkeypatch):
    # stalls are provoked with a short read timeout (huggingface_hub reads this constant at each download)
    monkeypatch.setattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    return HubSettings(
        endpoint=server.endpoint,
        cache_dir=str(tmp_path / "cache"),
        token=False,
        retries=2,
        backoff=0.05,
        max_wait=5.0,
        timeout=0.5,
    )


@pytest.fixture(scope="module")
def reference(tiny_bert):
    """The vector of a local folder, computed without the Hub."""
    embedder = DeltaEmbedder.from_representation(WHOLE, "cpu").fit(Checkpoint(tiny_bert))
    cache: dict[Path, np.ndarray] = {}

    def vector(folder: Path) -> np.ndarray:
        if folder not in cache:
            cache[folder] = embedder.embed_one(Checkpoint(folder))
        return cache[folder]

    return vector


def entries(hub_settings: HubSettings, *names: str):
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    return [found[n] for n in names]


def tree(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple]:
    """Every path under ``root`` (not following links) with its mode, and a file's size and mtime, except under
    ``skip`` (a folder's own mtime changes with its entries, which are listed themselves)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in skip]
        for name in dirnames + filenames:
            st = os.lstat(here / name)
            is_dir = (here / name).is_dir() and not (here / name).is_symlink()
            out[str(here / name)] = (st.st_mode,) if is_dir else (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def assert_snapshots_intact(cache: Path, published: dict[str, dict]) -> dict[str, int]:
    """Every file in every cached snapshot has exactly the published bytes; how many files each repo has."""
    checked: dict[str, int] = {}
    for snapshot in cache.glob("models--*/snapshots/*"):
        repo = snapshot.parent.parent.name[len("models--") :].replace("--", "/")
        for path in snapshot.rglob("*"):
            if path.is_dir():
                continue
            rel = path.relative_to(snapshot).as_posix()
            source = published[repo][rel]
            want = source if isinstance(source, bytes) else Path(source).read_bytes()
            assert path.read_bytes() == want, f"{repo}/{rel} differs from what was published"
            checked[repo] = checked.get(repo, 0) + 1
    return checked


def one_line(reason: str) -> str:
    assert reason and "\n" not in reason, repr(reason)
    return reason


# --- A1. pickles ------------------------------------------------------------------------------------------------------


def test_pickled_code_in_a_bin_never_runs_and_the_run_goes_on(world, server, hub_settings, tmp_path, reference):
    hub, made, published, markers = world
    bad = ["mallory/ft-pickle-open", "mallory/ft-pickle-legacy", "mallory/ft-pickle-raw"]
    db = Store(tmp_path / "store" / "s.duckdb")
    result = embed(
        BASE,
        entries(hub_settings, *bad, "good/ft-ok"),
        store=db,
        hub_settings=hub_settings,
        representation=WHOLE,
        keep_weights=False,
    )
    assert not list(markers.iterdir()), "a pickle ran code"
    assert result.embedded == ["good/ft-ok"]
    assert np.allclose(result.vectors[0], reference(made["good/ft-ok"]), atol=1e-6)
    assert set(result.failed) == set(bad)
    for name in bad:
        assert "UnpicklingError" in one_line(result.failed[name]) or "weights" in result.failed[name].lower()
    recorded = db.reads.failures().set_index("model")["error"]
    assert {name: recorded[name] for name in bad} == {name: result.failed[name] for name in bad}
    db.close()


# --- A3. remote code --------------------------------------------------------------------------------------------------


def test_remote_code_in_config_is_never_fetched_or_run(world, server, hub_settings, tmp_path, reference):
    hub, made, published, markers = world
    db = Store(tmp_path / "store" / "s.duckdb")
    result = embed(
        BASE, entries(hub_settings, "good/ft-remote-code-ok"), store=db, hub_settings=hub_settings, representation=WHOLE
    )
    assert result.embedded == ["good/ft-remote-code-ok"] and not result.failed
    assert np.allclose(result.vectors[0], reference(made["good/ft-remote-code-ok"]), atol=1e-6)
    assert not (markers / "remote-code").exists()
    asked = {r["path"].rsplit("/", 1)[-1] for r in server.requests if "/resolve/" in r["path"]}
    assert not asked & {"modeling_evil.py", "configuration_evil.py"}
    assert not any("transformers_modules" in m for m in sys.modules)
    db.close()


def test_source_never_trusts_remote_code_and_loads_torch_weights_only():
    """Every call in src/modelvec: no trust_remote_code other than a literal False; every torch.load has
    weights_only=True; no pickle.load(s), no numpy load with allow_pickle=True."""
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            kw = {k.arg: k.value for k in node.keywords}
            if any(k.arg is None for k in node.keywords) and "load" in ast.unparse(node.func):
                problems.append(f"{where}: **kwargs hide what a load is told")
            trc = kw.get("trust_remote_code")
            if trc is not None and not (isinstance(trc, ast.Constant) and trc.value is False):
                problems.append(f"{where}: trust_remote_code={ast.unparse(trc)}")
            func = ast.unparse(node.func)
            if func in ("torch.load", "load") or func.endswith(".torch.load"):
                wo = kw.get("weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    problems.append(f"{where}: {func}(...) without weights_only=True")
            if func in ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads", "dill.load"):
                problems.append(f"{where}: {func}")
            ap = kw.get("allow_pickle")
            if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                problems.append(f"{where}: allow_pickle={ast.unparse(ap)}")
    assert not problems, problems
    # and the scan does see the loads that are there
    assert "weights_only=True" in (SRC / "read" / "checkpoint.py").read_text()


# --- A2. names that try to escape the cache --------------------------------------------------------------------------


def hostile_names(outside: Path) -> list[str]:
    return [
        "../../evil.safetensors",
        f"{outside}/abs.safetensors",
        "a/../../x.safetensors",
        "sub\\..\\..\\x.safetensors",
        "..\\..\\evil.safetensors",
        "nul\x00.safetensors",
        "x" * 300 + ".safetensors",
        "C:evil.safetensors",
    ]


def test_hostile_names_ids_revisions_and_headers_stay_inside_the_cache(
    world, server, hub_settings, tmp_path, tmp_path_factory, reference
):
    hub, made, published, markers = world
    outside = tmp_path_factory.getbasetemp()  # everything the tests can see: a write anywhere in it is caught
    cache = Path(hub_settings.cache_dir)
    victim = outside / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "canary.txt").write_text("keep me")
    weights = made["good/ft-ok"] / "model.safetensors"
    config = (made["good/ft-ok"] / "config.json").read_bytes()
    names = hostile_names(outside)
    extra: dict[str, bytes | Path] = {}

    # a listing whose siblings carry hostile names (published as such: the Hub would serve them)
    sib = "mallory/ft-evil-siblings"
    sib_files = {
        "config.json": config,
        "model.safetensors": weights,
        "README.md": card(),
        **{n: weights for n in names},
    }
    hub.publish(sib, sib_files, unsafe_paths=True)
    extra[sib] = sib_files
    # sharded checkpoints whose index names a hostile shard (each one served under that name)
    index_repos = []
    for i, name in enumerate(names):
        repo = f"mallory/ft-evil-index-{i}"
        keys = load_file(str(weights)).keys()
        hub.publish(
            repo,
            {
                "config.json": config,
                "README.md": card(),
                name: weights,
                "model.safetensors.index.json": json.dumps({"weight_map": {k: name for k in keys}}).encode(),
            },
            unsafe_paths=True,
        )
        index_repos.append(repo)
    # ids and revisions the listing lies about
    forged_ids = {
        "mallory/ft-forged-1": "../x",
        "mallory/ft-forged-2": "a/../../b",
        "mallory/ft-forged-3": "a/b/c",
        "mallory/ft-forged-4": f"{outside}/abs",
    }
    forged_shas = {
        "mallory/ft-forged-sha-1": "../../../../victim",
        "mallory/ft-forged-sha-2": "../../../../pwned-ref",
        "mallory/ft-forged-sha-3": f"{outside}/abs-ref",
    }
    for repo in [*forged_ids, *forged_shas]:
        extra[repo] = {**files_of(made["good/ft-ok"]), "README.md": card()}
        hub.publish(repo, extra[repo])
    # response headers that huggingface_hub turns into cache paths
    header_repos = {
        "mallory/ft-etag-up": ("etag", '"../../../../escape-etag"'),
        "mallory/ft-etag-abs": ("etag", f'"{outside}/abs-etag"'),
        "mallory/ft-commit-up": ("commit", "../../../../escape-commit"),
    }
    for repo in header_repos:
        extra[repo] = {**files_of(made["good/ft-ok"]), "README.md": card()}
        hub.publish(repo, extra[repo])
    # a name-search candidate (no card) whose listed sha is a path: discovery downloads its config.json
    candidate = "mallory/bert-base-uncased-forged-sha"
    extra[candidate] = files_of(made["good/ft-ok"])
    hub.publish(candidate, extra[candidate])
    nocfg = "mallory/ft-commit-404"  # listed with a config.json it does not have: the 404 carries the commit
    extra[nocfg] = {"model.safetensors": weights, "README.md": card()}
    hub.publish(nocfg, extra[nocfg])

    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    # the forged-sha repos were fetched once at their real revision, so their snapshots folder exists
    for repo in forged_shas:
        fetch(repo, found[repo].sha, None, hub_settings)
    for repo, fake in forged_ids.items():
        hub.forge(repo, id=fake)
    for repo, fake in forged_shas.items():
        hub.forge(repo, sha=fake)
    hub.forge(candidate, sha="../../../pwned-discovery")
    for repo, (kind, value) in header_repos.items():
        hub.fail(f"/{repo}/resolve/*", kind=kind, value=value, times=None)
    hub.fail(f"/{nocfg}/resolve/*/config.json", kind="commit", value="../../../../escape-404", times=None)
    hub.forge(nocfg, siblings=["config.json", "model.safetensors", "README.md"])

    skip = (cache, tmp_path / "store")
    before = tree(outside, skip)
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    todo = [
        found[sib],
        *(found[r] for r in index_repos),
        *(found[f] for f in forged_ids.values()),
        *(found[r] for r in forged_shas),
        *(found[r] for r in header_repos),
        found[nocfg],
        found["good/ft-ok"],
    ]
    db = Store(tmp_path / "store" / "s.duckdb")
    result = embed(BASE, todo, store=db, hub_settings=hub_settings, representation=WHOLE, keep_weights=False)
    after = tree(outside, skip)
    assert not found[candidate].kept and "unsafe name from the Hub" in one_line(found[candidate].reason)

    assert {p: before[p] for p in before if p not in after} == {}, "deleted outside the cache"
    assert {p: after[p] for p in after if p not in before} == {}, "created outside the cache"
    assert {p for p in before if p in after and after[p] != before[p]} == set(), "changed outside the cache"
    assert (victim / "canary.txt").read_text() == "keep me"
    assert sorted(result.embedded) == sorted([sib, "good/ft-ok"])
    assert np.allclose(
        result.vectors[list(result.metadata["model"]).index(sib)], reference(made["good/ft-ok"]), atol=1e-6
    )
    failed = {name: one_line(reason) for name, reason in result.failed.items()}
    assert set(failed) == {e.model for e in todo} - {sib, "good/ft-ok"}
    for repo in index_repos:
        assert "refused the file name" in failed[repo], failed[repo]
    for fake in forged_ids.values():
        assert "not a valid Hub repository id" in failed[fake], failed[fake]
    for repo in forged_shas:
        assert "unusable revision" in failed[repo], failed[repo]
    for repo in header_repos:
        assert "unsafe name from the Hub" in failed[repo], failed[repo]
    # config.json comes by one GET whose headers never become a path: its 404 is a missing file, however it is headed
    assert "file not found in the repository" in failed[nocfg], failed[nocfg]
    recorded = db.reads.failures().set_index("model")["error"]
    assert {m: recorded[m] for m in failed} == failed
    # hostile names were never even asked for
    asked = [r["path"].split("/resolve/", 1) for r in server.requests if "/resolve/" in r["path"]]
    asked = {(repo[1:], rest.split("/", 1)[1]) for repo, rest in asked}
    assert {name for repo, name in asked if repo == sib} == {"config.json", "model.safetensors"}
    # a sharded checkpoint's index is refused before any shard it names is fetched (the config may come first)
    assert {name for repo, name in asked if repo in index_repos} <= {"model.safetensors.index.json", "config.json"}
    assert {name for repo, name in asked if repo in index_repos} >= {"model.safetensors.index.json"}
    db.close()
    published.update(extra)
    assert assert_snapshots_intact(cache, published)


def test_release_never_deletes_outside_the_repository(tmp_path):
    cache = tmp_path / "cache"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "canary.txt").write_text("keep me")
    (cache / "models--a--b" / "snapshots").mkdir(parents=True)
    hub_settings = HubSettings(cache_dir=str(cache))
    for revision in ["../../../victim", str(victim), "main/../../../../victim"]:
        assert release("a/b", revision, hub_settings) == 0
    for repo_id in ["../x", "a/../../b", "a/b/c"]:
        assert release(repo_id, "0" * 40, hub_settings) == 0
    # a snapshot that is a link to a folder elsewhere is not followed
    (cache / "models--a--b" / "snapshots" / ("1" * 40)).symlink_to(victim, target_is_directory=True)
    assert release("a/b", "1" * 40, hub_settings) == 0
    # links in a snapshot to files or folders outside the repository: the links go, what they point to stays
    snapshot = cache / "models--a--b" / "snapshots" / ("2" * 40)
    snapshot.mkdir()
    (snapshot / "model.safetensors").symlink_to(victim / "canary.txt")
    (snapshot / "sub").symlink_to(victim, target_is_directory=True)
    assert release("a/b", "2" * 40, hub_settings) == 0 and not snapshot.exists()
    assert sorted(p.name for p in victim.iterdir()) == ["canary.txt"]
    assert (victim / "canary.txt").read_text() == "keep me"


# --- B1. transient faults --------------------------------------------------------------------------------------------


def settle(server, kind: str, count: int, timeout: float = 10.0) -> None:
    """Wait until ``count`` answers with a fault of ``kind`` are logged (a stalled answer is logged when sent)."""
    deadline = time.monotonic() + timeout
    while sum(r["fault"] == kind for r in list(server.requests)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def gets(server, repo: str, name: str = "model.safetensors") -> list[dict]:
    return [
        r
        for r in server.requests
        if r["method"] == "GET" and r["path"].startswith(f"/{repo}/resolve/") and r["path"].endswith("/" + name)
    ]


def test_transient_faults_are_retried_and_give_the_local_vectors(world, server, hub_settings, tmp_path, reference):
    hub, made, published, markers = world
    other = made["good/ft-p1"] / "model.safetensors"  # bytes of another file, announced by a wrong ETag
    wrong_etag = '"' + hashlib.sha256(other.read_bytes()).hexdigest() + '"'
    w = "resolve/*/model.safetensors"
    cases = {
        "good/ft-t1": dict(pattern=w, status=500, times=2, methods=["GET"]),  # 5xx on the body: modelvec retries
        "good/ft-t2": dict(pattern=w, status=429, times=1, retry_after=1, methods=["GET"]),  # huggingface_hub waits
        "good/ft-t3": dict(pattern=w, kind="slow", delay=2.0, times=1, methods=["GET"]),  # no answer in time
        "good/ft-t4": dict(pattern=w, kind="reset", after_bytes=1000, times=1),  # TCP reset mid-body
        "good/ft-t5": dict(pattern=w, kind="size", times=1),  # HEAD announces one byte more than is sent
        "good/ft-t6": dict(pattern=w, kind="etag", value=wrong_etag, times=1),  # HEAD announces other bytes' sha256
        "good/ft-t7": dict(pattern=w, kind="corrupt", after_bytes=5000, times=1),  # one byte of the body inverted
        "good/ft-t8": dict(pattern=w, kind="slow", delay=2.0, times=1, methods=["HEAD"]),  # metadata past timeout
        "good/ft-t9": dict(pattern="", kind="slow", delay=2.0, times=1),  # model_info past the timeout
        "good/ft-big-stall": dict(pattern=w, kind="slow", after_bytes=BIG - 200_000, delay=2.0, times=1),
        "good/ft-big-reset": dict(pattern=w, kind="reset", after_bytes=BIG - 200_000, times=1),
        "good/ft-big-short": dict(pattern=w, kind="short", after_bytes=BIG - 200_000, times=1),
        "good/ft-t10": dict(pattern="", status=429, retry_after=1, times=1),  # model_info rate-limited
    }
    for repo, spec in cases.items():
        spec = dict(spec)
        pattern = spec.pop("pattern")
        hub.fail(f"/{repo}/{pattern}" if pattern else f"/api/models/{repo}", **spec)
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    by_id = ["good/ft-t9", "good/ft-t10"]  # named by id: embed asks the Hub for their model_info
    todo = [found[r] for r in cases if r not in by_id] + by_id
    db = Store(tmp_path / "store" / "s.duckdb")
    start = time.monotonic()
    result = embed(BASE, todo, store=db, hub_settings=hub_settings, representation=WHOLE)
    took = time.monotonic() - start
    assert not result.failed, result.failed
    assert sorted(result.embedded) == sorted(cases)
    rows = list(result.metadata["model"])
    for repo in cases:
        assert np.allclose(result.vectors[rows.index(repo)], reference(made[repo]), atol=1e-6), repo
    intact = assert_snapshots_intact(Path(hub_settings.cache_dir), published)
    assert {repo: intact.get(repo) for repo in [*cases, BASE]} == {repo: 2 for repo in [*cases, BASE]}

    def statuses(repo):
        return [(r["status"], r["range"], r["fault"]) for r in gets(server, repo)]

    settle(server, "slow", 4)

    assert statuses("good/ft-t1") == [(500, None, "status"), (500, None, "status"), (200, None, None)]
    limited, after = gets(server, "good/ft-t2")
    assert limited["status"] == 429 and after["time"] - limited["time"] >= 1.0  # Retry-After: 1 was honoured
    # a stalled answer is logged when it is finally sent, after the retry's: compare as sets
    assert sorted(statuses("good/ft-t3"), key=str) == sorted([(200, None, "slow"), (200, None, None)], key=str)
    assert statuses("good/ft-t4") == [(200, None, "reset"), (200, None, None)]  # no resume after a reset
    for repo, kind in [("good/ft-t5", "size"), ("good/ft-t6", "etag"), ("good/ft-t7", "corrupt")]:
        assert [s[2] for s in statuses(repo)] == ([None, None] if kind != "corrupt" else [kind, None]), repo
    heads = [
        r
        for r in server.requests
        if r["method"] == "HEAD" and r["path"].startswith("/good/ft-t5/") and r["path"].endswith("model.safetensors")
    ]
    assert [r["fault"] for r in heads] == ["size", None]
    heads = [
        r
        for r in server.requests
        if r["method"] == "HEAD" and r["path"].startswith("/good/ft-t8/") and r["path"].endswith("model.safetensors")
    ]
    assert sorted(str(r["fault"]) for r in heads) == ["None", "slow"]
    # past 10 MiB, a stalled or cleanly closed body resumes with a Range; a reset one starts over
    assert sorted(statuses("good/ft-big-stall"), key=str) == sorted(
        [(200, None, "slow"), (206, f"bytes={10 * 1024 * 1024}-", None)], key=str
    )
    assert statuses("good/ft-big-short") == [(200, None, "short"), (206, f"bytes={10 * 1024 * 1024}-", None)]
    assert statuses("good/ft-big-reset") == [(200, None, "reset"), (200, None, None)]
    infos = [r for r in server.requests if r["path"] == "/api/models/good/ft-t10"]
    assert [r["status"] for r in infos] == [429, 200] and infos[1]["time"] - infos[0]["time"] >= 1.0
    assert sorted(str(r["fault"]) for r in server.requests if r["path"] == "/api/models/good/ft-t9") == ["None", "slow"]
    assert took < 30, took
    db.close()


# --- B2. persistent faults -------------------------------------------------------------------------------------------


def test_persistent_faults_fail_the_model_in_one_line_and_the_run_goes_on(
    world, server, hub_settings, tmp_path, reference
):
    hub, made, published, markers = world
    w = "resolve/*/model.safetensors"
    cases = {
        "good/ft-p1": (dict(pattern=w, status=500, methods=["GET"]), "HTTP 500 from the Hub after 3 tries"),
        "good/ft-p2": (dict(pattern="", kind="slow", delay=1.5), "timed out after 3 tries (ReadTimeout)"),
        "good/ft-p3": (dict(pattern=w, kind="reset", after_bytes=1000), "connection failed after 3 tries (ReadError"),
        "good/ft-p4": (dict(pattern=w, kind="size"), "download of the wrong size after 3 tries: Consistency check"),
        "good/ft-p5": (
            dict(pattern=w, kind="corrupt", after_bytes=100),
            "downloaded bytes do not match their sha256 after 3 tries",
        ),
    }
    for repo, (spec, _) in cases.items():
        spec = dict(spec)
        pattern = spec.pop("pattern")
        hub.fail(f"/{repo}/{pattern}" if pattern else f"/api/models/{repo}", times=None, **spec)
    found = {e.model: e for e in discover(BASE, hub_settings=hub_settings).entries}
    todo = [found[r] for r in cases if r != "good/ft-p2"] + ["good/ft-p2", found["good/ft-ok"]]
    db = Store(tmp_path / "store" / "s.duckdb")
    result = embed(BASE, todo, store=db, hub_settings=hub_settings, representation=WHOLE)
    assert result.embedded == ["good/ft-ok"]
    assert np.allclose(result.vectors[0], reference(made["good/ft-ok"]), atol=1e-6)
    assert set(result.failed) == set(cases)
    for repo, (_, reason) in cases.items():
        assert reason in one_line(result.failed[repo]), (repo, result.failed[repo])
    recorded = db.reads.failures().set_index("model")["error"]
    assert {m: recorded[m] for m in cases} == result.failed
    assert [r["status"] for r in gets(server, "good/ft-p1")] == [500, 500, 500]  # retries=2: three tries
    # nothing half-written or corrupt reached a snapshot
    assert assert_snapshots_intact(Path(hub_settings.cache_dir), published)["good/ft-ok"] == 2
    for repo in cases:
        assert not list(Path(hub_settings.cache_dir).glob(f"models--{repo.replace('/', '--')}/snapshots/*/model*"))
    # a network failure is not remembered as a failure of the weights: with the Hub healthy, the next run embeds
    hub.clear_faults()
    again = embed(
        BASE,
        [found[r] for r in cases if r != "good/ft-p2"] + ["good/ft-p2"],
        store=db,
        hub_settings=hub_settings,
        representation=WHOLE,
    )
    assert sorted(again.embedded) == sorted(cases) and not again.failed
    db.close()


# --- B3. killed mid-download ------------------------------------------------------------------------------------------


def test_a_download_killed_midway_leaves_no_partial_file_and_a_rerun_completes(
    world, server, hub_settings, tmp_path, reference
):
    hub, made, published, markers = world
    repo = "good/ft-big-killed"  # over one 10 MiB read chunk, so the killed download has written some bytes
    sha = entries(hub_settings, repo)[0].sha
    hub.fail(f"/{repo}/resolve/*/model.safetensors", kind="slow", after_bytes=BIG - 200_000, delay=60, times=1)
    child = (
        "import sys; from modelvec.hub.download import fetch; from modelvec.hub.client import HubSettings; "
        f"fetch({repo!r}, {sha!r}, None, HubSettings(endpoint={server.endpoint!r}, "
        f"cache_dir={hub_settings.cache_dir!r}, token=False))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while not [r for r in gets(server, repo) if r["fault"] == "slow"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        blobs = Path(hub_settings.cache_dir) / f"models--{repo.replace('/', '--')}" / "blobs"
        while not any(p.name.endswith(".incomplete") and p.stat().st_size > 0 for p in blobs.iterdir()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # snapshot_download fetches files concurrently: the small config may still be landing while the weights stall
        config = Path(hub_settings.cache_dir) / f"models--{repo.replace('/', '--')}" / "snapshots" / sha / "config.json"
        while not config.is_file():
            assert time.monotonic() < deadline, "config.json never reached the snapshot"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    snapshot = Path(hub_settings.cache_dir) / f"models--{repo.replace('/', '--')}" / "snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json"]  # the weights are absent, not short
    assert assert_snapshots_intact(Path(hub_settings.cache_dir), published)[repo] == 1
    leftovers = [p for p in blobs.iterdir() if p.name.endswith(".incomplete")]
    assert len(leftovers) == 1 and 0 < leftovers[0].stat().st_size < (made[repo] / "model.safetensors").stat().st_size
    db = Store(tmp_path / "store" / "s.duckdb")
    result = embed(BASE, entries(hub_settings, repo), store=db, hub_settings=hub_settings, representation=WHOLE)
    assert result.embedded == [repo] and np.allclose(result.vectors[0], reference(made[repo]), atol=1e-6)
    assert assert_snapshots_intact(Path(hub_settings.cache_dir), published)[repo] == 2
    db.close()


def test_fetch_refuses_unsafe_names_before_any_request(server, hub_settings, tmp_path_factory):
    outside = tmp_path_factory.getbasetemp()
    before = len(server.requests)
    for repo_id in ["../x", "a/../../b", "a/b/c", f"{outside}/abs", "a\\b", "", "x" * 200]:
        with pytest.raises(FetchError, match="not a valid Hub repository id"):
            fetch(repo_id, "0" * 40, ["config.json", "model.safetensors"], hub_settings)
    for revision in ["../../../../x", f"{outside}/x", "main/../../x", "a\\b", "nul\x00"]:
        with pytest.raises(FetchError, match="unusable revision"):
            fetch("good/ft-ok", revision, ["config.json", "model.safetensors"], hub_settings)
    assert len(server.requests) == before


def test_the_name_guard_survives_a_client_factory_set_later(world, server, hub_settings, tmp_path_factory):
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http

    from modelvec.hub.http import httpx2

    hub = world[0]
    sha = entries(hub_settings, "good/ft-ok")[0].sha  # modelvec has talked to the Hub: its guard is installed
    hub.fail("/good/ft-ok/resolve/*", kind="etag", value='"../../../../escape-again"', times=None)
    set_client_factory(lambda: httpx2.Client(follow_redirects=True, timeout=None))  # a user's own client
    try:
        with pytest.raises(FetchError, match="unsafe name from the Hub"):
            fetch("good/ft-ok", sha, None, hub_settings)
    finally:
        set_client_factory(_http.default_client_factory)
    assert not list(tmp_path_factory.getbasetemp().glob("escape-again*"))


# --- B4. a crawl's faults: a seeded rate, a repository deleted mid-run --------------------------------------------------


def _statuses(endpoint: str, path: str, n: int) -> list[int]:
    """The statuses of ``n`` GETs of ``path``, one after another."""
    import urllib.error
    import urllib.request

    out = []
    for _ in range(n):
        try:
            with urllib.request.urlopen(endpoint + path, timeout=10) as answer:
                out.append(answer.status)
        except urllib.error.HTTPError as err:
            out.append(err.code)
    return out


def test_faults_at_a_seeded_rate(world, server):
    hub = world[0]
    with pytest.raises(ValueError, match="rate must be a probability"):
        hub.fail("*", status=500, times=None, rate=1.5)
    hub.fail("/api/models/good/ft-ok", status=503, times=None, rate=0.25, seed=3)
    first = _statuses(server.endpoint, "/api/models/good/ft-ok", 200)
    assert set(first) == {200, 503} and 30 <= first.count(503) <= 70  # about a quarter of the answers
    hub.clear_faults()
    hub.fail("/api/models/good/ft-ok", status=503, times=None, rate=0.25, seed=3)
    assert _statuses(server.endpoint, "/api/models/good/ft-ok", 200) == first  # the same seed, the same faults
    hub.clear_faults()
    hub.fail("/api/models/good/ft-ok", status=503, times=5, rate=0.5, seed=3)  # at most `times` of them
    assert _statuses(server.endpoint, "/api/models/good/ft-ok", 100).count(503) == 5


def test_faults_at_a_rate_are_retried_and_give_the_local_vectors(world, server, hub_settings, tmp_path, reference):
    hub, made = world[0], world[1]
    repos = [f"good/ft-t{n}" for n in range(1, 6)]
    for i, fault in enumerate([dict(status=429, retry_after=0.2), dict(status=503), dict(kind="reset")]):
        hub.fail("/good/ft-t*/resolve/*", times=None, rate=0.15, seed=i, **fault)
    patient = dataclasses.replace(hub_settings, retries=8)  # a fault on 1 answer in 2.2: 9 tries fail 1 time in 1,200
    result = embed(
        BASE, entries(hub_settings, *repos), store=tmp_path / "s.duckdb", hub_settings=patient, representation=WHOLE
    )
    assert not result.failed and sorted(result.embedded) == repos
    for row, repo in enumerate(result.metadata["model"]):
        assert np.allclose(result.vectors[row], reference(made[repo]), atol=1e-6), repo
    faults = [r["fault"] for r in server.requests if r["path"].startswith("/good/ft-t")]
    assert 0 < sum(f is not None for f in faults) < len(faults)  # some answers went wrong, not all


def test_a_repository_deleted_mid_run_is_recorded_as_transient(tiny_bert, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    hub.publish(BASE, files_of(tiny_bert))
    made = {r: planted_finetune(tiny_bert, tmp_path / "src" / r, seed=i) for i, r in enumerate(["x/first", "x/gone"])}
    shas = {r: hub.publish(r, {**files_of(f), "README.md": card()}, downloads=9) for r, f in made.items()}
    with hub.serve() as srv:
        hub_settings = HubSettings(endpoint=srv.endpoint, cache_dir=str(tmp_path / "cache"), token=False, backoff=0.01)
        found = entries(hub_settings, "x/first", "x/gone")  # discovered while it was there
        hub.delete("x/gone", after=2, pattern="/api/models/x/first")  # gone when the 2nd such request comes in
        ask = lambda: [
            *_statuses(srv.endpoint, "/api/models/x/first", 1),
            *_statuses(srv.endpoint, "/api/models/x/gone", 1),
        ]
        assert ask() == [200, 200]
        assert ask() == [200, 404]  # deleted before the 2nd request was answered
        assert "x/gone" not in {e.model for e in discover(BASE, hub_settings=hub_settings).entries}  # nor listed
        with Store(tmp_path / "s.duckdb") as db:
            result = embed(BASE, found, store=db, hub_settings=hub_settings, representation=WHOLE)
            failures = db.reads.failures().set_index("model")
    assert result.embedded == ["x/first"]
    assert (
        one_line(result.failed["x/gone"]).startswith("x/gone: ") and "repository not found" in result.failed["x/gone"]
    )
    assert failures.loc["x/gone", "kind"] == "transient"  # the world changed, not the model: tried again next run
    assert not (tmp_path / "hub" / "x" / "gone").exists()
    assert hub.publish("x/gone", {**files_of(made["x/gone"]), "README.md": card()}, downloads=9) == shas["x/gone"]
    with pytest.raises(ValueError, match="repo_id must be"):
        hub.delete("../escape")
