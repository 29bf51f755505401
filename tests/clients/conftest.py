"""Client conformance fixtures: a server whose answers the test writes, and no network.

`book_server(book)` serves the real engine and HTTP server over BookRunner, a fake model
that answers from `book` ({cue: answer text}): the cue found latest in the rendered prompt
picks the answer, so a question and, after a tool result, the answer to that result come from
one book. Under a grammar (response_format, a forced tool call) the answer is followed while
the grammar allows its tokens; from the first token it refuses, the fake model ends where the
grammar lets it and otherwise picks among the tokens the grammar allows (ServerRunner's hashed
choice), so what a grammar lets through shows in the answer. The chat template is Qwen2.5's
tool template (tests/server/test_tool_calls.py): tools in a system turn, calls as Hermes
<tool_call> blocks.

Every client here talks only to 127.0.0.1: telemetry, tracing and litellm's remote price list
are turned off by environment variables, set when this conftest is imported (before the test
modules import the libraries) or, for the generic ones, by an autouse fixture for these tests.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any

import numpy as np
import pytest

from lite_llm.server.app import create_server
from tests.server.conftest import make_tokenizer
from tests.server.fake_model import ServerRunner, fake_runner_engine, hashed_token
from tests.server.test_tool_calls import TOOL_TEMPLATE

MODEL = "tiny"
MAX_MODEL_LEN = 4096          # room for the tool schemas and instructions libraries add to prompts
# read when the libraries are imported (litellm loads its price list then), so set before the
# test modules are: each name is one library's own, nothing else in the session reads them
for _name, _value in {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",      # litellm: the bundled price list, not a download
        "LITELLM_TELEMETRY": "False",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",        # openai-agents: no trace export
        "OPENAI_AGENTS_DONT_LOG_MODEL_DATA": "1",
        "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",
        "LOGFIRE_IGNORE_NO_CONFIG": "1"}.items():   # pydantic-ai's instrumentation stays off
    os.environ.setdefault(_name, _value)
RUN_ENV = {"OTEL_SDK_DISABLED": "true", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(autouse=True, scope="session")
def offline_clients():
    """No exporter, tracker or hub download while these tests run."""
    saved = {k: os.environ.get(k) for k in RUN_ENV}
    os.environ.update(RUN_ENV)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class BookRunner(ServerRunner):
    """Each request answers book[cue] (then EOS) for the cue whose last occurrence in the
    prompt comes latest; a prompt without a cue answers NO_CUE."""
    book: dict[str, str] = {}
    NO_CUE = "No cue in the prompt."

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any):
        super().__init__(tokenizer, *args, **kwargs)
        self.eos = tokenizer.eos_token_id
        self.answers = {cue: tokenizer.encode(text, add_special_tokens=False) + [self.eos]
                        for cue, text in {**self.book, None: self.NO_CUE}.items()}
        self.plans: dict[str, list[int]] = {}      # request id -> the answer it follows
        self.astray: set[str] = set()              # requests a grammar turned off their answer

    def _plan(self, request) -> list[int]:
        plan = self.plans.get(request.request_id)
        if plan is None:
            prompt = self.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
            found = [(prompt.rfind(cue), cue) for cue in self.book if cue in prompt]
            plan = self.plans[request.request_id] = self.answers[max(found)[1] if found else None]
        return plan

    def _grammar_allows(self, row: int, token: int) -> bool:
        if self._masks is None or self._masks[1][row] < 0:
            return True
        bitmask, mask_rows = self._masks
        word = int(bitmask[mask_rows[row]].view(np.uint32)[token // 32])
        return bool(word >> (token % 32) & 1)

    def choose(self, request, tokens: list[int], row: int) -> int:
        plan = self._plan(request)
        step = request.num_output_tokens
        want = plan[step] if step < len(plan) else self.eos
        if request.request_id not in self.astray:
            if self._grammar_allows(row, want):
                return want
            self.astray.add(request.request_id)
        if self._grammar_allows(row, self.eos):      # off its answer, the model stops where it may
            return self.eos
        return hashed_token(tokens, None, self.allowed(row))


@contextlib.contextmanager
def book_server(book: dict[str, str], **server_kwargs: Any):
    """A started server (model name MODEL) answering from book; drained at the end."""
    runner = type("Runner", (BookRunner,), {"book": dict(book)})
    tok = make_tokenizer()
    engine = fake_runner_engine(tok, runner_cls=runner, step_seconds=0.0002, max_model_len=MAX_MODEL_LEN)
    kwargs = {"chat_template": TOOL_TEMPLATE, "request_timeout": 30.0, **server_kwargs}
    server = create_server(engine, tok, MODEL, MAX_MODEL_LEN, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.drain(2.0)


# ---- answers the books share ---------------------------------------------------------------

HELLO = "Hello there! How are you today?"
RESULT = "It is 21 degrees in Paris."            # the answer once the weather tool's result is in
WEATHER_RESULT = '{"temp_c": 21}'                # what the weather tool returns (its cue: temp_c)
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def call(name: str, arguments: dict) -> str:
    """A Hermes tool call as the template teaches the model to write it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


PARIS = {"city": "Paris"}
ADA = '{"name": "Ada", "age": 36}'
# the answers every client's suite scripts alike; a module adds its own: {**COMMON_BOOK, ...}
COMMON_BOOK = {
    "Say hello": HELLO,
    "Weather in Paris?": "Let me check.\n" + call("get_weather", PARIS),
    "Call the weather tool": call("get_weather", PARIS),
    "temp_c": RESULT,
    "Who is Ada?": ADA,
}


def tokens_of(text: str) -> int:
    """How many tokens the fake model takes to write text."""
    return len(_tokenizer().encode(text, add_special_tokens=False))


@functools.cache
def _tokenizer():
    return make_tokenizer()
