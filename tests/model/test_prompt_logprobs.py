"""prompt_logprobs on the real engine against transformers' log_softmax of the same prompt,
on a tiny random llama in fp32: every prompt token's logprob, rank and top-k, through
chunked prefill, a batch of unequal prompts, and a prompt whose blocks are prefix-cached."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint_path
from lite_llm import LLM, SamplingParams

K = 4


def hf_prompt_logprobs(model, prompt: list[int]) -> np.ndarray:
    """[P - 1, V] log_softmax of the logits at positions 0 .. P - 2 (each predicts the next token)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
    return torch.log_softmax(logits, -1)[:-1].numpy()


def check(out, prompt: list[int], want: np.ndarray) -> None:
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for i, entry in enumerate(got[1:]):
        target, row = prompt[i + 1], want[i]
        assert entry[target].logprob == pytest.approx(row[target], abs=2e-4)
        assert entry[target].rank == int((row > row[target] + 1e-6).sum()) + 1 or \
            entry[target].rank == int((row >= row[target] - 1e-6).sum())       # ties within rounding
        top = np.argsort(-row, kind="stable")[:K]
        ranked = sorted((lp.rank, t) for t, lp in entry.items() if t != target or lp.rank <= K)
        assert {t for _, t in ranked[:K]} == set(top.tolist())
        for t in top.tolist():
            assert entry[t].logprob == pytest.approx(row[t], abs=2e-4)


def test_prompt_logprobs_match_transformers_through_chunks_batches_and_the_prefix_cache():
    from transformers import AutoModelForCausalLM
    path = tiny_checkpoint_path("llama")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 320, n).tolist() for n in (2, 19, 70)]
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = [hf_prompt_logprobs(ref, p) for p in prompts]
    # token budget 32: the 70-token prompt prefills in three chunks; block size 16: it spans blocks
    with LLM(str(path), dtype="float32", block_size=16, max_num_batched_tokens=32, kv_cache_space=0.01,
             enable_prefix_caching=True) as llm:
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=K)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for out, p, w in zip(outs, prompts, want):
            check(out, p, w)
        plain = llm.generate([{"prompt_token_ids": prompts[2]}], SamplingParams(temperature=0, max_tokens=3,
                                                                                ignore_eos=True))[0]
        assert plain.prompt_logprobs is None
        assert plain.outputs[0].token_ids == outs[2].outputs[0].token_ids     # same generation either way
        again = llm.generate([{"prompt_token_ids": prompts[2]}], params)[0]   # its blocks are cached now
        check(again, prompts[2], want[2])
        zero = llm.generate([{"prompt_token_ids": prompts[1]}], params.replace(prompt_logprobs=0))[0]
        assert all(len(e) == 1 for e in zero.prompt_logprobs[1:])        # the prompt token's own only
