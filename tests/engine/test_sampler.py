"""The compiled sampler against a plain NumPy reference: penalties, min_tokens, greedy,
temperature + top_k/top_p/min_p filtering, the seeded draw, logprobs, and the distribution."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm.engine.input_batch import I_STEP, I_TOK_END
from lite_llm.engine.request import Request
from lite_llm.engine.sampler import Sampler
from lite_llm.sampling_params import SamplingParams

EOS = 2
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- reference (the spec)

def ref_splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def ref_uniform(seed: int, step: int) -> float:
    h = ref_splitmix64((seed & MASK64) ^ ref_splitmix64(step ^ 0xD1B54A32D192ED03))
    return (h >> 11) / 2.0**53


def ref_process(x: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int],
                eos: tuple[int, ...]) -> np.ndarray:
    """Penalties then min_tokens bans, on a float32 copy of one row [V]."""
    x = x.astype(np.float32).copy()
    v = x.shape[0]
    if p.repetition_penalty != 1.0:
        seen = np.zeros(v, bool)
        seen[prompt + output] = True
        rep = np.float32(p.repetition_penalty)
        x = np.where(seen, np.where(x > 0, x / rep, x * rep), x).astype(np.float32)
    counts = np.bincount(np.array(output, dtype=np.int64), minlength=v).astype(np.float32)
    x = x - (np.float32(p.frequency_penalty) * counts + np.float32(p.presence_penalty) * (counts > 0))
    if len(output) < p.min_tokens:
        x[list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos))] = -np.inf
    return x.astype(np.float32)


def ref_kept(x: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """w = exp((x - max) / T) [V] and the mask of tokens top_k, top_p, min_p keep."""
    w = np.exp((x - x.max()) * np.float32(1.0 / np.float32(p.temperature))).astype(np.float32)
    thr = np.float32(0.0)
    if 0 < p.top_k < w.size:
        thr = np.sort(w)[::-1][p.top_k - 1]
    if p.top_p < 1.0:
        vals = np.sort(w[w >= thr])[::-1].astype(np.float64)
        cum = np.cumsum(vals)
        cut = int(np.searchsorted(cum, p.top_p * vals.sum()))     # first index with cum >= target
        thr = max(thr, np.float32(vals[min(cut, vals.size - 1)]))
    thr = max(thr, np.float32(p.min_p))
    return w, w >= thr


def ref_draw(w: np.ndarray, kept: np.ndarray, u: float) -> int:
    cdf = np.cumsum(np.where(kept, w, 0).astype(np.float64))
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def ref_sample(x: np.ndarray, p: SamplingParams, prompt, output, seed, eos=(EOS,)) -> int:
    y = ref_process(x, p, prompt, output, eos)
    if p.is_greedy:
        return int(np.argmax(y))
    w, kept = ref_kept(y, p)
    return ref_draw(w, kept, ref_uniform(seed, len(output)))


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


# ---------------------------------------------------------------- helpers

def make_request(p: SamplingParams, prompt: list[int], output: list[int], seed: int,
                 name: str = "r") -> Request:
    req = Request(name, prompt, p, seed, eos_token_ids=(EOS,))
    for t in output:
        req.append_output_token(t)
    return req


def random_history(rng, vocab: int, num_prompt: int, num_output: int) -> tuple[list[int], list[int]]:
    # a small pool of ids so tokens repeat and counts above 1 occur
    pool = rng.choice(vocab, size=min(vocab, 40), replace=False)
    return rng.choice(pool, num_prompt).tolist(), rng.choice(pool, num_output).tolist()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


FILTERS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=1),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.3, top_k=700),
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=1.0, top_p=0.3),
    dict(temperature=0.5, top_p=0.999),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=0.9, top_k=50, top_p=0.8),
    dict(temperature=1.1, top_k=300, top_p=0.95, min_p=0.02),
    dict(temperature=2.0, top_p=0.7, min_p=0.1),
]
PENALTIES = [
    dict(),
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(frequency_penalty=0.6),
    dict(presence_penalty=-0.8),
    dict(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.5),
]


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize("penalty", PENALTIES)
def test_greedy_matches_reference_with_penalties(penalty, rng):
    vocab, num_seqs = 997, 6
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    logits = rng.standard_normal((num_seqs, vocab), dtype=np.float32) * 2
    reqs = []
    for s in range(num_seqs):
        prompt, output = random_history(rng, vocab, 12, 3 * s)
        # make a penalised token the unpenalised winner so the penalty has to change the argmax
        logits[s, (prompt + output)[0]] = 9.0
        reqs.append(make_request(SamplingParams(temperature=0.0, **penalty), prompt, output, seed=s))
    raw = logits.copy()
    results = sampler.sample(logits, reqs)
    for s, (req, res) in enumerate(zip(reqs, results)):
        want = ref_process(raw[s], req.sampling_params, req.prompt_token_ids, req.output_token_ids, (EOS,))
        # greedy rows are left holding the processed logits
        np.testing.assert_allclose(logits[s], want, rtol=1e-6, atol=1e-6)
        assert res.token_id == int(np.argmax(want))
        assert res.logprob is None and res.top_logprobs is None


@pytest.mark.parametrize("filt", FILTERS)
@pytest.mark.parametrize("penalty", [PENALTIES[0], PENALTIES[5]])
def test_sampled_tokens_match_reference_draws(filt, penalty, rng):
    """Same filtered distribution and same draw: the token equals the reference inverse CDF
    at the same u, for many steps (each step is a different u)."""
    vocab, num_seqs, num_steps = 4099, 5, 12
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    base = rng.standard_normal((num_seqs, vocab), dtype=np.float32) * 2.5
    hist = [random_history(rng, vocab, 10, 4) for _ in range(num_seqs)]
    reqs = [make_request(SamplingParams(**filt, **penalty), *hist[s], seed=1000 + s) for s in range(num_seqs)]
    for _ in range(num_steps):
        logits = base.copy()
        results = sampler.sample(logits, reqs)
        for s, (req, res) in enumerate(zip(reqs, results)):
            p, prompt, output = req.sampling_params, req.prompt_token_ids, req.output_token_ids
            y = ref_process(base[s], p, prompt, output, (EOS,))
            w, kept = ref_kept(y, p)
            assert kept[res.token_id], "sampled a token the filters remove"
            assert res.token_id == ref_draw(w, kept, ref_uniform(req.seed, len(output)))
        for req, res in zip(reqs, results):
            req.append_output_token(res.token_id)


def test_large_vocab_filters_match_reference(rng):
    vocab = 128_256    # Llama-3 vocabulary size: exercises the selection on long rows
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    params = [SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(top_k=40, temperature=0.7),
              SamplingParams(temperature=1.0, min_p=0.1), SamplingParams(top_k=2000, top_p=0.5)]
    base = rng.standard_normal((len(params), vocab), dtype=np.float32) * 3
    reqs = [make_request(p, [5, 6, 7], [], seed=77 + i) for i, p in enumerate(params)]
    for step in range(3):
        logits = base.copy()
        for s, res in enumerate(sampler.sample(logits, reqs)):
            req = reqs[s]
            w, kept = ref_kept(ref_process(base[s], req.sampling_params, [5, 6, 7],
                                           req.output_token_ids, (EOS,)), req.sampling_params)
            # sampled rows are left holding w = exp((x - max) / T)
            np.testing.assert_allclose(logits[s], w, rtol=1e-5, atol=1e-30)
            assert res.token_id == ref_draw(w, kept, ref_uniform(req.seed, step))
            req.append_output_token(res.token_id)


@pytest.mark.parametrize("filt", [dict(), dict(top_k=3), dict(top_p=0.75), dict(min_p=0.2),
                                  dict(temperature=0.5, top_k=4, top_p=0.9)])
def test_draws_follow_the_filtered_softmax(filt):
    """Chi-square over 6000 seeds on an 8-token vocabulary."""
    vocab, num_seeds = 8, 6000
    row = np.array([2.0, 1.5, 1.2, 0.3, 0.0, -0.4, -1.0, -3.0], np.float32)
    p = SamplingParams(**filt)
    w, kept = ref_kept(row, p)
    probs = np.where(kept, w, 0).astype(np.float64)
    probs /= probs.sum()
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    reqs = [make_request(p, [1], [], seed=s) for s in range(num_seeds)]
    tokens = [r.token_id for r in sampler.sample(np.tile(row, (num_seeds, 1)), reqs)]
    counts = np.bincount(tokens, minlength=vocab)
    assert counts[~kept].sum() == 0
    expected = probs[kept] * num_seeds
    chi2 = float((((counts[kept] - expected) ** 2) / expected).sum())
    # 99.99th percentile of chi-square with <= 7 degrees of freedom is below 30
    assert chi2 < 30.0, (counts, expected)


def test_seeded_tokens_do_not_depend_on_batch(rng):
    vocab = 500
    rows = rng.standard_normal((6, vocab), dtype=np.float32)
    params = [SamplingParams(temperature=1.0), SamplingParams(top_p=0.8), SamplingParams(top_k=10),
              SamplingParams(min_p=0.05, temperature=1.5), SamplingParams(temperature=0.0),
              SamplingParams(presence_penalty=1.0, top_k=30)]
    sampler = Sampler(vocab, (EOS,), num_threads=2)

    def run(order: list[int]) -> dict[int, int]:
        reqs = [make_request(params[i], [3, 4], [5, 9][: i % 3], seed=2**63 + 17 * i, name=str(i))
                for i in order]
        out = sampler.sample(rows[order].copy(), reqs)
        return {i: r.token_id for i, r in zip(order, out)}

    alone = {i: run([i])[i] for i in range(6)}
    assert run(list(range(6))) == alone
    assert run([5, 3, 1, 0, 4, 2]) == alone
    assert run([4, 2]) == {4: alone[4], 2: alone[2]}
    # a different seed changes at least one of many draws
    reqs_a = [make_request(SamplingParams(), [1], [], seed=s) for s in range(20)]
    reqs_b = [make_request(SamplingParams(), [1], [], seed=s + 100) for s in range(20)]
    flat = np.tile(rows[0], (20, 1))
    assert [r.token_id for r in sampler.sample(flat.copy(), reqs_a)] != \
        [r.token_id for r in sampler.sample(flat.copy(), reqs_b)]


def test_min_tokens_bans_eos_and_stop_tokens():
    vocab = 64
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    row = np.zeros(vocab, np.float32)
    row[EOS], row[7], row[11] = 10.0, 9.0, 8.0      # EOS best, stop token 7 next, then 11

    def greedy(p: SamplingParams, num_output: int) -> int:
        req = make_request(p, [1, 2, 3], [20] * num_output, seed=0)
        return sampler.sample(row[None].copy(), [req])[0].token_id

    p = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7])
    assert [greedy(p, n) for n in range(5)] == [11, 11, 11, EOS, EOS]
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[7], ignore_eos=True)
    assert [greedy(p, n) for n in range(3)] == [EOS, EOS, EOS]
    # sampling never draws a banned token, however likely
    reqs = [make_request(SamplingParams(min_tokens=1, stop_token_ids=[7]), [1], [], seed=s) for s in range(300)]
    tokens = {r.token_id for r in sampler.sample(np.tile(row, (300, 1)), reqs)}
    assert EOS not in tokens and 7 not in tokens and 11 in tokens


@pytest.mark.parametrize("num_logprobs", [0, 1, 5, 20])
def test_logprobs_are_raw_log_softmax(num_logprobs, rng):
    vocab = 3001
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    params = [SamplingParams(temperature=0.0, logprobs=num_logprobs),
              SamplingParams(temperature=0.6, top_k=5, repetition_penalty=1.5, logprobs=num_logprobs),
              SamplingParams(temperature=1.0, logprobs=num_logprobs),
              SamplingParams(temperature=1.0)]
    raw = rng.standard_normal((len(params), vocab), dtype=np.float32) * 3
    raw[1, 100] = raw[1, 200] = raw[1].max() + 1.0       # a tie at the top: lower id ranks first
    reqs = [make_request(p, [100, 200, 300], [], seed=i) for i, p in enumerate(params)]
    results = sampler.sample(raw.copy(), reqs)
    for s, res in enumerate(results[:3]):
        lsm = ref_log_softmax(raw[s])
        assert res.logprob == pytest.approx(lsm[res.token_id], abs=2e-5)
        assert res.rank == int((raw[s] >= raw[s, res.token_id]).sum())
        want_ids = np.argsort(-raw[s], kind="stable")[:num_logprobs]
        assert [t for t, _ in res.top_logprobs] == want_ids.tolist()
        np.testing.assert_allclose([lp for _, lp in res.top_logprobs], lsm[want_ids], atol=2e-5)
    assert results[0].rank == 1
    assert results[3].logprob is None and results[3].top_logprobs is None and results[3].rank is None


def test_rejects_bad_shapes_and_ids():
    sampler = Sampler(10, (EOS,), num_threads=1)
    req = make_request(SamplingParams(repetition_penalty=1.1), [1, 2], [], seed=0)
    with pytest.raises(ValueError):
        sampler.sample(np.zeros((1, 11), np.float32), [req])
    with pytest.raises(ValueError):
        sampler.sample(np.zeros((1, 10), np.float64), [req])
    bad = make_request(SamplingParams(repetition_penalty=1.1), [1, 10], [], seed=0)
    with pytest.raises(ValueError, match="outside vocabulary"):
        sampler.sample(np.zeros((1, 10), np.float32), [bad])
    assert sampler.sample(np.zeros((0, 10), np.float32), []) == []


# ---------------------------------------------------------------- grammar bitmask

def ref_apply_bitmask(x: np.ndarray, words: np.ndarray) -> np.ndarray:
    """x [V] with every token whose bit (t % 32 of word t // 32) is 0 set to -inf."""
    bits = np.unpackbits(words.astype("<i4").view(np.uint8), bitorder="little")[:x.shape[0]]
    return np.where(bits.astype(bool), x, -np.inf).astype(np.float32)


def random_bitmask(rng, rows: int, vocab: int, density: float) -> np.ndarray:
    """[rows, ceil(V / 32)] int32 with about `density` of the tokens allowed (at least one)."""
    allowed = rng.random((rows, vocab)) < density
    allowed[np.arange(rows), rng.integers(0, vocab, rows)] = True
    padded = np.zeros((rows, -(-vocab // 32) * 32), bool)
    padded[:, :vocab] = allowed
    return np.packbits(padded, axis=1, bitorder="little").view("<i4").astype(np.int32)


@pytest.mark.parametrize("density", [0.001, 0.3, 0.97])
def test_bitmask_rows_sample_what_the_masked_reference_samples(density, rng):
    """Masked rows draw from the masked distribution (the reference: -inf outside the mask,
    then the usual steps), greedy and sampled alike; logprobs are those of the masked row;
    unmasked rows (-1) of the same step are untouched by the mask."""
    vocab = 4099                       # not a multiple of 32: the last word is partial
    params = [SamplingParams(temperature=0.0, logprobs=3),
              SamplingParams(temperature=1.0, top_p=0.9, logprobs=2),
              SamplingParams(temperature=0.8, top_k=7, repetition_penalty=1.3),
              SamplingParams(temperature=1.0)]
    mask_rows = np.array([1, -1, 0, 2], np.int32)
    bitmask = random_bitmask(rng, 3, vocab, density)
    sampler = Sampler(vocab, (EOS,), num_threads=2)
    for step in range(6):
        raw = rng.standard_normal((len(params), vocab), dtype=np.float32) * 3
        reqs = [make_request(p, [5, 6, 7], [8] * step, seed=50 + i) for i, p in enumerate(params)]
        results = sampler.sample(raw.copy(), reqs, bitmask=bitmask, mask_rows=mask_rows)
        for s, (req, res) in enumerate(zip(reqs, results)):
            x = raw[s] if mask_rows[s] < 0 else ref_apply_bitmask(raw[s], bitmask[mask_rows[s]])
            assert np.isfinite(x[res.token_id]), "sampled a token the mask forbids"
            assert res.token_id == ref_sample(x, req.sampling_params, req.prompt_token_ids,
                                              req.output_token_ids, req.seed)
            if req.sampling_params.logprobs is not None:
                assert res.logprob == pytest.approx(ref_log_softmax(x)[res.token_id], abs=2e-5)


def test_bitmask_shapes_are_checked(rng):
    vocab = 100
    sampler = Sampler(vocab, (EOS,), num_threads=1)
    reqs = [make_request(SamplingParams(temperature=0.0), [1], [], seed=0)]
    with pytest.raises(ValueError, match="bitmask"):     # 3 words hold only 96 tokens
        sampler.sample(rng.standard_normal((1, vocab), dtype=np.float32), reqs,
                       bitmask=np.full((1, 3), -1, np.int32), mask_rows=np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="mask_rows"):
        sampler.sample(rng.standard_normal((1, vocab), dtype=np.float32), reqs,
                       bitmask=np.full((1, 4), -1, np.int32), mask_rows=np.array([1], np.int32))


def test_bound_sampling_rechecks_and_follows_changed_contents(rng):
    """The engine binds a step's sampling before forward() (Sampler.prepare) and samples after
    it (run_prepared); a steady batch binds the same arrays every step. Each step's tokens
    equal a fresh run over copies of that step's arrays, and a row made bad in place is still
    refused on a rebind of the same arrays."""
    vocab, num_seqs = 1031, 4
    bound, fresh = Sampler(vocab, (EOS,), num_threads=2), Sampler(vocab, (EOS,), num_threads=2)
    reqs = [make_request(SamplingParams(temperature=0.9, top_p=0.8, repetition_penalty=1.2),
                         *random_history(rng, vocab, 8, 3), seed=77 + s) for s in range(num_seqs)]
    fparams, iparams, context, banned = bound.build_params(reqs)
    logits = np.empty((num_seqs, vocab), np.float32)
    for step in range(6):
        logits[:] = rng.standard_normal((num_seqs, vocab), dtype=np.float32) * 2
        want = fresh.run(logits.copy(), fparams.copy(), iparams.copy(), context.copy(), banned.copy())
        bound.prepare(logits, fparams, iparams, context, banned)
        got = bound.run_prepared()
        assert [r.token_id for r in got] == [r.token_id for r in want]
        assert bound.last_tokens.tolist() == [r.token_id for r in want]
        iparams[:, I_STEP] += 1      # the next step draws another u
    iparams[0, I_TOK_END] = len(context) + 1     # past the context
    with pytest.raises(ValueError, match="bad iparams row 0"):
        bound.prepare(logits, fparams, iparams, context, banned)
