"""What the local Hub's API says about a repository at a commit: its fields (listings, model info), tags and tree.

Pure functions of a repository's state (see :mod:`.store`) and the names the Hub gives its fields; the lies of
:meth:`LocalHub.forge` are laid over them by :mod:`.hub`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .store import as_list

LFS_THRESHOLD = 10 * 1024 * 1024  # files at least this large are reported as LFS files (?blobs=true, tree)
TREE_PAGE_EXPANDED = 50  # the Hub's page size of a tree listing with expand=true (1000 without)
EXPANDABLE = (
    "author",
    "baseModels",
    "cardData",
    "childrenModelCount",
    "config",
    "createdAt",
    "disabled",
    "downloads",
    "gated",
    "lastModified",
    "library_name",
    "likes",
    "pipeline_tag",
    "private",
    "safetensors",
    "sha",
    "siblings",
    "tags",
    "model-index",
)
LIST_DEFAULT = (
    "_id",
    "id",
    "modelId",
    "likes",
    "downloads",
    "private",
    "pipeline_tag",
    "library_name",
    "tags",
    "createdAt",
)
LIST_FULL = ("author", "sha", "lastModified", "gated", "disabled", "siblings")
INFO_FIELDS = (
    "_id",
    "id",
    "modelId",
    "author",
    "sha",
    "lastModified",
    "createdAt",
    "private",
    "gated",
    "disabled",
    "downloads",
    "likes",
    "library_name",
    "pipeline_tag",
    "tags",
    "cardData",
    "model-index",
    "config",
    "siblings",
)
SORT_KEYS = {"downloads", "likes", "createdAt", "lastModified"}


def _relation(files, config: dict, n_bases: int) -> str:
    """The relation the Hub infers when a card names its base without ``base_model_relation``: an adapter by its
    files, a quantization by GGUF files or a quantization config, a merge by several bases, else a fine-tune."""
    if "adapter_config.json" in files:
        return "adapter"
    if any(str(p).endswith(".gguf") for p in files) or "quantization_config" in config:
        return "quantized"
    return "merge" if n_bases > 1 else "finetune"


def _tags(state: dict, commit: dict) -> list[str]:
    meta, card = state["meta"], commit.get("card") or {}
    files = commit["files"]
    tags: list[str] = []
    tags += as_list(_library_name(state, commit))
    if any(p.endswith(".safetensors") for p in files):
        tags.append("safetensors")
    if any(p.endswith(".bin") for p in files):
        tags.append("pytorch")
    tags += as_list((commit.get("config") or {}).get("model_type"))
    tags += as_list(_pipeline_tag(state, commit))
    tags += [f"dataset:{d}" for d in as_list(card.get("datasets"))]
    bases = as_list(card.get("base_model"))
    relation = str(card.get("base_model_relation") or _relation(files, commit.get("config") or {}, len(bases)))
    for base in bases:
        tags += [f"base_model:{base}", f"base_model:{relation}:{base}"]
    tags += [f"license:{lic}" for lic in as_list(card.get("license"))]
    tags += as_list(card.get("language"))
    tags += as_list(card.get("tags"))
    tags += as_list(meta.get("tags"))
    return list(dict.fromkeys(tags))


def _library_name(state: dict, commit: dict) -> str:
    card = commit.get("card") or {}
    return state["meta"].get("library_name") or card.get("library_name") or "transformers"


def _pipeline_tag(state: dict, commit: dict) -> str | None:
    card = commit.get("card") or {}
    return state["meta"].get("pipeline_tag") or card.get("pipeline_tag") or None


def base_models(state: dict) -> dict | None:
    """``baseModels`` as the Hub gives it: the relation to the bases the card of ``main`` names, and their ids."""
    main = state["commits"][state["refs"]["main"]]
    card = main.get("card") or {}
    bases = as_list(card.get("base_model"))
    if not bases:
        return None
    files, config = main["files"], main.get("config") or {}
    relation = str(card.get("base_model_relation") or _relation(files, config, len(bases)))
    return {"relation": relation, "models": [{"id": str(b)} for b in bases]}


def children_counts(states: list[dict]) -> dict[str, int]:
    """``childrenModelCount`` of every repository (lower-case id): how many models name it as a base on ``main``."""
    counts: dict[str, int] = {}
    for state in states:
        if not state["refs"].get("main"):
            continue
        card = state["commits"][state["refs"]["main"]].get("card") or {}
        for base in {str(b).lower() for b in as_list(card.get("base_model"))}:
            counts[base] = counts.get(base, 0) + 1
    return counts


def fields(state: dict, sha: str, *, blobs: bool = False) -> dict:
    """Every property of the repo at commit ``sha`` (tags and counters from main), as the Hub names them."""
    main = state["commits"][state["refs"]["main"]]
    commit = state["commits"][sha]
    meta, repo_id = state["meta"], state["id"]
    siblings = []
    for path, info in sorted(commit["files"].items()):
        sib: dict[str, Any] = {"rfilename": path}
        if blobs:
            sib["size"] = info["size"]
            sib["blobId"] = info["blob_id"]
            if info["size"] >= LFS_THRESHOLD:
                sib["lfs"] = {"size": info["size"], "sha256": info["sha256"], "pointerSize": 134}
        siblings.append(sib)
    out: dict[str, Any] = {
        "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
        "id": repo_id,
        "modelId": repo_id,
        "author": meta.get("author") or repo_id.split("/")[0],
        "sha": sha,
        "lastModified": commit["date"],
        "createdAt": meta["created_at"],
        "private": bool(meta.get("private")),
        "gated": meta.get("gated") or False,
        "disabled": False,
        "downloads": int(meta.get("downloads") or 0),
        "likes": int(meta.get("likes") or 0),
        "library_name": _library_name(state, main),
        "pipeline_tag": _pipeline_tag(state, main),
        "tags": _tags(state, main),
        "siblings": siblings,
    }
    if commit.get("card") is not None:
        out["cardData"] = commit["card"]
        if commit["card"].get("model-index") is not None:
            out["model-index"] = commit["card"]["model-index"]
    if commit.get("config") is not None:
        out["config"] = commit["config"]
    if commit.get("safetensors") is not None:
        out["safetensors"] = commit["safetensors"]
    bases = base_models(state)
    if bases is not None:
        out["baseModels"] = bases
    if out["pipeline_tag"] is None:
        del out["pipeline_tag"]
    return out


def tree(state: dict, sha: str, path: str, recursive: bool, expand: bool) -> list[dict] | None:
    """The entries of ``GET /api/models/{repo}/tree/{revision}/{path}`` at commit ``sha`` as the Hub gives them
    (folders and files in tree order; each file's git blob id, size, and ``lfs`` sha256 when it is at least
    LFS_THRESHOLD bytes, like ``?blobs=true``), or None when ``path`` is no folder of that commit. The children of
    ``path``, or with ``recursive`` everything under it; ``expand`` adds each entry's ``lastCommit``."""
    files = state["commits"][sha]["files"]
    folders: dict[str, list[str]] = {}  # folder -> the files under it, at any depth
    for name in files:
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder:  # an absolute name (published with unsafe_paths) has no folder ""
                folders.setdefault(folder, []).append(name)
    if path and path not in folders:
        return None
    prefix = f"{path}/" if path else ""
    entries = [(p, "directory") for p in folders] + [(p, "file") for p in files]
    entries = [(p, kind) for p, kind in entries if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])]
    out = []
    for p, kind in sorted(entries, key=lambda e: (e[0].split("/"), e[1])):
        if kind == "file":
            info = files[p]
            entry: dict[str, Any] = {"type": "file", "oid": info["blob_id"], "size": info["size"], "path": p}
            if info["size"] >= LFS_THRESHOLD:
                entry["lfs"] = {"oid": info["sha256"], "size": info["size"], "pointerSize": 134}
        else:
            h = hashlib.sha1()
            for name in sorted(folders[p]):
                h.update(name.encode("utf-8", "surrogatepass") + b"\0" + files[name]["sha256"].encode() + b"\0")
            entry = {"type": "directory", "oid": h.hexdigest(), "size": 0, "path": p}
        if expand:
            entry["lastCommit"] = _last_commit(state, sha, p)
        out.append(entry)
    return out


def _last_commit(state: dict, sha: str, path: str) -> dict:
    """The last commit up to ``sha`` that changed the file or folder ``path``, as the tree's ``lastCommit``."""

    def content(commit: dict) -> dict:
        return {n: i["sha256"] for n, i in commit["files"].items() if n == path or n.startswith(path + "/")}

    here = content(state["commits"][sha])
    while True:
        parent = state["commits"][sha].get("parent")
        if not parent or parent not in state["commits"] or content(state["commits"][parent]) != here:
            break
        sha = parent
    commit = state["commits"][sha]
    return {"id": sha, "title": (commit.get("message") or "").split("\n", 1)[0], "date": commit["date"]}
