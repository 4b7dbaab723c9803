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

from .aliases import ALIASES
from .names import guess_from_name, normalise_dataset
from .sources import SOURCES, Label, Labels, dataset_labels, matches_source

__all__ = [
    "ALIASES",
    "SOURCES",
    "Label",
    "Labels",
    "dataset_labels",
    "guess_from_name",
    "matches_source",
    "normalise_dataset",
]
