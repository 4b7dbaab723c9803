"""GPTQ, AWQ and bitsandbytes checkpoints read as the float weights they round: every linear's rows (any slice) are the
reference implementation's dequantization of the whole matrix (auto-gptq's QuantLinear, autoawq's dequantize_gemm,
bitsandbytes' dequantize_4bit and int8_vectorwise_dequant), the writers pack as those quantizers pack, the bytes a set
of rows needs are exactly those rows' pieces (a folder holding only them reads them; one byte less is one line), a
model's vector from its quantization is near its float vector, and a faulty checkpoint is one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import llama_pair, save_state
from modelvec import DeltaEmbedder, Representation, embed
from modelvec.core.errors import CheckpointError
from modelvec.core.files import PARTIAL
from modelvec.read import open_checkpoint
from modelvec.read.headers import header_of
from modelvec.testing.quantized import (
    _groups,
    awq_params,
    gptq_params,
    pack_awq,
    pack_gptq,
    quantized_names,
    write_quantized,
)

ROWS = Representation(rows=0.05, projection="countsketch", probe="none")
#: name -> (method, options): GPTQ at 4 and 8 bits, per group and per channel, with act-order's g_idx, v1 and v2
#: zeros, auto-gptq's quantize_config.json; AWQ at two group sizes; bitsandbytes nf4 and fp4, nested or not, int8.
MADE = {
    "gptq4-g128": ("gptq", {"bits": 4, "group": 128}),
    "gptq4-g32-act": ("gptq", {"bits": 4, "group": 32, "desc_act": True}),
    "gptq4-channel": ("gptq", {"bits": 4, "group": -1}),
    "gptq8-g32-act": ("gptq", {"bits": 8, "group": 32, "desc_act": True}),
    "gptq8-g128-v2": ("gptq", {"bits": 8, "group": 128, "v2": True}),
    "gptq4-autogptq": ("gptq", {"bits": 4, "group": 64, "quantize_config": True}),
    "awq-g128": ("awq", {"group": 128}),
    "awq-g64": ("awq", {"group": 64}),
    "nf4": ("nf4", {}),
    "nf4-nested": ("nf4", {"nested": True}),
    "fp4": ("fp4", {"blocksize": 128}),
    "fp4-nested": ("fp4", {"nested": True}),
    "int8": ("int8", {}),
}
BNB = ("nf4", "fp4", "int8")
KEY = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A bf16 Llama-shaped base and fine-tune (width 256, ff 512, 2 layers), a second fine-tune of the base, and the
    first one in every format of :data:`MADE` (bitsandbytes' only where it is installed)."""
    root = tmp_path_factory.mktemp("quantized")
    base, ft = llama_pair(root / "pair", 256, 512, 2, torch.bfloat16, scale=1e-2)
    state = load_file(str(base / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    other = {k: (v.float() + torch.randn(v.shape, generator=gen) * 1e-2).to(v.dtype) for k, v in state.items()}
    made = {
        "base": base,
        "ft": ft,
        "other": save_state(root / "other", other, json.loads((base / "config.json").read_text())),
    }
    bnb = importlib.util.find_spec("bitsandbytes") is not None
    for name, (method, options) in MADE.items():
        if method in BNB and not bnb:
            continue
        made[name] = write_quantized(ft, root / name, method, **options)
    return made


def quantized(zoo, name: str) -> Path:
    if name not in zoo:
        pytest.skip("bitsandbytes is not installed (make install installs it)")
    return zoo[name]


def auto_gptq_quantlinear():
    """auto-gptq's QuantLinear (qlinear_cuda, its pure-torch path), from its own file: the package's __init__ imports
    its models, which need transformers 4."""
    spec = importlib.util.find_spec("auto_gptq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("auto-gptq is not installed (make install installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "nn_modules" / "qlinear" / "qlinear_cuda.py"
    module_spec = importlib.util.spec_from_file_location("auto_gptq_qlinear_cuda", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.QuantLinear


def reference(folder: Path, method: str, options: dict, module: str) -> torch.Tensor:
    """The reference implementation's dequantization of one whole linear, ``[out, in]`` float32."""
    t = {
        k.removeprefix(module + "."): v
        for k, v in load_file(str(folder / "model.safetensors")).items()
        if k.startswith(module + ".")
    }
    if method == "gptq":
        scales = t["scales"]
        inputs, out = t["g_idx"].shape[0], scales.shape[1]
        layer = auto_gptq_quantlinear()(
            options["bits"], options["group"], inputs, out, False, weight_dtype=scales.dtype
        )
        qzeros = t["qzeros"]
        if options.get("v2"):  # auto-gptq reads the v1 zeros (stored minus 1): the v2 ones made so
            qzeros = v1_zeros(qzeros, options["bits"])
        layer.qweight, layer.qzeros, layer.scales, layer.g_idx = t["qweight"], qzeros, scales, t["g_idx"]
        return layer(torch.eye(inputs, dtype=scales.dtype)).T.float()
    if method == "awq":
        packing = pytest.importorskip("awq.utils.packing_utils")
        return packing.dequantize_gemm(t["qweight"], t["qzeros"], t["scales"], 4, options["group"]).T.float()
    F = pytest.importorskip("bitsandbytes.functional")
    if method == "int8":
        return F.int8_vectorwise_dequant(t["weight"], t["SCB"])
    state = F.QuantState.from_dict(
        {k.removeprefix("weight."): v for k, v in t.items() if k != "weight"}, torch.device("cpu")
    )
    return F.dequantize_4bit(t["weight"], state).float()


def v1_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    per, mask = 32 // bits, (1 << bits) - 1
    z = torch.stack([(qzeros >> (bits * j)) & mask for j in range(per)], -1) - 1
    return sum((z[..., j] & mask) << (bits * j) for j in range(per)).to(torch.int32)


@pytest.mark.parametrize("name", list(MADE))
def test_rows_of_every_linear_are_the_reference_dequantization_of_the_whole(zoo, name):
    method, options = MADE[name]
    folder = quantized(zoo, name)
    ck = open_checkpoint(folder)
    plain = open_checkpoint(zoo["ft"])
    assert ck.keys() == plain.keys() and type(ck).__name__ == "QuantizedCheckpoint"
    for key in quantized_names(load_file(str(zoo["ft"] / "model.safetensors"))):
        whole = reference(folder, method, options, key.removesuffix(".weight"))
        assert ck.shape(key) == plain.shape(key) == tuple(whole.shape)
        torch.testing.assert_close(ck.get(key), whole, rtol=0, atol=0, msg=f"{name} {key}")
        view = ck.get_stored(key, whole=False)
        for rows, cols in (
            (slice(3, 11), slice(None)),
            (slice(40, 41), slice(5, 77)),
            (slice(1, None, 7), slice(None)),
        ):
            torch.testing.assert_close(view[rows, cols], whole[rows, cols], rtol=0, atol=0, msg=f"{name} {key}")
        gap = (whole - plain.get(key)).abs().max() / plain.get(key).abs().max()
        assert gap < (0.2 if options.get("bits", 4) == 4 and method != "int8" else 0.02), (name, key, float(gap))


def test_gptq_v2_and_v1_zeros_read_the_same_weights(zoo):
    v1 = write_quantized(zoo["ft"], zoo["ft"].parent / "v1-of-v2", "gptq", bits=8, group=128)
    a, b = open_checkpoint(v1), open_checkpoint(zoo["gptq8-g128-v2"])
    assert torch.equal(a.get(KEY), b.get(KEY))
    assert a.quantized_types() == b.quantized_types() == ["GPTQ 8-bit g128"]


def test_the_writers_pack_as_auto_gptq_and_autoawq_pack():
    QuantLinear = auto_gptq_quantlinear()
    gemm = pytest.importorskip("awq.modules.linear.gemm")
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    for bits, group, act in ((4, 32, True), (8, 128, False), (4, -1, False)):
        g_idx = _groups(256, group, act, seed=3)
        scales, zeros = gptq_params(w, bits, g_idx)
        rounded = (
            scales.t()[g_idx.long()]
            * (
                torch.clamp(torch.round(w.t() / scales.t()[g_idx.long()]) + zeros.t()[g_idx.long()], 0, 2**bits - 1)
                - zeros.t()[g_idx.long()]
            )
        ).t()
        linear = torch.nn.Linear(256, 64, bias=False).half()
        linear.weight.data = rounded.half()
        layer = QuantLinear(bits, group, 256, 64, False)
        layer.pack(linear, scales.clone(), zeros.clone(), g_idx)  # it changes a [out, 1] zeros in place
        mine = pack_gptq(rounded.half(), scales, zeros, g_idx, bits)
        for part in ("qweight", "qzeros", "scales", "g_idx"):
            assert torch.equal(getattr(layer, part), mine[part]), (bits, group, part)
    rounded, scales, zeros = awq_params(w.half(), 64)
    linear = torch.nn.Linear(256, 64, bias=False).half()
    linear.weight.data = rounded
    layer = gemm.WQLinear_GEMM.from_linear(linear, 4, 64, scales=scales, zeros=zeros)
    mine = pack_awq(rounded, scales, zeros, 64)
    for part in ("qweight", "qzeros", "scales"):
        assert torch.equal(getattr(layer, part), mine[part]), part


def test_a_model_transformers_quantized_with_bitsandbytes_reads_as_bitsandbytes_dequantizes_it(tmp_path):
    """A Llama saved by transformers after loading it with BitsAndBytesConfig (nf4, double quantization; int8): the
    tensors and config it writes are those the writer writes, and every linear reads as bitsandbytes dequantizes it."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64)  # fmt: skip
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "float")
    for name, options in (
        ("nf4", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}),
        ("int8", {"load_in_8bit": True}),
    ):
        model = AutoModelForCausalLM.from_pretrained(
            tmp_path / "float", quantization_config=BitsAndBytesConfig(**options), device_map="cpu"
        )
        model.save_pretrained(tmp_path / name)
        mine = write_quantized(tmp_path / "float", tmp_path / f"mine-{name}", name, nested=name == "nf4")
        theirs = load_file(str(tmp_path / name / "model.safetensors"))
        assert {k for k in theirs if "layers" in k} == {
            k for k in load_file(str(mine / "model.safetensors")) if "layers" in k
        }
        ck = open_checkpoint(tmp_path / name)
        for key in sorted(k for k in ck.keys() if k.endswith("_proj.weight")):  # noqa: SIM118 - a checkpoint, no dict
            whole = reference(tmp_path / name, name, {}, key.removesuffix(".weight"))
            torch.testing.assert_close(ck.get(key), whole, rtol=0, atol=0)
        assert ck.quantized_types() == (
            ["bitsandbytes nf4 double-quantized"] if name == "nf4" else ["bitsandbytes int8"]
        )


def part_bytes(name: str, ck, rows: tuple[int, int]) -> int:
    """The bytes rows ``[a, b)`` (a and b multiples of 8) of q_proj need, from each format's sizes."""
    method, options = MADE[name]
    out, inputs = ck.shape(KEY)
    r = rows[1] - rows[0]
    if method == "gptq":
        bits = options["bits"]
        groups = 1 if options["group"] == -1 else inputs // options["group"]
        return inputs * bits // 32 * r * 4 + groups * r * bits // 32 * 4 + groups * r * 2 + inputs * 4
    if method == "awq":
        groups = inputs // options["group"]
        return inputs * r // 8 * 4 + groups * r // 8 * 4 + groups * r * 2
    if method == "int8":
        return r * inputs + r * 4
    block = options.get("blocksize", 64)
    state = ck.linears[KEY].parts["state"].nbytes
    nested = 256 * 4 + (-(-out * inputs // block) // 256) * 4 if options.get("nested") else 0
    return r * inputs // 2 + r * inputs // block * (1 if options.get("nested") else 4) + 16 * 4 + nested + state


@pytest.mark.parametrize("name", list(MADE))
def test_the_bytes_of_some_rows_are_exactly_theirs_and_a_folder_holding_only_them_reads_them(zoo, name, tmp_path):
    folder = quantized(zoo, name)
    ck = open_checkpoint(folder)
    rows = [(8, 24), (64, 72)]
    spans = ck.byte_ranges({KEY: rows})[folder / "model.safetensors"]
    assert sum(b - a for a, b in spans) == part_bytes(name, ck, (8, 24)) + part_bytes(name, ck, (64, 72)) - (
        part_bytes(name, ck, (0, 0))
    )
    start, _ = header_of(folder / "model.safetensors")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    data = (folder / "model.safetensors").read_bytes()
    sparse = bytearray(len(data))
    for a, b in [(0, start), *spans]:
        sparse[a:b] = data[a:b]
    (copy / "model.safetensors").write_bytes(bytes(sparse))
    held = [[0, start], *[list(s) for s in spans]]
    (copy / PARTIAL).write_text(json.dumps({"files": {"model.safetensors": held}}))
    if name.startswith(("nf4", "fp4")):  # its quantization states are fetched with the headers
        for other in open_checkpoint(folder).linears.values():
            part = other.parts["state"]
            held.append([start + part.offset, start + part.offset + part.nbytes])
            sparse[held[-1][0] : held[-1][1]] = data[held[-1][0] : held[-1][1]]
        (copy / "model.safetensors").write_bytes(bytes(sparse))
        (copy / PARTIAL).write_text(json.dumps({"files": {"model.safetensors": held}}))
    part = open_checkpoint(copy)
    whole = ck.get(KEY)
    view = part.get_stored(KEY, whole=False)
    part.require_rows({KEY: rows})
    for a, b in rows:
        torch.testing.assert_close(view[a:b], whole[a:b], rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"only some rows of model.safetensors were fetched") as info:
        part.require_rows({KEY: [(30, 31)]})
    assert len(str(info.value).splitlines()) == 1
    held[1][1] -= 1  # one byte short
    (copy / PARTIAL).write_text(json.dumps({"files": {"model.safetensors": held}}))
    with pytest.raises(CheckpointError, match=r"only some rows of model.safetensors were fetched"):
        open_checkpoint(copy).require_rows({KEY: rows})


@pytest.mark.parametrize("name", ["gptq4-g128", "gptq8-g32-act", "awq-g128", "nf4", "fp4-nested", "int8"])
def test_a_vector_from_a_quantization_is_near_the_float_models_own(zoo, name):
    folder = quantized(zoo, name)
    e = DeltaEmbedder(ROWS).fit(zoo["base"])
    exact, rounded, other = (e.embed_one(m) for m in (zoo["ft"], folder, zoo["other"]))
    gap = np.linalg.norm(rounded - exact) / np.linalg.norm(exact)
    print(f"{name}: |v(quantized) - v(float)| / |v(float)| = {gap:.4f}")
    assert gap < (0.05 if name.endswith(("int8", "8-g32-act")) else 0.5)
    assert np.linalg.norm(rounded - exact) < 0.5 * np.linalg.norm(rounded - other)  # nearer its own than a sibling


def faulty(zoo, tmp_path: Path, name: str, change) -> Path:
    folder = tmp_path / f"bad-{name}-{change.__name__}"
    shutil.copytree(quantized(zoo, name), folder)
    state = load_file(str(folder / "model.safetensors"))
    change(state, folder)
    save_file(state, str(folder / "model.safetensors"))
    return folder


def wrong_shape(state, folder):
    q = state["model.layers.0.mlp.up_proj.qweight"]
    state["model.layers.0.mlp.up_proj.qweight"] = torch.cat([q, q[:1]])


def no_scales(state, folder):
    del state["model.layers.1.self_attn.o_proj.scales"]


def bad_state(state, folder):
    key = next(k for k in state if k.startswith("model.layers.0.mlp.down_proj.weight.quant_state"))
    state[key] = torch.frombuffer(bytearray(b'{"quant_type": "nf4", "blocksize"'), dtype=torch.uint8)


def three_bits(state, folder):
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (folder / "config.json").write_text(json.dumps(config))


def gemv(state, folder):
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (folder / "config.json").write_text(json.dumps(config))


def test_a_faulty_quantized_checkpoint_is_one_line_and_recorded(zoo, tmp_path):
    cases = {
        faulty(
            zoo, tmp_path, "gptq4-g128", wrong_shape
        ): r"gptq: tensor model.layers.0.mlp.up_proj.qweight has shape \[33, 512\], expected \[32, 512\]",
        faulty(
            zoo, tmp_path, "awq-g128", no_scales
        ): r"awq: missing tensor model.layers.1.self_attn.o_proj.scales \(an AWQ linear's scales\)",
        faulty(zoo, tmp_path, "gptq4-g128", three_bits): r"gptq: 3-bit GPTQ \(read: 2, 4 and 8 bits\)",
        faulty(zoo, tmp_path, "awq-g128", gemv): r"awq: AWQ version 'gemv' at 4 bits \(read: gemm, 4 bits\)",
    }
    if "nf4" in zoo:
        cases[faulty(zoo, tmp_path, "nf4", bad_state)] = (
            r"bitsandbytes: tensor model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4 is not a JSON "
        )
    for folder, said in cases.items():
        with pytest.raises(CheckpointError, match=said) as info:
            open_checkpoint(folder, name="m").get(KEY)
        assert str(info.value).startswith("m: ") and len(str(info.value).splitlines()) == 1
    result = embed(zoo["base"], list(cases), representation=ROWS, store=tmp_path / "s.duckdb")
    assert not result.embedded and set(result.failed) == {str(f) for f in cases}
    assert all(len(line.splitlines()) == 1 for line in result.failed.values())
