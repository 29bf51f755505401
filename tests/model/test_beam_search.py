"""Beam search (LLM.beam_search) against transformers' generate(num_beams=k) on tiny random
checkpoints in fp32: the same token ids in the same order, with and without a length penalty,
with an EOS the beams reach at different lengths and with none reachable (ignore_eos)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from beam_ref import eos_checkpoint, hf_beams
from conftest import tiny_checkpoint_path
from lite_llm import LLM
from lite_llm.sampling_params import BeamSearchParams

K, MAX_NEW = 4, 10


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request):
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 300, n).tolist() for n in (3, 9, 21)]
    path, ref, eos = eos_checkpoint(request.param, prompts, K, MAX_NEW)
    with LLM(str(path), dtype="float32", block_size=16, kv_cache_space=0.02) as llm:
        yield llm, ref, prompts, eos


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0, -0.5])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_beams_match_transformers(models, length_penalty, ignore_eos):
    llm, ref, prompts, eos = models
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=K, max_tokens=MAX_NEW, ignore_eos=ignore_eos,
                                            length_penalty=length_penalty))
    lengths = set()
    for p, out in zip(prompts, outs):
        want = hf_beams(ref, p, K, MAX_NEW, None if ignore_eos else eos, length_penalty)
        got = [s.generated for s in out.sequences]
        assert got == [ids for ids, _ in want]
        np.testing.assert_allclose([s.score for s in out.sequences], [sc for _, sc in want], rtol=1e-4, atol=1e-4)
        for s in out.sequences:
            assert s.tokens[:len(p)] == p
            assert s.finish_reason == ("stop" if s.generated[-1] == eos and not ignore_eos else "length")
            lengths.add(len(s.generated))
    if not ignore_eos and length_penalty <= 1.0:   # (2.0 favours the long beams: all run to the end)
        assert len(lengths) > 1          # the EOS ended beams at different lengths
    elif ignore_eos:
        assert lengths == {MAX_NEW}


def test_beam_width_one_is_greedy(models):
    llm, ref, prompts, eos = models
    from lite_llm import SamplingParams
    greedy = llm.generate([{"prompt_token_ids": p} for p in prompts],
                          SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    beams = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                            BeamSearchParams(beam_width=1, max_tokens=MAX_NEW, ignore_eos=True))
    assert [b.sequences[0].generated for b in beams] == [g.outputs[0].token_ids for g in greedy]


def test_bad_params_are_value_errors():
    for kw in ({"beam_width": 0}, {"beam_width": 129}, {"max_tokens": 0}, {"early_stopping": "sometimes"}):
        with pytest.raises(ValueError):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **kw})


def test_beams_run_with_the_lora_adapter(tmp_path):
    """A LoRARequest reaches every beam: width 1 is the adapter's greedy output, not the base's."""
    from conftest import make_peft_adapter
    from lite_llm import LoRARequest, SamplingParams
    base = tiny_checkpoint_path("llama")
    adapter = LoRARequest("a1", 1, str(make_peft_adapter(base, tmp_path / "a1", 8, 16,
                                                         ["q_proj", "v_proj", "up_proj", "down_proj"], seed=1)))
    prompts = [{"prompt_token_ids": [5, 17, 33, 101, 7]}, {"prompt_token_ids": list(range(40, 60))}]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    width1 = BeamSearchParams(beam_width=1, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(str(base), dtype="float32", enable_lora=True, max_loras=1, max_lora_rank=8, block_size=16,
             kv_cache_space=0.02) as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, lora_request=adapter)]
        base_out = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        got = [b.sequences[0].generated for b in llm.beam_search(prompts, width1, lora_request=adapter)]
        with pytest.raises(ValueError):
            llm.beam_search([{"prompt": "x", "multi_modal_data": {"image": object()}}], width1)
    assert want != base_out        # the adapter changes the output
    assert got == want
