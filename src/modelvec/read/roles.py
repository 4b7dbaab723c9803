"""The terms architecture entries are written in (:mod:`modelvec.read.architectures` holds the entries).

An entry names, per stack, the tensors of a layer (:class:`Tensor`: a name template, the families it holds, its
storage orientation, conditions on config.json, fused parts); :meth:`Architecture.matrices` reads an entry against a
model's config into :class:`MatrixRef`: each matrix of the representation, where it is stored and the role it plays.
Nothing here names a family: that is the entries' part.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from string import Template
from typing import Any

from ..core.errors import ArchitectureError

#: The families in the order the description lists them; per-layer blocks follow a table's order.
ATTENTION = ("q", "k", "v", "o")
CROSS_ATTENTION = ("cross_q", "cross_k", "cross_v", "cross_o")


class Orientation(str, Enum):  # noqa: UP042  (str() and format() as an Enum's: the reports' words)
    """How a weight is stored. modelvec always uses W in R^{in x out} (x @ W), as the description."""

    LINEAR = "linear"  # torch.nn.Linear stores [out, in]: transposed on read
    CONV1D = "conv1d"  # GPT-2's Conv1D stores [in, out]: used as is


@dataclass(frozen=True)
class When:
    """A condition on config.json, e.g. T5 v1.1's gated feed-forward (``feed_forward_proj: gated-*``)."""

    key: str
    pattern: str
    default: str = ""

    def holds(self, config: Mapping[str, Any]) -> bool:
        return fnmatch.fnmatchcase(str(config.get(self.key, self.default)), self.pattern)


@dataclass(frozen=True, kw_only=True)
class Tensor:
    """One stored weight: its name template and the families it holds.

    A fused tensor (GPT-2's ``c_attn`` = q|k|v) lists several families; it is split along the output
    axis into equal parts, or, with ``split``, in proportion to config values (Phi-3's ``qkv_proj``
    with grouped-query attention: q has ``num_attention_heads`` heads, k and v ``num_key_value_heads``).
    ``fused`` names the whole (used by the rank study).
    """

    template: str
    families: tuple[str, ...]
    orientation: Orientation = Orientation.LINEAR
    when: When | None = None
    unless: When | None = None
    fused: str | None = None
    #: per family, the config keys whose value sizes its part (first found wins); None: equal parts
    split: tuple[tuple[str, ...], ...] | None = None

    def name(self, layer: int) -> str:
        return Template(self.template).substitute(layer=layer)

    def applies(self, config: Mapping[str, Any]) -> bool:
        return (self.when is None or self.when.holds(config)) and not (
            self.unless is not None and self.unless.holds(config)
        )

    def weights(self, config: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The relative sizes of the fused parts (None: equal), from ``split`` and the config."""
        if self.split is None:
            return None
        sizes = []
        for keys in self.split:
            value = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
            if value is None:
                raise ArchitectureError(
                    str(config.get("_name_or_path", "model")),
                    f"config.json gives no {' or '.join(keys)}, needed to split the fused {self.template}",
                )
            sizes.append(int(value))
        return tuple(sizes)


@dataclass(frozen=True)
class Stack:
    """The layers of one stack; ``layers_keys`` are config keys for its depth, first found wins."""

    name: str
    layers_keys: tuple[str, ...]
    tensors: tuple[Tensor, ...]


@dataclass(frozen=True)
class VocabularyHead:
    """A head that ends in the vocabulary: logits = E (gamma * norm(h) + beta) + b, E the tied embeddings.

    E beta is what the head adds to every token's logit whatever the input: a language-modelling
    fine-tune moves it towards the words of its texts, which the encoder's deltas hardly record
    (docs/evidence.md, "Where the texts are"). ``bias`` names beta (tried in order; a name matches
    a stored tensor that equals it or ends in ``.`` + it, so task-head and PEFT prefixes need no
    listing); ``embedding`` names E (vocab x width) in the base. ``default``: whether ``head="auto"`` (the
    default representation) appends it: yes for a masked-LM head, measured on the evidence zoo; no for
    GPT-2's ``ln_f``, the trunk's last norm, which every fine-tune trains whatever its task (unmeasured).
    """

    bias: tuple[str, ...]
    embedding: str
    default: bool = True


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A model family: how to recognise it in config.json and where its matrices live."""

    name: str
    model_types: tuple[str, ...]
    class_prefixes: tuple[str, ...]
    prefixes: tuple[str, ...]
    stacks: tuple[Stack, ...]
    description: str = ""
    #: where the head's vocabulary prior is (None: the family's norms have no bias, e.g. RMSNorm)
    vocabulary_head: VocabularyHead | None = None
    #: the probe tokens ``Representation(probe="auto")`` takes this family's deltas through (None: the deltas
    #: themselves), as the evidence chose per family (docs/evidence.md)
    probe: int | None = None
    #: config.json sizes two checkpoints must share for their matrices to align (layers, width,
    #: feed-forward, heads...); each entry lists alternative keys, first found wins. Discovery uses
    #: them to accept a name-search candidate without downloading its weights.
    shape_keys: tuple[tuple[str, ...], ...] = (
        ("num_hidden_layers",),
        ("hidden_size",),
        ("intermediate_size",),
        ("num_attention_heads",),
    )

    def shape(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The sizes named by :attr:`shape_keys`, under each entry's first key (None when absent)."""
        return {keys[0]: next((config[k] for k in keys if k in config), None) for keys in self.shape_keys}

    def matrices(self, config: Mapping[str, Any]) -> list[MatrixRef]:
        """Every matrix this config's model has, in stack, layer, table order."""
        refs: list[MatrixRef] = []
        for stack in self.stacks:
            n_layers = self.num_layers(stack, config)
            for layer in range(n_layers):
                for tensor in stack.tensors:
                    if not tensor.applies(config):
                        continue
                    weights = tensor.weights(config)
                    for part, family in enumerate(tensor.families):
                        refs.append(
                            MatrixRef(
                                stack=stack.name,
                                layer=layer,
                                family=family,
                                tensor=tensor.name(layer),
                                orientation=tensor.orientation,
                                part=part,
                                n_parts=len(tensor.families),
                                fused=tensor.fused,
                                weights=weights,
                            )
                        )
        return refs

    def num_layers(self, stack: Stack, config: Mapping[str, Any]) -> int:
        for key in stack.layers_keys:
            if isinstance(config.get(key), int):
                return int(config[key])
        raise ArchitectureError(
            str(config.get("_name_or_path", "model")),
            f"config.json gives no layer count for the {stack.name} (looked for {', '.join(stack.layers_keys)})",
        )


@dataclass(frozen=True, kw_only=True)
class MatrixRef:
    """One matrix of the representation: where it is stored and what role it plays."""

    stack: str
    layer: int
    family: str
    tensor: str
    orientation: Orientation
    part: int = 0
    n_parts: int = 1
    fused: str | None = None
    weights: tuple[int, ...] | None = None  # relative part sizes of a fused tensor (None: equal)

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.stack, self.layer, self.family)

    def span(self, whole: int) -> tuple[int, int] | None:
        """This part's [start, stop) along the fused axis of length ``whole``; None when it does not divide."""
        weights = self.weights or (1,) * self.n_parts
        total = sum(weights)
        if total <= 0 or whole % total:
            return None
        unit = whole // total
        start = unit * sum(weights[: self.part])
        return start, start + unit * weights[self.part]
