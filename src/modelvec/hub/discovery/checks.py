"""Judging what discovery finds: a model of the tree by its relation and files, a name-search candidate by its
config.json or safetensors header against the base, and the labels a model's siblings lend its name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.files import adapter_files, weight_format
from ...core.gguf import gguf_weights
from ..client import HubSettings, describe_error, with_retries
from ..download import download_file
from ..ids import BaseId
from ..labels import guess_from_name
from .catalogue import CatalogueEntry, Matcher


def _check_relation(entry: CatalogueEntry, base_id: BaseId, found: Mapping[str, CatalogueEntry]) -> None:
    """Whether a model of the tree can be embedded against the base, by its relation and files.

    Its declared parents come from its ``base_model:<id>`` tags. A fine-tune (of the base or of a fine-tune) and
    a merge are their weights; an adapter needs its adapter files, and is its own delta on the base itself, or on a
    fine-tune of the tree (``found``, kept) that fine-tune's delta plus its own (embedded so, said so); a GGUF
    repository is kept, read by byte ranges (the finest of its files) and placed by its weights, and so is a GPTQ, AWQ
    or bitsandbytes one (safetensors, dequantized for the rows read); a quantization in a format not read (EXL2, HQQ,
    AQLM...: :data:`UNREAD`, by its tags; or with no weights modelvec reads) is recorded as a quantization of its
    parent and never placed on the map.
    """
    entry.parents = [t.split(":", 1)[1] for t in entry.tags if t.startswith("base_model:") and t.count(":") == 1]
    root = {n.lower() for n in base_id.names}
    if any(p.lower() == entry.model.lower() for p in entry.parents):
        entry.kept, entry.reason = False, f"{entry.reason}; but names itself as its base"
        return
    readable_gguf = weight_format(entry.files) is None and gguf_weights(entry.files) is not None
    if readable_gguf:  # whatever its card says: its bytes say what it rounds
        what = ", ".join(entry.parents) or "no declared base"
        entry.reason = f"{entry.reason}; GGUF (declares {what}): read by byte ranges, placed by its weights"
        return
    unread = next((kind for kind in UNREAD if kind in {t.lower() for t in entry.tags}), None)
    if entry.relation == "quantized" and (unread or weight_format(entry.files) is None):
        what = ", ".join(entry.parents) or "its declared base"
        entry.kept, entry.reason = (
            False,
            f"a quantization of {what} ({unread or _quant_kind(entry)}): recorded, not mapped",
        )
        return
    if entry.relation == "quantized" or _quantized(entry):
        what = ", ".join(entry.parents) or "no declared base"
        entry.reason = (
            f"{entry.reason}; {_quant_kind(entry)} (declares {what}): read by byte ranges, placed by its weights"
        )
    if entry.relation == "adapter" and not any(p.lower() in root for p in entry.parents):
        parent = next((found[p.lower()] for p in entry.parents if p.lower() in found), None)
        if parent is None or not parent.kept or parent.relation in ("adapter", "quantized"):
            what = ", ".join(entry.parents) or "no declared base"
            why = (
                "not found in the tree"
                if parent is None
                else "not mapped"
                if not parent.kept
                else "a quantization"
                if parent.relation == "quantized"
                else "an adapter"
            )
            entry.kept = False
            entry.reason = f"{entry.reason}; an adapter on {what} ({why}): its delta would lack its parent's"
            return
        entry.reason = f"{entry.reason}; an adapter on {parent.model}: embedded on its delta"
    _check_weights(entry)


#: Quantization formats a repository's tags may name that modelvec does not read (their weights are no GPTQ, AWQ,
#: bitsandbytes or GGUF tensors).
UNREAD = ("exl2", "exl3", "hqq", "aqlm", "quanto", "eetq", "marlin", "bitblas")


def _quantized(entry: CatalogueEntry) -> bool:
    """Whether the repo's weights are quantized: GGUF files, or a GPTQ/AWQ/bitsandbytes quantization config."""
    names = {f.rsplit("/", 1)[-1] for f in entry.files}
    return any(f.endswith(".gguf") for f in names) or bool(names & {"quantize_config.json", "quant_config.json"})


def _quant_kind(entry: CatalogueEntry) -> str:
    if any(f.endswith(".gguf") for f in entry.files):
        return "GGUF"
    tags = {t.lower() for t in entry.tags}
    named = [kind for kind in ("gptq", "awq", "bitsandbytes", "4-bit", "8-bit") if kind in tags]
    names = {f.rsplit("/", 1)[-1] for f in entry.files}
    if not named and "quantize_config.json" in names:
        named = ["gptq"]
    elif not named and "quant_config.json" in names:
        named = ["awq"]
    return ", ".join(named) or "a quantized format"


def _guess_from_siblings(entries: list[CatalogueEntry]) -> None:
    """Name guesses may also use the datasets the other fine-tunes of this base declare.

    A dataset the alias table does not know ("acme-reviews") is still recognised in an
    unlabelled sibling's name ("someone/bert-acme-reviews"); the label is marked as guessed.
    """
    vocab = sorted(
        {
            d
            for e in entries
            if e.kept and e.label_source and "name" not in e.label_source.split("+")
            for d in e.datasets
        }
    )
    for e in entries:
        if not e.datasets and vocab:
            guessed = guess_from_name(e.model, known=vocab)
            if guessed:
                e.datasets, e.label_source = list(guessed), "name"
                e.labels = [{"dataset": d, "source": "name", "raw": e.model} for d in guessed]


def _check_weights(entry: CatalogueEntry) -> None:
    """A model modelvec cannot read is rejected at discovery, with what it has instead.

    Full PyTorch weights, or a PEFT adapter (``adapter_config.json`` and its weights).
    """
    if weight_format(entry.files) is None and adapter_files(entry.files) is None and gguf_weights(entry.files) is None:
        entry.kept = False
        entry.reason = f"{entry.reason}; but no PyTorch weights (has: {', '.join(entry.formats) or 'no weight files'})"


def _check_candidate(
    entry: CatalogueEntry,
    listed: Mapping[str, Any] | None,
    base_config: Mapping[str, Any],
    base_id: BaseId,
    base_cache: dict[str, Any],
    hub_settings: HubSettings,
    matcher: Matcher,
) -> tuple[bool, str]:
    prefix = f"name search '{base_id.search_term}'"
    listed_type, base_type = (listed or {}).get("model_type"), base_config.get("model_type")
    if listed_type and base_type and str(listed_type).lower() != str(base_type).lower():
        return False, f"{prefix}; model_type '{listed_type}' is not the base's '{base_type}' (the listing's config)"
    try:
        if "config.json" in entry.files:
            ok, why = matcher.config_match(base_config, _config(entry.model, entry.sha or "main", hub_settings))
            return ok, f"{prefix}; {why}"
        if "model.safetensors" in entry.files:
            ok, why = _header_match(entry, base_id, base_config, base_cache, hub_settings, matcher)
            return ok, f"{prefix}; {why}"
        return False, f"{prefix}; no config.json or safetensors header to compare with the base"
    except Exception as exc:
        return False, f"{prefix}; could not check the config: {describe_error(exc)}"


def _config(repo_id: str, revision: str, hub_settings: HubSettings) -> dict[str, Any]:
    config = json.loads(Path(download_file(repo_id, "config.json", revision, hub_settings)).read_text())
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return config


def _header_match(
    entry: CatalogueEntry,
    base_id: BaseId,
    base_config: Mapping[str, Any],
    base_cache: dict[str, Any],
    hub_settings: HubSettings,
    matcher: Matcher,
) -> tuple[bool, str]:
    """Compare the shapes of the base's matrices with the candidate's safetensors header (no weights)."""
    api = hub_settings.api()

    def shapes(repo: str, revision: str | None) -> dict[str, tuple[int, ...]]:
        meta = with_retries(lambda: api.get_safetensors_metadata(repo, revision=revision), hub_settings, repo)
        return {name: tuple(t.shape) for fm in meta.files_metadata.values() for name, t in fm.tensors.items()}

    theirs = shapes(entry.model, entry.sha)
    if "shapes" not in base_cache:  # the base's header is read once per discovery
        base_cache["shapes"] = shapes(base_id.canonical, base_cache["sha"])
    return matcher.header_match(base_config, base_id.canonical, base_cache["shapes"], theirs)
