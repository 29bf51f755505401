"""Drafts through the real scheduler, KV manager, persistent batch and engine, with a fake
model (fake_runner.next_token is the "model"): every drafted slot is allocated, what a
rejected draft wrote is never attended to as a real token, prefix caching and preemption
hold, and outputs, stop strings and finish reasons equal a run without drafts."""
from __future__ import annotations

import numpy as np
import pytest
from fake_runner import FakeRunner, next_token
from test_engine import CharTokenizer, run_all

from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.request import SampleResult
from lite_llm.engine.runner_output import RunnerOutput
from lite_llm.sampling_params import SamplingParams

VOCAB = 50


class DraftingFakeRunner(FakeRunner):
    """FakeRunner whose steps verify drafts greedily (a draft is accepted iff it is the
    fake model's next token) and which drafts k tokens per sampling sequence: the true
    continuation up to a point chosen by hash, then wrong tokens (so both branches run)."""

    def __init__(self, *args, k: int = 3, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = k
        self.num_rejected = self.num_accepted = 0

    def execute(self, sched_out):
        a = self.batch.prepare(sched_out)
        assert len(set(a.slot_mapping.tolist())) == len(a.slot_mapping), "two tokens write the same slot"
        self.kv_token[a.slot_mapping] = a.token_ids
        self.kv_pos[a.slot_mapping] = a.positions
        results, slots, tokens = [], [], []
        for c in sched_out.chunks:
            req = c.request
            fed = list(req.all_token_ids[:c.start + c.num_new_tokens - len(c.spec_token_ids)]) + list(c.spec_token_ids)
            end = c.start + c.num_new_tokens
            slot = self.batch.slot_of[req.request_id]
            kv = self._slots(slot, 0, end)            # every drafted position has a slot
            np.testing.assert_array_equal(self.kv_token[kv], fed, err_msg=f"KV of {req.request_id} is wrong")
            np.testing.assert_array_equal(self.kv_pos[kv], np.arange(end))
            if not c.sample:
                results.append(None)
                continue
            out = []
            ctx = list(req.all_token_ids)
            for d in list(c.spec_token_ids) + [None]:
                t = next_token(ctx, None, self.vocab_size)
                out.append(SampleResult(t, -0.5, None))
                ctx.append(t)
                if t != d:
                    self.num_rejected += d is not None
                    break
                self.num_accepted += 1
            results.append(out if c.spec_token_ids else out[0])
            slots += [slot] * len(out)
            tokens += [r.token_id for r in out]
        self.batch.append_sampled(np.array(slots, np.int32), np.array(tokens, np.int32))
        spec_token_ids = {}
        for c in sched_out.chunks:
            if c.sample:
                slot = self.batch.slot_of[c.request.request_id]
                ctx = self.batch.token_ids[slot, :self.batch.num_tokens[slot]].tolist()
                good = next_token(ctx, 99, self.k + 1)           # how many drafts are right
                drafts = []
                for j in range(self.k):
                    t = next_token(ctx, None, self.vocab_size)
                    drafts.append(t if j < good else (t + 1) % self.vocab_size)
                    ctx.append(t)
                spec_token_ids[c.request.request_id] = drafts
        return RunnerOutput(results, spec_token_ids)


def _run(runner_cls, requests, tokenizer=None, **cfg):
    config = EngineConfig(**{**dict(max_num_seqs=8, max_num_batched_tokens=64, block_size=4, num_blocks=1024,
                                    max_model_len=128, seed=7), **cfg})
    runner = runner_cls(config.num_blocks, config.block_size, VOCAB, config.max_num_batched_tokens,
                        config.max_num_seqs, config.max_model_len)
    engine = LLMEngine(runner, tokenizer, config)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    outs = run_all(engine)
    return outs, engine, runner


@pytest.mark.parametrize("num_blocks", [1024, 24])
def test_drafted_runs_equal_plain_ones(num_blocks):
    rng = np.random.default_rng(5)
    shared = rng.integers(1, VOCAB, 9).tolist()
    requests = []
    for i in range(10):
        prompt = shared + rng.integers(1, VOCAB, int(rng.integers(1, 12))).tolist() if i % 2 else \
            rng.integers(1, VOCAB, int(rng.integers(1, 20))).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 40)), ignore_eos=True)
        requests.append((f"r{i}", prompt, params))
    want, _, _ = _run(FakeRunner, requests, num_blocks=num_blocks)
    got, engine, runner = _run(DraftingFakeRunner, requests, num_blocks=num_blocks)
    for rid in want:
        assert got[rid].outputs[0].token_ids == want[rid].outputs[0].token_ids, rid
        assert got[rid].outputs[0].finish_reason == want[rid].outputs[0].finish_reason
    assert runner.num_accepted > 0 and runner.num_rejected > 0
    stats = engine.stats()
    assert stats.spec_decode_num_accepted_tokens == runner.num_accepted    # each counted once
    assert stats.prefix_cache_hits > 0
    if num_blocks == 24:
        assert stats.num_preempted_total > 0
    assert engine.kv_cache_manager.num_free_blocks == num_blocks


def test_stop_strings_and_eos_inside_drafts():
    tok = CharTokenizer()
    prompt = [1, 2, 3]
    ref, _, _ = _run(FakeRunner, [("a", prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))],
                     tokenizer=tok)
    full = ref["a"].outputs[0].text
    tokens = ref["a"].outputs[0].token_ids
    for params in (SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[full[12:14]]),
                   SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[full[20:22]],
                                  include_stop_str_in_output=True),
                   SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[tokens[17]]),
                   SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True)):
        want, _, _ = _run(FakeRunner, [("a", prompt, params)], tokenizer=tok)
        got, engine, runner = _run(DraftingFakeRunner, [("a", prompt, params)], tokenizer=tok)
        w, g = want["a"].outputs[0], got["a"].outputs[0]
        assert (g.text, g.token_ids, g.finish_reason, g.stop_reason) == (w.text, w.token_ids, w.finish_reason,
                                                                         w.stop_reason)
        assert runner.num_accepted > 0
        assert engine.stats().request_success_total == {w.finish_reason: 1}
