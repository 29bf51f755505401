"""OpenAI's audio routes over HTTP on 127.0.0.1, served from a tiny random Whisper by `serve`'s own
start-up (start_engine, build_server): the official `openai` client's transcriptions.create and
translations.create in every response format and streamed give the offline API's text (which is
transformers'); bad uploads are 400s in OpenAI's shape naming the field, never a 500, and the
server keeps serving; a long file does not hold a short one back."""
from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from lite_llm import LLM  # noqa: E402
from lite_llm.multimodal.transcribe import LANGUAGES, render  # noqa: E402
from test_whisper_offline import wav_bytes  # noqa: E402
from test_whisper_transcribe import speechy  # noqa: E402
from tests.server.conftest import error_of, request  # noqa: E402
from tests.server.watchdog import Watchdog  # noqa: E402
from whisper_checkpoint import whisper_asr_checkpoint  # noqa: E402

NAME = "tiny-whisper"
T = 0.4


def _serve_args(*argv: str):
    from lite_llm.server import app
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture(scope="module")
def served():
    from lite_llm.server.startup import build_server, start_engine
    args = _serve_args(str(whisper_asr_checkpoint()), "--served-model-name", NAME, "--port", "0",
                       "--host", "127.0.0.1")
    engine, tokenizer, info = start_engine(args)
    srv = build_server(args, engine, tokenizer, info)
    srv.start()
    yield srv, engine
    srv.drain(5.0)
    engine.shutdown()


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline():
    return LLM(model=str(whisper_asr_checkpoint()))


CLIP = wav_bytes(speechy(7.0, seed=11))


def test_the_default_fallback_matches_the_offline_api(client, offline):
    """No temperature: 0, then 0.2 .. 1.0 (the random model fails every window's checks: six
    decodings of the window, on both sides)."""
    want = offline.transcribe(CLIP, language="en")
    got = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP, "audio/wav"), language="en")
    assert got.text == want.text.strip() and got.text


def test_formats_match_the_offline_api(client, offline):
    # one temperature (no fallback): the random model fails every window's checks
    want = offline.transcribe(CLIP, language="en", temperature=T)
    got = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP, "audio/wav"), language="en",
                                             temperature=T)
    assert got.text == want.text.strip() and got.text
    text = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en", response_format="text",
                                              temperature=T)
    assert text.strip() == want.text.strip()
    timed = offline.transcribe(CLIP, language="en", timestamps=True, temperature=T)
    verbose = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en",
                                                 response_format="verbose_json", temperature=T,
                                                 timestamp_granularities=["segment"])
    assert verbose.language == "english" and verbose.text == timed.text.strip()
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(s.start, s.end, s.text) for s in timed.segments]
    for fmt in ("srt", "vtt"):
        body = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en",
                                                  response_format=fmt, temperature=T)
        assert body == render(timed, fmt)[0]


def test_word_timestamps_through_the_openai_client(client, offline):
    """timestamp_granularities ["word"]: verbose_json's `words` (OpenAI's TranscriptionWord: the word
    without its leading space, start, end) are the offline API's, no segments; with "segment" too,
    both, the segments' times moved to their words' as word timestamps move them."""
    want = offline.transcribe(CLIP, language="en", timestamps=True, temperature=T, word_timestamps=True)
    words = [w for s in want.segments for w in s.words]
    assert words and all(s.words is not None for s in want.segments)
    got = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en",
                                             response_format="verbose_json", temperature=T,
                                             timestamp_granularities=["word"])
    assert [(w.word, w.start, w.end) for w in got.words] == [(w.word.strip(), w.start, w.end) for w in words]
    assert got.segments is None and got.text == want.text.strip()
    both = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en",
                                              response_format="verbose_json", temperature=T,
                                              timestamp_granularities=["word", "segment"])
    assert [(w.start, w.end) for w in both.words] == [(w.start, w.end) for w in words]
    assert [(s.start, s.end, s.text) for s in both.segments] == [(s.start, s.end, s.text) for s in want.segments]
    assert all(a.start <= b.start for a, b in zip(got.words, got.words[1:]))


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")     # the openai client marks translations so
def test_language_is_detected_and_translation_asks_for_english_text(client, offline):
    want = offline.transcribe(CLIP, timestamps=True, temperature=T)
    got = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), response_format="verbose_json",
                                             temperature=T)
    assert got.text == want.text.strip() and got.language == LANGUAGES[want.language]
    tr = offline.transcribe(CLIP, task="translate", temperature=T)
    got = client.audio.translations.create(model=NAME, file=("a.wav", CLIP), temperature=T)
    assert got.text == tr.text.strip()


def test_streamed_deltas_add_up_to_the_text(server, offline):
    long = wav_bytes(speechy(65.0, seed=12))
    want = offline.transcribe(long, language="en", temperature=T)
    boundary = "XyZ"
    body = _form(boundary, long, language="en", stream="true", stream_include_usage="true", temperature=T)
    status, headers, data = request(server.server_address[1], "POST", "/v1/audio/transcriptions", raw=body,
                                    headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
                                    timeout=300)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e[len("data: "):] for e in data.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "transcription.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
    assert len(deltas) >= 3 and "".join(deltas) == want.text        # a delta per window, then the stop
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["completion_tokens"] > 0


def _form(boundary: str, data: bytes | None, filename: str = "a.wav", **fields) -> bytes:
    out = b""
    for k, v in {"model": NAME, **fields}.items():
        out += f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
    if data is not None:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def _post(port, body, ctype="multipart/form-data; boundary=B", path="/v1/audio/transcriptions"):
    return request(port, "POST", path, raw=body, headers={"Content-Type": ctype})


@pytest.mark.parametrize("case,param,message", [
    ("truncated", "file", "is not a readable audio file"),
    ("garbage", "file", "not a supported audio file"),
    ("empty", "file", "file is empty"),
    ("no_samples", "file", "holds no audio samples"),
    ("no_file", "file", "no 'file' field"),
    ("language", "language", "not one of Whisper's languages"),
    ("format", "response_format", "'response_format' must be one of"),
    ("temperature", "temperature", "'temperature' must be a number"),
    ("words", "timestamp_granularities[]", "word timestamps come in 'response_format' verbose_json"),
    ("granularity", "timestamp_granularities[]", "takes segment or word"),
    ("json_body", None, "must be multipart/form-data"),
    ("too_long", "file", "more than the 1800 s allowed"),
])
def test_bad_uploads_are_400s_and_serving_goes_on(server, client, case, param, message):
    port = server.server_address[1]
    header = wav_bytes(np.zeros(0, np.float32))           # a WAV of no samples
    bodies = {
        "truncated": _form("B", CLIP[:30]), "garbage": _form("B", b"this is not audio at all" * 10),
        "empty": _form("B", b""), "no_samples": _form("B", header), "no_file": _form("B", None),
        "language": _form("B", CLIP, language="klingon"), "format": _form("B", CLIP, response_format="mp3"),
        "temperature": _form("B", CLIP, temperature="hot"),
        "words": _form("B", CLIP, **{"timestamp_granularities[]": "word"}),
        "granularity": _form("B", CLIP, response_format="verbose_json", **{"timestamp_granularities[]": "letter"}),
        # 31 minutes of 8 kHz 8-bit silence: 15 MB, under the upload limit, over the duration limit
        "too_long": _form("B", _wav_8bit_silence(31 * 60)),
    }
    if case == "json_body":
        status, _, data = _post(port, b'{"model": "x"}', ctype="application/json")
    else:
        status, _, data = _post(port, bodies[case])
    assert status == 400, data[:300]
    err = error_of(data)
    assert message in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"
    assert b"Traceback" not in data
    ok = client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en", temperature=T)
    assert ok.text


def _wav_8bit_silence(seconds: int) -> bytes:
    import io
    import wave
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(b"\x80" * (8000 * seconds))
    return buf.getvalue()


def test_over_the_size_limit_is_refused(server):
    from lite_llm.server.audio_routes import body_limit
    port = server.server_address[1]
    status, _, data = _post(port, _form("B", b"\0" * (body_limit() + 1)))
    assert status == 413 and error_of(data)["code"] == 413


def test_the_audio_routes_are_in_the_openapi_document(server):
    from openapi_spec_validator import validate
    from lite_llm.server.openapi import AUDIO_ROUTES
    status, _, data = request(server.server_address[1], "GET", "/openapi.json")
    assert status == 200
    doc = json.loads(data)
    validate(doc)
    for route in AUDIO_ROUTES:
        op = doc["paths"][route]["post"]
        assert "multipart/form-data" in op["requestBody"]["content"] and {"200", "400", "413"} <= set(op["responses"])


def test_generation_routes_say_what_this_model_does(server):
    status, _, data = request(server.server_address[1], "POST", "/v1/chat/completions",
                              {"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "transcription" in error_of(data)["message"]


def test_a_long_file_does_not_hold_back_a_short_one(server, client):
    """A 5-minute file is decoded window by window; a short clip sent after it starts is answered
    before it ends."""
    port = server.server_address[1]
    long = _form("B", wav_bytes(speechy(300.0, seed=13)), language="en", temperature=T)
    done = {}

    def long_one():
        done["long"] = _post(port, long)[0], time.monotonic()
    with Watchdog(port, NAME, completion=False) as dog:       # /health from another connection
        t = threading.Thread(target=long_one)
        t.start()
        time.sleep(1.0)
        client.audio.transcriptions.create(model=NAME, file=("a.wav", CLIP), language="en", temperature=T)
        short_done = time.monotonic()
        t.join(600)
    assert done["long"][0] == 200
    assert short_done < done["long"][1]
    dog.check()
    print(dog.summary())


def transcribe_at_once(server, client, files: list[bytes]) -> tuple[list, Watchdog]:
    """Each file sent by a client thread of its own, all at once, under a watchdog: the texts
    (None for an answer missing after 120 s) and the watchdog."""
    got: dict[int, str] = {}

    def one(i):
        got[i] = client.audio.transcriptions.create(model=NAME, file=("a.wav", files[i]), language="en",
                                                    temperature=T).text
    with Watchdog(server.server_address[1], NAME, completion=False) as dog:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(files))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    return [got.get(i) for i in range(len(files))], dog


def test_concurrent_transcriptions_share_decoder_steps(served, client, offline):
    """Four clips sent at once: each answer is the offline API's for that clip alone, and the
    engine ran their tokens in shared decoder steps (more sequences than steps)."""
    server, engine = served
    clips = [wav_bytes(speechy(3.0 + 2 * i, seed=20 + i)) for i in range(4)]
    want = [offline.transcribe(c, language="en", temperature=T).text.strip() for c in clips]
    steps, seqs = engine.num_steps, engine.num_step_seqs
    got, dog = transcribe_at_once(server, client, clips)
    assert got == want and all(want)
    assert engine.num_step_seqs - seqs > engine.num_steps - steps
    dog.check()
    print(dog.summary())


def test_a_file_being_encoded_and_a_clip_sent_beside_it_both_complete(served, client, offline):
    """A 95-s file (4 windows) and a 7-s clip at once: the engine runs the windows' encoder passes
    in slices between the decoder steps (a layer a slice: 2 for each window of the tiny model, 5
    windows), and each answer is the offline API's."""
    server, engine = served
    files = [wav_bytes(speechy(95.0, seed=40)), wav_bytes(speechy(7.0, seed=41))]
    want = [offline.transcribe(f, language="en", temperature=T).text.strip() for f in files]
    slices = engine.num_encoder_slices
    got, dog = transcribe_at_once(server, client, files)
    assert got == want and all(want)
    assert engine.num_encoder_slices - slices >= 5 * 2
    dog.check()
    print(dog.summary())


def test_the_server_routes_answer_for_a_whisper_model(server):
    port = server.server_address[1]
    for path in ("/health", "/v1/models", "/metrics", "/v1/engine/stats", "/version"):
        status, _, data = request(port, "GET", path)
        assert status == 200, (path, data[:200])
    status, _, data = request(port, "GET", "/v1/models")
    assert [m["id"] for m in json.loads(data)["data"]] == [NAME]
