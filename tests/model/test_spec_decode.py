"""Speculative decoding end to end: greedy outputs token-identical with and without drafts
(n-gram prompt lookup and a draft model) on the default model and on tiny checkpoints, with
logprobs, stop strings, max_tokens, prefix caching and preemption; with sampling, a
chi-square test that the tokens keep the non-speculative distribution."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import build_tiny_checkpoint, tiny_checkpoint_path
from lite_llm import LLM, SamplingParams
from lite_llm.model.loader import default_model_path

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}

CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "def describe(width, height):\n    print('area', area(width, height))\n"
        "    print('perimeter', perimeter(width, height))\n")
DEFAULT_PROMPTS = [
    "Rename width to w and height to h in this code, and print nothing else:\n\n" + CODE + "\nHere is the code:\n",
    "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
    "The capital of France is",
]


def run(model, spec, prompts, params, **kwargs):
    """(token ids per prompt, outputs, engine stats) of one LLM."""
    with LLM(model, speculative_config=spec, **kwargs) as llm:
        outs = llm.generate(prompts, params)
        stats = llm.stats()
    return [list(o.outputs[0].token_ids) for o in outs], outs, stats


@pytest.fixture(scope="module")
def default_model():
    try:
        return default_model_path()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.fail(f"the default model is needed: {e}")


@pytest.mark.parametrize("spec", [NGRAM, "draft"])
def test_default_model_greedy_is_identical(default_model, spec):
    if spec == "draft":       # the same file as its own draft: every draft should be accepted
        spec = {"method": "draft_model", "model": default_model, "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0.0, max_tokens=48, logprobs=2)
    want, base, _ = run(None, None, DEFAULT_PROMPTS, params, max_model_len=512, block_size=16)
    got, outs, stats = run(None, spec, DEFAULT_PROMPTS, params, max_model_len=512, block_size=16)
    assert got == want
    assert stats.spec_decode_num_accepted_tokens > 0
    assert stats.generation_tokens_total == sum(len(t) for t in want)
    for o, b in zip(outs, base):
        assert o.outputs[0].text == b.outputs[0].text
        assert o.outputs[0].finish_reason == b.outputs[0].finish_reason
        for lp, blp in zip(o.outputs[0].logprobs, b.outputs[0].logprobs):
            assert list(lp)[:1] == list(blp)[:1]
            tok = next(iter(lp))
            # a verified token's logprob comes from a forward of k + 1 tokens (the GEMM path),
            # a decoded one's from a one-token GEMV: same math, other rounding of 8-bit blocks
            assert lp[tok].logprob == pytest.approx(blp[tok].logprob, abs=0.15)


def test_tiny_model_greedy_identical_with_preemption_prefix_cache_and_stops():
    path = str(tiny_checkpoint_path("llama"))
    rng = np.random.default_rng(3)
    motif = rng.integers(3, 300, 6).tolist()
    prompts = [{"prompt_token_ids": (motif * 4)[:n] + rng.integers(3, 300, 3).tolist()} for n in (5, 9, 13, 24)]
    prompts += prompts[:2]                        # the same prompts again: prefix-cache hits
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=1 if m == 33 else None,
                             prompt_logprobs=2 if m == 25 else None) for m in (40, 7, 33, 1, 40, 25)]
    # 6 KV blocks of 16 for six sequences of up to 4 blocks: they must preempt one another
    kwargs = dict(dtype="float32", block_size=16, max_num_batched_tokens=64, num_kv_blocks=6, max_model_len=64)
    want, base, _ = run_blocks(path, None, prompts, params, kwargs)
    got, outs, stats = run_blocks(path, NGRAM, prompts, params, kwargs)
    assert got == want
    assert [len(t) for t in got] == [p.max_tokens for p in params]
    assert base[5].prompt_logprobs and outs[5].prompt_logprobs and outs[2].outputs[0].logprobs
    for o, b in zip(outs, base):        # fp32: the k + 1 token forward gives the same logprobs
        assert (o.prompt_logprobs is None) == (b.prompt_logprobs is None)
        for lp, blp in zip(o.prompt_logprobs or [], b.prompt_logprobs or []):
            assert (lp is None and blp is None) or {t: round(v.logprob, 4) for t, v in lp.items()} == \
                {t: round(v.logprob, 4) for t, v in blp.items()}
        for lp, blp in zip(o.outputs[0].logprobs or [], b.outputs[0].logprobs or []):
            assert list(lp) == list(blp) and all(abs(lp[t].logprob - blp[t].logprob) < 1e-4 for t in lp)
    assert stats.spec_decode_num_accepted_tokens > 0
    assert stats.num_preempted_total > 0 and stats.prefix_cache_hits > 0


def run_blocks(path, spec, prompts, params, kwargs):
    num_blocks = kwargs.pop("num_kv_blocks")
    from lite_llm.llm import EngineArgs
    from test_parity import engine_outputs
    args = EngineArgs(path, num_kv_blocks=num_blocks, speculative_config=spec, progress=False, **kwargs)
    kwargs["num_kv_blocks"] = num_blocks
    outs, stats = engine_outputs(args, [p["prompt_token_ids"] for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs], outs, stats


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_stops_inside_accepted_drafts_cut_the_output(default_model):
    """A stop string, and a stop token, met in the middle of the run: the same text, tokens
    and finish reason as without drafts (the drafts after the stop are dropped)."""
    params = SamplingParams(temperature=0.0, max_tokens=48)
    prompt = DEFAULT_PROMPTS[1]
    (want,), (base,), _ = run(None, None, [prompt], params, max_model_len=512)
    text = base.outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 6]
    assert stop.strip()
    stop_token = want[len(want) * 2 // 3]
    for params in (SamplingParams(temperature=0.0, max_tokens=48, stop=[stop]),
                   SamplingParams(temperature=0.0, max_tokens=48, stop_token_ids=[stop_token]),
                   SamplingParams(temperature=0.0, max_tokens=48, stop=[stop], include_stop_str_in_output=True)):
        _, (b,), _ = run(None, None, [prompt], params, max_model_len=512)
        _, (o,), stats = run(None, NGRAM, [prompt], params, max_model_len=512)
        assert stats.spec_decode_num_accepted_tokens > 0
        assert len(b.outputs[0].token_ids) < len(want)
        assert (o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason,
                o.outputs[0].stop_reason) == \
            (b.outputs[0].text, b.outputs[0].token_ids, b.outputs[0].finish_reason, b.outputs[0].stop_reason)


def test_draft_model_with_another_vocabulary_is_refused():
    target = str(tiny_checkpoint_path("llama"))
    draft = str(tiny_checkpoint_path("llama", vocab_size=384))
    with pytest.raises(ValueError, match="vocabulary of 384 tokens, the target 320"):
        LLM(target, dtype="float32", max_model_len=64, kv_cache_space=0.01,
            speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unknown method 'medusa'"):
        LLM(target, speculative_config={"method": "medusa", "num_speculative_tokens": 2})


def chi2_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Pearson's two-sample statistic over categories with >= 10 observations in all (the
    rest pooled) and its degrees of freedom."""
    size = max(a.max(), b.max()) + 1
    ca, cb = np.bincount(a, minlength=size), np.bincount(b, minlength=size)
    big = (ca + cb) >= 10
    ca, cb = np.append(ca[big], ca[~big].sum()), np.append(cb[big], cb[~big].sum())
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    na, nb = ca.sum(), cb.sum()
    total = ca + cb
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    return float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum()), len(total) - 1


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df), one-sided 1e-4 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory):
    """A tiny llama with large random weights: sharp next-token distributions, so a test of
    them has power (std 0.05 weights give nearly uniform ones)."""
    return str(build_tiny_checkpoint("llama", tmp_path_factory.mktemp("peaked"), std=0.4, seed=2))


@pytest.mark.parametrize("spec", [NGRAM, "draft"])
def test_sampled_tokens_keep_their_distribution(spec, peaked_model):
    """Many seeds, one prompt: the tokens at output positions 1..3 (drafted and verified in
    the speculative run) are distributed as without speculation."""
    path = peaked_model
    if spec == "draft":      # the target as its own (greedy) draft: accepted with p(argmax) < 1
        spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    rng = np.random.default_rng(11)
    motif = rng.integers(3, 300, 5).tolist()
    kwargs = dict(dtype="float32", block_size=16, max_model_len=128, kv_cache_space=0.05, max_num_seqs=256)
    # the motif twice, then the model's own greedy continuation: tokens it likes recur
    (path_ids,), _, _ = run(path, None, [{"prompt_token_ids": motif * 2}],
                            SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), **kwargs)
    prompt = {"prompt_token_ids": motif * 2 + path_ids}
    num = 1500
    params = [SamplingParams(temperature=1.0, top_k=6, max_tokens=4, ignore_eos=True, seed=s) for s in range(num)]
    base, _, _ = run(path, None, [prompt] * num, params, **kwargs)
    got, _, stats = run(path, spec, [prompt] * num, params, **kwargs)
    drafted, accepted = stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens
    assert 0 < accepted < drafted, (accepted, drafted)
    base, got = np.array(base), np.array(got)
    for pos in (1, 2, 3):
        stat, df = chi2_two_sample(base[:, pos], got[:, pos])
        assert stat < chi2_critical(max(df, 1)), (pos, stat, df)
    assert (base != got).any()          # the runs did differ: the draws are not simply shared
