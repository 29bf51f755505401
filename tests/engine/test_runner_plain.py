"""The runner's plain-step path (ModelRunner._execute_plain: a steady batch's bound sampling
reused, then one compiled call samples, appends and builds the results) against the general
path it bypasses (plain_fast_path = False), on a tiny random llama through the whole engine.

The requests mix what the plain path takes (greedy, seeded top-k / top-p / min-p draws,
repetition / frequency / presence penalties, whose contexts are the appended tokens) with
what sends a step back to the general path (logprobs, min_tokens bans, a batch whose slots
are no longer 0..S-1 after requests finish): every token and logprob must be identical.
"""
from __future__ import annotations

import pytest
from conftest import tiny_checkpoint_path

from lite_llm import LLM, SamplingParams
from lite_llm.engine.runner import ModelRunner


def requests(mixed: bool):
    params = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=20, seed=5, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=1.1, top_p=0.8, seed=6, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=7, repetition_penalty=1.3, max_tokens=28, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=8, frequency_penalty=0.7, presence_penalty=0.4, max_tokens=18,
                       ignore_eos=True),
        SamplingParams(temperature=0, repetition_penalty=1.5, max_tokens=30, ignore_eos=True),
    ]
    if mixed:
        params += [SamplingParams(temperature=0.6, seed=9, logprobs=3, max_tokens=8, ignore_eos=True),
                   SamplingParams(temperature=1.0, seed=10, min_tokens=6, max_tokens=14)]
    prompts = [{"prompt_token_ids": [(17 * i + 5 * j) % 250 + 3 for j in range(3 + 2 * i)]}
               for i in range(len(params))]
    return prompts, params


def generate(monkeypatch, fast: bool, mixed: bool, **engine_args):
    """Each request's (token ids, logprobs) and the steps the plain path ran
    (ModelRunner.plain_steps)."""
    monkeypatch.setattr(ModelRunner, "plain_fast_path", fast)
    prompts, params = requests(mixed)
    with LLM(str(tiny_checkpoint_path("llama")), dtype="float32", max_model_len=128, max_num_seqs=8,
             kv_cache_space=0.01, **engine_args) as llm:
        outs = llm.generate(prompts, params, use_tqdm=False)
        plain_steps = llm.llm_engine.runner.plain_steps + llm.llm_engine.runner.steady_steps
    got = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]
    return got, plain_steps


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed"])
def test_plain_step_path_gives_the_general_paths_tokens(monkeypatch, mixed):
    fast, fast_calls = generate(monkeypatch, True, mixed)
    slow, slow_calls = generate(monkeypatch, False, mixed)
    assert slow_calls == 0
    # the plain path really ran: every step of the plain requests (the longest asks 30 tokens,
    # its slot no longer the batch's first row once others finish), many of the mixed ones
    assert fast_calls >= (12 if mixed else 29)
    for (ids, lps), (ref_ids, ref_lps) in zip(fast, slow):
        assert ids == ref_ids
        assert lps == ref_lps
    if not mixed:
        assert [len(ids) for ids, _ in fast] == [p.max_tokens for p in requests(mixed)[1]]


def test_plain_steps_with_chunked_prefill_give_the_general_paths_tokens(monkeypatch):
    """A 16-token budget: long prompts prefill over several steps beside decoding requests, so
    plain steps hold chunks that do not sample yet (their result is None)."""
    fast, fast_calls = generate(monkeypatch, True, False, max_num_batched_tokens=16)
    slow, _ = generate(monkeypatch, False, False, max_num_batched_tokens=16)
    assert fast_calls >= 29
    assert fast == slow
