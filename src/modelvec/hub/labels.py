"""Dataset labels for a model, and where each came from.

The clustering study asks whether models tuned on the same dataset end up near each other, so every
model needs dataset labels that are (1) comparable across models, whatever spelling its card used
("SST-2", "sst2", "glue" + config "sst2", "stanfordnlp/sst2" are one dataset), and (2) honest about
their origin: a label the author declared and one guessed from the repo name are evidence of very
different strength, and the analysis must be able to keep them apart (:func:`matches_source`).

What the Hub tells us, in priority order (:data:`SOURCES`):

- ``model-index``: the evaluation results in the card; each result names a dataset id and often a
  config, the most specific declaration there is;
- ``card``: the card's ``datasets:`` list;
- ``tag``: the Hub's ``dataset:<id>`` tags (derived from the card, kept for models whose card we
  did not parse);
- ``name``: a guess from the repo name, used only when the three above give nothing, and to pick
  the config of a declared bare collection ("glue" + "...-finetuned-mrpc" -> "glue/mrpc").

Spellings are reconciled by one alias table (:data:`ALIASES`, canonical -> aliases); adding a
dataset is adding an entry. Nothing here raises on odd input: non-strings and malformed entries
are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SOURCES = ("model-index", "card", "tag", "name")  # priority order; "name" = guessed
_DECLARED = SOURCES[:-1]
_FILTERS = ("declared", "guessed", "none")  # matches_source's words beyond the source names

GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax")

# canonical -> aliases. Case and the separators "-", "_", " ", "." never matter (lookup keys drop
# them), so an alias is only needed for a genuinely different spelling: an org-prefixed Hub id, an
# abbreviation, a version suffix. Canonical names are the Hub's short ids, lower case; GLUE tasks
# are "glue/<task>".
ALIASES: dict[str, tuple[str, ...]] = {
    "glue": ("nyu-mll/glue",),
    "glue/cola": ("cola",),
    "glue/sst2": ("sst2", "sst-2", "stanfordnlp/sst2", "setfit/sst2", "gpt3mix/sst2"),
    "glue/mrpc": ("mrpc", "setfit/mrpc"),
    "glue/qqp": ("qqp", "setfit/qqp"),
    "glue/stsb": ("stsb", "sts-b", "setfit/stsb"),
    "glue/mnli": (
        "mnli",
        "mnli-mm",
        "mnli_matched",
        "mnli_mismatched",
        "multi_nli",
        "multinli",
        "nyu-mll/multi_nli",
        "setfit/mnli",
    ),
    "glue/qnli": ("qnli", "setfit/qnli"),
    "glue/rte": ("rte", "setfit/rte"),
    "glue/wnli": ("wnli", "setfit/wnli"),
    "glue/ax": ("ax",),
    "super_glue": ("aps/super_glue", "superglue"),
    "tweet_eval": ("cardiffnlp/tweet_eval",),
    "xtreme": ("google/xtreme",),
    "paws-x": ("google-research-datasets/paws-x",),
    "paws": ("google-research-datasets/paws",),
    "xnli": ("facebook/xnli",),
    "imdb": ("stanfordnlp/imdb",),
    "snli": ("stanfordnlp/snli",),
    "anli": ("facebook/anli",),
    "fever": ("fever/fever",),
    "wanli": ("alisawuffles/wanli",),
    "sst": ("stanfordnlp/sst",),
    "sst5": ("setfit/sst5", "sst-5"),
    "ag_news": ("fancyzhx/ag_news", "ag news", "agnews"),
    "yelp_polarity": ("fancyzhx/yelp_polarity",),
    "yelp_review_full": ("yelp/yelp_review_full", "yelp_review"),
    "amazon_polarity": ("fancyzhx/amazon_polarity",),
    "rotten_tomatoes": ("cornell-movie-review-data/rotten_tomatoes",),
    "dbpedia_14": ("fancyzhx/dbpedia_14", "dbpedia"),
    "trec": ("cogcomp/trec",),
    "emotion": ("dair-ai/emotion",),
    "go_emotions": ("google-research-datasets/go_emotions",),
    "financial_phrasebank": ("takala/financial_phrasebank",),
    "banking77": ("polyai/banking77",),
    "clinc_oos": ("clinc/clinc_oos",),
    "boolq": ("google/boolq",),
    "squad": ("rajpurkar/squad", "squad_v1", "squad1", "squad_v1.1", "squad1.1"),
    "squad_v2": ("rajpurkar/squad_v2", "squad2", "squad_v2.0", "squad2.0"),
    "tydiqa": ("google-research-datasets/tydiqa",),
    "conll2003": ("eriktks/conll2003", "conll03", "conll-2003"),
    "wnut_17": ("leondz/wnut_17",),
    "wikiann": ("unimelb-nlp/wikiann",),
    "cnn_dailymail": ("abisee/cnn_dailymail", "cnn_dm"),
    "xsum": ("edinburghnlp/xsum",),
    "samsum": ("samsung/samsum",),
    "billsum": ("fiscalnote/billsum",),
    "wikitext": ("salesforce/wikitext",),
    "swag": ("allenai/swag",),
    "hellaswag": ("rowan/hellaswag",),
    "commonsense_qa": ("tau/commonsense_qa",),
    "winogrande": ("allenai/winogrande",),
}

# Multi-config collections whose bare name says too little; a config named in the repo name refines
# it. GLUE's configs also come from the "glue/..." entries of ALIASES (so "sst-2", "mnli-mm" count).
COLLECTION_CONFIGS: dict[str, tuple[str, ...]] = {
    "glue": GLUE_TASKS,
    "super_glue": ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc", "wsc.fixed", "axb", "axg"),
    "tweet_eval": (
        "emoji",
        "emotion",
        "hate",
        "irony",
        "offensive",
        "sentiment",
        "stance_abortion",
        "stance_atheism",
        "stance_climate",
        "stance_feminist",
        "stance_hillary",
    ),
    "xtreme": ("xnli", "tydiqa", "mlqa", "pan-x", "paws-x", "udpos", "bucc18", "tatoeba"),
}

# Configs that name a packaging or a version, not a different dataset: "<id>/<config>" would split
# one dataset's models into several labels.
IGNORED_CONFIGS = frozenset({"default", "plain_text", "all", "main"})
DATASET_IGNORED_CONFIGS: dict[str, frozenset[str]] = {
    "emotion": frozenset({"split", "unsplit"}),  # Trainer cards for dair-ai/emotion write config: split
}
_VERSION = re.compile(r"v?\d+(\.\d+)*")  # cnn_dailymail "3.0.0"

_PREFIXES = ("https://huggingface.co/datasets/", "hf://datasets/", "datasets/")

# Tokens that never name a dataset on their own in a repo name (they may still be part of a joined
# match such as "squad" + "v2").
NAME_STOPWORDS = frozenset(
    {
        "bert",
        "base",
        "uncased",
        "cased",
        "large",
        "small",
        "tiny",
        "mini",
        "medium",
        "xl",
        "xxl",
        "finetuned",
        "fine",
        "tuned",
        "ft",
        "english",
        "en",
        "v1",
        "v2",
        "v3",
        "model",
        "distilbert",
        "roberta",
        "deberta",
        "albert",
        "electra",
        "xlm",
        "bart",
        "t5",
        "gpt2",
    }
)
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


@dataclass(frozen=True)
class Label:
    """One dataset label with its provenance."""

    dataset: str  # normalised name, e.g. "glue/sst2"
    source: str  # one of SOURCES
    raw: str  # what the source said, e.g. "SST-2", "glue (config sst2)", the repo name


@dataclass(frozen=True)
class Labels:
    """A model's final dataset labels, and every (dataset, source, raw) that contributed to them."""

    datasets: tuple[str, ...]  # deduplicated, in first-seen priority order
    source: str | None  # contributing sources joined with "+" in SOURCES order; None when no labels
    labels: tuple[Label, ...]

    @property
    def guessed(self) -> bool:
        """True when the repo-name guess contributed (alone, or to refine a bare collection)."""
        return self.source is not None and "name" in self.source.split("+")


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


def _as_list(value: Any) -> list[Any]:
    """A YAML field that may be one item or a list of them."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None:
        return []
    return [value]


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _model_index_labels(model_index: Any) -> list[Label]:
    out = []
    for entry in _as_list(model_index):
        if not isinstance(entry, Mapping):
            continue
        for result in _as_list(entry.get("results")):
            if not isinstance(result, Mapping):
                continue
            dataset = result.get("dataset")
            if isinstance(dataset, str):
                dataset = {"type": dataset}
            if not isinstance(dataset, Mapping):
                continue
            ident = _text(dataset.get("type")) or _text(dataset.get("name"))
            if ident is None:
                continue
            config = _text(dataset.get("config")) or _text(dataset.get("args"))
            normalised = normalise_dataset(ident, config)
            if normalised:
                out.append(Label(normalised, "model-index", f"{ident} (config {config})" if config else ident))
    return out


def _card_labels(card: Mapping[str, Any]) -> list[Label]:
    out = []
    for item in _as_list(card.get("datasets")):
        raw = _text(item)
        if raw is not None and (normalised := normalise_dataset(raw)):
            out.append(Label(normalised, "card", raw))
    return out


def _tag_labels(tags: Any) -> list[Label]:
    out = []
    for tag in [tags] if isinstance(tags, str) else _as_list(tags):
        raw = _text(tag)
        if raw is None or not raw.lower().startswith("dataset:"):
            continue
        if normalised := normalise_dataset(raw[len("dataset:") :]):
            out.append(Label(normalised, "tag", raw))
    return out


def _refine(labels: Sequence[Label]) -> list[Label]:
    """Rewrite a general label into the specific ones present, keeping its source and raw text."""
    datasets = list(dict.fromkeys(label.dataset for label in labels))
    out: list[Label] = []
    for label in labels:
        specific = [d for d in datasets if d.startswith(label.dataset + "/")]
        for dataset in _drop_general(specific) or [label.dataset]:
            refined = Label(dataset, label.source, label.raw)
            if refined not in out:
                out.append(refined)
    return out


def _refine_by_name(labels: list[Label], repo_id: str) -> list[Label]:
    """Declared labels that are only bare collections take their config from the repo name."""
    if not labels or any(label.dataset not in COLLECTION_CONFIGS for label in labels):
        return labels
    tokens = _tokens(repo_id)
    out: list[Label] = []
    named: list[Label] = []
    for label in labels:
        configs = _scan(tokens, _CONFIG_KEYS[label.dataset])
        if not configs:
            out.append(label)
        out.extend(Label(c, label.source, label.raw) for c in configs)
        named.extend(Label(c, "name", repo_id) for c in configs)
    return list(dict.fromkeys(out + named))


def _assemble(labels: Sequence[Label]) -> Labels:
    """``labels`` arrive in priority order (declared sources first, name last)."""
    datasets = tuple(dict.fromkeys(label.dataset for label in labels))
    sources = [s for s in SOURCES if any(label.source == s for label in labels)]
    return Labels(datasets, "+".join(sources) or None, tuple(labels))


def dataset_labels(
    repo_id: str, card: Mapping[str, Any] | None = None, tags: Sequence[str] | None = None, model_index: Any = None
) -> Labels:
    """A model's dataset labels from what the Hub says about it, most specific source first.

    ``model_index`` (when not None) replaces the card's ``model-index:``. The repo name is consulted
    only when the card, model-index and tags declare nothing, or to pick the config of a declared
    bare collection (then "name" joins the source and ``guessed`` is True).
    """
    if not isinstance(card, Mapping):
        card = {}
    if model_index is None:
        model_index = card.get("model-index")
    repo = repo_id if isinstance(repo_id, str) else ""
    card_labels = _card_labels(card)
    # The Hub derives `dataset:` tags from the card's datasets: they count only without one.
    declared = _refine(_model_index_labels(model_index) + card_labels + ([] if card_labels else _tag_labels(tags)))
    if declared:
        return _assemble(_refine_by_name(declared, repo))
    return _assemble([Label(d, "name", repo) for d in guess_from_name(repo)])


def matches_source(source: str | None, wanted: Iterable[str]) -> bool:
    """Filter on provenance: does a model whose labels came from ``source`` pass any ``wanted`` item?

    Items: a source name ("model-index", "card", "tag", "name": that source contributed), a joined
    source exactly ("model-index+card"), "declared" (labels, none of them from the name),
    "guessed" ("name" contributed) or "none" (no labels). Non-string items are skipped; an unknown
    word raises ValueError, since a misspelt filter silently matching nothing would mislead.
    """
    parts = set(source.split("+")) if isinstance(source, str) and source else set()
    items = [wanted] if isinstance(wanted, str) else list(wanted) if isinstance(wanted, Iterable) else []
    for item in items:
        if not isinstance(item, str):
            continue
        word = item.strip().lower().replace("model_index", "model-index")
        if word in SOURCES:
            hit = word in parts
        elif word == "declared":  # wholly declared: a label refined by the name is partly guessed
            hit = bool(parts) and "name" not in parts
        elif word == "guessed":
            hit = "name" in parts
        elif word == "none":
            hit = not parts
        elif word and set(word.split("+")) <= set(SOURCES):
            hit = word == source
        else:
            raise ValueError(f"unknown label source filter {item!r}; use one of {SOURCES + _FILTERS}")
        if hit:
            return True
    return False
