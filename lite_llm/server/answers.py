"""Engine outputs to OpenAI answers: the whole chat.completion / text_completion body, and the
stream of chunks (with reasoning split off and tool calls parsed) that every API answering from
the chat machinery reads (Responses, Anthropic Messages), and its SSE encoding.

Pure: engine deltas in, dicts out; writing them is the transport's (server/transport.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lite_llm.server.context import PreparedRequest
from lite_llm.server.logprobs import echo_logprobs, format_logprobs, merge_logprobs, wire_prompt_logprobs
from lite_llm.server.parsers import make_reasoning_parser, make_tool_parser, tool_finish_reason


def wire_finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish reasons only: an aborted request is answered with an error instead."""
    return None if reason == "abort" else reason


@dataclass
class Choice:
    """One completion accumulated from deltas."""
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list = field(default_factory=list)     # entries as formatted for this API kind
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list | None = None   # the engine's, for its prompt (RequestOutput.prompt_logprobs)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def final_response(prep: PreparedRequest, choices: dict[int, Choice], tokenizer: Any = None) -> dict:
    """The non-streaming body; choices keyed by the response index (prompt * n + i)."""
    num_gen = sum(c.num_tokens for c in choices.values())
    num_prompt = sum(len(p.token_ids) for p in prep.prompts)
    items = []
    for index in sorted(choices):
        c = choices[index]
        text = "".join(c.text)
        lps = merge_logprobs(prep.kind, c.logprobs) if prep.logprobs is not None else None
        if prep.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = c.finish_reason
            if prep.reasoning_parser:
                reasoning, text = make_reasoning_parser(prep.reasoning_parser).feed(text, final=True)
                message = {"role": "assistant", "content": text, "reasoning_content": reasoning or None}
            if prep.tool_parser:
                content, calls = make_tool_parser(prep).feed(text, final=True)
                for call in calls:
                    del call["index"]
                message["content"] = content or None if calls or prep.forced_tools else content
                if calls:
                    message["tool_calls"] = calls
                finish = tool_finish_reason(finish, len(calls), prep.named_tool)
            items.append({"index": index, "message": message,
                          "logprobs": lps, "finish_reason": finish,
                          "stop_reason": c.stop_reason})
        else:
            if prep.echo:
                prompt = _prompt_text(prep, index)
                if lps is not None and c.prompt_logprobs is not None:
                    lps = echo_logprobs(prep, tokenizer, index, c.prompt_logprobs, lps, len(prompt))
                text = prompt + text
            item = {"index": index, "text": text, "logprobs": lps,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if prep.prompt_logprobs is not None:
                item["prompt_logprobs"] = wire_prompt_logprobs(c.prompt_logprobs)
            items.append(item)
    body = {"id": prep.id, "object": "chat.completion" if prep.kind == "chat" else "text_completion",
            "created": prep.created, "model": prep.model, "system_fingerprint": prep.system_fingerprint,
            "choices": items, "usage": usage(num_prompt, num_gen)}
    if prep.kind == "chat" and prep.prompt_logprobs is not None:     # vLLM: beside the choices
        body["prompt_logprobs"] = wire_prompt_logprobs(choices[min(choices)].prompt_logprobs if choices else None)
    return body


def _prompt_text(prep: PreparedRequest, index: int) -> str:
    p = prep.prompts[index // prep.params.n]
    return p.text if p.text is not None else ""


def chunk(prep: PreparedRequest, choices: list[dict], usage_value: dict | None = None) -> dict:
    body = {"id": prep.id,
            "object": "chat.completion.chunk" if prep.kind == "chat" else "text_completion",
            "created": prep.created, "model": prep.model, "system_fingerprint": prep.system_fingerprint,
            "choices": choices}
    if prep.include_usage:
        body["usage"] = usage_value
    return body


def chunk_choice(prep: PreparedRequest, index: int, text: str, logprobs: Any,
                 finish_reason: str | None, stop_reason: Any = None, role: bool = False,
                 reasoning: str = "", tool_calls: list[dict] | None = None) -> dict:
    if prep.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        if reasoning or tool_calls:
            delta = {**({"reasoning_content": reasoning} if reasoning else {}),
                     **({"content": text} if text else {}),
                     **({"tool_calls": tool_calls} if tool_calls else {})}
        elif finish_reason is not None and not text and not role:
            delta = {}
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": finish_reason, "stop_reason": stop_reason}
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": stop_reason}


@dataclass
class StreamTally:
    """What a stream of chunks has counted so far (the access log and usage read it)."""
    num_prompt: int
    num_tokens: int = 0
    aborted: bool = False       # an engine request ended with "abort": the caller says why


def iter_deltas(submitted: list[tuple[str, Any]]) -> Any:
    """(prompt index, delta RequestOutput) over every submitted engine request, in order."""
    for k, (_, stream) in enumerate(submitted):
        for out in stream:
            yield k, out


def stream_chunks(prep: PreparedRequest, deltas: Any, tokenizer: Any, tally: StreamTally) -> Any:
    """The chat.completion.chunk / text_completion chunks (dicts) of a prepared request, from
    its engine deltas: the role (or echo) chunks, a chunk per delta with reasoning split off and
    tool calls parsed, the usage chunk when asked for (with continuous usage, the usage so far
    on every chunk as well). Every API that answers from the chat
    machinery (Responses, Anthropic Messages) reads these chunks; an aborted engine request
    sets tally.aborted and ends the chunks without usage."""
    n = prep.params.n
    num_choices = len(prep.prompts) * n
    generated: dict[int, int] = {}      # response index -> its completion tokens so far

    def so_far(index: int) -> dict | None:
        """vLLM's continuous usage: the choice's prompt and its completion tokens until now."""
        if not prep.continuous_usage:
            return None
        return usage(len(prep.prompts[index // n].token_ids), generated.get(index, 0))

    if prep.kind == "chat":
        for index in range(num_choices):
            yield chunk(prep, [chunk_choice(prep, index, "", None, None, role=True)], so_far(index))
    elif prep.echo:
        for index in range(num_choices):
            yield chunk(prep, [chunk_choice(prep, index, prep.prompts[index // n].text or "", None, None)],
                        so_far(index))
    offsets: dict[int, int] = {}
    splitters: dict[int, Any] = {}
    tool_parsers: dict[int, Any] = {}
    for k, out in deltas:
        for o in out.outputs:
            if not o.text and not o.token_ids and o.finish_reason is None:
                continue
            index = k * n + o.index
            tally.num_tokens += len(o.token_ids)
            generated[index] = generated.get(index, 0) + len(o.token_ids)
            lps, offsets[index] = format_logprobs(prep, tokenizer, o, offsets.get(index, 0))
            text, reasoning, calls = o.text, "", None
            final = o.finish_reason is not None
            finish = wire_finish_reason(o.finish_reason)
            if prep.reasoning_parser:
                splitter = splitters.setdefault(index, make_reasoning_parser(prep.reasoning_parser))
                reasoning, text = splitter.feed(o.text, final=final)
            if prep.tool_parser:
                parser = tool_parsers.get(index) or tool_parsers.setdefault(index, make_tool_parser(prep))
                text, calls = parser.feed(text, final=final)
                finish = tool_finish_reason(finish, parser.num_calls, prep.named_tool)
            if text or reasoning or calls or lps is not None or finish is not None:
                yield chunk(prep, [chunk_choice(prep, index, text, lps, finish, o.stop_reason,
                                                reasoning=reasoning, tool_calls=calls)], so_far(index))
            if o.finish_reason == "abort":
                tally.aborted = True
    if prep.include_usage and not tally.aborted:
        yield chunk(prep, [], usage(tally.num_prompt, tally.num_tokens))


def sse(value: dict | str) -> bytes:
    data = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                            separators=(",", ":"))
    return f"data: {data}\n\n".encode("utf-8")
