"""``adapter_config.json`` as PEFT resolves it: which modules carry a LoRA delta, with which rank and scaling.

Read for :class:`~modelvec.read.adapters.AdapterCheckpoint` and checked on reading: a config that leaves the delta
undefined (another PEFT type, a LoRA variant whose merged weights are not base + scaling * B A, a missing or
ill-typed key) is a one-line CheckpointError naming the key. The matching rules mirror peft 0.21's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import CheckpointError
from ..core.files import ADAPTER_CONFIG

#: Keys without which the delta is undefined (PEFT would fill in its defaults, silently changing it).
REQUIRED_KEYS = ("peft_type", "r", "lora_alpha", "target_modules")

#: PEFT types with no weight delta of the form scaling * B A, and what they learn instead.
_OTHER_TYPES = {
    "PROMPT_TUNING": "virtual prompt tokens, not weights",
    "PREFIX_TUNING": "per-layer virtual key/value prefixes, not weights",
    "P_TUNING": "virtual prompt tokens, not weights",
    "MULTITASK_PROMPT_TUNING": "virtual prompt tokens, not weights",
    "IA3": "rescalings of activations, not additive deltas",
}
#: LoRA initialisations that rewrite the base weights themselves: the adapter alone is not the delta
#: from the published base unless PEFT converted it on saving (which sets init_lora_weights to true).
_BASE_CHANGING_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")
#: LoRA variants whose merged weight is not base + scaling * B A (or that cannot be merged at all).
_VARIANTS = {
    "use_dora": "DoRA (use_dora)",
    "use_qalora": "QALoRA (use_qalora)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "layer_replication": "layer replication (layer_replication)",
    "target_parameters": "LoRA on parameters (target_parameters)",
}


@dataclass(frozen=True, kw_only=True)
class AdapterConfig:
    """What ``adapter_config.json`` says about each module's delta; the matching rules are PEFT's.

    ``targets`` mirrors ``peft.tuners.tuners_utils.check_target_module_exists`` and
    ``rank_alpha`` mirrors ``LoraModel._create_and_replace`` (``get_pattern_key``), both as of
    peft 0.21; the keys are module names in the wrapped model (``bert.encoder.layer.0...``).
    """

    r: int
    lora_alpha: float
    target_modules: str | tuple[str, ...]
    rank_pattern: Mapping[str, int]
    alpha_pattern: Mapping[str, float]
    use_rslora: bool = False
    fan_in_fan_out: bool = False  # how PEFT stores the merged product; A and B, hence L R^T, do not depend on it
    exclude_modules: str | tuple[str, ...] | None = None
    modules_to_save: tuple[str, ...] | None = None
    layers_to_transform: int | tuple[int, ...] | None = None
    layers_pattern: str | tuple[str, ...] | None = None
    base_model: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], model: str) -> AdapterConfig:
        """The validated config; a one-line CheckpointError for anything that leaves the delta undefined."""
        read = _ConfigReader(config, model)
        read.check_supported()
        targets = read.names("target_modules")
        if targets is None:
            raise read.fail("target_modules is null, so no module is adapted")
        layers = read.layers()
        flags = read.flags()
        base = config.get("base_model_name_or_path")
        lora = cls(
            r=read.number("r", config["r"], True),
            lora_alpha=read.number("lora_alpha", config["lora_alpha"], False),
            target_modules=targets,
            rank_pattern=read.patterns("rank_pattern", True),
            alpha_pattern=read.patterns("alpha_pattern", False),
            **flags,
            exclude_modules=read.names("exclude_modules"),
            modules_to_save=read.names("modules_to_save", allow_str=False),  # type: ignore[arg-type]  # no str here
            layers_to_transform=layers,
            layers_pattern=read.names("layers_pattern"),
            base_model=str(base) if base else None,
        )
        for key, value in lora._regexes():
            try:
                re.compile(value)
            except re.error as exc:
                raise read.fail(f"{key} holds {value!r}, not a valid regular expression ({exc})") from None
        return lora

    def _regexes(self) -> Iterator[tuple[str, str]]:
        """What PEFT matches as regular expressions, with the key each comes from (checked once, on reading)."""
        for key in ("target_modules", "exclude_modules"):
            if isinstance(getattr(self, key), str):
                yield key, getattr(self, key)
        for key in ("layers_pattern", "modules_to_save", "rank_pattern", "alpha_pattern"):
            value = getattr(self, key)
            for item in [value] if isinstance(value, str) else value or ():
                yield key, item

    def targets(self, key: str) -> bool:
        """Whether PEFT puts a LoRA on module ``key`` (its weights are loaded only then)."""
        exclude = self.exclude_modules
        if exclude:
            if isinstance(exclude, str):
                if re.fullmatch(exclude, key):
                    return False
            elif key in exclude or any(key.endswith(f".{e}") for e in exclude):
                return False
        if self.modules_to_save and any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in self.modules_to_save):
            return False
        targets = self.target_modules
        if isinstance(targets, str):
            # PEFT expands "all-linear" to every linear layer but the output head before matching;
            # every matrix of the representation is such a layer.
            return targets.lower() == "all-linear" or re.fullmatch(targets, key) is not None
        if key in targets:
            return True
        if not any(key.endswith(f".{t}") for t in targets):
            return False
        layers = self.layers_to_transform
        if layers is None or layers == ():
            return True
        match = None
        if not self.layers_pattern:
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
        else:
            for pattern in (self.layers_pattern,) if isinstance(self.layers_pattern, str) else self.layers_pattern:
                match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
                if match is not None:
                    break
        if match is None:
            return False
        index = int(match["idx"])
        return index == layers if isinstance(layers, int) else index in layers

    def rank_alpha(self, key: str) -> tuple[int, float]:
        """Module ``key``'s r and lora_alpha: the first pattern of each map that matches the key's end."""

        def lookup(patterns: Mapping[str, Any], default: Any) -> Any:
            found = next((p for p in patterns if re.match(rf"(.*\.)?({p})$", key)), None)
            return patterns[found] if found is not None else default

        return lookup(self.rank_pattern, self.r), lookup(self.alpha_pattern, self.lora_alpha)

    def scale(self, key: str) -> float:
        r, alpha = self.rank_alpha(key)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r


class _ConfigReader:
    """``adapter_config.json``'s values for :meth:`AdapterConfig.from_config`, each checked as it is read: a value
    that leaves the delta undefined is a one-line CheckpointError naming the key."""

    def __init__(self, config: Mapping[str, Any], model: str) -> None:
        self.config = config
        self.model = model

    def fail(self, cause: str) -> CheckpointError:
        return CheckpointError(self.model, f"{ADAPTER_CONFIG}: {cause}")

    def check_supported(self) -> None:
        """A LoRA adapter whose merged weights are base + scaling * B A, with every key that defines it."""
        config = self.config
        missing = [k for k in REQUIRED_KEYS if k not in config]
        if "peft_type" in config and str(config["peft_type"]).upper() != "LORA":
            kind = str(config["peft_type"]).upper()
            why = _OTHER_TYPES.get(kind, "not implemented")
            raise self.fail(
                f"peft_type {kind} is not supported: only LoRA adapters are ({kind} learns {why})"
                if kind in _OTHER_TYPES
                else f"peft_type {kind} is not supported: only LoRA adapters are"
            )
        if missing:
            raise self.fail(f"lacks {', '.join(missing)}")
        for key, what in _VARIANTS.items():
            if config.get(key) not in (None, False, [], {}):
                raise self.fail(f"{what} is not supported: its merged weights are not base + scaling * B A")
        init = config.get("init_lora_weights")
        if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
            raise self.fail(
                f"init_lora_weights {init!r} changes the base weights themselves, so the adapter alone is not "
                "the delta (save it with PEFT's path_initial_model_for_weight_conversion)"
            )

    def number(self, key: str, value: Any, integer: bool) -> Any:
        ok = isinstance(value, int) if integer else isinstance(value, (int, float)) and math.isfinite(value)
        if isinstance(value, bool) or not ok or (integer and value < 1):
            raise self.fail(f"{key} must be {'a positive integer' if integer else 'a number'}, not {value!r}")
        return value

    def patterns(self, key: str, integer: bool) -> dict[str, Any]:
        value = self.config.get(key) or {}
        if not isinstance(value, dict):
            raise self.fail(f"{key} must be a map of module patterns, not {value!r}")
        return {str(k): self.number(f"{key}[{k!r}]", v, integer) for k, v in value.items()}

    def names(self, key: str, allow_str: bool = True) -> str | tuple[str, ...] | None:
        value = self.config.get(key)
        if value is None or (allow_str and isinstance(value, str)):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise self.fail(f"{key} must be {'a string or ' if allow_str else ''}a list of module names, not {value!r}")

    def layers(self) -> int | tuple[int, ...] | None:
        """``layers_to_transform``: a layer index, or a tuple of them."""
        layers = self.config.get("layers_to_transform")
        if not (
            layers is None
            or (isinstance(layers, int) and not isinstance(layers, bool))
            or (isinstance(layers, list) and all(isinstance(i, int) for i in layers))
        ):
            raise self.fail(f"layers_to_transform must be a layer index or a list of them, not {layers!r}")
        return tuple(layers) if isinstance(layers, list) else layers

    def flags(self) -> dict[str, bool]:
        flags = {}
        for key in ("use_rslora", "fan_in_fan_out"):
            flags[key] = self.config.get(key) or False
            if not isinstance(flags[key], bool):
                raise self.fail(f"{key} must be true or false, not {flags[key]!r}")
        return flags
