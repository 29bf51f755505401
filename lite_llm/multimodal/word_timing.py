"""Word-level timestamps: when each word of a window's transcript was said, from the decoder's
cross-attention (openai-whisper's timing.py, which faster-whisper and whisper.cpp follow).

A window's text tokens are run once more through the decoder behind a prompt without timestamps
([<|startoftranscript|>, language, task, <|notimestamps|>, text..., <|endoftext|>]); the
cross-attention of a few "alignment heads" (the checkpoint's generation_config.json
`alignment_heads`, else the table below for OpenAI's checkpoints, else every head of the upper
half of the layers) says which encoder frames each token reads. Those weights, softmaxed over the
window's audio frames, standardized over the tokens, median-filtered over the frames and averaged
over the heads, are a cost matrix [tokens, frames]; the monotonic path of least cost through it
(dynamic time warping, kernels.whisper_dtw) gives the frame where each token begins. Tokens are
grouped into words (at spaces, or at whole characters for languages written without them),
punctuation joins its neighbour, and openai-whisper's clamps keep a word after a pause or at a
sentence end from stretching over the silence.

    alignment_heads(gen, layers, heads) -> [(layer, head)]
    alignment_cost(scores, num_frames) -> [tokens, rows]             the cost matrix
    find_alignment(cost, text_tokens, ...) -> [WordTiming]           one window's words, unclamped
    add_word_timestamps(segments, texts, alignment, ...) -> float    the clamps; each segment's .words
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from itertools import product

import numpy as np

TOKENS_PER_SECOND = 50           # encoder rows a second (two feature frames each)
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
# languages written without spaces between words: a word is each run of tokens that decodes to
# whole characters
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}

# The alignment heads OpenAI published for its checkpoints (openai-whisper's _ALIGNMENT_HEADS;
# large-v3-turbo's as whisper.cpp lists them), for files that do not name theirs (whisper.cpp's
# model files), keyed by (decoder layers, width, vocabulary, mel bins). "large" (v1) has the
# shape of large-v2: a file of that shape takes v2's heads.
_OPENAI_HEADS = {
    (4, 384, 51864, 80): [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)],        # tiny.en
    (4, 384, 51865, 80): [(2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)],                          # tiny
    (6, 512, 51864, 80): [(3, 3), (4, 7), (5, 1), (5, 5), (5, 7)],                                  # base.en
    (6, 512, 51865, 80): [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)],          # base
    (12, 768, 51864, 80): [(6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0), (9, 4), (9, 8),
                           (9, 10), (10, 0), (10, 1), (10, 2), (10, 3), (10, 6), (10, 11), (11, 2), (11, 4)],
    (12, 768, 51865, 80): [(5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7), (9, 9), (10, 5)],
    (24, 1024, 51864, 80): [(11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4), (16, 9), (17, 12),
                            (17, 14), (18, 7), (18, 10), (18, 15), (20, 0), (20, 3), (20, 9), (20, 14), (21, 12)],
    (24, 1024, 51865, 80): [(13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)],                # medium
    (32, 1280, 51865, 80): [(10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15), (17, 16), (18, 4),
                            (18, 11), (18, 19), (19, 11), (21, 2), (21, 3), (22, 3), (22, 9), (22, 12),
                            (23, 5), (23, 7), (23, 13), (25, 5), (26, 1), (26, 12), (27, 15)],     # large-v2
    (32, 1280, 51866, 128): [(7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11), (21, 4),
                             (24, 1), (25, 6)],                                                     # large-v3
    (4, 1280, 51866, 128): [(2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)],                     # large-v3-turbo
}


def openai_heads(num_layers: int, width: int, vocab_size: int, num_mel_bins: int) -> list[tuple[int, int]] | None:
    """The published alignment heads of the OpenAI checkpoint of this shape, if one has it."""
    return _OPENAI_HEADS.get((num_layers, width, vocab_size, num_mel_bins))


def alignment_heads(gen: dict, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
    """(layer, head) pairs whose cross-attention aligns tokens to audio: the generation settings'
    `alignment_heads` where valid, else every head of the upper half of the layers (openai-whisper's
    default for a model without published heads)."""
    heads = gen.get("alignment_heads")
    if heads:
        try:
            pairs = sorted({(int(l), int(h)) for l, h in heads})
        except (TypeError, ValueError):
            pairs = []
        if pairs and all(0 <= l < num_layers and 0 <= h < num_heads for l, h in pairs):
            return pairs
    return list(product(range(num_layers // 2, num_layers), range(num_heads)))


def median_filter(x: np.ndarray, width: int, kernels=None, num_threads: int = 1) -> np.ndarray:
    """The median of each run of `width` values along the last axis, edges reflected (a row no
    longer than width // 2 is left as it is). kernels: the compiled loop (median_filter_rows, on
    up to num_threads) runs it where given; this NumPy form is its reference."""
    if width <= 0 or width % 2 != 1:
        raise ValueError("median filter width: an odd number")
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    if kernels is not None and width <= kernels.MEDIAN_MAX_WIDTH:
        rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
        out = np.empty_like(rows)
        kernels.median_filter_rows(rows, width, out, 1 if rows.size < 1 << 20 else num_threads)
        return out.reshape(x.shape)
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def alignment_cost(scores: np.ndarray, num_frames: int, width: int = MEDIAN_FILTER_WIDTH, kernels=None,
                   num_threads: int = 1) -> np.ndarray:
    """float32 [tokens, encoder rows]: scores [heads, tokens, all rows] (each head's q.k / sqrt(D)
    for each token over the window's encoder rows) over the rows of its num_frames feature frames,
    softmaxed, standardized over the tokens, median-filtered over the rows, averaged over the
    heads (openai-whisper's find_alignment); kernels, num_threads: median_filter's."""
    w = np.ascontiguousarray(scores[:, :, :max(num_frames // 2, 1)], np.float32)
    w = np.exp(w - w.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    mean = w.mean(axis=-2, keepdims=True)
    std = w.std(axis=-2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (w - mean) / std
    return median_filter(w, width, kernels, num_threads).mean(axis=0)


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float


@dataclass
class Word:
    """One word of a segment (seconds from the start of the audio)."""
    word: str
    start: float
    end: float
    tokens: list[int] = field(default_factory=list)


def split_to_word_tokens(decode, tokens: list[int], eot: int, language: str | None) -> tuple[list[str], list[list[int]]]:
    """(words, each word's tokens) of tokens (text tokens, then <|endoftext|>). decode: ids ->
    text with special tokens spelled out."""
    full = decode(tokens)
    words, word_tokens, current, offset = [], [], [], 0
    for t in tokens:            # runs of tokens that decode to whole characters
        current.append(t)
        text = decode(current)
        # whole where it has no replacement character, or has the whole text's there (bytes that
        # are not UTF-8 at all; openai-whisper compares the first one only, which loses the rest
        # of a transcript after bytes that never decode)
        if "\ufffd" not in text or full[offset:offset + len(text)] == text:
            words.append(text)
            word_tokens.append(current)
            current = []
            offset += len(text)
    if current:                 # what never decoded whole, then <|endoftext|> on its own
        tail = [current[:-1], current[-1:]] if len(current) > 1 and current[-1] >= eot else [current]
        words += [decode(c) for c in tail]
        word_tokens += tail
    if language in NO_SPACE_LANGUAGES:
        return words, word_tokens
    out_words: list[str] = []
    out_tokens: list[list[int]] = []
    for w, toks in zip(words, word_tokens):     # ... joined into words at spaces and punctuation
        if toks[0] >= eot or w.startswith(" ") or w.strip() in string.punctuation or not out_words:
            out_words.append(w)
            out_tokens.append(list(toks))
        else:
            out_words[-1] += w
            out_tokens[-1].extend(toks)
    return out_words, out_tokens


def find_alignment(cost: np.ndarray, text_tokens: list[int], decode, eot: int, language: str | None, dtw
                   ) -> list[WordTiming]:
    """The words of text_tokens and when each starts and ends (seconds from the window's start).
    cost: alignment_cost's rows for [<|notimestamps|>, text tokens...] (the rows that predict each
    text token and <|endoftext|>); dtw: kernels.whisper_dtw."""
    if not text_tokens:
        return []
    words, word_tokens = split_to_word_tokens(decode, list(text_tokens) + [eot], eot, language)
    if len(word_tokens) <= 1:
        return []
    text_idx, time_idx = dtw(np.ascontiguousarray(-cost, np.float64))
    jumps = np.concatenate([[True], np.diff(text_idx) != 0])
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in word_tokens[:-1]])])
    starts, ends = jump_times[bounds[:-1]], jump_times[bounds[1:]]
    return [WordTiming(w, t, float(s), float(e)) for w, t, s, e in zip(words, word_tokens, starts, ends)]


def merge_punctuations(alignment: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:
    """Opening punctuation joins the word after it, closing punctuation the word before it (the
    merged one is left empty)."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        prev, nxt = alignment[i], alignment[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        prev, nxt = alignment[i], alignment[j]
        if not prev.word.endswith(" ") and nxt.word in appended:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(segments: list, text_tokens: list[list[int]], alignment: list[WordTiming],
                        time_offset: float, last_speech_timestamp: float) -> float:
    """Each of one window's segments (objects with start, end, words; text_tokens: each one's
    text tokens, in order) given its words from the window's alignment, with openai-whisper's clamps: a word at a sentence end, or the first
    words after a pause, at most twice the median word length; a segment's start and end follow
    its words unless a word overhangs them by more than half a second. Returns the time the last
    word ends (the next window's pause reference)."""
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)
    k = 0
    for seg, text in zip(segments, text_tokens, strict=True):
        saved, words = 0, []
        while k < len(alignment) and saved < len(text):
            timing = alignment[k]
            if timing.word:
                words.append(Word(timing.word, round(time_offset + timing.start, 2),
                                  round(time_offset + timing.end, 2), list(timing.tokens)))
            saved += len(timing.tokens)
            k += 1
        if words:
            first = words[0]
            if first.end - last_speech_timestamp > median * 4 and (
                    first.end - first.start > longest
                    or (len(words) > 1 and words[1].end - first.start > longest * 2)):
                if len(words) > 1 and words[1].end - words[1].start > longest:
                    boundary = max(words[1].end / 2, words[1].end - longest)
                    first.end = words[1].start = boundary
                first.start = max(0.0, first.end - longest)
            if seg.start < first.end and seg.start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median, seg.start))
            else:
                seg.start = first.start
            if seg.end > words[-1].start and seg.end + 0.5 < words[-1].end:
                words[-1].end = max(words[-1].start + median, seg.end)
            else:
                seg.end = words[-1].end
            last_speech_timestamp = seg.end
        for w in words:
            w.start, w.end = round(w.start, 3), round(w.end, 3)
        seg.start, seg.end = round(seg.start, 3), round(seg.end, 3)
        seg.words = words
    return last_speech_timestamp
