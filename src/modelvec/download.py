"""Fetching only what the vectors need from the Hub, pinned to a revision, and letting it go.

A model's vector needs its ``config.json`` and its weights in the best format it has: safetensors
(single or sharded through its index), else PyTorch ``.bin`` (single or sharded). TensorFlow,
Flax, ONNX, optimizer states and training files are never downloaded. Files go through the
huggingface_hub cache (``HF_HUB_CACHE``), pinned to the commit sha recorded at discovery, so a
repository whose ``main`` moves on still gives the vector of the revision in the catalogue, and
``HF_HUB_OFFLINE=1`` works from the cache. :func:`release` deletes a fine-tune's files once
embedded so thousands of models fit on one disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from huggingface_hub import constants, hf_hub_download

from .errors import CheckpointError
from .hub import HubSettings, describe_error, is_commit_sha, with_retries

#: Weight formats in order of preference: (format name, the file that announces it).
WEIGHT_FORMATS: tuple[tuple[str, str], ...] = (
    ("safetensors-sharded", "model.safetensors.index.json"),
    ("safetensors", "model.safetensors"),
    ("bin-sharded", "pytorch_model.bin.index.json"),
    ("bin", "pytorch_model.bin"),
)
#: Other formats a repository may hold, recorded in the catalogue but never downloaded.
OTHER_FORMATS: tuple[tuple[str, str], ...] = (
    ("tf", "tf_model.h5"),
    ("flax", "flax_model.msgpack"),
    ("onnx", "*.onnx"),
    ("gguf", "*.gguf"),
    ("adapter", "adapter_config.json"),
)


def formats(files: Iterable[str]) -> tuple[str, ...]:
    """The weight formats a repository's top-level files offer, best first."""
    names = {f for f in files if "/" not in f}
    found = [fmt for fmt, marker in WEIGHT_FORMATS if marker in names]
    for fmt, marker in OTHER_FORMATS:
        if any(Path(n).match(marker) for n in names):
            found.append(fmt)
    return tuple(found)


def weight_format(files: Iterable[str]) -> str | None:
    """The format modelvec reads for this repository, or None when it has no PyTorch weights."""
    usable = [f for f in formats(files) if f in dict(WEIGHT_FORMATS)]
    return usable[0] if usable else None


class FetchError(CheckpointError):
    """A model's files could not be fetched (gated, missing, offline and not cached, ...)."""


def fetch(repo_id: str, revision: str, files: Sequence[str] | None, settings: HubSettings) -> Path:
    """Download ``config.json`` and the best weights of ``repo_id`` at ``revision``; the snapshot folder.

    ``files`` is the repository's file list at that revision (from discovery); None asks the Hub,
    or, offline, looks in the cache. Sharded checkpoints come through their index.
    """
    try:
        if files is None:
            files = _list_files(repo_id, revision, settings)
        fmt = weight_format(files)
        if fmt is None:
            have = ", ".join(formats(files)) or "no weight files"
            raise FetchError(repo_id, f"no PyTorch weights to read (the repository has: {have})")
        wanted = ["config.json"] if "config.json" in files else []
        marker = dict(WEIGHT_FORMATS)[fmt]
        wanted.append(marker)
        paths = [_download(repo_id, name, revision, settings) for name in wanted]
        if fmt.endswith("-sharded"):
            index = json.loads(Path(paths[-1]).read_text())
            shards = sorted(set(index.get("weight_map", {}).values()))
            if not shards:
                raise FetchError(repo_id, f"{marker} lists no shards")
            paths += [_download(repo_id, shard, revision, settings) for shard in shards]
        return Path(paths[-1]).parent
    except CheckpointError:
        raise
    except Exception as exc:
        raise FetchError(repo_id, f"could not fetch revision {revision[:12]}: {describe_error(exc)}") from exc


def _download(repo_id: str, filename: str, revision: str, settings: HubSettings) -> str:
    return with_retries(
        lambda: hf_hub_download(repo_id, filename, revision=revision, cache_dir=settings.cache_dir,
                                endpoint=settings.endpoint, token=settings.token),
        settings, f"{repo_id}/{filename}",
    )


def _list_files(repo_id: str, revision: str, settings: HubSettings) -> list[str]:
    if settings.offline:
        folder = snapshot_folder(repo_id, revision, settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and revision {revision[:12]} is not in the cache")
        return [p.name for p in folder.iterdir()]
    info = with_retries(lambda: settings.api().model_info(repo_id, revision=revision), settings, repo_id)
    return [s.rfilename for s in info.siblings or []]


def snapshot_folder(repo_id: str, revision: str, settings: HubSettings) -> Path | None:
    """The cached snapshot of ``repo_id`` at a commit sha (or branch), if the cache holds one."""
    from huggingface_hub import constants

    cache = Path(settings.cache_dir or constants.HF_HUB_CACHE)
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    sha = revision
    if not is_commit_sha(revision):
        ref = repo / "refs" / revision
        if not ref.is_file():
            return None
        sha = ref.read_text().strip()
    folder = repo / "snapshots" / sha
    return folder if folder.is_dir() else None


def resolve_revision(repo_id: str, revision: str, settings: HubSettings) -> str:
    """The commit sha of a branch (online: asks the Hub; offline: the cache's ref)."""
    if is_commit_sha(revision):
        return revision
    if settings.offline:
        folder = snapshot_folder(repo_id, revision, settings)
        if folder is None:
            raise FetchError(repo_id, f"offline (HF_HUB_OFFLINE=1) and '{revision}' is not in the cache")
        return folder.name
    try:
        info = with_retries(lambda: settings.api().model_info(repo_id, revision=revision), settings, repo_id)
    except Exception as exc:
        raise FetchError(repo_id, describe_error(exc)) from exc
    return str(info.sha)


def release(repo_id: str, revision: str, settings: HubSettings) -> int:
    """Delete one cached revision of a repository (its blobs too, unless another revision shares them).

    Used with ``--no-keep-weights`` once a fine-tune is embedded; other revisions and other
    repositories (the base) are untouched. Only this repository's folder is looked at, so it is
    safe while other models download into the same cache (a whole-cache scan is not).
    """
    repo = Path(settings.cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    if not snapshot.is_dir():
        return 0
    others = {os.path.realpath(p) for other in (repo / "snapshots").iterdir() if other.name != revision
              for p in other.rglob("*")}
    freed = 0
    for link in sorted(snapshot.rglob("*"), reverse=True):
        target = Path(os.path.realpath(link))
        if link.is_symlink() or link.is_file():
            if target != link and str(target) not in others and target.is_file() and repo in target.parents:
                freed += target.stat().st_size
                target.unlink()
            link.unlink()
        elif link.is_dir():
            link.rmdir()
    snapshot.rmdir()
    return freed
