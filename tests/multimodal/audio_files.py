"""Encoded audio for the tests, written with PyAV's encoders: one helper per file a client sends."""
from __future__ import annotations

import io

import numpy as np

# (container format, codec, sample rate the codec takes) of each format decode_audio opens
FORMATS = {"wav": ("wav", "pcm_s16le", None), "flac": ("flac", "flac", None), "mp3": ("mp3", "libmp3lame", None),
           "ogg": ("ogg", "libopus", 48000), "webm": ("webm", "libopus", 48000), "m4a": ("ipod", "aac", None)}


def sine(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def encode(samples: np.ndarray, rate: int, kind: str = "wav") -> bytes:
    """samples float32 [n] (mono) or [n, channels] at rate -> the bytes of a `kind` file (FORMATS),
    resampled first where the codec takes one rate only."""
    import av
    container, codec, codec_rate = FORMATS[kind]
    x = samples if samples.ndim == 2 else samples[:, None]
    layout = {1: "mono", 2: "stereo"}[x.shape[1]]
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=codec_rate or rate, layout=layout)
        pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16).reshape(1, -1)   # interleaved
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout=layout)
        frame.sample_rate = rate
        frames = [frame]
        if codec_rate and codec_rate != rate:
            resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout, rate=codec_rate)
            frames = resampler.resample(frame) + resampler.resample(None)
        for f in frames + [None]:
            for packet in stream.encode(f):
                out.mux(packet)
    return buf.getvalue()
