"""`lite-llm bench transcribe`: the same audio through lite-llm, faster-whisper (CTranslate2, int8
and float32) and whisper.cpp (pywhispercpp's build) from one HF Whisper directory.

    python -m lite_llm bench transcribe --model WHISPER_DIR [--lengths 5,30,60] [--streams 1,4]
        [--engines lite-llm,lite-llm-q8_0,lite-llm-ggml,faster-whisper-int8,faster-whisper-fp32,whisper.cpp]
        [--json]
    python -m lite_llm bench transcribe --make-model tiny OUT_DIR     # a random Whisper of that shape

The weights: lite-llm reads the directory (fp32; lite-llm-q8_0 its matrices quantized at load to
Q8_0, the int8 GEMMs, beside faster-whisper-int8); faster-whisper a CTranslate2 conversion of it
(ctranslate2's TransformersConverter, int8 or float32); whisper.cpp and lite-llm-ggml one F16
whisper.cpp file written from it as whisper.cpp's convert-h5-to-ggml.py writes it (the format its
users download). Conversions are cached under ~/.cache/lite_llm/peers/. The audio: espeak-ng's
speech when the program is installed (a paragraph, repeated to each length), else a speech-like
synthetic signal (voiced chirps with formant-like harmonics, pauses, noise); the same samples for
every engine. Decoding is alike for all: greedy (--beam-size N: beam search of N beams), temperature
0 with no fallback, timestamps on (--word-timestamps: word timestamps too, by each engine's
cross-attention alignment: whisper.cpp's DTW token timestamps with its preset heads for the shape),
no previous-text conditioning, no VAD, the language given (--language), --max-new-tokens a window
(--make-model's models talk until that limit in every engine, so each decodes the same number of
tokens; whisper.cpp's max_tokens is per segment, and it drops timestamps for a model of 2 decoder
layers, which it takes for a distilled one).

Each (engine, length, streams) runs in a child process of its own (so peak RSS is that engine's
alone), after one warm-up window:
    load_s        model load
    encoder_s     one 30-s window through the encoder (its features excluded)
    wall_s        N streams (threads) transcribing their own copy of the audio at once
    rtf           wall_s / (N x audio seconds): below 1 is faster than real time (x_realtime = 1 / rtf)
    tokens        text tokens decoded (every stream, every window; timestamp and special tokens
                  not counted, as the engines count those differently)
    tok_s         tokens / wall_s
    decode_tok_s  1 stream: tokens / (wall_s - windows x encoder_s), the decoder's own rate
    peak_rss_mib  the child's peak resident set
N streams: lite-llm's TranscriptionEngine decoding N requests together (one decoder step a token
for all of them) on all the threads; faster-whisper one model with num_workers=N, cpu_threads = threads / N; whisper.cpp one
context per stream, threads / N each. Timings here are for a quiet machine: two runs on a shared
one differ by more than the engines do.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from lite_llm.bench.common import CACHE_DIR, ORIGINAL_ENVIRON, peak_rss_bytes, print_table, progress

ENGINES = ("lite-llm", "lite-llm-q8_0", "lite-llm-ggml", "faster-whisper-int8", "faster-whisper-fp32", "whisper.cpp")
RATE = 16000
# released shapes: (d_model, heads, layers) of openai/whisper-*
SHAPES = {"tiny": (384, 6, 4), "base": (512, 8, 6), "small": (768, 12, 12)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="an HF Whisper directory (WhisperForConditionalGeneration with tokenizer.json)")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--lengths", default="5,30,60", help="audio lengths in seconds, comma-separated")
    p.add_argument("--streams", default="1,4", help="concurrent streams, comma-separated")
    p.add_argument("--threads", type=int, default=None, help="threads for every engine (default: this process's cores)")
    p.add_argument("--language", default="en")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens a window at most (default: half the decoder's positions, where the peers stop)")
    p.add_argument("--beam-size", type=int, default=1, help="beams for every engine (default: 1, greedy)")
    p.add_argument("--word-timestamps", action="store_true", help="word timestamps in every engine")
    p.add_argument("--json", action="store_true", help="print every figure as one JSON object instead of the table")
    p.add_argument("--make-model", nargs=2, metavar=("SHAPE", "OUT_DIR"),
                   help=f"write a random HF Whisper of a released shape ({', '.join(SHAPES)}) to OUT_DIR and exit")
    p.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)


# ---- audio ------------------------------------------------------------------------------------

TEXT = ("The quick brown fox jumps over the lazy dog. A meeting about the budget starts at nine, "
        "and the notes go out to everyone by the end of the day. ")


def speech(seconds: float, seed: int = 0) -> tuple[np.ndarray, str]:
    """(float32 16 kHz samples, what they are): espeak-ng's voice when installed, else the
    synthetic speech-like signal."""
    n = int(seconds * RATE)
    espeak = shutil.which("espeak-ng")
    if espeak:
        from lite_llm.multimodal import audio
        with tempfile.TemporaryDirectory() as tmp:
            wav = os.path.join(tmp, "s.wav")
            subprocess.run([espeak, "-w", wav, TEXT * 3], check=True, capture_output=True)
            with open(wav, "rb") as fh:
                voice = audio.decode_audio(fh.read(), "speech.wav")
        return np.resize(voice, n).astype(np.float32), "espeak-ng"
    rng = np.random.default_rng(seed)
    t = np.arange(n) / RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t) + 20 * np.sin(2 * np.pi * 3.1 * t)      # a wandering voice
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    voiced = sum(np.sin(k * phase) / k * (1 + np.sin(2 * np.pi * (0.9 + 0.3 * k) * t)) for k in range(1, 12))
    syllables = (np.sin(2 * np.pi * 4.0 * t) > -0.3) & (np.sin(2 * np.pi * 0.25 * t) > -0.7)   # syllables, pauses
    x = 0.1 * voiced * syllables + 0.01 * rng.standard_normal(n)
    return (x / max(np.abs(x).max(), 1e-6) * 0.5).astype(np.float32), "synthetic"


# ---- weights for the peers --------------------------------------------------------------------

def _key(path: str) -> str:
    h = hashlib.sha1()
    for name in sorted(os.listdir(path)):
        st = os.stat(os.path.join(path, name))
        h.update(f"{name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def _cached(model: str, what: str) -> str:
    return os.path.join(CACHE_DIR, "peers", f"{os.path.basename(os.path.normpath(model))}.{_key(model)}.{what}")


def ct2_model(model: str, quantization: str) -> str:
    """The CTranslate2 conversion of an HF Whisper directory (faster-whisper's format), cached."""
    out = _cached(model, f"ct2-{quantization}")
    if not os.path.isdir(out):
        from ctranslate2.converters import TransformersConverter
        progress(f"converting {model} for faster-whisper ({quantization}) -> {out}")
        files = [f for f in ("tokenizer.json", "preprocessor_config.json") if os.path.exists(os.path.join(model, f))]
        tmp = f"{out}.{os.getpid()}.tmp"
        TransformersConverter(model, copy_files=files).convert(tmp, quantization=quantization, force=True)
        os.replace(tmp, out)
    return out


# openai-whisper's names of the HF tensors (whisper.cpp's convert-h5-to-ggml.py)
_GGML_NAMES = {"self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
               "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
               "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
               "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
               "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
               "encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
               "encoder.embed_positions.weight": "encoder.positional_embedding",
               "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
               "decoder.embed_positions.weight": "decoder.positional_embedding",
               "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}
_F32_NAMES = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
              "decoder.positional_embedding")


def ggml_model(model: str) -> str:
    """The F16 whisper.cpp file of an HF Whisper directory, as convert-h5-to-ggml.py writes it
    (vectors, the convolutions' biases [C, 1] and the positional embeddings F32, the rest F16),
    cached."""
    out = _cached(model, "ggml-f16.bin")
    if os.path.exists(out):
        return out
    from lite_llm.model.hf import SafetensorsCheckpoint
    from lite_llm.model.tokenizer import _byte_alphabet
    from lite_llm.multimodal import audio
    from lite_llm.multimodal.towers import float_tensors
    progress(f"writing {model} as a whisper.cpp F16 file -> {out}")
    with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as fh:
        vocab = sorted(json.load(fh)["model"]["vocab"].items(), key=lambda kv: kv[1])
    byte_of = {c: b for b, c in _byte_alphabet().items()}
    filters = audio.mel_filters(cfg["num_mel_bins"]).astype("<f4")          # [n_mels, 201]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    ckpt = SafetensorsCheckpoint(model)
    try:
        names, get = float_tensors(ckpt, KeyError)
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<12i", 0x67676D6C, cfg["vocab_size"], cfg["max_source_positions"], cfg["d_model"],
                                 cfg["encoder_attention_heads"], cfg["encoder_layers"], cfg["max_target_positions"],
                                 cfg["d_model"], cfg["decoder_attention_heads"], cfg["decoder_layers"],
                                 cfg["num_mel_bins"], 1))
            fh.write(struct.pack("<2i", *filters.shape) + filters.tobytes())
            fh.write(struct.pack("<i", len(vocab)))
            for text, _ in vocab:
                raw = bytes(byte_of[c] for c in text)
                fh.write(struct.pack("<i", len(raw)) + raw)
            for hf in names:
                nn = hf.split(".")
                if nn[0] == "proj_out":
                    continue
                name = ".".join([nn[0], "blocks", nn[2], _GGML_NAMES[".".join(nn[3:-1])], nn[-1]]) \
                    if nn[1] == "layers" else _GGML_NAMES.get(hf, hf)
                data = get(hf)
                if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                    data = data.reshape(-1, 1)
                f32 = data.ndim < 2 or name in _F32_NAMES
                enc = name.encode()
                fh.write(struct.pack("<3i", data.ndim, len(enc), 0 if f32 else 1))
                fh.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)) + enc)
                fh.write(data.astype("<f4" if f32 else "<f2").tobytes())
    finally:
        ckpt.close()
    os.replace(tmp, out)
    return out


def make_model(shape: str, out: str) -> None:
    """A random HF Whisper of a released shape, numbered as the released multilingual ones
    (n_vocab 51865): text tokens are the 256 bytes and two-byte pairs, a tokenizer.json and the
    generation_config.json openai-whisper's rules give (whisper_ggml.generation_settings). It
    never ends a window early (see below): every engine decodes each window to the token limit."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from lite_llm.model.tokenizer import Tokenizer as Ours
    from lite_llm.model.tokenizer import _byte_alphabet
    from lite_llm.multimodal.whisper_ggml import SpecialIds, generation_settings
    from lite_llm.multimodal.word_timing import openai_heads
    d, heads, layers = SHAPES[shape]
    special = SpecialIds(51865)
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    text = [bytes([b]) for b in range(256)] + pairs[:special.eot - 256]
    spell = _byte_alphabet()
    tok = Tokenizer(models.BPE(vocab={"".join(spell[x] for x in t): i for i, t in enumerate(text)},
                               merges=[(spell[t[0]], spell[t[1]]) for t in text[256:]]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in special.names()])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "WhisperTokenizer", "eos_token": "<|endoftext|>"}, fh)
    torch.manual_seed(0)
    sot = special.eot + 1
    config = WhisperConfig(vocab_size=51865, d_model=d, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                           decoder_ffn_dim=4 * d, num_mel_bins=80, max_source_positions=1500, max_target_positions=448,
                           pad_token_id=special.eot, bos_token_id=special.eot, eos_token_id=special.eot,
                           decoder_start_token_id=sot)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        # a talker: the decoder's last norm holds its output's first coordinate at 1, and every
        # special token's and timestamp's embedding row (the output projection's, tied) has -20
        # there, so the end of text and the timestamps are never likely (below e^-12 against the
        # likeliest text token, summed over the 1501 timestamps as the timestamp rule sums them).
        # Every engine then decodes each window to its token limit after the forced first
        # timestamp: the same number of tokens everywhere, so their rates compare (a plain random
        # model ends a window after a number of tokens that differs from engine to engine)
        norm = model.model.decoder.layer_norm
        norm.weight[0], norm.bias[0] = 0.0, 1.0
        model.model.decoder.embed_tokens.weight[special.eot:, 0] = -20.0
    model.save_pretrained(out, safe_serialization=True)
    gen = generation_settings(Ours.from_dir(out), special)
    gen.update(pad_token_id=special.eot, bos_token_id=special.eot, max_length=448,
               # the heads OpenAI published for the shape, as its checkpoints carry them: every
               # engine aligns words with the same heads (CTranslate2's converter reads them here,
               # whisper.cpp takes its preset for the shape)
               alignment_heads=[list(p) for p in openai_heads(layers, d, 51865, 80)])
    with open(os.path.join(out, "generation_config.json"), "w") as fh:
        json.dump(gen, fh, indent=1)


# ---- one engine in a child process ------------------------------------------------------------

class _LiteLLM:
    def __init__(self, spec: dict):
        from lite_llm.multimodal.transcribe import TranscribeOptions, WhisperModel
        path = ggml_model(spec["model"]) if spec["engine"] == "lite-llm-ggml" else spec["model"]
        n = spec["streams"]
        self.model = WhisperModel.from_pretrained(path, num_threads=spec["threads"], max_requests=max(2, n),
                                                  # a beam search holds 2 x its beams while it forks
                                                  max_sequences=max(12, 2 * n * spec["beam_size"]),
                                                  quantization="q8_0" if spec["engine"] == "lite-llm-q8_0" else None)
        self.opts = TranscribeOptions(language=spec["language"], temperature=0.0, compression_ratio_threshold=None,
                                      logprob_threshold=None, timestamps=True,
                                      # unset: half the decoder's positions a window, as the peers
                                      # (openai-whisper's sample_len) stop
                                      max_new_tokens=spec["max_new_tokens"]
                                      or self.model.decoder.cfg.max_target_positions // 2,
                                      beam_size=spec["beam_size"] if spec["beam_size"] > 1 else None,
                                      word_timestamps=spec["word_timestamps"])

    def encode(self, samples: np.ndarray) -> float:
        feats = self.model.features(samples)
        t0 = time.perf_counter()
        self.model.encoder.encode(feats)
        return time.perf_counter() - t0

    def run(self, clips: list[np.ndarray]) -> int:
        from lite_llm.engine.transcription import TranscriptionEngine
        eot = self.model.eot
        if len(clips) == 1:
            results = [self.model.transcribe(clips[0], self.opts)]
        else:
            engine = TranscriptionEngine(self.model, max_num_seqs=len(clips))
            engine.start()
            try:
                jobs = [engine.submit(c, self.opts) for c in clips]
                results = [j.result() for j in jobs]
            finally:
                engine.shutdown()
        return sum(t < eot for r in results for s in r.segments for t in s.tokens)


class _FasterWhisper:
    def __init__(self, spec: dict):
        from faster_whisper import WhisperModel
        quant = "int8" if spec["engine"].endswith("int8") else "float32"
        n = spec["streams"]
        self.model = WhisperModel(ct2_model(spec["model"], quant), device="cpu", compute_type=quant,
                                  cpu_threads=max(1, spec["threads"] // n), num_workers=n)
        self.kw = dict(language=spec["language"], beam_size=spec["beam_size"], temperature=[0.0],
                       compression_ratio_threshold=None, log_prob_threshold=None, no_speech_threshold=None,
                       condition_on_previous_text=False, vad_filter=False, without_timestamps=False,
                       word_timestamps=spec["word_timestamps"])
        if spec["max_new_tokens"]:
            self.kw["max_new_tokens"] = spec["max_new_tokens"]
        self.eot = spec["eot"]

    def encode(self, samples: np.ndarray) -> float:
        feats = self.model.feature_extractor(samples)[:, :3000]
        t0 = time.perf_counter()
        self.model.encode(feats)
        return time.perf_counter() - t0

    def _one(self, clip: np.ndarray) -> int:
        segments, _ = self.model.transcribe(clip, **self.kw)
        return sum(t < self.eot for s in segments for t in s.tokens)

    def run(self, clips: list[np.ndarray]) -> int:
        return sum(_threads(self._one, clips))


class _WhisperCpp:
    def __init__(self, spec: dict):
        from pywhispercpp.model import Model
        path = ggml_model(spec["model"])
        n = spec["streams"]
        self.threads = max(1, spec["threads"] // n)
        kw = dict(n_threads=self.threads, language=spec["language"], temperature=0.0, temperature_inc=0.0,
                  no_context=True, print_progress=False, print_realtime=False, suppress_nst=True,
                  max_tokens=spec["max_new_tokens"] or 0)
        if spec["beam_size"] > 1:
            kw["beam_search"] = {"beam_size": spec["beam_size"], "patience": -1.0}
        context = None
        if spec["word_timestamps"]:     # DTW token timestamps over the shape's preset heads
            import _pywhispercpp as pw
            kw["token_timestamps"] = True
            preset = {"tiny": pw.WHISPER_AHEADS_TINY, "base": pw.WHISPER_AHEADS_BASE,
                      "small": pw.WHISPER_AHEADS_SMALL}.get(spec.get("shape"), pw.WHISPER_AHEADS_N_TOP_MOST)
            context = {"dtw_token_timestamps": True, "dtw_aheads_preset": preset}
        self.models = [Model(path, redirect_whispercpp_logs_to=None, params_sampling_strategy=int(spec["beam_size"] > 1),
                             context_params=context, **kw) for _ in range(n)]

    def encode(self, samples: np.ndarray) -> float:
        import _pywhispercpp as pw
        ctx = self.models[0]._ctx
        pw.whisper_pcm_to_mel(ctx, samples, samples.size, self.threads)
        t0 = time.perf_counter()
        pw.whisper_encode(ctx, 0, self.threads)
        return time.perf_counter() - t0

    def run(self, clips: list[np.ndarray]) -> int:
        import _pywhispercpp as pw

        def one(i: int) -> int:
            m = self.models[i]
            n, eot = len(m.transcribe(clips[i])), pw.whisper_token_eot(m._ctx)
            return sum(pw.whisper_full_get_token_id(m._ctx, s, k) < eot
                       for s in range(n) for k in range(pw.whisper_full_n_tokens(m._ctx, s)))
        return sum(_threads(one, list(range(len(clips)))))


def _threads(fn, items: list) -> list:
    out: list = [None] * len(items)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            out[i] = fn(items[i])
        except BaseException as e:      # re-raised on the calling thread
            errors.append(e)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(items))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return out


def child(spec: dict) -> dict[str, Any]:
    """One engine, one length, one stream count (see the module's docstring)."""
    kind = {"lite-llm": _LiteLLM, "lite-llm-q8_0": _LiteLLM, "lite-llm-ggml": _LiteLLM,
            "faster-whisper-int8": _FasterWhisper,
            "faster-whisper-fp32": _FasterWhisper, "whisper.cpp": _WhisperCpp}[spec["engine"]]
    samples, source = speech(spec["seconds"], seed=1)
    t0 = time.perf_counter()
    eng = kind(spec)
    load_s = time.perf_counter() - t0
    window, _ = speech(30.0, seed=2)
    eng.encode(window)                                       # warm-up: first-call allocations, caches
    encoder_s = eng.encode(window)
    eng.run([window[:RATE * 5]])                             # warm-up of the decoder
    clips = [samples.copy() for _ in range(spec["streams"])]
    t0 = time.perf_counter()
    tokens = eng.run(clips)
    wall = time.perf_counter() - t0
    windows = max(1, int(np.ceil(spec["seconds"] / 30.0)))
    decode_s = wall - windows * encoder_s
    return {"engine": spec["engine"], "audio_s": spec["seconds"], "audio": source, "streams": spec["streams"],
            "threads": spec["threads"], "load_s": load_s, "encoder_s": encoder_s, "wall_s": wall,
            "rtf": wall / (spec["streams"] * spec["seconds"]), "x_realtime": spec["streams"] * spec["seconds"] / wall,
            "tokens": tokens, "tok_s": tokens / wall,
            "decode_tok_s": tokens / decode_s if spec["streams"] == 1 and decode_s > 0 else None,
            "peak_rss_mib": peak_rss_bytes() / 2 ** 20}


def _run_child(spec: dict) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lite-llm-bench-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        env = dict(ORIGINAL_ENVIRON)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.run([sys.executable, "-m", "lite_llm.bench.transcribe", "--child", spec_path, out_path],
                              env=env, stdout=subprocess.DEVNULL)
        if os.path.exists(out_path):
            with open(out_path) as fh:
                return json.load(fh)
        return {"engine": spec["engine"], "audio_s": spec["seconds"], "streams": spec["streams"],
                "error": f"exited with status {proc.returncode} (its stderr is above)"}


# ---- the command --------------------------------------------------------------------------------

COLUMNS = ["engine", "audio_s", "streams", "load_s", "encoder_s", "rtf", "x_realtime", "tokens", "tok_s",
           "decode_tok_s", "peak_rss_mib"]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def run(args: argparse.Namespace) -> int:
    if args.child:
        with open(args.child[0]) as fh:
            result = child(json.load(fh))
        with open(args.child[1], "w") as fh:
            json.dump(result, fh)
        return 0
    if args.make_model:
        shape, out = args.make_model
        if shape not in SHAPES:
            print(f"lite-llm bench transcribe: error: --make-model: shape {shape!r} is not one of {', '.join(SHAPES)}",
                  file=sys.stderr)
            return 2
        make_model(shape, out)
        progress(f"wrote a random Whisper-{shape} to {out}")
        return 0
    if not args.model or not os.path.isfile(os.path.join(args.model, "config.json")):
        print("lite-llm bench transcribe: error: --model must be an HF Whisper directory", file=sys.stderr)
        return 2
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        print(f"lite-llm bench transcribe: error: unknown engines {unknown} (of {', '.join(ENGINES)})", file=sys.stderr)
        return 2
    threads = args.threads or max(1, len(os.sched_getaffinity(0)))
    if args.beam_size < 1:
        print("lite-llm bench transcribe: error: --beam-size must be >= 1", file=sys.stderr)
        return 2
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as fh:
        raw = json.load(fh)
    eot = int(raw["eos_token_id"])
    shape = next((k for k, (c, h, l) in SHAPES.items()
                  if (raw.get("d_model"), raw.get("decoder_attention_heads"), raw.get("decoder_layers")) == (c, h, l)),
                 None)
    for engine in engines:         # conversions first: not in any engine's load time
        if engine.startswith("faster-whisper"):
            ct2_model(args.model, "int8" if engine.endswith("int8") else "float32")
        elif engine in ("whisper.cpp", "lite-llm-ggml"):
            ggml_model(args.model)
    rows = []
    for seconds in [float(x) for x in args.lengths.split(",")]:
        for streams in [int(x) for x in args.streams.split(",")]:
            for engine in engines:
                progress(f"{engine}: {seconds:g} s of audio, {streams} stream(s), {threads} threads")
                rows.append(_run_child({"engine": engine, "model": os.path.abspath(args.model), "seconds": seconds,
                                        "streams": streams, "threads": threads, "language": args.language,
                                        "max_new_tokens": args.max_new_tokens, "eot": eot,
                                        "beam_size": args.beam_size, "word_timestamps": args.word_timestamps,
                                        "shape": shape}))
    if args.json:
        print(json.dumps({"model": os.path.abspath(args.model), "threads": threads, "results": rows}, indent=1))
        return 0
    table = [[_fmt(r.get(c)) for c in COLUMNS] if "error" not in r else
             [r["engine"], _fmt(r["audio_s"]), _fmt(r["streams"]), r["error"]] + [""] * (len(COLUMNS) - 4)
             for r in rows]
    print_table(f"transcription, {threads} threads, audio: {rows[0].get('audio', '?') if rows else '?'}", COLUMNS,
                table)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="lite-llm bench transcribe")
    add_arguments(p)
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
