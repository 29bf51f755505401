"""AWQ and GPTQ checkpoints (written here with NumPy in each project's documented packing)
run on the block-quantized kernels: logits against transformers on the same weights
dequantized, the format each matrix becomes, and clear errors for what is not supported."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from lite_llm.model.hfquant import mxfp4_blocks
from lite_llm.model.loader import ModelLoadError
from test_parity import lite_logits, make_runner

SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _quantize(w: np.ndarray, bits: int, group: int, sym: bool):
    """w [N, K] -> (q [K, N] uint, z [K/group, N], s fp16 [K/group, N]) with W = (q - z) s."""
    n, k = w.shape
    wg = w.T.reshape(k // group, group, n)
    top = (1 << bits) - 1
    if sym:
        s = (np.abs(wg).max(1) / (top / 2)).astype(np.float16)
        z = np.full((k // group, n), 1 << (bits - 1), np.int32)
    else:
        lo, hi = wg.min(1), wg.max(1)
        s = ((hi - lo) / top).astype(np.float16)
        z = np.clip(np.round(-lo / s.astype(np.float32)), 0, top).astype(np.int32)
    q = np.clip(np.round(wg / s.astype(np.float32)[:, None] + z[:, None]), 0, top).astype(np.int32)
    # reductions over a transposed view come out in Fortran order, and safetensors writes the
    # raw buffer: make every array C-ordered before it is saved
    return tuple(np.ascontiguousarray(a) for a in (q.reshape(k, n), z, s))


def _pack(vals: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """uint values -> int32 words of 32 / bits values, low bits first, along axis (0 rows, 1 cols)."""
    per = 32 // bits
    v = vals.astype(np.uint32)
    if axis == 0:
        v = v.reshape(-1, per, v.shape[1]).transpose(0, 2, 1)          # [words, N, per]
    else:
        v = v.reshape(v.shape[0], -1, per)                              # [R, words, per]
        if order is not None:                                          # slot i holds column order[i]
            v = v[:, :, list(order)]
    words = (v << (np.arange(per, dtype=np.uint32) * bits)).sum(-1, dtype=np.uint32)
    return np.ascontiguousarray(words).view(np.int32)


def write_quantized(ckpt, out, method: str, bits: int = 4, group: int = 64, sym: bool = False,
                    config_extra: dict | None = None):
    """Copy tiny checkpoint `ckpt` to `out` with every layer linear quantized in `method`'s
    layout; returns the directory of a float copy holding the dequantized weights."""
    ref = out.parent / (out.name + "-dequantized")
    for d in (out, ref):
        shutil.copytree(ckpt, d)
    sd = load_file(str(ckpt / "model.safetensors"))
    q_sd, ref_sd = {}, dict(sd)
    for name, w in sd.items():
        prefix = name[: -len(".weight")]
        if not (name.endswith(".weight") and prefix.split("layers.")[-1].split(".", 1)[-1] in LINEARS):
            q_sd[name] = w
            continue
        q, z, s = _quantize(w.astype(np.float32), bits, group, sym)
        ref_sd[name] = np.ascontiguousarray(((q - np.repeat(z, group, 0)) * np.repeat(s.astype(np.float32), group, 0)).T,
                                            dtype=w.dtype)
        if method == "awq":
            q_sd[prefix + ".qweight"] = _pack(q, 4, 1, AWQ_ORDER)
            q_sd[prefix + ".qzeros"] = _pack(z, 4, 1, AWQ_ORDER)
        else:
            q_sd[prefix + ".qweight"] = _pack(q, bits, 0)
            q_sd[prefix + ".qzeros"] = _pack(z - 1, bits, 1)            # GPTQ v1: zero points minus one
            q_sd[prefix + ".g_idx"] = (np.arange(q.shape[0]) // group).astype(np.int32)
        q_sd[prefix + ".scales"] = s
    save_file(q_sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(ref_sd, str(ref / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    qc = ({"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
          if method == "awq" else
          {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": False})
    cfg["quantization_config"] = {**qc, **(config_extra or {})}
    (out / "config.json").write_text(json.dumps(cfg))
    return ref


@pytest.mark.parametrize("method,bits,group,sym,kind", [("awq", 4, 128, False, "Q4_1"), ("gptq", 4, 64, False, "Q4_1"),
                                                         ("gptq", 4, 128, True, "Q4_0"), ("gptq", 8, 32, True, "Q8_0")])
def test_awq_and_gptq_logits_match_the_dequantized_weights(tiny_checkpoint, tmp_path, method, bits, group, sym, kind):
    from transformers import AutoModelForCausalLM
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    ref = write_quantized(ckpt, tmp_path / method, method, bits, group, sym)
    ids = [5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300]
    model = AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    runner, _ = make_runner(tmp_path / method)
    assert runner.formats["layers.0.qkv"][0] == (kind,) * 3 and runner.formats["layers.1.down"][0] == (kind,)
    assert runner.formats["lm_head"][0] == ("float32",)          # embeddings and head stay as stored
    got = lite_logits(runner, [ids])[0]
    err = np.abs(got - want) / (want.max(-1, keepdims=True) - want.min(-1, keepdims=True))
    # int8 activation blocks, as for GGUF files (test_quantized.py)
    assert err.max() < 0.04 and np.median(err) < 0.005, (err.max(), np.median(err))


def test_unsupported_and_broken_checkpoints_are_refused_clearly(tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    write_quantized(ckpt, tmp_path / "act", "gptq", config_extra={"desc_act": True})
    with pytest.raises(ModelLoadError, match="desc_act=true .* is not supported"):
        make_runner(tmp_path / "act")
    # desc_act false, but g_idx out of order: the groups are not the ones the scales are read by
    write_quantized(ckpt, tmp_path / "gidx", "gptq", group=64)
    sd = load_file(str(tmp_path / "gidx" / "model.safetensors"))
    sd["model.layers.0.mlp.up_proj.g_idx"] = sd["model.layers.0.mlp.up_proj.g_idx"][::-1].copy()
    save_file(sd, str(tmp_path / "gidx" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"up_proj.g_idx puts input features in groups out of order"):
        make_runner(tmp_path / "gidx")
    write_quantized(ckpt, tmp_path / "group", "gptq", group=64, config_extra={"group_size": 128})
    with pytest.raises(ModelLoadError, match=r"q_proj.qzeros' has shape \[4, 32\], expected \[2, 32\].*is group_size right"):
        make_runner(tmp_path / "group")
    write_quantized(ckpt, tmp_path / "asym8", "gptq", bits=8, group=32, sym=False)
    with pytest.raises(ModelLoadError, match="8-bit GPTQ with zero points other than 128"):
        make_runner(tmp_path / "asym8")
    write_quantized(ckpt, tmp_path / "noscales", "awq", group=128)
    sd = load_file(str(tmp_path / "noscales" / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.scales"]
    save_file(sd, str(tmp_path / "noscales" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="AWQ tensor 'model.layers.1.mlp.up_proj.scales' is missing"):
        make_runner(tmp_path / "noscales")
    write_quantized(ckpt, tmp_path / "exl", "awq", group=128, config_extra={"version": "exllama"})
    with pytest.raises(ModelLoadError, match="AWQ 'exllama' with 4 bits is not supported"):
        make_runner(tmp_path / "exl")
    write_quantized(ckpt, tmp_path / "bnb", "awq", group=128, config_extra={"quant_method": "bitsandbytes"})
    with pytest.raises(ModelLoadError, match="quantization method 'bitsandbytes' is not supported"):
        make_runner(tmp_path / "bnb")


def test_w8a8_compressed_tensors_logits_match_the_dequantized_weights(tiny_checkpoint, tmp_path):
    """int8 weights with a float32 scale per output channel (as llm-compressor writes W8A8)."""
    from transformers import AutoModelForCausalLM
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    out, ref = tmp_path / "w8a8", tmp_path / "w8a8-dequantized"
    for d in (out, ref):
        shutil.copytree(ckpt, d)
    sd = load_file(str(ckpt / "model.safetensors"))
    q_sd, ref_sd = dict(sd), dict(sd)
    for name, w in sd.items():
        prefix = name[: -len(".weight")]
        if name.endswith(".weight") and prefix.split("layers.")[-1].split(".", 1)[-1] in LINEARS:
            scale = (np.abs(w).max(1, keepdims=True) / 127).astype(np.float32)
            q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
            q_sd[name], q_sd[prefix + ".weight_scale"] = q, scale
            ref_sd[name] = (q * scale).astype(w.dtype)
    save_file(q_sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(ref_sd, str(ref / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
                                  "config_groups": {"group_0": {
                                      "targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                                      "input_activations": {"num_bits": 8, "type": "int", "dynamic": True,
                                                            "strategy": "token"}}}}
    (out / "config.json").write_text(json.dumps(cfg))
    ids = [5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300]
    model = AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    runner, _ = make_runner(out)
    assert runner.formats["layers.0.gate_up"][0] == ("Q8_0", "Q8_0") and runner.formats["lm_head"][0] == ("float32",)
    got = lite_logits(runner, [ids])[0]
    err = np.abs(got - want) / (want.max(-1, keepdims=True) - want.min(-1, keepdims=True))
    assert err.max() < 0.04 and np.median(err) < 0.005, (err.max(), np.median(err))
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="compressed-tensors format 'int-quantized' .* is not supported"):
        make_runner(out)


def test_mxfp4_from_hugging_face_blocks_equals_transformers_dequantization(rng):
    """gpt-oss's MXFP4 tensors (X_blocks [E, N, G, 16] of e2m1 pairs, X_scales [E, N, G] of e8m0)
    as ggml MXFP4 rows: what gguf's dequantizer reads from them is what transformers' own
    conversion makes of the checkpoint, every code and a spread of exponents (the MXFP4 rows on
    the block kernels: tests/kernels/test_qgemm.py)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    e, n, g = 2, 24, 8
    blocks = rng.integers(0, 256, (e, n, g, 16), dtype=np.uint8)
    scales = rng.integers(112, 136, (e, n, g), dtype=np.uint8)
    raw = mxfp4_blocks(blocks, scales)
    assert raw.shape == (e, n, g * 17)
    got = gguf.quants.dequantize(raw.reshape(e * n, -1), gguf.GGMLQuantizationType.MXFP4).reshape(e, n, 32 * g)
    want = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(got, want.transpose(1, 2).numpy())
