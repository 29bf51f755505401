"""THE route table of `serve` (route_table), and the handlers of the server's own small routes:
models, health, version, metrics, the OpenAPI document, the web pages, tokenize, and the OpenAI
generation routes (answered by generation.py).

Each route is (method, path, handler, auth, probe, error shape, OpenAPI operation); a handler is
`handler(req, state) -> Response` (routing.py). The other APIs' handlers live in their modules
(responses.py, anthropic.py, ollama.py, vllm_routes.py, pooling.py, audio_routes.py, lora_routes.py) and are
listed here.
Adding a route: its handler, one line below, its body schemas in openapi.py, README.
"""
from __future__ import annotations

import logging

from lite_llm import __version__
from lite_llm.server import (anthropic, audio_routes, generation, lora_routes, ollama, openai, pooling, responses,
                             vllm_routes, webui)
from lite_llm.server import models as models_pool
from lite_llm.server.openapi import (audio_op, get_op, health_op, invocations_op, model_op, ollama_op, openapi_document,
                                     post_op, response_op)
from lite_llm.server.routing import Request, Response, Route, RouteTable, ServerState
from lite_llm.server.validation import ApiError, show

logger = logging.getLogger("lite_llm.server")


def route_table(web_ui: bool = True, metrics_no_auth: bool = False) -> RouteTable:
    """Every route the server answers. web_ui: the pages at / and /dashboard and their files
    (open: they hold no data; every call they make sends the key typed into them);
    metrics_no_auth: /metrics without the API key (--metrics-no-auth)."""
    anthropic_error = anthropic.error_body
    ollama_error = ollama.error_body
    messages_events = "`event: message_start` ... `event: message_stop` (Anthropic's)"
    routes = [
        Route("GET", "/v1/models", models, probe=True, doc=get_op("List the served models", "ModelList")),
        Route("GET", "/v1/models/{model:path}", model, doc=model_op()),
        Route("POST", "/v1/completions", completions,
              doc=post_op("Text completion", "CompletionRequest", "CompletionResponse", stream=True)),
        Route("POST", "/v1/chat/completions", chat,
              doc=post_op("Chat completion", "ChatCompletionRequest", "ChatCompletionResponse", stream=True)),
        Route("POST", "/tokenize", tokenize,
              doc=post_op("Text or messages to token ids", "TokenizeRequest", "TokenizeResponse", stream=False)),
        Route("POST", "/detokenize", detokenize,
              doc=post_op("Token ids to text", "DetokenizeRequest", "DetokenizeResponse", stream=False)),
        Route("POST", "/v1/chat/completions/batch", vllm_routes.chat_batch,
              doc=post_op("vLLM's batch: one choice per conversation", "ChatCompletionBatchRequest",
                          "ChatCompletionResponse", stream=False)),
        Route("POST", "/invocations", vllm_routes.invocations, doc=invocations_op()),
        Route("POST", "/v1/responses", responses.create,
              doc=post_op("OpenAI Responses", "ResponsesRequest", "Response", stream=True,
                          events="`event: response.created` ... `event: response.completed`, typed events")),
        Route("GET", "/v1/responses/{response_id}", responses.retrieve,
              doc=response_op("A stored response", "Response", (404,))),
        Route("DELETE", "/v1/responses/{response_id}", responses.delete,
              doc=response_op("Forget a stored response", "DeletedResponse", (404,))),
        Route("POST", "/v1/responses/{response_id}/cancel", responses.cancel,
              doc=response_op("Cancel a background response", "Response", (400, 404))),
        Route("POST", "/v1/messages", anthropic.messages, error=anthropic_error,
              doc=post_op("Anthropic Messages", "MessagesRequest", "Message", stream=True,
                          shape="AnthropicError", events=messages_events)),
        Route("POST", "/v1/messages/count_tokens", anthropic.count_tokens, error=anthropic_error,
              doc=post_op("Anthropic: tokens a Messages request's input takes", "CountTokensRequest",
                          "TokenCount", stream=False, shape="AnthropicError")),
        Route("POST", "/v1/audio/transcriptions", audio_routes.transcriptions,
              doc=audio_op("OpenAI audio transcription (Whisper models)"), body_limit=audio_routes.upload_limit),
        Route("POST", "/v1/audio/translations", audio_routes.translations,
              doc=audio_op("OpenAI audio translation to English (Whisper models)"), body_limit=audio_routes.upload_limit),
        Route("POST", "/v1/embeddings", pooling.embeddings,
              doc=post_op("OpenAI embeddings (pooling models)", "EmbeddingRequest", "EmbeddingResponse",
                          stream=False)),
        Route("POST", "/pooling", pooling.pooled,
              doc=post_op("vLLM's pooling: each input's pooled row, unnormalized", "PoolingRequest",
                          "PoolingResponse", stream=False)),
        *(Route("POST", path, pooling.score,
                doc=post_op("vLLM's score: text_1 against each text_2 (a cross-encoder, or cosine of embeddings)",
                            "ScoreRequest", "ScoreResponse", stream=False)) for path in ("/score", "/v1/score")),
        *(Route("POST", path, pooling.rerank,
                doc=post_op("Jina / Cohere rerank: documents by relevance to the query", "RerankRequest",
                            "RerankResponse", stream=False)) for path in ("/rerank", "/v1/rerank", "/v2/rerank")),
        Route("POST", "/v1/load_lora_adapter", lora_routes.load_adapter,
              doc=post_op("vLLM's: load a LoRA adapter (with --enable-lora; 404 without)",
                          "LoadLoraAdapterRequest", "LoraAdapterResponse", stream=False)),
        Route("POST", "/v1/unload_lora_adapter", lora_routes.unload_adapter,
              doc=post_op("vLLM's: unload a LoRA adapter (running requests finish with it)",
                          "UnloadLoraAdapterRequest", "LoraAdapterResponse", stream=False)),
        # Ollama's API (ollama.py): its own error shape, NDJSON streams
        Route("POST", "/api/chat", ollama.chat, error=ollama_error,
              doc=ollama_op("Ollama: chat", "OllamaChatRequest", "OllamaChatResponse", stream=True)),
        Route("POST", "/api/generate", ollama.generate, error=ollama_error,
              doc=ollama_op("Ollama: generate from a prompt", "OllamaGenerateRequest", "OllamaGenerateResponse",
                            stream=True)),
        Route("POST", "/api/embed", ollama.embed, error=ollama_error,
              doc=ollama_op("Ollama: embeddings (pooling models)", "OllamaEmbedRequest", "OllamaEmbedResponse")),
        Route("POST", "/api/embeddings", ollama.embeddings, error=ollama_error,
              doc=ollama_op("Ollama's older embeddings route", "OllamaEmbeddingsRequest", "OllamaEmbeddingsResponse")),
        Route("GET", "/api/tags", ollama.tags, error=ollama_error,
              doc=ollama_op("Ollama: the served models", None, "OllamaModels")),
        Route("GET", "/api/ps", ollama.ps, error=ollama_error,
              doc=ollama_op("Ollama: the loaded models", None, "OllamaModels")),
        Route("POST", "/api/show", ollama.show, error=ollama_error,
              doc=ollama_op("Ollama: a model's details, capabilities and template", "OllamaShowRequest",
                            "OllamaShowResponse")),
        Route("GET", "/api/version", ollama.version, error=ollama_error, probe=True,
              doc=ollama_op("Ollama: the server's version", None, "OllamaVersion")),
        Route("POST", "/api/pull", ollama.pull, error=ollama_error,
              doc=ollama_op("Ollama: fetch a Hugging Face model into the local cache", "OllamaPullRequest",
                            "OllamaProgress", stream=True)),
        Route("GET", "/ping", health, auth=False, probe=True, doc=health_op("SageMaker's health check: as /health")),
        Route("POST", "/ping", health, auth=False, probe=True, doc=health_op("As GET /ping")),
        Route("GET", "/health", health, auth=False, probe=True,
              doc=health_op("200 while serving, 503 when draining or the engine stopped")),
        Route("GET", "/version", version, probe=True, doc=get_op("Server version and kernel variant", "Version")),
        Route("GET", "/metrics", metrics, auth=not metrics_no_auth, probe=True,
              doc=get_op("Prometheus metrics", {"type": "string"}, media="text/plain")),
        Route("GET", "/openapi.json", openapi, doc=get_op("This document", {"type": "object"})),
        Route("GET", "/v1/engine/stats", engine_stats,
              doc=get_op("Engine counters, histograms and the live window (rates, per-thread busy, bandwidth) "
                         "the dashboard charts", {"type": "object"})),
    ]
    if web_ui:
        routes += [Route("GET", path, web, auth=False) for path in webui.PAGES]
        routes.append(Route("GET", webui.STATIC_PREFIX + "{file:path}", web, auth=False, log_path=True))
    return RouteTable(routes)


# ---- the server's own routes -------------------------------------------------------------------

def model_card(state: ServerState, name: str) -> dict:
    # root names the model, never a filesystem path of this machine
    return {"id": name, "object": "model", "created": state.started, "owned_by": "lite-llm",
            "root": state.model_root or state.ctx.model_names[0], "parent": None,
            "max_model_len": state.ctx.max_model_len}


def models(req: Request, state: ServerState) -> Response:
    """GET /v1/models: the served names, then the loaded LoRA adapters (several models: each
    loaded or not, and its memory)."""
    if state.pool is not None:
        return Response.json({"object": "list", "data": models_pool.model_cards(state, model_card)})
    return Response.json({"object": "list", "data": [model_card(state, name) for name in state.ctx.model_names]
                          + lora_routes.model_cards(state)})


def model(req: Request, state: ServerState) -> Response:
    """GET /v1/models/{model}."""
    name = req.route_arg
    card = next((c for c in lora_routes.model_cards(state) if c["id"] == name), None)
    if card is not None:
        return Response.json(card)
    if name not in state.ctx.model_names:
        raise ApiError(404, f"The model '{show(name)[1:-1]}' does not exist.", "model", code="model_not_found")
    if state.pool is not None:
        return Response.json(next(c for c in models_pool.model_cards(state, model_card) if c["id"] == name))
    return Response.json(model_card(state, name))


def health(req: Request, state: ServerState) -> Response:
    """/health and /ping: 200 while serving; 503 when draining or the engine stopped."""
    state.check_serving()
    return Response(200, b"", "text/plain")


def version(req: Request, state: ServerState) -> Response:
    info = state.kernel_info
    return Response.json({"version": __version__, "kernel_variant": info.get("kernel_variant"),
                          "num_threads": info.get("num_threads")})


def metrics(req: Request, state: ServerState) -> Response:
    engine, stats, replicas = state.engine, None, None
    try:
        if hasattr(engine, "replica_stats"):      # data parallel: a series per replica
            replicas = engine.replica_stats()
        else:
            stats = engine.stats()
    except Exception:         # a dead engine still lets us export what we observed
        logger.exception("engine.stats() failed")
    text = state.metrics.render(stats, replicas)
    return Response(200, text.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")


def web(req: Request, state: ServerState) -> Response:
    """The web pages and their files (webui.py)."""
    found = webui.web_file(req.path)
    if found is None:
        raise ApiError(404, f"Not Found: {req.method} {req.path[:200]}", code="not_found")
    return Response(200, found[0], found[1], dict(webui.HEADERS))


def engine_stats(req: Request, state: ServerState) -> Response:
    """GET /v1/engine/stats: what the dashboard polls."""
    stats = None
    try:
        stats = state.engine.stats()
    except Exception:
        logger.exception("engine.stats() failed")
    out = webui.engine_stats(stats, state.kernel_info, state.ctx.model_names)
    out["memory"] = models_pool.memory_view(state)
    return Response.json(out)


def openapi(req: Request, state: ServerState) -> Response:
    ctx = state.ctx
    return Response.json(openapi_document(__version__, state.routes, api_key=state.api_key is not None,
                                          pooling=pooling.is_pooling(state.engine), vocab_size=ctx.vocab_size,
                                          audio=bool(audio_routes.speech_models(state)),
                                          max_model_len=ctx.max_model_len, images=ctx.mm_processor is not None,
                                          request_templates=ctx.trust_request_chat_template,
                                          tools=ctx.tool_parser_of() is not None))


def tokenize(req: Request, state: ServerState) -> Response:
    return Response.json(openai.tokenize(req.json(), state.ctx))


def detokenize(req: Request, state: ServerState) -> Response:
    return Response.json(openai.detokenize(req.json(), state.ctx))


def completions(req: Request, state: ServerState) -> Response:
    return generation.generate(req, state, openai.prepare_completion)


def chat(req: Request, state: ServerState) -> Response:
    return generation.generate(req, state, openai.prepare_chat)
