"""A step's images: those of several requests scheduled together are encoded in that one step,
back to back before its forward call, and their encoder tokens count in the step's token budget
(vLLM's encoder budget) so a step does not both encode many images and prefill a full chunk."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm import LLM, SamplingParams
from lite_llm.multimodal import MMItem, MMPrompt, encoder_cut
from vl_checkpoint import PLACEHOLDER, image, qwen2_5_vl_checkpoint

pytest.importorskip("PIL")
PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=1)


def _prompt() -> str:
    return "<|im_start|>user\nLook: " + PLACEHOLDER + " what is it?<|im_end|>\n<|im_start|>assistant\n"


class _R:   # a request with two images: tokens [10, 30) and [40, 50)
    mm = MMPrompt((MMItem(10, 20, b"a", np.zeros((1, 1), np.float32), (1, 2, 2)),
                   MMItem(40, 10, b"b", np.zeros((1, 1), np.float32), (1, 2, 2))), None)


def test_encoder_cut_counts_images_not_cached_nor_encoded_this_step():
    # room for both images' tokens and encodings: 60 chunk tokens + 30 encoder tokens
    assert encoder_cut(_R, 0, 60, 90, None, set()) == (60, 30, [b"a", b"b"])
    # cached images cost nothing; one this step encodes already neither
    assert encoder_cut(_R, 0, 60, 60, {b"a": None, b"b": None}, set()) == (60, 0, [])
    assert encoder_cut(_R, 0, 60, 70, {b"a": None}, {b"x"}) == (60, 10, [b"b"])
    # the second image does not fit beside the first: the chunk ends before it
    assert encoder_cut(_R, 0, 60, 70, None, set()) == (40, 20, [b"a"])
    # a step that already encodes an image: the first one here does not fit, the request waits
    assert encoder_cut(_R, 10, 50, 30, None, {b"x"}) == (0, 0, [])
    # the first image of a step always fits (else an image over half the budget never runs),
    # and the text after it is what room leaves
    assert encoder_cut(_R, 10, 25, 25, None, set()) == (20, 20, [b"a"])
    # a chunk resuming inside an image (a prefix hit) encodes it whatever the room
    assert encoder_cut(_R, 15, 20, 5, None, {b"x"}) == (15, 20, [b"a"])


@pytest.fixture(scope="module")
def llm():
    engine = LLM(str(qwen2_5_vl_checkpoint()), dtype="float32", block_size=16, max_num_batched_tokens=128,
                 kv_cache_space=0.01, max_num_seqs=4, enable_prefix_caching=False)
    yield engine
    engine.shutdown()


def _record_steps(llm, monkeypatch):
    """Per step: (tokens scheduled, encoder tokens, images it encoded)."""
    eng = llm.llm_engine
    vision, sched = eng.runner.vision, eng.scheduler
    steps, step_inputs, schedule, scheduled = [], vision.step_inputs, sched.schedule, []

    def scheduling():
        scheduled.append(schedule())
        return scheduled[-1]

    def recording(chunks, num_tokens, positions):
        out = step_inputs(chunks, num_tokens, positions)
        assert scheduled[-1].num_tokens == num_tokens
        steps.append((num_tokens, scheduled[-1].encoder_tokens, vision.step_encoded))
        return out
    monkeypatch.setattr(sched, "schedule", scheduling)
    monkeypatch.setattr(vision, "step_inputs", recording)
    vision.cache.clear()
    vision.cached_rows = 0
    return steps


def _logprobs(out):
    o = out.outputs[0]
    return o.token_ids, np.array([lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)])


def test_two_requests_images_are_encoded_in_one_step_with_the_logits_of_each_alone(llm, monkeypatch):
    a, b = image(84, 84, seed=31), image(112, 84, seed=32)
    steps = _record_steps(llm, monkeypatch)
    both = llm.generate([{"prompt": _prompt(), "multi_modal_data": {"image": a}},
                         {"prompt": _prompt(), "multi_modal_data": {"image": b}}], PARAMS)
    assert steps[0][2] == 2 and sum(s[2] for s in steps) == 2      # both images, in the first step
    assert steps[0][1] == 9 + 12 and steps[0][0] == sum(len(o.prompt_token_ids) for o in both)
    monkeypatch.undo()
    for img, together in zip((a, b), both):
        alone = llm.generate({"prompt": _prompt(), "multi_modal_data": {"image": img}}, PARAMS)[0]
        ids_t, lp_t = _logprobs(together)
        ids_a, lp_a = _logprobs(alone)
        assert ids_t == ids_a
        np.testing.assert_allclose(lp_t, lp_a, rtol=1e-4, atol=1e-4)


def test_a_steps_encoder_tokens_stay_within_its_budget(monkeypatch):
    # 100 tokens a step; each prompt is 37 text tokens around an 84x84 image's 9: two whole prompts
    # fit a step's tokens (92), not with their encodings (110); the third waits
    small = LLM(str(qwen2_5_vl_checkpoint()), dtype="float32", block_size=16, max_num_batched_tokens=100,
                kv_cache_space=0.01, max_num_seqs=4, enable_prefix_caching=False)
    try:
        steps = _record_steps(small, monkeypatch)
        outs = small.generate([{"prompt": _prompt(), "multi_modal_data": {"image": image(84, 84, seed=k)}}
                               for k in range(3)], PARAMS)
        assert [len(o.prompt_token_ids) for o in outs] == [46] * 3
        assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
        assert sum(s[2] for s in steps) == 3
        for num_tokens, enc, images in steps:
            assert num_tokens + 9 * images <= 100 or images == 1
            assert enc == 9 * images
        # the first step: prompt 0 and its image (46 + 9), prompt 1 through its image with its
        # text cut to what is left (36 + 9): 100, where without encodings counted it would take 100 tokens
        assert steps[0] == (82, 18, 2)
    finally:
        small.shutdown()


def test_an_assembled_engine_schedules_with_the_runners_encoder_cache(llm):
    """The runner is built on the engine thread, after the engine: the scheduler must still get
    its encoder cache, so an image the runner holds costs a request no encoder budget."""
    eng = llm.llm_engine
    assert eng.runner.vision is not None
    assert eng.scheduler.encoder_cache is eng.runner.vision.cache
