"""A Qwen2.5-VL Hugging Face checkpoint written as the two files llama.cpp runs it from: the
language model as a "qwen2vl" GGUF (multimodal RoPE sections in qwen2vl.rope.dimension_sections)
and the vision tower + merger as an mmproj GGUF in clip.cpp's "qwen2.5vl_merger" layout. For
the benchmark and the tests that compare lite-llm with llama.cpp on the same weights; llama.cpp's
own converter (convert_hf_to_gguf.py) is not on PyPI, so this follows the layout it writes:

    visual.patch_embed.proj [C, 3, 2, p, p]   -> v.patch_embd.weight / .weight.1 (one per frame)
    visual.blocks.N.attn.qkv                  -> v.blk.N.attn_q / attn_k / attn_v (split by rows)
    visual.blocks.N.attn.proj                 -> v.blk.N.attn_out
    visual.blocks.N.norm1 / norm2 (RMSNorm)   -> v.blk.N.ln1 / ln2
    visual.blocks.N.mlp.{gate,up,down}_proj   -> v.blk.N.ffn_gate / ffn_up / ffn_down
    visual.merger.ln_q / mlp.0 / mlp.2        -> v.post_ln / mm.0 / mm.2

Window attention is described by clip.vision.n_wa_pattern: every n-th block (1-based) attends to
the whole image, so fullatt_block_indexes must be evenly spaced (n - 1, 2n - 1, ...). clip.cpp
cuts windows of 112 pixels whatever the config says: a checkpoint with another window_size is
refused. The vocabulary is synthetic (the benchmark's checkpoints have none): "t<id>" for every
id, the given special tokens as control tokens at their ids; callers feed token ids, never text.

Not a library path: nothing in lite-llm reads these files through this module.
"""
from __future__ import annotations

import json
import os

# Qwen2.5-VL's own special tokens, by id (the released tokenizer's)
QWEN_SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                 151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
                 151655: "<|image_pad|>", 151656: "<|video_pad|>"}
CLIP_WINDOW = 112     # clip.cpp's fixed attention window for qwen2.5vl_merger, pixels
OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def add_text_header(w, t: dict, eps: float, theta: float) -> None:
    """The language model's shape keys of a GGUF (writer w) from an HF text config t: layers,
    context, widths, heads, the RMSNorm epsilon and the RoPE base (bench.llava's GGUF too)."""
    w.add_block_count(t["num_hidden_layers"])
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(t["num_attention_heads"])
    w.add_head_count_kv(t["num_key_value_heads"])
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_freq_base(theta)


class _Tensors:
    """The checkpoint's tensors by name, read one at a time as float32 NumPy (bf16 included)."""

    def __init__(self, root: str):
        from safetensors import safe_open
        self._files = {}
        for name in sorted(os.listdir(root)):
            if name.endswith(".safetensors"):
                f = safe_open(os.path.join(root, name), framework="pt")
                for key in f.keys():
                    self._files[key] = f

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._files[name].get_slice(name).get_shape())

    def get(self, name: str):
        return self._files[name].get_tensor(name).float().numpy()


KINDS = ("f32", "f16", "bf16")


def _write(path: str, arch: str, meta, items: list, kind: str) -> str:
    """items: (gguf name, numpy shape, producer of the float32 array). Matrices are written in
    `kind` (f16: llama.cpp's converters' default; bf16: the checkpoint's own bits), vectors
    always F32; tensor data streams one tensor at a time so a 3B checkpoint never sits in
    memory whole."""
    import gguf
    import numpy as np
    if kind not in KINDS:
        raise ValueError(f"GGUF tensor type {kind!r}: choose from {', '.join(KINDS)}")
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[kind]
    w = gguf.GGUFWriter(path, arch)
    meta(w, gguf)
    w.add_file_type(file_type)
    kinds = []
    for name, shape, _ in items:
        k = kind if len(shape) >= 2 else "f32"
        kinds.append(k)
        n = int(np.prod(shape))
        if k == "bf16":
            w.add_tensor_info(name, shape, np.dtype(np.uint16), 2 * n, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            dt = np.dtype(np.float16 if k == "f16" else np.float32)
            w.add_tensor_info(name, shape, dt, n * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for (name, shape, make), k in zip(items, kinds):
        a = np.ascontiguousarray(make(), dtype=np.float32)
        if a.shape != tuple(shape):
            raise ValueError(f"{name}: made {a.shape}, declared {shape}")
        if k == "bf16":     # round to nearest even (exact for weights that were bf16)
            bits = a.view(np.uint32)
            a = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        elif k == "f16":
            a = a.astype(np.float16)
        w.write_tensor_data(a)
    w.close()
    return path


def write_language_model(root: str, path: str, *, kind: str = "f16", specials: dict[int, str] | None = None) -> str:
    """The language model of the Qwen2.5-VL checkpoint at root as a llama.cpp "qwen2vl" GGUF."""
    cfg = json.load(open(os.path.join(root, "config.json")))
    t = cfg.get("text_config", cfg)
    sd = _Tensors(root)
    lm = "model.language_model." if "model.language_model.embed_tokens.weight" in sd else "model."
    V = t["vocab_size"]
    rope = t.get("rope_scaling") or t.get("rope_parameters") or {}
    sections = list(rope["mrope_section"]) + [0] * (4 - len(rope["mrope_section"]))
    theta = rope.get("rope_theta", t.get("rope_theta", 1000000.0))
    specials = QWEN_SPECIALS if specials is None else specials
    tie = cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False))

    def meta(w, gguf):
        w.add_name("random-weight Qwen2.5-VL language model")
        add_text_header(w, t, t.get("rms_norm_eps", 1e-6), theta)
        w.add_rope_dimension_sections(sections)
        w.add_tokenizer_model("llama")
        w.add_token_list([specials.get(i, f"t{i}") for i in range(V)])
        w.add_token_scores([0.0] * V)
        w.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(V)])
        w.add_bos_token_id(t.get("bos_token_id") or 0)
        w.add_eos_token_id(t.get("eos_token_id") or 0)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)

    def item(name, key):
        return (name, sd.shape(key), lambda: sd.get(key))
    items = [item("token_embd.weight", lm + "embed_tokens.weight"), item("output_norm.weight", lm + "norm.weight")]
    if not tie:
        items.append(item("output.weight", "lm_head.weight"))
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(t["num_hidden_layers"]):
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                key = f"{lm}layers.{i}.{theirs}.{part}"
                if key in sd:
                    items.append(item(f"blk.{i}.{ours}.{part}", key))
    return _write(path, "qwen2vl", meta, items, kind)


def n_wa_pattern(fullatt_block_indexes: list[int]) -> int:
    """clip.cpp's window pattern: block i attends to the whole image when (i + 1) % n == 0."""
    n = fullatt_block_indexes[0] + 1
    if any(b - a != n for a, b in zip(fullatt_block_indexes, fullatt_block_indexes[1:])):
        raise ValueError(f"fullatt_block_indexes {fullatt_block_indexes} are not every {n}-th block: "
                         "clip.cpp's n_wa_pattern cannot describe them")
    return n


def write_mmproj(root: str, path: str, *, kind: str = "f16") -> str:
    """The vision tower and merger of the Qwen2.5-VL checkpoint at root as a llama.cpp mmproj GGUF."""
    cfg = json.load(open(os.path.join(root, "config.json")))
    v, t = cfg["vision_config"], cfg.get("text_config", cfg)
    if v.get("window_size", CLIP_WINDOW) != CLIP_WINDOW:
        raise ValueError(f"window_size {v['window_size']}: clip.cpp cuts qwen2.5vl windows of {CLIP_WINDOW} pixels")
    if v.get("temporal_patch_size", 2) != 2:
        raise ValueError("clip.cpp's qwen2.5vl_merger takes a temporal patch of 2 frames")
    sd = _Tensors(root)
    p = "model.visual." if "model.visual.merger.ln_q.weight" in sd else "visual."
    C = v["hidden_size"]
    pattern = n_wa_pattern(v["fullatt_block_indexes"])

    def meta(w, gguf):
        w.add_name("random-weight Qwen2.5-VL vision tower")
        w.add_type(gguf.GGUFType.MMPROJ)
        w.add_clip_has_vision_encoder(True)
        w.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
        w.add_vision_projection_dim(t["hidden_size"])
        w.add_vision_image_size(560)                 # llama.cpp's converter's value for Qwen2-VL towers
        w.add_vision_patch_size(v["patch_size"])
        w.add_vision_embedding_length(C)
        w.add_vision_feed_forward_length(v["intermediate_size"])
        w.add_vision_block_count(v["depth"])
        w.add_vision_head_count(v["num_heads"])
        w.add_vision_image_mean(OPENAI_CLIP_MEAN)
        w.add_vision_image_std(OPENAI_CLIP_STD)
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(pattern)
        w.add_vision_attention_layernorm_eps(t.get("rms_norm_eps", 1e-6))

    def item(name, key, rows=None):
        shape = sd.shape(key)
        if rows is None:
            return (name, shape, lambda: sd.get(key))
        return (name, (C, *shape[1:]), lambda: sd.get(key)[rows * C:(rows + 1) * C])
    patch = p + "patch_embed.proj.weight"           # [C, 3, 2, p, p]: one conv2d per frame
    pshape = sd.shape(patch)
    items = [(f"v.patch_embd.weight{suffix}", (pshape[0], pshape[1], *pshape[3:]),
              lambda k=k: sd.get(patch)[:, :, k]) for k, suffix in ((0, ""), (1, ".1"))]
    names = {"attn_out": "attn.proj", "ln1": "norm1", "ln2": "norm2", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(v["depth"]):
        b = f"{p}blocks.{i}."
        for part in ("weight", "bias"):
            for k, ours in enumerate(("attn_q", "attn_k", "attn_v")):
                items.append(item(f"v.blk.{i}.{ours}.{part}", f"{b}attn.qkv.{part}", rows=k))
            for ours, theirs in names.items():
                if f"{b}{theirs}.{part}" in sd:
                    items.append(item(f"v.blk.{i}.{ours}.{part}", f"{b}{theirs}.{part}"))
    items.append(item("v.post_ln.weight", p + "merger.ln_q.weight"))
    for ours, theirs in (("mm.0", "merger.mlp.0"), ("mm.2", "merger.mlp.2")):
        for part in ("weight", "bias"):
            items.append(item(f"{ours}.{part}", f"{p}{theirs}.{part}"))
    return _write(path, "clip", meta, items, kind)


def write_pair(root: str, out_dir: str, *, kind: str = "f16", specials: dict[int, str] | None = None) -> tuple[str, str]:
    """(language model GGUF, mmproj GGUF) of the checkpoint at root with `kind` matrices, under
    out_dir (reused when present)."""
    lm, mm = os.path.join(out_dir, f"lm-{kind}.gguf"), os.path.join(out_dir, f"mmproj-{kind}.gguf")
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(lm):
        write_language_model(root, lm + ".part", kind=kind, specials=specials)
        os.replace(lm + ".part", lm)
    if not os.path.exists(mm):
        write_mmproj(root, mm + ".part", kind=kind)
        os.replace(mm + ".part", mm)
    return lm, mm
