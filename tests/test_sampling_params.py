"""SamplingParams: vLLM defaults, normalisation, range checks naming the field, copies."""
from __future__ import annotations

import pytest

from lite_llm.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.best_of, p.temperature, p.top_p, p.top_k, p.min_p) == (1, None, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs, p.seed) == (16, 0, None, None, None)
    assert p.stop == [] and p.stop_token_ids == [] and not p.ignore_eos
    assert p.detokenize and p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.include_stop_str_in_output and not p.is_greedy


def test_normalisation():
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(max_tokens=None).max_tokens is None
    g = SamplingParams(temperature=0.0, top_p=0.5, top_k=10, min_p=0.3)
    assert g.is_greedy and (g.top_p, g.top_k, g.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(temperature=1e-6).is_greedy


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("best_of", 0), ("presence_penalty", 2.5), ("frequency_penalty", -2.1),
    ("repetition_penalty", 0.0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.01),
    ("top_k", -2), ("min_p", 1.5), ("seed", 1.5), ("stop", [""]), ("stop", [1]),
    ("stop_token_ids", [-1]), ("max_tokens", 0), ("min_tokens", -1), ("logprobs", 21),
    ("logprobs", -1), ("prompt_logprobs", -1), ("prompt_logprobs", 21), ("n", True),
])
def test_out_of_range_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_cross_field_checks():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams(n=3, best_of=2)
    SamplingParams(n=2, best_of=3)
    SamplingParams(min_tokens=5, max_tokens=5, logprobs=20, presence_penalty=-2, frequency_penalty=2)


def test_clone_and_replace_are_independent_and_validated():
    p = SamplingParams(stop=["x"], stop_token_ids=[5], temperature=0.7)
    c = p.clone()
    c.stop.append("y")
    assert p.stop == ["x"] and c == SamplingParams(stop=["x", "y"], stop_token_ids=[5], temperature=0.7)
    r = p.replace(max_tokens=64, stop="z")
    assert (r.max_tokens, r.stop, r.temperature) == (64, ["z"], 0.7) and p.max_tokens == 16
    with pytest.raises(ValueError, match="top_p"):
        p.replace(top_p=2.0)
