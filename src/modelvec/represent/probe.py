"""The base's own inputs to each matrix on a fixed probe text: what ``Representation.probe`` takes deltas through.

A fine-tune changes a matrix by dW; what that changes in the network is dW's effect on the inputs the matrix
actually sees. For each matrix, H holds the base's inputs to it on the first ``tokens`` tokens of the packaged probe
text (``probe.txt``: varied generic prose, prompts and code written for this, from none of the evidence zoos'
data): the hidden state after the norm for q, k, v (and gate, up, ff1), the attention's output for o, the
feed-forward's inner activation for down (ff2), the encoder's output for a decoder's cross-attention k and v. The
vector then sketches dW·H, the first-order change of each layer's output on those tokens (see
:class:`~modelvec.represent.projection.ProbeProjection`), instead of dW itself.

H is computed once per base by one forward pass of ``transformers``' model for the base's own configuration (no
remote code: an architecture transformers does not ship is refused), with its weights in their stored dtype and
each layer lifted to float32 only while it runs, so memory holds the stored model once (mapped where transformers
maps it) plus one layer in float32. The arrays are float32, one per distinct input (q, k and v share theirs), keyed
by the tensor names of the layout (without its prefix).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ArchitectureError, CheckpointError
from ..read import Layout

PROBE_FILE = Path(__file__).with_name("probe.txt")
#: What a kept file of probe inputs is valid for besides the base and the text: bumped when their computation changes.
PROBE_VERSION = 1


@cache
def probe_text() -> str:
    """The packaged probe text (the same for every base; its checksum is part of what H is kept for)."""
    return PROBE_FILE.read_text(encoding="utf-8")


def probe_checksum() -> str:
    return hashlib.sha256(probe_text().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ProbeInputs:
    """H for every matrix of a base: ``arrays`` (name -> tokens x width, float32) and ``of`` (tensor name, without
    the layout's prefix -> the name of its array). ``tokens``: the probe tokens (rows of every array)."""

    tokens: int
    arrays: dict[str, np.ndarray]
    of: dict[str, str]

    def for_tensor(self, tensor: str) -> np.ndarray:
        return self.arrays[self.of[tensor]]


def _transformers(name: str) -> Any:
    """transformers, which runs the base for the probe (a dependency; refused in one line where it cannot be imported)."""
    try:
        import transformers
    except ImportError:
        raise ArchitectureError(
            name,
            "the probe runs the base through transformers, which cannot be imported (pip install transformers, "
            "or --probe none)",
        ) from None
    return transformers


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(":, ")


def probe_ids(folder: str | os.PathLike[str], tokens: int, name: str) -> list[int]:
    """The first ``tokens`` token ids of the probe text under the base's own tokenizer (its folder's)."""
    AutoTokenizer = _transformers(name).AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            name,
            f"the probe needs the base's tokenizer, and its folder has none usable ({_first_line(exc)}); "
            "--probe none embeds without it",
        ) from None
    ids = list(tokenizer(probe_text(), add_special_tokens=True, truncation=False)["input_ids"])
    if len(ids) < tokens:
        raise CheckpointError(name, f"the probe text is {len(ids)} tokens under this tokenizer, fewer than {tokens}")
    return ids[:tokens]


def _module_of(tensor: str, modules: dict[str, Any]) -> str | None:
    """The module whose weight ``tensor`` is, named as the model names it (prefixes may differ either way)."""
    stem = tensor.removesuffix(".weight")
    if stem in modules:
        return stem
    found = [n for n in modules if n.endswith("." + stem) or stem.endswith("." + n)]
    return max(found, key=len) if found else None


def _lift() -> tuple[Any, Any]:
    """Hooks that run a layer in float32 (its parameters and floating inputs) and put its stored weights back."""
    import torch

    stored: dict[str, torch.Tensor] = {}

    def up(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        for pname, p in module.named_parameters():
            if p.dtype != torch.float32:
                stored[pname] = p.data
                p.data = p.data.float()

        def lift(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return v.float() if v.is_floating_point() else v
            return type(v)(lift(x) for x in v) if isinstance(v, tuple) else v

        return tuple(lift(a) for a in args), {k: lift(v) for k, v in kwargs.items()}

    def down(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        for pname, p in module.named_parameters():
            if pname in stored:
                p.data = stored.pop(pname)

    return up, down


def _layers(model: Any) -> list[Any]:
    """The repeated blocks (each a ModuleList's children): what is lifted to float32 one at a time."""
    import torch

    return [m for mod in model.modules() if isinstance(mod, torch.nn.ModuleList) for m in mod]


def compute_inputs(folder: str | os.PathLike[str], layout: Layout, tokens: int, name: str) -> ProbeInputs:
    """H of the base in ``folder`` for every matrix of ``layout`` on the probe's first ``tokens`` tokens."""
    import torch

    transformers = _transformers(name)
    AutoConfig, AutoModel = transformers.AutoConfig, transformers.AutoModel
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    ids = probe_ids(folder, tokens, name)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        model, loading = AutoModel.from_pretrained(
            str(folder), config=config, dtype="auto", local_files_only=True, output_loading_info=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ArchitectureError(
            name, f"the probe runs the base through transformers, which cannot load it ({_first_line(exc)})"
        ) from None
    lacking = sorted([*loading.get("missing_keys", ()), *(str(k[0]) for k in loading.get("mismatched_keys", ()))])
    if lacking:  # transformers would run them as random weights: the inputs would be nobody's
        raise CheckpointError(
            name,
            f"the probe runs the base, and its checkpoint lacks {len(lacking)} of the tensors that needs "
            f"({lacking[0]}, ...); --probe none embeds without running it",
        )
    model.eval()
    modules = dict(model.named_modules())
    wanted: dict[str, str] = {}  # module -> tensor
    for ref in layout.refs:
        module = _module_of(ref.tensor, modules)
        if module is None:
            raise ArchitectureError(name, f"the probe found no module of transformers' model for {ref.tensor}")
        wanted[module] = ref.tensor
    arrays: dict[str, np.ndarray] = {}
    of: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], tuple[str, Any]] = {}  # holds each input: no address is reused
    handles = []

    def keep(module_name: str) -> Any:
        def hook(module: Any, args: tuple) -> None:
            x = args[0].detach()
            key = (x.data_ptr(), tuple(x.shape))
            if key not in seen:  # q, k and v (gate and up) read one tensor: kept once
                seen[key] = (module_name, x)
                arrays[module_name] = x.reshape(-1, x.shape[-1]).to(torch.float32).numpy().copy()
            of[wanted[module_name]] = seen[key][0]

        return hook

    for module_name in wanted:
        handles.append(modules[module_name].register_forward_pre_hook(keep(module_name)))
    for layer in _layers(model):
        up, down = _lift()
        handles.append(layer.register_forward_pre_hook(up, with_kwargs=True))
        handles.append(layer.register_forward_hook(down, with_kwargs=True))
    batch = torch.tensor([ids])
    extra = {"decoder_input_ids": batch} if getattr(config, "is_encoder_decoder", False) else {}
    try:
        with torch.no_grad():
            model(input_ids=batch, **extra)
    finally:
        for h in handles:
            h.remove()
    if missing := sorted(set(wanted.values()) - set(of)):
        raise ArchitectureError(name, f"the probe's forward pass never reached {missing[0]}")
    return ProbeInputs(tokens, arrays, of)
