"""A chat model and a Whisper model behind one server (`serve --model CHAT --model WHISPER`,
server/models.py) over real HTTP on 127.0.0.1, built as `serve` builds it (the parsed flags ->
start_models -> build_server).

The audio routes answer on the Whisper model (the one the form's `model` names, the server's
first speech-to-text model without one), loaded on its first request, with a one-model server's
answers (the offline API's); the chat routes on the chat model; each model's wrong route is a 400
saying what the model does. Under both loads at once neither stalls: the two engines take turns
on the cores (each step or turn holds the pool's step lock), so chat requests keep completing
while a long file is transcribed, and a clip sent while chat requests keep coming is answered."""
from __future__ import annotations

import argparse
import json
import threading
import time

import pytest

openai = pytest.importorskip("openai")

from lite_llm import LLM  # noqa: E402
from lite_llm.engine.transcription import plan_memory  # noqa: E402
from lite_llm.multimodal.transcribe import WhisperModel  # noqa: E402
from lite_llm.server.args import add_arguments  # noqa: E402
from lite_llm.server.startup import build_server, start_models  # noqa: E402
from test_whisper_offline import wav_bytes  # noqa: E402
from test_whisper_transcribe import speechy  # noqa: E402
from conftest import tiny_checkpoint_path  # noqa: E402
from tests.server.conftest import error_of, request  # noqa: E402
from tests.server.watchdog import Watchdog  # noqa: E402
from whisper_checkpoint import whisper_asr_checkpoint  # noqa: E402

T = 0.4
CLIP = wav_bytes(speechy(7.0, seed=11))


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def served():
    args = _parse(["--model", str(tiny_checkpoint_path("llama")), "--model", str(whisper_asr_checkpoint()),
                   "--port", "0", "--host", "127.0.0.1", "--max-model-len", "128", "--kv-cache-space", "0.02",
                   "--dtype", "float32", "--disable-log-requests", "--disable-web-ui"])
    pool, first = start_models(args)
    server = build_server(args, pool, first.ctx.tokenizer, first.info, pool=pool)
    server.start()
    chat, speech = list(pool.entries)
    yield server, pool, chat, speech
    server.drain(5.0)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def offline():
    return LLM(model=str(whisper_asr_checkpoint()))


def _form(data: bytes, **fields) -> bytes:
    parts = [f'--B\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    head = "".join(parts) + '--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n' \
                            "Content-Type: audio/wav\r\n\r\n"
    return head.encode() + data + b"\r\n--B--\r\n"


def _post_form(port: int, body: bytes) -> tuple[int, dict]:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/audio/transcriptions", body, {"Content-Type": "multipart/form-data; boundary=B"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


def _chat(port: int, model: str, max_tokens: int = 16) -> tuple[int, dict]:
    status, _, data = request(port, "POST", "/v1/chat/completions",
                              {"model": model, "messages": [{"role": "user", "content": "Say something"}],
                               "max_tokens": max_tokens, "temperature": 0})
    return status, json.loads(data)


def test_the_audio_routes_answer_on_the_whisper_model_as_the_offline_api(served, client, offline):
    """Loaded on its first transcription; the form's model or none picks it; the text is the offline
    API's; streamed deltas add up to it; /v1/models lists both models, loaded."""
    server, pool, chat, speech = served
    port = server.server_address[1]
    want = offline.transcribe(CLIP, language="en", temperature=T).text.strip()
    got = client.audio.transcriptions.create(model=speech, file=("a.wav", CLIP, "audio/wav"), language="en",
                                             temperature=T)
    assert got.text == want and want
    status, body = _post_form(port, _form(CLIP, language="en", temperature=str(T)))    # no model field
    assert status == 200 and body["text"] == want
    status, headers, data = request(port, "POST", "/v1/audio/transcriptions", raw=_form(
        CLIP, model=speech, language="en", temperature=str(T), stream="true"),
        headers={"Content-Type": "multipart/form-data; boundary=B"}, timeout=120)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    chunks = [json.loads(e[len("data: "):]) for e in data.decode().split("\n\n") if e and e != "data: [DONE]"]
    assert all(c["model"] == speech for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).strip() == want
    status, _, data = request(port, "GET", "/v1/models")
    assert {m["id"]: m["status"] for m in json.loads(data)["data"]} == {chat: "loaded", speech: "loaded"}
    # both engines take their turns on the cores under the pool's one lock
    assert all(e.loaded.engine.step_lock is pool.step_lock for e in pool.entries.values())


@pytest.mark.filterwarnings("ignore:Items? .* using the .ReadOnly. qualifier:UserWarning")   # litellm's TypedDicts
def test_litellm_transcription_on_the_whisper_model(served, offline, tmp_path, monkeypatch):
    """litellm's transcription() as its documentation calls an OpenAI-compatible server (model
    "openai/<name>", api_base): the text, and verbose_json's segments, are the offline API's."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # its bundled price list, no download
    monkeypatch.setenv("LITELLM_TELEMETRY", "False")
    import litellm
    server, pool, chat, speech = served
    path = tmp_path / "clip.wav"
    path.write_bytes(CLIP)
    want = offline.transcribe(CLIP, language="en", timestamps=True, temperature=T)
    kw = dict(model="openai/" + speech, api_base=server.url + "/v1", api_key="unused", language="en", temperature=T)
    with open(path, "rb") as fh:
        got = litellm.transcription(file=fh, **kw)
    assert got.text == want.text.strip() and got.text
    with open(path, "rb") as fh:
        verbose = litellm.transcription(file=fh, response_format="verbose_json", **kw)
    assert [(s["start"], s["end"], s["text"]) for s in verbose.segments] == \
        [(s.start, s.end, s.text) for s in want.segments]


def test_each_model_refuses_the_other_kind_of_request(served, client):
    server, pool, chat, speech = served
    port = server.server_address[1]
    status, body = _chat(port, speech)
    assert status == 400 and "transcription" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=chat, file=("a.wav", CLIP), language="en")
    assert e.value.body["param"] == "model" and "not a speech-to-text model" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="no-such-model", file=("a.wav", CLIP), language="en")
    status, body = _chat(port, chat)
    assert status == 200 and body["model"] == chat and body["usage"]["completion_tokens"] > 0


def test_chat_keeps_answering_while_a_long_file_is_transcribed(served, client, offline):
    """A 95-s file (4 windows, each with its encoder pass) and chat requests one after another on
    the chat model: several chat answers come back before the file's, which is the offline API's."""
    server, pool, chat, speech = served
    port = server.server_address[1]
    long_clip = wav_bytes(speechy(95.0, seed=40))
    want = offline.transcribe(long_clip, language="en", temperature=T).text.strip()
    done: dict = {}

    def long_one():
        done["text"] = client.audio.transcriptions.create(model=speech, file=("a.wav", long_clip), language="en",
                                                          temperature=T).text
        done["at"] = time.monotonic()
    chats = []
    with Watchdog(port, chat, completion=False) as dog:
        t = threading.Thread(target=long_one)
        t.start()
        while t.is_alive():
            status, body = _chat(port, chat)
            assert status == 200 and body["usage"]["completion_tokens"] > 0
            chats.append(time.monotonic())
        t.join()
    assert done["text"] == want and want
    assert sum(at < done["at"] for at in chats) >= 3
    dog.check()


class TurnRecorder:
    """The pool's step lock, recording which thread held it and whether two ever held it at once."""

    def __init__(self, lock):
        self.lock, self.turns, self.holders, self.most = lock, {}, 0, 0

    def __enter__(self):
        self.lock.__enter__()
        self.holders += 1
        self.most = max(self.most, self.holders)
        name = threading.current_thread().name
        self.turns[name] = self.turns.get(name, 0) + 1
        return self

    def __exit__(self, *exc):
        self.holders -= 1
        self.lock.__exit__(*exc)


def test_a_clip_is_answered_while_chat_requests_keep_coming(served, client, offline):
    """Three clients send chat requests back to back for the whole test; a clip sent among them is
    answered (the offline API's text) and chat answers keep coming while it is decoded. Both
    engines' compute ran under the one step lock, one holder at a time."""
    server, pool, chat, speech = served
    port = server.server_address[1]
    want = offline.transcribe(CLIP, language="en", temperature=T).text.strip()
    with pool.use(speech), pool.use(chat):      # both loaded (this test alone loads them here)
        engines = [e.loaded.engine for e in pool.entries.values()]
    recorder = TurnRecorder(pool.step_lock)
    for e in engines:
        e.step_lock = recorder
    stop = threading.Event()
    answered: list[float] = []
    failures: list = []

    def chatter():
        while not stop.is_set():
            status, body = _chat(port, chat, 32)
            if status != 200:
                failures.append(body)
            answered.append(time.monotonic())
    threads = [threading.Thread(target=chatter) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        sent = time.monotonic()
        got = client.audio.transcriptions.create(model=speech, file=("a.wav", CLIP), language="en", temperature=T)
        back = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for e in engines:
            e.step_lock = pool.step_lock
    assert got.text == want and not failures
    assert sum(sent < at < back for at in answered) >= 3
    assert recorder.most == 1 and recorder.turns.get("lite_llm-transcription", 0) > 0
    assert sum(recorder.turns.values()) > recorder.turns["lite_llm-transcription"]     # the chat engine's steps


def test_models_dir_serves_a_whisper_cpp_file_beside_a_chat_model(tmp_path, offline):
    """--models-dir: a whisper.cpp model file (.bin with the ggml magic) is a model named by its stem,
    another .bin is not; the audio routes answer on it as the offline API does on the file."""
    import os
    from lite_llm.server import models
    from whisper_ggml_files import whisper_ggml_checkpoint, write_ggml
    os.symlink(tiny_checkpoint_path("llama"), tmp_path / "chat")
    write_ggml(whisper_ggml_checkpoint(), tmp_path / "ggml-tiny.bin")
    (tmp_path / "notes.bin").write_bytes(b"not a model at all")
    args = _parse(["--models-dir", str(tmp_path), "--port", "0", "--host", "127.0.0.1", "--max-model-len", "128",
                   "--kv-cache-space", "0.02", "--dtype", "float32", "--disable-log-requests", "--disable-web-ui"])
    assert [s.name for s in models.model_specs(args)] == ["chat", "ggml-tiny"]
    pool, first = start_models(args)
    server = build_server(args, pool, first.ctx.tokenizer, first.info, pool=pool)
    server.start()
    try:
        want = LLM(model=str(tmp_path / "ggml-tiny.bin")).transcribe(CLIP, language="en", temperature=T).text.strip()
        status, body = _post_form(server.server_address[1], _form(CLIP, language="en", temperature=str(T)))
        assert status == 200 and body["text"] == want
    finally:
        server.drain(5.0)


def test_info_prints_a_whisper_models_memory_plan():
    """`lite-llm info --model WHISPER`: the transcription engine's plan at serve's defaults."""
    from lite_llm import info
    path = str(whisper_asr_checkpoint())
    got = info.collect(model=path, bandwidth=False)["model"]["memory_plan"]
    assert {k: got[k] for k in ("weights", "kv_cache", "activations", "total")} == plan_memory(path).as_dict()


def test_the_memory_plan_is_what_the_decoder_holds():
    """plan_memory's K/V bytes are the decoder's blocks as allocated, float32 and q8_0 at load."""
    path = str(whisper_asr_checkpoint())
    for quantization in (None, "q8_0"):
        plan = plan_memory(path, quantization=quantization, max_num_seqs=3)
        model = WhisperModel.from_pretrained(path, max_requests=3, max_sequences=12, quantization=quantization)
        dec = model.decoder
        assert plan.kv_cache == sum(a.nbytes for a in dec.k_self + dec.v_self + dec.k_cross + dec.v_cross)
        assert plan.weights > 0 and plan.activations > 0
