"""BERT-family encoders (HF BertModel: all-MiniLM, bge, e5, gte; XLMRobertaModel; and their
*ForSequenceClassification cross-encoders): learned absolute positions and token-type rows
added to the word embeddings, LayerNorm after the embeddings and after each residual add
(post-norm), bidirectional attention, an ungated erf-GELU MLP. HF safetensors and llama.cpp's
"bert" GGUF.

NomicBert (nomic-embed-text v1 / v1.5; nomic's remote code, llama.cpp's "nomic-bert"): the
same post-norm encoder with RoPE (rotate-half, base rotary_emb_base) in place of learned
positions, a SwiGLU MLP (silu(fc12 x) * fc11 x, then fc2) and no biases but the LayerNorms'.
HF directories as nomic's config.json spells them (n_embd, n_head, n_inner, n_layer, ...)
and GGUF files of arch "nomic-bert".

Canonical names beyond lite_llm/model/__init__.py's: type_embed [types, E] (fp32 table),
embed_norm.weight / .bias [E]; layers.{i}.attn_norm is the LayerNorm after the attention's
residual add, layers.{i}.mlp_norm the one after the MLP's; no final norm, no LM head (the
tied embedding stands in for one nobody calls). A classifier head (pooler dense + tanh, then
classifier [num_labels, E]) is read by the pooler itself (lite_llm/model/pooler.py), not
the kernel model: head_tensors() below.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import SafetensorsCheckpoint, concat, stacked
from lite_llm.model.weights import StackedRows, convert

HF_ARCHITECTURES = ("BertModel", "BertForSequenceClassification", "XLMRobertaModel",
                    "XLMRobertaForSequenceClassification", "RobertaModel", "RobertaForSequenceClassification",
                    "NomicBertModel")
GGUF_ARCHITECTURES = {"bert": "BertModel", "nomic-bert": "NomicBertModel"}
CLASSIFIERS = ("BertForSequenceClassification", "XLMRobertaForSequenceClassification",
               "RobertaForSequenceClassification")


def HF_UNREAD(config: ModelConfig) -> tuple[tuple[str, str], ...]:
    """File tensors the kernel model leaves unread (arch/__init__.py unread_tensors)."""
    unread = ((r"(?:\w+\.)?embeddings\.position_ids", "a buffer older transformers saved: positions 0, 1, ..."),)
    if config.architecture in CLASSIFIERS:
        return unread + ((r"(?:\w+\.)?pooler\.dense\.(?:weight|bias)|classifier\..+",
                          "the classifier head: read by the pooler (head_tensors), not the kernel model"),)
    return unread + ((r"(?:\w+\.)?pooler\.dense\.(?:weight|bias)",
                      "BERT's pooler (dense + tanh over the first token): an embedding is pooled from the last "
                      "hidden states (CLS or mean, as sentence-transformers and vLLM pool), never through it"),)


def is_roberta(arch: str) -> bool:
    return "Roberta" in arch


def is_nomic(arch: str) -> bool:
    return arch == "NomicBertModel"


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    if is_nomic(arch):
        return nomic_config(raw, where)
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ModelLoadError(f"{where}: position_embedding_type {raw['position_embedding_type']!r} "
                             "is not supported (absolute only)")
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        raise ModelLoadError(f"{where}: a BERT decoder / cross-attention model is not supported")
    positions = int(raw["max_position_embeddings"])
    # RoBERTa numbers positions from padding_idx + 1: those rows are dropped at load
    offset = int(raw.get("pad_token_id", 1)) + 1 if is_roberta(arch) else 0
    common = llama.hf_fields(raw)
    return ModelConfig(
        **common,
        architecture=arch,
        num_kv_heads=common["num_heads"],
        head_dim=common["dim"] // common["num_heads"],
        max_position_embeddings=positions - offset,
        **llama.BIASED_LAYERNORM_BLOCK,
        norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        act=llama.activation(raw.get("hidden_act", "gelu"), where),
        pos_offset=offset,
        tie_word_embeddings=True,
        eos_token_ids=(),
        post_ln=True,
        type_vocab_size=int(raw.get("type_vocab_size", 2)),
        causal=False,
    )


def prefix(ckpt, arch: str) -> str:
    """The base model's tensor prefix: "" (a BertModel saved alone), "bert." / "roberta."."""
    for p in ("", "bert.", "roberta.", "model."):
        if p + "embeddings.word_embeddings.weight" in ckpt:
            return p
    raise ModelLoadError(f"{ckpt.path}: no embeddings.word_embeddings.weight under '', 'bert.' or 'roberta.'")


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    if is_nomic(config.architecture):
        yield from nomic_hf_tensors(ckpt, config)
        return
    E, F, V, P = config.dim, config.ffn_dim, config.vocab_size, config.max_position_embeddings
    get = ckpt.read
    d = prefix(ckpt, config.architecture)
    off = config.pos_offset

    def rows(*parts: tuple[str, tuple[int, int]]) -> StackedRows:
        return stacked(ckpt, parts)

    e = d + "embeddings."
    yield "embed", rows((e + "word_embeddings.weight", (V, E)))
    ckpt.entry(e + "position_embeddings.weight", (P + off, E))
    yield "pos_embed", StackedRows(((P, lambda a, b: ckpt.read_rows(e + "position_embeddings.weight", a + off,
                                                                    b + off)),), E)
    yield "type_embed", get(e + "token_type_embeddings.weight", (config.type_vocab_size, E))
    yield "embed_norm.weight", get(e + "LayerNorm.weight", (E,))
    yield "embed_norm.bias", get(e + "LayerNorm.bias", (E,))
    for i in range(config.num_layers):
        h, p = f"{d}encoder.layer.{i}.", f"layers.{i}."
        a = h + "attention.self."
        yield p + "qkv.weight", rows(*((a + f"{x}.weight", (E, E)) for x in ("query", "key", "value")))
        yield p + "qkv.bias", concat(*(get(a + f"{x}.bias", (E,)) for x in ("query", "key", "value")))
        yield p + "o.weight", rows((h + "attention.output.dense.weight", (E, E)))
        yield p + "o.bias", get(h + "attention.output.dense.bias", (E,))
        yield p + "attn_norm.weight", get(h + "attention.output.LayerNorm.weight", (E,))
        yield p + "attn_norm.bias", get(h + "attention.output.LayerNorm.bias", (E,))
        yield p + "up.weight", rows((h + "intermediate.dense.weight", (F, E)))
        yield p + "up.bias", get(h + "intermediate.dense.bias", (F,))
        yield p + "down.weight", rows((h + "output.dense.weight", (E, F)))
        yield p + "down.bias", get(h + "output.dense.bias", (E,))
        yield p + "mlp_norm.weight", get(h + "output.LayerNorm.weight", (E,))
        yield p + "mlp_norm.bias", get(h + "output.LayerNorm.bias", (E,))


def tensor_names(config: ModelConfig) -> list[str]:
    if is_nomic(config.architecture):
        return nomic_tensor_names(config)
    names = ["embed", "pos_embed", "type_embed", "embed_norm.weight", "embed_norm.bias"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names += [p + n for n in ("qkv.weight", "qkv.bias", "o.weight", "o.bias", "attn_norm.weight",
                                  "attn_norm.bias", "up.weight", "up.bias", "down.weight", "down.bias",
                                  "mlp_norm.weight", "mlp_norm.bias")]
    return names


def head_tensors(path: str, arch: str, dim: int) -> dict[str, np.ndarray]:
    """A cross-encoder's classifier head as float32 arrays: BERT's pooler.dense [E, E] (+ bias)
    then classifier [L, E]; RoBERTa's classifier.dense [E, E] then classifier.out_proj [L, E].
    {} for a bare encoder."""
    if arch not in CLASSIFIERS:
        return {}
    ckpt = SafetensorsCheckpoint(path)
    try:
        d = prefix(ckpt, arch)
        if is_roberta(arch):
            names = {"dense": "classifier.dense", "out": "classifier.out_proj"}
        else:
            names = {"dense": d + "pooler.dense", "out": "classifier"}
        out = {}
        for key, name in names.items():
            out[key + ".weight"] = convert(ckpt.read(name + ".weight"), "float32")
            out[key + ".bias"] = convert(ckpt.read(name + ".bias"), "float32")
        if out["dense.weight"].shape != (dim, dim) or out["out.weight"].shape[1] != dim:
            raise ModelLoadError(f"{path}: classifier head shapes {out['dense.weight'].shape} / "
                                 f"{out['out.weight'].shape} do not fit width {dim}")
        return out
    finally:
        ckpt.close()


# ---- GGUF (llama.cpp's "bert" graph) ------------------------------------------------------


def _metadata_key(f, arch: str):
    """key(name, default=None): GGUF metadata `<arch>.<name>`, else default; a ModelLoadError
    naming the file and the key when both are missing."""
    def key(name: str, default=None):
        value = f.metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{f.path}: metadata {arch}.{name} is missing")
        return value
    return key


def gguf_config(f, arch: str) -> ModelConfig:
    if arch == "nomic-bert":
        return nomic_gguf_config(f, arch)
    key = _metadata_key(f, arch)

    dim, heads = int(key("embedding_length")), int(key("attention.head_count"))
    types = f.tensors.get("token_types.weight")
    return ModelConfig(
        architecture="BertModel", vocab_size=int(f.tensors["token_embd.weight"].shape[0]), dim=dim,
        ffn_dim=int(key("feed_forward_length")), num_layers=int(key("block_count")), num_heads=heads,
        num_kv_heads=heads, head_dim=dim // heads, max_position_embeddings=int(key("context_length")),
        norm_eps=float(key("attention.layer_norm_epsilon", 1e-12)), norm="layer", act="gelu", gated_mlp=False,
        qkv_bias=True, o_bias=True, mlp_bias=True, rope=False, tie_word_embeddings=True, post_ln=True,
        type_vocab_size=int(types.shape[0]) if types is not None else 0, causal=False)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    if is_nomic(config.architecture):
        yield from nomic_gguf_tensors(f, config)
        return
    from functools import partial
    E, F, V, P = config.dim, config.ffn_dim, config.vocab_size, config.max_position_embeddings

    def one(name: str, shape: tuple[int, int]) -> StackedRows:
        f.info(name, shape)
        t = f.tensors[name].type_name
        blocks = (t, partial(f.read_raw_rows, name)) if t in NATIVE_TYPES else None
        return StackedRows(((shape[0], partial(f.read_rows, name)),), shape[1], blocks=(blocks,),
                           stored=(f.stored(name),))

    def parts(*specs: tuple[str, tuple[int, int]]) -> StackedRows:
        rows = [one(n, s) for n, s in specs]
        return StackedRows(tuple(r.parts[0] for r in rows), E, blocks=tuple(r.blocks[0] for r in rows),
                           stored=tuple(r.stored[0] for r in rows))

    def vec(name: str, n: int) -> np.ndarray:
        f.info(name, (n,))
        return f.read(name)

    yield "embed", one("token_embd.weight", (V, E))
    f.info("position_embd.weight", (P, E))
    yield "pos_embed", f.read("position_embd.weight")
    if config.type_vocab_size:
        yield "type_embed", f.read("token_types.weight")
    yield "embed_norm.weight", vec("token_embd_norm.weight", E)
    yield "embed_norm.bias", vec("token_embd_norm.bias", E)
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "qkv.weight", parts(*((b + f"attn_{x}.weight", (E, E)) for x in "qkv"))
        yield p + "qkv.bias", np.concatenate([vec(b + f"attn_{x}.bias", E) for x in "qkv"])
        yield p + "o.weight", one(b + "attn_output.weight", (E, E))
        yield p + "o.bias", vec(b + "attn_output.bias", E)
        yield p + "attn_norm.weight", vec(b + "attn_output_norm.weight", E)
        yield p + "attn_norm.bias", vec(b + "attn_output_norm.bias", E)
        yield p + "up.weight", one(b + "ffn_up.weight", (F, E))
        yield p + "up.bias", vec(b + "ffn_up.bias", F)
        yield p + "down.weight", one(b + "ffn_down.weight", (E, F))
        yield p + "down.bias", vec(b + "ffn_down.bias", E)
        yield p + "mlp_norm.weight", vec(b + "layer_output_norm.weight", E)
        yield p + "mlp_norm.bias", vec(b + "layer_output_norm.bias", E)


def _gguf_rows(f, name: str, shape: tuple[int, int], r0: int = 0) -> StackedRows:
    """Rows r0 .. r0 + shape[0] of a GGUF matrix, read when asked (in its stored blocks where the
    kernels run that type natively)."""
    t = f.tensors[name].type_name
    blocks = (t, lambda a, b: f.read_raw_rows(name, r0 + a, r0 + b)) if t in NATIVE_TYPES else None
    return StackedRows(((shape[0], lambda a, b: f.read_rows(name, r0 + a, r0 + b)),), shape[1], blocks=(blocks,),
                       stored=(f.stored(name, 0, r0, r0 + shape[0]),))


def _join(*parts: StackedRows) -> StackedRows:
    return StackedRows(tuple(p.parts[0] for p in parts), parts[0].cols, blocks=tuple(p.blocks[0] for p in parts),
                       stored=tuple(p.stored[0] for p in parts))


# ---- NomicBert ------------------------------------------------------------------------------


def _nomic(dim: int, heads: int, ffn: int, layers: int, vocab: int, positions: int, eps: float, theta: float,
           types: int, torch_dtype=None) -> ModelConfig:
    return ModelConfig(
        architecture="NomicBertModel", vocab_size=vocab, dim=dim, ffn_dim=ffn, num_layers=layers, num_heads=heads,
        num_kv_heads=heads, head_dim=dim // heads, max_position_embeddings=positions, norm_eps=eps, norm="layer",
        act="silu", gated_mlp=True, qkv_bias=False, o_bias=False, mlp_bias=False, rope=True, rope_theta=theta,
        tie_word_embeddings=True, eos_token_ids=(), torch_dtype=torch_dtype, post_ln=True, type_vocab_size=types,
        causal=False)


def nomic_config(raw: dict, where: str) -> ModelConfig:
    """nomic's config.json (GPT-2 style names): n_embd, n_head, n_inner, n_layer, n_positions,
    rotary_emb_base, layer_norm_epsilon. What nomic-embed-text v1 / v1.5 set is supported; any
    other variant of their code (biases, rotary scaling, interleaved rotary, pre-norm, GELU) is
    refused by name rather than computed wrongly."""
    unsupported = {"qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False,
                   "rotary_emb_interleaved": False, "rotary_scaling_factor": None, "parallel_block": False,
                   "use_rms_norm": False, "causal": False, "rotary_emb_fraction": 1.0}
    for key, want in unsupported.items():
        if raw.get(key, want) != want:
            raise ModelLoadError(f"{where}: NomicBert with {key}={raw[key]!r} is not supported (only {want!r})")
    if raw.get("activation_function", "swiglu") != "swiglu":
        raise ModelLoadError(f"{where}: NomicBert activation_function {raw['activation_function']!r} is not "
                             "supported (swiglu only)")
    if raw.get("num_experts"):
        raise ModelLoadError(f"{where}: NomicBert with experts (nomic-embed-text v2 MoE) is not supported")
    dim = int(raw["n_embd"])
    return _nomic(dim, int(raw["n_head"]), int(raw.get("n_inner") or 4 * dim), int(raw["n_layer"]),
                  int(raw["vocab_size"]), int(raw.get("n_positions", 2048)),
                  float(raw.get("layer_norm_epsilon", 1e-12)), float(raw.get("rotary_emb_base", 10000.0)),
                  int(raw.get("type_vocab_size", 2)), raw.get("torch_dtype"))


def nomic_tensor_names(config: ModelConfig) -> list[str]:
    names = ["embed"] + (["type_embed"] if config.type_vocab_size else []) + ["embed_norm.weight",
                                                                                "embed_norm.bias"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names += [p + n for n in ("qkv.weight", "o.weight", "attn_norm.weight", "attn_norm.bias", "gate_up.weight",
                                  "down.weight", "mlp_norm.weight", "mlp_norm.bias")]
    return names


def nomic_hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    """nomic's state dict: embeddings.word_embeddings / token_type_embeddings, emb_ln, and per
    layer attn.Wqkv [3E, E] (q, k, v rows), attn.out_proj, norm1 (after attention), mlp.fc11
    (up), mlp.fc12 (gate), mlp.fc2 (down), norm2 (after the MLP)."""
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    get = ckpt.read
    d = next((p for p in ("", "model.", "bert.") if p + "embeddings.word_embeddings.weight" in ckpt), None)
    if d is None:
        raise ModelLoadError(f"{ckpt.path}: no embeddings.word_embeddings.weight under '', 'model.' or 'bert.'")
    yield "embed", stacked(ckpt, ((d + "embeddings.word_embeddings.weight", (V, E)),))
    if config.type_vocab_size:
        yield "type_embed", get(d + "embeddings.token_type_embeddings.weight", (config.type_vocab_size, E))
    yield "embed_norm.weight", get(d + "emb_ln.weight", (E,))
    yield "embed_norm.bias", get(d + "emb_ln.bias", (E,))
    for i in range(config.num_layers):
        h, p = f"{d}encoder.layers.{i}.", f"layers.{i}."
        yield p + "qkv.weight", stacked(ckpt, ((h + "attn.Wqkv.weight", (3 * E, E)),))
        yield p + "o.weight", stacked(ckpt, ((h + "attn.out_proj.weight", (E, E)),))
        yield p + "attn_norm.weight", get(h + "norm1.weight", (E,))
        yield p + "attn_norm.bias", get(h + "norm1.bias", (E,))
        yield p + "gate_up.weight", stacked(ckpt, ((h + "mlp.fc12.weight", (F, E)), (h + "mlp.fc11.weight", (F, E))))
        yield p + "down.weight", stacked(ckpt, ((h + "mlp.fc2.weight", (E, F)),))
        yield p + "mlp_norm.weight", get(h + "norm2.weight", (E,))
        yield p + "mlp_norm.bias", get(h + "norm2.bias", (E,))


def nomic_gguf_config(f, arch: str) -> ModelConfig:
    key = _metadata_key(f, arch)

    if "blk.0.ffn_gate.weight" not in f.tensors or "blk.0.attn_qkv.weight" not in f.tensors:
        raise ModelLoadError(f"{f.path}: a nomic-bert GGUF without blk.0.attn_qkv / blk.0.ffn_gate is not "
                             "supported (experts or split q/k/v)")
    types = f.tensors.get("token_types.weight")
    return _nomic(int(key("embedding_length")), int(key("attention.head_count")), int(key("feed_forward_length")),
                  int(key("block_count")), int(f.tensors["token_embd.weight"].shape[0]), int(key("context_length")),
                  float(key("attention.layer_norm_epsilon", 1e-12)), float(key("rope.freq_base", 10000.0)),
                  int(types.shape[0]) if types is not None else 0)


def nomic_gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    """llama.cpp's "nomic-bert" names: token_embd, token_types, token_embd_norm; per block
    attn_qkv [3E, E], attn_output, attn_output_norm, ffn_up (fc11), ffn_gate (fc12), ffn_down,
    layer_output_norm."""
    E, F, V = config.dim, config.ffn_dim, config.vocab_size

    def mat(name: str, shape: tuple[int, int]) -> StackedRows:
        f.info(name, shape)
        return _gguf_rows(f, name, shape)

    def vec(name: str, n: int) -> np.ndarray:
        f.info(name, (n,))
        return f.read(name)

    yield "embed", mat("token_embd.weight", (V, E))
    if config.type_vocab_size:
        f.info("token_types.weight", (config.type_vocab_size, E))
        yield "type_embed", f.read("token_types.weight")
    yield "embed_norm.weight", vec("token_embd_norm.weight", E)
    yield "embed_norm.bias", vec("token_embd_norm.bias", E)
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "qkv.weight", mat(b + "attn_qkv.weight", (3 * E, E))
        yield p + "o.weight", mat(b + "attn_output.weight", (E, E))
        yield p + "attn_norm.weight", vec(b + "attn_output_norm.weight", E)
        yield p + "attn_norm.bias", vec(b + "attn_output_norm.bias", E)
        yield p + "gate_up.weight", _join(mat(b + "ffn_gate.weight", (F, E)), mat(b + "ffn_up.weight", (F, E)))
        yield p + "down.weight", mat(b + "ffn_down.weight", (E, F))
        yield p + "mlp_norm.weight", vec(b + "layer_output_norm.weight", E)
        yield p + "mlp_norm.bias", vec(b + "layer_output_norm.bias", E)
