"""HTTP routes of pooling models (lite_llm/engine/pooling.py, lite_llm/model/pooler.py): OpenAI's /v1/embeddings, vLLM's
/pooling, /score and /v1/score, and the Jina/Cohere rerank shape on /rerank, /v1/rerank and
/v2/rerank: one handler each (routes.py lists them); auth, framing and errors are the transport's.

Each body is checked whole before any work (a 400 in OpenAI's error shape names the field),
then every input of the request goes to the engine in one submission (PoolingClient.pool), so
its sequences share steps with each other and with concurrent requests.
"""
from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np

from lite_llm.engine import pooling
from lite_llm.engine.pooling import PoolingClient
from lite_llm.model.pooler import PoolingInputError, check_dimensions, finish_embedding
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad

ROUTES = ("/v1/embeddings", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")
# the body fields each kind of route reads (server/openapi.py documents exactly these; others are ignored)
FIELDS = {
    "embeddings": {"model", "input", "encoding_format", "dimensions", "normalize", "truncate_prompt_tokens", "user"},
    "pooling": {"model", "input", "prompt", "encoding_format", "truncate_prompt_tokens"},
    "score": {"model", "text_1", "text_2", "truncate_prompt_tokens"},
    "rerank": {"model", "query", "documents", "top_n", "return_documents", "truncate_prompt_tokens"},
}


def is_pooling(engine: Any) -> bool:
    return isinstance(engine, PoolingClient)


def refuse_generation(engine: Any) -> None:
    """A pooling (or speech-to-text) model asked to generate: a 400 naming its runner."""
    from lite_llm.server.audio_routes import is_transcription
    if is_transcription(engine):
        raise bad("this model runs the 'transcription' runner: it turns speech into text; it cannot generate "
                  "(use /v1/audio/transcriptions or /v1/audio/translations)")
    if is_pooling(engine):
        raise bad("this model runs the 'pooling' runner: it embeds, classifies and scores; "
                  "it cannot generate (use /v1/embeddings, /pooling, /score or /rerank)")


def embeddings(req: Request, state: ServerState) -> Response:
    """POST /v1/embeddings."""
    return _answer(req, state, embeddings_answer)


def pooled(req: Request, state: ServerState) -> Response:
    """POST /pooling."""
    return _answer(req, state, _pooling)


def score(req: Request, state: ServerState) -> Response:
    """POST /score and /v1/score."""
    return _answer(req, state, _score)


def rerank(req: Request, state: ServerState) -> Response:
    """POST /rerank, /v1/rerank and /v2/rerank."""
    return _answer(req, state, _rerank)


def _answer(req: Request, state: ServerState, route: Any) -> Response:
    """The body checked whole, then route(body, engine, ctx) -> (answer, prompt tokens) run."""
    state.check_serving()
    body = req.json()
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    engine = state.engine
    if not is_pooling(engine):
        raise bad(f"this model runs the 'generate' runner: it cannot embed, classify or score ({req.path}); "
                  "serve an embedding or reranking model, or pass --runner pooling")
    _check_model(body, state.ctx)
    with state.inflight():
        try:
            answer, tokens = route(body, engine, state.ctx)
        except PoolingInputError as e:
            raise bad(str(e)) from None
    return Response.json(answer, tokens=(tokens, 0))


def _check_model(body: dict, ctx) -> None:
    model = body.get("model")
    if model is not None and model not in ctx.model_names:
        raise ApiError(404, f"The model '{str(model)[:200]}' does not exist.", "model", code="model_not_found")


def _truncate(body: dict) -> int | None:
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise bad("truncate_prompt_tokens must be -1 or a positive integer", "truncate_prompt_tokens")
    return value


def _inputs(value: Any, field: str, engine, ctx, truncate) -> tuple[list[pooling.PoolItem], int]:
    """OpenAI's `input`: a string, a list of strings, a list of token ids or a list of lists of
    token ids -> (items, prompt tokens)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad(f"'{field}' must be a non-empty string, list of strings or list of token ids", field)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    items = []
    for i, v in enumerate(value):
        what = f"{field}[{i}]" if len(value) > 1 else field
        if isinstance(v, str):
            if not v:
                raise bad(f"{what} is an empty string", field)
            ids = engine.tokenizer.encode(v)
        elif isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            ids = v
        else:
            raise bad(f"{what} must be a string or a list of token ids", field)
        items.append(pooling.make_item(ids, None, vocab_size=ctx.vocab_size, max_model_len=ctx.max_model_len,
                                       truncate_prompt_tokens=truncate, what=what))
    return items, sum(len(it.token_ids) for it in items)


def _encode(vec: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in vec]


def _format(body: dict) -> str:
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad(f"encoding_format {str(fmt)[:50]!r}: expected 'float' or 'base64'", "encoding_format")
    return fmt


def embeddings_answer(body: dict, engine, ctx) -> tuple[dict, int]:
    """(an /v1/embeddings answer, its prompt tokens) of a request body: for any front end."""
    fmt = _format(body)
    spec = engine.spec
    dims = body.get("dimensions")
    try:
        dims = check_dimensions(dims, spec.pooler, spec.config.dim, ctx.model_names[0])
    except PoolingInputError as e:
        raise bad(str(e), "dimensions") from None
    normalize = body.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise bad("normalize must be a boolean", "normalize")
    items, tokens = _inputs(body.get("input"), "input", engine, ctx, _truncate(body))
    rows = engine.pool(items)
    data = [{"object": "embedding", "index": i,
             "embedding": _encode(finish_embedding(r, spec.pooler, dims, normalize), fmt)}
            for i, r in enumerate(rows)]
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": ctx.model_names[0], "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, tokens


def _pooling(body: dict, engine, ctx) -> tuple[dict, int]:
    """vLLM's /pooling: the pooled rows as they come out (no normalization), per input."""
    fmt = _format(body)
    items, tokens = _inputs(body.get("input", body.get("prompt")), "input", engine, ctx, _truncate(body))
    rows = engine.pool(items)
    data = [{"object": "pooling", "index": i, "data": _encode(r, fmt)} for i, r in enumerate(rows)]
    return {"id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": ctx.model_names[0], "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, tokens


def _texts(value: Any, field: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad(f"'{field}' must be a non-empty string or list of strings", field)
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise bad(f"{field}[{i}] must be a string", field)
        if not v:
            raise bad(f"{field}[{i}] is an empty string", field)
    return value


def _score(body: dict, engine, ctx) -> tuple[dict, int]:
    """vLLM's /score: text_1 (one, or as many as text_2) against each of text_2."""
    t1, t2 = _texts(body.get("text_1"), "text_1"), _texts(body.get("text_2"), "text_2")
    if len(t1) != 1 and len(t1) != len(t2):
        raise bad(f"text_1 has {len(t1)} texts and text_2 {len(t2)}: give one text_1 or as many as text_2", "text_1")
    pairs = pooling.score_pairs(engine, t1, t2, truncate_prompt_tokens=_truncate(body))
    tokens = sum(len(ids) for ids, _ in pairs)
    data = [{"index": i, "object": "score", "score": s} for i, (_, s) in enumerate(pairs)]
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": ctx.model_names[0], "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, tokens


def _rerank(body: dict, engine, ctx) -> tuple[dict, int]:
    """Jina / Cohere rerank: query, documents (strings or {"text": ...}), top_n, return_documents."""
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad("'query' must be a non-empty string", "query")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise bad("'documents' must be a non-empty list", "documents")
    texts = [d.get("text") if isinstance(d, dict) else d for d in docs]
    texts = _texts(texts, "documents")
    top_n = body.get("top_n", len(texts))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise bad("top_n must be a non-negative integer", "top_n")
    return_documents = body.get("return_documents", True)
    pairs = pooling.score_pairs(engine, query, texts, truncate_prompt_tokens=_truncate(body))
    tokens = sum(len(ids) for ids, _ in pairs)
    order = sorted(range(len(pairs)), key=lambda i: -pairs[i][1])[:top_n or len(pairs)]
    results = []
    for i in order:
        r = {"index": i, "relevance_score": pairs[i][1]}
        if return_documents:
            r["document"] = {"text": texts[i]}
        results.append(r)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": ctx.model_names[0], "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, tokens

