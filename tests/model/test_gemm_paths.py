"""A bf16 model on every GEMM path of every variant this machine runs (forced by
LITE_LLM_GEMM_PATH): logits close to transformers, and the fp32-FMA path at least as close to
an fp64 run of the same bf16 weights as vdpbf16ps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint_path
from lite_llm import _kernels
from lite_llm._kernels import gemm_path
from lite_llm.engine.runner import ModelRunner
from lite_llm.model.loader import load_model
from test_parity import BLOCK, hf_logits, lite_logits, make_runner, prompts_for

CASES = [(v, p) for v in _kernels.available() for p in _kernels.load(v).BF16_PATHS]


@pytest.fixture
def forced(monkeypatch, tmp_path):
    """Force a path through the environment, as a user would; a private cache directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def force(path: str) -> None:
        monkeypatch.setenv("LITE_LLM_GEMM_PATH", path)
    with gemm_path.chosen_aside():
        yield force


def _fp64_logits(path, prompts):
    """transformers in fp64 on the bf16-rounded weights: the exact arithmetic of a bf16 model."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).double().eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].numpy() for p in prompts]


@pytest.mark.parametrize("variant,path", CASES)
@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_bf16_logits_on_every_path_close_to_transformers(variant, path, arch, forced):
    forced(path)
    ckpt = tiny_checkpoint_path(arch)
    runner, loaded = make_runner(ckpt, dtype="bfloat16", kernels=_kernels.load(variant))
    assert runner.gemm_paths.chosen["bf16"] == path
    prompts = prompts_for(loaded.config.vocab_size)
    for r, g in zip(hf_logits(ckpt, prompts), lite_logits(runner, prompts)):
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()


@pytest.mark.parametrize("variant", [v for v in _kernels.available() if "dpbf16" in _kernels.load(v).BF16_PATHS])
def test_fma_path_at_least_as_accurate_as_vdpbf16ps_at_model_level(variant, forced):
    ckpt = tiny_checkpoint_path("llama")
    prompts = prompts_for(320, lens=[23, 40])
    exact = _fp64_logits(ckpt, prompts)
    errors = {}
    for path in ("dpbf16", "fma"):
        forced(path)
        runner, _ = make_runner(ckpt, dtype="bfloat16", kernels=_kernels.load(variant))
        got = lite_logits(runner, prompts)
        errors[path] = np.mean([np.abs(g - e).mean() for g, e in zip(got, exact)])
    assert errors["fma"] <= errors["dpbf16"], errors


def test_a_bad_lite_llm_gemm_path_stops_start_up_clearly(forced):
    forced("fastest")
    with pytest.raises(ValueError, match="LITE_LLM_GEMM_PATH"):
        make_runner(tiny_checkpoint_path("llama"), dtype="bfloat16")


ATTENTION_CASES = [(v, kv, p) for v in _kernels.available() for kv in ("bfloat16", "int8")
                   for p in ("direct", "bf16", "fma")]


@pytest.mark.parametrize("variant,kv_cache_dtype,path", ATTENTION_CASES)
def test_bf16_logits_on_every_attention_path_close_to_transformers(variant, kv_cache_dtype, path, monkeypatch):
    """Attention tiles forced direct, staged to bf16 pairs or staged to fp32 (LITE_LLM_ATTENTION_PATH),
    over a bf16 and an int8 cache: prompts of 23 and 40 tokens prefill in tiles of 8 rows and more."""
    monkeypatch.setenv("LITE_LLM_ATTENTION_PATH", path)
    ckpt = tiny_checkpoint_path("llama")
    loaded = load_model(str(ckpt), dtype="bfloat16", progress=False)
    runner = ModelRunner(loaded, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=256, max_num_seqs=256,
                         num_threads=2, kernels=_kernels.load(variant), kv_cache_dtype=kv_cache_dtype)
    assert runner.attention_path == path
    prompts = prompts_for(loaded.config.vocab_size, lens=[23, 40])
    for r, g in zip(hf_logits(ckpt, prompts), lite_logits(runner, prompts)):
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max(), np.abs(g - r).max() / np.abs(r).max()


def test_a_bad_lite_llm_attention_path_stops_start_up_clearly(monkeypatch):
    monkeypatch.setenv("LITE_LLM_ATTENTION_PATH", "fastest")
    with pytest.raises(ValueError, match="LITE_LLM_ATTENTION_PATH='fastest': expected one of auto, direct"):
        make_runner(tiny_checkpoint_path("llama"), dtype="bfloat16")
