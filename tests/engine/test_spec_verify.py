"""Speculative decoding's pieces without a model: the config's checks, the n-gram proposer
against a plain Python lookup, the compiled verifier (_sampler.verify) against a NumPy spec
of rejection sampling, and the verifier's output distribution against the target's."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm.config import SpeculativeConfig
from lite_llm.engine import _batch
from lite_llm.engine.input_batch import I_SEED, I_STEP
from lite_llm.engine.sampler import Sampler
from lite_llm.sampling_params import SamplingParams
from test_sampler import EOS, make_request, ref_draw, ref_kept, ref_sample, ref_uniform

SPEC_SALT = 0x5BEC5BEC0DDC0FFE     # the acceptance test's draws: uniform(seed ^ SPEC_SALT, index)


# ---------------------------------------------------------------- config

def test_config_parses_vllm_spellings():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 3, 1, 5)
    c = SpeculativeConfig.parse({"model": "[ngram]", "num_speculative_tokens": 2})
    assert c.method == "ngram" and c.model is None
    c = SpeculativeConfig.parse({"model": "/m/draft.gguf", "num_speculative_tokens": 2})
    assert (c.method, c.model) == ("draft_model", "/m/draft.gguf")
    assert SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize("value,message", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "unknown method 'eagle'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens must be an integer >= 1"),
    ({"method": "ngram"}, "num_speculative_tokens is required"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "prompt_lookup_min <= prompt_lookup_max"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}, "unsupported keys"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
])
def test_config_errors_name_what_is_wrong(value, message):
    with pytest.raises(ValueError, match="speculative_config.*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        SpeculativeConfig.parse(value)


# ---------------------------------------------------------------- n-gram proposer

def ref_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    n = len(tokens)
    for g in range(min(max_n, n - 1), min_n - 1, -1):
        suffix = tokens[n - g:]
        for i in range(n - g - 1, -1, -1):
            if tokens[i:i + g] == suffix:
                return tokens[i + g:i + g + k]
    return []


@pytest.mark.parametrize("min_n,max_n,k", [(1, 1, 4), (1, 3, 2), (2, 4, 5), (3, 3, 1)])
def test_ngram_proposals_match_plain_lookup(min_n, max_n, k, rng):
    rows, length = 12, 60
    token_rows = np.zeros((rows, length + 8), np.int32)
    num_tokens = np.zeros(rows, np.int32)
    for slot in range(rows):
        n = int(rng.integers(1, length))
        token_rows[slot, :n] = rng.integers(0, 4 + slot, n)     # small alphabets repeat n-grams
        num_tokens[slot] = n
    slots = np.array([5, 0, 11, 3, 7, 2], np.int32)
    max_drafts = np.array([k, k, 0, k, max(k - 1, 0), k], np.int32)
    drafts, num = np.full((len(slots), k), -1, np.int32), np.zeros(len(slots), np.int32)
    _batch.ngram_propose(token_rows, num_tokens, slots, max_drafts, min_n, max_n, drafts, num)
    for s, slot in enumerate(slots):
        want = ref_ngram(token_rows[slot, :num_tokens[slot]].tolist(), int(max_drafts[s]), min_n, max_n)
        assert drafts[s, :num[s]].tolist() == want, (slot, token_rows[slot, :num_tokens[slot]])


# ---------------------------------------------------------------- the verifier

def ref_verify(rows: np.ndarray, drafts: list[int], p: SamplingParams, seed: int, step: int) -> list[int]:
    """Rejection sampling with point-mass proposals, row by row (the spec of _sampler.verify)."""
    out = []
    for j, x in enumerate(rows):
        history = [0] * (step + j)          # only its length matters: no penalties here
        if j == len(drafts):
            out.append(ref_sample(x, p, [1], history, seed))
            return out
        d = drafts[j]
        if p.is_greedy:
            tok = int(np.argmax(x))
            out.append(tok)
            if tok != d:
                return out
            continue
        w, kept = ref_kept(x.astype(np.float32), p)
        total = float(w[kept].astype(np.float64).sum())
        p_d = float(w[d]) / total if kept[d] else 0.0
        if ref_uniform(seed ^ SPEC_SALT, step + j) < p_d:
            out.append(d)
            continue
        kept = kept.copy()
        kept[d] = False
        out.append(ref_draw(w, kept, ref_uniform(seed, step + j)))
        return out
    return out


FILTERS = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=5),
           dict(temperature=1.2, top_p=0.8), dict(temperature=0.9, top_k=30, top_p=0.9, min_p=0.02)]


@pytest.mark.parametrize("filt", FILTERS)
def test_verifier_matches_reference(filt, rng):
    vocab, num_seqs = 203, 24
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    num_drafts = [int(rng.integers(0, 5)) for _ in range(num_seqs)]
    seq_rows = np.concatenate([[0], np.cumsum([d + 1 for d in num_drafts])]).astype(np.int32)
    logits = (rng.standard_normal((int(seq_rows[-1]), vocab)) * 2.5).astype(np.float32)
    reqs, drafts = [], np.zeros(int(seq_rows[-1]), np.int32)
    for s in range(num_seqs):
        p = SamplingParams(seed=s, **filt)
        reqs.append(make_request(p, [1, 5, 7], list(range(3, 3 + s % 4)), seed=1000 + s, name=f"r{s}"))
        for j in range(num_drafts[s]):
            row = logits[seq_rows[s] + j]
            # drafts the target likes, and ones it does not, so both branches run
            drafts[seq_rows[s] + j] = int(np.argmax(row)) if rng.random() < 0.6 else int(rng.integers(vocab))
    raw = logits.copy()
    fparams, iparams, ctx, banned = sampler.build_params(reqs)
    results = sampler.verify(logits, seq_rows, drafts, fparams, iparams, ctx, banned)
    num_accepted = 0
    for s, req in enumerate(reqs):
        lo, hi = seq_rows[s], seq_rows[s + 1]
        want = ref_verify(raw[lo:hi], drafts[lo:hi - 1].tolist(), req.sampling_params,
                          int(iparams[s, I_SEED]) & ((1 << 64) - 1), int(iparams[s, I_STEP]))
        got = [r.token_id for r in results[s]] if isinstance(results[s], list) else [results[s].token_id]
        assert isinstance(results[s], list) == (hi - lo > 1)
        assert got == want, s
        assert sampler.last_counts[s] == len(want)
        num_accepted += len(want) - 1
    assert num_accepted > 0


def test_verifier_reports_raw_logprobs_of_each_output_token(rng):
    vocab = 50
    sampler = Sampler(vocab, (EOS,), num_threads=1)
    logits = rng.standard_normal((4, vocab)).astype(np.float32)
    drafts = np.array([int(np.argmax(logits[0])), int(np.argmax(logits[1])), int(np.argmax(logits[2])), 0], np.int32)
    req = make_request(SamplingParams(temperature=0.0, logprobs=2), [1], [], seed=0)
    raw = logits.astype(np.float64)
    out = sampler.verify(logits, np.array([0, 4], np.int32), drafts, *sampler.build_params([req]))[0]
    assert [r.token_id for r in out] == [int(np.argmax(raw[j])) for j in range(4)]
    for j, r in enumerate(out):
        lsm = raw[j] - raw[j].max() - np.log(np.exp(raw[j] - raw[j].max()).sum())
        assert r.logprob == pytest.approx(lsm[r.token_id], abs=1e-5) and r.rank == 1
        assert [t for t, _ in r.top_logprobs] == list(np.argsort(-raw[j])[:2])


def test_verifier_refuses_drafts_with_penalties(rng):
    sampler = Sampler(20, (EOS,), num_threads=1)
    req = make_request(SamplingParams(temperature=1.0, repetition_penalty=1.2), [1], [], seed=0)
    with pytest.raises(ValueError, match="drafts and penalties"):
        sampler.verify(np.zeros((2, 20), np.float32), np.array([0, 2], np.int32), np.zeros(2, np.int32),
                       *sampler.build_params([req]))
    with pytest.raises(ValueError, match="outside vocabulary"):
        ok = make_request(SamplingParams(temperature=1.0), [1], [], seed=0)
        sampler.verify(np.zeros((2, 20), np.float32), np.array([0, 2], np.int32), np.array([20, 0], np.int32),
                       *sampler.build_params([ok]))


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) (Wilson-Hilferty; z = 3.719: one-sided 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi2_goodness(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over categories expected >= 5 times (the rest pooled)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("filt", [dict(temperature=1.0), dict(temperature=0.8, top_k=6),
                                  dict(temperature=1.5, top_p=0.9)])
def test_verified_tokens_follow_the_target_distribution(filt):
    """Many sequences with the same two rows and the same draft pair: the first output token
    is distributed as p0 (whatever was drafted), the second, when the first draft was
    accepted, as p1."""
    vocab, num_seqs = 12, 40000
    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((3, vocab)) * 1.5).astype(np.float32)
    p = SamplingParams(**filt)
    probs = []
    for x in rows:
        w, kept = ref_kept(x, p)
        q = np.where(kept, w, 0).astype(np.float64)
        probs.append(q / q.sum())
    d0 = int(np.argsort(-probs[0])[1])       # the target's second choice: often rejected
    d1 = int(np.argmax(probs[1]))
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    reqs = [make_request(SamplingParams(seed=s, **filt), [1], [], seed=s, name=str(s)) for s in range(num_seqs)]
    fparams, iparams, ctx, banned = sampler.build_params(reqs)
    logits = np.tile(rows, (num_seqs, 1))
    seq_rows = np.arange(0, 3 * num_seqs + 1, 3, dtype=np.int32)
    drafts = np.tile(np.array([d0, d1, 0], np.int32), num_seqs)
    results = sampler.verify(logits, seq_rows, drafts, fparams, iparams, ctx, banned)
    first = np.array([r[0].token_id for r in results])
    second = np.array([r[1].token_id for r in results if len(r) > 1 and r[0].token_id == d0])
    assert 0.05 * num_seqs < (first == d0).sum() < 0.95 * num_seqs      # both branches ran
    for tokens, want in ((first, probs[0]), (second, probs[1])):
        stat, df = chi2_goodness(np.bincount(tokens, minlength=vocab), want)
        assert stat < chi2_critical(max(df, 1)), (stat, df)


@pytest.mark.parametrize("command", [["serve"], ["generate", "-p", "x"], ["bench", "latency"]])
def test_cli_refuses_a_bad_speculative_config_before_loading(command):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "lite_llm", *command, "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": -1}'], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "--speculative-config: speculative_config: num_speculative_tokens must be an integer >= 1" in out.stderr
