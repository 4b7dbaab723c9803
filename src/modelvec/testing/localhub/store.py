"""How the local Hub keeps a repository on disk: ids and paths, content-addressed blobs, commits, metadata, cards.

Store layout under the hub's ``root``::

    <owner>/<name>/repo.json          metadata, refs {"main": sha}, commits {sha: {parent, message, date, files,
                                      card, config}}; written atomically (tmp + os.replace)
    <owner>/<name>/blobs/<sha256>     file contents, content-addressed (hard links to published files if possible)

The functions here check and shape what :meth:`LocalHub.publish` is given and store it; the hub's state
(the cache of ``repo.json`` files, its lock) is in :mod:`.hub`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

CHUNK = 1 << 20  # bytes per read/write when hashing or streaming files
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_META_KEYS = {"author", "created_at", "downloads", "likes", "pipeline_tag", "library_name", "tags", "gated", "private"}
_IGNORED_DIRS = {".git"}  # like upload_folder, also .cache/huggingface (local_dir download metadata)


def now() -> str:
    return iso(_dt.datetime.now(_dt.UTC))


def iso(when: _dt.datetime) -> str:
    """The Hub's date format, ``2024-05-01T12:00:00.000Z`` (UTC, milliseconds)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    when = when.astimezone(_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _normalize_date(value: Any) -> str:
    if isinstance(value, _dt.datetime):
        return iso(value)
    if isinstance(value, _dt.date):
        return iso(_dt.datetime(value.year, value.month, value.day, tzinfo=_dt.UTC))
    text = str(value).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return iso(_dt.datetime.fromisoformat(text))
    except ValueError as err:
        raise ValueError(f"created_at must be an ISO date, got {value!r}") from err


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None and str(v) != ""]
    return [str(value)] if str(value) != "" else []


def _jsonable(value: Any) -> Any:
    """YAML values (dates, sets...) as JSON values."""
    return json.loads(json.dumps(value, default=str))


def parse_front_matter(text: str) -> dict | None:
    """The YAML front matter of a model card (between a leading ``---`` line and the next one), or None."""
    lines = text.lstrip("\ufeff").lstrip("\r\n \t").splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            try:
                data = yaml.safe_load("\n".join(lines[1:end]))
            except yaml.YAMLError:
                return None
            if not isinstance(data, dict):
                return None
            try:
                return _jsonable(data)
            except (TypeError, ValueError):  # e.g. non-string keys YAML allows and JSON does not
                return None
    return None


def check_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME_RE.match(p) and ".." not in p for p in parts):
        raise ValueError(f"repo_id must be 'owner/name' (letters, digits, '.', '_', '-'), got {repo_id!r}")
    return parts[0], parts[1]


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in path:
        raise ValueError(f"invalid path in repo: {path!r}")
    return path


def check_meta(meta: dict) -> dict:
    """Metadata given to :meth:`LocalHub.publish` or :meth:`LocalHub.set_meta`, checked and normalised."""
    unknown = set(meta) - _META_KEYS
    if unknown:
        raise TypeError(f"unknown metadata: {sorted(unknown)}; known: {sorted(_META_KEYS)}")
    meta = dict(meta)
    if "gated" in meta and meta["gated"] not in (False, "auto", "manual"):
        raise ValueError("gated must be False, 'auto' or 'manual'")
    if "created_at" in meta:
        meta["created_at"] = _normalize_date(meta["created_at"])
    if "tags" in meta:
        meta["tags"] = as_list(meta["tags"])
    for key in ("downloads", "likes"):
        if key in meta:
            meta[key] = int(meta[key])
    if "private" in meta:
        meta["private"] = bool(meta["private"])
    return meta


def collect(
    files: Mapping[str, bytes | str | os.PathLike] | str | os.PathLike, unsafe_paths: bool = False
) -> dict[str, bytes | Path]:
    """The files a publish takes: path in repo -> contents (bytes) or local file (see :meth:`LocalHub.publish`)."""
    if isinstance(files, (str, os.PathLike)):
        folder = Path(files)
        if not folder.is_dir():
            raise NotADirectoryError(f"not a folder: {folder}")
        out: dict[str, bytes | Path] = {}
        for dirpath, dirnames, filenames in os.walk(folder):
            rel_dir = Path(dirpath).relative_to(folder)
            dirnames[:] = sorted(
                d for d in dirnames if d not in _IGNORED_DIRS and (rel_dir / d).as_posix() != ".cache/huggingface"
            )
            for fname in filenames:
                full = Path(dirpath) / fname
                if full.is_file():
                    out[(rel_dir / fname).as_posix()] = full
        return out
    out = {}
    for path, content in files.items():
        if not unsafe_paths:
            _check_path(path)
        elif not isinstance(path, str) or not path:
            raise ValueError(f"invalid path in repo: {path!r}")
        if isinstance(content, (bytes, bytearray, memoryview)):
            out[path] = bytes(content)
        elif isinstance(content, (str, os.PathLike)):
            source = Path(content)
            if not source.is_file():
                raise FileNotFoundError(f"{path}: no such local file {source} (pass file contents as bytes)")
            out[path] = source
        else:
            raise TypeError(f"{path}: content must be bytes or a local file path, not {type(content).__name__}")
    return out


def store_blob(blobs: Path, source: bytes | Path, link: bool = False) -> dict:
    """Put content into the blob store; its {sha256, size, blob_id}."""
    blobs.mkdir(parents=True, exist_ok=True)
    sha256 = hashlib.sha256()
    if isinstance(source, bytes):
        size = len(source)
        sha256.update(source)
        blob_sha1 = hashlib.sha1(b"blob %d\0" % size + source).hexdigest()
    else:
        size = source.stat().st_size
        git = hashlib.sha1(b"blob %d\0" % size)
        with open(source, "rb") as f:
            while chunk := f.read(CHUNK):
                sha256.update(chunk)
                git.update(chunk)
        blob_sha1 = git.hexdigest()
    digest = sha256.hexdigest()
    target = blobs / digest
    if not target.exists():
        tmp = blobs / f".{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            if isinstance(source, bytes):
                tmp.write_bytes(source)
            elif link:
                try:
                    os.link(source, tmp)
                except OSError:
                    shutil.copyfile(source, tmp)
            else:
                shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return {"sha256": digest, "size": size, "blob_id": blob_sha1}


_DTYPES = {"F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16", "I64": "I64", "I32": "I32", "I8": "I8", "U8": "U8"}


def safetensors_info(blobs: Path, tree: dict) -> dict | None:
    """A commit's ``safetensors`` as the Hub gives it: the parameters per dtype of its safetensors files and their
    total (read from each file's header), or None when it has none or one does not parse."""
    counts: dict[str, int] = {}
    for path, info in tree.items():
        if not path.endswith(".safetensors"):
            continue
        try:
            with open(blobs / info["sha256"], "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n)) if 0 < n < 100_000_000 else None
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict):
            return None
        for name, tensor in header.items():
            if name != "__metadata__" and isinstance(tensor, dict):
                size = 1
                for d in tensor.get("shape") or []:
                    size *= int(d)
                dtype = _DTYPES.get(str(tensor.get("dtype")), str(tensor.get("dtype")))
                counts[dtype] = counts.get(dtype, 0) + size
    return {"parameters": counts, "total": sum(counts.values())} if counts else None


def card_and_config(blobs: Path, tree: dict) -> tuple[dict | None, dict | None]:
    """A commit's ``card`` (the README's front matter) and ``config`` (config.json's model_type and architectures),
    each None when the commit has no such file (or it does not parse)."""
    card = config = None
    if "README.md" in tree:
        text = (blobs / tree["README.md"]["sha256"]).read_bytes().decode("utf-8", errors="replace")
        card = parse_front_matter(text)
    if "config.json" in tree:
        try:
            raw = json.loads((blobs / tree["config.json"]["sha256"]).read_bytes())
        except ValueError:
            raw = None
        if isinstance(raw, dict):
            config = {k: raw[k] for k in ("model_type", "architectures") if k in raw}
    return card, config


def new_state(repo_id: str, owner: str) -> dict:
    """The state of a repository before its first commit."""
    return {
        "id": repo_id,
        "meta": {
            "author": owner,
            "created_at": now(),
            "downloads": 0,
            "likes": 0,
            "library_name": None,
            "pipeline_tag": None,
            "tags": [],
            "gated": False,
            "private": False,
        },
        "refs": {},
        "commits": {},
    }


def commit_sha(parent: str | None, tree: dict, message: str) -> str:
    """The 40-hex sha of a commit: a hash of its parent, its files' paths and contents, and its message."""
    h = hashlib.sha1()
    h.update((parent or "").encode())
    for path in sorted(tree):
        h.update(b"\0" + path.encode() + b"\0" + tree[path]["sha256"].encode())
    h.update(b"\0" + message.encode())
    return h.hexdigest()
