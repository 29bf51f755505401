"""The Responses stream as OpenAI sends it, over real HTTP on a scripted model: the openai SDK's
`responses.stream()` helper (its text snapshots, its final response) and the raw typed events
(order, sequence_number, output_index, content_index, item ids). An item opens with no content
and its part with no text, so every character arrives in a delta exactly once; an answer cut at
max_output_tokens ends with response.incomplete, the cut item "incomplete"."""
from __future__ import annotations

import json

import openai
import pytest

from .conftest import request
from .fake_model import ScriptedRunner
from .test_hardening import scripted_server

ANSWER = "Hello there! How are you today?"


class AnswerRunner(ScriptedRunner):
    """Answers ANSWER, then the end-of-turn token (the tokenizer's EOS)."""
    script = ANSWER + "<|im_end|>"


class ThinkingRunner(ScriptedRunner):
    script = "<think>I should greet.</think>" + ANSWER + "<|im_end|>"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30)


def _raw_events(server, body: dict) -> list[dict]:
    """Every SSE event of a streamed /v1/responses call: its `event:` name must be its data's type."""
    status, headers, data = request(server.port, "POST", "/v1/responses", {"model": "tiny", "stream": True,
                                                                           "temperature": 0, **body})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), data
    events = []
    for block in data.decode("utf-8").split("\n\n"):
        if not block:
            continue
        name, payload = block.split("\n")
        assert name.startswith("event: ") and payload.startswith("data: ")
        event = json.loads(payload[len("data: "):])
        assert event["type"] == name[len("event: "):]
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _text_item_events(events: list[dict], output_index: int, kind: str) -> tuple[list[dict], str]:
    """Checks one text item's events as OpenAI orders them (added, part added, deltas, text done,
    part done, item done), all naming the same item and indexes; returns them and the item's text."""
    delta, done_type, part_type = (("response.output_text.delta", "response.output_text.done", "output_text")
                                   if kind == "message" else
                                   ("response.reasoning_text.delta", "response.reasoning_text.done",
                                    "reasoning_text"))
    mine = [e for e in events if e.get("output_index") == output_index]
    added, part_added = mine[0], mine[1]
    assert added["type"] == "response.output_item.added" and added["item"]["type"] == kind
    assert added["item"]["content"] == [] and added["item"]["status"] == "in_progress"
    item_id = added["item"]["id"]
    assert part_added["type"] == "response.content_part.added"
    assert part_added["part"]["type"] == part_type and part_added["part"]["text"] == ""
    deltas = mine[2:-3]
    assert deltas and all(e["type"] == delta for e in deltas)
    text = "".join(e["delta"] for e in deltas)
    text_done, part_done, item_done = mine[-3:]
    assert [text_done["type"], part_done["type"], item_done["type"]] == [
        done_type, "response.content_part.done", "response.output_item.done"]
    assert text_done["text"] == part_done["part"]["text"] == text
    assert item_done["item"]["content"] == [part_done["part"]] and item_done["item"]["id"] == item_id
    for e in mine[1:-1]:
        assert (e["item_id"], e["output_index"], e["content_index"]) == (item_id, output_index, 0), e
    return mine, text


def test_sdk_stream_helper_snapshots_and_final_response():
    with scripted_server(AnswerRunner) as (server, _):
        client = _client(server)
        with client.responses.stream(model="tiny", input="Hi", temperature=0, max_output_tokens=100) as stream:
            events = list(stream)
            final = stream.get_final_response()
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) > 3
        so_far = ""
        for e in deltas:                     # the helper's snapshot is the text so far, no more
            so_far += e.delta
            assert e.snapshot == so_far
        assert so_far == ANSWER
        assert [e.text for e in events if e.type == "response.output_text.done"] == [ANSWER]
        assert events[-1].type == "response.completed" and final.status == "completed"
        assert final.output_text == ANSWER and final.incomplete_details is None
        assert len(final.output) == 1 and final.output[0].status == "completed"
        assert [c.text for c in final.output[0].content] == [ANSWER]


def test_sdk_stream_helper_at_max_output_tokens_ends_incomplete():
    with scripted_server(AnswerRunner) as (server, _):
        client = _client(server)
        with client.responses.stream(model="tiny", input="Hi", temperature=0, max_output_tokens=4) as stream:
            events = list(stream)
            # the helper keeps only a response.completed; OpenAI ends a cut answer with response.incomplete
            with pytest.raises(RuntimeError, match="response.completed"):
                stream.get_final_response()
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text and ANSWER.startswith(text) and text != ANSWER
        assert [e.snapshot for e in events if e.type == "response.output_text.delta"][-1] == text
        assert "response.completed" not in [e.type for e in events]
        last = events[-1]
        assert last.type == "response.incomplete"
        r = last.response
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert r.output_text == text and r.usage.output_tokens == 4 and r.completed_at is None
        assert [(o.type, o.status) for o in r.output] == [("message", "incomplete")]
        # the stored response says the same
        assert client.responses.retrieve(r.id).model_dump() == r.model_dump()


def test_raw_event_sequence_of_a_message():
    with scripted_server(AnswerRunner) as (server, _):
        events = _raw_events(server, {"input": "Hi", "max_output_tokens": 100})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    for e in events[:2]:
        assert e["response"]["status"] == "in_progress" and e["response"]["output"] == []
        assert e["response"]["usage"] is None
    mine, text = _text_item_events(events, 0, "message")
    assert text == ANSWER and kinds == kinds[:2] + [e["type"] for e in mine] + ["response.completed"]
    assert mine[0]["item"] == {"id": mine[0]["item"]["id"], "type": "message", "role": "assistant",
                               "status": "in_progress", "content": []}
    assert mine[1]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert mine[0]["item"]["id"].startswith("msg_")
    done_item = mine[-1]["item"]
    assert done_item["status"] == "completed"
    r = events[-1]["response"]
    assert r["status"] == "completed" and r["output"] == [done_item] and r["incomplete_details"] is None
    assert r["usage"]["output_tokens"] > 0 and r["id"] == events[0]["response"]["id"]


def test_raw_event_sequence_at_max_output_tokens():
    with scripted_server(AnswerRunner) as (server, _):
        events = _raw_events(server, {"input": "Hi", "max_output_tokens": 3})
    mine, text = _text_item_events(events, 0, "message")
    assert [e["type"] for e in events] == ["response.created", "response.in_progress"] + [
        e["type"] for e in mine] + ["response.incomplete"]
    assert mine[-1]["item"]["status"] == "incomplete" and ANSWER.startswith(text)
    r = events[-1]["response"]
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"] == [mine[-1]["item"]] and r["usage"]["output_tokens"] == 3


def test_raw_event_sequence_of_reasoning_then_message():
    with scripted_server(ThinkingRunner, reasoning_parser="qwen3") as (server, _):
        events = _raw_events(server, {"input": "Hi", "max_output_tokens": 100})
        with _client(server).responses.stream(model="tiny", input="Hi", temperature=0,
                                              max_output_tokens=100) as stream:
            final = stream.get_final_response()
    reasoning, thought = _text_item_events(events, 0, "reasoning")
    message, text = _text_item_events(events, 1, "message")
    assert thought == "I should greet." and text == ANSWER
    assert reasoning[0]["item"]["summary"] == [] and reasoning[0]["item"]["id"].startswith("rs_")
    assert [e["type"] for e in events] == ["response.created", "response.in_progress"] + [
        e["type"] for e in reasoning + message] + ["response.completed"]
    assert events[-1]["response"]["output"] == [reasoning[-1]["item"], message[-1]["item"]]
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == ANSWER
    assert [c.text for c in final.output[1].content] == [ANSWER]
