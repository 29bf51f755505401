"""Token ids -> text, one token at a time, and stop-string matching on the growing text.

IncrementalDetokenizer decodes a short window of recent ids instead of the whole output
(vLLM's prefix_offset/read_offset scheme), so a token costs the same at any output length: the window starts a few tokens back so that
tokenizers which decide spacing from context (SentencePiece's leading "▁", byte-level BPE's
merged bytes) render the new token as they would inside the full text. A delta is only
released once the window decodes without a trailing U+FFFD, so a character split across
tokens (emoji, CJK in byte-level BPE) is never emitted in halves.

spaces_between_special_tokens is accepted for vLLM parity; like vLLM's fast-tokenizer path,
text comes from tokenizer.decode, which decides the spacing around special tokens itself.

What does not live here: choosing tokens (sampler.py), finish reasons (the engine).
"""
from __future__ import annotations

_INITIAL_CONTEXT = 5     # prompt tokens decoded before the first output token (vLLM's value)
_REPLACEMENT = "\ufffd"  # what decode yields for an incomplete UTF-8 sequence


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
        self.text = ""                     # all output text released so far, grown by each delta
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
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ints(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""


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
