"""LLM(model=<Whisper>).transcribe and `python -m lite_llm transcribe`: a real file through PyAV,
the same text as WhisperModel's and transformers'; the output formats."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lite_llm import LLM
from lite_llm.multimodal import audio
from lite_llm.multimodal.transcribe import Segment, Transcription, render
from test_whisper_transcribe import _hf_segments, speechy
from whisper_checkpoint import whisper_asr_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wav_bytes(x: np.ndarray) -> bytes:
    """16-bit PCM WAV of float samples at 16 kHz (the standard library's writer)."""
    import io
    import wave
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(audio.SAMPLE_RATE)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def llm():
    return LLM(model=str(whisper_asr_checkpoint()))


def test_llm_transcribes_a_file_as_transformers(llm, tmp_path):
    from transformers import WhisperForConditionalGeneration
    x = speechy(8.0, seed=5)
    data = wav_bytes(x)
    f = tmp_path / "a.wav"
    f.write_bytes(data)
    assert llm.runner_type == "transcription"
    r = llm.transcribe(str(f), language="en", temperature=0.0, max_new_tokens=30)
    decoded = audio.decode_audio(data)
    model = WhisperForConditionalGeneration.from_pretrained(whisper_asr_checkpoint(), dtype=torch.float32).eval()
    theirs = _hf_segments(model, decoded, language="en", max_new_tokens=30)
    assert [s.tokens for s in r.segments] == [s[2] for s in theirs]
    assert r.text == "".join(llm.tokenizer.decode([t for t in s[2] if t < 256]) for s in theirs) and r.text.strip()
    assert llm.transcribe(data, language="en", temperature=0.0, max_new_tokens=30).text == r.text   # bytes
    assert llm.transcribe(decoded, language="en", temperature=0.0, max_new_tokens=30).text == r.text  # samples
    with pytest.raises(ValueError, match="cannot generate"):
        llm.generate("hello")


def test_quantization_at_load(tmp_path):
    """LLM(quantization="q8_0") runs a Whisper directory on int8 blocks: a transcript within the
    fp32 one's reach (the same language and segments' count on this clip, text decoded); a
    whisper.cpp file is refused it in one line (it runs in its stored types)."""
    from lite_llm.model.loader import ModelLoadError
    from whisper_ggml_files import whisper_ggml_checkpoint, write_ggml
    x = speechy(8.0, seed=5)
    q = LLM(model=str(whisper_asr_checkpoint()), quantization="q8_0")
    r = q.transcribe(x, language="en", temperature=0.0, max_new_tokens=30)
    assert q.runner_type == "transcription" and r.language == "en" and r.segments and r.text.strip()
    f = write_ggml(whisper_ggml_checkpoint(), tmp_path / "ggml-tiny.bin", "F16")
    with pytest.raises(ModelLoadError, match="stored types") as e:
        LLM(model=str(f), quantization="q8_0")
    assert "\n" not in str(e.value)


def test_formats():
    r = Transcription(text=" a b", language="en", duration=3661.5, segments=[
        Segment(0, 0, 0.0, 1.5, " a", [1], 0.0, -0.1, 1.0), Segment(1, 0, 3600.25, 3661.5, " b", [2], 0.0, -0.2, 1.1)])
    assert render(r, "text")[0] == "a b\n"
    assert json.loads(render(r, "json")[0]) == {"text": "a b", "usage": {"type": "duration", "seconds": 3662}}
    v = json.loads(render(r, "verbose_json")[0])
    assert v["language"] == "english" and v["segments"][1]["start"] == 3600.25 and v["duration"] == 3661.5
    assert render(r, "srt")[0] == "1\n00:00:00,000 --> 00:00:01,500\na\n\n2\n01:00:00,250 --> 01:01:01,500\nb\n"
    assert render(r, "vtt")[0] == "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\na\n\n01:00:00.250 --> 01:01:01.500\nb\n"


def test_cli(tmp_path, llm):
    x = speechy(40.0, seed=6)
    f = tmp_path / "long.wav"
    f.write_bytes(wav_bytes(x))
    env = dict(os.environ, PYTHONPATH=ROOT)
    args = [sys.executable, "-m", "lite_llm", "transcribe", str(f), "--model", str(whisper_asr_checkpoint()),
            "--language", "en", "--temperature", "0"]
    out = subprocess.run(args + ["--format", "srt"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    want = llm.transcribe(str(f), language="en", temperature=0.0, timestamps=True)
    assert out.stdout.rstrip("\n") == render(want, "srt")[0].rstrip("\n")
    assert len(want.segments) >= 2 and out.stdout.startswith("1\n00:00:")
    out = subprocess.run(args + ["--format", "verbose_json", "--word-timestamps"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    timed = llm.transcribe(str(f), language="en", temperature=0.0, timestamps=True, word_timestamps=True)
    body = json.loads(out.stdout)
    assert body["words"] == [{"word": w.word.strip(), "start": w.start, "end": w.end}
                             for s in timed.segments for w in s.words] and body["words"]
    assert [(s["start"], s["end"]) for s in body["segments"]] == [(s.start, s.end) for s in timed.segments]
    out = subprocess.run(args + ["--format", "srt", "--word-timestamps"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 2 and "verbose_json" in out.stderr
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    out = subprocess.run(args[:4] + [str(bad)] + args[5:], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "not a readable audio file" in out.stderr and "Traceback" not in out.stderr
