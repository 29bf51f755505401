"""The offline LLM API end to end: greedy tokens identical to transformers in fp32 for a
batch of prompts of several lengths, the real SmolLM2 GGUF against transformers loading the
same file, and LLM.chat answering a question."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint_path
from lite_llm import LLM, SamplingParams
from lite_llm.model.loader import default_model_path


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by full recomputation: the plain definition, no cache involved."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("mistral", {}), ("qwen2", {}),
                                            ("qwen3", {"head_dim": 32}), ("opt", {})])
def test_fp32_greedy_tokens_match_transformers_for_a_batch(arch, overrides):
    from transformers import AutoModelForCausalLM
    path = tiny_checkpoint_path(arch, **overrides)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 320, n).tolist() for n in (1, 4, 17, 33)]
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = [hf_greedy(ref_model, p, 12) for p in prompts]
    # a small block size and token budget: prompts span blocks and prefill in chunks
    with LLM(str(path), dtype="float32", block_size=16, max_num_batched_tokens=32,
             kv_cache_space=0.01) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == want
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


@pytest.fixture(scope="module")
def smollm():
    llm = LLM(None, dtype="float32", max_model_len=1024, kv_cache_space=0.25)
    yield llm
    llm.shutdown()


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_default_model_greedy_tokens_match_transformers_on_the_same_gguf(smollm):
    """transformers dequantizes the same Q4_1 GGUF; fp32 greedy continuations must agree."""
    import os
    from transformers import AutoModelForCausalLM
    path = default_model_path()
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    tok = smollm.get_tokenizer()
    prompts = ["The capital of Germany is", "def fibonacci(n):", "Once upon a time"]
    ids = [tok.encode(p) for p in prompts]
    want = [hf_greedy(ref, p, 16) for p in ids]
    outs = smollm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == want
    assert [o.prompt_token_ids for o in outs] == ids


def llama_cpp_argmax(path: str, ids: list[int]) -> np.ndarray:
    """llama.cpp's greedy next token after every prefix of ids, on the same file (its own
    quantized kernels)."""
    import llama_cpp
    model = llama_cpp.Llama(path, n_ctx=len(ids) + 8, n_threads=2, logits_all=True, verbose=False)
    model.eval(ids)
    picks = np.asarray(model.scores[:len(ids)]).argmax(-1)
    model.close()
    return picks


@pytest.mark.peers
def test_default_model_greedy_tokens_agree_with_llama_cpp_on_the_same_file(smollm):
    """Both engines run the Q4_1 file as stored (int8 activation blocks x 4-bit weights): fed
    each of our greedy contexts, llama.cpp picks the same next token at >= 95 % of 256
    generated positions over 4 prompts (position by position after a first difference would
    only measure that a near-tie went the other way once)."""
    tok = smollm.get_tokenizer()
    prompts = ["The capital of Germany is", "def fibonacci(n):", "Once upon a time", "The three primary colors are"]
    outs = smollm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    same = total = 0
    for p, o in zip(prompts, outs):
        ids, ours = tok.encode(p), o.outputs[0].token_ids
        theirs = llama_cpp_argmax(default_model_path(), ids + ours[:-1])[len(ids) - 1:]
        same += int((theirs == np.asarray(ours)).sum())
        total += len(ours)
    assert total == 256 and same / total >= 0.95, same / total


def test_chat_answers_the_capital_of_france(smollm):
    """The 135M model in Q4_1 run as stored, like llama.cpp, is a near-tie on "What is the
    capital of France?" (both engines answer "L'Étoile, ..."); this phrasing both answer."""
    out = smollm.chat([{"role": "user", "content": "Tell me the capital of France."}],
                      SamplingParams(temperature=0, max_tokens=32))
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason in ("stop", "length")


def test_generate_accepts_strings_and_token_dicts_and_keeps_order(smollm):
    tok = smollm.get_tokenizer()
    outs = smollm.generate(["Hello", {"prompt_token_ids": tok.encode("Bonjour")}, "One two three"],
                           SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert [o.prompt for o in outs] == ["Hello", None, "One two three"]
    assert outs[1].prompt_token_ids == tok.encode("Bonjour")
    assert all(1 <= len(o.outputs[0].token_ids) <= 4 for o in outs)
    assert all(o.outputs[0].text == tok.decode(o.outputs[0].token_ids) for o in outs
               if o.outputs[0].finish_reason == "length")


def test_seeded_sampling_is_reproducible_and_n_gives_several(smollm):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, seed=1234, n=3)
    a = smollm.generate(["Tell me a story"], params)[0]
    b = smollm.generate(["Tell me a story"], params)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len(a.outputs) == 3 and [o.index for o in a.outputs] == [0, 1, 2]


def test_logprobs_are_returned_per_token(smollm):
    out = smollm.generate(["The sky is"], SamplingParams(temperature=0, max_tokens=3, logprobs=2))[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    for tok_id, entry in zip(out.token_ids, out.logprobs):
        assert tok_id in entry and entry[tok_id].rank == 1     # greedy picks the most likely
        assert all(lp.logprob <= 0 for lp in entry.values())


def test_a_kv_cache_too_small_for_max_model_len_fails_at_start_with_the_numbers(tmp_path):
    path = tiny_checkpoint_path("llama")
    with pytest.raises(ValueError, match=r"cannot hold one request of max_model_len=128.*needs 8 blocks"):
        LLM(str(path), dtype="float32", block_size=16, kv_cache_space=1e-6)


def test_auto_kv_cache_is_sized_by_what_the_engine_can_use_and_says_why(tiny_checkpoint, monkeypatch):
    """No size given: the least of 4 GiB, half the memory available after the weights, and all
    that max_num_seqs sequences of max_model_len tokens can hold; the plan says which bound won."""
    from lite_llm.engine import assemble as llm_mod
    from lite_llm.engine.runner import kv_bytes_per_block
    from lite_llm.model.loader import load_model
    monkeypatch.delenv("LITE_LLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = load_model(str(tiny_checkpoint("llama")), dtype="float32", progress=False).config
    per_block = kv_bytes_per_block(cfg, 16, "float32")
    monkeypatch.setattr(llm_mod, "mem_available", lambda: 64 * llm_mod.GiB)
    small = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, None, max_num_seqs=4)
    assert small.num_blocks == 4 * 256 // 16 and small.bytes_per_block == per_block
    assert "4 sequences of 256 tokens" in small.describe()
    big = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, None, max_num_seqs=10**9)
    assert big.num_blocks == 4 * llm_mod.GiB // per_block and "4 GiB, vLLM's default" in big.describe()
    monkeypatch.setattr(llm_mod, "mem_available", lambda: 2 * llm_mod.GiB)
    tight = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, None, weight_bytes=llm_mod.GiB, max_num_seqs=10**9)
    assert tight.num_blocks == llm_mod.GiB // 2 // per_block and "half of the 2.0 GiB" in tight.describe()
    given = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, 0.01, max_num_seqs=4)
    assert given.num_blocks == int(0.01 * llm_mod.GiB // per_block) and not given.reason


def test_default_max_num_seqs_is_vllms_capped_per_computing_thread(tiny_checkpoint, caplog):
    """No max_num_seqs given: vLLM's CPU default (256 offline, 128 served), at most 32 per
    computing thread; the engine takes it (and says why), and a given value is kept."""
    import logging
    from lite_llm import llm as llm_mod
    assert llm_mod.default_max_num_seqs(2, serving=True)[0] == 64
    assert llm_mod.default_max_num_seqs(2, serving=False)[0] == 64
    assert llm_mod.default_max_num_seqs(3, serving=False)[0] == 96
    assert llm_mod.default_max_num_seqs(16, serving=True)[0] == 128
    assert llm_mod.default_max_num_seqs(16, serving=False)[0] == 256
    assert llm_mod.default_max_num_seqs(64, serving=False)[0] == 256
    path = str(tiny_checkpoint("llama"))
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        llm = LLM(path, dtype="float32", block_size=16, kv_cache_space=0.01)
    threads = llm_mod.plan_ranks(1, False).num_threads
    expect = llm_mod.default_max_num_seqs(threads, serving=False)[0]
    assert llm.llm_engine.config.max_num_seqs == expect
    assert f"max_num_seqs {expect} (" in caplog.text
    llm.shutdown()
    given = LLM(path, dtype="float32", block_size=16, kv_cache_space=0.01, max_num_seqs=5)
    assert given.llm_engine.config.max_num_seqs == 5
    given.shutdown()


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_a_kv_cache_space_is_each_tensor_parallel_ranks(tiny_checkpoint, monkeypatch, kv_heads):
    """-tp 2: a size in GiB is every rank's (vLLM's per-worker VLLM_CPU_KVCACHE_SPACE). With 2
    KV heads each rank's block is half of one rank's, so twice the blocks; with 1 KV head it
    is replicated, so the same blocks, each held twice. The memory available bounds all ranks."""
    from lite_llm.engine import assemble as llm_mod
    from lite_llm.engine.runner import kv_bytes_per_block
    from lite_llm.model.loader import load_model
    monkeypatch.delenv("LITE_LLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = load_model(str(tiny_checkpoint("llama", num_key_value_heads=kv_heads)), dtype="float32",
                     progress=False).config
    whole = kv_bytes_per_block(cfg, 16, "float32")
    one = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, 0.01)
    two = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, 0.01, tensor_parallel_size=2)
    assert two.num_blocks == int(0.01 * llm_mod.GiB // (whole // 2 if kv_heads == 2 else whole))
    assert two.num_blocks >= one.num_blocks * (2 if kv_heads == 2 else 1)
    assert two.bytes_per_block == whole * (1 if kv_heads == 2 else 2)
    assert "0.01 GiB for each of 2 ranks" in two.describe()
    monkeypatch.setattr(llm_mod, "mem_available", lambda: 2 * llm_mod.GiB)
    tight = llm_mod.plan_kv_cache(cfg, "float32", 16, 256, None, weight_bytes=llm_mod.GiB, max_num_seqs=10**9,
                                  tensor_parallel_size=2)
    assert tight.num_blocks * tight.bytes_per_block <= llm_mod.GiB // 2
    with pytest.raises(ValueError, match="do not split over 3 ranks"):
        llm_mod.plan_kv_cache(cfg, "float32", 16, 256, 0.01, tensor_parallel_size=3)
