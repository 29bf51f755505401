"""Logits parity with transformers (the reference) on tiny random checkpoints of every
supported architecture and variant; paged decode and chunked prefill against one-shot prefill.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint_path
from lite_llm import _kernels
from lite_llm.engine.runner import ModelRunner
from lite_llm.model.loader import load_model

BLOCK = 16
# (arch, overrides): every architecture and each variant that changes the math
CASES = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"num_key_value_heads": 1}),                       # MQA
    ("llama", {"num_key_value_heads": 4}),                       # MHA
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}),
    ("mistral", {}),                                             # sliding window 8
    ("qwen2", {}),                                               # qkv bias
    ("qwen3", {"head_dim": 32}),                                 # q/k norm, head_dim != hidden / heads
    ("opt", {}),                                                 # learned positions, LayerNorm, ReLU, biases
]
PROMPT_LENS = [1, 5, 23, 40]


def _ids(case) -> str:
    arch, ov = case
    return arch + ("-" + "-".join(f"{k}={v.get('rope_type') if isinstance(v, dict) else v}" for k, v in ov.items()) if ov else "")


def hf_logits(path, prompts: list[list[int]], dtype=torch.float32) -> list[np.ndarray]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            out.append(model(torch.tensor([p])).logits[0].float().numpy())
    return out


def make_runner(path, dtype="float32", num_blocks=64, max_tokens=256, kernels=None, quantization=None, **kw):
    loaded = load_model(str(path), dtype=dtype, progress=False, **kw)
    return ModelRunner(loaded, num_blocks=num_blocks, block_size=BLOCK, max_num_batched_tokens=max_tokens,
                       max_num_seqs=max_tokens, num_threads=2, kernels=kernels, quantization=quantization), loaded


def lite_logits(runner, prompts: list[list[int]], chunk: int | None = None) -> list[np.ndarray]:
    """Logits of every position of every prompt, all prompts in each step (a mixed batch),
    prefilled `chunk` tokens per sequence per step (None: one shot)."""
    blocks_per_seq = runner.num_blocks // len(prompts)
    tables = np.array([[s * blocks_per_seq + b for b in range(blocks_per_seq)] for s in range(len(prompts))], np.int32)
    done = [0] * len(prompts)
    prompt_lens = np.array([len(p) for p in prompts], np.int32)
    result = [np.zeros((len(p), runner.config.vocab_size), np.float32) for p in prompts]
    while any(d < len(p) for d, p in zip(done, prompts)):
        toks, pos, seq, owners = [], [], [], []
        for s, p in enumerate(prompts):
            n = len(p) - done[s] if chunk is None else min(chunk, len(p) - done[s])
            for i in range(done[s], done[s] + n):
                toks.append(p[i]); pos.append(i); seq.append(s); owners.append((s, i))
            done[s] += n
        toks, pos, seq = (np.array(a, np.int32) for a in (toks, pos, seq))
        slots = (tables[seq, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK)
        rows = np.arange(len(toks), dtype=np.int32)
        logits = runner.forward(toks, pos, slots, seq, tables, rows, rope_rows=runner.rope_rows(pos, seq, prompt_lens))
        for r, (s, i) in enumerate(owners):
            result[s][i] = logits[r]
    return result


def paged_greedy(runner, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode through the paged cache: the prompt in one step, then n - 1 single-token
    steps; (the n tokens, the logits each was chosen from)."""
    table = np.arange(runner.num_blocks, dtype=np.int32)[None, :]
    toks, pos = np.array(prompt, np.int32), np.arange(len(prompt), dtype=np.int32)
    out, seen = [], []
    while len(out) < n:
        slots = table[0, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
        seq = np.zeros(len(toks), np.int32)
        logits = runner.forward(toks, pos, slots, seq, table, np.array([len(toks) - 1], np.int32),
                                rope_rows=runner.rope_rows(pos, seq, np.array([len(prompt)], np.int32)))
        seen.append(logits[0].copy())
        out.append(int(np.argmax(logits[0])))
        toks, pos = np.array([out[-1]], np.int32), np.array([pos[-1] + 1], np.int32)
    return out, seen


def prompts_for(vocab: int, lens=PROMPT_LENS, seed=0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, n).tolist() for n in lens]


def runner_greedy(runner, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens of one sequence through the runner: the prompt in one step, then a token a step."""
    table = np.arange(runner.num_blocks, dtype=np.int32)[None, :]
    got, toks, pos = [], np.array(prompt, np.int32), np.arange(len(prompt), dtype=np.int32)
    while len(got) < n:
        slots = table[0, pos // 16].astype(np.int64) * 16 + pos % 16
        logits = runner.forward(toks, pos, slots, np.zeros(len(toks), np.int32), table,
                                np.array([len(toks) - 1], np.int32))
        got.append(int(np.argmax(logits[0])))
        toks, pos = np.array([got[-1]], np.int32), np.array([pos[-1] + 1], np.int32)
    return got


def llama_cpp_greedy(path, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens of llama.cpp (llama-cpp-python) on the GGUF file at path."""
    import llama_cpp
    theirs = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    try:
        theirs.eval(prompt)
        want = []
        for _ in range(n):
            want.append(int(np.argmax(theirs.scores[theirs.n_tokens - 1])))
            theirs.eval([want[-1]])
        return want
    finally:
        theirs.close()


def check_llama_cpp_agrees(path, n: int = 16) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file at path: its n greedy tokens after a random
    12-token prompt equal ours on the same file."""
    runner, loaded = make_runner(path)
    prompt = prompts_for(loaded.config.vocab_size, [12])[0]
    assert runner_greedy(runner, prompt, n) == llama_cpp_greedy(path, prompt, n)


def check_gguf_matches_hf(gguf_path, ckpt, fields=(), approx=(), lens=(7, 30)):
    """A GGUF file written from the HF checkpoint ckpt: the same config fields (approx: float
    fields the file holds as float32, within 1e-6) and the same logits (within 1e-5 of each row's
    largest; the file read in chunks of 5) as ckpt loaded directly. Returns the file's logits, the
    prompts and the file's config, for checks of their own."""
    g_runner, g = make_runner(gguf_path)
    h_runner, h = make_runner(ckpt)
    for field in fields:
        assert getattr(g.config, field) == getattr(h.config, field), field
    for field in approx:
        assert getattr(g.config, field) == pytest.approx(getattr(h.config, field), rel=1e-6), field
    prompts = prompts_for(h.config.vocab_size, list(lens))
    got, want = lite_logits(g_runner, prompts, chunk=5), lite_logits(h_runner, prompts)
    print(f"max |logit diff| GGUF vs HF: {max(float(np.abs(a - b).max()) for a, b in zip(got, want)):.2e}")
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    return got, prompts, g.config


def engine_outputs(args, prompts, params):
    """Every prompt (token ids) through one engine built from EngineArgs args, all added at once:
    (outputs folded, the engine's stats after them)."""
    from lite_llm.engine.assemble import build_engine
    from lite_llm.outputs import fold
    engine = build_engine(args).engine
    try:
        if not isinstance(params, list):
            params = [params] * len(prompts)
        streams = [engine.add_request(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
        outs = [fold(s) for s in streams]
        return outs, engine.stats()
    finally:
        engine.shutdown(0.0)


def check_logits(got: list[np.ndarray], ref: list[np.ndarray]) -> None:
    """fp32 logits within 1e-4 (relative, and of each row's largest magnitude) of the reference's."""
    print(f"max |logit diff| vs transformers: {max(float(np.abs(g - r).max()) for g, r in zip(got, ref)):.2e}")
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


def override_ids(case, leave_out=()) -> str:
    """A (family, overrides) case's test id: its overrides, or "default"."""
    return "-".join(f"{k}={v}" for k, v in case[1].items() if k not in leave_out) or "default"


def hf_greedy(path, prompts, n):
    """transformers' greedy tokens, each step recomputed from the whole sequence (no cache involved)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(n):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(ids[len(p):])
    return out


def check_engine_greedy_under_preemption(path) -> None:
    """Five requests through the engine at once under a 16-token budget and 6 KV blocks of 16:
    they preempt one another (a readmitted request restarts its states empty) and every greedy
    token equals transformers'."""
    from lite_llm import SamplingParams
    from lite_llm.llm import EngineArgs
    prompts = prompts_for(320, [1, 9, 23, 30, 37], seed=2)
    want = hf_greedy(path, prompts, 16)
    outs, stats = engine_outputs(EngineArgs(path, dtype="float32", block_size=16, max_num_batched_tokens=16,
                                            num_kv_blocks=6, max_model_len=64, max_num_seqs=4, progress=False),
                                 prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == want
    assert stats.num_preempted_total > 0


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size)
    ref = hf_logits(path, prompts)
    got = lite_logits(runner, prompts)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


@pytest.mark.parametrize("case", [CASES[0], CASES[7], CASES[9], CASES[10]], ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_paged_decode_match_one_shot(case, chunk):
    """chunk=1 is token-by-token decode through the paged cache."""
    check_chunked_matches_one_shot(*case, chunk)


def check_chunked_matches_one_shot(arch: str, overrides: dict, chunk: int) -> None:
    """Prompts of 3, 20 and 37 tokens prefilled `chunk` at a time give the one-shot logits."""
    runner, loaded = make_runner(tiny_checkpoint_path(arch, **overrides))
    prompts = prompts_for(loaded.config.vocab_size, lens=[3, 20, 37])
    whole = lite_logits(runner, prompts)
    parts = lite_logits(runner, prompts, chunk=chunk)
    for w, p in zip(whole, parts):
        np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.03), ("float16", 0.01)])
@pytest.mark.parametrize("case", [CASES[0], CASES[8], CASES[10]], ids=_ids)
def test_half_precision_logits_close_to_transformers(case, dtype, tol):
    """bf16/fp16 weights (KV cache bf16), fp32 activations and accumulation: every logit within
    `tol` x the largest |logit| of the fp32 reference (transformers' own bf16 run is ~0.01 off)."""
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path, dtype=dtype)
    prompts = prompts_for(loaded.config.vocab_size)
    ref = hf_logits(path, prompts)
    got = lite_logits(runner, prompts)
    for r, g in zip(ref, got):
        assert np.abs(g - r).max() <= tol * np.abs(r).max()


def check_variant_matches_default(path, variant: str) -> None:
    """fp32 logits of kernel build `variant` within 1e-4 of the default build's, two prompts."""
    prompts = prompts_for(320, lens=[9, 30])
    base, _ = make_runner(path)
    other, _ = make_runner(path, kernels=_kernels.load(variant))
    for a, b in zip(lite_logits(base, prompts), lite_logits(other, prompts)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * np.abs(a).max())


@pytest.mark.parametrize("variant", _kernels.available())
def test_every_variant_gives_the_same_logits(variant):
    check_variant_matches_default(tiny_checkpoint_path("qwen2"), variant)


@pytest.mark.slow
def test_a_32k_token_sequence_through_chunked_prefill_matches_transformers(tiny_checkpoint):
    """Long context: one 32768-token sequence of a tiny Llama (rope_theta 1e6, 32k positions)
    prefilled in chunks of 2048 over its paged cache gives transformers' logits at the end of
    every chunk (each chunk attends to all the keys before it)."""
    n, chunk = 32768, 2048
    path = tiny_checkpoint("llama", max_position_embeddings=n, rope_theta=1e6, num_hidden_layers=2,
                           hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    ids = np.random.default_rng(3).integers(3, 300, n).tolist()
    want = hf_logits(path, [ids])[0][chunk - 1::chunk]
    runner, _ = make_runner(path, num_blocks=n // BLOCK, max_tokens=chunk)
    table = np.arange(n // BLOCK, dtype=np.int32)[None, :]
    got = []
    for start in range(0, n, chunk):
        pos = np.arange(start, start + chunk, dtype=np.int32)
        slots = (table[0, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK)
        logits = runner.forward(np.asarray(ids[start:start + chunk], np.int32), pos, slots,
                                np.zeros(chunk, np.int32), table, np.array([chunk - 1], np.int32))
        got.append(logits[0].copy())
    got = np.stack(got)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-4 * scale, np.abs(got - want).max() / scale
    assert (got.argmax(1) == want.argmax(1)).all()
