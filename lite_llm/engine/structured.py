"""Structured outputs: a grammar per request, enforced token by token with llguidance.

    StructuredOutputsParams --grammar_of--> llguidance grammar text
        --Grammars.matcher--> a fresh LLMatcher (compiled once per grammar text, then copied)
    each step:  StructuredOutputs.start_step(sched_out) -> MaskJob: the allowed-token bitmask
                [M, ceil(V / 32)] int32 of the step's M constrained rows, computed by llguidance's
                executor with the GIL released, on a helper thread while forward() runs
                runner: MaskJob.wait() -> (bitmask, mask_rows [R]) -> the compiled sampler sets
                masked-out logits to -inf before anything else (_sampler.pyx)
                engine: accept(request, token) advances the request's matcher; a grammar that
                has ended finishes the request with "stop"

Bit t % 32 of word t // 32 of a row is 1 when token t is allowed (llguidance's layout). A
step without constrained sampling rows does no mask work at all.

What does not live here: the parameters and their checks (sampling_params.py), the OpenAI
fields that become them (server/openai.py), applying the mask (_sampler.pyx).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from lite_llm.sampling_params import StructuredOutputsParams

_JSON_SEPARATORS = {False: (", ", ": "), True: (",", ":")}   # by disable_any_whitespace


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy   # noqa: F401  (fill_next_token_bitmask, used by the tests too)
    except ImportError:   # pragma: no cover - a declared dependency
        raise ValueError("structured outputs need the llguidance package: pip install llguidance") from None
    return llguidance


def _closed_objects(schema: Any) -> Any:
    """schema with "additionalProperties": false on every object schema that does not set it."""
    if isinstance(schema, list):
        return [_closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class GrammarError(ValueError):
    """A constraint the grammar engine refused. The message is fixed per kind: the engine's own
    text (parser positions, panics, Rust backtraces) is not the client's business."""

    def __init__(self, kind: str):
        super().__init__(f"invalid {_WHAT[kind]}: the grammar engine cannot compile it")
        self.kind = kind


def _engine_call(kind: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) of llguidance; any failure, a Rust panic included (pyo3 raises
    those as a BaseException), becomes a GrammarError."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:
        raise GrammarError(kind) from None


def grammar_of(p: StructuredOutputsParams) -> str:
    """The llguidance grammar text for p (not yet checked: Grammars.template compiles it)."""
    llg = _llguidance()
    kind = p.kind
    if kind in ("json", "json_object"):
        schema = p.json if kind == "json" else {"type": "object"}
        if schema is True:
            schema = {}
        if schema is False or not isinstance(schema, dict):
            raise ValueError("invalid JSON schema: it must be an object (or true)")
        if p.disable_additional_properties:
            schema = _closed_objects(schema)
        items, keys = _JSON_SEPARATORS[bool(p.disable_any_whitespace)]
        options: dict[str, Any] = {"item_separator": items, "key_separator": keys,
                                   "whitespace_flexible": False}
        if p.whitespace_pattern is not None:
            options.update(whitespace_flexible=True, whitespace_pattern=p.whitespace_pattern,
                           item_separator=",", key_separator=":")
        return _engine_call(kind, llg.LLMatcher.grammar_from_json_schema, schema, overrides=options)
    if kind == "regex":
        return _engine_call(kind, llg.LLMatcher.grammar_from_regex, p.regex)
    if kind == "choice":
        return _engine_call(kind, llg.LLMatcher.grammar_from_lark,
                            "start: " + " | ".join(json.dumps(c) for c in p.choice))
    return _engine_call(kind, llg.grammar_from, "grammar", p.grammar)     # Lark, or GBNF converted to Lark


_WHAT = {"json": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
         "choice": "choice list", "grammar": "grammar"}


class Grammars:
    """Compiled grammars, shared by every thread: the tokenizer's token trie (built once, on
    first use: ~0.5 s for a 50k vocabulary) and a compiled matcher per grammar text (LRU), of
    which each request gets its own copy. Thread-safe: the HTTP threads compile and check a
    request's grammar before it is queued, the engine thread copies it."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_cached: int = 256, max_cached_chars: int = 256 << 10):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = tuple(eos_token_ids)
        # a compiled grammar costs ~40 bytes per character of its text (a 20,000-value enum: ~10 MB),
        # so the cache is bounded by the text it holds as well as by its count
        self.max_cached, self.max_cached_chars = max_cached, max_cached_chars
        self._cached_chars = 0
        self._lock = threading.Lock()
        self._lltokenizer = None
        self._templates: OrderedDict[str, Any] = OrderedDict()

    @property
    def mask_words(self) -> int:
        """int32 words per bitmask row: ceil(vocab_size / 32)."""
        return (self.vocab_size + 31) // 32

    def lltokenizer(self):
        with self._lock:
            if self._lltokenizer is None:
                llg = _llguidance()
                spec = getattr(self.tokenizer, "backend_json", lambda: None)() if self.tokenizer else None
                if spec is None:
                    raise ValueError("structured outputs need the model's tokenizer as a tokenizer.json "
                                     "pipeline; this model's tokenizer is not supported")
                eos = list(self.eos_token_ids) or None
                self._lltokenizer = llg.LLTokenizer(spec, n_vocab=self.vocab_size, eos_token=eos)
            return self._lltokenizer

    def template(self, p: StructuredOutputsParams):
        """The compiled, never advanced matcher of p's grammar; ValueError naming what is wrong."""
        grammar = grammar_of(p)
        with self._lock:
            found = self._templates.get(grammar)
            if found is not None:
                self._templates.move_to_end(grammar)
                return found
        llg = _llguidance()
        tokenizer = self.lltokenizer()
        matcher = _engine_call(p.kind, llg.LLMatcher, tokenizer, grammar, log_level=0)   # compiles without the GIL
        if matcher.is_error():
            raise GrammarError(p.kind)
        with self._lock:
            if grammar not in self._templates:
                self._templates[grammar] = matcher
                self._cached_chars += len(grammar)
            while self._templates and (len(self._templates) > self.max_cached
                                       or self._cached_chars > self.max_cached_chars):
                self._cached_chars -= len(self._templates.popitem(last=False)[0])
        return matcher

    def matcher(self, p: StructuredOutputsParams):
        """A fresh matcher for one request (a copy of the cached compiled one)."""
        return self.template(p).deep_copy()


class MaskJob:
    """One step's bitmask, being computed (wait() returns it once done)."""

    def __init__(self, bitmask: np.ndarray, mask_rows: np.ndarray, future: Future | None):
        self.bitmask = bitmask        # [M, W] int32, row k for the k-th constrained row
        self.mask_rows = mask_rows    # [R] int32: bitmask row of each sampling row, -1 = none
        self._future = future

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        if self._future is not None:
            self._future.result()
            self._future = None
        return self.bitmask, self.mask_rows


class StructuredOutputs:
    """The engine thread's matchers, one per constrained request, and each step's mask work.
    overlap=False computes the masks on the calling thread (the reference the tests compare
    the overlapped path with; also what a caller with no spare core may prefer)."""

    def __init__(self, grammars: Grammars, *, overlap: bool = True, num_threads: int | None = None):
        self.grammars = grammars
        self.overlap = overlap
        self.matchers: dict[str, Any] = {}
        self._num_threads = num_threads
        self._executor = None        # llguidance's thread pool, made on first use
        self._helper: ThreadPoolExecutor | None = None
        self._bitmask = np.zeros((0, grammars.mask_words), np.int32)

    def add(self, request) -> None:
        p = request.sampling_params.structured_outputs
        if p is not None:
            self.matchers[request.request_id] = self.grammars.matcher(p)

    def remove(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)

    def start_step(self, sched_out) -> MaskJob | None:
        """Start computing the bitmask of the step's constrained sampling rows; None when it
        has none (the sampler then takes no mask)."""
        if not self.matchers:
            return None
        matchers = self.matchers
        rows: list[tuple[Any, int]] = []
        mask_rows: list[int] = []
        for c in sched_out.chunks:
            if c.sample:
                m = matchers.get(c.request.request_id)
                if m is None:
                    mask_rows.append(-1)
                else:
                    mask_rows.append(len(rows))
                    rows.append((m, len(rows)))
        if not rows:
            return None
        if self._bitmask.shape[0] < len(rows):
            self._bitmask = np.zeros((max(len(rows), 2 * self._bitmask.shape[0]), self.grammars.mask_words),
                                     np.int32)
        bitmask = self._bitmask[:len(rows)]
        if self._executor is None:
            llg = _llguidance()
            self._executor = llg.LLExecutor(num_threads=self._num_threads)
        args = (rows, bitmask.ctypes.data, bitmask.shape[1] * 4, len(rows))
        future = None
        if self.overlap:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(1, thread_name_prefix="lite-llm-grammar")
            future = self._helper.submit(self._executor.unsafe_compute_mask_ptr, *args)
        else:
            self._executor.unsafe_compute_mask_ptr(*args)
        return MaskJob(bitmask, np.array(mask_rows, np.int32), future)

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance request_id's matcher by its sampled token; True when its grammar has ended
        (or the token broke it: only possible when bans such as min_tokens left the mask no
        token), so the request must stop."""
        m = self.matchers.get(request_id)
        if m is None:
            return False
        ok = m.consume_token(token_id)
        return not ok or m.is_stopped()

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None
