"""Speech to text with Whisper: audio -> segments with timestamps and text, as transformers'
WhisperForConditionalGeneration.generate (and openai-whisper's transcribe) decode it.

    WhisperModel.from_pretrained(path)            encoder, decoder, tokenizer, generation_config.json
      .transcribe(audio, TranscribeOptions(...))  -> Transcription (text, language, segments)
      .transcribe_iter(...)                       the same, one window at a time (progress, streaming)
      .transcription_steps(...)                   the same as a program that asks for its decoder
                                                  steps (Step) and its other compiled work (Work:
                                                  features, an encoder layer, cross K/V) instead
                                                  of running them: a worker runs the steps of
                                                  several programs as one and the Work in slices
                                                  between them

Decoding of one 30-s window: the prompt <|startoftranscript|> <|lang|> <|task|> (<|notimestamps|>
without timestamps), after <|startofprev|> and the prompt text when there is one; the language,
when none is given, is the likeliest language token after <|startoftranscript|> on the first window;
then greedy (temperature 0) or sampled tokens under Whisper's logits rules (begin_suppress_tokens
at the first position, suppress_tokens everywhere, the timestamp rules of transformers'
WhisperTimeStampLogitsProcessor). A window whose tokens compress too well (a loop) or whose mean
log-probability is too low is decoded again at the next temperature (the fallback). Long audio:
the window after a decoded one starts at its last complete timestamp pair (timestamp-driven
seeking), so a window never cuts a segment in the middle; without timestamps, windows follow each
other 30 s apart.

Features of audio longer than 30 s are the log-mel of the whole file (one normalization, as the
extractor computes it with truncation=False), sliced per window and zero-padded to 3000 frames.
What does not live here: the encoder (whisper.py), the decoder (whisper_decoder.py), audio decoding
(audio.py).
"""
from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from lite_llm.config import check_quantization
from lite_llm.multimodal import audio, word_timing
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.multimodal.whisper import ARCHITECTURES, WhisperEncoder, WhisperError
from lite_llm.multimodal.whisper_decoder import LANGUAGES, WhisperDecoder
from lite_llm.multimodal.whisper_ggml import is_ggml_file

TIME_PRECISION = 0.02          # seconds a timestamp token stands for
FRAME_SECONDS = 0.01           # one feature frame (hop 160 at 16 kHz)
INPUT_STRIDE = 2               # feature frames per encoder row (conv2's stride)
# the work of a window between decoder steps comes in slices of about one encoder layer
# (T 12 C^2 multiply-adds with its attention): one encoder layer a slice, and the cross K/V of
# up to 6 decoder layers (T 2 C^2 each); a long file's log-mel 4096 frames (41 s, ~15 ms) a slice,
# its normalization 32 times as many (a pass over the values, ~1/30 of the FFT's time a frame)
ENCODER_LAYERS_PER_SLICE = 1
CROSS_LAYERS_PER_SLICE = 6
FEATURE_FRAMES_PER_SLICE = 4096
NORMALIZE_FRAMES_PER_SLICE = 32 * FEATURE_FRAMES_PER_SLICE

ALIASES = {"burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb",
           "pushto": "ps", "panjabi": "pa", "moldavian": "ro", "moldovan": "ro", "sinhalese": "si",
           "castilian": "es", "mandarin": "zh"}


@dataclass
class Step:
    """A decoding program's request for one decoder step: WhisperDecoder.step(states, tokens)'s
    logits [len(states), V] are sent back into the program (by run_alone, or by a worker that
    runs the Steps of several programs as one decoder step)."""
    states: list
    tokens: list[list[int]]


@dataclass
class Work:
    """A decoding program's request for one slice of compiled work outside the decoder step (kind:
    "features", "encoder" a layer's worth of a window's encoder pass, "cross" some layers of its
    cross-attention K/V): run() when the program's turn comes, its return value sent back in
    (so a worker can run the decoder steps of other programs between the slices)."""
    kind: str
    run: Callable[[], object]


def run_alone(program, decoder: WhisperDecoder | None):
    """The return value of a decoding program run on its own: each Step one decoder.step, each
    Work run at once."""
    try:
        item = next(program)
        while True:
            item = program.send(item.run() if isinstance(item, Work) else decoder.step(item.states, item.tokens))
    except StopIteration as e:
        return e.value


class TranscriptionError(ValueError):
    """A transcription request that cannot be served (unknown language, bad option); the message
    says which."""


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None         # a code ("en") or name ("english"); None: detected
    task: str = "transcribe"            # or "translate" (to English)
    timestamps: bool | None = None      # None: on for audio longer than one window
    temperature: float | tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)   # tried in turn (the fallback)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    prompt: str | None = None           # text the decoder reads before each window (its style, names)
    max_new_tokens: int | None = None   # per window; None: up to the decoder's positions
    # a window whose <|nospeech|> probability is above this and whose mean log-probability is below
    # logprob_threshold is silence: skipped, no segment (openai-whisper's 0.6; None: never)
    no_speech_threshold: float | None = None
    seed: int | None = 0                # of the sampling at temperatures above 0 (None: fresh each time)
    beam_size: int | None = None        # beam search at temperature 0 (openai-whisper's 5); None: greedy
    length_penalty: float = 1.0         # a finished beam's score: sum of log-probs / length ** this
    # each segment's words with their times (word_timing.py: the cross-attention of the alignment
    # heads, a pass of the window's text through the decoder); the next window then starts where
    # the last word ends, as openai-whisper seeks with word timestamps
    word_timestamps: bool = False


@dataclass
class Segment:
    id: int
    seek: int                       # the window's first feature frame
    start: float                    # seconds
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float = 0.0
    words: list[word_timing.Word] | None = None     # with word_timestamps


@dataclass
class Transcription:
    text: str
    language: str
    duration: float
    segments: list[Segment] = field(default_factory=list)
    task: str = "transcribe"


def language_code(name: str) -> str:
    """A Whisper language code from a code, a name or an alias (any case); TranscriptionError if none."""
    key = name.strip().lower()
    if key in LANGUAGES:
        return key
    if key in ALIASES:
        return ALIASES[key]
    for code, lang in LANGUAGES.items():
        if lang == key:
            return code
    raise TranscriptionError("language: not one of Whisper's languages")


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first, equal values in index order: what
    np.argsort(-values, kind="stable")[:k] gives, without sorting them all (a beam step's
    candidates: beams x vocabulary values, of which 2 x beams are kept)."""
    if k >= values.shape[0]:
        return np.argsort(-values, kind="stable")
    idx, v = None, values
    top = float(values.max())
    gap = 1.0 / 16
    while np.isfinite(top) and gap <= 4096.0:   # the values near the largest, if k of them are
        near = np.flatnonzero(values >= top - gap)
        if near.shape[0] >= k:
            if near.shape[0] <= values.shape[0] // 8:     # (few: a flat distribution has them all near)
                idx, v = near, values[near]
            break
        gap *= 2.0
    if v.shape[0] > 64 * k:                     # the k-th largest by partition, then those above it
        kth = v[np.argpartition(-v, k - 1)[k - 1]]
        above = np.flatnonzero(v > kth)
        keep = np.concatenate([above, np.flatnonzero(v == kth)[:k - len(above)]])
        idx, v = keep if idx is None else idx[keep], v[keep]
    elif idx is None:
        idx = np.arange(v.shape[0])
    return idx[np.lexsort((idx, -v))[:k]]


def compression_ratio(tokens: list[int], vocab_size: int) -> float:
    """Raw bytes / zlib bytes of the tokens (each in ceil(log2(V)/8)-ish little-endian bytes, as
    transformers measures it): above the threshold, the window repeats itself."""
    width = int(math.log2(vocab_size) / 8) + 1
    raw = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def log_mel_long(samples: np.ndarray, n_mels: int) -> np.ndarray:
    """float32 [n_mels, n // 160] log-mel of samples longer than one window, one normalization
    over the whole (WhisperFeatureExtractor with truncation=False), computed in slices of
    frames (float64 FFT, memory bounded by the slice)."""
    return run_alone(log_mel_long_steps(samples, n_mels), None)


def log_mel_long_steps(samples: np.ndarray, n_mels: int):
    """log_mel_long as a program of Work: the log-mel of FEATURE_FRAMES_PER_SLICE frames a slice,
    then the normalization (against the whole file's maximum) a slice of frames at a time."""
    samples = np.asarray(samples)
    n_frames = samples.shape[0] // audio.HOP
    filters = audio.mel_filters(n_mels).T.astype(np.float64)
    window = audio.hann_window()
    logs = np.empty((n_frames, n_mels), np.float64)
    tops = []
    for a in range(0, n_frames, FEATURE_FRAMES_PER_SLICE):
        b = min(a + FEATURE_FRAMES_PER_SLICE, n_frames)
        tops.append((yield Work("features", partial(_log_mel_frames, samples, a, b, window, filters, logs))))
    out = np.empty((n_mels, n_frames), np.float32)
    floor = max(tops) - 8.0
    for a in range(0, n_frames, NORMALIZE_FRAMES_PER_SLICE):
        b = min(a + NORMALIZE_FRAMES_PER_SLICE, n_frames)
        yield Work("features", partial(_log_mel_normalize, logs, a, b, floor, out))
    return out


def _log_mel_frames(samples: np.ndarray, a: int, b: int, window: np.ndarray, filters: np.ndarray,
                    logs: np.ndarray) -> float:
    """logs[a:b] = log10 mel power of frames a..b-1 (the samples reflected at the file's ends,
    as np.pad(mode="reflect") of the whole); their maximum."""
    n, half = samples.shape[0], audio.N_FFT // 2
    idx = np.arange(a * audio.HOP - half, (b - 1) * audio.HOP + half)
    idx = np.abs(idx)
    idx = np.where(idx >= n, 2 * (n - 1) - idx, idx)
    x = samples[idx].astype(np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(x, audio.N_FFT)[::audio.HOP]
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    logs[a:b] = np.log10(np.maximum(power @ filters, 1e-10))
    return float(logs[a:b].max())


def _log_mel_normalize(logs: np.ndarray, a: int, b: int, floor: float, out: np.ndarray) -> None:
    """out[:, a:b] = float32 (max(logs[a:b], floor) + 4) / 4, transposed."""
    out[:, a:b] = ((np.maximum(logs[a:b], floor) + 4.0) / 4.0).T


class WhisperModel:
    """A Whisper checkpoint ready to transcribe: its encoder, decoder, tokenizer and the
    generation settings of its generation_config.json (special token ids, suppressions). path:
    an HF directory or a whisper.cpp model file (whisper_ggml.py)."""

    def __init__(self, encoder: WhisperEncoder, decoder: WhisperDecoder, tokenizer, gen: dict):
        self.encoder, self.decoder, self.tokenizer = encoder, decoder, tokenizer
        self.gen = gen
        self.eot = int(gen["eos_token_id"] if not isinstance(gen["eos_token_id"], list) else gen["eos_token_id"][0])
        self.sot = int(gen["decoder_start_token_id"])
        self.lang_to_id = {k.strip("<|>"): int(v) for k, v in (gen.get("lang_to_id") or {}).items()}
        self.task_to_id = {k: int(v) for k, v in (gen.get("task_to_id") or {}).items()}
        if "no_timestamps_token_id" not in gen:
            raise WhisperError("generation_config.json has no no_timestamps_token_id (needed for timestamps)")
        self.no_timestamps = int(gen["no_timestamps_token_id"])
        self.timestamp_begin = self.no_timestamps + 1
        self.prev_sot = gen.get("prev_sot_token_id")
        self.suppress = [int(t) for t in gen.get("suppress_tokens") or []]
        self.begin_suppress = [int(t) for t in gen.get("begin_suppress_tokens") or []]
        self.max_initial_timestamp_index = gen.get("max_initial_timestamp_index")
        self.multilingual = bool(gen.get("is_multilingual", bool(self.lang_to_id)))
        self.vocab_size = decoder.cfg.vocab_size
        # the word alignment's heads: the checkpoint's, else those OpenAI published for a model of
        # its shape (a whisper.cpp file names none), else the upper half of the layers
        dc = decoder.cfg
        published = word_timing.openai_heads(dc.num_layers, dc.hidden_size, dc.vocab_size, encoder.cfg.num_mel_bins)
        self.alignment_heads = word_timing.alignment_heads(
            gen if gen.get("alignment_heads") or not published else {"alignment_heads": published},
            dc.num_layers, dc.num_heads)

    @classmethod
    def from_pretrained(cls, path: str, kernels="auto", dtype: str = "float32", num_threads: int | None = None,
                        max_requests: int = 2, max_sequences: int = 12,
                        quantization: str | None = None) -> "WhisperModel":
        """quantization: None (the checkpoint's weights in dtype), "q8_0" or "q4_0": an HF
        checkpoint's matrices quantized at load to those ggml blocks (int8 GEMMs, as a quantized
        whisper.cpp file runs); a whisper.cpp file runs in its stored types."""
        if os.path.isfile(path):         # a whisper.cpp model file (ggml-base.bin): weights in its stored formats
            from lite_llm.multimodal import whisper_ggml
            if check_quantization(quantization):        # a user's mistake: one line (cli.user_error)
                raise whisper_ggml.GGMLFileError(f"{path}: a whisper.cpp model file runs in its stored types: "
                                                 "quantization applies to an HF checkpoint (or use a quantized "
                                                 "file, ggml-*-q8_0.bin)")
            return cls(*whisper_ggml.load(path, kernels, num_threads, max_requests, max_sequences))
        enc = WhisperEncoder.from_pretrained(path, kernels=kernels, dtype=dtype, num_threads=num_threads,
                                             quantization=quantization)
        dec = WhisperDecoder.from_pretrained(path, kernels=kernels, dtype=dtype, num_threads=num_threads,
                                             max_requests=max_requests, max_sequences=max_sequences,
                                             quantization=quantization)
        gen_path = os.path.join(path, "generation_config.json")
        if not os.path.exists(gen_path):
            raise WhisperError(f"{path}: no generation_config.json (Whisper's special token ids)")
        with open(gen_path, encoding="utf-8") as fh:
            gen = json.load(fh)
        return cls(enc, dec, Tokenizer.from_dir(path), gen)

    # ---- pieces -------------------------------------------------------------------------------

    def features(self, samples: np.ndarray) -> np.ndarray:
        """[n_mels, frames]: one window's 3000 frames for up to 30 s (compiled), the whole file's
        otherwise."""
        return run_alone(self.features_steps(samples), None)

    def features_steps(self, samples: np.ndarray):
        """features() as a program of Work (one slice for a window, slices of frames for a file)."""
        samples = np.asarray(samples, np.float32).reshape(-1)
        if samples.shape[0] <= audio.N_SAMPLES:
            return (yield Work("features", partial(self.encoder.features, samples)))
        return (yield from log_mel_long_steps(samples, self.encoder.cfg.num_mel_bins))

    def encode_steps(self, window: np.ndarray):
        """A window's encoder rows [T, C] (features [n_mels, 3000]), as a program of Work: the
        encoder cache's, else its encoder pass one slice of ENCODER_LAYERS_PER_SLICE layers at a
        time (WhisperEncoder.start_pass; the rows of encode())."""
        key, rows = self.encoder.cached(window)
        if rows is None:
            run = self.encoder.start_pass(window, ENCODER_LAYERS_PER_SLICE).run
            while rows is None:
                rows = yield Work("encoder", run)
            rows = self.encoder.keep(key, rows)
        return rows

    def cross_steps(self, rows: np.ndarray):
        """The decoder's cross K/V of a window's encoder rows (a CrossKV its decoding states start
        on; the caller releases it), as a program of Work: CROSS_LAYERS_PER_SLICE layers a slice."""
        cross = self.decoder.cross(rows)
        try:
            while not (yield Work("cross", partial(self.decoder.fill_cross, cross, CROSS_LAYERS_PER_SLICE))):
                pass
        except BaseException:
            self.decoder.release_cross(cross)
            raise
        return cross

    def decode_text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t < self.eot], skip_special_tokens=True)

    def detect_language(self, rows: np.ndarray) -> tuple[str, dict[str, float]]:
        """(code, probabilities of each language) of a window's encoder rows (or of its filled
        CrossKV: WhisperDecoder.start takes either, as the decode_* methods do)."""
        return run_alone(self.detect_language_steps(rows), self.decoder)

    def detect_language_steps(self, rows: np.ndarray):
        """detect_language as a program of Steps."""
        if not self.lang_to_id:
            return "en", {"en": 1.0}
        st = self.decoder.start(rows)
        try:
            logits = (yield Step([st], [[self.sot]]))[0]
        finally:
            self.decoder.release(st)
        codes = list(self.lang_to_id)
        v = logits[[self.lang_to_id[c] for c in codes]].astype(np.float64)
        p = np.exp(v - v.max())
        p /= p.sum()
        return codes[int(np.argmax(v))], dict(zip(codes, p.tolist()))

    def _process(self, logits: np.ndarray, generated: list[int], timestamps: bool) -> np.ndarray:
        """Whisper's logits rules in transformers' order: begin_suppress_tokens at the first
        position, suppress_tokens, then the timestamp rules (float32 in, float32 out)."""
        s = logits.astype(np.float32, copy=True)
        if not generated and self.begin_suppress:
            s[self.begin_suppress] = -np.inf
        if self.suppress:
            s[self.suppress] = -np.inf
        if not timestamps:
            return s
        tb = self.timestamp_begin
        s[self.no_timestamps] = -np.inf
        last_ts = len(generated) >= 1 and generated[-1] >= tb
        penult_ts = len(generated) < 2 or generated[-2] >= tb
        if last_ts:
            if penult_ts:
                s[tb:] = -np.inf                 # a pair is closed: text (or EOT) next
            else:
                s[:self.eot] = -np.inf           # an open timestamp: another timestamp or EOT
        stamps = [t for t in generated if t >= tb]
        if stamps:
            floor = stamps[-1] if (last_ts and not penult_ts) else stamps[-1] + 1
            s[tb:floor] = -np.inf                # timestamps never go back
        if not generated:
            s[:tb] = -np.inf                     # the first token is a timestamp
            if self.max_initial_timestamp_index is not None:
                s[tb + int(self.max_initial_timestamp_index) + 1:] = -np.inf
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            # timestamps together likelier than any text token: log sum_ts p > max_text log p, i.e.
            # sum_ts exp(z - m) > exp(max_text z - m) (one exp pass, no log-softmax array)
            m = float(s.max())
            if np.sum(np.exp(s[tb:].astype(np.float64) - m)) > np.exp(float(s[:tb].max()) - m):
                s[:tb] = -np.inf
        return s

    def prompt_tokens(self, language: str | None, task: str, timestamps: bool, prompt: str | None) -> list[int]:
        init = [self.sot]
        if self.multilingual and self.lang_to_id:
            if language not in self.lang_to_id:
                raise TranscriptionError("language: not supported by this model")
            init.append(self.lang_to_id[language])
            if task not in self.task_to_id:
                raise TranscriptionError("task: not supported by this model")
            init.append(self.task_to_id[task])
        if not timestamps:
            init.append(self.no_timestamps)
        if prompt:
            if self.prev_sot is None:
                raise TranscriptionError("prompt: this model has no <|startofprev|> token")
            text = self.tokenizer.encode(" " + prompt.strip(), add_special_tokens=False)
            text = text[-(self.decoder.cfg.max_target_positions // 2 - 1):]
            init = [int(self.prev_sot), *text, *init]
        return init

    def decode_beams(self, rows: np.ndarray, prompt: list[int], timestamps: bool, max_new_tokens: int | None,
                     num_beams: int, length_penalty: float = 1.0) -> tuple[list[int], float, float]:
        return run_alone(self.decode_beams_steps(rows, prompt, timestamps, max_new_tokens, num_beams,
                                                 length_penalty), self.decoder)

    def decode_beams_steps(self, rows: np.ndarray, prompt: list[int], timestamps: bool, max_new_tokens: int | None,
                           num_beams: int, length_penalty: float = 1.0):
        """decode_window's answer by beam search, as transformers' generate(num_beams=...) runs it:
        2 x num_beams candidates a step, the best num_beams unfinished ones go on, a candidate among
        the first num_beams that ends (EOT or the length limit) joins the finished ones with its
        score / length ** length_penalty, until no running beam can beat the worst finished one.
        The mean log-probability returned is the best beam's normalized score (transformers')."""
        dec, B = self.decoder, num_beams
        limit = dec.cfg.max_target_positions - len(prompt)
        if max_new_tokens is not None:
            limit = min(limit, max_new_tokens)
        if limit <= 0:
            raise TranscriptionError("prompt: too long for the model's decoder")
        K = 2 * B
        root = dec.start(rows)
        states = [root]
        try:
            cut = prompt.index(self.sot) + 1
            z = (yield Step([root], [prompt[:cut]]))[0].astype(np.float64)
            p = np.exp(z - z.max())
            no_speech = float(p[self.no_timestamps - 1] / p.sum())
            logits = (yield Step([root], [prompt[cut:]]))[0] if cut < len(prompt) else z.astype(np.float32)
            states += [dec.fork(root) for _ in range(B - 1)]
            logits = np.repeat(logits[None].astype(np.float32), B, axis=0)
            seqs: list[list[int]] = [[] for _ in range(B)]
            scores = np.full(B, -1e9, np.float32)
            scores[0] = 0.0
            fin_scores = np.full(B, -1e9, np.float32)
            fin_seqs: list[list[int]] = [[] for _ in range(B)]
            fin_done = np.zeros(B, bool)
            improvable = True
            n = 0
            while True:
                m = logits.max(axis=1, keepdims=True)
                lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
                lp = np.stack([self._process(lp[b], seqs[b], timestamps) for b in range(B)])
                acc = (lp + scores[:, None]).reshape(-1)
                top = top_k(acc, K)
                cand_scores = acc[top].astype(np.float32)
                parents, toks = top // lp.shape[1], top % lp.shape[1]
                cand = [seqs[pa] + [int(t)] for pa, t in zip(parents, toks)]
                hits = np.array([t == self.eot or n + 1 >= limit for t in toks])
                run = cand_scores + hits.astype(np.float32) * np.float32(-1e9)
                order = np.argsort(-run, kind="stable")[:B]
                norm = cand_scores / np.float32((n + 1) ** length_penalty)
                if not improvable:
                    norm = norm + np.float32(-1e9)
                just = hits & (np.arange(K) < B)
                norm = norm + (~just).astype(np.float32) * np.float32(-1e9)
                m_scores = np.concatenate([fin_scores, norm])
                m_seqs = fin_seqs + cand
                m_done = np.concatenate([fin_done, just])
                best = np.argsort(-m_scores, kind="stable")[:B]
                fin_scores, fin_seqs, fin_done = m_scores[best], [m_seqs[i] for i in best], m_done[best]
                n += 1
                scores = run[order]
                seqs = [cand[i] for i in order]
                worst = np.where(fin_done, fin_scores.min(), np.float32(-1e9))
                improvable = improvable and bool(np.any(scores[0] / np.float32(n ** length_penalty) > worst))
                if not improvable or hits.all():
                    break
                # the caches follow the beams: a parent's state goes to its first child, others fork it
                taken: set[int] = set()
                new_states = []
                for i in order:
                    pa = int(parents[i])
                    new_states.append(states[pa] if pa not in taken else dec.fork(states[pa]))
                    taken.add(pa)
                for k, st in enumerate(states):
                    if k not in taken:
                        dec.release(st)
                states = new_states
                logits = yield Step(states, [[s[-1]] for s in seqs])
        finally:
            for st in states:
                dec.release(st)
        return fin_seqs[0], float(fin_scores[0]), no_speech

    def decode_window(self, rows: np.ndarray, prompt: list[int], timestamps: bool, temperature: float,
                      max_new_tokens: int | None, rng: np.random.Generator) -> tuple[list[int], float, float]:
        return run_alone(self.decode_window_steps(rows, prompt, timestamps, temperature, max_new_tokens, rng),
                         self.decoder)

    def decode_window_steps(self, rows: np.ndarray, prompt: list[int], timestamps: bool, temperature: float,
                            max_new_tokens: int | None, rng: np.random.Generator):
        """(generated tokens with the final EOT if any, mean log-probability of them, the
        probability of <|nospeech|> after <|startoftranscript|>) of one window."""
        dec = self.decoder
        limit = dec.cfg.max_target_positions - len(prompt)
        if max_new_tokens is not None:
            limit = min(limit, max_new_tokens)
        if limit <= 0:
            raise TranscriptionError("prompt: too long for the model's decoder")
        st = dec.start(rows)
        try:
            cut = prompt.index(self.sot) + 1
            logits = (yield Step([st], [prompt[:cut]]))[0]
            z = logits.astype(np.float64)
            p = np.exp(z - z.max())
            no_speech = float(p[self.no_timestamps - 1] / p.sum())     # <|nospeech|> precedes <|notimestamps|>
            if cut < len(prompt):
                logits = (yield Step([st], [prompt[cut:]]))[0]
            out: list[int] = []
            sum_lp = 0.0
            while True:
                s = self._process(logits, out, timestamps)
                if temperature > 0:
                    z = s.astype(np.float64) / temperature
                    p = np.exp(z - z.max())
                    p /= p.sum()
                    tok = int(rng.choice(p.shape[0], p=p))
                else:
                    tok = int(np.argmax(s))
                m = s.max()         # log p(tok): float32 exps (a vector pass), their sum in float64
                with np.errstate(under="ignore"):
                    sum_lp += float(s[tok] - m) - math.log(float(np.sum(np.exp(s - m), dtype=np.float64)))
                out.append(tok)
                if tok == self.eot or len(out) >= limit:
                    break
                logits = (yield Step([st], [[tok]]))[0]
        finally:
            dec.release(st)
        return out, sum_lp / max(len(out), 1), no_speech

    # ---- transcription ------------------------------------------------------------------------

    def transcribe(self, samples: np.ndarray, options: TranscribeOptions = TranscribeOptions()) -> Transcription:
        result = None
        for result in self.transcribe_iter(samples, options):
            pass
        return result

    def transcribe_iter(self, samples: np.ndarray, options: TranscribeOptions = TranscribeOptions()):
        """Yields the Transcription so far after each window (its .segments growing), the last one
        complete. Samples: float32 mono at 16 kHz."""
        program = self.transcription_steps(samples, options)
        reply = None
        try:
            while True:
                item = program.send(reply)
                if isinstance(item, Step):
                    reply = self.decoder.step(item.states, item.tokens)
                elif isinstance(item, Work):
                    reply = item.run()
                else:
                    reply = None
                    yield item
        except StopIteration:
            return
        finally:
            program.close()

    def transcription_steps(self, samples: np.ndarray, options: TranscribeOptions = TranscribeOptions()):
        """transcribe_iter as a program: yields a Step whenever it needs the decoder (the logits are
        sent back), a Work for each slice of its features, encoder passes and cross K/V (its
        run()'s value is sent back) and the Transcription so far after each window (None is sent
        back)."""
        samples = np.asarray(samples, np.float32).reshape(-1)
        if samples.shape[0] == 0:
            raise TranscriptionError("audio holds no samples")
        if options.task not in ("transcribe", "translate"):
            raise TranscriptionError("task: expected transcribe or translate")
        language = None if options.language is None else language_code(options.language)
        if language is not None and self.lang_to_id and language not in self.lang_to_id:
            raise TranscriptionError("language: not supported by this model")
        temps = options.temperature if isinstance(options.temperature, (tuple, list)) else (options.temperature,)
        temps = tuple(float(t) for t in temps)
        if not temps or any(not 0.0 <= t <= 2.0 for t in temps):
            raise TranscriptionError("temperature: expected values from 0 to 2")
        if options.beam_size is not None and not 1 <= options.beam_size <= self.decoder.max_sequences // 2:
            raise TranscriptionError(f"beam_size: expected 1 to {self.decoder.max_sequences // 2}")
        feats = yield from self.features_steps(samples)
        max_frames = feats.shape[1] if samples.shape[0] > audio.N_SAMPLES else audio.N_FRAMES
        timestamps = options.timestamps if options.timestamps is not None else samples.shape[0] > audio.N_SAMPLES
        rng = np.random.default_rng(options.seed)
        content = samples.shape[0] // audio.HOP          # feature frames of audio (not padding)
        last_speech = 0.0                                # when the last word ended (word timestamps)
        result = Transcription(text="", language=language or "", duration=samples.shape[0] / audio.SAMPLE_RATE,
                               task=options.task)
        seek = 0
        while seek < max_frames:
            n = min(max_frames - seek, audio.N_FRAMES)
            window = feats[:, seek:seek + n]
            if n < audio.N_FRAMES:
                window = np.pad(window, ((0, 0), (0, audio.N_FRAMES - n)))
            rows = yield from self.encode_steps(np.ascontiguousarray(window))
            # the window's cross K/V once, shared by language detection, every temperature tried and
            # the word alignment
            cross = yield from self.cross_steps(rows)
            try:
                if not result.language:
                    result.language = (yield from self.detect_language_steps(cross))[0]
                prompt = self.prompt_tokens(result.language, options.task, timestamps, options.prompt)
                for i, temp in enumerate(temps):
                    if options.beam_size and temp == 0.0:
                        tokens, avg_lp, no_speech = yield from self.decode_beams_steps(
                            cross, prompt, timestamps, options.max_new_tokens, options.beam_size,
                            options.length_penalty)
                    else:
                        tokens, avg_lp, no_speech = yield from self.decode_window_steps(
                            cross, prompt, timestamps, temp, options.max_new_tokens, rng)
                    ratio = compression_ratio(tokens, self.vocab_size)
                    retry = (options.compression_ratio_threshold is not None
                             and ratio > options.compression_ratio_threshold) or \
                            (options.logprob_threshold is not None and avg_lp < options.logprob_threshold)
                    if not retry:
                        break
                if options.no_speech_threshold is not None and no_speech > options.no_speech_threshold and \
                        options.logprob_threshold is not None and avg_lp < options.logprob_threshold:
                    seek += n                                   # silence: no segment
                    yield result
                    continue
                if tokens and tokens[-1] == self.eot:
                    tokens = tokens[:-1]
                segs, advance = self._segments(tokens, seek, n)
                advance = advance if advance > 0 else n         # never the same window twice
                new = [Segment(id=len(result.segments) + i, seek=seek, start=round(start, 3), end=round(end, 3),
                               text=self.decode_text(toks), tokens=toks, temperature=temp, avg_logprob=avg_lp,
                               compression_ratio=ratio, no_speech_prob=no_speech)
                       for i, (start, end, toks) in enumerate(segs)]
                if options.word_timestamps:
                    # the window's audio frames (the padding of a short file's window is not audio)
                    frames = min(n, content - seek)
                    texts = [[t for t in sg.tokens if t < self.eot] for sg in new]
                    alignment = yield Work("align", partial(self.align_words, cross, sum(texts, []),
                                                            result.language, options.task, frames))
                    word_timing.add_word_timestamps(new, texts, alignment, seek * FRAME_SECONDS, last_speech)
                    ends = [w.end for sg in new for w in sg.words]
                    single_ending = [t >= self.timestamp_begin for t in tokens[-2:]] == [False, True]
                    if ends and not single_ending and round(ends[-1] / FRAME_SECONDS) > seek:
                        advance = round(ends[-1] / FRAME_SECONDS) - seek
                        if content <= seek + advance < max_frames:
                            advance = max_frames - seek      # only the padding of a short file's window is left
                    if ends:            # the next window's pause reference: where the last word ends
                        last_speech = ends[-1]
                    # an instantaneous or empty segment is dropped, as openai-whisper clears and
                    # faster-whisper skips them when aligning words
                    new = [sg for sg in new if sg.start != sg.end and sg.text.strip()]
                    for i, sg in enumerate(new):
                        sg.id = len(result.segments) + i
            finally:
                self.decoder.release_cross(cross)
            result.segments.extend(new)
            seek += advance
            result.text = "".join(s.text for s in result.segments)
            yield result

    def align_words(self, cross, text_tokens: list[int], language: str, task: str, frames: int
                    ) -> list[word_timing.WordTiming]:
        """The words of a window's text tokens and when each starts and ends in it (seconds):
        the tokens run behind a prompt without timestamps on the window's cross K/V, the
        alignment heads' cross-attention over its `frames` feature frames aligned to them
        (word_timing.py)."""
        if not text_tokens:
            return []
        prompt = self.prompt_tokens(language, task, False, None)
        tokens = prompt + list(text_tokens) + [self.eot]
        scores = self.decoder.cross_scores(cross, tokens, self.alignment_heads)
        cost = word_timing.alignment_cost(scores, max(frames, 2), kernels=self.decoder.kernels,
                                          num_threads=self.decoder.num_threads)[len(prompt) - 1:-1]
        return word_timing.find_alignment(cost, text_tokens, self._decode_special, self.eot, language, self._dtw)

    def _decode_special(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _dtw(self, cost: np.ndarray):
        kernels = self.decoder.kernels
        if kernels is None:     # deferred: the NumPy-only model has none of its own
            from lite_llm._kernels import kernels
        return kernels.whisper_dtw(cost)

    def _segments(self, tokens: list[int], seek: int, n: int) -> tuple[list[tuple[float, float, list[int]]], int]:
        """(segments (start s, end s, tokens), frames to advance) of one window's tokens, as
        transformers' _retrieve_segment cuts them."""
        tb = self.timestamp_begin
        offset = seek * FRAME_SECONDS
        is_ts = [t >= tb for t in tokens]
        single_ending = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(is_ts) - 1) if is_ts[i] and is_ts[i + 1]]
        if cuts:
            if single_ending:
                cuts.append(len(tokens))
            else:
                cuts[-1] += 1
            segs, last = [], 0
            for j, cut in enumerate(cuts):
                part = tokens[last:cut]
                end_tok = part[-1] if (j < len(cuts) - 1 or single_ending) else part[-2]
                segs.append((offset + (part[0] - tb) * TIME_PRECISION, offset + (end_tok - tb) * TIME_PRECISION, part))
                last = cut
            advance = n if single_ending else (tokens[last - 2] - tb) * INPUT_STRIDE
            return segs, advance
        stamps = [i for i, x in enumerate(is_ts) if x]
        end = int(n * FRAME_SECONDS / TIME_PRECISION)
        if stamps and tokens[stamps[-1]] != tb:
            end = tokens[stamps[-1]] - tb
        return [(offset, offset + end * TIME_PRECISION, tokens)], n


# ---- inputs and outputs -------------------------------------------------------------------------

def whisper_dir(path: str) -> bool:
    """Whether path is an HF Whisper checkpoint directory (WhisperForConditionalGeneration)."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return False
    try:
        with open(cfg, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return False
    return (raw.get("architectures") or [None])[0] in ARCHITECTURES or raw.get("model_type") == "whisper"


def is_whisper_model(path: str) -> bool:
    """Whether path is a Whisper model: an HF directory (whisper_dir) or a whisper.cpp model file
    (its ggml magic; a damaged one still counts, so its loader names what is wrong)."""
    return whisper_dir(path) if os.path.isdir(path) else is_ggml_file(path)


def load_audio(src, cfg: audio.AudioConfig = audio.AudioConfig()) -> np.ndarray:
    """float32 16 kHz mono samples of a path, encoded bytes, or samples already (an array at
    16 kHz); audio.AudioError for a file that cannot be used."""
    if isinstance(src, np.ndarray):
        x = np.asarray(src, np.float32)
        if x.ndim == 2:                         # [channels, n] or [n, channels]: the channels' mean
            x = x.mean(axis=0 if x.shape[0] < x.shape[1] else 1)
        if x.ndim != 1:
            raise audio.AudioError(f"samples of shape {src.shape}: expected [n] at 16 kHz")
        if x.shape[0] > cfg.max_samples:
            raise audio.AudioError(f"audio lasts more than the {cfg.max_seconds:.0f} s allowed")
        return np.ascontiguousarray(x)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return audio.decode_audio(bytes(src), "audio", cfg)
    path = os.fspath(src)
    size = os.path.getsize(path)
    if size > cfg.max_audio_bytes:
        raise audio.AudioError(f"{path} is {size} bytes, more than the {cfg.max_audio_bytes} allowed")
    with open(path, "rb") as fh:
        return audio.decode_audio(fh.read(), os.path.basename(path), cfg)


def progress_bar(done: float, total: float, width: int = 30) -> str:
    """`[#####.....]  12.0/75.0 s` of audio transcribed."""
    k = int(width * done / total) if total > 0 else width
    return f"[{'#' * k}{'.' * (width - k)}] {done:6.1f}/{total:.1f} s"


FORMATS = ("json", "text", "srt", "verbose_json", "vtt")


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def segment_dict(s: Segment) -> dict:
    """One segment as OpenAI's verbose_json lists it."""
    return {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
            "temperature": s.temperature, "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
            "no_speech_prob": s.no_speech_prob}


def word_dict(w: word_timing.Word) -> dict:
    """One word as OpenAI's verbose_json lists it (the word without its leading space)."""
    return {"word": w.word.strip(), "start": w.start, "end": w.end}


def render(result: Transcription, fmt: str, granularities: tuple[str, ...] = ("segment",)) -> tuple[str, str]:
    """(body, content type) of a transcription in one of FORMATS, as OpenAI's audio routes answer;
    verbose_json lists the segments and / or the words (transcribed with word_timestamps) as
    granularities ask."""
    if fmt == "text":
        return result.text.strip() + "\n", "text/plain; charset=utf-8"
    if fmt == "json":
        return json.dumps({"text": result.text.strip(), "usage": {"type": "duration",
                                                                  "seconds": int(math.ceil(result.duration))}}), \
            "application/json"
    if fmt == "verbose_json":
        body = {"task": result.task, "language": LANGUAGES.get(result.language, result.language),
                "duration": round(result.duration, 3), "text": result.text.strip()}
        if "word" in granularities:
            body["words"] = [word_dict(w) for s in result.segments for w in (s.words or [])]
        if "segment" in granularities or "word" not in granularities:
            body["segments"] = [segment_dict(s) for s in result.segments]
        body["usage"] = {"type": "duration", "seconds": int(math.ceil(result.duration))}
        return json.dumps(body), "application/json"
    if fmt == "srt":
        blocks = [f"{i + 1}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
                  for i, s in enumerate(result.segments)]
        return "\n".join(blocks), "text/plain; charset=utf-8"
    if fmt == "vtt":
        blocks = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in result.segments]
        return "WEBVTT\n\n" + "\n".join(blocks), "text/vtt; charset=utf-8"
    raise TranscriptionError(f"response_format: expected one of {', '.join(FORMATS)}")
