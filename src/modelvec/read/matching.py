"""Whether a Hub candidate has its base's matrices, judged from its config or its safetensors header.

Discovery (:mod:`modelvec.hub.discovery`) finds candidates and fetches their small files; the
judgement is this stage's, since only the architecture tables know which sizes and tensors make a
family. :class:`ArchitectureMatcher` is what the pipeline hands to discovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .architectures import detect

Shapes = Mapping[str, tuple[int, ...]]


def config_match(base_config: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a candidate's config.json describes the base's matrices; the reason either way."""
    arch = detect(base_config, "base")
    base_type = str(base_config.get("model_type") or "").lower()
    their_type = str(config.get("model_type") or "").lower()
    if their_type != base_type:
        return False, f"model_type '{their_type or 'none'}' is not the base's '{base_type}'"
    ours, theirs = arch.shape(base_config), arch.shape(config)
    for key, value in ours.items():
        if theirs[key] != value:
            return False, f"{key} {theirs[key]} differs from the base's {value}"
    return True, f"config matches the base ({base_type}, {len(ours)} sizes)"


def header_match(base_config: Mapping[str, Any], base: str, ours: Shapes, theirs: Shapes) -> tuple[bool, str]:
    """Compare the shapes of the base's matrices (``ours``) with a candidate's safetensors header (``theirs``)."""
    arch = detect(base_config, base)

    def find(table: Shapes, tensor: str) -> tuple[int, ...] | None:
        for prefix in arch.prefixes:
            if prefix + tensor in table:
                return table[prefix + tensor]
        return None

    checked = 0
    for ref in arch.matrices(base_config):
        a, b = find(ours, ref.tensor), find(theirs, ref.tensor)
        if a is None:
            continue
        if b != a:
            return False, f"safetensors header: {ref.tensor} is {b}, the base's is {a}"
        checked += 1
    if not checked:
        return False, "safetensors header: none of the base's matrices found"
    return True, f"safetensors header matches the base ({checked} matrices)"


class ArchitectureMatcher:
    """The judgements discovery needs, from the architecture tables (see :class:`modelvec.hub.discovery.Matcher`)."""

    def check_base(self, base: str, config: Mapping[str, Any]) -> None:
        """Raise an ArchitectureError when the base's family is not supported."""
        detect(config, base)

    def config_match(self, base_config: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[bool, str]:
        return config_match(base_config, config)

    def header_match(self, base_config: Mapping[str, Any], base: str, ours: Shapes, theirs: Shapes) -> tuple[bool, str]:
        return header_match(base_config, base, ours, theirs)
