"""OpenAI's audio routes for a served Whisper model (lite_llm/engine/transcription.py):
POST /v1/audio/transcriptions and /v1/audio/translations.

The body is multipart/form-data (read within these routes' own body limit, room for one audio
file: upload_limit), parsed by the standard library's email parser: `file` (the audio),
`model` (on a server of several models, the Whisper model to use; by default its first),
`language`, `prompt`, `response_format` (json, text, srt, vtt, verbose_json),
`temperature` (0, the default: Whisper's fallback 0, 0.2 .. 1.0; above 0: that one), 
`timestamp_granularities[]` (segment, word: verbose_json's `words`), `stream` (vLLM's `transcription.chunk` deltas, one per
window decoded, then `data: [DONE]`) and vLLM's `stream_include_usage`. Every field is checked
and the audio decoded (bounded: audio.AudioConfig) on the HTTP thread before the request is
queued; decoding the speech runs on the engine's worker. A client's mistake is a 400 in OpenAI's
shape naming the field; a full queue a 429.
"""
from __future__ import annotations

import email.parser
import email.policy
import functools
import os
import time
import uuid
from typing import Any

from lite_llm.multimodal import audio
from lite_llm.multimodal.transcribe import (FORMATS, TranscribeOptions, TranscriptionError, is_whisper_model,
                                            language_code, render)
from lite_llm.server.answers import sse
from lite_llm.server.models import model_state
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad
from lite_llm.engine.transcription import QueueFullError, TranscriptionEngine

MAX_PARTS = 32               # form fields of one request
MAX_FIELD_BYTES = 16 * 1024  # a text field (the prompt is the longest: 224 tokens in Whisper's decoder)
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
AUDIO_LIMITS = audio.AudioConfig()


def is_transcription(engine: Any) -> bool:
    return isinstance(engine, TranscriptionEngine)


def body_limit() -> int:
    """The request body the audio routes read by default: the audio limit and room for the form's fields."""
    return AUDIO_LIMITS.max_audio_bytes + MAX_PARTS * MAX_FIELD_BYTES


def upload_limit(state: ServerState) -> int:
    """The audio routes' body limit (their Route.body_limit): body_limit(), or --max-request-bytes."""
    return state.max_upload_bytes


@functools.lru_cache(maxsize=256)
def _is_speech_file(path: str) -> bool:
    path = os.path.expanduser(path)
    return os.path.exists(path) and is_whisper_model(path)


def speech_models(state: ServerState) -> list[str]:
    """The names of the server's speech-to-text (Whisper) models: its one model if it is one; of a
    server of several (server/models.py), those whose files are a Whisper model's, loaded or not."""
    pool = state.pool
    if pool is None:
        return list(state.ctx.model_names[:1]) if is_transcription(state.engine) else []
    return [name for name, entry in pool.entries.items() if _is_speech_file(entry.spec.model)]


def transcriptions(req: Request, state: ServerState) -> Response:
    """POST /v1/audio/transcriptions."""
    return _answer(req, state, "transcribe")


def translations(req: Request, state: ServerState) -> Response:
    """POST /v1/audio/translations: speech in any language to English text."""
    return _answer(req, state, "translate")


def parse_form(req: Request) -> tuple[dict[str, list[str]], bytes | None]:
    """(text fields by name, the `file` part's bytes) of a multipart/form-data body."""
    ctype = req.headers.get("Content-Type", "") or ""
    if not ctype.lower().startswith("multipart/form-data") or "boundary=" not in ctype.lower():
        raise bad("the request body must be multipart/form-data (with a boundary), as OpenAI's audio routes take")
    body = req.body()
    head = b"Content-Type: " + ctype.encode("latin-1", "replace") + b"\r\nMIME-Version: 1.0\r\n\r\n"
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not msg.is_multipart():
        raise bad("the multipart/form-data body could not be parsed")
    fields: dict[str, list[str]] = {}
    data = None
    for k, part in enumerate(msg.iter_parts()):
        if k >= MAX_PARTS:
            raise bad(f"the form has more than {MAX_PARTS} fields")
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            data = payload
            continue
        if len(payload) > MAX_FIELD_BYTES:
            raise bad(f"form field {name[:64]!r} is over {MAX_FIELD_BYTES} bytes", name[:64])
        fields.setdefault(name, []).append(payload.decode("utf-8", "replace"))
    if not msg.defects and data is None and not fields and body.strip():
        raise bad("the multipart/form-data body holds no fields")
    return fields, data


def _one(fields: dict[str, list[str]], name: str) -> str | None:
    v = fields.get(name)
    return v[-1] if v else None


def _bool(fields, name: str) -> bool:
    v = _one(fields, name)
    if v is None or v.strip().lower() in ("", "false", "0"):
        return False
    if v.strip().lower() in ("true", "1"):
        return True
    raise bad(f"'{name}' must be true or false", name)


def _options(fields: dict[str, list[str]], task: str) -> tuple[TranscribeOptions, str, tuple[str, ...]]:
    """The request's options, its response_format and the timestamp granularities verbose_json
    lists (render's: segments unless only words are asked for)."""
    fmt = (_one(fields, "response_format") or "json").strip()
    if fmt not in FORMATS:
        raise bad(f"'response_format' must be one of {', '.join(FORMATS)}", "response_format")
    language = _one(fields, "language")
    if language is not None and language.strip():
        try:
            language = language_code(language)
        except TranscriptionError:
            raise bad("'language' is not one of Whisper's languages", "language") from None
    else:
        language = None
    temps = FALLBACK
    t = _one(fields, "temperature")
    if t is not None and t.strip():
        try:
            value = float(t)
        except ValueError:
            raise bad("'temperature' must be a number from 0 to 1", "temperature") from None
        if not 0.0 <= value <= 1.0:
            raise bad("'temperature' must be a number from 0 to 1", "temperature")
        temps = FALLBACK if value == 0.0 else (value,)
    granularities = fields.get("timestamp_granularities[]", []) + fields.get("timestamp_granularities", [])
    if len(granularities) > 2:
        raise bad("'timestamp_granularities[]' takes segment, word or both", "timestamp_granularities[]")
    for g in granularities:
        if g not in ("segment", "word"):
            raise bad("'timestamp_granularities[]' takes segment or word", "timestamp_granularities[]")
    words = "word" in granularities
    if words and fmt != "verbose_json":
        raise bad("word timestamps come in 'response_format' verbose_json", "timestamp_granularities[]")
    prompt = _one(fields, "prompt") or None
    timestamps = True if fmt in ("verbose_json", "srt", "vtt") else None
    return TranscribeOptions(language=language, task=task, timestamps=timestamps, temperature=temps,
                             prompt=prompt, word_timestamps=words), fmt, tuple(granularities) or ("segment",)


def _answer(req: Request, state: ServerState, task: str) -> Response:
    """The form's `model` picks the model (on a server of several, loaded first if it is not;
    without one, the server's first speech-to-text model), which must be a Whisper model."""
    state.check_serving()
    speech = speech_models(state)
    if not speech:      # refused before the upload is read
        what = "this model is not" if state.pool is None else "no model of this server is"
        raise bad(f"{what} a speech-to-text model: it cannot answer {req.path} (serve a Whisper checkpoint)")
    fields, data = parse_form(req)
    name = _one(fields, "model")
    if name is None and state.pool is not None:
        name = speech[0]
    with model_state(state, name) as model:
        if not is_transcription(model.engine):
            raise bad(f"the model '{model.ctx.model_names[0]}' is not a speech-to-text model: it cannot answer "
                      f"{req.path} (this server's: {', '.join(speech)})", "model")
        return _transcribe(req, model, fields, data, task)


def _transcribe(req: Request, state: ServerState, fields: dict[str, list[str]], data: bytes | None,
                task: str) -> Response:
    """The request on a Whisper model's state."""
    engine = state.engine
    options, fmt, granularities = _options(fields, task)
    stream = _bool(fields, "stream")
    include_usage = _bool(fields, "stream_include_usage")
    if data is None:
        raise bad("the form has no 'file' field (the audio)", "file")
    try:
        samples = audio.decode_audio(data, "file", AUDIO_LIMITS)
    except audio.AudioError as e:
        raise bad(str(e), "file") from None
    if options.prompt:
        try:
            engine.model.prompt_tokens(options.language or "en", task, False, options.prompt)
        except TranscriptionError as e:
            raise bad(str(e), "prompt") from None
    try:
        job = engine.submit(samples, options)
    except QueueFullError:
        raise ApiError(429, "The server is at capacity (transcription queue full); retry later.",
                       code="queue_full", headers={"Retry-After": str(state.retry_after)}) from None
    except RuntimeError as e:
        raise ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable") from None
    if stream:
        return Response.events(_stream(job, state, task, include_usage), close=job.cancel)
    with state.inflight():
        watch = req.watch(job.cancel) if req.watch is not None else None
        try:
            if watch is not None:
                with watch:
                    result = _wait(job)
            else:
                result = _wait(job)
        finally:
            job.cancel()
    body, ctype = render(result, fmt, granularities)
    return Response(200, body.encode("utf-8"), ctype)


def _wait(job):
    try:
        return job.result()
    except TranscriptionError as e:
        param = str(e).split(":", 1)[0] if ":" in str(e) else None
        raise bad(str(e), param if param in ("language", "prompt", "task", "temperature") else None) from None
    except RuntimeError as e:
        raise ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable") from None


def _stream(job, state: ServerState, task: str, include_usage: bool):
    """vLLM's streamed transcription: a `transcription.chunk` (`translation.chunk`) per window with
    the new text as choices[0].delta.content, a last one with finish_reason "stop", the usage
    when asked, then [DONE]. An error after the first chunk ends the stream with an error event."""
    rid = f"trsc-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = "transcription.chunk" if task == "transcribe" else "translation.chunk"
    model = state.ctx.model_names[0]

    def chunk(content: str | None, finish: str | None, usage: dict | None = None) -> bytes:
        choices = [] if usage is not None else [{"delta": {"content": content} if content is not None else {},
                                                 "finish_reason": finish, "stop_reason": None}]
        out = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return sse(out)

    sent = 0
    tokens = 0
    with state.inflight():
        try:
            for kind, value in job.events():
                if kind == "error":
                    e = value
                    err = bad(str(e)) if isinstance(e, ValueError) else \
                        ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable")
                    yield sse(err.body())
                    break
                segs = value.segments
                new = "".join(s.text for s in segs[sent:])
                tokens += sum(len(s.tokens) for s in segs[sent:])
                sent = len(segs)
                if kind == "window" and new:
                    yield chunk(new, None)
                if kind == "done":
                    yield chunk(None, "stop")
                    if include_usage:
                        yield chunk(None, None, {"prompt_tokens": 0, "completion_tokens": tokens,
                                                 "total_tokens": tokens})
            yield sse("[DONE]")
        finally:
            job.cancel()
