"""Where a checkpoint's matrices are: its architecture's matrix refs under the name prefix found in its files, and
the check that a fine-tune has its base's (from names and shapes alone: no tensor is read)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..core.errors import CheckpointError, IncompatibleError
from .roles import Architecture, MatrixRef


class Named(Protocol):
    """What a one-line error names: a checkpoint (:class:`~modelvec.read.checkpoint.Checkpoint`), by its name."""

    name: str


class Layout:
    """The resolved matrices of one checkpoint: its architecture, matrix refs and name prefix."""

    def __init__(self, arch: Architecture, refs: list[MatrixRef], prefix: str) -> None:
        self.arch = arch
        self.refs = refs
        self.prefix = prefix

    def by_layer(self) -> Iterator[tuple[str, int, list[MatrixRef]]]:
        """Refs grouped by (stack, layer), in order."""
        group: list[MatrixRef] = []
        for ref in self.refs:
            if group and (group[0].stack, group[0].layer) != (ref.stack, ref.layer):
                yield group[0].stack, group[0].layer, group
                group = []
            group.append(ref)
        if group:
            yield group[0].stack, group[0].layer, group


def resolve_layout(arch: Architecture, config: dict[str, Any], names: set[str], model: str) -> Layout:
    """The layout of a checkpoint of ``arch`` whose configuration is ``config`` and tensors ``names``: its matrix
    refs under the first of the architecture's prefixes its names use; a one-line error where one is missing."""
    refs = arch.matrices(config)
    if not refs:
        raise CheckpointError(model, "the architecture has no layers to read")
    prefix = next((p for p in arch.prefixes if p + refs[0].tensor in names), None)
    if prefix is None:
        raise CheckpointError(
            model,
            f"missing tensor {refs[0].tensor} (also tried prefixes {', '.join(repr(p) for p in arch.prefixes if p)})",
        )
    for ref in refs:
        if prefix + ref.tensor not in names:
            raise CheckpointError(model, f"missing tensor {prefix + ref.tensor}")
    return Layout(arch, refs, prefix)


def infer_config(arch: Architecture, names: set[str]) -> dict[str, Any]:
    """Layer counts from tensor names, for a bare weights file without config.json."""
    config: dict[str, Any] = {}
    for stack in arch.stacks:
        first = stack.tensors[0]
        count = 0
        while any(p + first.name(count) in names for p in arch.prefixes):
            count += 1
        for key in stack.layers_keys:
            config.setdefault(key, count)
    return config


def check_compatible(model: Named, model_layout: Layout, base_layout: Layout) -> None:
    """A fine-tune must have its base's family and matrices; raises a one-line error otherwise."""
    if model_layout.arch is not base_layout.arch:
        raise IncompatibleError(
            model.name, f"family {model_layout.arch.name} does not match the base's family {base_layout.arch.name}"
        )
    if [r.key for r in model_layout.refs] != [r.key for r in base_layout.refs]:
        n_model = max(r.layer for r in model_layout.refs) + 1
        n_base = max(r.layer for r in base_layout.refs) + 1
        raise IncompatibleError(
            model.name, f"has {n_model} layers / matrices that differ from the base's ({n_base} layers)"
        )
