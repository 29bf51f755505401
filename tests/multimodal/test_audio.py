"""Audio in: each container a client sends decoded to 16 kHz mono, its bounds (size, length, a
container that inflates to hours) and its refusals; Whisper's log-mel features, the NumPy
reference and the compiled path, against transformers' WhisperFeatureExtractor."""
from __future__ import annotations

import io
import tracemalloc
import wave

import numpy as np
import pytest

from lite_llm import _kernels
from lite_llm.multimodal import audio
from lite_llm.multimodal.audio import AudioConfig, AudioError, decode_audio

pytest.importorskip("av")
from audio_files import FORMATS, encode, sine  # noqa: E402

VARIANTS = _kernels.available()
RATE = audio.SAMPLE_RATE


def _peak_hz(x: np.ndarray) -> float:
    return float(np.abs(np.fft.rfft(x)).argmax() * RATE / len(x))


# ---- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_format_decodes_to_16khz_mono(kind):
    x = sine(440, 2.0, RATE)
    y = decode_audio(encode(x, RATE, kind), "file")
    assert y.dtype == np.float32 and y.ndim == 1
    # lossy codecs add a frame of priming / padding at most
    assert abs(len(y) - len(x)) < 0.12 * RATE, len(y)
    assert abs(_peak_hz(y) - 440) < 1.0
    if kind in ("wav", "flac"):       # lossless: the samples themselves, to 16-bit precision
        np.testing.assert_allclose(y, x, atol=2 / 32768)


def test_stereo_44k_is_averaged_and_resampled():
    rate = 44100
    left, right = sine(1000, 1.0, rate), np.full(rate, 0.25, np.float32)
    y = decode_audio(encode(np.stack([left, right], 1), rate, "wav"))
    want = 0.5 * (sine(1000, 1.0, RATE) + 0.25)
    assert abs(len(y) - RATE) <= 2
    n = min(len(y), len(want))
    # away from the ends, where the resampler's filter has no neighbours
    np.testing.assert_allclose(y[100:n - 100], want[100:n - 100], atol=1e-3)


@pytest.mark.parametrize("data,why", [
    (b"", "is empty"),
    (b"hello, this is no audio at all" * 10, "not a supported audio file"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "not a readable audio file"),      # cut inside its header
    (b"fLaC\x00\x00\x00\x22" + b"\x00" * 10, "not a readable audio file"),
])
def test_bad_files_are_refused_with_a_reason(data, why):
    with pytest.raises(AudioError, match=why) as e:
        decode_audio(data, "file 'x'")
    assert e.value.args[0].startswith("file 'x'")


def test_without_pyav_decoding_says_how_to_install_it(monkeypatch):
    import sys
    data = encode(sine(440, 0.5, RATE), RATE, "wav")
    monkeypatch.setitem(sys.modules, "av", None)          # import av raises ImportError
    with pytest.raises(AudioError, match=r"lite-llm\[audio\]"):
        decode_audio(data, "file")


def test_a_file_of_zero_samples_is_refused():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:           # a well-formed WAV header and no samples
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(RATE)
    data = buf.getvalue()
    with pytest.raises(AudioError, match="no audio samples"):
        decode_audio(data, "file")


def test_a_file_cut_inside_its_data_decodes_what_it_holds():
    data = encode(sine(440, 2.0, RATE), RATE, "wav")
    y = decode_audio(data[:len(data) // 2], "file")
    assert abs(len(y) - RATE) < 0.01 * RATE


def test_size_and_length_limits():
    data = encode(sine(440, 3.0, RATE), RATE, "flac")
    with pytest.raises(AudioError, match=f"more than the {len(data) - 1} allowed"):
        decode_audio(data, "file", AudioConfig(max_audio_bytes=len(data) - 1))
    with pytest.raises(AudioError, match="more than the 2 s allowed"):
        decode_audio(data, "file", AudioConfig(max_seconds=2))
    assert len(decode_audio(data, "file", AudioConfig(max_seconds=3.5))) == 3 * RATE


@pytest.mark.parametrize("kind,at_most", [("flac", 2**18), ("mp3", 2**21)])
def test_a_small_file_of_long_silence_stops_at_the_limit(kind, at_most):
    """20 minutes of silence in a small file (a zip bomb's audio cousin): refused at the length
    limit while decoding, having held no more than about the limit's samples."""
    data = encode(np.zeros(20 * 60 * 8000, np.float32), 8000, kind)
    assert len(data) < at_most
    cfg = AudioConfig(max_seconds=30)
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="more than the 30 s allowed"):
            decode_audio(data, "file", cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 30 s at 16 kHz is 1.9 MB of float32; the whole file would be 77 MB
    assert peak < 8 * 2**20, peak


def test_a_low_sample_rate_cannot_inflate_through_the_resampler():
    """200 KB of WAV at 1 Hz is 100 000 s once resampled to 16 kHz (6 GB of float32): refused from
    its declared length, before a sample is resampled."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(1)
        w.writeframes(bytes(2 * 100_000))
    tracemalloc.start()
    try:
        with pytest.raises(AudioError, match="more than the 1800 s allowed"):
            decode_audio(buf.getvalue(), "file")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak


# ---- log-mel features ---------------------------------------------------------------------------


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(7 * RATE) / RATE
    return {"sine": sine(440, 7.0, RATE), "noise": (0.1 * rng.standard_normal(40 * RATE)).astype(np.float32),
            "silence": np.zeros(3 * RATE, np.float32),
            "chirp": (0.3 * np.sin(2 * np.pi * (100 * t + 500 * t * t))).astype(np.float32),
            "quiet": sine(1000, 12.0, RATE, amplitude=1e-3), "short": sine(3000, 0.05, RATE)}


@pytest.fixture(scope="module", params=[80, 128])
def extractor(request):
    from transformers import WhisperFeatureExtractor
    return WhisperFeatureExtractor(feature_size=request.param)


def _theirs(fe, x: np.ndarray) -> np.ndarray:
    """The extractor's NumPy (float64) path; its default torch path differs from it by up to 9e-5
    on these signals (the chirp)."""
    return fe._np_extract_fbank_features(audio.pad_or_trim(x)[None], "cpu")[0]


def test_mel_filters_are_the_extractors(extractor):
    np.testing.assert_allclose(audio.mel_filters(extractor.feature_size), extractor.mel_filters.T, atol=1e-8)


@pytest.mark.parametrize("name", sorted(_signals()))
def test_log_mel_reference_matches_transformers(extractor, name):
    x = _signals()[name]
    ours = audio.log_mel_reference(x, extractor.feature_size)
    np.testing.assert_allclose(ours, _theirs(extractor, x), atol=1e-5)
    default = extractor(x, sampling_rate=RATE, return_tensors="np").input_features[0]
    np.testing.assert_allclose(ours, default, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_log_mel_compiled_matches_reference_and_transformers(extractor, variant):
    k = _kernels.load(variant)
    model = audio.log_mel_model(k, extractor.feature_size)
    signals = _signals()
    out = audio.log_mel(k, model, list(signals.values()), num_threads=3)    # one call, each window its own floor
    assert out.shape == (len(signals), extractor.feature_size, audio.N_FRAMES)
    for got, (name, x) in zip(out, signals.items()):
        ref = audio.log_mel_reference(x, extractor.feature_size)
        # float32 DFT: its error near the -8 floor is what torch.stft's is (see _theirs)
        np.testing.assert_allclose(got, ref, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(got, _theirs(extractor, x), atol=1e-4, err_msg=name)


def test_longer_than_30_s_is_cut_shorter_is_padded():
    x = _signals()["noise"]                 # 40 s
    np.testing.assert_array_equal(audio.log_mel_reference(x), audio.log_mel_reference(x[:audio.N_SAMPLES]))
    short = sine(440, 1.0, RATE)
    np.testing.assert_array_equal(audio.log_mel_reference(short),
                                  audio.log_mel_reference(np.concatenate([short, np.zeros(RATE, np.float32)])))
