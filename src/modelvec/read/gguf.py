"""GGUF checkpoints (llama.cpp's format, often quantized) for the rank study of weights.

:class:`GGUFCheckpoint` reads a ``.gguf`` file with the ``gguf`` package's ``GGUFReader`` (memory-mapped)
and offers what the rank study uses from :class:`~modelvec.read.checkpoint.Checkpoint`: ``name``,
``keys()``, ``shape()``, ``get(key)`` (float32), ``config``, ``architecture()`` and ``layout()``.
Tensors are named as in the Hugging Face checkpoint the file was converted from, so modelvec's architecture tables
apply unchanged: the GGUF names (``blk.N.attn_q.weight``, ``blk.N.ffn_down.weight``, ``blk.N.attn_qkv.weight``...)
are found by running each table's Hugging Face names through gguf's own ``TensorNameMap`` for the file's
``general.architecture``, the map llama.cpp's converter uses. The config comes from the metadata
(``<arch>.block_count``, ``<arch>.embedding_length``...), and where that is silent from the tensors the file stores
(T5's gated feed-forward), as :data:`~modelvec.read.gguf_families.FAMILIES` declares.

A GGUF split in parts (``-00001-of-00003.gguf``, llama.cpp's ``gguf-split``) is one model: any part's path opens
all of them (the metadata is the first part's), a part missing is one line. Each ``get`` dequantizes one tensor
(``gguf.quants.dequantize``), so memory stays bounded by the largest matrix. Quantization noise raises the measured
rank: the rank study warns (:class:`QuantizationWarning`, naming the quant types) and refuses deltas between
quantized checkpoints, whose noise is as large as a fine-tuning delta.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import CheckpointError, first_line, shown
from ..core.gguf import SPLIT
from ..core.spans import merge
from .architectures import ARCHITECTURES
from .checkpoint import Checkpoint
from .gguf_families import FAMILIES
from .roles import Orientation

PathLike = str | os.PathLike[str]
#: Storage types that are plain floats: everything else is block-quantized (Q8_0, Q4_K, IQ2_XS...).
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


def _gguf(name: str) -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError(name, "reading .gguf files needs the gguf package (pip install gguf)") from None
    return gguf


class GGUFCheckpoint(Checkpoint):
    """A lazily read GGUF file whose tensors carry the Hugging Face names of modelvec's tables.

    ``get(key)`` returns each matrix as the Hugging Face checkpoint stores it, so every rule of
    :class:`Checkpoint` (orientation, fused parts, layout) applies as is:

    - **Shape order.** GGUF lists dimensions innermost first (ggml's ``ne``), the reverse of numpy;
      the tensors come back in numpy order, i.e. ``[out, in]`` for a linear layer.
    - **GPT-2's Conv1D.** llama.cpp's converter transposes ``c_attn``, ``c_proj`` and ``c_fc`` to
      ggml's ``[out, in]``; they are transposed back to Conv1D's ``[in, out]``.
    - **Llama's Q and K.** The converter permutes the rows of ``q_proj`` and ``k_proj`` of the
      ``llama`` architecture (per head, from Hugging Face's half-split rotary layout to the
      interleaved one). A row permutation does not change singular values, so ranks would be the
      same either way; the permutation is undone anyway so that the tensors equal the Hugging Face
      ones (and a delta against a safetensors base lines up).

    Tensors with no matrix role in the table keep their GGUF names in ``keys()``.
    """

    def __init__(self, path: PathLike, name: str | None = None) -> None:
        path = Path(path)
        self.name = name or str(path)
        if not path.is_file():
            raise CheckpointError(
                self.name, f"{path.name} is not a regular file" if path.exists() else f"no such file: {path}"
            )
        self._gguf = _gguf(self.name)
        self.path = path
        self.parts = split_files(path, self.name)
        self._reader: Any = None
        reader = self._open_reader()
        fields = reader.fields
        arch = self._meta(fields, "general.architecture")
        if arch is None:
            raise CheckpointError(self.name, f"{path.name} has no general.architecture in its GGUF metadata")
        self.gguf_arch = str(arch)
        family = FAMILIES.get(self.gguf_arch)
        if family is None:
            raise CheckpointError(
                self.name,
                f"unsupported GGUF architecture '{shown(self.gguf_arch, 60)}' in {path.name} "
                f"(supported: {', '.join(sorted(FAMILIES))})",
            )
        self.family = family
        self._infos = {
            name: (t.tensor_type, tuple(int(d) for d in reversed(t.shape.tolist())))
            for name, t in self._tensors.items()
        }
        self._gguf_config = self._config_from(fields)
        super().__init__(path, self.name)  # the hooks below give the files and the config
        self._hf_to_gguf, self._transposed, self._heads = self._map_names()

    # --- the Checkpoint hooks ------------------------------------------------------------------
    def _locate_weights(self) -> tuple[list[Path], None]:
        return list(self.parts), None

    def _read_config(self) -> dict[str, Any]:
        return self._gguf_config

    # --- reading -----------------------------------------------------------------------------------
    def _open_reader(self) -> Any:
        """The first part's reader (its metadata is the model's), every part's tensors gathered by name."""
        if self._reader is None:
            readers = [self._read_part(part) for part in self.parts]
            tensors: dict[str, Any] = {}
            part_of: dict[str, Path] = {}
            for part, reader in zip(self.parts, readers):
                for t in reader.tensors:
                    if t.name in tensors:
                        raise CheckpointError(
                            self.name, f"tensor {shown(t.name)} is in both {part_of[t.name].name} and {part.name}"
                        )
                    tensors[t.name], part_of[t.name] = t, part
            self._reader, self._tensors, self._part_of = readers[0], tensors, part_of
            self._check_split(readers)
        return self._reader

    def _read_part(self, part: Path) -> Any:
        try:
            reader = self._gguf.GGUFReader(part, "r")
        except Exception as exc:  # the reader raises ValueError, IndexError and numpy errors for a bad file
            with open(part, "rb") as fh:
                magic = fh.read(4)
            what = "is truncated or corrupt" if magic == b"GGUF" else "is not a GGUF file (no GGUF magic)"
            raise CheckpointError(self.name, f"cannot read {part.name}: it {what} ({first_line(exc)})") from None
        if reader.byte_order != "I":
            raise CheckpointError(self.name, f"{part.name} is a GGUF of the other byte order (not supported)")
        return reader

    def _check_split(self, readers: Sequence[Any]) -> None:
        """The parts' own word (``split.no``, ``split.count``) against their names: a part renamed or of
        another split set is one line."""
        if len(readers) == 1:
            return
        for i, (part, reader) in enumerate(zip(self.parts, readers)):
            no, count = self._meta(reader.fields, "split.no"), self._meta(reader.fields, "split.count")
            if no is not None and count is not None and (int(no), int(count)) != (i, len(self.parts)):
                raise CheckpointError(
                    self.name,
                    f"{part.name} says it is part {int(no) + 1} of {int(count)}, its name part {i + 1} of "
                    f"{len(self.parts)}",
                )

    def _meta(self, fields: dict[str, Any], key: str) -> Any:
        f = fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception as exc:
            raise CheckpointError(self.name, f"bad GGUF metadata {key}: {first_line(exc)}") from None

    def _config_from(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A config.json-like dict for the architecture table, from the GGUF metadata."""
        config: dict[str, Any] = {"model_type": self.family.model_type, "_name_or_path": self.name}
        for key, template in self.family.config.items():
            value = self._meta(fields, template.format(arch=self.gguf_arch))
            if isinstance(value, list):  # per-layer values (e.g. head counts): the table needs one
                value = value[0] if value else None
            if value is None and key in self.family.defaults:
                value = config.get(self.family.defaults[key])
            if value is None:
                if key in ("num_hidden_layers", "n_layer", "num_layers"):
                    raise CheckpointError(
                        self.name,
                        f"{self.path.name} has no {template.format(arch=self.gguf_arch)} in its GGUF metadata",
                    )
                continue
            try:
                config[key] = int(value)
            except (TypeError, ValueError):
                raise CheckpointError(
                    self.name,
                    f"bad GGUF metadata {template.format(arch=self.gguf_arch)}: "
                    f"{shown(repr(value), 60)} is not a count",
                ) from None
        for stored in self.family.stored:
            config[stored.key] = stored.value if stored.tensor in self._infos else stored.otherwise
        return config

    def _map_names(self) -> tuple[dict[str, str], set[str], dict[str, int]]:
        """Hugging Face name -> GGUF name for every tensor of the table, through gguf's TensorNameMap.

        Also the names stored transposed (Conv1D) and, for the permuted Q/K rows, the head count.
        """
        gg = self._gguf
        arch_enum = {v: k for k, v in gg.MODEL_ARCH_NAMES.items()}.get(self.gguf_arch)
        if arch_enum is None:
            raise CheckpointError(
                self.name, f"the installed gguf package does not know architecture '{self.gguf_arch}'"
            )
        table = ARCHITECTURES[self.family.table]
        config = self.config or {}
        n_blocks = max(
            [
                v
                for k, v in config.items()
                if k in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers") and isinstance(v, int)
            ]
            + [1]
        )
        names = gg.get_tensor_name_map(arch_enum, n_blocks)
        mapped: dict[str, str] = {}
        transposed: set[str] = set()
        heads: dict[str, int] = {}
        for ref in table.matrices(config):
            hit = None
            for prefix in dict.fromkeys(("", *table.prefixes)):
                found = names.get_type_and_name(prefix + ref.tensor, try_suffixes=(".weight", ".bias"))
                if found is not None:
                    hit = found
                    break
            if hit is None or hit[1] not in self._infos:
                continue  # the layout names it as missing
            kind, gguf_name = hit
            mapped[ref.tensor] = gguf_name
            if ref.orientation is Orientation.CONV1D:
                transposed.add(ref.tensor)
            if self.family.permuted_qk and kind in (gg.MODEL_TENSOR.ATTN_Q, gg.MODEL_TENSOR.ATTN_K):
                key = "num_attention_heads" if kind == gg.MODEL_TENSOR.ATTN_Q else "num_key_value_heads"
                if not isinstance(config.get(key), int):
                    raise CheckpointError(
                        self.name, f"{self.path.name} gives no head count, needed to read {gguf_name}"
                    )
                heads[ref.tensor] = int(config[key])
        return mapped, transposed, heads

    def keys(self) -> set[str]:
        """The table's tensors under their Hugging Face names, every other tensor under its GGUF name."""
        claimed = set(self._hf_to_gguf.values())
        return set(self._hf_to_gguf) | {n for n in self._infos if n not in claimed}

    def gguf_name(self, key: str) -> str:
        """The GGUF tensor holding ``key`` (a Hugging Face name or a GGUF name)."""
        name = self._hf_to_gguf.get(key, key)
        if name not in self._infos:
            raise CheckpointError(self.name, f"missing tensor {key}")
        return name

    def quant_type(self, key: str) -> str:
        """The storage type of ``key``: F32, F16, BF16, Q8_0, Q4_K..."""
        return self._infos[self.gguf_name(key)][0].name

    def shape(self, key: str) -> tuple[int, ...]:
        shape = self._infos[self.gguf_name(key)][1]
        return tuple(reversed(shape)) if key in self._transposed else shape

    def stored(self, key: str) -> None:
        """No safetensors bytes to read: a GGUF's tensors are dequantized through :meth:`get_stored`."""
        return None

    def get_stored(self, key: str, *, whole: bool = True) -> Any:
        """GGUF's blocks are dequantized on read: float32 is as stored as they get. ``whole=False``: a view that
        dequantizes only the rows sliced from it (:class:`GGUFRows`: a few percent of the blocks, where the
        representation reads a few percent of the rows), where the rows are stored as rows (not Conv1D's)."""
        if whole or key in self._transposed:
            return self.get(key)
        return GGUFRows(self, key)

    def rows(self, key: str, rows: np.ndarray) -> np.ndarray:
        """The GGUF rows ``rows`` of ``key``'s stored tensor, dequantized (float32, [len(rows), in])."""
        name = self.gguf_name(key)
        qtype, _ = self._infos[name]
        tensor = self._tensors[name] if self._reader is not None else self._reopen(name)
        try:
            data = np.asarray(tensor.data)[rows]
            values = data.astype(np.float32) if qtype.name in FLOAT_TYPES else self._gguf.quants.dequantize(data, qtype)
        except Exception as exc:  # unknown quant type, truncated data
            raise CheckpointError(
                self.name, f"cannot dequantize tensor {name} ({qtype.name}): {first_line(exc)}"
            ) from None
        return np.require(values, np.float32, ["C", "W"])

    def row_of(self, key: str, rows: np.ndarray) -> np.ndarray:
        """The GGUF rows holding the Hugging Face rows ``rows`` of ``key``: the same, but for Llama's Q and K, whose
        rows the converter permuted within each head (interleaved from half-split: :func:`_unpermute`)."""
        if key not in self._heads:
            return rows
        head = self.shape(key)[0] // self._heads[key]
        h, within = np.divmod(rows, head)
        half, i = np.divmod(within, head // 2)
        return h * head + 2 * i + half

    def byte_ranges(self, rows: Mapping[str, Sequence[tuple[int, int]]]) -> dict[Path, list[tuple[int, int]]] | None:
        """Where the given rows' blocks lie in the file, sorted and merged where they touch (what a prefetch asks the
        kernel to read)."""
        spans: dict[Path, list[tuple[int, int]]] = {}
        for key, ranges in rows.items():
            name = self.gguf_name(key)
            tensor = self._tensors[name] if self._reader is not None else self._reopen(name)
            data = np.asarray(tensor.data)
            per_row = data.nbytes // max(1, data.shape[0])
            start = int(tensor.data_offset)
            wanted = self.row_of(key, np.concatenate([np.arange(a, b) for a, b in ranges] or [np.zeros(0, int)]))
            spans.setdefault(self._part_of[name], []).extend(
                (start + int(r) * per_row, start + (int(r) + 1) * per_row) for r in np.sort(wanted)
            )
        return {part: merge(found) for part, found in spans.items()}

    def _file_of(self, key: str) -> Path:
        name = self.gguf_name(key)
        if self._reader is None:
            self._open_reader()
        return self._part_of[name]

    def get(self, key: str) -> torch.Tensor:
        """One tensor, dequantized to float32, in the Hugging Face checkpoint's storage layout."""
        name = self.gguf_name(key)
        qtype, shape = self._infos[name]
        self.require_rows({key: [(0, shape[0] if shape else 1)]})  # a partial download: every row
        tensor = self._tensors[name] if self._reader is not None else self._reopen(name)
        if qtype.name in ("I8", "I16", "I32", "I64"):
            raise CheckpointError(self.name, f"tensor {key} has type {qtype.name}, expected a float or quantized type")
        try:
            if qtype.name == "F64":
                values = np.asarray(tensor.data, dtype=np.float32)
            else:
                values = self._gguf.quants.dequantize(tensor.data, qtype)
            values = np.require(values.reshape(shape), np.float32, ["C", "W"])  # a copy of a read-only F32 view
        except Exception as exc:  # unknown quant type, truncated data
            raise CheckpointError(
                self.name, f"cannot dequantize tensor {name} ({qtype.name}): {first_line(exc)}"
            ) from None
        out = torch.from_numpy(values)
        if key in self._heads:
            out = _unpermute(out, self._heads[key], self.name, key)
        return out.T if key in self._transposed else out

    def _reopen(self, name: str) -> Any:
        self._open_reader()
        return self._tensors[name]

    # --- quantization -------------------------------------------------------------------------------
    def quantized_types(self) -> list[str]:
        """The block-quantized storage types of the layout's matrices (empty for F32/F16/BF16 files)."""
        types = {self.quant_type(ref.tensor) for ref in self.layout().refs}
        return sorted(types - FLOAT_TYPES)

    def close(self) -> None:
        super().close()
        self._reader = None
        self._tensors = {}
        self._part_of = {}


def split_files(path: Path, name: str) -> tuple[Path, ...]:
    """Every part of the split GGUF that ``path`` is a part of, in order (``path`` alone where it is not split); a
    part missing is one line."""
    split = SPLIT.fullmatch(path.name)
    if split is None:
        return (path,)
    count = int(split.group("parts"))
    width = len(split.group("part"))
    parts = tuple(
        path.with_name(f"{split.group('stem')}-{i:0{width}d}-of-{split.group('parts')}.gguf")
        for i in range(1, count + 1)
    )
    lost = [p.name for p in parts if not p.is_file()]
    if lost:
        shown_lost = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
        raise CheckpointError(name, f"a GGUF split in {count} files lacks {shown_lost}")
    return parts


def _unpermute(w: torch.Tensor, n_head: int, model: str, key: str) -> torch.Tensor:
    """Undo llama.cpp's ``LlamaModel.permute`` of Q/K rows (``[out, in]``, per head: interleaved -> half-split)."""
    rows = w.shape[0]
    if n_head <= 0 or rows % (2 * n_head):
        raise CheckpointError(model, f"tensor {key} has {rows} rows, not a multiple of 2 x {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape).contiguous()


class GGUFRows:
    """A GGUF matrix read a few rows at a time: slicing rows (and columns) dequantizes only the blocks of those rows,
    in the Hugging Face checkpoint's row order, as a float32 tensor; what the embedder's row plans read."""

    ndim = 2

    def __init__(self, ck: GGUFCheckpoint, key: str) -> None:
        self.ck, self.key = ck, key
        self.shape = torch.Size(ck.shape(key))
        self.dtype = torch.float32

    def __getitem__(self, index: Any) -> torch.Tensor:
        rows, cols = index if isinstance(index, tuple) else (index, slice(None))
        if not isinstance(rows, slice):
            raise TypeError("GGUF rows are read by slices of rows")
        wanted = np.arange(self.shape[0])[rows]
        values = self.ck.rows(self.key, self.ck.row_of(self.key, wanted))
        return torch.from_numpy(values)[:, cols]
