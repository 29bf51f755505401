"""vLLM's extra generation routes: POST /v1/chat/completions/batch (several conversations in one
body, one choice per conversation) and SageMaker's POST /invocations (a chat, batch or
completion body, told apart by its shape). Both run through openai.prepare_chat /
prepare_completion and generation.run_prepared like the OpenAI routes; /ping (GET and POST, no
key) is routes.py's health route.
"""
from __future__ import annotations

import dataclasses
from lite_llm.server import generation, openai, validation
from lite_llm.server.context import PreparedRequest, ServingContext
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import bad

MAX_CONVERSATIONS = validation.MAX_PROMPTS


def prepare_chat_batch(body: dict, ctx: ServingContext) -> PreparedRequest:
    """vLLM's BatchChatCompletionRequest: the chat fields with 'messages' a list of conversations;
    not streamed, no tools, n = 1. Each conversation is prepared as its own chat request; the
    batch shares their sampling parameters, max_tokens fitting the longest prompt."""
    conversations = body.get("messages")
    if not isinstance(conversations, list) or not conversations \
            or not all(isinstance(c, list) and c for c in conversations):
        raise bad("'messages' must be a non-empty list of conversations (each a non-empty list of messages)",
                  "messages")
    if len(conversations) > MAX_CONVERSATIONS:
        raise bad(f"at most {MAX_CONVERSATIONS} conversations per request", "messages")
    if validation.get_bool(body, "stream", False):
        raise bad("Batch chat completions do not support streaming: drop 'stream'", "stream")
    if body.get("tools") or body.get("tool_choice") not in (None, "none"):
        raise bad("Batch chat completions do not support tools", "tools")
    if body.get("n") not in (None, 1):
        raise bad("Batch chat completions do not support n > 1", "n")
    preps: list[PreparedRequest] = []
    pixels: list[int] = []      # the batch's images, all conversations', share one pixel bound
    for i, conversation in enumerate(conversations):
        try:
            preps.append(openai.prepare_chat({**body, "messages": conversation}, ctx, pixels))
        except validation.ApiError as e:
            if e.param and e.param.startswith("messages"):
                e.param = f"messages[{i}]" + e.param[len("messages"):]
            raise
    first = preps[0]
    params = dataclasses.replace(first.params, max_tokens=min(p.params.max_tokens for p in preps))
    beam = first.beam and dataclasses.replace(first.beam, max_tokens=params.max_tokens)
    return dataclasses.replace(first, prompts=[p.prompts[0] for p in preps], params=params, beam=beam)


def chat_batch(req: Request, state: ServerState) -> Response:
    """POST /v1/chat/completions/batch."""
    return generation.generate(req, state, prepare_chat_batch)


def invocations(req: Request, state: ServerState) -> Response:
    """POST /invocations (SageMaker): 'messages' -> chat (a list of conversations -> batch),
    'prompt' -> completion."""
    state.check_serving()
    body = req.json()
    messages = body.get("messages")
    if messages is not None and "prompt" not in body:
        batch = isinstance(messages, list) and bool(messages) and isinstance(messages[0], list)
        prepare = prepare_chat_batch if batch else openai.prepare_chat
    elif "prompt" in body and messages is None:
        prepare = openai.prepare_completion
    else:
        raise bad("/invocations takes a chat body ('messages') or a completion body ('prompt')", "messages")
    return generation.run_prepared(req, state, prepare(body, state.ctx))
