"""openai-agents' Runner (Chat Completions and Responses models, whole and streamed) over real
HTTP against a scripted model that calls its tool until a tool result is in its prompt, then
answers: what the tool runs per agent run under tool_choice "required", parallel_tool_calls
false and a named tool_choice, the call ids, and the calls and results round-tripped into the
next prompt. The scripted model writes its call three times in one answer, as the default
model does in about one forced answer of three (a repeated call, not a server echo): each call
the model writes runs, as against OpenAI; parallel_tool_calls false or a named tool_choice
makes it one."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from lite_llm.server.app import create_server

from .conftest import make_tokenizer
from .fake_model import GuidedScriptedRunner, fake_runner_engine
from .test_responses_api import Recording
from .test_tool_calls import CALL, TOOL_TEMPLATE

REPEATS = 3
MAX_MODEL_LEN = 2048            # the agent's tool schema and three round-tripped calls fit


class AgentRunner(GuidedScriptedRunner):
    """Until a tool result is in the prompt: the same get_weather call REPEATS times; then a sentence."""
    calls = "\n".join([CALL] * REPEATS) + "<|im_end|>"
    answer = "It is sunny in Paris.<|im_end|>"

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any):
        super().__init__(tokenizer, *args, **kwargs)
        self.scripts = {"calls": tokenizer.encode(self.calls, add_special_tokens=False),
                        "answer": tokenizer.encode(self.answer, add_special_tokens=False)}
        self.chosen: dict[str, list[int]] = {}

    def choose(self, request, tokens: list[int], row: int) -> int:
        if request.request_id not in self.chosen:
            prompt = self.tokenizer.decode(request.prompt_token_ids)
            self.chosen[request.request_id] = self.scripts["answer" if "<tool_response>" in prompt else "calls"]
        self.script_ids = self.chosen[request.request_id]
        return super().choose(request, tokens, row)


@pytest.fixture(scope="module")
def agent_server():
    """(server, Recording engine) with the Qwen-style tool template (hermes calls)."""
    set_tracing_disabled(True)
    tok = make_tokenizer()
    engine = Recording(fake_runner_engine(tok, runner_cls=AgentRunner, step_seconds=0.0005,
                                          max_model_len=MAX_MODEL_LEN))
    server = create_server(engine, tok, "tiny", MAX_MODEL_LEN, chat_template=TOOL_TEMPLATE)
    server.start()
    try:
        yield server, engine
    finally:
        server.drain(2.0)


def _run(server, api: str, stream: bool, **settings: Any) -> tuple[list[str], Any]:
    """(the cities the tool ran for, the run's result) of one agent run."""
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        ran.append(city)
        return "sunny"

    async def go():
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)
        model = (OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel)("tiny", client)
        agent = Agent(name="weather", instructions="Use tools.", tools=[get_weather], model=model,
                      model_settings=ModelSettings(temperature=0, max_tokens=400, **settings))
        if not stream:
            return await Runner.run(agent, "Weather in Paris?", max_turns=4)
        result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    return ran, asyncio.run(go())


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_required_runs_each_call_the_model_wrote_once_then_answers(agent_server, api, stream):
    server, engine = agent_server
    del engine.prompts[:]
    ran, result = _run(server, api, stream, tool_choice="required")
    assert ran == ["Paris"] * REPEATS and result.final_output == "It is sunny in Paris."
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i.raw_item for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    ids = [c.call_id if hasattr(c, "call_id") else c["call_id"] for c in calls]
    assert len(set(ids)) == REPEATS and sorted(o["call_id"] for o in outputs) == sorted(ids)
    # two requests: the forced one, then (the SDK resets tool_choice after a tool ran) an auto one
    # whose prompt holds every call and every result
    assert len(engine.prompts) == 2
    assert engine.prompts[1].count("<tool_call>") == REPEATS and engine.prompts[1].count("<tool_response>") == REPEATS


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("settings", [{"tool_choice": "required", "parallel_tool_calls": False},
                                      {"tool_choice": "get_weather"}], ids=["no-parallel", "named"])
def test_one_call_per_turn_when_asked_runs_the_tool_once(agent_server, api, settings):
    server, _ = agent_server
    ran, result = _run(server, api, False, **settings)
    assert ran == ["Paris"] and result.final_output == "It is sunny in Paris."
