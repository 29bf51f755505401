"""FP8 checkpoints (float8_e4m3fn weights, written here with torch as the Hub's checkpoints store
them) run kept at one byte a weight: DeepSeek-V3 / Qwen3-FP8's block layout (quant_method "fp8",
weight_scale_inv per 128 x 128 block) and compressed-tensors' float-quantized layout
(weight_scale per output channel), and quant_method "fp8" with one scale per tensor. Logits against transformers on the same weights dequantized
(float32), the formats each matrix runs in, the bytes they take, and clear refusals."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lite_llm.model.loader import ModelLoadError
from test_parity import lite_logits, make_runner

# hidden 320: K of q, k, v, gate, up is two whole 128-column chunks and a short one; 384: three (down)
SHAPE = dict(hidden_size=320, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
EXPERTS = re.compile(r"mlp\.experts\.\d+\.(gate|up|down)_proj")
IDS = [5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300]
BLOCK_CONFIG = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic", "fmt": "e4m3"}
TENSOR_CONFIG = {"quant_method": "fp8", "activation_scheme": "static"}
CHANNEL_CONFIG = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                  "config_groups": {"group_0": {
                      "targets": ["Linear"],
                      "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                                  "dynamic": False},
                      "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                            "dynamic": True}}}}


def _quantize(w: torch.Tensor, layout: str):
    """w [N, K] float32 -> (q float8_e4m3fn [N, K], scale tensor as stored, scale per element [N, K]);
    layout "block" (128 x 128), "channel" or "tensor"."""
    n, k = w.shape
    if layout == "tensor":
        scale = (w.abs().amax() / 448).clamp(min=1e-12).float()               # [] (vLLM's per-tensor FP8)
        full = scale.expand(n, k)
    elif layout == "block":
        bn = bk = 128
        pad = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
        pad[:n, :k] = w
        amax = pad.reshape(-(-n // bn), bn, -(-k // bk), bk).abs().amax(dim=(1, 3))
        scale = (amax / 448).clamp(min=1e-12).float()                        # [ceil(N/128), ceil(K/128)]
        full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    else:
        scale = (w.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12).float()   # [N, 1]
        full = scale.expand(n, k)
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale, full


def write_fp8(ckpt, out, layout: str, linears=None):
    """Copy tiny checkpoint `ckpt` to `out` with every layer linear in FP8 (`layout` "block" or
    "channel"; linears: a pattern of the layer's modules to quantize instead of LINEARS);
    returns the directory of a float32 copy holding the dequantized weights."""
    ref = out.parent / (out.name + "-dequantized")
    for d in (out, ref):
        shutil.copytree(ckpt, d)
    sd = load_file(str(ckpt / "model.safetensors"))
    q_sd, ref_sd = {}, {}
    for name, w in sd.items():
        prefix = name[: -len(".weight")]
        ref_sd[name] = w.float().contiguous()
        q_sd[name] = w.contiguous()
        module = prefix.split("layers.")[-1].split(".", 1)[-1]
        if name.endswith(".weight") and (linears.fullmatch(module) if linears else module in LINEARS):
            q, scale, full = _quantize(w.float(), layout)
            q_sd[name] = q
            q_sd[prefix + (".weight_scale_inv" if layout == "block" else ".weight_scale")] = scale
            if layout == "tensor":     # a static activation scale beside it: not used (activations stay float)
                q_sd[prefix + ".input_scale"] = torch.tensor(0.5)
            ref_sd[name] = (q.float() * full).contiguous()              # dequantized as transformers does
    save_file(q_sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(ref_sd, str(ref / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"block": BLOCK_CONFIG, "channel": CHANNEL_CONFIG, "tensor": TENSOR_CONFIG}[layout]
    (out / "config.json").write_text(json.dumps(cfg))
    return ref


def _hf(path) -> np.ndarray:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].double().numpy()


def _rel_err(got, want) -> float:
    return float((np.abs(got - want) / (want.max(-1, keepdims=True) - want.min(-1, keepdims=True))).max())


@pytest.mark.parametrize("layout,hidden", [("block", 256), ("block", 320), ("channel", 320), ("tensor", 320)])
def test_fp8_logits_match_the_dequantized_weights(tiny_checkpoint, tmp_path, layout, hidden):
    shape = {**SHAPE, "hidden_size": hidden}
    ckpt = tiny_checkpoint("qwen3", **shape, std=0.08)
    ref = write_fp8(ckpt, tmp_path / layout, layout)
    want = _hf(ref)
    runner, loaded = make_runner(tmp_path / layout)
    assert runner.formats["layers.0.qkv"][0] == ("F8_E4M3",) and runner.formats["layers.1.down"][0] == ("F8_E4M3",)
    assert runner.formats["layers.0.gate_up"] == (("F8_E4M3",), "float32")   # activations stay float
    assert runner.formats["lm_head"][0] == ("float32",)                         # not quantized: as stored
    got = lite_logits(runner, [IDS])[0]
    assert _rel_err(got, want) < 1e-4, _rel_err(got, want)
    # one byte a weight, plus per 16 rows and 128 columns 16 float32 scales (3 %)
    E, F, D = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    for name, (n, k) in {"qkv": (4 * D + 2 * 2 * D, E), "o": (E, 4 * D), "gate_up": (2 * F, E), "down": (E, F)}.items():
        m = runner.packed.model.matrices[f"layers.0.{name}"]
        assert m.data.dtype == np.uint8 and m.data.nbytes == -(-n // 16) * (16 * k + 64 * -(-k // 128)), name
    if layout == "block" and hidden % 128 == 0:
        # transformers dequantizes "fp8" checkpoints itself on a CPU (whole blocks only)
        assert _rel_err(got, _hf(tmp_path / layout)) < 1e-4


def test_fp8_moe_experts_run_as_stored(tiny_checkpoint, tmp_path):
    """Qwen3-MoE with its experts in FP8 blocks (one tensor per expert and projection, as
    Qwen3-30B-A3B-FP8 stores them); here only the experts: attention stays float."""
    ckpt = tiny_checkpoint("qwen3_moe", hidden_size=256, std=0.08)
    ref = write_fp8(ckpt, tmp_path / "moe", "block", linears=EXPERTS)
    want = _hf(ref)
    runner, _ = make_runner(tmp_path / "moe")
    assert runner.formats["layers.0.experts.gate_up"][0] == ("F8_E4M3",)
    assert runner.formats["layers.1.experts.down"][0] == ("F8_E4M3",)
    assert runner.formats["layers.0.qkv"][0] == ("float32",)
    got = lite_logits(runner, [IDS])[0]
    assert _rel_err(got, want) < 1e-4, _rel_err(got, want)


def test_info_names_the_formats_and_bytes_as_run(tiny_checkpoint, tmp_path):
    """`lite_llm info --model` on an FP8 directory: the matrices kept in F8_E4M3, the others in
    bf16, and the bytes a decoded token reads, as the runner packs them."""
    from lite_llm import info
    ckpt = tiny_checkpoint("qwen3", **{**SHAPE, "hidden_size": 256}, std=0.08)
    write_fp8(ckpt, tmp_path / "fp8", "block")
    w = info.model_weight_bytes(str(tmp_path / "fp8"))
    assert w["formats"] == {"F8_E4M3 (as stored)": 2 * len(LINEARS), "F32 -> bf16": 2}    # embedding, LM head
    runner, _ = make_runner(tmp_path / "fp8", dtype="bfloat16")
    vectors = sum(v.nbytes for v in runner.packed.model.vectors.values())
    assert runner.bytes_per_token == w["bytes_per_token_as_run"] + vectors
    assert any(line.startswith("weight formats: F32 -> bf16 x 2, F8_E4M3 (as stored) x 14")
               for line in info.format_text({**_machine_info(), "model": w}))


def _machine_info() -> dict:
    """The machine half of `info`'s dict, without the bandwidth probe."""
    from lite_llm import info
    return {k: v for k, v in info.collect(model=None, bandwidth=False).items() if k != "model"}


def test_fp8_checkpoints_refused_clearly(tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint("qwen3", **SHAPE, std=0.08)
    out = tmp_path / "b64"
    write_fp8(ckpt, out, "block")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [128, 64]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="FP8 blocks of 128 x 64 are not supported"):
        make_runner(out)
    cfg["quantization_config"]["weight_block_size"] = [64, 128]     # the file's scales are per 128 rows
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"q_proj.weight_scale_inv has shape \[1, 3\], expected \[2, 3\]"):
        make_runner(out)
    cfg.pop("quantization_config")                   # FP8 bytes are not read as plain values
    (tmp_path / "b64" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="q_proj.weight' is float8_e4m3fn, which runs only as an FP8 linear"):
        make_runner(tmp_path / "b64")
    out = tmp_path / "ch"
    write_fp8(ckpt, out, "channel")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="compressed-tensors format 'float-quantized' .* is not supported"):
        make_runner(out)
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    (out / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.up_proj.weight"
    sd[name] = sd[name].float().to(torch.bfloat16)          # a scale beside weights that are not FP8
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="up_proj.weight is BF16 beside an FP8 scale"):
        make_runner(out)
    sd[name] = sd[name].to(torch.float8_e5m2)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="up_proj.weight' has dtype F8_E5M2, not a type this loader reads"):
        make_runner(out)


MLA_LINEARS = re.compile(r"self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
                         r"|mlp\.(shared_experts\.)?(gate|up|down)_proj")


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_deepseek_fp8_latent_attention_runs_as_stored(tiny_checkpoint, tmp_path, arch):
    """DeepSeek-V3 / R1's released layout: the attention linears in FP8 blocks, kv_b_proj among
    them (each head's W_UV rows run in FP8 as stored, its W_UK transposed from the dequantized
    rows in float32), the dense MLP and the shared experts too; logits against transformers on
    the dequantized weights."""
    ckpt = tiny_checkpoint(arch, std=0.08)
    ref = write_fp8(ckpt, tmp_path / arch, "block", linears=MLA_LINEARS)
    want = _hf(ref)
    runner, loaded = make_runner(tmp_path / arch)
    cfg = loaded.config
    for i in range(cfg.num_layers):
        for name in ("qkv", "v_b", "o") + (("q_b",) if cfg.q_lora_rank else ()):
            assert set(runner.formats[f"layers.{i}.{name}"][0]) == {"F8_E4M3"}, (i, name, runner.formats)
        assert set(runner.formats[f"layers.{i}.k_b"][0]) == {"float32"}
    assert set(runner.formats["layers.0.gate_up"][0]) == {"F8_E4M3"}
    got = lite_logits(runner, [IDS])[0]
    assert _rel_err(got, want) < 1e-4, _rel_err(got, want)
