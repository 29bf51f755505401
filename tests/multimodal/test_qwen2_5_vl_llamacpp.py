"""Qwen2.5-VL against llama.cpp on the same weights: a tiny random checkpoint (windows of 112
pixels, clip.cpp's fixed window) written by bench.qwen2_5_vl_gguf as an F32 "qwen2vl" GGUF +
"qwen2.5vl_merger" mmproj pair, run by llama-cpp-python's mtmd. The image rows llama.cpp's clip
computes and the logits of the text after the image agree with lite-llm's (and so with
transformers', which test_qwen2_5_vl checks lite-llm against). Images have sides that are
multiples of 28 px within the pixel limits, so neither side resizes: llama.cpp's resize is its
own (bilinear on uint8), not the HF processor's. Attention runs without llama.cpp's flash
attention (F16 K/V). clip.cpp still rounds to F16 on the way: the patch embedding's im2col and
the merger's GELU (ggml's F16 lookup table of the tanh form, where Qwen2.5-VL's is exact): the
rows agree within 1e-3 of their largest value (measured 5-7e-4; ours and the NumPy reference:
1e-6). Attending to the whole image in every block instead of windows moves them by 6e-2."""
from __future__ import annotations

import numpy as np
import pytest

from vl_checkpoint import IMAGE_PAD, SPECIAL, image, qwen2_5_vl_checkpoint

pytest.importorskip("PIL")
pytest.importorskip("llama_cpp.mtmd_cpp")

# 168 x 112: 12 x 8 patches, 6 x 4 merged rows in two 112-px windows side by side; 112 x 224:
# two windows one above the other; 84 x 84: one window, smaller than a window (not 56 x 56:
# clip.cpp's least image for qwen2.5vl_merger is 8 rows, 6272 px, HF's 4: it enlarges that one)
SIZES = [(168, 112), (112, 224), (84, 84)]


@pytest.fixture(scope="module")
def ckpt():
    return qwen2_5_vl_checkpoint(window_size=112)


@pytest.fixture(scope="module")
def peer(ckpt):
    from lite_llm.bench.qwen2_5_vl_gguf import write_pair
    from lite_llm.bench.vision import LlamaCppQwenVL
    lm, mm = write_pair(str(ckpt), str(ckpt / "gguf"), kind="f32", specials=dict(enumerate(SPECIAL)))
    p = LlamaCppQwenVL(lm, mm, threads=2, n_ctx=512, flash_attn=False, warmup=False)
    yield p
    p.close()


@pytest.fixture(scope="module")
def runner(ckpt):
    from lite_llm.model.loader import load_model
    from vl_common import small_runner
    return small_runner(load_model(str(ckpt), dtype="float32", progress=False))


@pytest.mark.parametrize("size", SIZES)
def test_llamacpp_image_rows_match_ours(ckpt, peer, runner, size):
    from lite_llm.multimodal import Processor, qwen2_5_vl
    img = image(*size, seed=sum(size))
    pixels, grid = qwen2_5_vl.preprocess(img, Processor.for_model(str(ckpt)).vision)
    assert grid[1:] == (size[1] // 14, size[0] // 14)          # no resize on our side either
    ours = runner.vision.encoder.encode(pixels, grid)
    _, theirs = peer.encode(img)
    assert theirs.shape == ours.shape == (grid[1] * grid[2] // 4, 64)
    tol = 1e-3 * np.abs(ours).max()
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=tol)
    if size[0] > 112 or size[1] > 112:      # several windows: the comparison sees them
        import dataclasses
        enc = runner.vision.encoder
        whole = dataclasses.replace(enc.cfg, fullatt_block_indexes=list(range(len(enc.blocks))))
        enc.cfg, cfg = whole, enc.cfg
        try:
            assert np.abs(theirs - enc.encode_reference(pixels, grid)).max() > 10 * tol
        finally:
            enc.cfg = cfg


@pytest.mark.parametrize("size", SIZES[:2])
def test_llamacpp_logits_after_the_image_match_ours(ckpt, peer, runner, size):
    """Text, the image, text: the logits of every position from <|vision_end|> on (multimodal
    RoPE positions continue past the image's largest grid side) agree with lite-llm's, within
    1e-3 of their largest value (the image rows' F16 roundings carried through)."""
    from test_qwen2_5_vl import _prompt
    from vl_common import prefill_logits
    img = image(*size, seed=sum(size) + 1)
    ids, mm = _prompt(ckpt, [img])
    first, n = ids.index(IMAGE_PAD), ids.count(IMAGE_PAD)
    ours = prefill_logits(runner, ids, mm)[first + n:]
    theirs, _ = peer.prefill(ids[:first], img, ids[first + n:], all_logits=True)
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-3 * np.abs(ours).max())
    # a different image: llama.cpp's logits move with it (the comparison is not of text alone)
    other, _ = peer.prefill(ids[:first], image(*size, seed=99), ids[first + n:], all_logits=True)
    assert np.abs(other - theirs).max() > 10 * 1e-3 * np.abs(ours).max()


def test_the_writer_refuses_what_clip_cpp_cannot_run(tmp_path):
    from lite_llm.bench.qwen2_5_vl_gguf import n_wa_pattern, write_mmproj
    assert n_wa_pattern([7, 15, 23, 31]) == 8 and n_wa_pattern([1, 3]) == 2
    with pytest.raises(ValueError, match="not every 3-th block"):
        n_wa_pattern([2, 4])
    with pytest.raises(ValueError, match="window_size 56"):
        write_mmproj(str(qwen2_5_vl_checkpoint()), str(tmp_path / "mm.gguf"))


def test_a_bf16_pair_runs_the_same_model(ckpt, runner):
    """The benchmark's BF16 pair (matrices rounded to bf16, round to nearest even): llama.cpp's
    image rows agree with ours within bf16's precision, so its bits are laid out as GGUF's BF16."""
    from lite_llm.bench.qwen2_5_vl_gguf import write_pair
    from lite_llm.bench.vision import LlamaCppQwenVL
    from lite_llm.multimodal import Processor, qwen2_5_vl
    lm, mm = write_pair(str(ckpt), str(ckpt / "gguf"), kind="bf16", specials=dict(enumerate(SPECIAL)))
    peer = LlamaCppQwenVL(lm, mm, threads=2, n_ctx=512, flash_attn=False, warmup=False)
    try:
        img = image(168, 112, seed=5)
        ours = runner.vision.encoder.encode(*qwen2_5_vl.preprocess(img, Processor.for_model(str(ckpt)).vision))
        _, theirs = peer.encode(img)
    finally:
        peer.close()
    err = np.abs(theirs - ours).max() / np.abs(ours).max()
    assert 1e-4 < err < 3e-2      # bf16's rounding shows, and nothing worse


def test_bench_vision_runs_llama_cpp_beside_us(capsys, tmp_path):
    """`lite-llm bench vision --peers llama.cpp` on the tiny shape: the pair is written, both
    engines run in their own processes and the table has llama.cpp's encode, TTFT and decode."""
    from lite_llm import cli
    assert cli.main(["bench", "vision", "--shape", "tiny", "--peers", "llama.cpp", "--image", "112",
                     "--repeats", "1", "--decode-tokens", "3", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp on the BF16 GGUF + mmproj pair" in out and "16 image tokens" in out
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()[2:]}
    assert set(rows) == {"encode (s)", "TTFT (s)", "decode (s/tok)"}
    assert all(len(r) == 5 for r in rows.values())      # a two-word name, lite-llm, llama.cpp, ratio
    assert (tmp_path / "qwen2_5_vl-tiny-random-gguf" / "mmproj-bf16.gguf").exists()
