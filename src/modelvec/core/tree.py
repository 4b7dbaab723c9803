"""The Hub's model tree as modelvec follows it: the relations a card declares to its parents, and how deep discovery
goes below a base (light: the command line reads the default without importing the Hub client)."""

from __future__ import annotations

#: The ``base_model:<relation>:<parent>`` tags of the Hub's model tree, each followed from the base down.
RELATIONS = ("finetune", "adapter", "merge", "quantized")
#: Levels of the model tree followed below the base unless asked otherwise.
DEPTH = 3
