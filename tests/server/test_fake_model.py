"""The server suite's engine is the product's: a served completion is exactly the fake model
runner's token rule carried through AsyncEngine, LLMEngine, the scheduler and the detokenizer,
and min_tokens keeps a stop token out as the real sampler's bans do."""
from __future__ import annotations

import os

import pytest

from .fake_model import clean_vocab, hashed_completion

PROMPT_IDS = [5, 17, 42, 99, 7]


@pytest.mark.skipif(bool(os.environ.get("LITE_LLM_SERVER_TEST_MODEL")),
                    reason="the token rule is the fake model runner's; a real model is being served")
def test_greedy_and_seeded_completions_follow_the_runner_rule(client, served):
    vocab = clean_vocab(served.tokenizer)
    want = hashed_completion(PROMPT_IDS, 9, vocab)
    r = client.completions.create(model=served.model, prompt=PROMPT_IDS, max_tokens=9, temperature=0, logprobs=0)
    assert r.choices[0].text == served.tokenizer.decode(want)
    assert r.choices[0].logprobs.tokens == [served.tokenizer.decode([t]) for t in want]
    assert r.choices[0].finish_reason == "length"
    seeded = client.completions.create(model=served.model, prompt=PROMPT_IDS, max_tokens=9, temperature=1.0,
                                       seed=11, n=2)
    texts = {c.index: c.text for c in seeded.choices}    # child i samples with seed + i
    assert texts == {i: served.tokenizer.decode(hashed_completion(PROMPT_IDS, 9, vocab, 11 + i)) for i in (0, 1)}


def test_min_tokens_holds_a_stop_token_back(client, served):
    full = client.completions.create(model=served.model, prompt=PROMPT_IDS, max_tokens=8, temperature=0,
                                     logprobs=0).choices[0].logprobs.tokens
    target = served.tokenizer.encode(full[1], add_special_tokens=False)
    assert len(target) == 1 and full[0] != full[1]
    stopped = client.completions.create(model=served.model, prompt=PROMPT_IDS, max_tokens=8, temperature=0,
                                        extra_body={"stop_token_ids": target})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 2
    held = client.completions.create(model=served.model, prompt=PROMPT_IDS, max_tokens=8, temperature=0,
                                     logprobs=0, extra_body={"stop_token_ids": target, "min_tokens": 5})
    tokens = held.choices[0].logprobs.tokens
    assert len(tokens) >= 5 and full[1] not in tokens[:5]
