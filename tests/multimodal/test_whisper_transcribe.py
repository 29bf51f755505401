"""Whisper transcription against transformers' WhisperForConditionalGeneration.generate on a tiny
random multilingual Whisper (its text is gibberish, the same gibberish): the prompt, language
detection, suppressions, timestamp rules, long audio with timestamp-driven seeking; and the
fallback's measures."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_llm.multimodal import audio
from lite_llm.multimodal.transcribe import (TranscribeOptions, TranscriptionError, WhisperModel, compression_ratio,
                                            language_code, log_mel_long, top_k)
from whisper_checkpoint import whisper_asr_checkpoint

RATE = audio.SAMPLE_RATE


def speechy(seconds: float, seed: int = 0) -> np.ndarray:
    """Bursts of chirps and noise with pauses: a signal whose windows differ."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * (180 + 90 * np.sin(2 * np.pi * 0.3 * t)) * t) * (np.sin(2 * np.pi * 0.5 * t) > -0.2)
    return (x + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.fixture(scope="module")
def both():
    from transformers import WhisperForConditionalGeneration
    path = whisper_asr_checkpoint()
    theirs = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    return WhisperModel.from_pretrained(str(path), num_threads=2), theirs


def _hf_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    from transformers import WhisperFeatureExtractor
    fe = WhisperFeatureExtractor(feature_size=80)
    if x.shape[0] <= audio.N_SAMPLES:
        return fe(x, sampling_rate=RATE, return_tensors="np").input_features, None
    f = fe(x, sampling_rate=RATE, truncation=False, padding="longest", return_attention_mask=True, return_tensors="np")
    return f.input_features, f.attention_mask


def _hf_segments(model, x, **kw):
    feats, mask = _hf_features(x)
    with torch.no_grad():
        out = model.generate(torch.from_numpy(feats), attention_mask=None if mask is None else torch.from_numpy(mask),
                             return_segments=True, temperature=0.0, compression_ratio_threshold=None,
                             logprob_threshold=None, **kw)
    return [(float(s["start"]), float(s["end"]), [int(t) for t in s["tokens"]]) for s in out["segments"][0]]


def _ours(model, x, **kw):
    r = model.transcribe(x, TranscribeOptions(temperature=0.0, compression_ratio_threshold=None, logprob_threshold=None,
                                              **kw))
    return r, [(s.start, s.end, s.tokens) for s in r.segments]


def _same(ours, theirs):
    assert [s[2] for s in ours] == [s[2] for s in theirs]
    np.testing.assert_allclose([s[:2] for s in ours], [s[:2] for s in theirs], atol=1e-6)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(n=st.integers(1, 300), k=st.integers(1, 12), levels=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_top_k_is_a_stable_sorts_head(n, k, levels, seed):
    """A beam step's candidates without sorting the whole vocabulary: the indices a stable sort puts
    first, ties (few distinct values) and suppressed -inf entries included."""
    rng = np.random.default_rng(seed)
    for spread in (1.0, 40.0, 1e6):      # values near the largest, or spread wide (the fallback)
        v = (rng.integers(0, levels, n) * spread).astype(np.float32) - np.float32(levels)
        v[rng.random(n) < 0.2] = -np.inf
        np.testing.assert_array_equal(top_k(v, k), np.argsort(-v, kind="stable")[:k])
    v[:] = -np.inf
    np.testing.assert_array_equal(top_k(v, k), np.argsort(-v, kind="stable")[:k])


def test_long_features_match_the_extractor():
    x = speechy(47.3)
    np.testing.assert_allclose(log_mel_long(x, 80), _hf_features(x)[0][0], atol=1e-4)


@pytest.mark.parametrize("language,task", [("en", "transcribe"), ("fr", "translate"), (None, "transcribe")])
def test_short_without_timestamps(both, language, task):
    ours, theirs = both
    x = speechy(9.0, seed=1)
    hf = _hf_segments(theirs, x, language=language, task=task, return_timestamps=False, max_new_tokens=30)
    r, mine = _ours(ours, x, language=language, task=task, timestamps=False, max_new_tokens=30)
    _same(mine, hf)
    assert mine[0][2] and r.text == ours.decode_text(mine[0][2])
    if language is None:       # detected as transformers detects it
        with torch.no_grad():
            lang = theirs.detect_language(torch.from_numpy(_hf_features(x)[0])).item()
        assert ours.lang_to_id[r.language] == lang


def test_short_with_timestamps(both):
    ours, theirs = both
    x = speechy(12.0, seed=2)
    hf = _hf_segments(theirs, x, language="de", return_timestamps=True, max_new_tokens=60)
    r, mine = _ours(ours, x, language="de", timestamps=True, max_new_tokens=60)
    _same(mine, hf)
    tb = ours.timestamp_begin
    assert any(t >= tb for s in mine for t in s[2])            # timestamps were decoded


def test_long_audio_seeks_by_timestamps(both):
    ours, theirs = both
    x = speechy(75.0, seed=3)
    hf = _hf_segments(theirs, x, language="en", return_timestamps=True, max_new_tokens=60)
    r, mine = _ours(ours, x, language="en", timestamps=True, max_new_tokens=60)
    _same(mine, hf)
    seeks = sorted({s.seek for s in r.segments})
    assert len(seeks) >= 3 and any(s % 3000 for s in seeks)      # windows start where a segment ended
    assert r.segments[-1].end <= 75.0 + 30


def test_fallback_measures():
    assert compression_ratio([5] * 200, 1773) > 2.4
    assert compression_ratio(list(range(200)), 1773) < 2.4
    assert language_code("English") == "en" and language_code("mandarin") == "zh"
    with pytest.raises(TranscriptionError, match="language"):
        language_code("klingon")


def test_fallback_decodes_again_at_a_higher_temperature(both):
    ours, _ = both
    x = speechy(5.0, seed=4)
    # a log-prob threshold no window reaches: every temperature is tried, the last one kept
    r = ours.transcribe(x, TranscribeOptions(language="en", temperature=(0.0, 0.5, 1.0), logprob_threshold=0.0,
                                             max_new_tokens=20, seed=1))
    assert r.segments[0].temperature == 1.0
    r = ours.transcribe(x, TranscribeOptions(language="en", temperature=(0.0, 0.5), max_new_tokens=20,
                                             logprob_threshold=-1e9, compression_ratio_threshold=None))
    assert r.segments[0].temperature == 0.0


def test_refusals(both):
    ours, _ = both
    with pytest.raises(TranscriptionError, match="language"):
        ours.transcribe(speechy(1.0), TranscribeOptions(language="pt"))       # a language this model lacks
    with pytest.raises(TranscriptionError, match="no samples"):
        ours.transcribe(np.zeros(0, np.float32))
    with pytest.raises(TranscriptionError, match="task"):
        ours.transcribe(speechy(1.0), TranscribeOptions(task="summarize"))
    with pytest.raises(TranscriptionError, match="beam_size"):
        ours.transcribe(speechy(1.0), TranscribeOptions(beam_size=0))


def test_no_speech_probability_is_transformers(both):
    """<|nospeech|>'s probability after <|startoftranscript|> (transformers' WhisperNoSpeechDetection),
    and a window over the threshold with a low log-probability is skipped as silence."""
    ours, theirs = both
    x = speechy(6.0, seed=7)
    r = ours.transcribe(x, TranscribeOptions(language="en", temperature=0.0, max_new_tokens=10))
    feats = torch.from_numpy(_hf_features(x)[0])
    with torch.no_grad():
        logits = theirs(input_features=feats, decoder_input_ids=torch.tensor([[ours.sot]])).logits[0, -1]
    want = torch.softmax(logits.double(), -1)[ours.no_timestamps - 1].item()
    assert r.segments[0].no_speech_prob == pytest.approx(want, rel=1e-4) and 0 < want < 1
    skipped = ours.transcribe(x, TranscribeOptions(language="en", temperature=0.0, max_new_tokens=10,
                                                   no_speech_threshold=want / 2, logprob_threshold=0.0))
    assert skipped.segments == [] and skipped.text == ""


@pytest.mark.parametrize("timestamps,seconds", [(False, 9.0), (True, 9.0), (True, 50.0)])
def test_beam_search_matches_transformers(both, timestamps, seconds):
    ours, theirs = both
    x = speechy(seconds, seed=8)
    hf = _hf_segments(theirs, x, language="en", return_timestamps=timestamps, max_new_tokens=25, num_beams=5)
    r, mine = _ours(ours, x, language="en", timestamps=timestamps, max_new_tokens=25, beam_size=5)
    _same(mine, hf)
    greedy = _ours(ours, x, language="en", timestamps=timestamps, max_new_tokens=25)[1]
    assert [s[2] for s in greedy] != [s[2] for s in mine]        # the beams found another answer
