"""Deterministic mode (`LLM(deterministic=True)`, `serve --deterministic`): a request's greedy
tokens, their logprobs and its prompt logprobs are the same bits whatever the engine batches
with it (alone, 7 or 64 sequences), however its prompt is chunked, and after the scheduler
preempts it or its neighbours and recomputes them. Without the mode a one-token step runs other
kernels than a batch (a streaming GEMV for bf16 weights, key splits in attention, staged
attention tiles), so these differ in the last bits and a near tie can flip a greedy token."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from lite_llm import SamplingParams
from lite_llm.engine.args import EngineArgs
from lite_llm.model.loader import default_model_path
from test_parity import engine_outputs


def run(path: str, prompts: list[list[int]], params: list[SamplingParams], **kwargs):
    """Every prompt through one deterministic engine, all added at once: (outputs, stats)."""
    return engine_outputs(EngineArgs(path, progress=False, deterministic=True, **kwargs), prompts, params)


def fingerprint(out):
    """The target's tokens, each step's top logprobs and its prompt logprobs, as exact floats."""
    c = out.outputs[0]
    steps = [[(t, lp[t].logprob) for t in lp] for lp in c.logprobs]
    prompt = [None if lp is None else [(t, lp[t].logprob) for t in lp] for lp in out.prompt_logprobs or []]
    return list(c.token_ids), steps, prompt


def check_invariant(path: str, prompt_len: int, gen: int, vocab: int, **kwargs):
    rng = np.random.default_rng(7)
    target = rng.integers(3, vocab, prompt_len).tolist()
    want_params = SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True, logprobs=3, prompt_logprobs=2)

    def others(n, max_len, max_gen=gen + 8):
        prompts = [rng.integers(3, vocab, int(rng.integers(1, max_len))).tolist() for _ in range(n)]
        params = [SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, max_gen)), ignore_eos=True)
                  for _ in range(n)]
        return prompts, params

    alone, _ = run(path, [target], [want_params], **kwargs)
    want = fingerprint(alone[0])
    assert len(want[0]) == gen and len(want[2]) == prompt_len
    cases = {}
    for n in (6, 63):                                   # batches of 7 and 64 sequences, target in the middle
        prompts, params = others(n, 60)
        k = n // 2
        outs, _ = run(path, prompts[:k] + [target] + prompts[k:], params[:k] + [want_params] + params[k:], **kwargs)
        cases[f"batch of {n + 1}"] = fingerprint(outs[k])
    for budget in (16, 37):                             # the prompt in chunks of other sizes, beside others
        prompts, params = others(5, 40)
        outs, _ = run(path, [target] + prompts, [want_params] + params,
                      **{**kwargs, "max_num_batched_tokens": budget})
        cases[f"chunks of {budget}"] = fingerprint(outs[0])
    # too few KV blocks for everyone: recompute preemption, the target added last (the newest)
    prompts, params = others(7, 60, max_gen=40)
    blocks = (prompt_len + gen) // 16 + 6
    outs, stats = run(path, prompts + [target], params + [want_params],
                      **{**kwargs, "block_size": 16, "num_kv_blocks": blocks,
                         "max_model_len": min(kwargs["max_model_len"], 16 * blocks)})
    assert stats.num_preempted_total > 0
    cases["preempted"] = fingerprint(outs[-1])
    for name, got in cases.items():
        assert got[0] == want[0], f"{name}: greedy tokens differ"
        assert got[1] == want[1], f"{name}: logprobs differ"
        assert got[2] == want[2], f"{name}: prompt logprobs differ"


@pytest.mark.parametrize("dtype,kv", [("bfloat16", "auto"), ("bfloat16", "int8"), ("float32", "auto")])
def test_tiny_llama_bits_do_not_depend_on_the_batch(dtype, kv):
    check_invariant(str(tiny_checkpoint_path("llama")), prompt_len=45, gen=20, vocab=320, dtype=dtype,
                    kv_cache_dtype=kv, max_model_len=128)


def test_quantized_weights_bits_do_not_depend_on_the_batch():
    check_invariant(str(tiny_checkpoint_path("llama")), prompt_len=45, gen=20, vocab=320, dtype="bfloat16",
                    quantization="q8_0", max_model_len=128)


def test_sliding_window_past_an_attention_span():
    """Mistral's window of 8 with prompts past 256 keys: a tile's first key falls anywhere, and
    the softmax's rescaling points (spans of 256 keys) must not follow it."""
    path = str(tiny_checkpoint_path("mistral", max_position_embeddings=1024))
    check_invariant(path, prompt_len=300, gen=12, vocab=320, dtype="bfloat16", kv_cache_dtype="int8",
                    max_model_len=512)


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_default_model_bits_do_not_depend_on_the_batch():
    try:
        path = default_model_path()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.fail(f"the default model is needed: {e}")
    check_invariant(path, prompt_len=40, gen=12, vocab=49152, max_model_len=256)


def test_short_convolutions_bits_do_not_depend_on_the_batch():
    """LFM2's conv layers carry a state across a prompt's chunks: each token's sum is over the
    same taps in the same order however the prompt is cut."""
    check_invariant(str(tiny_checkpoint_path("lfm2")), prompt_len=45, gen=20, vocab=320, dtype="bfloat16",
                    max_model_len=128)


def test_mamba2_layers_are_refused():
    with pytest.raises(ValueError, match="deterministic mode does not cover Mamba2"):
        run(str(tiny_checkpoint_path("bamba")), [[5, 6, 7]], [SamplingParams(max_tokens=1)], dtype="float32",
            max_model_len=64)


@pytest.mark.parametrize("arch,pooling", [("bert", "MEAN"), ("qwen3_base", "LAST")])
def test_embeddings_bits_do_not_depend_on_the_batch(arch, pooling):
    """Pooling models (an encoder, mean pooling; a decoder embedder, last token): an input's vector
    alone equals its vector among inputs of other lengths, bit for bit, one-token inputs too."""
    from lite_llm import LLM
    rng = np.random.default_rng(5)
    inputs = [{"prompt_token_ids": rng.integers(5, 300, n).tolist()} for n in (1, 17, 1, 60, 9, 33, 2)]
    path = str(tiny_checkpoint_path(arch, **({"head_dim": 16} if arch == "qwen3_base" else {})))
    with LLM(path, runner="pooling", dtype="bfloat16", deterministic=True,
             pooler_config={"pooling_type": pooling, "normalize": False}) as llm:
        alone = [llm.embed([x], use_tqdm=False)[0].outputs.embedding for x in inputs]
        together = [o.outputs.embedding for o in llm.embed(inputs, use_tqdm=False)]
    for a, b in zip(alone, together):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
