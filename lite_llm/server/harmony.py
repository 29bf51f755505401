"""The harmony response format of gpt-oss, parsed from the generated text delta by delta.

A gpt-oss answer is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>Let me think...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

(the prompt ends with <|start|>assistant, so the first header starts at <|channel|>). The
channel says what a body is: analysis is the chain of thought, final the answer, commentary a
preamble to the user or, with a recipient (to=functions.NAME), a tool call whose body is the
arguments. <|end|> closes a message, <|call|> a tool call, <|return|> the answer; the last two
are end-of-sequence tokens, so they may not reach the text at all. The markers are special
tokens: the text must keep them (skip_special_tokens false, as vLLM serves gpt-oss).

Two parsers on one stream, registered beside the <think> splitter and the tool call parsers
(openai.py REASONING_PARSER_CLASSES / TOOL_PARSER_CLASSES), under vLLM's names:

  openai_gptoss (--reasoning-parser): analysis bodies -> reasoning; final bodies and
      preambles -> content; a message to a recipient passes through in its harmony form, for
      the tool call parser to read (without one it stays in the content as written);
  openai (--tool-call-parser): messages to functions.NAME -> tool calls (whole, when the
      message ends); every other body -> content.

Text before any harmony header is content as it is (a model or template that does not write
harmony). A marker split across deltas is held back until it is whole; a header still open
at the end is dropped, a body still open at the end is closed there (a tool call cut off by
max_tokens is then a call only if its arguments are whole JSON, as the other parsers do).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
_HEADER_OPENERS = (START, CHANNEL)
_BODY_ENDS = (END, CALL, RETURN, START)
_CHANNEL_RE = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT_RE = re.compile(r"(?:^|\s|>)to=([^\s<]+)")
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)   # a template that writes these is harmony's


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of text that begins one of tags."""
    for k in range(min(max(len(t) for t in tags) - 1, len(text)), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return k
    return 0


class HarmonyStream:
    """Harmony text -> events, delta by delta:
        ("open", header)          a message's header is whole
        ("body", header, text)    a piece of its body
        ("close", header, tag)    its end marker (None: the text ended inside it)
    header: {"channel": str | None, "recipient": str | None}; text before any header is the
    body of a message with neither (plain content)."""

    def __init__(self) -> None:
        self.buf = ""
        self.state = "start"      # -> "header" | "body" (-> "start" after each message)
        self.header: dict = {}

    def feed(self, text: str, final: bool = False) -> list[tuple]:
        self.buf += text
        events: list[tuple] = []
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(_HEADER_OPENERS):
                    self.buf, self.state = head, "header"
                elif head and any(t.startswith(head) for t in _HEADER_OPENERS) and not final:
                    break                                   # may still become a header
                elif head or final:
                    self.header, self.state = {"channel": None, "recipient": None}, "body"
                    events.append(("open", self.header))
                else:
                    break
            if self.state == "header":
                at = self.buf.find(MESSAGE)
                if at < 0:
                    if final:
                        self.buf = ""
                    break
                raw, self.buf = self.buf[:at], self.buf[at + len(MESSAGE):]
                channel, recipient = _CHANNEL_RE.search(raw), _RECIPIENT_RE.search(raw)
                self.header = {"channel": channel.group(1) if channel else None,
                               "recipient": recipient.group(1) if recipient else None}
                self.state = "body"
                events.append(("open", self.header))
            ends = [(self.buf.find(t), t) for t in _BODY_ENDS if t in self.buf]
            if ends:
                at, tag = min(ends)
                if at:
                    events.append(("body", self.header, self.buf[:at]))
                self.buf = self.buf[at:] if tag == START else self.buf[at + len(tag):]
                events.append(("close", self.header, None if tag == START else tag))
                self.state = "start"      # a header next, or plain text (a splitter's content between calls)
                continue
            keep = 0 if final else _partial_suffix(self.buf, _BODY_ENDS)
            if len(self.buf) > keep:
                events.append(("body", self.header, self.buf[:len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep:]
            if final:
                events.append(("close", self.header, None))
                self.buf = ""
            break
        return events


def _function_of(recipient: str | None) -> str | None:
    """The function a message calls: functions.NAME -> NAME (other recipients: built-in tools)."""
    if recipient and recipient.startswith("functions."):
        return recipient[len("functions."):]
    return None


class HarmonyReasoningSplitter:
    """openai_gptoss: feed(text, final) -> (reasoning, content) (see the module's docstring)."""

    def __init__(self, parser: str = "openai_gptoss") -> None:
        self.stream = HarmonyStream()

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        reasoning = content = ""
        for kind, header, *rest in self.stream.feed(text, final):
            if header["recipient"]:          # a tool call: kept in its harmony form for the tool parser
                if kind == "open":
                    content += f"{START}assistant to={header['recipient']}{CHANNEL}{header['channel'] or 'commentary'}" \
                               f"{MESSAGE}"
                elif kind == "body":
                    content += rest[0]
                else:
                    content += CALL
            elif kind == "body":
                if header["channel"] == "analysis":
                    reasoning += rest[0]
                else:
                    content += rest[0]
        return reasoning, content


class HarmonyToolParser:
    """openai: feed(text, final) -> (content, calls); calls as the other tool call parsers give
    them ({"index", "id", "type": "function", "function": {"name", "arguments"}}), each whole
    when its message ends. forced: the answer is calls only (nothing in it is content)."""

    def __init__(self, forced: bool = False) -> None:
        self.stream = HarmonyStream()
        self.forced = forced
        self.num_calls = 0
        self.args = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        content, calls = "", []
        for kind, header, *rest in self.stream.feed(text, final):
            name = _function_of(header["recipient"])
            if header["recipient"]:
                if kind == "open":
                    self.args = ""
                elif kind == "body":
                    self.args += rest[0]
                elif name is not None:
                    call = _call(name, self.args.strip(), complete=rest[0] is not None)
                    if call is not None:
                        call["index"] = self.num_calls
                        self.num_calls += 1
                        calls.append(call)
            elif kind == "body" and not self.forced:
                content += rest[0]
        return content, calls


def _call(name: str, args: str, complete: bool) -> dict | None:
    """A tool call of name with arguments text args: JSON arguments are passed on as written
    (compacted); a message cut off before its end is a call only when its JSON is whole."""
    try:
        value = json.loads(args) if args else {}
        args = json.dumps(value, ensure_ascii=False)
    except ValueError:
        if not complete:
            return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


def is_harmony_template(template: Any) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's)."""
    return isinstance(template, str) and CHANNEL in template and MESSAGE in template


def in_use(reasoning_parser: str | None, tool_parser: str | None) -> bool:
    """Whether a chat request is read by a harmony parser (its text must keep the markers)."""
    return reasoning_parser == "openai_gptoss" or tool_parser == "openai"


def forced_call_grammar(fns: list[dict], call_schemas: list[dict], defs: dict, tokenizer: Any = None) -> str:
    """A grammar (the structured-output engine's lark with %json) whose every output is one
    harmony message calling one of the functions fns, its body JSON arguments valid against
    the function's parameters (call_schemas[i]["properties"]["arguments"], as openai.py's
    forced_tool_calls makes them, the tools' hoisted definitions `defs` at each root). The markers are special
    tokens: named by id where the vocabulary has them, text cannot make them."""
    def mark(tag: str) -> str:
        tid = tokenizer.token_to_id(tag) if tokenizer is not None and hasattr(tokenizer, "token_to_id") else None
        return f"<[{tid}]>" if tid is not None else json.dumps(tag)

    rules = ["start: " + " | ".join(f"call{i}" for i in range(len(fns)))]
    for i, (fn, schema) in enumerate(zip(fns, call_schemas)):
        args = dict(schema["properties"]["arguments"])
        body = {**args, **({"$defs": defs} if defs else {}),
                "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
        rules.append(f"call{i}: {mark(CHANNEL)} {json.dumps('commentary to=functions.' + fn['name'] + ' ')} "
                     f"{mark(CONSTRAIN)} \"json\" {mark(MESSAGE)} args{i} {mark(CALL)}")
        rules.append(f"args{i}: %json " + json.dumps(body))
    return "\n".join(rules) + "\n"
