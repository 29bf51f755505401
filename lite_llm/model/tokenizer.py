"""Tokenizer: text <-> token ids and chat-template rendering, as transformers does them.

Sources: an HF directory (tokenizer.json, or a sentencepiece tokenizer.model, plus
tokenizer_config.json) or a GGUF file's tokenizer metadata (rebuilt here as a
`tokenizers.Tokenizer` the way transformers' GGUF converter builds it). Incremental
detokenization for streaming lives with the engine, not here.
"""
from __future__ import annotations

import json
import os
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
        return _compile(template).render(messages=messages, tools=tools, documents=None,
                                         add_generation_prompt=add_generation_prompt, **variables)


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


@lru_cache(maxsize=16)
def _compile(template: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; chat templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
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
