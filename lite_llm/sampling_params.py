"""SamplingParams: how to pick each next token and when to stop, with vLLM's names and defaults.

Validation happens once, at construction, and raises ValueError naming the offending field.
What the parameters do lives in lite_llm/engine/sampler.py (token choice),
lite_llm/engine/structured.py (grammars) and lite_llm/engine/detokenizer.py (stop strings);
this module only holds and checks values.

It is a plain (mutable) dataclass because vLLM code assigns fields after construction
(`params.max_tokens = ...`); the engine takes a `clone()` at submission so a caller's later
edits never reach a running request.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import math
from dataclasses import dataclass

import json as _json

_SAMPLING_EPS = 1e-5     # temperature below this is greedy (vLLM's threshold)
MAX_LOGPROBS = 20        # OpenAI's and vLLM's default cap on top logprobs per token
# Nesting levels (objects and arrays) of a JSON schema: far beyond any real schema, shallow enough
# that everything walking one (copies, the grammar compiler) stays far from the recursion limit.
MAX_JSON_DEPTH = 64
# Sizes of a constraint, checked before the grammar engine compiles it (its work grows with them;
# 100k choices took it seconds). A JSON schema's size is its JSON text's.
MAX_CHOICES = 1024
MAX_CHOICE_BYTES = 64 << 10         # all choices together, UTF-8
MAX_REGEX_BYTES = 16 << 10          # regex and whitespace_pattern
MAX_GRAMMAR_BYTES = 256 << 10       # grammar text (forced tool calls embed every tool's schema in one)
MAX_SCHEMA_BYTES = 256 << 10


class RequestOutputKind(enum.Enum):
    """When the engine hands over a request's output (vLLM's names; its CUMULATIVE mode is what
    outputs.fold builds from the deltas). DELTA: after every step that produced something,
    only what is new (streaming). FINAL_ONLY: once, when the request finishes, one delta holding
    everything (what LLM.generate and non-streaming HTTP answers need: no output objects and no
    queue hop per token)."""
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    """Constrain a request's output, token by token (vLLM's StructuredOutputsParams): exactly
    one of a JSON schema (`json`, a dict or its JSON text), any JSON object (`json_object`), a
    regular expression (`regex`), one of some strings (`choice`), or a grammar (`grammar`: Lark
    as llguidance reads it, or llama.cpp's GBNF).

    JSON is written with json.dumps' separators (", " and ": ") and no other whitespace;
    disable_any_whitespace drops the spaces too; whitespace_pattern (a regex) allows that
    whitespace between tokens instead. disable_additional_properties treats every object that
    does not say otherwise as "additionalProperties": false.
    """
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise ValueError("structured_outputs needs exactly one of json, json_object, regex, choice, "
                             f"grammar; got {', '.join(kinds) if kinds else 'none'}")
        if isinstance(self.json, str):
            try:
                self.json = _json.loads(self.json)
            except RecursionError:
                raise ValueError(f"structured_outputs.json is nested deeper than {MAX_JSON_DEPTH} levels") from None
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError("structured_outputs.json must be a JSON schema (an object)")
        if nested_deeper_than(self.json, MAX_JSON_DEPTH):
            raise ValueError(f"structured_outputs.json is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(self.json, dict) and len(_json.dumps(self.json)) > MAX_SCHEMA_BYTES:
            raise ValueError(f"structured_outputs.json is larger than {MAX_SCHEMA_BYTES} bytes")
        for name in ("regex", "grammar", "whitespace_pattern"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or (not v and name != "whitespace_pattern")):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
            limit = MAX_GRAMMAR_BYTES if name == "grammar" else MAX_REGEX_BYTES
            if v is not None and len(v.encode("utf-8", "surrogatepass")) > limit:
                raise ValueError(f"structured_outputs.{name} is longer than {limit} bytes")
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not isinstance(self.choice, (list, tuple)) \
                    or not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of non-empty strings")
            if len(self.choice) > MAX_CHOICES:
                raise ValueError(f"structured_outputs.choice has more than {MAX_CHOICES} choices")
            if sum(len(c.encode("utf-8", "surrogatepass")) for c in self.choice) > MAX_CHOICE_BYTES:
                raise ValueError(f"structured_outputs.choice is longer than {MAX_CHOICE_BYTES} bytes in all")
            self.choice = list(self.choice)

    @property
    def kind(self) -> str:
        """What constrains the output: "json", "json_object", "regex", "choice" or "grammar"."""
        if self.json_object and self.json is None:
            return "json_object"
        return next(k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None)


GuidedDecodingParams = StructuredOutputsParams    # vLLM's older name


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                        # 0 (or -1, stored as 0) = off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None         # a str is accepted and becomes [str]; None -> []
    stop_token_ids: list[int] | None = None   # None -> []
    ignore_eos: bool = False
    max_tokens: int | None = 16           # None = until max_model_len
    min_tokens: int = 0
    logprobs: int | None = None           # top logprobs per generated token; 0 = the sampled one only
    prompt_logprobs: int | None = None    # top logprobs per prompt token (and the token's own)
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit before sampling
    structured_outputs: StructuredOutputsParams | None = None   # a grammar the output must follow
    guided_decoding: StructuredOutputsParams | None = None      # vLLM's older name: moved to the above
    output_kind: RequestOutputKind = RequestOutputKind.DELTA    # outputs every step, or once at the end

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [] if self.stop is None else list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else [int(t) for t in self.stop_token_ids]
        if self.logit_bias is not None:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()} or None
        if self.top_k == -1:
            self.top_k = 0
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("give structured_outputs or guided_decoding, not both")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as e:       # an unknown key
                raise ValueError(f"structured_outputs: {e}") from None
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, "
                             f"got {type(self.structured_outputs).__name__}")
        self._verify()
        if self.temperature < _SAMPLING_EPS:
            # Greedy takes the argmax: the filters cannot change it, so switch them off (as vLLM).
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def _verify(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        check(_is_int(self.n) and self.n >= 1, "n", "must be an integer >= 1")
        check(self.best_of is None or (_is_int(self.best_of) and self.best_of >= self.n),
              "best_of", f"must be None or an integer >= n ({self.n})")
        check(_is_num(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
              "presence_penalty", "must be in [-2, 2]")
        check(_is_num(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
              "frequency_penalty", "must be in [-2, 2]")
        check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0.0,
              "repetition_penalty", "must be > 0")
        check(_is_num(self.temperature) and self.temperature >= 0.0, "temperature", "must be >= 0")
        check(_is_num(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", "must be 0 or -1 (off), or >= 1")
        check(_is_num(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        check(self.seed is None or _is_int(self.seed), "seed", "must be None or an integer")
        check(all(isinstance(s, str) and s for s in self.stop), "stop",
              "must be a non-empty string or a list of non-empty strings")
        check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "must be token ids >= 0")
        check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
              "max_tokens", "must be None or an integer >= 1")
        check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
              "min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
              "logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}]")
        check(self.prompt_logprobs is None
              or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
              "prompt_logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}]")
        check(isinstance(self.output_kind, RequestOutputKind), "output_kind", "must be a RequestOutputKind")
        check(self.logit_bias is None or all(t >= 0 and math.isfinite(b) for t, b in self.logit_bias.items()),
              "logit_bias", "must map token ids >= 0 to finite numbers")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)

    def replace(self, **changes) -> SamplingParams:
        """A validated copy with some fields changed: params.replace(max_tokens=64)."""
        return dataclasses.replace(self.clone(), **changes)


@dataclass(frozen=True)
class PoolingParams:
    """A pooling request (vLLM's name): its prompt runs whole in one engine step and its result
    is the pooled row (outputs.PoolingOutput), not tokens. token_type_ids: the segment of each
    prompt token (a cross-encoder's pair: 0 for the first text, 1 for the second), None: all 0."""
    token_type_ids: tuple[int, ...] | None = None

    def clone(self) -> PoolingParams:
        return self         # frozen: nothing a caller can change later


def nested_deeper_than(value, limit: int) -> bool:
    """Whether a JSON-like value nests dicts and lists more than limit levels deep ({} is one
    level), found without recursion: client data is never walked recursively before this."""
    stack = [(value, 1)] if isinstance(value, (dict, list, tuple)) else []
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend([(x, depth + 1) for x in items if isinstance(x, (dict, list, tuple))])
    return False


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


MAX_BEAM_WIDTH = 128       # beams per prompt (the server's cap on n): each is a running sequence a step


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams; early_stopping as transformers' (False, True or "never")."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        if not _is_int(self.beam_width) or not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be an integer in [1, {MAX_BEAM_WIDTH}], got {self.beam_width!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.length_penalty, (int, float)) or isinstance(self.length_penalty, bool) \
                or not -1e6 <= self.length_penalty <= 1e6:
            raise ValueError(f"length_penalty must be a number, got {self.length_penalty!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.early_stopping not in (False, True, "never"):
            raise ValueError(f"early_stopping must be True, False or \"never\", got {self.early_stopping!r}")
