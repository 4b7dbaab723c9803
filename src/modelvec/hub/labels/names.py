"""Dataset names made comparable: one spelling per dataset through the alias table (:mod:`.aliases`), and the
datasets a repo name mentions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from .aliases import ALIASES, COLLECTION_CONFIGS, DATASET_IGNORED_CONFIGS, IGNORED_CONFIGS, NAME_STOPWORDS

_VERSION = re.compile(r"v?\d+(\.\d+)*")  # cnn_dailymail "3.0.0"

_PREFIXES = ("https://huggingface.co/datasets/", "hf://datasets/", "datasets/")
_MAX_JOIN = 3  # tokens joined when matching a repo name: "yelp-review-full"

_SEPARATORS = re.compile(r"[-_ .]")
_TOKEN_SPLIT = re.compile(r"[-_.]+")
_COLLECTION_SPLIT = re.compile(r"[\s/]+")


def _key(text: str) -> str:
    """Separator-insensitive lookup key: lower case, without "-", "_", " " or "."."""
    return _SEPARATORS.sub("", text.strip().lower())


def _build_lookup() -> tuple[dict[str, str], dict[str, str]]:
    exact: dict[str, str] = {}
    loose: dict[str, str] = {}
    for canonical, aliases in ALIASES.items():
        for alias in (canonical, *aliases):
            exact.setdefault(alias.strip().lower(), canonical)
            loose.setdefault(_key(alias), canonical)
    return exact, loose


_EXACT, _LOOSE = _build_lookup()


def _lookup(name: str) -> str | None:
    """The canonical name an alias stands for, or None when the table does not know it."""
    return _EXACT.get(name) or _LOOSE.get(_key(name))


def _build_config_keys() -> dict[str, dict[str, str]]:
    """collection -> {separator-free config key -> "collection/config"}, for refining by name."""
    out: dict[str, dict[str, str]] = {}
    for collection, configs in COLLECTION_CONFIGS.items():
        keys = {_key(c): f"{collection}/{c.lower()}" for c in configs}
        for canonical, aliases in ALIASES.items():
            if canonical.startswith(collection + "/"):
                keys.update({_key(a): canonical for a in (canonical.split("/", 1)[1], *aliases) if "/" not in a})
        out[collection] = keys
    return out


_CONFIG_KEYS = _build_config_keys()


def _config_of(base: str, config: str) -> str | None:
    """``base`` with ``config`` applied, or None when the config adds nothing."""
    cfg = config.strip().lower()
    if not cfg or cfg in IGNORED_CONFIGS or cfg in DATASET_IGNORED_CONFIGS.get(base, ()) or _VERSION.fullmatch(cfg):
        return None
    if "/" in base and base in ALIASES:  # an alias already fixed the config ("multi_nli" -> glue/mnli)
        return None
    resolved = _lookup(cfg)
    if cfg == base or resolved == base or cfg == base.rsplit("/", 1)[-1]:
        return None
    if resolved and resolved.startswith(base + "/"):  # ("glue", "SST-2") -> glue/sst2
        return resolved
    return f"{base}/{cfg}"


def normalise_dataset(name: str, config: str | None = None) -> str:
    """One spelling per dataset, so labels compare across cards: "SST-2", ("glue", "sst2") -> "glue/sst2".

    Returns "" for a non-string or empty name (callers skip those).
    """
    if not isinstance(name, str):
        return ""
    text = name.strip().lower()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    text = text.strip().strip("/")
    if not text:
        return ""
    base = _lookup(text)
    if base is None:
        # "glue/SST-2", "GLUE MNLI", "nyu-mll/glue/cola": a known collection followed by its config
        for match in _COLLECTION_SPLIT.finditer(text):
            collection = _lookup(text[: match.start()])
            if collection is not None and "/" not in collection and collection in COLLECTION_CONFIGS:
                inner = normalise_dataset(collection, text[match.end() :])
                if inner != collection:
                    base = inner
                    break
        else:
            base = text
    if isinstance(config, str):
        return _config_of(base, config) or base
    return base


def _tokens(repo_id: str) -> list[str]:
    name = repo_id.rsplit("/", 1)[-1].strip().lower()
    return [t for t in _TOKEN_SPLIT.split(name) if t]


def _scan(tokens: Sequence[str], keys: Mapping[str, str], max_join: int = _MAX_JOIN) -> list[str]:
    """Matches of single tokens or 2-/3-token joins against ``keys``, longest first, left to right."""
    found: list[str] = []
    i = 0
    while i < len(tokens):
        for width in range(min(max_join, len(tokens) - i), 0, -1):
            joined = "".join(tokens[i : i + width])
            if width == 1 and joined in NAME_STOPWORDS:
                continue
            hit = keys.get(joined)
            if hit is not None:
                if hit not in found:
                    found.append(hit)
                i += width
                break
        else:
            i += 1
    return found


def _drop_general(datasets: Sequence[str]) -> list[str]:
    """Drop "glue" when "glue/<task>" is present (and any "<x>" when "<x>/<y>" is)."""
    return [d for d in datasets if not any(o.startswith(d + "/") for o in datasets)]


def guess_from_name(repo_id: str, known: Iterable[str] = ()) -> tuple[str, ...]:
    """Datasets a repo name mentions ("textattack/bert-base-uncased-SST-2" -> ("glue/sst2",)).

    Only whole tokens (split on "-", "_", ".") or joins of 2-3 adjacent tokens count, so "roberta"
    never matches "rte"; the longest match wins ("squad-v2" -> squad_v2, not squad). ``known``
    adds normalised dataset names to recognise besides the alias table (discovery passes the
    datasets other fine-tunes of the same base declare), matched on their last path part.
    """
    if not isinstance(repo_id, str):
        return ()
    keys, max_join = _LOOSE, _MAX_JOIN
    extra = {_key(name.rsplit("/", 1)[-1]): name for name in known if isinstance(name, str) and name.strip()}
    if extra:
        keys = {**extra, **_LOOSE}
        max_join = max(_MAX_JOIN, *(len(_tokens(name)) for name in extra.values()))
    return tuple(_drop_general(_scan(_tokens(repo_id), keys, max_join)))
