"""Logprobs in OpenAI's shapes: chat's {"content": [{"token", "logprob", "bytes", "top_logprobs"}]},
completions' parallel lists with text offsets (and the prompt's with echo), vLLM's
prompt_logprobs; a token's raw bytes when its text is part of a UTF-8 character.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from lite_llm.outputs import CompletionOutput, Logprob
from lite_llm.server.context import PreparedRequest

_LOGPROB_FLOOR = -9999.0    # JSON has no -inf; vLLM clamps the same way


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable stand-in character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """The token's raw bytes: a token holding part of a UTF-8 character decodes to U+FFFD, so
    its bytes come from the vocabulary piece (byte-level BPE or sentencepiece <0xNN>)."""
    if "\ufffd" not in text:
        return list(text.encode("utf-8"))
    try:
        piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    except Exception:
        piece = None
    if piece:
        m = _SP_BYTE.fullmatch(piece)
        if m:
            return [int(m.group(1), 16)]
        dec = byte_level_decoder()
        if all(ch in dec for ch in piece):
            return [dec[ch] for ch in piece]
    return list(text.encode("utf-8"))


def token_text(tokenizer: Any, token_id: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _lp(value: float) -> float:
    return max(float(value), _LOGPROB_FLOOR) if not math.isnan(value) else _LOGPROB_FLOOR


def format_logprobs(prep: PreparedRequest, tokenizer: Any, out: CompletionOutput,
                    text_offset: int) -> tuple[Any, int]:
    """Logprobs of one delta in this API's shape; returns (value, text offset after it)."""
    if prep.logprobs is None or out.logprobs is None:
        return None, text_offset
    top_n = prep.logprobs
    if prep.kind == "chat":
        content = []
        for tid, lps in zip(out.token_ids, out.logprobs):
            chosen = lps.get(tid)
            tok = token_text(tokenizer, tid, chosen)
            tops = sorted(lps.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
            content.append({
                "token": tok, "logprob": _lp(chosen.logprob if chosen else -math.inf),
                "bytes": token_bytes(tokenizer, tid, tok),
                "top_logprobs": [{"token": (t := token_text(tokenizer, i, lp)), "logprob": _lp(lp.logprob),
                                  "bytes": token_bytes(tokenizer, i, t)} for i, lp in tops[:top_n]],
            })
        return {"content": content}, text_offset
    tokens, token_lps, tops_out, offsets = [], [], [], []
    for tid, lps in zip(out.token_ids, out.logprobs):
        chosen = lps.get(tid)
        tok = token_text(tokenizer, tid, chosen)
        tokens.append(tok)
        token_lps.append(_lp(chosen.logprob if chosen else -math.inf))
        ranked = sorted(lps.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        top = {token_text(tokenizer, i, lp): _lp(lp.logprob) for i, lp in ranked[:top_n]}
        if top_n > 0:
            top.setdefault(tok, token_lps[-1])
        tops_out.append(top)
        offsets.append(text_offset)
        text_offset += len(tok)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops_out,
            "text_offset": offsets}, text_offset


def merge_logprobs(kind: str, parts: list) -> Any:
    if not parts:
        return None
    if kind == "chat":
        return {"content": [c for p in parts for c in p["content"]]}
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs",
                                                          "top_logprobs", "text_offset")}


def wire_prompt_logprobs(entries: list | None) -> list | None:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {"<id>": {"logprob", "rank",
    "decoded_token"}}."""
    if entries is None:
        return None
    return [None if e is None else {str(t): {"logprob": _lp(lp.logprob), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in e.items()}
            for e in entries]


def echo_logprobs(prep: PreparedRequest, tokenizer: Any, index: int, entries: list, generated: dict,
                   prompt_chars: int) -> dict:
    """Completions' logprobs with echo: the prompt's tokens first (the first has no logprob),
    then the generated ones, text offsets running over the whole echoed text."""
    ids = prep.prompts[index // prep.params.n].token_ids
    tokens, token_lps, tops, offsets, at = [], [], [], [], 0
    for tid, entry in zip(ids, entries):
        chosen = entry.get(tid) if entry else None
        tok = token_text(tokenizer, tid, chosen)
        tokens.append(tok)
        offsets.append(at)
        at += len(tok)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(_lp(chosen.logprob))
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        top = {token_text(tokenizer, i, lp): _lp(lp.logprob) for i, lp in ranked[:prep.logprobs]}
        if prep.logprobs:
            top.setdefault(tok, token_lps[-1])
        tops.append(top)
    return {"tokens": tokens + generated["tokens"], "token_logprobs": token_lps + generated["token_logprobs"],
            "top_logprobs": tops + generated["top_logprobs"],
            "text_offset": offsets + [prompt_chars + o for o in generated["text_offset"]]}
