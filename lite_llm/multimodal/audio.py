"""Audio inputs: encoded bytes (WAV, FLAC, MP3, OGG, WebM, M4A) -> 16 kHz mono float32 samples ->
Whisper's log-mel features. Decoded with PyAV (the optional `lite-llm[audio]` extra: FFmpeg's
demuxers, decoders and resampler in one wheel, the resampler openai-whisper gets by running the
ffmpeg program; channels are averaged). Every refusal is an AudioError naming what is wrong and the
limit broken, which the server turns into a 400.

Bounds, as images' (media.py): the encoded size is checked before anything is opened; the
container format is read from the file's first bytes and only the formats above are opened (no
playlist or concat demuxer that would open other files); the samples decoded are counted frame by
frame against max_seconds, so a 3-hour file or a container whose few KB decode to hours of
silence stops at the limit, never allocating more than it.

Features: log_mel_reference is the plain NumPy spec of WhisperFeatureExtractor (periodic Hann
window of 400, hop 160, reflect padding, power spectrum, Slaney mel filters, log10 clamped at
1e-10, floored at max - 8, (x + 4) / 4, 30 s windows); log_mel runs the same on the compiled
kernels (_kernels/audio.pxi). What does not live here: the encoder (whisper.py).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


class AudioError(ValueError):
    """A request's audio cannot be used; the message says which and why."""


SAMPLE_RATE = 16000          # Whisper's
N_FFT = 400                  # 25 ms window
HOP = 160                    # 10 ms hop
CHUNK_SECONDS = 30           # one encoder window
N_SAMPLES = SAMPLE_RATE * CHUNK_SECONDS       # 480000 samples in a window
N_FRAMES = N_SAMPLES // HOP                   # 3000 feature frames in a window

# container formats opened, by their first bytes (FFmpeg demuxer names)
FORMATS = ("wav", "flac", "mp3", "ogg", "matroska", "mp4")


@dataclass(frozen=True)
class AudioConfig:
    max_audio_bytes: int = 25 * 2**20      # encoded size of one file (OpenAI's upload limit)
    # decoded length of one file at most: 30 min is 28.8 M samples, 115 MB as float32 at 16 kHz
    max_seconds: float = 1800.0

    @property
    def max_samples(self) -> int:
        return int(self.max_seconds * SAMPLE_RATE)


def _av():
    try:
        import av
    except ImportError:
        raise AudioError("audio inputs need PyAV: pip install 'lite-llm[audio]'") from None
    return av


def sniff_format(data: bytes) -> str | None:
    """The FFmpeg demuxer of an encoded file from its first bytes, None if not one of FORMATS."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:4] == b"\x1a\x45\xdf\xa3":                 # EBML: WebM / Matroska
        return "matroska"
    if data[4:8] == b"ftyp":                            # ISO base media: M4A, MP4
        return "mp4"
    if data[:3] == b"ID3" or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):   # MPEG audio sync
        return "mp3"
    return None


def decode_audio(data: bytes, what: str = "audio", cfg: AudioConfig = AudioConfig()) -> np.ndarray:
    """Encoded bytes -> float32 [n] mono samples at 16 kHz (the channels' mean, FFmpeg's resampler);
    empty, unknown, undecodable, silent-of-samples or too long: AudioError. A file cut inside
    its data decodes to what it holds (as ffmpeg does); cut inside its header it is refused."""
    if not data:
        raise AudioError(f"{what} is empty")
    if len(data) > cfg.max_audio_bytes:
        raise AudioError(f"{what} is {len(data)} bytes, more than the {cfg.max_audio_bytes} allowed")
    fmt = sniff_format(data)
    if fmt is None:
        raise AudioError(f"{what} is not a supported audio file (WAV, FLAC, MP3, OGG, WebM, M4A)")
    av = _av()
    limit = cfg.max_samples
    parts, total = [], 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=fmt, metadata_errors="ignore") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise AudioError(f"{what} has no audio stream")
            if container.duration is not None and container.duration / 1e6 > cfg.max_seconds:
                raise AudioError(f"{what} lasts {container.duration / 1e6:.0f} s, more than the "
                                 f"{cfg.max_seconds:.0f} s allowed")
            # planar float at 16 kHz, the channels kept: their mean is the downmix (what openai-whisper's
            # `ffmpeg -ac 1` to 16-bit samples gives; FFmpeg's float downmix adds them at -3 dB instead)
            resampler = av.AudioResampler(format="fltp", rate=SAMPLE_RATE)

            def take(frames):
                nonlocal total
                for out in frames:
                    a = out.to_ndarray().mean(axis=0, dtype=np.float32)     # [channels, n] -> [n]
                    total += a.shape[0]
                    if total > limit:
                        raise AudioError(f"{what} lasts more than the {cfg.max_seconds:.0f} s allowed")
                    parts.append(a)
            for frame in container.decode(stream):
                # a frame's own length is bounded by its codec; the sum is what a bomb inflates
                if frame.samples * SAMPLE_RATE > (limit - total + SAMPLE_RATE) * max(frame.sample_rate, 1):
                    raise AudioError(f"{what} lasts more than the {cfg.max_seconds:.0f} s allowed")
                take(resampler.resample(frame))
            take(resampler.resample(None))
    except AudioError:
        raise
    except Exception as e:      # PyAV raises several types (av.error.*, ValueError) for a bad file
        raise AudioError(f"{what} is not a readable audio file ({type(e).__name__})") from None
    if total == 0:
        raise AudioError(f"{what} holds no audio samples")
    return np.ascontiguousarray(np.concatenate(parts), np.float32)


# ---- log-mel features ---------------------------------------------------------------------------


def _hz_to_mel(f):
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, np.float64)
    mel = 3.0 * f / 200.0
    log_region = f >= 1000.0
    return np.where(log_region, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * (27.0 / np.log(6.4)), mel)


def _mel_to_hz(m):
    m = np.asarray(m, np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), 200.0 * m / 3.0)


def mel_filters(n_mels: int) -> np.ndarray:
    """float32 [n_mels, N_FFT / 2 + 1] triangular filters from 0 to 8 kHz on Slaney's mel scale,
    each scaled to unit area (Slaney's norm), as WhisperFeatureExtractor and librosa build them."""
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2))
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]                   # [bins, n_mels + 2]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))                     # [bins, n_mels]
    fb *= 2.0 / (edges[2:n_mels + 2] - edges[:n_mels])
    return np.ascontiguousarray(fb.T, np.float32)


def hann_window() -> np.ndarray:
    """float64 [N_FFT] periodic Hann window (torch.hann_window's, the extractor's)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)


def pad_or_trim(samples: np.ndarray) -> np.ndarray:
    """float32 [N_SAMPLES]: samples cut to 30 s or zero-padded to it (the extractor's default
    padding="max_length", truncation=True)."""
    samples = np.asarray(samples, np.float32).reshape(-1)
    if samples.shape[0] >= N_SAMPLES:
        return np.ascontiguousarray(samples[:N_SAMPLES])
    return np.pad(samples, (0, N_SAMPLES - samples.shape[0]))


def log_mel_reference(samples: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """float32 [n_mels, N_FRAMES] of the first 30 s of samples [n] (16 kHz), in NumPy float64."""
    x = np.pad(pad_or_trim(samples).astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:N_FRAMES]   # the last frame dropped
    power = np.abs(np.fft.rfft(frames * hann_window(), axis=-1)) ** 2               # [frames, bins]
    mel = np.maximum(power @ mel_filters(n_mels).T.astype(np.float64), 1e-10)
    log = np.log10(mel)
    log = np.maximum(log, log.max() - 8.0)
    return np.ascontiguousarray(((log + 4.0) / 4.0).T, np.float32)


def log_mel_model(kernels, n_mels: int):
    """kernels.LogMelModel of n_mels bins: the windowed real-DFT rows and the mel filters, packed."""
    # deferred: decoding audio loads no kernel build (any _kernels module loads one)
    from lite_llm._kernels import layout
    from lite_llm._kernels.packed import PackedMatrix, PackedModel
    k = np.arange(N_FFT // 2 + 1)[:, None] * np.arange(N_FFT)[None, :]
    angle = 2 * np.pi * (k % N_FFT) / N_FFT
    dft = np.concatenate([np.cos(angle), -np.sin(angle)]) * hann_window()   # [2 bins, n_fft]
    dft = np.ascontiguousarray(dft, np.float32)
    mel = mel_filters(n_mels)
    packed = PackedModel({"dft": PackedMatrix.of_float(layout.pack(dft, "float32"), dft.shape, "float32"),
                          "mel": PackedMatrix.of_float(layout.pack(mel, "float32"), mel.shape, "float32")})
    return kernels.LogMelModel(packed, HOP)


def log_mel(kernels, model, windows: list[np.ndarray], num_threads: int = 1) -> np.ndarray:
    """float32 [B, n_mels, 3000]: the features of B windows of samples, each cut or zero-padded to
    30 s (pad_or_trim), in one compiled call."""
    samples = np.ascontiguousarray(np.stack([pad_or_trim(w) for w in windows]), np.float32)
    out = np.empty((len(windows), model.n_mels, N_FRAMES), np.float32)
    kernels.log_mel_forward(model, samples, out, num_threads)
    return out
