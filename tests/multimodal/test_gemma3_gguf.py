"""Gemma 3 (vision) as llama.cpp and Ollama users have it on disk: a "gemma3" GGUF language model
and a llama.cpp mmproj GGUF (projector type "gemma3", written as convert_hf_to_gguf.py writes it)
built from a tiny random Gemma3ForConditionalGeneration: the same processor settings, the same
tower output and the same fp32 logits as transformers on the HF directory, with one and two
images (one shot and through chunked prefill), a served answer, and llama.cpp's greedy tokens
on the same two files."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gemma3_checkpoint import BOI, IMAGE, NL2, TOKENS_PER_IMAGE, gemma3_gguf_pair, write_gemma3_mmproj
from lite_llm.multimodal import Processor, gemma3, llava
from test_gemma3 import _hf_logits, _hf_pixels, _lite_logits
from vl_checkpoint import image
from vl_common import TEXT_IDS, check_another_image_moves_the_logits, image_prompt, small_runner

pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def files():
    return gemma3_gguf_pair()


@pytest.fixture(scope="module")
def hf_model(files):
    from transformers import Gemma3ForConditionalGeneration
    return Gemma3ForConditionalGeneration.from_pretrained(files[0], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runner(files):
    from lite_llm.model.loader import load_model
    _, lm, mm = files
    return small_runner(load_model(str(lm), dtype="float32", progress=False, mmproj=str(mm)))


def test_the_pair_reads_as_the_hf_directory(files):
    """Tower geometry, pooling, normalisation and the image token ids (from the GGUF vocabulary)
    equal the HF directory's; the mmproj holds clip.cpp's names; no media marker is added to a
    vocabulary that has <start_of_image>."""
    from lite_llm.model.loader import load_model
    hf, lm, mm = files
    assert llava.mmproj_projector(str(mm)) == "gemma3"
    ours = Processor.for_model(str(lm), str(mm))
    theirs = Processor.for_model(str(hf))
    assert ours.module is gemma3 and ours.placeholder == "<start_of_image>" and ours.placeholder_id == BOI
    assert ours.vision.eps == pytest.approx(theirs.vision.eps)      # stored as float32
    assert dataclasses.replace(ours.vision, eps=theirs.vision.eps) == theirs.vision
    loaded = load_model(str(lm), dtype="float32", progress=False, mmproj=str(mm))
    assert loaded.config.architecture == "Gemma3ForCausalLM"
    assert loaded.tokenizer.token_to_id(llava.MEDIA_MARKER) is None
    assert loaded.tokenizer.encode("\n\n", add_special_tokens=False) == [NL2]


def test_vision_tower_and_projector_match_transformers(files, hf_model, runner):
    img = image(100, 70, seed=1)
    with torch.no_grad():
        ref = hf_model.model.get_image_features(pixel_values=torch.from_numpy(_hf_pixels(files[0], [img]))
                                                ).pooler_output[0].numpy()
    ours = runner.vision.encoder.encode(gemma3.preprocess(img, runner.vision.vision))
    assert runner.vision.bidirectional and ours.shape == ref.shape == (TOKENS_PER_IMAGE, 64)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


def test_an_f16_projection_as_the_converter_writes_it_reads_back(files, runner, tmp_path):
    """convert_hf_to_gguf.py forces mm.input_projection to F16: read back, it is the F32 one
    rounded to fp16, transposed to [E, C]."""
    path = write_gemma3_mmproj(files[0], tmp_path / "mmproj-f16.gguf", projection_f16=True)
    _, t = gemma3.read_mmproj(str(path), str(files[1]))
    want = runner.vision.encoder.t["proj.w"]
    assert t["proj.w"].shape == want.shape
    np.testing.assert_array_equal(t["proj.w"], want.astype(np.float16).astype(np.float32))


def _prompt(files, images, text_ids=TEXT_IDS):
    return image_prompt(Processor.for_model(str(files[1]), str(files[2])), [BOI], images, text_ids)


@pytest.mark.parametrize("sizes", [[(100, 70)], [(56, 112), (84, 56)]], ids=["one-image", "two-images"])
@pytest.mark.parametrize("chunk", [None, 5])
def test_fp32_logits_match_transformers(files, hf_model, runner, sizes, chunk):
    images = [image(*s, seed=i + 3) for i, s in enumerate(sizes)]
    ids, mm = _prompt(files, images)
    assert ids.count(IMAGE) == TOKENS_PER_IMAGE * len(images) and len(ids) > 6 + TOKENS_PER_IMAGE
    ref = _hf_logits(hf_model, files[0], ids, images)
    np.testing.assert_allclose(_lite_logits(runner, ids, mm, chunk), ref, rtol=1e-4, atol=2e-4)


def test_a_different_image_gives_different_logits(files, runner):
    check_another_image_moves_the_logits(lambda images: _prompt(files, images), runner)


def test_bad_gemma3_mmproj_files_are_refused_naming_the_problem(files, tmp_path):
    from conftest import write_gguf
    bad = write_gguf(tmp_path / "no-proj.gguf", {"v.patch_embd.weight": (np.zeros((4, 3, 2, 2), np.float32), None)},
                     "clip", {"clip.projector_type": "gemma3", "clip.vision.image_size": 84,
                              "clip.vision.patch_size": 14})
    with pytest.raises(gemma3.Gemma3VisionError, match="tensor v.post_ln.weight is missing: not a Gemma 3"):
        gemma3.read_mmproj(str(bad), str(files[1]))
    with pytest.raises(llava.LlavaError, match="is not LLaVA-1.5's"):
        llava.read_mmproj(str(files[2]))
    with pytest.raises(gemma3.Gemma3VisionError, match="no <start_of_image>"):
        from llava_checkpoint import llava_checkpoint
        gemma3.gguf_image_token_ids(str(llava_checkpoint()[1]))


def test_the_openai_client_gets_an_answer_from_the_pair():
    openai = pytest.importorskip("openai")
    from test_llava_engine import _url, ask_about_image, vision_server
    _, lm, mm = gemma3_gguf_pair()
    with vision_server("tiny-gemma3-gguf", str(lm), mmproj=str(mm)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        url = _url(image(90, 60, seed=1))
        whole = ask_about_image(client, "tiny-gemma3-gguf", url)
        assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > TOKENS_PER_IMAGE + 4
        pieces = [c.choices[0].delta.content or "" for c in
                  ask_about_image(client, "tiny-gemma3-gguf", url, stream=True) if c.choices]
        assert "".join(pieces) == whole.choices[0].message.content


def _llama_cpp_greedy(lm, mm, img, text: bytes, num_tokens: int) -> tuple[list[list[int]], list[int]]:
    """(token ids of the text chunks around the image, greedy tokens) of llama.cpp's mtmd on the
    pair: the text split at its media marker, <start_of_image> / <end_of_image> around the
    image's rows (decoded non-causally), then num_tokens greedy steps."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    llm = llama_cpp.Llama(model_path=str(lm), n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 2, False
    ctx = mtmd.mtmd_init_from_file(str(mm).encode(), llm.model, params)
    assert ctx, "llama.cpp's mtmd cannot load the gemma3 mmproj"
    rgb = np.ascontiguousarray(np.asarray(img.convert("RGB"), np.uint8))
    bitmap = mtmd.mtmd_bitmap_init(img.size[0], img.size[1], rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        text = text.replace(b"<__media__>", mtmd.mtmd_default_marker())
        inp = mtmd.mtmd_input_text(text, len(text), True, True)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (ctypes.c_void_p * 1)(bitmap), 1) == 0
        texts = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(c) == 0:
                n = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                texts.append([toks[j] for j in range(n.value)])
            else:
                assert mtmd.mtmd_input_chunk_get_n_tokens(c) == TOKENS_PER_IMAGE
        n_past = ctypes.c_int(0)
        assert mtmd.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, 256, True, ctypes.byref(n_past)) == 0
        out = []
        for _ in range(num_tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            out.append(int(logits.argmax()))
            assert llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(out[-1]),
                                                                                 1)) == 0
        return texts, out
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(ctx)
        llm.close()


@pytest.mark.peers
def test_llama_cpp_on_the_same_pair_gives_the_same_greedy_tokens(files):
    """An image already the tower's 84 x 84 (llama.cpp's own resize differs from PIL's): llama.cpp
    puts the image between <start_of_image> and <end_of_image> where the text has "\\n\\n" around
    its marker, which is Gemma3Processor's expansion; the prompt ids and 8 greedy tokens agree."""
    pytest.importorskip("llama_cpp")
    from lite_llm import LLM, SamplingParams
    from gemma3_checkpoint import EOI
    _, lm, mm = files
    img = image(84, 84, seed=3)
    (before, after), theirs = _llama_cpp_greedy(lm, mm, img, b"hello the cat\n\n<__media__>\n\nwhat is it", 8)
    assert before[-2:] == [NL2, BOI] and after[:2] == [EOI, NL2]
    llm = LLM(str(lm), mmproj=str(mm), dtype="float32", block_size=16, max_num_batched_tokens=64,
              kv_cache_space=0.01, max_num_seqs=4)
    try:
        out = llm.generate({"prompt_token_ids": before[:-2] + [BOI] + after[2:], "multi_modal_data": {"image": img}},
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    finally:
        llm.shutdown()
    assert out.prompt_token_ids == before + [IMAGE] * TOKENS_PER_IMAGE + after
    assert len(set(theirs)) > 1 and out.outputs[0].token_ids == theirs
