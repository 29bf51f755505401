"""Token ids -> text, one token at a time, and stop-string matching on the growing text.

IncrementalDetokenizer decodes a short window of recent ids instead of the whole output
(vLLM's prefix_offset/read_offset scheme), so a token costs the same at any output length: the window starts a few tokens back so that
tokenizers which decide spacing from context (SentencePiece's leading "▁", byte-level BPE's
merged bytes) render the new token as they would inside the full text. A delta is only
released once the window decodes without a trailing U+FFFD, so a character split across
tokens (emoji, CJK in byte-level BPE) is never emitted in halves.

spaces_between_special_tokens is accepted for vLLM parity; like vLLM's fast-tokenizer path,
text comes from tokenizer.decode, which decides the spacing around special tokens itself.

make_detokenizer picks ByteDetokenizer, the same deltas from a table of each token's bytes,
for byte-level BPE tokenizers (no tokenizer call per token).

What does not live here: choosing tokens (sampler.py), finish reasons (the engine).
"""
from __future__ import annotations

_INITIAL_CONTEXT = 5     # prompt tokens decoded before the first output token (vLLM's value)
_REPLACEMENT = "\ufffd"  # what decode yields for an incomplete UTF-8 sequence


def _joined(pieces: list[str]) -> str:
    """The pieces as one string, kept as the list's only piece (a str grown by += is copied
    whole at each append: O(n) per token)."""
    if len(pieces) > 1:
        pieces[:] = ["".join(pieces)]
    return pieces[0] if pieces else ""


class IncrementalDetokenizer:
    """Text of the output tokens of one sequence, grown by add().

        ids:   [ ... prompt ... | out0 out1 ... ]
                      prefix_offset ^    ^ read_offset
        text of ids[prefix_offset:read_offset] is already emitted; decoding
        ids[prefix_offset:] and dropping that prefix gives the new delta.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        # the project's Tokenizer takes our ids (Python ints) without converting them again
        self._decode_ints = getattr(tokenizer, "decode_ints", tokenizer.decode)
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._ids: list[int] = [int(t) for t in prompt_token_ids[-_INITIAL_CONTEXT:]]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self.pieces: list[str] = []       # the deltas released so far (text joins them)
        self.token_ids: list[int] = []     # output ids seen so far

    def add(self, token_id: int) -> str:
        """Feed one output token; returns the text it completes (possibly "")."""
        self.token_ids.append(token_id)
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix_offset:])
        if window.endswith(_REPLACEMENT) or len(window) <= len(self._prefix_text):
            return ""     # an incomplete character, or nothing visible yet (a skipped special token)
        delta = window[len(self._prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        # keep only what the next window needs: ids before prefix_offset are never decoded again
        if self._prefix_offset > 0:
            del self._ids[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        self.pieces.append(delta)
        return delta

    @property
    def text(self) -> str:
        """All output text released so far."""
        return _joined(self.pieces)

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ints(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""


class ByteDetokenizer:
    """IncrementalDetokenizer's deltas, for a tokenizer whose decode is the lossy UTF-8 of its
    tokens' bytes concatenated (Tokenizer.byte_table: byte-level BPE). One table lookup and
    one bytes.decode per token instead of two tokenizer decodes.

    Why the deltas are the same: IncrementalDetokenizer releases text only when its window
    decodes without a trailing U+FFFD, i.e. its bytes end on a complete character, where a
    UTF-8 decoder is back in its initial state. From such a point on, decoding the window
    (prefix + new bytes) gives the prefix's text followed by the new bytes' text, so the
    delta is the new bytes alone, decoded: held while they are empty (a skipped special
    token) or end in U+FFFD (an incomplete or invalid sequence), released whole otherwise.
    make_detokenizer checks that the prompt context itself ends on such a point.
    """
    __slots__ = ("table", "_size", "pending", "skip_special_tokens", "pieces", "token_ids")

    def __init__(self, table: list[bytes], skip_special_tokens: bool = True):
        self.table = table
        self._size = len(table)
        self.pending = b""                # bytes of the output tokens not released yet
        self.skip_special_tokens = skip_special_tokens
        self.pieces: list[str] = []       # the deltas released so far (text joins them)
        self.token_ids: list[int] = []

    def add(self, token_id: int) -> str:
        """Feed one output token; returns the text it completes (possibly "")."""
        self.token_ids.append(token_id)
        if token_id < self._size:
            pending = self.pending + self.table[token_id]
        else:
            pending = self.pending         # an id the vocabulary does not know decodes to nothing
        if not pending:
            return ""
        delta = pending.decode("utf-8", "replace")
        if delta[-1] == _REPLACEMENT:
            self.pending = pending
            return ""
        self.pending = b""
        self.pieces.append(delta)
        return delta

    @property
    def text(self) -> str:
        """All output text released so far."""
        return _joined(self.pieces)


def make_detokenizer(tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
    """The incremental detokenizer for one sequence: ByteDetokenizer when the tokenizer has a
    byte table and the prompt context it would start from ends on a whole character,
    IncrementalDetokenizer otherwise (both give the same deltas)."""
    byte_table = getattr(tokenizer, "byte_table", None)
    table = byte_table(skip_special_tokens) if byte_table is not None else None
    if table is not None:
        size = len(table)
        context = b"".join(table[t] for t in prompt_token_ids[-_INITIAL_CONTEXT:] if t < size)
        if not context.decode("utf-8", "replace").endswith(_REPLACEMENT):
            return ByteDetokenizer(table, skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens=skip_special_tokens)


def find_stop(text: str, num_new_chars: int, stop: list[str],
              include_stop_str_in_output: bool) -> tuple[str, int] | None:
    """The stop string completed by the last num_new_chars characters of text, and the length
    to truncate text to (after the stop string if include_stop_str_in_output, else before it).

    Only the tail that can hold a newly completed match is searched (a match must end inside
    the new characters), so earlier text is never rescanned. When several stop strings
    complete in the same delta, the one starting first wins (list order breaks ties).
    """
    best: tuple[str, int] | None = None
    best_index = len(text) + 1
    for s in stop:
        if not s:
            continue
        start = max(0, len(text) - num_new_chars - len(s) + 1)
        index = text.find(s, start)
        if index != -1 and index < best_index:
            best, best_index = s, index
    if best is None:
        return None
    return best, best_index + len(best) if include_stop_str_in_output else best_index


def stop_holdback(text: str, stop: list[str]) -> int:
    """How many trailing characters of text to keep from a stream: the longest suffix that is
    a proper prefix of some stop string (it may yet become that stop string)."""
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold
