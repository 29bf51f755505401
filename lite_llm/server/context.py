"""What a request is prepared against and into: ServingContext (the served model's facts and
the server's settings that validation reads), Prompt and PreparedRequest (a validated
completions or chat call, ready for engine.add_request), and the tokenizer's concurrency cap
(TokenizeSlots).
"""
from __future__ import annotations

import hashlib
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from lite_llm import __version__
from lite_llm.sampling_params import SamplingParams
from lite_llm.server.parsers import tool_parser_for
from lite_llm.server.validation import ApiError, bad, show


class TokenizeSlots:
    """At most `limit` long texts tokenized at once (the tokenizer runs off the GIL but on a
    core): a caller waits up to `wait` seconds for a slot, then gets a 503 with Retry-After."""

    LONG_TEXT = 1 << 16      # characters; shorter texts take no slot (microseconds of work)

    def __init__(self, limit: int, retry_after: int = 1, wait: float = 5.0):
        self._sem = threading.BoundedSemaphore(max(1, limit))
        self.retry_after, self.wait = retry_after, wait

    def __enter__(self) -> "TokenizeSlots":
        if not self._sem.acquire(timeout=self.wait):
            raise ApiError(503, "the server is busy tokenizing other long prompts; retry later",
                           code="tokenizer_busy", headers={"Retry-After": str(self.retry_after)})
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sem.release()


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes of text one token can stand for, or None when no such bound holds
    (see Tokenizer.max_bytes_per_token)."""
    fn = getattr(tokenizer, "max_bytes_per_token", None)
    try:
        return fn() if callable(fn) else None
    except Exception:
        return None


def system_fingerprint(info: dict) -> str:
    """fp_<10 hex>: changes when the server version, model, dtype or kernel variant does."""
    key = "|".join(str(x) for x in (__version__, info.get("model_name"), info.get("dtype"),
                                    info.get("kernel_variant"), info.get("weight_bytes")))
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class ServingContext:
    """What validation needs to know about the model being served."""
    model_names: tuple[str, ...]          # the first is the default and the one reported
    max_model_len: int
    vocab_size: int
    tokenizer: Any                        # encode/decode/convert_ids_to_tokens/apply_chat_template
    generation_defaults: dict = field(default_factory=dict)  # SamplingParams kwargs (generation_config.json)
    chat_template: str | None = None      # --chat-template, overriding the model's
    trust_request_chat_template: bool = False   # --trust-request-chat-template: clients may send one
    max_token_bytes: int | None = None    # bytes of text one token can stand for (None: unbounded)
    tokenize_slots: Any = None            # TokenizeSlots, or None for no cap
    reasoning_parser: str | None = None   # --reasoning-parser: "deepseek_r1" | "qwen3" | None
    tool_parser: str | None = None        # --tool-call-parser: one of TOOL_PARSERS | None
    system_fingerprint: str | None = None
    loras: Any = None                     # lora.LoRAManager (`name in loras`) under --enable-lora
    mm_processor: Any = None              # multimodal.Processor of a model that takes images, else None
    media: Any = None                     # multimodal.MediaConfig: image limits and allowed hosts
    default_max_tokens: int | None = None  # --default-max-tokens: output cap of a request naming none
    eos_token_ids: tuple[int, ...] = ()   # what ends a beam of use_beam_search

    def tool_parser_of(self, template: str | None = None) -> str | None:
        """The tool call parser of a chat rendered with template (a request's own, else
        --chat-template, else the model's): --tool-call-parser, else the format the template shows."""
        return self.tool_parser or tool_parser_for(template or self.chat_template
                                                   or getattr(self.tokenizer, "chat_template", None))

    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is None:
            return self.model_names[0]
        if not isinstance(model, str):
            raise bad("'model' must be a string", "model")
        if model not in self.model_names and not (self.loras is not None and model in self.loras):
            raise ApiError(404, f"The model '{show(model)[1:-1]}' does not exist.", "model",
                           code="model_not_found")
        return model


@dataclass(frozen=True)
class Prompt:
    text: str | None
    token_ids: list[int]
    mm: Any = None                    # the prompt's images (multimodal.MMPrompt), placeholders expanded


@dataclass(frozen=True)
class PreparedRequest:
    """A validated /v1/completions or /v1/chat/completions call, ready for engine.add_request."""
    kind: str                         # "completion" | "chat"
    id: str                           # cmpl-... / chatcmpl-...
    created: int
    model: str
    prompts: list[Prompt]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool = False    # vLLM's stream_options.continuous_usage_stats: usage on every chunk
    echo: bool = False
    prompt_logprobs: int | None = None    # vLLM's prompt_logprobs field: returned beside the choices
    logprobs: int | None = None       # top logprobs asked per token; None = no logprobs in the answer
    reasoning_parser: str | None = None   # chat only: split <think>...</think> into reasoning_content
    tool_parser: str | None = None        # chat with tools: a TOOL_PARSERS name (make_tool_parser)
    max_tool_calls: int | None = None     # parallel_tool_calls false: 1 (later calls dropped)
    named_tool: bool = False              # tool_choice named a function: OpenAI finishes with "stop"
    forced_tools: bool = False            # tool_choice required or named: the whole answer is calls
    system_fingerprint: str | None = None
    beam: Any = None                      # use_beam_search: its sampling_params.BeamSearchParams, else None
    # Server-made part of every engine request id: the client's request_id names the response
    # (id), never an engine request alone, so two requests naming the same one both run and
    # neither can refuse, see or abort the other (vLLM adds a random suffix the same way).
    scope: str = field(default_factory=lambda: uuid.uuid4().hex)

    def engine_request_id(self, prompt_index: int) -> str:
        return f"{self.id}-{prompt_index}-{self.scope}"
