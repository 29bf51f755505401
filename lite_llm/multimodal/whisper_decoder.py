"""Whisper's text decoder: tokens -> next-token logits, reading one request's encoder rows
through cross-attention.

    WhisperDecoder.from_pretrained(path)        an HF WhisperForConditionalGeneration directory
      .start(encoder_rows) -> DecoderState      a request: its cross K/V (computed once, here) and
                                                an empty self-attention cache
      .cross(encoder_rows) -> CrossKV           the cross K/V alone, computed in slices of layers
      .fill_cross(cross, n)                     (fill_cross), then shared by the states started on
      .start(cross) / .release_cross(cross)     it (start(cross): no K/V computed again)
      .step(states, tokens) -> logits [S, V]    ONE forward over several requests, each with its own
                                                new tokens (a prompt prefill or one token), each
                                                state's caches advanced; the last token's logits
      .fork(state) / .release(state)            a copy of a state (a beam: the parent's full
                                                self-attention blocks shared copy-on-write, its
                                                partly filled last one copied, the cross K/V
                                                shared), its blocks and slots freed
      .cross_scores(cross, tokens, heads)       the cross-attention scores of some heads over a
                                                pass of tokens (word alignment: word_timing.py)
      .reference_logits(rows, tokens)           the plain NumPy forward of one sequence

The model: token embeddings plus learned positions, pre-norm blocks (LayerNorm, causal
self-attention, LayerNorm, cross-attention over the encoder rows, LayerNorm, fc1 / GELU / fc2), a
final LayerNorm and the output projection tied to the token embeddings. k projections have no
bias (as in the encoder).

The compiled path runs a step in one nogil call (kernels.whisper_decoder_step,
lite_llm/_kernels/audio.pxi): every layer and the output projection, the linear layers on the
GEMM kernels (panels of layout.pack) and both attentions on the paged attention kernel, in their
batch-invariant forms (a request's logits are the same bits whatever else the step holds); the
embeddings and block tables are Python's. The self-attention K/V of every request live in blocks of one pool per layer (block_size rows a
block, each request a block table), the cross K/V in blocks of their own, written once by
start(). The interface (a prefill of the prompt, a step over a batch of requests each with its
own caches) is the engine's; the blocks here are pools of the decoder's own rather than the engine's shared
block pool: self-attention blocks for max_sequences sequences, taken as tokens come and shared
between a beam and its forks by reference counts (a shared block is full, so never written
again), and max_requests cross K/V slots shared by a request's states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from lite_llm.config import QUANTIZATIONS, check_quantization
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.weights import bf16_to_f32, to_bf16
from lite_llm.multimodal.llava import _act, _layernorm
from lite_llm.multimodal.towers import float_tensors
from lite_llm.multimodal.whisper import WhisperError, activation, open_checkpoint
from lite_llm.multimodal.whisper_stored import (StoredMatrix, checkpoint_matrices, dense, pack_quantized, pack_stored,
                                               quantizable, stack_rows)

BLOCK = 16          # rows of a KV block (the attention kernel's tile)
# below this many multiply-adds a step (or an op outside one) runs on one thread: a parallel
# region and its barriers cost more than the work when the cores are shared. A decoder step is
# one region (whisper_decoder_step): one token of the tiny shape is ~20 M multiply-adds.
SERIAL_WORK = 1 << 21

# Whisper's languages: code -> name (the tokenizer's table); names and a few aliases are accepted too
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese"}


@dataclass(frozen=True)
class WhisperDecoderConfig:
    vocab_size: int = 51865
    hidden_size: int = 384              # d_model
    num_heads: int = 6                  # decoder_attention_heads
    num_layers: int = 4                 # decoder_layers
    intermediate_size: int = 1536       # decoder_ffn_dim
    max_target_positions: int = 448
    max_source_positions: int = 1500
    eps: float = 1e-5
    act: str = "gelu"

    @classmethod
    def from_hf(cls, raw: dict) -> "WhisperDecoderConfig":
        if raw.get("scale_embedding"):
            raise WhisperError("scale_embedding is not supported (Whisper checkpoints leave it off)")
        return cls(vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["d_model"]),
                   num_heads=int(raw["decoder_attention_heads"]), num_layers=int(raw["decoder_layers"]),
                   intermediate_size=int(raw["decoder_ffn_dim"]),
                   max_target_positions=int(raw.get("max_target_positions", 448)),
                   max_source_positions=int(raw.get("max_source_positions", 1500)), act=activation(raw))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def read_hf(source: str, cfg: WhisperDecoderConfig, lazy: bool = False) -> dict:
    """The decoder of an HF Whisper directory as float32 tensors: "embed" [V, C] (also the output
    projection), "pos" [P, C], per block blk.{i}.{ln1,ln2,ln3}.{w,b} (before self-attention,
    cross-attention, the MLP), q/k/v/o (self), cq/ck/cv/co (cross), up/down (fc1/fc2), each .w/.b
    (k and ck biases zero), and "ln.w"/"ln.b". lazy: the matrices (embed and the .w of q .. down)
    as CheckpointMatrix, each read when it is packed (the vectors and "pos" read now)."""
    ckpt = SafetensorsCheckpoint(source)
    try:
        names, get = float_tensors(ckpt, lambda name: WhisperError(f"{source}: the checkpoint has no tensor {name}"))
        mat = checkpoint_matrices(ckpt, names, get, lazy)
        d, C = "decoder.", cfg.hidden_size
        t = {"embed": mat(d + "embed_tokens.weight"), "pos": get(d + "embed_positions.weight"),
             "ln.w": get(d + "layer_norm.weight"), "ln.b": get(d + "layer_norm.bias")}
        for i in range(cfg.num_layers):
            p, q = f"{d}layers.{i}.", f"blk.{i}."
            for ours, theirs in (("ln1", "self_attn_layer_norm"), ("ln2", "encoder_attn_layer_norm"),
                                 ("ln3", "final_layer_norm")):
                t[q + ours + ".w"], t[q + ours + ".b"] = get(p + theirs + ".weight"), get(p + theirs + ".bias")
            for ours, theirs in (("q", "self_attn.q_proj"), ("v", "self_attn.v_proj"),
                                 ("o", "self_attn.out_proj"), ("cq", "encoder_attn.q_proj"),
                                 ("cv", "encoder_attn.v_proj"), ("co", "encoder_attn.out_proj"),
                                 ("up", "fc1"), ("down", "fc2")):
                t[q + ours + ".w"], t[q + ours + ".b"] = mat(p + theirs + ".weight"), get(p + theirs + ".bias")
            for ours, theirs in (("k", "self_attn.k_proj"), ("ck", "encoder_attn.k_proj")):
                t[q + ours + ".w"] = mat(p + theirs + ".weight")
                t[q + ours + ".b"] = np.zeros(C, np.float32)
    finally:
        ckpt.close()
    C, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    want = {"embed": (V, C), "pos": (cfg.max_target_positions, C)}
    for i in range(cfg.num_layers):
        want.update({f"blk.{i}.{m}.w": (C, C) for m in ("q", "k", "v", "o", "cq", "ck", "cv", "co")})
        want.update({f"blk.{i}.up.w": (F, C), f"blk.{i}.down.w": (C, F)})
    for name, shape in want.items():
        if t[name].shape != shape:
            raise WhisperError(f"{source}: {name} is {t[name].shape}, the config says {shape}")
    if C % cfg.num_heads:
        raise WhisperError(f"{source}: d_model {C} is not {cfg.num_heads} heads")
    return t


@dataclass
class DecoderState:
    """One request's decoder caches: its sequence slot, its self-attention blocks, the tokens it
    has run (their positions are 0..len-1) and its cross rows. Reference states (no kernels)
    keep their K/V as arrays [layers, n, C] instead."""
    slot: int                           # its sequence slot (of max_sequences)
    cross_len: int
    cross_slot: int = -1                # its cross K/V's slot (shared by the forks of one request)
    tokens: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)     # its self-attention blocks in order (some shared)
    self_k: list | None = None          # reference: per layer [n, C]
    self_v: list | None = None
    cross_k: list | None = None         # reference: per layer [T, C]
    cross_v: list | None = None
    released: bool = False


@dataclass
class CrossKV:
    """One window's cross-attention K/V (WhisperDecoder.cross): its slot, filled layer by layer
    (fill_cross), then shared by every state started on it; the slot is freed when it and they
    are released. Reference ones (no kernels) keep the K/V as arrays per layer [T, C]."""
    slot: int
    length: int                         # encoder rows
    rows: np.ndarray | None             # [T, C] until every layer is filled
    layers: int = 0                     # layers filled
    cross_k: list = field(default_factory=list)     # reference
    cross_v: list = field(default_factory=list)
    released: bool = False


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, H: int, causal_from: int | None) -> np.ndarray:
    """Attention of q [n, C] over k, v [m, C] in H heads; causal_from: the position of q's first
    row among the keys (None: every key)."""
    n, C = q.shape
    D = C // H
    qh = q.reshape(n, H, D).transpose(1, 0, 2)
    kh = k.reshape(-1, H, D).transpose(1, 0, 2)
    vh = v.reshape(-1, H, D).transpose(1, 0, 2)
    s = (qh @ kh.transpose(0, 2, 1)) * np.float32(D ** -0.5)          # [H, n, m]
    if causal_from is not None:
        allowed = np.arange(k.shape[0])[None, :] <= (causal_from + np.arange(n))[:, None]
        s = np.where(allowed[None], s, np.float32(-np.inf))
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return (s @ vh).transpose(1, 0, 2).reshape(n, C)


KV_CACHE_DTYPES = ("float32", "bfloat16", "int8")


class WhisperDecoder:
    """Whisper's decoder over requests' states (see the module's docstring). tensors: read_hf's
    (or whisper_ggml.read_decoder's: matrices in a whisper.cpp file's stored formats, run as
    stored); with kernels, its float32 matrices are taken out of the dict as they are packed.
    kernels: the kernel module (None: NumPy only). max_requests: the requests the
    compiled caches hold at once (start() refuses more: the caller bounds its concurrency);
    max_sequences: their states with forks."""

    def __init__(self, cfg: WhisperDecoderConfig, tensors: dict, kernels=None,
                 dtype: str = "float32", num_threads: int = 1, max_requests: int = 8,
                 max_sequences: int | None = None, quantization: str | None = None,
                 kv_cache_dtype: str | None = None):
        self.cfg, self.t = cfg, tensors if kernels is not None else dense(tensors)
        self.kernels, self.num_threads, self.dtype = kernels, num_threads, dtype
        self.quantization = check_quantization(quantization)
        # the K / V blocks' format (kv_layout.kv_cache_shapes), one for the self- and the cross-
        # attention: float32 for float32 weights, int8 rows (a float32 scale each) for weights
        # quantized at load, else bf16 (the cross K/V of 1500 rows are most of what a step reads:
        # 8-bit rows halve them)
        if kv_cache_dtype is None:
            kv_cache_dtype = "int8" if self.quantization else "float32" if dtype == "float32" else "bfloat16"
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise WhisperError(f"kv_cache_dtype {kv_cache_dtype!r}: one of {', '.join(KV_CACHE_DTYPES)}")
        self.kv_dtype = kv_cache_dtype
        self.max_requests = max_requests                       # cross K/V slots: requests at once
        self.max_sequences = max_sequences or max_requests      # self-attention slots: requests and their forks
        self.free_slots = list(range(self.max_sequences - 1, -1, -1))
        self.free_cross = list(range(max_requests - 1, -1, -1))
        self.cross_refs: dict[int, int] = {}
        if kernels is not None:
            if cfg.head_dim % 16:
                raise WhisperError(f"head size {cfg.head_dim} is not a multiple of 16 (the attention kernel's)")
            self._pack(kernels, dtype)

    @classmethod
    def from_pretrained(cls, path: str, kernels="auto", dtype: str = "float32", num_threads: int | None = None,
                        **kw) -> "WhisperDecoder":
        raw, kernels, num_threads = open_checkpoint(path, kernels, num_threads)
        cfg = WhisperDecoderConfig.from_hf(raw)
        return cls(cfg, read_hf(path, cfg, lazy=True), kernels, dtype, num_threads, **kw)

    # ---- packing ----------------------------------------------------------------------------

    def _pack(self, kernels, dtype: str) -> None:
        # deferred: the compiled kernels (which any _kernels module loads) load when a decoder is built
        from lite_llm._kernels import layout
        t, cfg = self.t, self.cfg
        # name -> (packed panels, rows, bias, the weights' format: dtype, or a whisper.cpp file's stored one)
        self.mats: dict[str, tuple[np.ndarray, int, np.ndarray | None, str]] = {}

        def mat(name, keys, b):
            # a float matrix leaves self.t as it is packed (the step reads the panels only), read
            # from the file then where it is a CheckpointMatrix (quantized a slice of rows at a time)
            ws = [t[k] if isinstance(t[k], StoredMatrix) else t.pop(k) for k in keys]
            if any(isinstance(w, StoredMatrix) for w in ws):
                m = pack_stored(ws, b)
                self.mats[name] = (m.data, m.shape[0], m.bias, m.parts[0].format)
                return
            if self.quantization and quantizable(ws[0].shape[1]):
                m = pack_quantized(ws, b, QUANTIZATIONS[self.quantization])
                self.mats[name] = (m.data, m.shape[0], m.bias, m.parts[0].format)
                return
            w = stack_rows(ws)
            del ws
            self.mats[name] = (layout.pack(to_bf16(w) if dtype == "bfloat16" else w, dtype), w.shape[0],
                               None if b is None else np.ascontiguousarray(b, np.float32), dtype)
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            mat(p + "qkv", [p + "q.w", p + "k.w", p + "v.w"],
                np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]]))
            mat(p + "ckv", [p + "ck.w", p + "cv.w"], np.concatenate([t[p + "ck.b"], t[p + "cv.b"]]))
            for m in ("o", "cq", "co", "up", "down"):
                mat(p + m, [p + m + ".w"], t[p + m + ".b"])
        mat("embed", ["embed"], None)
        H, D, L = cfg.num_heads, cfg.head_dim, cfg.num_layers
        self.self_blocks = -(-cfg.max_target_positions // BLOCK)          # blocks of one request's tokens
        self.cross_blocks = -(-cfg.max_source_positions // BLOCK)         # ... of its encoder rows
        nb_self, nb_cross = self.max_sequences * self.self_blocks, self.max_requests * self.cross_blocks
        # the self-attention blocks: a pool every sequence takes its blocks from as its tokens
        # grow; a fork shares its parent's full blocks (ref counted, never written again) and
        # copies only the partly filled last one, so beams cost a block each, not a sequence each.
        # The pool holds max_sequences whole sequences: a state can always grow to the decoder's
        # positions.
        self.free_blocks = list(range(nb_self - 1, -1, -1))
        self.block_refs = np.zeros(nb_self, np.int32)
        # K / V blocks (kv_layout.kv_cache_shapes), one pair a layer, in self.kv_dtype
        kv = layout.KV_NUMPY[self.kv_dtype]
        (ks, vs), (kc, vc) = (layout.kv_cache_shapes(nb, H, BLOCK, D, self.kv_dtype) for nb in (nb_self, nb_cross))
        self.k_self = [np.zeros(ks, kv) for _ in range(L)]
        self.v_self = [np.zeros(vs, kv) for _ in range(L)]
        self.k_cross = [np.zeros(kc, kv) for _ in range(L)]
        self.v_cross = [np.zeros(vc, kv) for _ in range(L)]
        # the matrices and caches for the one compiled call of each step
        self.layers = kernels.WhisperDecoderModel(
            self.mats, t, [(self.k_self[i], self.v_self[i], self.k_cross[i], self.v_cross[i]) for i in range(L)],
            L, cfg.hidden_size, cfg.intermediate_size, H, cfg.eps, cfg.act)

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """float32 [N, C] token embeddings of ids: the NumPy reference's table, else rows of the
        output projection's panels (layout.pack: float32 / float16 [ceil(V/16), C, 16], bf16
        [ceil(V/16), C/2, 16, 2]), or ggml block panels (a quantized file's, or quantized at load)
        dequantized."""
        e = self.t.get("embed")
        if isinstance(e, np.ndarray):
            return e[ids]
        packed, _, _, fmt = self.mats["embed"]
        if fmt in ("float32", "float16"):
            return packed[ids // 16, :, ids % 16].astype(np.float32)
        if fmt == "bfloat16":
            bits = packed[ids // 16, :, ids % 16, :].reshape(len(ids), -1)[:, :self.cfg.hidden_size]
            return bf16_to_f32(bits)
        # ggml blocks: the panels holding the rows, dequantized (16 rows a panel), the rows picked
        panels = np.ascontiguousarray(packed[ids // 16])
        values = self.kernels.qdequantize_packed(panels, fmt, 16 * len(ids), self.cfg.hidden_size)
        return values[np.arange(len(ids)) * 16 + ids % 16]

    def _threads(self, work: int) -> int:
        return 1 if work < SERIAL_WORK else self.num_threads

    def _gemm(self, x: np.ndarray, name: str, out: np.ndarray | None = None, accumulate: bool = False) -> np.ndarray:
        packed, n, bias, fmt = self.mats[name]
        if out is None:
            out = np.empty((x.shape[0], n), np.float32)
        self.kernels.gemm(np.ascontiguousarray(x), packed, fmt, n, out, bias, accumulate,
                          self._threads(x.shape[0] * x.shape[1] * n))
        return out

    def _layernorm(self, x: np.ndarray, name: str) -> np.ndarray:
        out = np.empty_like(x)
        self.kernels.layernorm(x, self.t[name + ".w"], self.t[name + ".b"], out, self.cfg.eps,
                               self._threads(64 * x.size))
        return out

    # ---- requests -----------------------------------------------------------------------------

    def start(self, rows) -> DecoderState:
        """A request over encoder rows [T, C] (its cross K/V computed here, once) or over a filled
        CrossKV (cross, fill_cross: shared, nothing computed)."""
        if isinstance(rows, CrossKV):
            return self._start_on(rows)
        if self.kernels is not None and not self.free_slots:
            raise WhisperError(f"the decoder holds {self.max_requests} requests at once")
        cross = self.cross(rows)
        try:
            self.fill_cross(cross, self.cfg.num_layers)
            return self._start_on(cross)
        finally:
            self.release_cross(cross)           # the state holds the K/V now

    def cross(self, rows: np.ndarray) -> CrossKV:
        """A slot for the cross K/V of encoder rows [T, C], to be filled by fill_cross."""
        cfg = self.cfg
        rows = np.ascontiguousarray(rows, np.float32)
        T, C = rows.shape
        if C != cfg.hidden_size or not 0 < T <= cfg.max_source_positions:
            raise WhisperError(f"encoder rows {rows.shape}: expected [1..{cfg.max_source_positions}, {cfg.hidden_size}]")
        if self.kernels is None:
            return CrossKV(slot=-1, length=T, rows=rows)
        if not self.free_cross:
            raise WhisperError(f"the decoder holds {self.max_requests} requests at once")
        cross = CrossKV(slot=self.free_cross.pop(), length=T, rows=rows)
        self.cross_refs[cross.slot] = 1
        return cross

    def fill_cross(self, cross: CrossKV, num_layers: int) -> bool:
        """The cross K/V of the next num_layers layers computed and stored; whether all are."""
        cfg = self.cfg
        if cross.released:
            raise WhisperError("a released cross K/V")
        rows, T = cross.rows, cross.length
        H, D = cfg.num_heads, cfg.head_dim
        if self.kernels is not None:
            slots = (cross.slot * self.cross_blocks * BLOCK + np.arange(T)).astype(np.int64)
        for i in range(cross.layers, min(cross.layers + num_layers, cfg.num_layers)):
            p = f"blk.{i}."
            if self.kernels is None:
                cross.cross_k.append(rows @ self.t[p + "ck.w"].T + self.t[p + "ck.b"])
                cross.cross_v.append(rows @ self.t[p + "cv.w"].T + self.t[p + "cv.b"])
            else:
                kv = self._gemm(rows, p + "ckv").reshape(T, 2, H, D)
                self.kernels.write_kv(np.ascontiguousarray(kv[:, 0]), self.k_cross[i], slots, "k")
                self.kernels.write_kv(np.ascontiguousarray(kv[:, 1]), self.v_cross[i], slots, "v")
            cross.layers = i + 1
        if cross.layers == cfg.num_layers:
            cross.rows = None
            return True
        return False

    def _start_on(self, cross: CrossKV) -> DecoderState:
        cfg, C = self.cfg, self.cfg.hidden_size
        if cross.released or cross.layers != cfg.num_layers:
            raise WhisperError("a decoder state starts on a filled cross K/V (fill_cross)")
        if self.kernels is None:
            return DecoderState(slot=-1, cross_len=cross.length, self_k=[np.zeros((0, C), np.float32)] * cfg.num_layers,
                                self_v=[np.zeros((0, C), np.float32)] * cfg.num_layers, cross_k=cross.cross_k,
                                cross_v=cross.cross_v)
        if not self.free_slots:
            raise WhisperError(f"the decoder holds {self.max_sequences} sequences at once")
        self.cross_refs[cross.slot] += 1
        return DecoderState(slot=self.free_slots.pop(), cross_len=cross.length, cross_slot=cross.slot)

    def _unref_cross(self, slot: int) -> None:
        self.cross_refs[slot] -= 1
        if self.cross_refs[slot] == 0:
            del self.cross_refs[slot]
            self.free_cross.append(slot)

    def release_cross(self, cross: CrossKV) -> None:
        """cross's own hold on its slot dropped (the states started on it keep theirs)."""
        if not cross.released:
            cross.released, cross.rows = True, None
            if cross.slot >= 0:
                self._unref_cross(cross.slot)

    def release(self, st: DecoderState) -> None:
        if not st.released:
            st.released = True
            if st.slot >= 0:
                self.free_slots.append(st.slot)
                self._unref_blocks(st.blocks)
                st.blocks = []
                self._unref_cross(st.cross_slot)

    def fork(self, st: DecoderState) -> DecoderState:
        """A copy of st (a beam that leaves its parent): its self-attention blocks are the parent's
        full ones, shared, and a copy of the partly filled last one; the cross K/V shared."""
        if self.kernels is None:
            return DecoderState(slot=-1, cross_len=st.cross_len, tokens=list(st.tokens), self_k=list(st.self_k),
                                self_v=list(st.self_v), cross_k=st.cross_k, cross_v=st.cross_v)
        if st.released:
            raise WhisperError("a released decoder state")
        if not self.free_slots:
            raise WhisperError(f"the decoder holds {self.max_sequences} sequences at once")
        blocks = list(st.blocks)
        full = len(st.tokens) // BLOCK
        self.block_refs[blocks[:full]] += 1
        if full < len(blocks):                  # the last block is partly filled: the child's own copy
            blocks[full] = self._take_block()
            self._copy_block(st.blocks[full], blocks[full])
        new = DecoderState(slot=self.free_slots.pop(), cross_len=st.cross_len, tokens=list(st.tokens),
                           cross_slot=st.cross_slot, blocks=blocks)
        self.cross_refs[st.cross_slot] += 1
        return new

    def _take_block(self) -> int:
        # never empty: the pool holds max_sequences whole sequences, and a state is one of them
        b = self.free_blocks.pop()
        self.block_refs[b] = 1
        return b

    def _unref_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            self.block_refs[b] -= 1
            if self.block_refs[b] == 0:
                self.free_blocks.append(b)

    def _copy_block(self, src: int, dst: int) -> None:
        for i in range(self.cfg.num_layers):
            self.k_self[i][dst] = self.k_self[i][src]
            self.v_self[i][dst] = self.v_self[i][src]

    # ---- forward ------------------------------------------------------------------------------

    def step(self, states: list[DecoderState], tokens: list[list[int]]) -> np.ndarray:
        """float32 [S, V]: the logits after each state's new tokens (ONE forward over them all),
        each state's caches advanced by them."""
        self._check(states, tokens)
        if self.kernels is None:
            return np.stack([self._reference_step(st, new) for st, new in zip(states, tokens)])
        return self._compiled_step(states, tokens)

    def _check(self, states: list[DecoderState], tokens: list[list[int]]) -> None:
        cfg = self.cfg
        for st, new in zip(states, tokens, strict=True):
            if st.released:
                raise WhisperError("a released decoder state")
            if not new or len(st.tokens) + len(new) > cfg.max_target_positions:
                raise WhisperError(f"{len(st.tokens)} + {len(new)} tokens: the decoder holds 1 to "
                                   f"{cfg.max_target_positions}")
            if min(new) < 0 or max(new) >= cfg.vocab_size:
                raise WhisperError(f"a token outside the vocabulary of {cfg.vocab_size}")

    def cross_scores(self, cross: CrossKV, tokens: list[int], heads: list[tuple[int, int]]) -> np.ndarray:
        """float32 [len(heads), len(tokens), cross rows]: the cross-attention scores (q.k / sqrt(D),
        before the softmax) of each (layer, head) in heads for each of tokens, run as one sequence
        from position 0 on the filled cross K/V (a state of its own for the pass, released)."""
        cfg = self.cfg
        H, D, L = cfg.num_heads, cfg.head_dim, cfg.num_layers
        if not heads or any(not (0 <= l < L and 0 <= h < H) for l, h in heads):
            raise WhisperError(f"alignment heads: (layer, head) pairs within {L} layers of {H} heads")
        layers = sorted({l for l, _ in heads})
        tokens = list(tokens)
        st = self._start_on(cross)
        try:
            self._check([st], [tokens])
            q = self._capture_q(st, tokens, layers)                         # [layers, N, C]
        finally:
            self.release(st)
        keys = {l: self._cross_keys(cross, l) for l in layers}             # [H, T, D] each, read once
        out = np.empty((len(heads), len(tokens), cross.length), np.float32)
        for i, (l, h) in enumerate(heads):
            out[i] = (q[layers.index(l), :, h * D:(h + 1) * D] @ keys[l][h].T) * np.float32(D ** -0.5)
        return out

    def _capture_q(self, st: DecoderState, tokens: list[int], layers: list[int]) -> np.ndarray:
        """float32 [len(layers), N, C]: the cross-attention query rows of those layers in a step of
        tokens on st (its caches advanced as step() does)."""
        if self.kernels is None:
            cap: dict[int, np.ndarray] = {}
            self._reference_step(st, tokens, cap)
            return np.stack([cap[l] for l in layers])
        index = np.full(self.cfg.num_layers, -1, np.int32)
        index[layers] = np.arange(len(layers), dtype=np.int32)
        capture = np.empty((len(layers), len(tokens), self.cfg.hidden_size), np.float32)
        self._compiled_step([st], [tokens], index, capture)
        return capture

    def _cross_keys(self, cross: CrossKV, layer: int) -> np.ndarray:
        """float32 [H, T, D]: a layer's cross-attention keys per head, as the attention reads them
        (the cache's blocks decoded: bf16 widened, int8 codes times their row's scale)."""
        T, H, D = cross.length, self.cfg.num_heads, self.cfg.head_dim
        if self.kernels is None:
            return np.ascontiguousarray(cross.cross_k[layer].reshape(T, H, D).transpose(1, 0, 2), np.float32)
        # deferred as in _pack: a _kernels module loads the compiled kernels
        from lite_llm._kernels.kv_layout import kv_from_layout
        first = cross.slot * self.cross_blocks
        blocks = self.k_cross[layer][first:first + -(-T // BLOCK)]
        got = kv_from_layout(blocks, "k")
        if isinstance(got, tuple):                                          # [blocks, H, B, D]
            codes, scales = got
            k = codes.astype(np.float32) * scales[..., None]
        elif got.dtype == np.uint16:
            k = bf16_to_f32(got)
        else:
            k = got
        return np.ascontiguousarray(k.transpose(1, 0, 2, 3).reshape(H, -1, D)[:, :T], np.float32)

    def _compiled_step(self, states, tokens, capture_layers=None, capture=None) -> np.ndarray:
        cfg, k, t = self.cfg, self.kernels, self.t
        C = cfg.hidden_size
        S = len(states)
        lens = np.fromiter(map(len, tokens), np.int64, S)                       # [S] new tokens of each
        ids = np.fromiter(chain.from_iterable(tokens), np.int64)                # [N]
        N = ids.shape[0]
        seq = np.repeat(np.arange(S, dtype=np.int32), lens)                     # [N] sequence of each token
        ends = np.cumsum(lens) - 1                                              # [S] each one's last token
        # token j of sequence s sits at position len(s.tokens) + j
        firsts = np.fromiter((len(st.tokens) for st in states), np.int64, S) - (ends + 1 - lens)
        positions = np.arange(N) + np.repeat(firsts, lens)
        # each state's self-attention blocks, grown to hold its new tokens (only a state's own last
        # block is ever written: a fork's shared blocks are full), then its block table; its cross
        # K/V are its cross slot's cross_blocks in order
        self_tables = np.zeros((S, self.self_blocks), np.int32)
        for i, (st, n) in enumerate(zip(states, tokens)):
            while len(st.blocks) * BLOCK < len(st.tokens) + len(n):
                st.blocks.append(self._take_block())
            self_tables[i, :len(st.blocks)] = st.blocks
        cross_tables = (np.fromiter((st.cross_slot for st in states), np.int32, S)[:, None] * np.int32(self.cross_blocks)
                        + np.arange(self.cross_blocks, dtype=np.int32))
        tok_blocks = self_tables[np.repeat(np.arange(S), lens), positions // BLOCK].astype(np.int64)
        slots = tok_blocks * BLOCK + positions % BLOCK
        pos32 = positions.astype(np.int32)
        cross_lens = np.fromiter((st.cross_len for st in states), np.int64, S)
        cross_last = np.repeat(cross_lens - 1, lens).astype(np.int32)
        # the step's multiply-adds: its rows through every layer's matrices and the head, q.k and
        # p.v over the keys of both attentions; one thread below SERIAL_WORK
        F = cfg.intermediate_size
        work = (N * cfg.num_layers * (6 * C * C + 2 * C * F) + S * C * cfg.vocab_size
                + 2 * C * cfg.num_layers * int(positions.sum() + N + np.dot(cross_lens, lens)))
        x = np.ascontiguousarray(self._embed(ids) + t["pos"][positions], np.float32)       # [N, C]
        logits = np.empty((S, cfg.vocab_size), np.float32)
        k.whisper_decoder_step(self.layers, x, slots, self_tables, cross_tables, seq, pos32, cross_last, ends, logits,
                               self._threads(work), capture_layers, capture)
        for st, n in zip(states, tokens):
            st.tokens.extend(int(v) for v in n)
        return logits

    def _reference_step(self, st: DecoderState, new: list[int], capture: dict | None = None) -> np.ndarray:
        cfg, t = self.cfg, self.t
        n0 = len(st.tokens)
        x = t["embed"][np.asarray(new)] + t["pos"][n0:n0 + len(new)]
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            h = _layernorm(x, t[p + "ln1.w"], t[p + "ln1.b"], cfg.eps)
            q, kk, v = (h @ t[p + s + ".w"].T + t[p + s + ".b"] for s in ("q", "k", "v"))
            st.self_k[i] = np.concatenate([st.self_k[i], kk])
            st.self_v[i] = np.concatenate([st.self_v[i], v])
            x = x + _attend(q, st.self_k[i], st.self_v[i], cfg.num_heads, n0) @ t[p + "o.w"].T + t[p + "o.b"]
            h = _layernorm(x, t[p + "ln2.w"], t[p + "ln2.b"], cfg.eps)
            q = h @ t[p + "cq.w"].T + t[p + "cq.b"]
            if capture is not None:
                capture[i] = q.astype(np.float32)
            x = x + _attend(q, st.cross_k[i], st.cross_v[i], cfg.num_heads, None) @ t[p + "co.w"].T + t[p + "co.b"]
            h = _layernorm(x, t[p + "ln3.w"], t[p + "ln3.b"], cfg.eps)
            x = x + _act(h @ t[p + "up.w"].T + t[p + "up.b"], "gelu") @ t[p + "down.w"].T + t[p + "down.b"]
        st.tokens.extend(int(v) for v in new)
        h = _layernorm(x[-1:], t["ln.w"], t["ln.b"], cfg.eps)
        return (h @ t["embed"].T)[0].astype(np.float32)
