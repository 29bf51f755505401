"""`bench make-gguf`: random-weight GGUF checkpoints of real model shapes, so benchmarks of
sizes past the shipped model need no downloads.

The weights are random normal (std 0.02; norms 1), written as an F16 GGUF with the embedded
default model's tokenizer (SmolLM2's 49152-token vocabulary and chat template; a shape with a
larger vocabulary, Gemma 3's 262144, gets unused tokens appended so the embedding and output
matrices have the real size), then quantized by llama.cpp's own quantizer
(`llama_model_quantize`, the benchmark extra llama-cpp-python) to the type asked for: the same
file llama.cpp users download, bit for bit in layout. Files are cached under ~/.cache/lite_llm/models/ by shape and type.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from dataclasses import dataclass

from lite_llm.bench.common import CACHE_DIR, copy_gguf_keys, progress


@dataclass(frozen=True)
class Shape:
    arch: str                 # GGUF architecture: "llama" | "qwen3" | "qwen3moe" | "gemma3" | "gpt-oss" | "deepseek2"
    dim: int
    num_layers: int
    ffn_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context: int
    rope_theta: float
    tied: bool = False
    num_experts: int = 0      # qwen3moe: experts per layer (ffn_dim is each expert's width)
    experts_used: int = 0     # top-k
    vocab: int = 0            # 0: the embedded tokenizer's 49152; more: padded with unused tokens
    sliding_window: int = 0   # gemma3: the window of the sliding layers (every 6th layer is global)
    rope_local_theta: float = 0.0   # gemma3: the sliding layers' RoPE base
    yarn: tuple[float, int] = ()    # YaRN RoPE: (factor, original context length)
    yarn_mscale_all_dim: float = 0.0   # deepseek2: YaRN's mscale_all_dim (llama.cpp: 0.1 x it, yarn_log_multiplier)
    # deepseek2 (multi-head latent attention, no q latent as V2-Lite): head_dim is the heads' no-RoPE
    # key width and value width (qk_nope_head_dim = v_head_dim), rope_dim qk_rope_head_dim
    kv_lora_rank: int = 0
    rope_dim: int = 0
    shared_experts: int = 0   # deepseek2: shared experts, each of ffn_dim (one MLP of their sum)
    dense_layers: int = 0     # deepseek2: leading dense layers, of dense_ffn_dim
    dense_ffn_dim: int = 0


SHAPES = {
    "llama-1.1b": Shape("llama", 2048, 16, 8192, 32, 8, 64, 4096, 500000.0),
    "llama-3.2-1b": Shape("llama", 2048, 16, 8192, 32, 8, 64, 8192, 500000.0, tied=True),
    "llama-3.1-8b": Shape("llama", 4096, 32, 14336, 32, 8, 128, 8192, 500000.0),
    "qwen3-8b": Shape("qwen3", 4096, 36, 12288, 32, 8, 128, 8192, 1000000.0),
    # Qwen3-30B-A3B's layer (width 2048, 32 q / 4 kv heads of 128, experts of 768, top-8) with
    # 48 experts instead of 128 and 12 layers instead of 48: 3.0 B parameters (3.3 GB in Q8_0,
    # 1.9 GB in Q4_K_M), 0.8 B of them read per token
    "qwen3-30b-a3b-scaled": Shape("qwen3moe", 2048, 12, 768, 32, 4, 128, 8192, 1000000.0,
                                  num_experts=48, experts_used=8),
    # Gemma 3 1B (google/gemma-3-1b-pt's config.json): 26 layers of width 1152, 4 q / 1 kv heads of
    # 256 (query_pre_attn_scalar 256 = head_dim, llama.cpp's scale for every size but 27B), GeGLU of
    # 6912, 262144-token vocabulary, tied; sliding window 512 with every 6th layer global, RoPE base
    # 1M global / 10k local, no rope scaling (the 4B-27B use linear x8); q/k norms, four norms a layer
    "gemma3-1b": Shape("gemma3", 1152, 26, 6912, 4, 1, 256, 32768, 1000000.0, tied=True, vocab=262144,
                       sliding_window=512, rope_local_theta=10000.0),
    # gpt-oss-20b (openai/gpt-oss-20b's config.json): width 2880, 64 q / 8 kv heads of 64 with biases
    # and attention sinks, sliding window 128 on alternating layers (even ones, as llama.cpp), YaRN
    # x32 over 4096 positions on RoPE base 150k, top-4 softmax-after-top-k routing over experts of
    # 2880 with biases and the clamped SwiGLU, a 201088-token vocabulary, untied, rms eps 1e-5;
    # with 8 experts instead of 32 and 12 layers instead of 24 (F16 file 7.7 GB): 3.9 B parameters,
    # 2.1 B of them read per token (12 x (26.5 M attention + 4 x 24.9 M experts) + 0.58 B output)
    # against the real model's 3.6 B; in MXFP4_MOE the experts are MXFP4 as released, the rest Q8_0
    "gpt-oss-20b-scaled": Shape("gpt-oss", 2880, 12, 2880, 64, 8, 64, 131072, 150000.0, num_experts=8,
                                experts_used=4, vocab=201088, sliding_window=128, yarn=(32.0, 4096)),
    # DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite's config.json): 27 layers of width 2048, 16 heads
    # of multi-head latent attention (kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, no q latent),
    # the first layer dense (10944), then top-6 softmax routing (greedy, not renormalised, x1.0) over
    # experts of 1408 plus 2 shared ones, a 102400-token vocabulary, untied, YaRN x40 over 4096 on
    # base 10k with mscale_all_dim 0.707, rms eps 1e-6; with 16 routed experts instead of 64 (F16 file
    # 9.8 GB): 4.9 B parameters, 2.4 B of them read per token (26 x (13.8 M attention + 8 x 8.65 M
    # experts, 6 routed and 2 shared) + the dense layer's 81 M + 0.21 B output), the real model's 2.4 B
    "deepseek-v2-lite-scaled": Shape("deepseek2", 2048, 27, 1408, 16, 16, 128, 163840, 10000.0, num_experts=16,
                                     experts_used=6, vocab=102400, yarn=(40.0, 4096), yarn_mscale_all_dim=0.707,
                                     kv_lora_rank=512, rope_dim=64, shared_experts=2, dense_layers=1,
                                     dense_ffn_dim=10944),
    "tiny": Shape("llama", 256, 2, 512, 4, 2, 64, 512, 10000.0),      # for tests
    "tiny-moe": Shape("qwen3moe", 256, 2, 256, 4, 2, 64, 512, 10000.0, num_experts=8, experts_used=2),
    # six layers (the sixth global) with a window of 8, a padded vocabulary
    "tiny-gemma3": Shape("gemma3", 256, 6, 512, 4, 1, 64, 512, 1000000.0, tied=True, vocab=49408,
                         sliding_window=8, rope_local_theta=10000.0),
    # four layers, the sliding ones with a window of 8
    "tiny-gpt-oss": Shape("gpt-oss", 256, 4, 256, 4, 2, 64, 4096, 150000.0, num_experts=8, experts_used=4,
                          sliding_window=8, yarn=(32.0, 4096)),
    # one dense layer then two MoE layers; latent rows of 64 + 32
    "tiny-deepseek2": Shape("deepseek2", 256, 3, 256, 4, 4, 32, 4096, 10000.0, num_experts=8, experts_used=2,
                            yarn=(40.0, 4096), yarn_mscale_all_dim=0.707, kv_lora_rank=64, rope_dim=32,
                            shared_experts=2, dense_layers=1, dense_ffn_dim=512),
}
TYPES = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K",
         "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ3_S", "TQ1_0", "TQ2_0",
         "MXFP4_MOE",     # MXFP4_MOE: 3-D expert tensors in MXFP4, the other matrices Q8_0 (gpt-oss's files)
         "IQ2_XXS", "IQ3_XXS")    # random blocks (RANDOM_BLOCKS below)

# The codebook types llama.cpp's quantizer makes only with an importance matrix (which needs a
# real model and text): written as random blocks in place of the layer matrices of the type
# llama.cpp's nearest file type gives them, so a file streams the bytes a real one streams.
RANDOM_BLOCKS = {"IQ2_XXS": ("Q2_K", "Q2_K"), "IQ3_XXS": ("Q3_K_M", "Q3_K")}


def _random_blocks(src: str, dest: str, replace: str, type_name: str, seed: int) -> None:
    """A copy of the GGUF src whose layer matrices of ggml type `replace` are random blocks of
    `type_name`: each block's fp16 scale in 1e-3..3e-3, every other byte random (any byte is a
    valid codebook index or sign); the other tensors and every key as in src but the file type."""
    import gguf
    import numpy as np
    progress(f"make-gguf: {type_name} as random blocks in place of the {replace} matrices of {src} -> {dest}")
    reader = gguf.GGUFReader(src)
    tmp = f"{dest}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(tmp, reader.fields["general.architecture"].contents())
    copy_gguf_keys(reader, w, gguf.LlamaFileType[f"MOSTLY_{type_name}"])
    rng = np.random.default_rng(seed)
    qtype, old = gguf.GGMLQuantizationType[type_name], gguf.GGMLQuantizationType[replace]
    values, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    for t in reader.tensors:
        if t.tensor_type == old and t.name.startswith("blk."):
            rows = int(np.prod([int(x) for x in t.shape[1:]]))
            blocks = rng.integers(0, 256, (rows, int(t.shape[0]) // values, nbytes), dtype=np.uint8)
            scales = rng.uniform(1e-3, 3e-3, blocks.shape[:2]).astype("<f2")
            blocks[:, :, :2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
            w.add_tensor(t.name, blocks.reshape(rows, -1), raw_dtype=qtype)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dest)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="llama-1.1b", choices=sorted(SHAPES))
    parser.add_argument("--type", default="Q4_K_M", choices=TYPES, help="llama.cpp file type")
    parser.add_argument("--output", "-o", default=None, help="path (default: the cache, reused when present)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    print(make_gguf(args.shape, args.type, args.output, args.seed))
    return 0


def make_gguf(shape_name: str, type_name: str, output: str | None = None, seed: int = 0) -> str:
    """Path of a random-weight GGUF of SHAPES[shape_name] in llama.cpp file type type_name."""
    cache = os.path.join(CACHE_DIR, "models")
    f16 = os.path.join(cache, f"{shape_name}.seed{seed}.F16.gguf")
    dest = output or os.path.join(cache, f"{shape_name}.seed{seed}.{type_name}.gguf")
    if output is None and os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    if not os.path.exists(f16):
        _write_f16(SHAPES[shape_name], f16, seed)
    if type_name == "F16":
        if output is not None:
            import shutil
            shutil.copyfile(f16, dest)
        return dest if output is not None else f16
    if type_name in RANDOM_BLOCKS:
        base, replace = RANDOM_BLOCKS[type_name]
        _random_blocks(make_gguf(shape_name, base, None, seed), dest, replace, type_name, seed)
        return dest
    _quantize(f16, dest, type_name)
    return dest


def _write_f16(shape: Shape, path: str, seed: int) -> None:
    import gguf
    import numpy as np

    from lite_llm.model.loader import default_model_path
    progress(f"make-gguf: writing random F16 weights to {path}")
    start = time.perf_counter()
    src = gguf.GGUFReader(default_model_path())
    tmp = f"{path}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(tmp, shape.arch)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    pad = max(shape.vocab - vocab, 0)    # a larger vocabulary (Gemma's 262144): unused tokens appended
    for key, field in src.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                value = field.contents()
                if pad and key == "tokenizer.ggml.tokens":
                    value = value + [f"<unused_{i}>" for i in range(pad)]
                elif pad and key == "tokenizer.ggml.token_type":
                    value = value + [int(gguf.TokenType.UNUSED)] * pad
                elif pad and key == "tokenizer.ggml.scores":
                    value = value + [0.0] * pad
                w.add_key_value(key, value, vtype, sub_type=field.types[-1])
            else:
                w.add_key_value(key, field.contents(), vtype)
    vocab += pad
    a = shape.arch
    mla = a == "deepseek2"
    w.add_uint32(f"{a}.block_count", shape.num_layers)
    w.add_uint32(f"{a}.context_length", shape.context)
    w.add_uint32(f"{a}.embedding_length", shape.dim)
    w.add_uint32(f"{a}.feed_forward_length", shape.dense_ffn_dim or shape.ffn_dim)
    w.add_uint32(f"{a}.attention.head_count", shape.num_heads)
    if mla:   # llama.cpp's MLA layout: one kv "head" of the latent + the RoPE key, values of the latent
        R, Dr = shape.kv_lora_rank, shape.rope_dim
        w.add_uint32(f"{a}.attention.head_count_kv", 1)
        w.add_uint32(f"{a}.attention.key_length", R + Dr)
        w.add_uint32(f"{a}.attention.value_length", R)
        w.add_uint32(f"{a}.attention.key_length_mla", shape.head_dim + Dr)
        w.add_uint32(f"{a}.attention.value_length_mla", shape.head_dim)
        w.add_uint32(f"{a}.attention.kv_lora_rank", R)
        w.add_uint32(f"{a}.attention.q_lora_rank", 0)    # 0: q from x (V2-Lite)
        w.add_uint32(f"{a}.rope.dimension_count", Dr)
        w.add_uint32(f"{a}.leading_dense_block_count", shape.dense_layers)
        w.add_uint32(f"{a}.expert_shared_count", shape.shared_experts)
        w.add_float32(f"{a}.expert_weights_scale", 1.0)
        w.add_bool(f"{a}.expert_weights_norm", False)
        w.add_uint32(f"{a}.expert_gating_func", 1)        # softmax (V2)
        w.add_uint32(f"{a}.expert_group_count", 1)
        w.add_uint32(f"{a}.expert_group_used_count", 1)
    else:
        w.add_uint32(f"{a}.attention.head_count_kv", shape.num_kv_heads)
        w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
        w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
        w.add_uint32(f"{a}.rope.dimension_count", shape.head_dim)
    if shape.num_experts:
        w.add_uint32(f"{a}.expert_count", shape.num_experts)
        w.add_uint32(f"{a}.expert_used_count", shape.experts_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", shape.ffn_dim)
    if shape.sliding_window:      # llama.cpp fixes the pattern: gemma3 every 6th layer global, gpt-oss odd ones
        w.add_uint32(f"{a}.attention.sliding_window", shape.sliding_window)
    if shape.rope_local_theta:    # gemma3's local base (llama.cpp's default is 10k too)
        w.add_float32(f"{a}.rope.freq_base_swa", shape.rope_local_theta)
    if shape.yarn:
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", shape.yarn[0])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", shape.yarn[1])
    if shape.yarn_mscale_all_dim:
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * shape.yarn_mscale_all_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5 if a in ("llama", "gpt-oss") else 1e-6)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    rng = np.random.default_rng(seed)
    E, H, Hkv, D, F = shape.dim, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.ffn_dim
    X = shape.num_experts
    # (name, shape, kind), in file order: "f16" random float16, "f32" random float32 (biases, sinks:
    # llama.cpp's quantizer leaves them), "ones" float32 ones (norms). Tensors are announced first
    # and written one at a time, so an 8B shape (16 GB of F16) never sits in memory whole
    specs = [("token_embd.weight", (vocab, E), "f16")]
    for i in range(shape.num_layers):
        p = f"blk.{i}."
        # the MLP's norm (gpt-oss names it post_attention_norm)
        specs += [(p + "attn_norm.weight", (E,), "ones"),
                  (p + ("post_attention_norm.weight" if a == "gpt-oss" else "ffn_norm.weight"), (E,), "ones")]
        if mla:   # q from x, the latent + RoPE key, W_UK transposed and W_UV per head (llama.cpp's split)
            R, Dr = shape.kv_lora_rank, shape.rope_dim
            specs += [(p + "attn_q.weight", (H * (D + Dr), E), "f16"), (p + "attn_kv_a_mqa.weight", (R + Dr, E), "f16"),
                      (p + "attn_kv_a_norm.weight", (R,), "ones"), (p + "attn_k_b.weight", (H, R, D), "f16"),
                      (p + "attn_v_b.weight", (H, D, R), "f16"), (p + "attn_output.weight", (E, H * D), "f16")]
        else:
            specs += [(p + "attn_q.weight", (H * D, E), "f16"), (p + "attn_k.weight", (Hkv * D, E), "f16"),
                      (p + "attn_v.weight", (Hkv * D, E), "f16"), (p + "attn_output.weight", (E, H * D), "f16")]
        if a == "gpt-oss":   # biases on q, k, v, o and a sink logit per head
            specs += [(p + "attn_q.bias", (H * D,), "f32"), (p + "attn_k.bias", (Hkv * D,), "f32"),
                      (p + "attn_v.bias", (Hkv * D,), "f32"), (p + "attn_output.bias", (E,), "f32"),
                      (p + "attn_sinks.weight", (H,), "f32")]
        if a in ("qwen3", "qwen3moe", "gemma3"):
            specs += [(p + "attn_q_norm.weight", (D,), "ones"), (p + "attn_k_norm.weight", (D,), "ones")]
        if a == "gemma3":    # the norms after attention and after the MLP (stored with Gemma's + 1)
            specs += [(p + "post_attention_norm.weight", (E,), "ones"), (p + "post_ffw_norm.weight", (E,), "ones")]
        if X and i >= shape.dense_layers:   # the router, and every expert's matrices as one 3-D tensor
            specs += [(p + "ffn_gate_inp.weight", (X, E), "f16")]
            if a == "gpt-oss":
                specs.append((p + "ffn_gate_inp.bias", (X,), "f32"))
            specs += [(p + "ffn_gate_exps.weight", (X, F, E), "f16"), (p + "ffn_up_exps.weight", (X, F, E), "f16"),
                      (p + "ffn_down_exps.weight", (X, E, F), "f16")]
            if a == "gpt-oss":
                specs += [(p + "ffn_gate_exps.bias", (X, F), "f32"), (p + "ffn_up_exps.bias", (X, F), "f32"),
                          (p + "ffn_down_exps.bias", (X, E), "f32")]
            if shape.shared_experts:
                Fs = shape.shared_experts * F
                specs += [(p + "ffn_gate_shexp.weight", (Fs, E), "f16"), (p + "ffn_up_shexp.weight", (Fs, E), "f16"),
                          (p + "ffn_down_shexp.weight", (E, Fs), "f16")]
        else:
            Fd = shape.dense_ffn_dim or F
            specs += [(p + "ffn_gate.weight", (Fd, E), "f16"), (p + "ffn_up.weight", (Fd, E), "f16"),
                      (p + "ffn_down.weight", (E, Fd), "f16")]
    specs.append(("output_norm.weight", (E,), "ones"))
    if not shape.tied:
        specs.append(("output.weight", (vocab, E), "f16"))
    for name, dims, kind in specs:
        dtype = np.dtype(np.float16 if kind == "f16" else np.float32)
        w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for n, (name, dims, kind) in enumerate(specs, 1):
        if kind == "ones":
            w.write_tensor_data(np.ones(dims, np.float32))
        else:
            x = rng.standard_normal(dims, dtype=np.float32) * 0.02
            w.write_tensor_data(x.astype(np.float16) if kind == "f16" else x)
        if name.endswith(("ffn_down.weight", "ffn_down_exps.weight")) or n == len(specs):
            progress(f"make-gguf: {n}/{len(specs)} tensors")
    w.close()
    os.replace(tmp, path)
    progress(f"make-gguf: {os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - start:.1f} s")


def _quantize(src: str, dest: str, type_name: str) -> None:
    try:
        import llama_cpp
    except ImportError as e:
        raise SystemExit(f"make-gguf: quantizing needs llama.cpp's quantizer: pip install 'lite-llm[bench]' ({e})")
    progress(f"make-gguf: quantizing to {type_name} with llama.cpp -> {dest}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    params.nthread = os.cpu_count() or 1
    tmp = f"{dest}.{os.getpid()}.tmp"
    start = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise SystemExit(f"make-gguf: llama_model_quantize returned {rc}")
    os.replace(tmp, dest)
    progress(f"make-gguf: quantized in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(run(argparse.ArgumentParser().parse_args()))
