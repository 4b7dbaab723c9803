"""Every matrix's squared singular values, read from a checkpoint (or its delta to a base): the rank study's input.

Each stored tensor is read once, whole, and every matrix studied in it (a fused tensor: the whole and each part)
is taken from that read. The σᵢ² are the eigenvalues of the float64 Gram matrix of the exact float64 upcast
(:mod:`modelvec.spectra.energy`), on either device, so every rank equals a float64 SVD's:

- on the CPU, safetensors are read with numpy alone (:meth:`~modelvec.read.checkpoint.Checkpoint.float64`: no
  torch is imported, a large share of a small study's seconds) and the tensors are spread over threads, one
  LAPACK call each; ``.bin`` and GGUF files are read through torch;
- on a GPU, threads read the next tensors' bytes while the GPU forms each Gram matrix and its eigenvalues, in
  float64. What bounds it is cuSOLVER's ``syevd``, one matrix at a time: 0.10 s for a 4,096-wide Gram on an
  H200 (0.08 s in float32; no faster batched or on several streams), 16 of an 8B model's 19.7 s; CPU threads
  sharing the eigenvalues (LAPACK, 16 cores) did not shorten it (19.5 s without them): docs/scale.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import CheckpointError, IncompatibleError
from ..read import MatrixRef, Orientation, open_checkpoint
from ..read.checkpoint import NUMPY_DTYPES, Checkpoint, refuse_quantized_delta, warn_if_quantized
from ..read.layout import Layout, check_compatible
from ..spectra.energy import as_float64, block_energies, each_on_a_thread, fuses_by_gram
from ..spectra.tables import Spectrum

if TYPE_CHECKING:
    import torch

PathLike = str | os.PathLike[str]
KINDS = ("weights", "delta")
_READ_AHEAD = 6  # tensors read ahead of a GPU (each at most one 8B MLP matrix, 117 MB in bf16)


@dataclass(frozen=True, kw_only=True)
class Tensor:
    """One stored tensor and the matrices studied in it: each ref with its columns of the whole (n x m, the
    description's orientation); ``from_parts``: the last ref is the whole, whose Gram is the sum of the parts'."""

    name: str
    refs: tuple[MatrixRef, ...]
    spans: tuple[tuple[int, int], ...]
    n: int
    linear: bool
    from_parts: bool

    def blocks(self, whole: Any) -> list[Any]:
        """Each studied matrix as a view of ``whole`` (the tensor as stored, numpy or torch), the whole last
        left out where it comes from its parts."""
        view = whole.T if self.linear else whole  # the description's orientation: free, a view
        spans = self.spans[:-1] if self.from_parts else self.spans
        return [view[:, a:b] for a, b in spans]

    def shapes(self) -> list[tuple[int, int]]:
        return [(self.n, b - a) for a, b in self.spans]


def _refs(layout: Layout, fused: bool) -> list[MatrixRef]:
    """The layout's matrices, plus each fused tensor whole (e.g. GPT-2's c_attn as ``qkv``)."""
    refs = []
    for ref in layout.refs:
        if fused and ref.fused and ref.part == 0:
            refs.append(dataclasses.replace(ref, family=ref.fused, part=0, n_parts=1))
        refs.append(ref)
    return refs


def plan_tensors(ck: Checkpoint, layout: Layout, fused: bool = True) -> tuple[list[MatrixRef], list[Tensor]]:
    """The matrices studied (in the table's order) and the tensors to read for them, each once."""
    refs = _refs(layout, fused)
    by_tensor: dict[str, list[MatrixRef]] = {}
    for ref in refs:
        by_tensor.setdefault(ref.tensor, []).append(ref)
    tensors = []
    for tensor, group in by_tensor.items():
        group = [r for r in group if r.n_parts > 1] + [r for r in group if r.n_parts == 1]  # parts, then the whole
        spans = [ck.columns(r, layout.prefix) for r in group]
        n = spans[0][0]
        shapes = [(n, b - a) for _, (a, b) in spans[:-1]]
        from_parts = len(group) > 1 and group[-1].n_parts == 1 and fuses_by_gram(shapes)
        linear = group[0].orientation is Orientation.LINEAR
        tensors.append(
            Tensor(
                name=layout.prefix + tensor,
                refs=tuple(group),
                spans=tuple(s for _, s in spans),
                n=n,
                linear=linear,
                from_parts=from_parts,
            )
        )
    return refs, tensors


def spectra_of(
    model: PathLike | Checkpoint,
    *,
    base: PathLike | Checkpoint | None = None,
    of: str = "weights",
    fused: bool = True,
    device: str = "auto",
) -> list[Spectrum]:
    """Squared singular values of every matrix of ``model`` (``of="weights"``) or of its delta to ``base``.

    A ``.gguf`` file is read dequantized (``quantized.GGUFCheckpoint``); when quantized, its weights'
    study warns (``QuantizationWarning``: the noise raises the measured rank) and a delta is refused.
    """
    if of not in KINDS:
        raise ValueError(f"of must be one of {', '.join(KINDS)}, not {of!r}")
    where = study_device(device)
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    layout = ck.layout()
    base_ck = None
    if of == "delta":
        if base is None:
            raise ValueError("of='delta' needs a base")
        base_ck = base if isinstance(base, Checkpoint) else open_checkpoint(base)
        check_compatible(ck, layout, base_ck.layout())
        refuse_quantized_delta(ck)
        refuse_quantized_delta(base_ck)
    else:
        warn_if_quantized(ck)
    refs, tensors = plan_tensors(ck, layout, fused)
    if base_ck is not None:
        _check_shapes(ck, base_ck, tensors)
    energies = (_on_cpu if where == "cpu" else _on_gpu)(ck, base_ck, tensors, where)
    out: dict[tuple[str, int, str], Spectrum] = {}
    for tensor, values in zip(tensors, energies):
        for ref, shape, e in zip(tensor.refs, tensor.shapes(), values):
            if not np.isfinite(e).all():
                raise CheckpointError(ck.name, f"tensor {tensor.name} has NaN or Inf values")
            out[(ref.stack, ref.layer, ref.family)] = Spectrum(ref.stack, ref.layer, ref.family, shape, e)
    return [out[(r.stack, r.layer, r.family)] for r in refs]


def study_device(device: str) -> str:
    """The device's name, resolved as the embedder resolves it, but without importing torch for the CPU: ``auto``
    where no NVIDIA driver has a GPU is the CPU at once (the torch import is a second of a small study)."""
    if device == "cpu" or (device == "auto" and not _nvidia_gpu_present()):
        return "cpu"
    from ..represent import resolve_device

    return str(resolve_device(device))


def _nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver lists a GPU here (its /proc entries), without loading CUDA."""
    try:
        return any(os.scandir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def _check_shapes(ck: Checkpoint, base_ck: Checkpoint, tensors: Sequence[Tensor]) -> None:
    for tensor in tensors:
        mine, theirs = ck.shape(tensor.name), base_ck.shape(_base_name(base_ck, ck, tensor.name))
        if mine != theirs:
            raise IncompatibleError(
                ck.name, f"tensor {tensor.name} has shape {list(mine)}, the base's has {list(theirs)}"
            )


def _base_name(base_ck: Checkpoint, ck: Checkpoint, name: str) -> str:
    """The base's name of a tensor of ``ck`` (the two may store their layers under different prefixes)."""
    mine, theirs = ck.layout().prefix, base_ck.layout().prefix
    return theirs + name[len(mine) :]


# --- the CPU: numpy, one tensor per thread ------------------------------------------------------------------
def read_float64(ck: Checkpoint, name: str) -> np.ndarray:
    """A tensor's exact float64 upcast as stored: numpy from safetensors, torch for ``.bin`` and GGUF."""
    a = ck.float64(name)
    return as_float64(ck.get_stored(name)) if a is None else a


def _on_cpu(ck: Checkpoint, base_ck: Checkpoint | None, tensors: Sequence[Tensor], _: str) -> list[list[np.ndarray]]:
    def one(tensor: Tensor) -> list[np.ndarray]:
        a = read_float64(ck, tensor.name)
        if base_ck is not None:  # exact: the float64 difference of two float32/bf16 values
            a -= read_float64(base_ck, _base_name(base_ck, ck, tensor.name))
        return block_energies(tensor.blocks(a), whole=tensor.from_parts)

    return each_on_a_thread(one, list(tensors))


# --- a GPU: bytes read ahead on threads, float64 Grams and eigenvalues on the device -------------------------
def _raw(ck: Checkpoint, name: str) -> Any:
    """A tensor's stored bytes in host memory (numpy, read with one system call), or for ``.bin`` and GGUF the
    tensor torch reads; on a reader thread."""
    where = ck.stored(name)
    if where is None:
        return ck.get_stored(name)
    raw = np.empty(where.nbytes, np.uint8)
    with open(where.file, "rb", buffering=0) as fh:
        fh.seek(where.offset)
        view, got = raw.data, 0
        while got < where.nbytes:
            n = fh.readinto(view[got:])
            if not n:
                raise CheckpointError(ck.name, f"{where.file.name} ends inside tensor {name}")
            got += n
    dtype = np.int16 if where.dtype == "BF16" else NUMPY_DTYPES[where.dtype]
    return (raw.view(dtype).reshape(where.shape), where.dtype)


def _on_device(raw: Any, device: str) -> torch.Tensor:
    """What :func:`_raw` read, on the device, as its exact float64 upcast."""
    import torch

    if isinstance(raw, torch.Tensor):
        return raw.to(device).double()
    array, dtype = raw
    tensor = torch.from_numpy(array).to(device)
    return (tensor.view(torch.bfloat16) if dtype == "BF16" else tensor).double()


def _grams(blocks: list[torch.Tensor], whole: bool) -> list[torch.Tensor] | None:
    """The float64 Gram matrix of each block's smaller side (and the whole's, from the parts'); None where a
    value is not finite."""
    import torch

    if not all(bool(torch.isfinite(w).all()) for w in blocks):
        return None
    if whole:  # each part's (n x n) Gram, wide parts (fuses_by_gram): the whole's is their sum
        grams = [w @ w.mT for w in blocks]
        grams.append(torch.stack(grams).sum(0))
    else:
        grams = [w.mT @ w if w.shape[1] <= w.shape[0] else w @ w.mT for w in blocks]
    return grams


def _eigenvalues(gram: torch.Tensor) -> np.ndarray:
    """σᵢ² from a Gram matrix on the device: float64 ``syevd``, descending."""
    import torch

    return torch.linalg.eigvalsh(gram).flip(-1).clamp_min(0).cpu().numpy()


def _read_ahead(read: Callable[[Tensor], Any], tensors: Sequence[Tensor], ahead: int) -> Iterator[tuple[Tensor, Any]]:
    """Each tensor with what ``read`` gave for it, in order, read on threads at most ``ahead`` tensors ahead."""
    with ThreadPoolExecutor(ahead, thread_name_prefix="modelvec-read") as pool:
        pending: deque[tuple[Tensor, Future]] = deque()
        queue = iter(tensors)
        for tensor in queue:
            pending.append((tensor, pool.submit(read, tensor)))
            if len(pending) >= ahead:
                break
        while pending:
            tensor, future = pending.popleft()
            following = next(queue, None)
            if following is not None:
                pending.append((following, pool.submit(read, following)))
            yield tensor, future.result()


def _on_gpu(
    ck: Checkpoint, base_ck: Checkpoint | None, tensors: Sequence[Tensor], device: str
) -> list[list[np.ndarray]]:
    def read(tensor: Tensor) -> tuple[Any, Any]:
        theirs = None if base_ck is None else _raw(base_ck, _base_name(base_ck, ck, tensor.name))
        return _raw(ck, tensor.name), theirs

    out = []
    for tensor, (mine, theirs) in _read_ahead(read, tensors, _READ_AHEAD):
        a = _on_device(mine, device)
        if theirs is not None:
            a -= _on_device(theirs, device)
        blocks = tensor.blocks(a)
        grams = _grams(blocks, tensor.from_parts)
        if grams is None:  # named by the caller
            out.append([np.full(n, np.nan) for n in [min(w.shape) for w in blocks] + [tensor.n] * tensor.from_parts])
        else:
            out.append([_eigenvalues(g) for g in grams])
    return out
