"""Tokenizer: text <-> token ids and chat-template rendering, as transformers does them.

Sources: an HF directory (tokenizer.json, or a sentencepiece tokenizer.model, plus
tokenizer_config.json) or a GGUF file's tokenizer metadata (rebuilt here as a
`tokenizers.Tokenizer` the way transformers' GGUF converter builds it). Incremental
detokenization for streaming lives with the engine, not here.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from datetime import datetime
from functools import lru_cache
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

# ---- byte-level alphabet (GPT-2): every byte has a printable stand-in -------------------


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> split regex; others use GPT-2's
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}

_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4     # llama.cpp token_type values


class Tokenizer:
    """encode/decode/apply_chat_template over a `tokenizers.Tokenizer` or a sentencepiece model."""

    def __init__(self, backend: tokenizers.Tokenizer | None = None, *, sp_model: Any = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, unk_token: str | None = None,
                 add_bos_token: bool = False, add_eos_token: bool = False,
                 chat_template: str | None = None, extra_special_tokens: tuple[str, ...] = ()):
        if (backend is None) == (sp_model is None):
            raise ValueError("Tokenizer needs exactly one of a tokenizers backend or a sentencepiece model")
        self._backend = backend
        self._sp = sp_model
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token, self.unk_token = pad_token, unk_token
        self.add_bos_token, self.add_eos_token = add_bos_token, add_eos_token
        self.chat_template = chat_template
        named = [t for t in (bos_token, eos_token, pad_token, unk_token) if t is not None]
        if backend is not None:
            # named special tokens are matched whole and skipped on decode, as transformers does
            backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in named])
            specials = {a.content for a in backend.get_added_tokens_decoder().values() if a.special}
        else:
            specials = set()
        self._special_tokens = specials | set(named) | set(extra_special_tokens)
        self.all_special_ids: set[int] = {i for i in map(self.token_to_id, self._special_tokens) if i is not None}
        self.bos_token_id = self.token_to_id(bos_token) if bos_token is not None else None
        self.eos_token_id = self.token_to_id(eos_token) if eos_token is not None else None
        self.pad_token_id = self.token_to_id(pad_token) if pad_token is not None else None

    def add_special_token(self, text: str) -> int:
        """Match `text` whole as one special token from now on (an id past the vocabulary's
        unless it has one); returns its id. Only for tokenizers with a `tokenizers` backend."""
        if self._backend is None:
            raise ValueError("special tokens can only be added to a tokenizers backend")
        self._backend.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        self._special_tokens.add(text)
        tid = self.token_to_id(text)
        self.all_special_ids.add(tid)
        return tid

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str) -> "Tokenizer":
        """From an HF directory: tokenizer.json (or tokenizer.model) + tokenizer_config.json."""
        cfg: dict = {}
        cfg_path = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as fh:
                cfg = json.load(fh)
        special_map_path = os.path.join(path, "special_tokens_map.json")
        if os.path.exists(special_map_path):
            with open(special_map_path, encoding="utf-8") as fh:
                for key, value in json.load(fh).items():
                    cfg.setdefault(key, value)
        template = cfg.get("chat_template")
        template_path = os.path.join(path, "chat_template.jinja")
        if os.path.exists(template_path):
            with open(template_path, encoding="utf-8") as fh:
                template = fh.read()
        if isinstance(template, list):      # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        kwargs = dict(bos_token=_token_str(cfg.get("bos_token")), eos_token=_token_str(cfg.get("eos_token")),
                      pad_token=_token_str(cfg.get("pad_token")), unk_token=_token_str(cfg.get("unk_token")),
                      chat_template=template)
        json_path = os.path.join(path, "tokenizer.json")
        if os.path.exists(json_path):
            backend = tokenizers.Tokenizer.from_file(json_path)
            # a tokenizer.json saved for training may pad and truncate every encoding (BERT
            # checkpoints: to 128): lengths are the engine's business
            backend.no_padding()
            backend.no_truncation()
            # tokenizer.json's post-processor decides BOS/EOS; transformers (5.x) loads a tokenizer.json
            # tokenizer without applying tokenizer_config's add_bos_token, and so do we
            return cls(backend, **kwargs)
        sp_path = os.path.join(path, "tokenizer.model")
        if os.path.exists(sp_path):
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=sp_path)
            for key, piece_id in (("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()), ("unk_token", sp.unk_id())):
                if kwargs[key] is None and piece_id >= 0:
                    kwargs[key] = sp.id_to_piece(piece_id)
            return cls(sp_model=sp, add_bos_token=bool(cfg.get("add_bos_token", True)),
                       add_eos_token=bool(cfg.get("add_eos_token", False)), **kwargs)
        raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model")

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "Tokenizer":
        """From llama.cpp tokenizer metadata (tokenizer.ggml.*), built like transformers' GGUF converter."""
        kind = meta.get("tokenizer.ggml.model")
        tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
        types: list[int] = meta.get("tokenizer.ggml.token_type") or []
        if not tokens:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        byte_level = kind == "gpt2"
        if kind == "bert":   # llama.cpp's WordPiece: its own [CLS] A [SEP] template, nothing else to add
            return cls(_wordpiece_backend(meta, tokens), unk_token="[UNK]" if "[UNK]" in tokens else None,
                       pad_token="[PAD]" if "[PAD]" in tokens else None)
        if kind == "gpt2":
            backend, add_bos_default = _byte_level_backend(meta, tokens, types), False
        elif kind == "llama":
            backend, add_bos_default = _sentencepiece_backend(meta, tokens), True
        else:
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
        alphabet = set(_byte_alphabet().values())
        control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                   if ty == _TOKEN_CONTROL and (not byte_level or set(t) <= alphabet)]
        if control:
            backend.add_special_tokens(control)
        vocab = backend.get_vocab()
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types)
                if ty == _TOKEN_USER_DEFINED and t in vocab]
        if user:
            backend.add_tokens(user)

        def token(key: str) -> str | None:
            idx = meta.get(f"tokenizer.ggml.{key}")
            return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

        tok = cls(backend, bos_token=token("bos_token_id"), eos_token=token("eos_token_id"),
                  pad_token=token("padding_token_id"), unk_token=token("unknown_token_id"),
                  add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
                  add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                  chat_template=meta.get("tokenizer.chat_template"))
        tok._set_post_processor()
        return tok

    def _set_post_processor(self) -> None:
        """BOS/EOS around each sequence per add_bos_token/add_eos_token (transformers' update_post_processor)."""
        add_bos = self.add_bos_token and self.bos_token is not None
        add_eos = self.add_eos_token and self.eos_token is not None
        single = f"{(self.bos_token + ':0 ') if add_bos else ''}$A:0{(' ' + self.eos_token + ':0') if add_eos else ''}"
        pair = f"{single}{(' ' + self.bos_token + ':1') if add_bos else ''} $B:1" \
               f"{(' ' + self.eos_token + ':1') if add_eos else ''}"
        special = []
        if add_bos:
            special.append((self.bos_token, self.bos_token_id))
        if add_eos:
            special.append((self.eos_token, self.eos_token_id))
        self._backend.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                                     special_tokens=special)

    # ---- text <-> ids ----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary plus added tokens (the ids encode can return)."""
        if self._sp is not None:
            return self._sp.get_piece_size()
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        if self._sp is not None:
            i = self._sp.piece_to_id(token)
            return None if i == self._sp.unk_id() and token != self._sp.id_to_piece(i) else i
        return self._backend.token_to_id(token)

    def max_bytes_per_token(self) -> int | None:
        """The most bytes of input text one token can stand for, or None if unbounded.

        So a text of B bytes yields at least ceil(B / this) tokens, which lets a server refuse
        a text too long for its context without tokenizing it. The bound is the longest
        vocabulary or added token, counted in the bytes it is spelled with (a byte-level BPE
        piece: one character a byte), times 4 when a Unicode normalizer may shrink text first
        (NFKC maps a 4-byte mathematical letter to one ASCII byte). There is no bound when the
        pipeline can drop or merge text of any length: sentencepiece (collapses whitespace),
        WordPiece and fused unknown tokens (a word of any length -> one [UNK]), a normalizer or
        pre-tokenizer that removes characters, added tokens that swallow nearby whitespace.
        """
        if self._backend is None:
            return None
        if not hasattr(self, "_max_token_bytes"):
            self._max_token_bytes = _max_bytes_per_token(self._backend.to_str())
        return self._max_token_bytes

    def backend_json(self) -> str | None:
        """The tokenizers pipeline as its tokenizer.json text (the grammar engine builds its
        token trie from it); None for a sentencepiece model."""
        return None if self._backend is None else self._backend.to_str()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._sp is not None:
            ids = list(self._sp.encode(text))
            if add_special_tokens:
                if self.add_bos_token and self.bos_token_id is not None:
                    ids.insert(0, self.bos_token_id)
                if self.add_eos_token and self.eos_token_id is not None:
                    ids.append(self.eos_token_id)
            return ids
        if len(text) < _GIL_FREE_CHARS:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        # encode_batch runs without the GIL (encode holds it): other threads keep serving
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.decode_ints([int(i) for i in ids], skip_special_tokens)

    def decode_ints(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """decode() of a list of Python ints as they are (the incremental detokenizer calls
        this twice per generated token; converting each id again would cost a third)."""
        if self._sp is not None:
            if skip_special_tokens:
                ids = [i for i in ids if i not in self.all_special_ids]
            return self._sp.decode(ids)
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def byte_table(self, skip_special_tokens: bool = True) -> list[bytes] | None:
        """The bytes each token id decodes to, when decode(ids) is exactly the UTF-8 of their
        concatenation (a lossy decode: U+FFFD for invalid bytes), else None. That holds for a
        byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): the ByteLevel decoder maps each token's
        characters back through the byte alphabet (a token with a character outside it gives
        its own UTF-8), ids unknown to the vocabulary give nothing, and skipped special tokens
        give nothing. Not for sentencepiece-style decoders (their leading-space strip and
        per-byte fallback depend on the neighbours). Built once per tokenizer (~30 ms)."""
        tables = getattr(self, "_byte_tables", None)
        if tables is None:
            tables = self._byte_tables = _byte_tables(self._backend, self.all_special_ids)
        return tables[skip_special_tokens] if tables else None

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        if self._sp is not None:
            return [self._sp.id_to_piece(int(i)) for i in ids]
        return [self._backend.id_to_token(int(i)) for i in ids]

    # ---- chat ------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            chat_template: str | None = None, tools: list[dict] | None = None,
                            **extra: Any) -> str:
        """Render messages with the model's Jinja chat template, like transformers (tokenize=False)."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("this model has no chat template; pass chat_template=")
        variables = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token),
                                       ("pad_token", self.pad_token), ("unk_token", self.unk_token))
                     if v is not None}
        variables.update(extra)
        messages = [_alias_reasoning(dict(m)) for m in messages]
        compiled = _compile(template)
        # a template may repeat what it was given: its bound on text grows with its input
        _budget.start(TEMPLATE_MAX_CHARS + 2 * _text_size((messages, tools, variables)))
        try:
            return compiled.render(messages=messages, tools=tools, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables)
        finally:
            _budget.stop()


_GIL_FREE_CHARS = 4096     # longer texts are tokenized with the GIL released
_SAFE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace", "Sequence"}
_SAFE_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "Sequence",
                        "UnicodeScripts"}


def _max_bytes_per_token(spec: str) -> int | None:
    """max_bytes_per_token from a tokenizers JSON document (see Tokenizer.max_bytes_per_token)."""
    cfg = json.loads(spec)
    model = cfg.get("model") or {}
    if model.get("type") != "BPE":
        return None
    if model.get("unk_token") is not None and model.get("fuse_unk") and not model.get("byte_fallback"):
        return None
    shrink = 1

    def walk(node: Any, kinds: set[str], key: str) -> bool:
        nonlocal shrink
        if node is None:
            return True
        kind = node.get("type")
        if kind not in kinds:
            return False
        if kind == "Sequence":
            return all(walk(n, kinds, key) for n in node.get(key) or [])
        if kind in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase"):
            shrink = max(shrink, 4)
        if kind == "Replace":
            pattern, content = (node.get("pattern") or {}).get("String"), node.get("content") or ""
            if pattern is None or not content:
                return False
            shrink = max(shrink, -(-len(pattern.encode()) // len(content.encode())))
        if str(node.get("behavior", "")).lower() == "removed":
            return False
        return True

    if not walk(cfg.get("normalizer"), _SAFE_NORMALIZERS, "normalizers"):
        return None
    pre = cfg.get("pre_tokenizer")
    if not walk(pre, _SAFE_PRE_TOKENIZERS, "pretokenizers"):
        return None
    added = cfg.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") for a in added):
        return None
    byte_level = '"ByteLevel"' in json.dumps(pre)
    vocab = model.get("vocab") or {}
    longest = max((len(t) if byte_level else len(t.encode("utf-8")) for t in vocab), default=1)
    longest = max([longest, *(len(a.get("content", "").encode("utf-8")) for a in added)])
    return max(1, longest) * shrink


def _byte_tables(backend: tokenizers.Tokenizer | None, special_ids: set[int]
                 ) -> tuple[list[bytes], list[bytes]] | None:
    """(table keeping special tokens, table skipping them) for Tokenizer.byte_table, or None
    when the backend's decode is not a byte-level one."""
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    # alphabet character -> its byte; a latin-1 character outside the alphabet -> U+FFFF, so
    # that encode("latin-1") fails and the token falls back to its own UTF-8 as the decoder does
    trans = {ord(c): b for b, c in _byte_alphabet().items()}
    for x in range(256):
        trans.setdefault(x, 0xFFFF)
    vocab = backend.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        try:
            table[i] = token.translate(trans).encode("latin-1")
        except UnicodeEncodeError:
            table[i] = token.encode("utf-8")
    skipping = list(table)
    for i in special_ids | {i for i, a in backend.get_added_tokens_decoder().items() if a.special}:
        if i < len(skipping):
            skipping[i] = b""
    return table, skipping


def _token_str(value: Any) -> str | None:
    """tokenizer_config's special tokens are strings or AddedToken dicts {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _alias_reasoning(message: dict) -> dict:
    # older names for a message's reasoning, as transformers aliases them
    for key in ("reasoning_content", "thinking", "reasoning"):
        if message.get(key) is not None:
            return {"thinking": message[key], **message, "reasoning_content": message[key]}
    return message


# ---- chat templates: jinja2's sandbox with bounded work and memory ----------------------------
#
# A template is a program: the model's own, --chat-template, or (when the server trusts them) a
# client's. Each render gets a budget, checked in the sandbox's hooks: every operator that can
# multiply text or lists (`*`, `+`, `%`, `**`, `~`), every call and filter, every loop iteration
# and every piece of output. Intercepting the operators also stops jinja's optimizer from folding
# `'a' * 500000000` into the compiled template (which the compiled-template cache would then keep).

TEMPLATE_MAX_CHARS = 1 << 20          # characters of one text a render builds, beyond 2x its input's text
TEMPLATE_MAX_BUILT = 32               # all text a render builds, in multiples of the above
TEMPLATE_MAX_ITEMS = 100_000          # items of one list a template builds (jinja's own MAX_RANGE)
TEMPLATE_MAX_ITERATIONS = 1_000_000   # loop iterations of one render
TEMPLATE_MAX_SECONDS = 0.5            # CPU time of the rendering thread for one render
TEMPLATE_MAX_INT_BITS = 4096          # bits of an integer a template computes
_CHECK_EVERY = 64                     # hooks between two looks at the thread's CPU clock
# filters that neither copy nor stringify their arguments: no need to weigh containers passed to them
_CHEAP_FILTERS = {"length", "count", "first", "last", "default", "d", "trim", "lower", "upper",
                  "capitalize", "title", "int", "float", "abs", "round", "attr", "select", "reject",
                  "selectattr", "rejectattr", "map", "items", "bool", "min", "max", "sum", "random"}
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")


class TemplateLimitError(ValueError):
    """A chat template broke one of its bounds (the message names the bound, not the template)."""


class _Budget(threading.local):
    """The running render's counters (one render per thread at a time)."""
    limit = TEMPLATE_MAX_CHARS    # characters of one text (outside a render: the bare bound)
    running = False
    deadline = 0.0
    iterations = 0
    ticks = 0
    built = 0                     # characters of the strings built so far

    def start(self, limit: int) -> None:
        self.limit, self.running, self.iterations, self.ticks, self.built = limit, True, 0, 0, 0
        self.deadline = time.thread_time() + TEMPLATE_MAX_SECONDS

    def stop(self) -> None:
        self.limit, self.running = TEMPLATE_MAX_CHARS, False

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % _CHECK_EVERY == 0 and self.running and time.thread_time() > self.deadline:
            raise TemplateLimitError(f"chat template rendering exceeds {TEMPLATE_MAX_SECONDS:g} s of CPU time")

    def iterate(self) -> None:
        self.iterations += 1
        if self.iterations > TEMPLATE_MAX_ITERATIONS:
            raise TemplateLimitError(f"chat template loops exceed {TEMPLATE_MAX_ITERATIONS} iterations")
        self.tick()


_budget = _Budget()


def _text_size(value: Any) -> int:
    """About the characters of text in a JSON-like value: its JSON's length (the C encoder's speed)."""
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str, check_circular=False))
    except (ValueError, TypeError, RecursionError):
        return 0


def _weight(value: Any, limit: int) -> int:
    """What turning value into text would cost: characters of its strings plus one per other
    item, nested containers counted each time they are referenced (`[[s] * 9] * 9` holds s 81
    times); the walk stops once it passes limit, so it costs at most ~limit steps."""
    total, steps, stack = 0, 0, [value]
    while stack and total <= limit and steps <= TEMPLATE_MAX_ITEMS * 4:
        v = stack.pop()
        steps += 1
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += len(v)
            stack.extend(v)
        else:
            total += 1
    return total if not stack else max(total, limit + 1)


def _check_text(n: int) -> None:
    if n > _budget.limit:
        raise TemplateLimitError(f"chat template output exceeds {_budget.limit} characters")


def _check_items(n: int) -> None:
    if n > TEMPLATE_MAX_ITEMS:
        raise TemplateLimitError(f"chat template list exceeds {TEMPLATE_MAX_ITEMS} items")


def _check_value(value: Any) -> None:
    """A value about to be stringified, joined or serialized stays within the text bound."""
    if isinstance(value, str):
        _check_text(len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        _check_text(_weight(value, _budget.limit))


def _check_format(spec: str) -> None:
    """Widths and precisions in a %- or {}-format string stay within the text bound."""
    if len(spec) > _budget.limit:
        _check_text(len(spec))
    for m in _PERCENT_SPEC.finditer(spec):
        for digits in m.groups():
            if digits and (len(digits) > 9 or int(digits) > _budget.limit):
                _check_text(_budget.limit + 1)
    for m in _BRACE_SPEC.finditer(spec):
        for digits in re.findall(r"\d+", m.group(1)):
            if len(digits) > 9 or int(digits) > _budget.limit:
                _check_text(_budget.limit + 1)


def _check_replace(text: str, old: Any, new: Any) -> None:
    """text.replace(old, new) (the filter or the method) stays within the text bound."""
    _check_text(len(text) + (text.count(str(old)) + 1) * len(str(new)))


def _check_args(args: tuple, kwargs: dict, weigh: bool) -> None:
    """No width beyond the text bound (str.ljust(10**9), center(10**9)); containers that will be
    copied or stringified within it."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and a > _budget.limit:
            _check_text(a)
        elif weigh and isinstance(a, (list, tuple, dict, set, frozenset)):
            _check_value(a)


def _check_result(value: Any) -> Any:
    if type(value) is str:
        n, budget = len(value), _budget
        if n > budget.limit:
            _check_text(n)
        budget.built += n
        if budget.built > TEMPLATE_MAX_BUILT * budget.limit:
            raise TemplateLimitError(f"chat template builds more than {TEMPLATE_MAX_BUILT * budget.limit} "
                                     "characters of text")
    elif isinstance(value, (list, tuple)):
        _check_items(len(value))
    return value


def _check_binop(op: str, left: Any, right: Any) -> None:
    seqs = (str, list, tuple)
    if op == "+" and type(left) is str and type(right) is str:    # the common case, first
        if len(left) + len(right) > _budget.limit:
            _check_text(len(left) + len(right))
        return
    if op == "*":
        seq, n = (left, right) if isinstance(left, seqs) else (right, left)
        if isinstance(seq, seqs) and isinstance(n, int):
            n = max(0, n)
            if isinstance(seq, str):
                _check_text(len(seq) * n)
            else:
                _check_items(len(seq) * n)
                _check_text(_weight(seq, _budget.limit) * n)
        elif isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > TEMPLATE_MAX_INT_BITS:
            raise TemplateLimitError(f"chat template number exceeds {TEMPLATE_MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(left, str) and isinstance(right, str):
            _check_text(len(left) + len(right))
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            _check_items(len(left) + len(right))
    elif op == "%":
        if isinstance(left, str):
            _check_format(left)
            _check_value(right)
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                and right * left.bit_length() > TEMPLATE_MAX_INT_BITS:
            raise TemplateLimitError(f"chat template number exceeds {TEMPLATE_MAX_INT_BITS} bits")


class _Bounded:
    """What a for loop iterates over in a bounded template: the iterable, each step counted."""
    __slots__ = ("items",)

    def __init__(self, items: Any):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        for item in self.items:
            _budget.iterate()
            yield item


def _bounded_filter(name: str, fn: Any) -> Any:
    weigh = name not in _CHEAP_FILTERS

    def bounded(*args: Any, **kwargs: Any) -> Any:
        if not _budget.running:
            # jinja's optimizer calls filters on constants while compiling; refusing here keeps
            # their results (`'x'|center(1000000)`) out of the compiled template, and so out of the cache
            raise TemplateLimitError("filters run only while rendering")
        _budget.tick()
        _check_args(args, kwargs, weigh)
        if name == "format" and args and isinstance(args[0], str):
            _check_format(args[0])
        if name == "indent" and args and isinstance(args[0], str) and len(args) > 1:
            width = args[1] if not isinstance(args[1], int) else " " * min(args[1], _budget.limit + 1)
            _check_text(len(args[0]) + (args[0].count("\n") + 1) * len(str(width)))
        if name == "replace" and len(args) > 3 and isinstance(args[1], str):
            _check_replace(args[1], args[2], args[3])
        return _check_result(fn(*args, **kwargs))

    return functools.update_wrapper(bounded, fn)     # keeps jinja's pass_context/pass_environment marks


@lru_cache(maxsize=None)
def _bounded_environment():
    """(jinja2, the bounded sandbox's Environment class), made once."""
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, Frame
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
            # `a ~ b ~ c` joins through the environment, which weighs the pieces first
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset({"*", "+", "%", "**"})

        def __init__(self, **kwargs: Any):
            super().__init__(finalize=self._finalize_output, **kwargs)

        def wrap_filters(self) -> None:
            self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
            self.filters["_bounded_iter"] = _Bounded

        @staticmethod
        def _finalize_output(value: Any) -> Any:
            _check_value(value)
            return value

        def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):     # every loop counts its iterations
                loop.iter = nodes.Filter(loop.iter, "_bounded_iter", [], [], None, None, lineno=loop.lineno)
            return tree

        def concat(self, pieces: Any) -> str:         # the output, macro results, {% set %} blocks
            parts, total = [], 0
            for piece in pieces:
                total += len(piece)
                _check_text(total)
                _budget.tick()
                parts.append(piece)
            return "".join(parts)

        def bounded_join(self, pieces: tuple) -> str:
            for p in pieces:
                _check_value(p)
            return _check_result("".join(map(str, pieces)))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _budget.tick()
            _check_binop(operator, left, right)
            return _check_result(self.binop_table[operator](left, right))

        def getattr(self, obj: Any, attribute: str) -> Any:
            _budget.tick()
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                _check_format(obj)
            return super().getattr(obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _budget.tick()
            target = getattr(__obj, "__self__", None)
            # str methods (join, format) copy their arguments into text; macros and globals do not
            weigh = isinstance(target, str) or getattr(__obj, "__name__", "") in ("format", "format_map")
            _check_args(args, kwargs, weigh)
            if isinstance(target, str) and getattr(__obj, "__name__", "") == "replace" and len(args) >= 2:
                _check_replace(target, args[0], args[1])
            return _check_result(super().call(__context, __obj, *args, **kwargs))

    return jinja2, BoundedEnvironment


@lru_cache(maxsize=16)
def _compile(template: str):
    from jinja2.ext import loopcontrols
    jinja2, BoundedEnvironment = _bounded_environment()

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; chat templates expect plain JSON
        if (indent if isinstance(indent, int) else len(str(indent or ""))) > 16:
            raise TemplateLimitError("chat template tojson indent exceeds 16 characters")
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        _check_format(fmt)
        return datetime.now().strftime(fmt)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.wrap_filters()
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


# ---- GGUF tokenizer backends ---------------------------------------------------------------


def _merges(meta: dict, tokens: list[str]) -> list[tuple[str, str]]:
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None:
        return [tuple(m.split(" ", 1)) for m in merges]
    # no merges stored: derive them from the vocabulary, best score first (transformers' generate_merges)
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        found.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    found.sort(key=lambda x: (x[2], len(x[0]), len(x[1])), reverse=True)
    return [(a, b) for a, b, _ in found]


def _wordpiece_backend(meta: dict, tokens: list[str]) -> tokenizers.Tokenizer:
    """BERT's WordPiece from llama.cpp's spelling of it (its converter writes a word-initial piece
    as "\u2581x" and a continuation "##x" as "x"): lower-cased, [CLS] A [SEP] (B [SEP])."""
    from tokenizers import normalizers
    vocab = {}
    for i, t in enumerate(tokens):
        if t.startswith("[") and t.endswith("]"):
            piece = t
        elif t.startswith("\u2581"):
            piece = t[1:]
        else:
            piece = "##" + t
        vocab.setdefault(piece, i)
    backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    cls_id, sep_id = vocab.get("[CLS]"), vocab.get("[SEP]")
    if cls_id is not None and sep_id is not None:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens
                                if t.startswith("[") and t.endswith("]")])
    return backend


def _byte_level_backend(meta: dict, tokens: list[str], types: list[int] = ()) -> tokenizers.Tokenizer:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for i, t in enumerate(tokens):
        # a user-defined token (an added token that is not special, e.g. Gemma's "\n\n") is
        # stored as its raw text, as llama.cpp's converter writes it and its tokenizer matches it
        raw = set(t) <= alphabet or (i < len(types) and types[i] == _TOKEN_USER_DEFINED)
        key = t if raw else "".join(spelling[b] for b in t.encode("utf-8"))
        vocab[key] = i
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, tokens), dropout=None,
                                              continuing_subword_prefix="", end_of_word_suffix="",
                                              fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(meta: dict, tokens: list[str]) -> tokenizers.Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, tokens), fuse_unk=True,
                                              byte_fallback=True, dropout=None))
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    return backend
