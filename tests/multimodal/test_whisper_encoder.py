"""Whisper's encoder against transformers' WhisperEncoder on tiny random checkpoints: the NumPy
reference and the compiled forward (fp32 within 1e-4, bf16 weights within bf16's error), several
windows in one call, a pass run in slices of layers (the bits of one call), and the output cache
by content hash."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lite_llm import _kernels
from lite_llm.multimodal import audio
from lite_llm.multimodal.whisper import WhisperEncoder, WhisperError, features_hash
from whisper_checkpoint import SHAPES, whisper_checkpoint

VARIANTS = _kernels.available()
RATE = audio.SAMPLE_RATE


def _features(n_mels: int, seed: int) -> np.ndarray:
    """Log-mel features [n_mels, 3000] of 30 s of noise under a chirp."""
    rng = np.random.default_rng(seed)
    t = np.arange(9 * RATE) / RATE
    x = 0.3 * np.sin(2 * np.pi * (200 * t + 300 * t * t)) + 0.05 * rng.standard_normal(t.shape)
    return audio.log_mel_reference(x.astype(np.float32), n_mels)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request):
    """(path, transformers' encoder, its output of two windows [2, 1500, C], the features [2, M, 3000])."""
    from transformers import WhisperForConditionalGeneration
    path = whisper_checkpoint(request.param)
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    M = SHAPES[request.param]["num_mel_bins"]
    feats = np.stack([_features(M, 0), _features(M, 1)])
    with torch.no_grad():
        theirs = model.model.encoder(torch.from_numpy(feats)).last_hidden_state.numpy()
    return path, feats, theirs


def test_reference_matches_transformers(checkpoint):
    path, feats, theirs = checkpoint
    enc = WhisperEncoder.from_pretrained(str(path), kernels=None)
    np.testing.assert_allclose(enc.encode(feats[0]), theirs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_fp32_matches_transformers(checkpoint, variant):
    path, feats, theirs = checkpoint
    enc = WhisperEncoder.from_pretrained(str(path), kernels=_kernels.load(variant), num_threads=3)
    got = enc.encode_many(list(feats))            # both windows in one call: attention within each
    assert len(got) == 2 and got[0].shape == theirs[0].shape
    for g, t in zip(got, theirs):
        np.testing.assert_allclose(g, t, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(enc.encode(feats[1]), theirs[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_bf16_is_close(checkpoint, variant):
    path, feats, theirs = checkpoint
    enc = WhisperEncoder.from_pretrained(str(path), kernels=_kernels.load(variant), dtype="bfloat16", num_threads=2)
    got = enc.encode(feats[0])
    # bf16 weights and K/V: 8 bits of mantissa through 2 blocks of LayerNorm'd rows
    err = np.abs(got - theirs[0]).max()
    assert err < 0.1, err
    assert np.abs(got - theirs[0]).mean() < 0.01


def test_features_then_encoder_from_samples():
    """samples -> compiled features -> encoder, against the extractor and transformers."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    path = whisper_checkpoint("tiny80")
    enc = WhisperEncoder.from_pretrained(str(path), num_threads=2)
    x = (0.2 * np.sin(2 * np.pi * 300 * np.arange(5 * RATE) / RATE)).astype(np.float32)
    feats = enc.features(x)
    fe = WhisperFeatureExtractor(feature_size=80)
    np.testing.assert_allclose(feats, fe._np_extract_fbank_features(audio.pad_or_trim(x)[None], "cpu")[0], atol=1e-4)
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model.model.encoder(torch.from_numpy(feats[None])).last_hidden_state.numpy()[0]
    np.testing.assert_allclose(enc.encode(feats), theirs, atol=1e-4, rtol=1e-4)


def test_cache_encodes_a_window_once():
    path = whisper_checkpoint("tiny80")
    enc = WhisperEncoder.from_pretrained(str(path), num_threads=2, max_cached_rows=2 * 1500)
    a, b, c = _features(80, 0), _features(80, 1), _features(80, 2)
    first = enc.encode_cached(a)
    assert enc.encode_cached(a.copy()) is first and enc.num_encoded == 1
    assert features_hash(a) != features_hash(b)
    enc.encode_cached(b)
    enc.encode_cached(c)                          # the cache holds 2 windows: a, the oldest, goes
    assert enc.num_encoded == 3 and enc.cached_rows == 2 * 1500
    enc.encode_cached(a)
    assert enc.num_encoded == 4


def test_two_passes_of_one_window_are_kept_once():
    """Two requests encoding the same window at once (start_pass, then keep): the cache holds it
    once and both get its first rows."""
    enc = WhisperEncoder.from_pretrained(str(whisper_checkpoint("tiny80")), num_threads=1)
    a = _features(80, 0)
    key, hit = enc.cached(a)
    assert hit is None
    passes = [enc.start_pass(a, 2) for _ in range(2)]
    first, second = (enc.keep(key, p.run()) for p in passes)
    assert second is first and enc.cached_rows == 1500 and len(enc.cache) == 1
    assert enc.cached(a.copy())[1] is first


def test_wrong_features_are_refused():
    enc = WhisperEncoder.from_pretrained(str(whisper_checkpoint("tiny80")), num_threads=1)
    for bad in (np.zeros((128, 3000), np.float32), np.zeros((80, 3001), np.float32),
                np.zeros((80, 3002), np.float32)):
        with pytest.raises(WhisperError, match="expected"):
            enc.encode(bad)


@pytest.mark.parametrize("dtype,quantization", [("float32", None), ("bfloat16", None), ("float32", "q8_0")])
def test_a_pass_in_slices_gives_the_bits_of_one_call(dtype, quantization):
    """start_pass runs the encoder a layer (or two) a call, the residual rows kept between calls:
    the rows are encode()'s, bit for bit, and a pass of n layers a slice takes ceil(depth / n)
    calls of whisper_encoder_layers."""
    path = whisper_checkpoint("tiny80")
    enc = WhisperEncoder.from_pretrained(str(path), dtype=dtype, quantization=quantization, num_threads=2)
    assert enc.cfg.num_layers == 2
    for seed in (0, 1):
        feats = _features(80, seed)
        whole = enc.encode(feats)
        for per, calls in ((1, 2), (2, 1), (5, 1)):
            p = enc.start_pass(feats, per)
            outs = [p.run() for _ in range(calls)]
            assert all(o is None for o in outs[:-1]) and outs[-1] is p.rows
            assert p.rows.dtype == np.float32 and np.array_equal(p.rows, whole), (seed, per)
            with pytest.raises(WhisperError, match="all its slices"):
                p.run()
    # the NumPy reference: one slice
    ref = WhisperEncoder.from_pretrained(str(path), kernels=None)
    p = ref.start_pass(_features(80, 0))
    assert np.array_equal(p.run(), ref.encode(_features(80, 0)))
    # a shorter window (fewer frames) too
    short = _features(80, 2)[:, :1000]
    p = enc.start_pass(short)
    while p.run() is None:
        pass
    assert np.array_equal(p.rows, enc.encode(short))


def test_the_slice_kernel_refuses_a_bad_layer_range():
    enc = WhisperEncoder.from_pretrained(str(whisper_checkpoint("tiny80")), num_threads=1)
    feats = _features(80, 0)[None]
    x, out = np.empty((1500, 64), np.float32), np.empty((1500, 64), np.float32)
    for first, last in ((1, 1), (-1, 1), (0, 3), (2, 1)):
        with pytest.raises(ValueError, match="layers"):
            enc.kernels.whisper_encoder_layers(enc.model, feats, x, out, first, last, 1)
    with pytest.raises(ValueError, match="must be"):
        enc.kernels.whisper_encoder_layers(enc.model, feats, np.empty((1000, 64), np.float32), out, 0, 1, 1)
