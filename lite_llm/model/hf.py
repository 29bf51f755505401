"""Hugging Face checkpoints: config.json -> ModelConfig, and safetensors (single or sharded) read
with pread into new buffers (a slice of rows at a time if asked), mapped onto the canonical
tensor names of lite_llm/model/__init__.py.

Tensors come out in the file's own dtype (float32, float16, or bf16 bits as uint16); dtype
conversion and progress reporting are the loader's. Hub-cache resolution is in loader.py.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model import hfquant
from lite_llm.model.loader import MappedFile, ModelLoadError, pread_into
from lite_llm.model.weights import StackedRows, StoredPart

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM", "OPTForCausalLM")
_SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                       "F64": np.dtype("<f8"), "I32": np.dtype("<i4"),   # I32: AWQ / GPTQ packed values
                       "I8": np.dtype("i1")}                              # I8: W8A8 weights
_STORED_TYPES = {"<f4": "F32", "<f2": "F16", "<u2": "BF16"}     # numpy dtype str -> type the packer takes
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "relu": "relu"}
OPT_POSITION_OFFSET = 2     # OPT's learned position table keeps 2 unused rows before position 0


# ---- config ------------------------------------------------------------------------------


def read_config(path: str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, raw config.json dict) for the HF directory `path`."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise ModelLoadError(f"{cfg_path}: missing config.json (not a Hugging Face model directory?)")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: unreadable config.json: {e}") from e
    return config_from_dict(raw, cfg_path), raw


def _rope(raw: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either transformers 4 or 5 config spellings."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention", next(iter(params.values())))   # per-layer-type dict
    theta = raw.get("rope_theta") or params.get("rope_theta") or 10000.0
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return float(theta), None
    scaling = {k: v for k, v in params.items() if k not in ("type", "rope_type", "rope_theta")}
    scaling["rope_type"] = kind
    return float(theta), scaling


def config_from_dict(raw: dict, where: str = "config.json") -> ModelConfig:
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{where}: architecture {arch!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    try:
        return _opt_config(raw, where) if arch == "OPTForCausalLM" else _decoder_config(raw, arch, where)
    except KeyError as e:
        raise ModelLoadError(f"{where}: {arch} config lacks field {e.args[0]!r}") from None


def _eos(raw: dict) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def _decoder_config(raw: dict, arch: str, where: str) -> ModelConfig:
    num_heads = int(raw["num_attention_heads"])
    dim = int(raw["hidden_size"])
    theta, scaling = _rope(raw)
    if scaling is not None and scaling["rope_type"] not in ("linear", "llama3", "yarn"):
        raise ModelLoadError(f"{where}: rope scaling {scaling['rope_type']!r} is not supported "
                             f"(supported: linear, llama3, yarn)")
    act = raw.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ModelLoadError(f"{where}: activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
    sliding = None
    if arch == "MistralForCausalLM":
        sliding = raw.get("sliding_window")
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and raw.get("use_sliding_window"):
        sliding = raw.get("sliding_window")
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        dim=dim,
        ffn_dim=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or dim // num_heads),
        max_position_embeddings=int(raw["max_position_embeddings"]),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm="rms",
        act=_ACTIVATIONS[act],
        gated_mlp=True,
        qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
        o_bias=attention_bias and arch != "Qwen2ForCausalLM",
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM",
        rope=True,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=int(sliding) if sliding else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos(raw),
        torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def _opt_config(raw: dict, where: str) -> ModelConfig:
    dim = int(raw["hidden_size"])
    if not raw.get("do_layer_norm_before", True):
        raise ModelLoadError(f"{where}: OPT with do_layer_norm_before=false (post-norm, OPT-350m) is not supported")
    if int(raw.get("word_embed_proj_dim", dim)) != dim:
        raise ModelLoadError(f"{where}: OPT with word_embed_proj_dim {raw['word_embed_proj_dim']} != hidden_size "
                             f"{dim} (projected embeddings) is not supported")
    if not raw.get("enable_bias", True) or not raw.get("layer_norm_elementwise_affine", True):
        raise ModelLoadError(f"{where}: OPT without biases or LayerNorm affine is not supported")
    if raw.get("_remove_final_layer_norm", False):
        raise ModelLoadError(f"{where}: OPT with _remove_final_layer_norm is not supported")
    act = raw.get("activation_function", "relu")
    if act not in _ACTIVATIONS:
        raise ModelLoadError(f"{where}: activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
    num_heads = int(raw["num_attention_heads"])
    return ModelConfig(
        architecture="OPTForCausalLM",
        vocab_size=int(raw["vocab_size"]),
        dim=dim,
        ffn_dim=int(raw["ffn_dim"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=dim // num_heads,
        max_position_embeddings=int(raw["max_position_embeddings"]),
        norm_eps=1e-5,                  # OPT's nn.LayerNorm default; config.json does not store it
        norm="layer",
        act=_ACTIVATIONS[act],
        gated_mlp=False,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        qk_norm=False,
        rope=False,
        rope_theta=10000.0,
        rope_scaling=None,
        pos_offset=0,                   # the loader strips OPT_POSITION_OFFSET rows: row 0 = position 0
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        sliding_window=None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos(raw),
        torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


# ---- safetensors ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int          # absolute byte offsets in file
    end: int


class SafetensorsCheckpoint:
    """All tensors of a directory's *.safetensors (one file, or shards listed in the index)."""

    def __init__(self, path: str):
        self.path = path
        index_path = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path, encoding="utf-8") as fh:
                weight_map = json.load(fh).get("weight_map", {})
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise ModelLoadError(f"{path}: no *.safetensors weights found")
        self.entries: dict[str, _Entry] = {}
        self._fds: dict[str, int] = {}
        self._maps: dict[str, MappedFile] = {}
        self.quant = None       # hfquant.QuantSpec of an AWQ / GPTQ checkpoint (the loader sets it)
        for name in files:
            self._read_header(os.path.join(path, name))

    def close(self) -> None:
        """Close the files (headers stay; a later read opens them again)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        maps, self._maps = self._maps, {}
        for m in maps.values():
            m.close()

    def stored(self, name: str) -> StoredPart | None:
        """Where tensor `name`'s bytes lie, for packing straight from the mapped file; None for a
        type the packer does not take as stored (float64, integers)."""
        e = self.entry(name)
        type_name = _STORED_TYPES.get(e.dtype.str)
        if type_name is None:
            return None
        mapped = self._maps.get(e.file) or self._maps.setdefault(e.file, MappedFile(e.file))
        return StoredPart(view=partial(mapped.view, e.begin, e.end - e.begin), nbytes=e.end - e.begin,
                          type_name=type_name,
                          release=partial(mapped.release, e.begin, e.end - e.begin))

    def _read_header(self, file: str) -> None:
        if not os.path.exists(file):
            raise ModelLoadError(f"{file}: safetensors shard listed in the index is missing")
        size = os.path.getsize(file)
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{file}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise ModelLoadError(f"{file}: truncated safetensors file: header of {n} bytes, file has {size}")
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ModelLoadError(f"{file}: corrupt safetensors header: {e}") from e
        data_start = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = (data_start + int(o) for o in meta["data_offsets"])
            if end > size:
                raise ModelLoadError(f"{file}: truncated safetensors file: tensor {name!r} needs bytes "
                                     f"{begin}..{end}, file has {size}")
            dt = _SAFETENSORS_DTYPES.get(meta["dtype"])
            if dt is None:
                raise ModelLoadError(f"{file}: tensor {name!r} has dtype {meta['dtype']}, not a type "
                                     f"this loader reads (F32, F16, BF16, F64; I32 / I8 for AWQ, GPTQ, W8A8 values)")
            shape = tuple(int(s) for s in meta["shape"])
            if (end - begin) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
                raise ModelLoadError(f"{file}: tensor {name!r}: {end - begin} bytes do not hold "
                                     f"{meta['dtype']} {list(shape)}")
            self.entries[name] = _Entry(file, dt, shape, begin, end)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def entry(self, name: str, shape: tuple[int, ...] | None = None) -> _Entry:
        """The entry of tensor `name`, checked: present, and of `shape` if given."""
        e = self.entries.get(name)
        if e is None:
            raise ModelLoadError(f"{self.path}: tensor {name!r} is missing from the safetensors files")
        if shape is not None and e.shape != tuple(shape):
            raise ModelLoadError(f"{e.file}: tensor {name!r} has shape {list(e.shape)}, expected {list(shape)}")
        return e

    def read(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` (float32/float16/bf16-as-uint16; float64 narrowed to float32), shape
        checked; new memory."""
        e = self.entry(name, shape)
        return self.read_rows(name, 0, e.shape[0] if e.shape else 1)

    def read_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 (outermost axis) of tensor `name`, as read(); new memory."""
        e = self.entry(name)
        rows = e.shape[0] if e.shape else 1
        if not 0 <= r0 <= r1 <= rows:
            raise ValueError(f"{e.file}: rows {r0}..{r1} of tensor {name!r} with {rows} rows")
        row_bytes = (e.end - e.begin) // rows if rows else 0
        out = np.empty(((r1 - r0) * row_bytes) // e.dtype.itemsize, e.dtype)
        self._pread(e.file, e.begin + r0 * row_bytes, out)
        out = out.reshape((r1 - r0, *e.shape[1:]) if e.shape else ())
        return out.astype(np.float32) if e.dtype == np.float64 else out.astype(e.dtype.newbyteorder("="), copy=False)

    def _pread(self, file: str, offset: int, out: np.ndarray) -> None:
        fd = self._fds.get(file)
        if fd is None:
            try:
                fd = self._fds[file] = os.open(file, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError as e:
                raise ModelLoadError(f"{file}: cannot open safetensors file: {e}") from e
        pread_into(fd, offset, out, file)

    @property
    def total_bytes(self) -> int:
        return sum(e.end - e.begin for e in self.entries.values())


# ---- HF names -> canonical tensors -------------------------------------------------------


def hf_tensor_names(config: ModelConfig) -> list[str]:
    """Every canonical tensor an HF checkpoint yields for config, in load order."""
    names = ["embed"] + (["pos_embed"] if not config.rope else [])
    layer_norm = config.norm == "layer"
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names += [p + "attn_norm.weight"] + ([p + "attn_norm.bias"] if layer_norm else [])
        names += [p + "qkv.weight"] + ([p + "qkv.bias"] if config.qkv_bias else [])
        if config.qk_norm:
            names += [p + "q_norm.weight", p + "k_norm.weight"]
        names += [p + "o.weight"] + ([p + "o.bias"] if config.o_bias else [])
        names += [p + "mlp_norm.weight"] + ([p + "mlp_norm.bias"] if layer_norm else [])
        mlp_in = "gate_up" if config.gated_mlp else "up"
        names += [p + f"{mlp_in}.weight"] + ([p + f"{mlp_in}.bias"] if config.mlp_bias else [])
        names += [p + "down.weight"] + ([p + "down.bias"] if config.mlp_bias else [])
    names += ["final_norm.weight"] + (["final_norm.bias"] if layer_norm else [])
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def iter_hf_tensors(ckpt: SafetensorsCheckpoint,
                    config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    """Canonical (name, tensor) pairs in the file dtype, one at a time: 1-D tensors as arrays,
    2-D ones as StackedRows (read when asked, a slice of rows at a time; q/k/v and gate/up fused)."""
    if config.architecture == "OPTForCausalLM":
        yield from _iter_opt(ckpt, config)
        return
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    q_rows, kv_rows = config.q_size, config.kv_size
    D = config.head_dim
    get = ckpt.read

    def rows(*parts: tuple[str, tuple[int, int]]) -> StackedRows:
        return _stacked(ckpt, parts)

    yield "embed", rows(("model.embed_tokens.weight", (V, E)))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "input_layernorm.weight", (E,))
        a = h + "self_attn."
        yield p + "qkv.weight", rows((a + "q_proj.weight", (q_rows, E)), (a + "k_proj.weight", (kv_rows, E)),
                                     (a + "v_proj.weight", (kv_rows, E)))
        if config.qkv_bias:
            yield p + "qkv.bias", _cat(get(a + "q_proj.bias", (q_rows,)), get(a + "k_proj.bias", (kv_rows,)),
                                       get(a + "v_proj.bias", (kv_rows,)))
        if config.qk_norm:
            yield p + "q_norm.weight", get(a + "q_norm.weight", (D,))
            yield p + "k_norm.weight", get(a + "k_norm.weight", (D,))
        yield p + "o.weight", rows((a + "o_proj.weight", (E, q_rows)))
        if config.o_bias:
            yield p + "o.bias", get(a + "o_proj.bias", (E,))
        yield p + "mlp_norm.weight", get(h + "post_attention_layernorm.weight", (E,))
        m = h + "mlp."
        yield p + "gate_up.weight", rows((m + "gate_proj.weight", (F, E)), (m + "up_proj.weight", (F, E)))
        if config.mlp_bias:
            yield p + "gate_up.bias", _cat(get(m + "gate_proj.bias", (F,)), get(m + "up_proj.bias", (F,)))
        yield p + "down.weight", rows((m + "down_proj.weight", (E, F)))
        if config.mlp_bias:
            yield p + "down.bias", get(m + "down_proj.bias", (E,))
    yield "final_norm.weight", get("model.norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", rows(("lm_head.weight", (V, E)))


def _iter_opt(ckpt: SafetensorsCheckpoint, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    E, F, V, P = config.dim, config.ffn_dim, config.vocab_size, config.max_position_embeddings
    get = ckpt.read

    def rows(*parts: tuple[str, tuple[int, int]]) -> StackedRows:
        return _stacked(ckpt, parts)

    d = "model.decoder."
    yield "embed", rows((d + "embed_tokens.weight", (V, E)))
    ckpt.entry(d + "embed_positions.weight", (P + OPT_POSITION_OFFSET, E))
    yield "pos_embed", StackedRows(((P, lambda a, b: ckpt.read_rows(d + "embed_positions.weight", a + OPT_POSITION_OFFSET,
                                                                    b + OPT_POSITION_OFFSET)),), E)
    for i in range(config.num_layers):
        h, p = f"{d}layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "self_attn_layer_norm.weight", (E,))
        yield p + "attn_norm.bias", get(h + "self_attn_layer_norm.bias", (E,))
        a = h + "self_attn."
        yield p + "qkv.weight", rows(*((a + f"{x}_proj.weight", (E, E)) for x in "qkv"))
        yield p + "qkv.bias", _cat(*(get(a + f"{x}_proj.bias", (E,)) for x in "qkv"))
        yield p + "o.weight", rows((a + "out_proj.weight", (E, E)))
        yield p + "o.bias", get(a + "out_proj.bias", (E,))
        yield p + "mlp_norm.weight", get(h + "final_layer_norm.weight", (E,))
        yield p + "mlp_norm.bias", get(h + "final_layer_norm.bias", (E,))
        yield p + "up.weight", rows((h + "fc1.weight", (F, E)))
        yield p + "up.bias", get(h + "fc1.bias", (F,))
        yield p + "down.weight", rows((h + "fc2.weight", (E, F)))
        yield p + "down.bias", get(h + "fc2.bias", (E,))
    yield "final_norm.weight", get(d + "final_layer_norm.weight", (E,))
    yield "final_norm.bias", get(d + "final_layer_norm.bias", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", rows(("lm_head.weight", (V, E)))


def _stacked(ckpt: SafetensorsCheckpoint, parts: tuple[tuple[str, tuple[int, int]], ...]) -> StackedRows:
    """StackedRows of the named 2-D tensors (shapes checked now, rows read when asked); a linear
    of an AWQ / GPTQ checkpoint (X.qweight beside no X.weight) comes as ggml blocks."""
    rows, blocks, stored = [], [], []
    for name, shape in parts:
        prefix = name[: -len(".weight")]
        if hfquant.is_quantized_linear(ckpt, prefix):
            q = hfquant.QuantLinear(ckpt, prefix, ckpt.quant, shape)
            rows.append((shape[0], q.read_rows))
            blocks.append((q.type_name, q.read_blocks))
            stored.append(None)
        else:
            ckpt.entry(name, shape)
            rows.append((shape[0], partial(ckpt.read_rows, name)))
            blocks.append(None)
            stored.append(ckpt.stored(name))
    return StackedRows(tuple(rows), parts[0][1][1], blocks=tuple(blocks), stored=tuple(stored))


def _cat(*parts: np.ndarray) -> np.ndarray:
    dtypes = {p.dtype for p in parts}
    if len(dtypes) != 1:    # mixed shards (rare): widen everything to float32 via the loader's rules
        from lite_llm.model.weights import convert
        parts = tuple(convert(p, "float32") for p in parts)
    return np.concatenate(parts)
