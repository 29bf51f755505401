"""gpt-oss against transformers on tiny random checkpoints (GptOssForCausalLM): attention sinks,
sliding (window 8) and full layers alternating, YaRN RoPE, q/k/v/o biases, the router's
top-4-then-softmax over 8 experts with its bias, the clamped SwiGLU experts with biases (the
fixture's gate/up biases push values past the clamp at 7). fp32 logits and greedy tokens, bf16
logits, chunked prefill and paged decode against one shot, 8-bit KV caches, and MXFP4 experts
(the released checkpoints' *_blocks / *_scales) against the same weights dequantized."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import checkpoint_copy, tiny_checkpoint_path
from lite_llm import _kernels
from test_families import _greedy, hf_logits
from test_moe import _check_routed, _position_errors
from test_parity import (check_chunked_matches_one_shot, check_variant_matches_default, lite_logits, make_runner,
                         prompts_for)

CASES = [("gpt_oss", {}),
         ("gpt_oss", {"num_key_value_heads": 1, "num_experts_per_tok": 2, "tie_word_embeddings": True})]
PROMPT_LENS = [1, 5, 23, 40]     # 23 and 40 > the sliding window of 8


def _ids(case) -> str:
    arch, ov = case
    return arch + ("-" + "-".join(f"{k}={v}" for k, v in ov.items()) if ov else "")


def _max_abs_diff(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g - r).max()) for g, r in zip(got, want))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.attn_sinks and cfg.moe_routing == "topk_softmax" and cfg.act == "swiglu_oai"
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2 and cfg.sliding_window == 8
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    ref = hf_logits(path, prompts)
    got = lite_logits(runner, prompts)
    print(f"max |logit diff| vs transformers: {_max_abs_diff(got, ref):.2e} (logits up to "
          f"{max(float(np.abs(r).max()) for r in ref):.2f})")
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


def test_fp32_greedy_tokens_match_transformers():
    _greedy(CASES[0], prompt_len=12)


@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_paged_decode_match_one_shot(chunk):
    check_chunked_matches_one_shot(*CASES[0], chunk)


def _check_near_ties(err: np.ndarray) -> None:
    """test_moe._check_routed with room for more flips: this fixture's experts differ a lot
    (gate/up biases of N(0, 6)), and the router's 4th and 5th logits come within 1e-3 of each
    other at a few positions (4e-4 at the worst one measured), where rounding picks either
    expert; a flip there moves the later positions of that prompt too. At most 10 % of the
    positions beyond 0.03 of the largest |logit|, the median well within it."""
    assert int((err > 0.03).sum()) <= err.size // 10 and np.median(err) <= 0.01, np.round(np.sort(err)[-8:], 3)


@pytest.mark.parametrize("variant", _kernels.available())
def test_every_variant_gives_the_same_logits(variant):
    """The sinks, the clamped SwiGLU and the routing on every kernel build."""
    check_variant_matches_default(tiny_checkpoint_path("gpt_oss"), variant)


def test_bf16_logits_close_to_transformers():
    """bf16 weights against the fp32 reference, where no near-tied routing flips."""
    path = tiny_checkpoint_path("gpt_oss")
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    err = _position_errors(lite_logits(runner, prompts), hf_logits(path, prompts), lambda r: np.abs(r).max())
    _check_near_ties(err)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_8bit_kv_cache_stays_close(kv_cache_dtype):
    """The sinks ride every cache format's tiles: an 8-bit cache within 3 % of the largest
    |logit| where no near-tied routing flips (_check_near_ties)."""
    from test_kv_cache_dtype import make_runner as make_kv_runner
    path = tiny_checkpoint_path("gpt_oss")
    runner, loaded = make_kv_runner(path, kv_cache_dtype=kv_cache_dtype)
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    err = _position_errors(lite_logits(runner, prompts), hf_logits(path, prompts), lambda r: np.abs(r).max())
    _check_near_ties(err)


def _to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[rows, K] float -> (blocks [rows, K/32, 16] uint8, scales [rows, K/32] uint8) as the
    released checkpoints store them: e8m0 scale per 32, e2m1 codes, the low nibble first."""
    from lite_llm.model.arch.gpt_oss import FP4_VALUES
    rows, k = w.shape
    x = w.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(x).max(-1)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), 0).astype(np.int32)
    scaled = x / np.ldexp(np.float32(1.0), exp)[..., None]
    codes = np.abs(scaled[..., None] - FP4_VALUES[None, None, None, :]).argmin(-1).astype(np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(exp + 127, np.uint8)


def _mxfp4_checkpoints(tmp_path):
    """(MXFP4 checkpoint, the same values as float32 parameters) of the fixture: the experts
    as the released checkpoints store them (gate_up_proj_blocks [X, 2F, E/32, 16] with
    _scales, rows interleaving gate and up; down_proj_blocks [X, E, F/32, 16])."""
    from safetensors.numpy import save_file
    from lite_llm.model.arch.gpt_oss import _mxfp4_rows
    ckpt = tiny_checkpoint_path("gpt_oss")
    mx_dir, deq_dir = tmp_path / "mxfp4", tmp_path / "dequantized"
    sd = checkpoint_copy(ckpt, mx_dir)
    checkpoint_copy(ckpt, deq_dir)
    deq = dict(sd)
    for i in range(4):
        m = f"model.layers.{i}.mlp.experts."
        gate_up = sd.pop(m + "gate_up_proj")              # [X, E, 2F]
        down = sd.pop(m + "down_proj")                    # [X, F, E]
        gu = [_to_mxfp4(w.T) for w in gate_up]            # rows: output features
        dn = [_to_mxfp4(w.T) for w in down]
        sd[m + "gate_up_proj_blocks"] = np.stack([b for b, _ in gu])
        sd[m + "gate_up_proj_scales"] = np.stack([s for _, s in gu])
        sd[m + "down_proj_blocks"] = np.stack([b for b, _ in dn])
        sd[m + "down_proj_scales"] = np.stack([s for _, s in dn])
        # C order: safetensors writes an array's memory as it lies
        deq[m + "gate_up_proj"] = np.ascontiguousarray(np.stack([_mxfp4_rows(b, s).T for b, s in gu]))
        deq[m + "down_proj"] = np.ascontiguousarray(np.stack([_mxfp4_rows(b, s).T for b, s in dn]))
        assert np.abs(deq[m + "gate_up_proj"] - gate_up).max() > 0     # really quantized
    save_file(sd, str(mx_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(deq, str(deq_dir / "model.safetensors"), metadata={"format": "pt"})
    return mx_dir, deq_dir


def test_mxfp4_experts_give_the_logits_of_their_dequantized_weights(tmp_path):
    """An MXFP4 checkpoint's experts run as stored (MXFP4 blocks on the int8 dot products) and
    give the logits of the same model with those values stored as float32 (what transformers
    dequantizes them to): within the quantized families' bound on the logit range (int8
    activation blocks), at all but the positions a near-tied routing flips."""
    mx_dir, deq_dir = _mxfp4_checkpoints(tmp_path)
    prompts = prompts_for(320, [7, 30])
    mx_runner, _ = make_runner(mx_dir)
    assert "MXFP4" in str(mx_runner.formats)
    want = hf_logits(deq_dir, prompts)
    got = lite_logits(mx_runner, prompts)
    _check_routed(_position_errors(got, want, lambda r: r.max(-1) - r.min(-1)), 0.04, 0.01)


def test_mxfp4_experts_as_ggml_blocks_once_the_kernels_take_them(tmp_path, monkeypatch):
    """The place the MXFP4 block type plugs in: with "MXFP4" among the kernels' native types,
    each expert of an HF MXFP4 checkpoint carries its rows as ggml MXFP4 blocks (exponent byte,
    then low nibbles = values 0..15, high = 16..31), which gguf-py decodes to exactly the
    values the dequantizing path reads; without it, none (the packer dequantizes)."""
    import gguf
    from lite_llm.model import gguf as lite_gguf
    from lite_llm.model.loader import load_model
    mx_dir, _ = _mxfp4_checkpoints(tmp_path)

    def expert(name: str):
        return dict(load_model(str(mx_dir), dtype="float32", progress=False).iter_tensors(streamed=True))[name]

    native = lite_gguf.NATIVE_TYPES
    monkeypatch.setattr(lite_gguf, "NATIVE_TYPES", tuple(t for t in native if t != "MXFP4"))
    assert expert("layers.2.experts.5.gate_up.weight").block_types() is None
    monkeypatch.setattr(lite_gguf, "NATIVE_TYPES", native)
    for name, rows in (("layers.2.experts.5.gate_up.weight", 64), ("layers.1.experts.3.down.weight", 64)):
        t = expert(name)
        assert set(t.block_types()) == {"MXFP4"}
        raw = np.concatenate([reader(0, n) for (n, _), (_, reader) in zip(t.parts, t.blocks)])
        decoded = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).reshape(rows, -1)
        np.testing.assert_array_equal(decoded, t.read(0, rows))
