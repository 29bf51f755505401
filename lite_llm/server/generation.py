"""Answering a generation request: a PreparedRequest (openai.prepare_completion / prepare_chat,
or another API's body mapped onto chat) submitted to the engine, one engine request per prompt,
and its deltas turned into one JSON answer or a stream of events.

run_prepared answers in OpenAI's shape, or, given an `api` adapter, in that API's:
api.answer(prep, chat_body) -> the whole answer's body; api.stream(prep, chunks) -> encoded
events, where chunks are answers.stream_chunks' dicts, an ApiError last if the request failed
(responses.py and anthropic.py have one each). The request stays in flight (draining waits for
it) and its client watched (leaving aborts its engine requests) until the transport has written
the answer: the Response's close releases both.
"""
from __future__ import annotations

import logging
import threading
from contextlib import ExitStack
from typing import Any, Callable, Iterator

from lite_llm.engine import beam_search
from lite_llm.engine.async_engine import EngineDeadError, EngineShutdownError, QueueFullError
from lite_llm.sampling_params import RequestOutputKind
from lite_llm.server.answers import Choice, StreamTally, final_response, iter_deltas, sse, stream_chunks
from lite_llm.server.context import PreparedRequest, ServingContext
from lite_llm.server.logprobs import format_logprobs
from lite_llm.server.pooling import refuse_generation
from lite_llm.server.routing import ClientGone, Request, Response, ServerState, Watch
from lite_llm.server.validation import ApiError

logger = logging.getLogger("lite_llm.server")


def generate(req: Request, state: ServerState,
             prepare: Callable[[dict, ServingContext], PreparedRequest]) -> Response:
    """A generation route: its body prepared by `prepare`, answered in OpenAI's shape."""
    state.check_serving()
    refuse_generation(state.engine)
    return run_prepared(req, state, prepare(req.json(), state.ctx))


def run_prepared(req: Request, state: ServerState, prep: PreparedRequest, api: Any = None) -> Response:
    """Submit prep and answer it (see the module's docstring for api)."""
    held = ExitStack()         # unwound by the Response's close, or here if no Response is made
    held.enter_context(state.inflight())
    try:
        state.check_serving()
        if prep.beam is not None:
            response = _beam_answer(req, state, prep, api, held)
            response.close = held.close
            return response
        submitted = submit(req, state, prep, final_only=not prep.stream)
        aborted, finished = threading.Event(), threading.Event()

        def abort_all() -> None:
            aborted.set()
            for rid, _ in submitted:
                state.engine.abort(rid)

        watch = held.enter_context(req.watch(abort_all))
        # an answer that did not finish (client gone, write failed, error) frees its sequences
        held.callback(lambda: None if finished.is_set() or aborted.is_set() else abort_all())
        if prep.stream:
            response = Response.events(close=held.close)      # the stream counts its tokens on it
            response.stream = _events(state, prep, submitted, watch, api, response, finished)
        else:
            response = _answer(state, prep, submitted, watch, api)
            finished.set()
            response.close = held.close
        return response
    except BaseException:
        held.close()
        raise


def submit(req: Request, state: ServerState, prep: PreparedRequest,
           final_only: bool = False) -> list[tuple[str, Any]]:
    """One engine request per prompt -> [(engine request id, its stream of deltas)].
    final_only: the answer is whole, so each engine request hands its output over once."""
    submitted: list[tuple[str, Any]] = []
    params = prep.params.replace(output_kind=RequestOutputKind.FINAL_ONLY) if final_only else prep.params
    try:
        for k, p in enumerate(prep.prompts):
            rid = prep.engine_request_id(k)
            extra = {} if prep.model in state.ctx.model_names else {"lora_request": prep.model}   # an adapter's name
            # its prompts and samples share this request's fair share of slots, and its client's
            # requests together one client's share (the scheduler's "client|request" owners)
            extra["owner"] = f"{req.client}|{prep.id}"
            if p.mm is not None:
                extra["mm"] = p.mm
            stream = state.engine.add_request(rid, p.token_ids, params, prompt=p.text, **extra)
            submitted.append((rid, stream))
    except QueueFullError:
        _abort(state, submitted)
        raise ApiError(429, "The server is at capacity (request queue full); retry later.",
                       code="queue_full", headers={"Retry-After": str(state.retry_after)}) from None
    except ValueError as e:      # the engine's own checks on a request
        _abort(state, submitted)
        raise ApiError(400, str(e)) from None
    except (EngineShutdownError, EngineDeadError) as e:
        _abort(state, submitted)
        raise ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable") from None
    except Exception:
        _abort(state, submitted)
        state.check_serving()       # a stopped engine is a 503, anything else a 500
        raise
    return submitted


def _beam_answer(req: Request, state: ServerState, prep: PreparedRequest, api: Any, held: ExitStack) -> Response:
    """use_beam_search: the search (engine/beam_search.py) run here, each step's beams submitted as
    engine requests of this request's owner; a client leaving aborts the step in flight."""
    lock = threading.Lock()
    current: list[str] = []

    def remember(ids: list[str]) -> None:
        with lock:
            current[:] = ids
        if watch.gone:
            abort_all()

    def abort_all() -> None:
        with lock:
            ids = list(current)
        for rid in ids:
            state.engine.abort(rid)

    watch = held.enter_context(req.watch(abort_all))
    lora = None if prep.model in state.ctx.model_names else prep.model      # an adapter's name
    step = beam_search.engine_step(state.engine, owner=f"{req.client}|{prep.id}", on_submit=remember,
                                   lora_request=lora)
    ctx = state.ctx
    try:
        found = beam_search.search(step, [p.token_ids for p in prep.prompts], prep.beam, ctx.eos_token_ids,
                                   ctx.max_model_len)
    except beam_search.BeamSearchAborted:
        if watch.gone:
            raise ClientGone() from None
        raise _aborted(state) from None
    except QueueFullError:
        raise ApiError(429, "The server is at capacity (request queue full); retry later.",
                       code="queue_full", headers={"Retry-After": str(state.retry_after)}) from None
    except ValueError as e:      # the engine's own checks on a request
        raise ApiError(400, str(e)) from None
    except (EngineShutdownError, EngineDeadError) as e:
        raise ApiError(503, f"the engine is not accepting requests: {e}", code="engine_unavailable") from None
    if watch.gone:
        raise ClientGone()
    n = prep.params.n
    choices: dict[int, Choice] = {}
    for k, hyps in enumerate(found):
        for i, (_, beam, reason) in enumerate(hyps[:n]):
            text = beam_search.finish_text(ctx.tokenizer, beam, reason, prep.beam.include_stop_str_in_output)
            choices[k * n + i] = Choice(text=[text], num_tokens=len(beam.tokens), finish_reason=reason,
                                        stop_reason=None)      # an EOS, as vLLM says it
    body = final_response(prep, choices, ctx.tokenizer)
    tokens = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    return Response.json(body if api is None else api.answer(prep, body), tokens=tokens)


def _abort(state: ServerState, submitted: list[tuple[str, Any]]) -> None:
    for rid, _ in submitted:
        state.engine.abort(rid)


def _answer(state: ServerState, prep: PreparedRequest, submitted: list, watch: Watch, api: Any) -> Response:
    tok = state.ctx.tokenizer
    choices: dict[int, Choice] = {}
    offsets: dict[int, int] = {}
    try:
        deltas = list(iter_deltas(submitted))
    except ValueError as e:             # refused by the engine thread
        raise ApiError(400, str(e)) from None
    except EngineDeadError as e:
        raise ApiError(503, f"the engine failed: {e}", code="engine_dead") from None
    for k, out in deltas:
        if out.prompt_logprobs is not None:
            for i in range(prep.params.n):
                choices.setdefault(k * prep.params.n + i, Choice()).prompt_logprobs = out.prompt_logprobs
        for o in out.outputs:
            index = k * prep.params.n + o.index
            c = choices.setdefault(index, Choice())
            c.text.append(o.text)
            c.num_tokens += len(o.token_ids)
            lps, offsets[index] = format_logprobs(prep, tok, o, offsets.get(index, 0))
            if lps is not None:
                c.logprobs.append(lps)
            if o.finish_reason is not None:
                c.finish_reason, c.stop_reason = o.finish_reason, o.stop_reason
    if watch.gone:
        raise ClientGone()
    if any(c.finish_reason == "abort" for c in choices.values()):
        raise _aborted(state)
    body = final_response(prep, choices, tok)
    tokens = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    return Response.json(body if api is None else api.answer(prep, body), tokens=tokens)


def _aborted(state: ServerState) -> ApiError:
    """An engine request that ended with "abort" (never a finish reason on the wire)."""
    if state.draining:
        return ApiError(503, "the server shut down before the request finished", code="server_draining")
    return ApiError(503, "the engine aborted the request (it cannot fit the KV cache, or the "
                         "engine is stopping)", code="request_aborted")


def _events(state: ServerState, prep: PreparedRequest, submitted: list, watch: Watch, api: Any,
            response: Response, finished: threading.Event) -> Iterator[bytes]:
    """The encoded events of a streamed answer, each checked against the watch before it is
    written; response.tokens kept current for the access log."""
    tally = StreamTally(sum(len(p.token_ids) for p in prep.prompts))
    response.tokens = (tally.num_prompt, 0)
    items = _chunk_items(state, prep, submitted, tally)
    try:
        for data in (api.stream(prep, items) if api is not None else _openai_events(items)):
            if watch.gone:
                raise ClientGone()
            yield data
    finally:
        response.tokens = (tally.num_prompt, tally.num_tokens)
    finished.set()


def _chunk_items(state: ServerState, prep: PreparedRequest, submitted: list,
                 tally: StreamTally) -> Iterator[dict | ApiError]:
    """The request's chunks (answers.stream_chunks), then an ApiError if it was aborted or the
    engine failed mid-stream: each API says so in its own stream."""
    try:
        yield from stream_chunks(prep, iter_deltas(submitted), state.ctx.tokenizer, tally)
        if tally.aborted:
            yield _aborted(state)
    except Exception as e:     # the engine failed mid-stream: say so in the stream itself
        logger.exception("stream %s failed", prep.id)
        yield ApiError(503 if not state.engine_alive() else 500, f"generation failed: {e}")


def _openai_events(items: Iterator[dict | ApiError]) -> Iterator[bytes]:
    for item in items:
        yield sse(item.body() if isinstance(item, ApiError) else item)
    yield sse("[DONE]")
