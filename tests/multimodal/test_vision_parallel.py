"""Images under data parallel and tensor parallel: `-dp 2` replicas serve a vision model over
HTTP (the front end preprocesses the image and sends it whole to the replica it routes to; the
router keys on the image's hash as the replicas' prefix cache does), with the answers of one
engine; under tensor parallel (`-tp 2`) rank 0 encodes the images and each step's image rows
travel to the other rank with the step: two ranks give one rank's logits and greedy tokens."""
from __future__ import annotations

import os

import numpy as np
import pytest
from gemma3_checkpoint import BOI, TOKENS_PER_IMAGE, gemma3_checkpoint, gemma3_gguf_pair
from test_llava_engine import _url, ask_about_image
from vl_checkpoint import image

from lite_llm import LLM, SamplingParams
from lite_llm.engine.args import EngineArgs

openai = pytest.importorskip("openai")
pytest.importorskip("PIL")


def _content(url: str) -> list[dict]:
    return [{"type": "text", "text": "What is in "}, {"type": "image_url", "image_url": {"url": url}}]


def test_two_replicas_answer_images_as_one_engine(monkeypatch):
    """A Gemma 3 GGUF + mmproj pair under -dp 2: the openai client's image chats (streaming and
    not, two different images) get one engine's greedy answers; the same image again goes to
    the replica that cached it and hits its prefix cache past the image's rows."""
    from lite_llm.engine.data_parallel import build_data_parallel_engine
    from lite_llm.server.app import create_server
    _, lm, mm = gemma3_gguf_pair()
    urls = [_url(image(90, 60, seed=1)), _url(image(70, 100, seed=2))]
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    with LLM(str(lm), mmproj=str(mm), dtype="float32", block_size=16, kv_cache_space=0.01) as llm:
        want = [llm.chat([{"role": "user", "content": _content(u)}], greedy)[0].outputs[0].text for u in urls]
    assert want[0] != want[1]
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "nobind")
    engine, tokenizer, info = build_data_parallel_engine(
        EngineArgs(str(lm), mmproj=str(mm), dtype="float32", block_size=16, max_num_batched_tokens=64,
                   kv_cache_space=0.01, max_num_seqs=4), 2)
    assert info["mmproj"] == str(mm) and len(info["replicas"]) == 2
    server = create_server(engine, tokenizer, "tiny-gemma3", info["max_model_len"], kernel_info=info,
                           model_root=info["model_path"], vocab_size=info["vocab_size"])
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        first = ask_about_image(client, "tiny-gemma3", urls[0])
        assert first.choices[0].message.content == want[0]
        before = [st.prefix_cache_hits for st in engine.replica_stats()]
        # at once (the engine reuses freed blocks first: a cached block lasts until the next allocation)
        again = ask_about_image(client, "tiny-gemma3", urls[0])
        assert again.choices[0].message.content == want[0]
        hits = [st.prefix_cache_hits - b for st, b in zip(engine.replica_stats(), before)]
        assert min(hits) == 0           # one replica served it: the one that held its blocks
        with LLM(str(lm), mmproj=str(mm), dtype="float32", block_size=16, kv_cache_space=0.01) as llm:
            ids = llm.chat([{"role": "user", "content": _content(urls[0])}], greedy)[0].prompt_token_ids
            first_image_token = ids.index(BOI) + 1
        # every full block of the prompt, past the image's rows
        assert max(hits) >= 16 * ((again.usage.prompt_tokens - 1) // 16) > first_image_token + TOKENS_PER_IMAGE
        other = ask_about_image(client, "tiny-gemma3", urls[1])
        assert other.choices[0].message.content == want[1]
        pieces = [c.choices[0].delta.content or "" for c in ask_about_image(client, "tiny-gemma3", urls[1],
                                                                            stream=True) if c.choices]
        assert "".join(pieces) == want[1]
    finally:
        server.drain(5.0)


def test_the_router_keys_blocks_on_the_images_they_hold():
    """Two prompts with the same token ids and different images share no block hash past the
    image's first block; the same image gives the same hashes."""
    from lite_llm.engine.data_parallel import PrefixRouter
    from lite_llm.multimodal import MediaConfig, Processor
    ckpt = gemma3_checkpoint()
    proc = Processor.for_model(str(ckpt))
    prompt = [40] * 20 + [BOI] + [41] * 20
    ids_a, mm_a = proc.process(prompt, [image(90, 60, seed=1)], MediaConfig())
    ids_b, mm_b = proc.process(prompt, [image(90, 60, seed=2)], MediaConfig())
    _, mm_a2 = proc.process(prompt, [image(90, 60, seed=1)], MediaConfig())
    router = PrefixRouter(2, 16)
    a, b, a2 = router.block_hashes(ids_a, mm_a), router.block_hashes(ids_b, mm_b), router.block_hashes(ids_a, mm_a2)
    assert ids_a == ids_b and a == a2 and len(a) == len(b) >= 2
    image_block = mm_a.items[0].offset // 16
    assert a[:image_block] == b[:image_block] and all(x != y for x, y in zip(a[image_block:], b[image_block:]))
    assert router.block_hashes(ids_a) != a      # the text-only hashes would not tell them apart


_TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                               reason="tensor parallel tests bind rank 0 to CPU 0 and rank 1 to CPU 1")


@_TWO_CPUS
def test_tensor_parallel_qwen2_5_vl_logits_equal_one_rank():
    """A prompt with two images of different sizes (multimodal RoPE, image rows in place of the
    placeholders): fp32 logits of every position through two ranks equal one rank's up to
    summation order, in one step and through 7-token chunks."""
    from model.test_tensor_parallel import tp_runner
    from test_qwen2_5_vl import _prompt
    from vl_common import prefill_logits, small_runner
    from vl_checkpoint import qwen2_5_vl_checkpoint

    from lite_llm.model.loader import load_model
    ckpt = qwen2_5_vl_checkpoint()
    one = small_runner(load_model(str(ckpt), dtype="float32", progress=False))
    two, group = tp_runner(ckpt)
    try:
        assert two.vision is not None and group.layout.images
        ids, mm = _prompt(ckpt, [image(56, 112, seed=3), image(84, 56, seed=4)])
        for chunk in (None, 7):
            a, b = prefill_logits(one, ids, mm, chunk), prefill_logits(two, ids, mm, chunk)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    finally:
        group.close()


@_TWO_CPUS
@pytest.mark.parametrize("given", ["gguf+mmproj", "hf"])
def test_tensor_parallel_llava_logits_equal_one_rank(given):
    """LLaVA (CLIP tower + projector on rank 0, plain 1-D positions) given as a GGUF + mmproj
    pair and as an HF directory: a prompt with two images of different sizes, fp32 logits of
    every position through two ranks equal one rank's up to summation order, in one step and
    through 5-token chunks (an image's 9 rows never split); a different image changes them."""
    from llava_checkpoint import llava_checkpoint
    from model.test_tensor_parallel import tp_runner
    from test_llava import _prompt
    from vl_common import prefill_logits, small_runner

    from lite_llm.model.loader import load_model
    hf, lm, mm = llava_checkpoint()
    model, mmproj = (lm, str(mm)) if given == "gguf+mmproj" else (hf, None)
    one = small_runner(load_model(str(model), dtype="float32", progress=False, mmproj=mmproj))
    two, group = tp_runner(model, mmproj=mmproj)
    try:
        assert two.vision is not None and group.layout.images
        ids, mm_inputs = _prompt(str(model), mmproj, [image(100, 70, seed=3), image(56, 112, seed=4)])
        assert len(mm_inputs.items) == 2
        for chunk in (None, 5):
            a, b = prefill_logits(one, ids, mm_inputs, chunk), prefill_logits(two, ids, mm_inputs, chunk)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
        other_ids, other = _prompt(str(model), mmproj, [image(100, 70, seed=5), image(56, 112, seed=4)])
        assert other_ids == ids
        assert np.abs(prefill_logits(two, ids, other)[-1] - b[-1]).max() > 1e-3
    finally:
        group.close()


@_TWO_CPUS
def test_tensor_parallel_gemma3_image_chat_as_one_rank(monkeypatch):
    """Gemma 3 (image tokens attend to each other both ways: their attention positions travel
    too) under -tp 2: the greedy answer and its logprobs of one rank, the image's tokens in a
    chunk of their own (16-token steps)."""
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    messages = [{"role": "user", "content": _content(_url(image(90, 60, seed=5)))}]

    def answer(**kw):
        with LLM(str(gemma3_checkpoint()), dtype="float32", block_size=16, max_num_batched_tokens=16,
                 kv_cache_space=0.01, **kw) as llm:
            o = llm.chat(messages, greedy)[0].outputs[0]
            return o.token_ids, np.array([lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)])
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0-1")
    want_ids, want_lp = answer()
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0|1")
    ids, lp = answer(tensor_parallel_size=2)
    assert ids == want_ids
    np.testing.assert_allclose(lp, want_lp, rtol=1e-4, atol=1e-4)
