"""Whisper's audio encoder: log-mel features [n_mels, 3000] of a 30-s window -> 1500 rows of the
model's width, which the decoder's cross-attention reads.

    WhisperEncoder.from_pretrained(path)          an HF WhisperForConditionalGeneration directory
      .features(samples)                          16 kHz samples -> [n_mels, 3000] (audio.log_mel)
      .encode(features) / .encode_many([...])     ONE compiled call (_kernels/audio.pxi) per pass
      .encode_cached(features)                    the same, kept by content hash (as image rows are)
      .start_pass(features) -> EncoderPass        one window's pass in slices of layers, one compiled
                                                  call each (.run() per slice), the bits of encode()

The stem is two convolutions (kernel 3; the second of stride 2, halving 3000 frames to 1500) with
GELU, then learned positions (initialised sinusoidal in the checkpoints), pre-norm blocks (the
ViT blocks of llava.py: LayerNorm, attention whose k has no bias, LayerNorm, fc1 / GELU / fc2)
and a final LayerNorm. What does not live here: the decoder and its cross-attention (the engine),
audio decoding (audio.py).
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from lite_llm.config import QUANTIZATIONS, check_quantization
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.multimodal import audio
from lite_llm.multimodal.llava import _act, _layernorm, vit_blocks_reference, vit_packer
from lite_llm.multimodal.towers import float_tensors
from lite_llm.multimodal.whisper_stored import (checkpoint_matrices, dense, is_stored, pack_encoder, pack_quantized,
                                               quantizable, stack_rows)

try:
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b

ARCHITECTURES = ("WhisperForConditionalGeneration",)


class WhisperError(ValueError):
    """A Whisper checkpoint that cannot be used; the message says which tensor or setting."""


def open_checkpoint(path: str, kernels, num_threads: int | None) -> tuple[dict, object, int]:
    """(config.json, the kernels: this CPU's for "auto", threads: the process's cores for None) of
    the HF Whisper directory at path, which must be one."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        raw = json.load(fh)
    if (raw.get("architectures") or [None])[0] not in ARCHITECTURES and raw.get("model_type") != "whisper":
        raise WhisperError(f"{path}: not a Whisper checkpoint (architectures {raw.get('architectures')})")
    if kernels == "auto":
        from lite_llm._kernels import kernels   # deferred: the module imports where no kernel build loads
    if num_threads is None:
        num_threads = max(1, len(os.sched_getaffinity(0)))
    return raw, kernels, num_threads


def activation(raw: dict) -> str:
    """config.json's activation_function as the kernels name it: "gelu" (erf) or "gelu_tanh"."""
    act = raw.get("activation_function", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise WhisperError(f"activation_function {act!r} is not supported (gelu)")
    return "gelu" if act == "gelu" else "gelu_tanh"


@dataclass(frozen=True)
class WhisperEncoderConfig:
    num_mel_bins: int = 80
    hidden_size: int = 384          # d_model
    num_heads: int = 6              # encoder_attention_heads
    num_layers: int = 4             # encoder_layers
    intermediate_size: int = 1536   # encoder_ffn_dim
    max_source_positions: int = 1500
    eps: float = 1e-5               # nn.LayerNorm's default, Whisper's
    act: str = "gelu"

    @classmethod
    def from_hf(cls, raw: dict) -> "WhisperEncoderConfig":
        return cls(num_mel_bins=int(raw.get("num_mel_bins", 80)), hidden_size=int(raw["d_model"]),
                   num_heads=int(raw["encoder_attention_heads"]), num_layers=int(raw["encoder_layers"]),
                   intermediate_size=int(raw["encoder_ffn_dim"]),
                   max_source_positions=int(raw.get("max_source_positions", 1500)), act=activation(raw))

    @property
    def num_frames(self) -> int:
        """Feature frames of one window: two per output row (conv2's stride)."""
        return 2 * self.max_source_positions


def read_hf(source: str, cfg: WhisperEncoderConfig, lazy: bool = False) -> dict:
    """The encoder of an HF Whisper directory as canonical float32 tensors: "conv1.w" [C, 3 M]
    and "conv2.w" [C, 3 C] (a conv1d weight [C, C_in, 3] flattened: column c * 3 + tap), their
    biases, "pos" [P, C], the blocks (blk.{i}.*) and "ln.w" / "ln.b". lazy: the matrices as
    CheckpointMatrix, each read when it is packed (the vectors read now)."""
    ckpt = SafetensorsCheckpoint(source)
    try:
        names, get = float_tensors(ckpt, lambda name: WhisperError(f"{source}: the checkpoint has no tensor {name}"))
        mat = checkpoint_matrices(ckpt, names, get, lazy)
        e, C = "encoder.", cfg.hidden_size
        t = {"conv1.w": mat(e + "conv1.weight"), "conv1.b": get(e + "conv1.bias"),
             "conv2.w": mat(e + "conv2.weight"), "conv2.b": get(e + "conv2.bias"),
             "pos": get(e + "embed_positions.weight"),
             "ln.w": get(e + "layer_norm.weight"), "ln.b": get(e + "layer_norm.bias")}
        for i in range(cfg.num_layers):
            p, q = f"{e}layers.{i}.", f"blk.{i}."
            for ours, theirs in (("ln1", "self_attn_layer_norm"), ("ln2", "final_layer_norm")):
                t[q + ours + ".w"], t[q + ours + ".b"] = get(p + theirs + ".weight"), get(p + theirs + ".bias")
            for ours, theirs in (("q", "self_attn.q_proj"), ("v", "self_attn.v_proj"), ("o", "self_attn.out_proj"),
                                 ("up", "fc1"), ("down", "fc2")):
                t[q + ours + ".w"], t[q + ours + ".b"] = mat(p + theirs + ".weight"), get(p + theirs + ".bias")
            t[q + "k.w"] = mat(p + "self_attn.k_proj.weight")
            t[q + "k.b"] = np.zeros(C, np.float32)          # Whisper's k projection has no bias
    finally:
        ckpt.close()
    _check(cfg, t, source)
    return t


def _check(cfg: WhisperEncoderConfig, t: dict[str, np.ndarray], source: str) -> None:
    C, F, M = cfg.hidden_size, cfg.intermediate_size, cfg.num_mel_bins
    want = {"conv1.w": (C, 3 * M), "conv2.w": (C, 3 * C), "pos": (cfg.max_source_positions, C)}
    for i in range(cfg.num_layers):
        want.update({f"blk.{i}.q.w": (C, C), f"blk.{i}.k.w": (C, C), f"blk.{i}.o.w": (C, C),
                     f"blk.{i}.up.w": (F, C), f"blk.{i}.down.w": (C, F)})
    for name, shape in want.items():
        if t[name].shape != shape:
            raise WhisperError(f"{source}: {name} is {t[name].shape}, the config says {shape}")
    if C % cfg.num_heads:
        raise WhisperError(f"{source}: d_model {C} is not {cfg.num_heads} heads")


def features_hash(features: np.ndarray) -> bytes:
    """The encoder cache's key of one window's features [n_mels, frames]."""
    h = blake2b(digest_size=16)
    h.update(np.asarray(features.shape, np.int64).tobytes())
    h.update(np.ascontiguousarray(features, np.float32).tobytes())
    return h.digest()


class WhisperEncoder:
    """Whisper's encoder over 30-s windows (encode_many: several in one compiled call) and its
    output cache by content hash. tensors: read_hf's float32 arrays (or with lazy=True its
    CheckpointMatrix, read when packed; or whisper_ggml.read_encoder's, whose matrices stay in
    a whisper.cpp file's stored formats); with kernels, its float matrices are taken out of the
    dict as they are packed. kernels: the kernel module to run it on (None: NumPy only, every
    matrix read as float32 arrays)."""

    def __init__(self, cfg: WhisperEncoderConfig, tensors: dict, kernels=None,
                 dtype: str = "float32", num_threads: int = 1, bf16_path: str | None = None,
                 max_cached_rows: int = 1 << 16, quantization: str | None = None):
        self.cfg, self.t = cfg, tensors if kernels is not None else dense(tensors)
        self.kernels, self.num_threads = kernels, num_threads
        self.quantization = check_quantization(quantization)
        self.model = None if kernels is None else self._pack(kernels, dtype, bf16_path)
        self.mel = None if kernels is None else audio.log_mel_model(kernels, cfg.num_mel_bins)
        self.cache: OrderedDict[bytes, np.ndarray] = OrderedDict()    # features hash -> [P, C], LRU order
        self.cached_rows = 0
        self.max_cached_rows = max_cached_rows
        self.num_encoded = 0            # windows run through the encoder (tests, metrics)

    @classmethod
    def from_pretrained(cls, path: str, kernels="auto", dtype: str = "float32", num_threads: int | None = None,
                        **kw) -> "WhisperEncoder":
        """The encoder of the HF Whisper directory at path, on this CPU's kernels ("auto") or
        in NumPy (None); quantization="q8_0" / "q4_0": its matrices quantized at load to those
        ggml blocks (the int8 GEMMs a quantized whisper.cpp file runs on). Each matrix is read
        from the file as it is packed (quantized a slice of rows at a time)."""
        raw, kernels, num_threads = open_checkpoint(path, kernels, num_threads)
        cfg = WhisperEncoderConfig.from_hf(raw)
        return cls(cfg, read_hf(path, cfg, lazy=True), kernels, dtype, num_threads, **kw)

    def _pack(self, kernels, dtype: str, bf16_path: str | None):
        """The compiled model. Each float matrix is taken out of self.t as it is packed (the
        forward reads the panels only), read then from the file where it is a CheckpointMatrix:
        an HF checkpoint's weights are held once, not twice, and its float32 matrices one at a
        time at most; encode_reference then needs an encoder built with kernels=None."""
        t, cfg = self.t, self.cfg
        if is_stored(t):     # a whisper.cpp file's stored matrices
            # dtype: the attention's (bfloat16 for a quantized file: whisper_ggml.load)
            return kernels.WhisperEncoderModel(pack_encoder(t, cfg), "bfloat16" if dtype == "bfloat16" else "float32",
                                               cfg.num_layers, cfg.num_heads, cfg.eps, cfg.act, bf16_path)
        packed, float_mat = vit_packer(dtype)

        def mat(name: str, ws: list, b: np.ndarray) -> None:
            # ws: the parts stacked by rows (q, k, v), float32 arrays or CheckpointMatrix
            if self.quantization and quantizable(ws[0].shape[1]):
                packed.matrices[name] = pack_quantized(ws, b, QUANTIZATIONS[self.quantization])
            else:
                float_mat(name, stack_rows(ws), b)
        mat("conv1", [t.pop("conv1.w")], t["conv1.b"])
        mat("conv2", [t.pop("conv2.w")], t["conv2.b"])
        for i in range(cfg.num_layers):
            p = f"blk.{i}."
            mat(p + "qkv", [t.pop(p + "q.w"), t.pop(p + "k.w"), t.pop(p + "v.w")],
                np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]]))
            for part in ("o", "up", "down"):
                mat(p + part, [t.pop(p + part + ".w")], t[p + part + ".b"])
            for part in ("ln1", "ln2"):
                packed.vectors[p + part + ".w"] = t[p + part + ".w"]
                packed.vectors[p + part + ".b"] = t[p + part + ".b"]
        for name in ("pos", "ln.w", "ln.b"):
            packed.vectors[name] = np.ascontiguousarray(t[name], np.float32)
        # quantized matrices: attention in bf16 too (its K/V rows; fp32 only for fp32 weights)
        return kernels.WhisperEncoderModel(packed, "bfloat16" if self.quantization else dtype, cfg.num_layers,
                                           cfg.num_heads, cfg.eps, cfg.act, bf16_path)

    # ---- features ---------------------------------------------------------------------------

    def features(self, samples: np.ndarray) -> np.ndarray:
        """float32 [n_mels, 3000] of the first 30 s of 16 kHz samples (compiled; NumPy without
        kernels)."""
        if self.mel is None:
            return audio.log_mel_reference(samples, self.cfg.num_mel_bins)
        return audio.log_mel(self.kernels, self.mel, [samples], self.num_threads)[0]

    # ---- encoder ----------------------------------------------------------------------------

    def _rows(self, features: np.ndarray) -> int:
        f = np.asarray(features)
        if f.ndim != 2 or f.shape[0] != self.cfg.num_mel_bins or f.shape[1] % 2 or f.shape[1] == 0 \
                or f.shape[1] > self.cfg.num_frames:
            raise WhisperError(f"features {f.shape}: expected [{self.cfg.num_mel_bins}, an even number of frames "
                               f"up to {self.cfg.num_frames}]")
        return f.shape[1] // 2

    def encode(self, features: np.ndarray) -> np.ndarray:
        """One window's features [n_mels, 2 T] -> its encoder rows [T, C]."""
        return self.encode_many([features])[0]

    def encode_many(self, windows: list[np.ndarray]) -> list[np.ndarray]:
        """Windows of features (one length) -> each one's rows [T, C]: ONE compiled call over them
        all (the NumPy reference, window by window, without kernels)."""
        rows = {self._rows(f) for f in windows}
        if len(rows) != 1:
            raise WhisperError("the windows of one encoder call must have one length")
        self.num_encoded += len(windows)
        if self.model is None:
            return [self.encode_reference(f) for f in windows]
        T = rows.pop()
        out = np.empty((len(windows) * T, self.cfg.hidden_size), np.float32)
        feats = np.ascontiguousarray(np.stack([np.asarray(f, np.float32) for f in windows]))
        self.kernels.whisper_encoder_forward(self.model, feats, out, self.num_threads)
        return [out[k * T:(k + 1) * T] for k in range(len(windows))]

    def encode_cached(self, features: np.ndarray) -> np.ndarray:
        """encode(features), kept by content hash: the same window is encoded once while it
        stays among the last max_cached_rows rows (oldest evicted first)."""
        key, rows = self.cached(features)
        return rows if rows is not None else self.keep(key, self.encode(features))

    def cached(self, features: np.ndarray) -> tuple[bytes, np.ndarray | None]:
        """(the cache's key of features, their rows if the cache holds them, else None)."""
        key = features_hash(features)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
        return key, hit

    def keep(self, key: bytes, rows: np.ndarray) -> np.ndarray:
        """rows into the cache under key (cached's), the oldest evicted beyond max_cached_rows; the
        rows it holds already if the same window was encoded meanwhile (the same bits)."""
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        self.cache[key] = rows
        self.cached_rows += rows.shape[0]
        while self.cached_rows > self.max_cached_rows and len(self.cache) > 1:
            self.cached_rows -= self.cache.popitem(last=False)[1].shape[0]
        return rows

    def start_pass(self, features: np.ndarray, layers_per_slice: int = 1) -> "EncoderPass":
        """encode(features) to be run in slices (EncoderPass.run), so a caller can do other work
        between them."""
        return EncoderPass(self, features, layers_per_slice)

    def encode_reference(self, features: np.ndarray) -> np.ndarray:
        """encode() in NumPy float32: the plain reference (of an encoder built with kernels=None,
        which keeps the float32 matrices)."""
        cfg, t = self.cfg, self.t
        if "conv1.w" not in t:
            raise WhisperError("the NumPy reference needs the float32 weights: build the encoder with kernels=None")
        f = np.asarray(features, np.float32)                       # [M, 2T]
        T = self._rows(f)

        def conv(x, w, b, stride):      # x [frames, C_in] -> [frames / stride, C], kernel 3, padding 1
            xp = np.pad(x, ((1, 1), (0, 0)))
            n = x.shape[0] // stride
            cols = np.stack([xp[tap:tap + stride * n:stride] for tap in range(3)], axis=2)   # [n, C_in, 3]
            return cols.reshape(n, -1) @ w.T + b
        h = _act(conv(f.T, t["conv1.w"], t["conv1.b"], 1), "gelu")
        x = _act(conv(h, t["conv2.w"], t["conv2.b"], 2), "gelu") + t["pos"][:T]
        x = vit_blocks_reference(x, t, cfg, _act)
        return np.ascontiguousarray(_layernorm(x, t["ln.w"], t["ln.b"], cfg.eps), np.float32)


class EncoderPass:
    """One window's encoder pass in slices: each run() is ONE compiled call
    (kernels.whisper_encoder_layers) over the next layers_per_slice layers, the stem with the
    first slice and the final LayerNorm with the last, the residual rows [T, C] kept between
    them; .rows, the window's encoder rows, once the last has run. The rows are the bits of
    encode(features). Without kernels: one slice, the NumPy reference."""

    def __init__(self, encoder: WhisperEncoder, features: np.ndarray, layers_per_slice: int = 1):
        self.encoder = encoder
        T = encoder._rows(features)
        self.features = np.ascontiguousarray(np.asarray(features, np.float32)[None])     # [1, M, 2T]
        depth = encoder.cfg.num_layers
        step = max(1, layers_per_slice)
        # (first, last) layers of each slice; a model of no layers still runs its stem and LayerNorm
        self.slices = [(a, min(a + step, depth)) for a in range(0, depth, step)] or [(0, 0)]
        if encoder.model is None:
            self.slices = [(0, depth)]
        self.done = 0                   # slices run
        self.x = None if encoder.model is None else np.empty((T, encoder.cfg.hidden_size), np.float32)
        self.rows: np.ndarray | None = None
        encoder.num_encoded += 1

    def run(self) -> np.ndarray | None:
        """The next slice; the rows after the last one (None before)."""
        enc = self.encoder
        if self.rows is not None:
            raise WhisperError("this encoder pass has run all its slices")
        first, last = self.slices[self.done]
        if enc.model is None:
            out = enc.encode_reference(self.features[0])
        else:
            out = np.empty_like(self.x) if last == enc.cfg.num_layers else self.x
            enc.kernels.whisper_encoder_layers(enc.model, self.features, self.x, out, first, last, enc.num_threads)
        self.done += 1
        if self.done == len(self.slices):
            self.rows, self.x, self.features = out, None, None
        return self.rows
