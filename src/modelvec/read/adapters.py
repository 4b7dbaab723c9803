"""PEFT LoRA adapters as models: their deltas read as thin factors, never as whole matrices.

A folder with ``adapter_config.json`` and ``adapter_model.safetensors`` (or ``adapter_model.bin``)
is a fine-tune of its base whose delta is known in factored form: for each adapted module
dW = scaling * B A (PEFT's ``lora_A`` is [r, in], ``lora_B`` [out, r]), with scaling =
lora_alpha / r, or lora_alpha / sqrt(r) with ``use_rslora``, r and alpha resolved per module from
``rank_pattern`` / ``alpha_pattern``. In the description's orientation (x @ W, W in R^{in x out})
that is dW = L R^T with L = scaling * A^T (in x r) and R = B (out x r), whether the module is an
nn.Linear or GPT-2's Conv1D: ``fan_in_fan_out`` only tells PEFT to transpose the product into
Conv1D's [in, out] storage when it merges, and A and B have the same shapes either way.

Modules map onto the base's :class:`~modelvec.read.roles.MatrixRef` exactly as a full
fine-tune's tensors do (prefixes, fused parts: a LoRA on GPT-2's ``c_attn`` splits into q | k | v
by the rows of B), so adapters and full fine-tunes of one base share one vector space; a matrix the
adapter leaves alone has dW = 0, as the merged model would. Which modules carry a delta follows
PEFT's own loading rules (``target_modules``, ``exclude_modules``, ``layers_to_transform``,
``modules_to_save``), mirrored from peft 0.21 so that no PEFT install is needed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
import xxhash

from ..core.errors import CheckpointError, IncompatibleError
from ..core.files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from .adapter_config import AdapterConfig
from .architectures import ARCHITECTURES
from .checkpoint import Checkpoint, LowRankDelta
from .layout import Layout
from .roles import Architecture, MatrixRef
from .weightfiles import read_json

PathLike = str | os.PathLike[str]
Key = tuple[str, int, str]  # MatrixRef.key: (stack, layer, family)

_PREFIX = "base_model.model."  # what PEFT puts before the wrapped model's module names
_LORA_KEY = re.compile(r"(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight")


def _listing(names: Iterable[str], limit: int = 3) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown or "none"


@dataclass(frozen=True)
class _Hit:
    """A module name matched to an architecture table entry."""

    prefix: str
    stack: int
    tensor: int
    layer: int


@cache
def _module_patterns(arch: Architecture) -> tuple[tuple[re.Pattern[str], str, int, int], ...]:
    """Each table entry as a pattern over module names (the tensor name without ``.weight``)."""
    out = []
    for s, stack in enumerate(arch.stacks):
        for t, tensor in enumerate(stack.tensors):
            module = tensor.template.removesuffix(".weight")
            pattern = re.escape(module).replace(re.escape("${layer}"), r"(\d+)")
            for prefix in arch.prefixes:
                out.append((re.compile(re.escape(prefix) + pattern), prefix, s, t))
    return tuple(out)


def _match(arch: Architecture, module: str) -> _Hit | None:
    for pattern, prefix, s, t in _module_patterns(arch):
        found = pattern.fullmatch(module)
        if found:
            return _Hit(prefix, s, t, int(found.group(1)))
    return None


class AdapterCheckpoint(Checkpoint):
    """A PEFT LoRA adapter folder, read lazily like any checkpoint; :meth:`low_rank_deltas` gives its factored deltas.

    ``stamp`` and ``fingerprint`` cover ``adapter_config.json`` too: alpha, rank_pattern or
    use_rslora change the delta without touching the weights file.
    """

    def __init__(self, path: PathLike, name: str | None = None) -> None:
        if not (Path(path) / ADAPTER_CONFIG).is_file():
            raise CheckpointError(name or str(path), f"not an adapter folder: no {ADAPTER_CONFIG} in {path}")
        super().__init__(path, name)
        config_file = self.folder / ADAPTER_CONFIG
        self.lora = AdapterConfig.from_config(read_json(config_file, self.name), self.name)
        self._config_bytes = config_file.read_bytes()
        self._modules: dict[str, tuple[str, str]] | None = None

    def _locate_weights(self) -> tuple[list[Path], dict[str, Path] | None]:
        for name in ADAPTER_WEIGHTS:
            if (self.folder / name).is_file():
                return [self.folder / name], None
        raise CheckpointError(self.name, f"no adapter weights in {self.path} (looked for {', '.join(ADAPTER_WEIGHTS)})")

    def stamp(self) -> str:
        digest = xxhash.xxh3_128(super().stamp().encode())
        digest.update(self._config_bytes)
        return "stat:" + digest.hexdigest()

    def fingerprint(self) -> str:
        digest = xxhash.xxh3_128(super().fingerprint().encode())
        digest.update(self._config_bytes)
        return digest.hexdigest()

    def modules(self) -> dict[str, tuple[str, str]]:
        """Every LoRA module in the weights file: module name (as PEFT matches it) -> (lora_A key, lora_B key)."""
        if self._modules is None:
            pairs: dict[str, dict[str, str]] = {}
            for key in sorted(self.keys()):
                if "lora_magnitude_vector" in key:
                    raise CheckpointError(self.name, f"holds DoRA magnitude vectors ({key}): DoRA is not supported")
                found = _LORA_KEY.fullmatch(key)
                if found:
                    pairs.setdefault(found["module"].removeprefix(_PREFIX), {})[found["which"]] = key
            for module, pair in pairs.items():
                if len(pair) != 2:
                    have, lack = ("lora_A", "lora_B") if "A" in pair else ("lora_B", "lora_A")
                    raise CheckpointError(self.name, f"holds {have} but no {lack} for {module}")
            self._modules = {module: (pair["A"], pair["B"]) for module, pair in pairs.items()}
        return self._modules

    def layout(self) -> Layout:
        """The matrices the adapter adapts, in the family its module names belong to (no base needed).

        What a checkpoint's layout is for an adapter; :meth:`low_rank_deltas` maps onto the base's own
        layout, and this one names the family when it is not the base's.
        """
        if self._layout is None:
            modules = self.modules()
            best: tuple[Architecture, list[tuple[str, _Hit]]] | None = None
            for arch in ARCHITECTURES.values():
                hits = [(m, hit) for m in modules if (hit := _match(arch, m)) is not None]
                if hits and (best is None or len(hits) > len(best[1])):
                    best = (arch, hits)
            if best is None:
                raise CheckpointError(
                    self.name,
                    f"adapts no attention or feed-forward matrix of a supported family (adapted: {_listing(modules)})",
                )
            arch, hits = best
            refs = []
            for _, hit in sorted(hits, key=lambda mh: (mh[1].stack, mh[1].layer, mh[1].tensor)):
                stack = arch.stacks[hit.stack]
                tensor = stack.tensors[hit.tensor]
                refs += [
                    MatrixRef(
                        stack=stack.name,
                        layer=hit.layer,
                        family=family,
                        tensor=tensor.name(hit.layer),
                        orientation=tensor.orientation,
                        part=part,
                        n_parts=len(tensor.families),
                        fused=tensor.fused,
                    )
                    for part, family in enumerate(tensor.families)
                ]
            self._layout = Layout(arch, refs, hits[0][1].prefix)
        return self._layout

    factored = True

    def low_rank_deltas(self, base: Layout, shapes: Mapping[Key, tuple[int, ...]]) -> dict[Key, LowRankDelta]:
        """The factored delta of every base matrix the adapter changes, keyed like ``MatrixRef.key``.

        ``shapes`` gives each base matrix's (n, m) in the description's orientation (fused parts
        split). Modules outside the representation (heads, embeddings, a pooler) are ignored, as
        for full fine-tunes; a module of the base's family that the base lacks, a shape that does
        not fit, or an adapter that changes none of the base's matrices is an IncompatibleError.
        """
        by_tensor: dict[str, list[MatrixRef]] = {}
        for ref in base.refs:
            by_tensor.setdefault(ref.tensor, []).append(ref)
        stored = self.modules()
        adapted = {m: keys for m, keys in stored.items() if self.lora.targets(m)}  # PEFT loads only these
        for key in sorted(self.keys()):  # modules_to_save: whole copies, not a LoRA
            if key.endswith(".weight") and _match(base.arch, key.removeprefix(_PREFIX).removesuffix(".weight")):
                raise CheckpointError(
                    self.name,
                    f"stores the whole of {key.removeprefix(_PREFIX)} (modules_to_save), "
                    "a matrix of the representation: not supported",
                )
        out: dict[Key, LowRankDelta] = {}
        prefixes = set()
        for module, (a_key, b_key) in stored.items():
            hit = _match(base.arch, module)
            if hit is None:
                continue  # a head, the embeddings, a pooler: not in the representation
            tensor = base.arch.stacks[hit.stack].tensors[hit.tensor].name(hit.layer)
            refs = by_tensor.get(tensor)
            if refs is None:
                layers = max(r.layer for r in base.refs) + 1
                raise IncompatibleError(
                    self.name, f"adapts {module}, which the base does not have ({base.arch.name}, {layers} layers)"
                )
            prefixes.add(hit.prefix)
            if module in adapted:
                out.update(self._factors(module, a_key, b_key, refs, shapes))
        for prefix in sorted(prefixes):  # PEFT puts a LoRA on these; without weights it would keep its initial ones
            for tensor in by_tensor:
                module = prefix + tensor.removesuffix(".weight")
                if self.lora.targets(module) and module not in adapted:
                    raise CheckpointError(
                        self.name, f"target_modules selects {module}, but the adapter has no lora_A/lora_B for it"
                    )
        if not out:
            raise self._matches_nothing(base, adapted or stored)
        return out

    def _factors(
        self, module: str, a_key: str, b_key: str, refs: list[MatrixRef], shapes: Mapping[Key, tuple[int, ...]]
    ) -> dict[Key, LowRankDelta]:
        a, b = self.get(a_key), self.get(b_key)
        n = shapes[refs[0].key][0]
        whole = sum(shapes[ref.key][1] for ref in refs) if len(refs) == refs[0].n_parts else -1
        r, _ = self.lora.rank_alpha(module)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[1] != n or b.shape[0] != whole:
            raise IncompatibleError(
                self.name,
                f"{module}: lora_A is {list(a.shape)} and lora_B {list(b.shape)}, but the "
                f"base's {refs[0].tensor} needs [r, {n}] and [{whole}, r]",
            )
        if a.shape[0] != r:
            raise CheckpointError(self.name, f"{module}: lora_A has rank {a.shape[0]}, {ADAPTER_CONFIG} gives r={r}")
        for key, tensor in ((a_key, a), (b_key, b)):
            if not torch.isfinite(tensor).all():
                raise CheckpointError(self.name, f"tensor {key} has NaN or Inf values")
        left = a.T.double() * self.lora.scale(module)
        right = b.double()
        spans = {ref.key: ref.span(whole) for ref in refs}
        return {ref.key: LowRankDelta(left, right[s[0] : s[1]]) for ref in refs if (s := spans[ref.key]) is not None}

    def _matches_nothing(self, base: Layout, modules: Mapping[str, Any]) -> IncompatibleError:
        """The error for an adapter that changes none of the base's matrices: another family, or targets elsewhere."""
        try:
            own = self.layout().arch
        except CheckpointError:
            own = None
        of = f" (base_model_name_or_path: {self.lora.base_model})" if self.lora.base_model else ""
        if own is not None and own is not base.arch:
            return IncompatibleError(
                self.name, f"is an adapter of a {own.name} model{of}, the base is {base.arch.name}"
            )
        targets = self.lora.target_modules
        shown = targets if isinstance(targets, str) else _listing(targets)
        return IncompatibleError(
            self.name,
            f"target_modules ({shown}) match none of the base's {base.arch.name} "
            f"matrices (adapted: {_listing(modules)})",
        )
