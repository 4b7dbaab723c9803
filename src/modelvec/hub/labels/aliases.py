"""The table of dataset names: each dataset's canonical name and its other spellings, the collections whose
configs a repo name may add, the configs that add nothing, and the words of repo names that never name a dataset.
Adding a dataset is adding an entry here."""

from __future__ import annotations

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
