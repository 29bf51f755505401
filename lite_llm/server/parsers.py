"""Parsing a chat answer's text: reasoning (<think>...</think>) split from the content, and tool
calls parsed out of it, delta by delta; the grammar that forces a tool call (tool_choice
"required" or a named function).

The registries below are the one place a format is named: --reasoning-parser and
--tool-call-parser take their keys, and a new format is one class and one entry here.
A parser's feed(text, final) returns what the text so far settles: (reasoning, content) for a
reasoning parser, (content, calls) for a tool call parser; text that may still turn into
markup is held back until it is whole.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Callable

from lite_llm.sampling_params import StructuredOutputsParams
from lite_llm.server import harmony
from lite_llm.server.validation import strict_schema

MAX_FORCED_CALLS = 8        # calls a forced answer may hold: a model repeating calls ends there


_DATA_KEYS = ("const", "enum", "default", "examples")      # values there are data, not schemas


def _hoist_defs(params: Any, prefix: str, defs: dict) -> Any:
    """params with its "$defs" / "definitions" moved into defs under prefix + their name, and its
    local references ("#/$defs/...", "#/definitions/...", "#") rewritten to point there: inside a
    call's schema the parameters are no longer the root a "#/..." reference is resolved from
    (Pydantic models with nested models give such schemas)."""
    refs_root = isinstance(params, dict) and '"#"' in json.dumps(params)
    if not isinstance(params, dict) or not (refs_root or any(k in params for k in ("$defs", "definitions"))):
        return params

    def move(node: Any) -> Any:
        if isinstance(node, list):
            return [move(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for head in ("#/$defs/", "#/definitions/"):
                    if value.startswith(head):
                        value = "#/$defs/" + prefix + value[len(head):]
                if value == "#":
                    value = "#/$defs/" + prefix.rstrip("_")
            out[key] = value if key in _DATA_KEYS else move(value)
        return out

    root = move(params)
    for key in ("$defs", "definitions"):
        for name, sub in (root.pop(key, None) or {}).items():
            defs[prefix + name] = sub
    if refs_root:
        defs[prefix.rstrip("_")] = root
    return root


def _call_schema(fn: dict, arguments_key: str, defs: dict | None = None, prefix: str = "") -> dict:
    params = fn.get("parameters") or {"type": "object"}
    params = strict_schema(params) if fn.get("strict") else params
    if defs is not None:
        params = _hoist_defs(params, prefix, defs)
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, arguments_key: params},
            "required": ["name", arguments_key], "additionalProperties": False}


def forced_tool_calls(parser: str, tools: list[dict], choice: str | dict, parallel: bool,
                      tokenizer: Any = None) -> StructuredOutputsParams:
    """A grammar whose every output is one call of the named tool, or (tool_choice "required")
    one or, if parallel, 1 to MAX_FORCED_CALLS calls of the tools, in the parser's format
    ("forced_json": vLLM's [{"name", "parameters"}, ...]), arguments valid against the
    function's parameters schema (as strict mode reads it for a tool with "strict": true)."""
    named = isinstance(choice, dict)
    fns = [t["function"] for t in tools if not named or t["function"]["name"] == choice["name"]]
    key = "parameters" if parser in ("llama3_json", "forced_json") else "arguments"
    defs: dict = {}         # the tools' own definitions, at the root where references resolve
    schemas = [_call_schema(fn, key, defs, f"tool{i}_") for i, fn in enumerate(fns)]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    many = parallel and not named
    if parser == "openai":      # harmony: one message to the function, its arguments the body
        return StructuredOutputsParams(grammar=harmony.forced_call_grammar(fns, schemas, defs, tokenizer))
    if parser == "forced_json":
        return StructuredOutputsParams(json={"type": "array", "items": schema, "minItems": 1,
                                             "maxItems": MAX_FORCED_CALLS if many else 1,
                                             **({"$defs": defs} if defs else {})})
    schema = {**schema, "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False},
              **({"$defs": defs} if defs else {})}
    body = "%json " + json.dumps(schema)

    def calls(one: str, sep: str) -> str:
        return f'{one} ({sep} {one}){{0,{MAX_FORCED_CALLS - 1}}}' if many else one

    if parser == "hermes":
        rules = ["start: " + calls("call", '"\\n"'),
                 'call: "<tool_call>\\n" body "\\n</tool_call>"']
    elif parser == "llama3_json":
        rules = ["start: " + calls("body", '"; "')]
    else:
        # [TOOL_CALLS] is a special token in Mistral's vocabularies: named by id, text cannot make it
        tid = tokenizer.token_to_id("[TOOL_CALLS]") if tokenizer is not None else None
        head = f"<[{tid}]>" if tid is not None else '"[TOOL_CALLS]"'
        rules = [f'start: {head} "[" ' + calls("body", '", "') + ' "]"']
    return StructuredOutputsParams(grammar="\n".join(rules + ["body: " + body]) + "\n")


class ReasoningSplitter:
    """Splits a chat answer's text, delta by delta, into (reasoning, content) at <think> tags.

    deepseek_r1: the template opened the thinking, so the output starts inside it (an opening
    <think> is dropped) until </think>; without a </think> it is all reasoning. qwen3: the
    output is thinking only when it opens with <think> (Qwen3 with enable_thinking=False
    answers directly). A tag split across deltas is held back until it is whole.
    """
    START, END = "<think>", "</think>"

    def __init__(self, parser: str):
        self.starts_inside = parser == "deepseek_r1"
        self.state = "start"      # -> "reasoning" -> "content"
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(self.START):
                self.buf, self.state = head[len(self.START):], "reasoning"
            elif self.START.startswith(head) and not final:
                return "", ""       # may still become <think>
            else:
                self.state = "reasoning" if self.starts_inside else "content"
        if self.state == "reasoning":
            end = self.buf.find(self.END)
            if end >= 0:
                reasoning, self.buf = self.buf[:end], self.buf[end + len(self.END):]
                self.state = "content"
            else:
                keep = 0 if final else _partial_suffix(self.buf, self.END)
                reasoning, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        if self.state == "content":
            content, self.buf = self.buf, ""
        return reasoning, content


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that begins tag (and so may complete it later)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class HermesToolParser:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Hermes, Qwen2.5, Qwen3)
    -> OpenAI tool calls, delta by delta: text outside the blocks is content as written (the text
    before a call keeps its trailing whitespace, as vLLM's hermes parser), except a stretch of
    whitespace alone before, between or after calls: it is held back until text follows it and
    dropped if a call does or the answer ends after one, so the same answer gives the same
    content whatever its deltas, streamed or whole. A tag split across deltas is held back, a
    closed block that is not a JSON call stays content as it was written. A block still open at
    the end is a call if its JSON is whole, else dropped (cut off by max_tokens: markup that
    opened a call is never content). forced: the answer is calls only (a forced tool_choice),
    so nothing in it is content."""
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, forced: bool = False) -> None:
        self.buf = ""
        self.inside = False
        self.num_calls = 0
        self.forced = forced
        self.blank = ""         # whitespace since the start or the last call, no text after it yet
        self.spoke = False      # text since the start or the last call

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        content, calls = "", []

        def say(piece: str) -> None:
            nonlocal content
            if self.forced:
                return
            if not self.spoke:
                self.blank += piece
                if not self.blank.strip():
                    return
                piece, self.blank, self.spoke = self.blank, "", True
            content += piece

        while True:
            if not self.inside:
                at = self.buf.find(self.START)
                if at >= 0:
                    say(self.buf[:at])
                    self.buf, self.inside = self.buf[at + len(self.START):], True
                    continue
                keep = 0 if final else _partial_suffix(self.buf, self.START)
                say(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            end = self.buf.find(self.END)
            if end < 0 and not final:
                break
            block = self.buf if end < 0 else self.buf[:end]
            self.buf = "" if end < 0 else self.buf[end + len(self.END):]
            self.inside = False
            call = _parse_tool_call(block)
            if call is None:
                if end >= 0:
                    say(self.START + block + self.END)
            else:
                call["index"] = self.num_calls + len(calls)
                calls.append(call)
                self.blank, self.spoke = "", False
            if end < 0:
                break
        self.num_calls += len(calls)
        if final and self.blank and not self.num_calls:     # an answer of whitespace alone, no call
            content, self.blank = content + self.blank, ""
        return content, calls


class JsonToolParser:
    """Tool calls written as bare JSON at the start of the answer, delta by delta:
    llama3_json: [<|python_tag|>]{"name": ..., "parameters": {...}} (several joined by "; ");
    mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (the special token is dropped
    from the text unless skip_special_tokens is false, so a leading JSON list counts too);
    forced_json: [{"name": ..., "parameters": {...}}, ...], what a forced tool_choice writes
    when no parser is set (vLLM's format).
    An answer that opens that way is held back until it ends and then parsed; if it is not
    valid calls it is content as written, unless its markup (<|python_tag|>, [TOOL_CALLS]) or a
    forced tool_choice says it is calls: then the whole calls before the first broken one are
    kept (cut off by max_tokens) and the rest dropped. Any other answer streams as content."""
    PREFIXES = {"llama3_json": ("<|python_tag|>",), "mistral": ("[TOOL_CALLS]",), "forced_json": ()}

    def __init__(self, parser: str, forced: bool = False) -> None:
        self.parser = parser
        self.buf = ""
        self.forced = forced or parser == "forced_json"
        self.mode: str | None = "calls" if self.forced else None   # None: undecided, "calls": held, "content": streaming
        self.num_calls = 0

    def _opens_calls(self, text: str) -> bool | None:
        """Whether text (stripped of leading whitespace) opens tool calls; None: too short to tell."""
        for prefix in self.PREFIXES[self.parser] + (("{",) if self.parser == "llama3_json" else ("[",)):
            if text.startswith(prefix):
                return True
            if prefix.startswith(text):
                return None
        return False

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        if self.mode == "content":
            return text, []
        self.buf += text
        if self.mode is None:
            opens = self._opens_calls(self.buf.lstrip())
            if opens is None and not final:
                return "", []
            self.mode = "calls" if opens else "content"
            if self.mode == "content":
                out, self.buf = self.buf, ""
                return out, []
        if not final:
            return "", []
        text = self.buf.strip()
        marked = any(text.startswith(p) for p in self.PREFIXES[self.parser])
        calls, whole = self._parse(text)
        if not whole and not (self.forced or marked):
            return self.buf, []
        for i, call in enumerate(calls):
            call["index"] = i
        self.num_calls = len(calls)
        return "", calls

    def _parse(self, text: str) -> tuple[list[dict], bool]:
        """The calls text holds, up to the first that is not one, and whether that was all of it."""
        for prefix in self.PREFIXES[self.parser]:
            if text.startswith(prefix):
                text = text[len(prefix):].strip()
        is_list = self.parser != "llama3_json" and text.startswith("[")
        body, sep = (text[1:], ",") if is_list else (text, ";")
        decoder = json.JSONDecoder()
        calls: list[dict] = []
        at = 0
        while True:
            rest = body[at:].lstrip()
            at = len(body) - len(rest)
            if not rest or (is_list and rest == "]"):       # a list must be closed to be whole
                return calls, bool(calls) and (rest == "]") == is_list
            try:
                value, at = decoder.raw_decode(body, at)
            except (ValueError, RecursionError):     # a model's text: invalid, or nested past the stack
                return calls, False
            call = _call_from(value)
            if call is None:
                return calls, False
            calls.append(call)
            rest = body[at:].lstrip()
            if rest.startswith(sep):
                at = len(body) - len(rest) + 1
            elif rest and not (is_list and rest == "]"):
                return calls, False


class _MaxCalls:
    """Keeps the first max_calls calls of a parser's output (parallel_tool_calls false)."""

    def __init__(self, parser: Any, max_calls: int) -> None:
        self.parser, self.max_calls = parser, max_calls

    @property
    def num_calls(self) -> int:
        return min(self.parser.num_calls, self.max_calls)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        content, calls = self.parser.feed(text, final)
        return content, [c for c in calls if c["index"] < self.max_calls]


def make_tool_parser(prep: Any):
    """The streaming tool call parser of a prepared chat request (context.PreparedRequest: its
    tool_parser names one of TOOL_PARSERS, or "forced_json")."""
    parser = TOOL_PARSERS.get(prep.tool_parser, _forced_json)(prep.forced_tools)
    return parser if prep.max_tool_calls is None else _MaxCalls(parser, prep.max_tool_calls)


def make_reasoning_parser(name: str):
    """The streaming reasoning parser of --reasoning-parser name (one of REASONING_PARSERS)."""
    return REASONING_PARSERS[name]()


def _call_from(value: Any) -> dict | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def _parse_tool_call(block: str) -> dict | None:
    try:
        value = json.loads(block.strip())
    except (ValueError, RecursionError):
        return None
    return _call_from(value)


# ---- the registries ----------------------------------------------------------------------------

# --reasoning-parser name -> a new parser (feed(text, final) -> (reasoning, content))
REASONING_PARSERS: dict[str, Callable[[], Any]] = {
    "deepseek_r1": lambda: ReasoningSplitter("deepseek_r1"),   # the output starts inside the thinking
    "qwen3": lambda: ReasoningSplitter("qwen3"),               # thinking only when it opens with <think>
    "openai_gptoss": harmony.HarmonyReasoningSplitter,         # gpt-oss: harmony's analysis channel
}
# --tool-call-parser name -> a new parser given forced (feed(text, final) -> (content, calls)), and
# the marks by which a chat template shows the format (tool_parser_for)
TOOL_PARSERS: dict[str, Callable[[bool], Any]] = {
    "hermes": HermesToolParser,                                      # Hermes, Qwen2.5, Qwen3
    "llama3_json": lambda forced: JsonToolParser("llama3_json", forced),   # Llama 3.1-3.3
    "mistral": lambda forced: JsonToolParser("mistral", forced),     # Mistral
    "openai": harmony.HarmonyToolParser,                             # gpt-oss: harmony messages to functions.NAME
}
TEMPLATE_MARKS = {"hermes": ("<tool_call>",), "mistral": ("[TOOL_CALLS]",),
                  "llama3_json": ("<|python_tag|>", "ipython"), "openai": ("<|channel|>",)}


def _forced_json(forced: bool) -> Any:
    """What a forced tool_choice writes when no parser is set: vLLM's JSON list of calls."""
    return JsonToolParser("forced_json", forced)


def tool_parser_for(template: str | None) -> str | None:
    """The tool call format a chat template teaches its model, where unambiguous."""
    if not template:
        return None
    found = [name for name, marks in TEMPLATE_MARKS.items() if any(m in template for m in marks)]
    return found[0] if len(found) == 1 else None


def tool_finish_reason(reason: str | None, num_calls: int, named: bool = False) -> str | None:
    """"tool_calls" when the model stopped after calling tools, except under a named tool_choice,
    where OpenAI answers "stop"."""
    return "tool_calls" if num_calls and reason == "stop" and not named else reason
