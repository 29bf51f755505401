"""`python -m lite_llm.bench.llava`: image encode time and time to first token of a one-image
prompt on a random-weight LLaVA-1.5, lite-llm on a GGUF language model + mmproj pair against
llama.cpp (llama-cpp-python's mtmd) on the same two files and transformers on the same weights.

    --shape 1b     LLaVA-1.5's CLIP ViT-L/14-336 (width 1024, 24 blocks of which 23 run, 16
                   heads, 576 image rows) and its 2-layer projector, in front of a 1.1B Llama
                   (TinyLlama's shape: width 2048, 22 layers, 32 q / 4 kv heads, vocab 32064);
                   LLaVA-1.5-7B's own 7B language model would not fit beside the other engines
    --shape tiny   a tiny shape, to check the program runs

Weights are written once in F16 (the GGUF pair, llama.cpp's converters' default) and bf16 (the
HF directory transformers loads); each engine runs in its own process, one after the other, on
--threads. encode = the vision tower and projector on one preprocessed image (best of
--repeats; lite-llm: its engine thread's time in the tower while it serves the TTFT requests); TTFT = preprocessing + encode + prefill + the first token of a prompt of the image
and --text-len text tokens (best of --repeats, a new image each time so no cache helps). The
llama.cpp build in llama-cpp-python 0.3.x computes a different image embedding than
transformers (its class row sits after the patches: see BENCHMARKS.md); its cost is the same.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from lite_llm.bench.qwen2_5_vl_gguf import add_text_header
from lite_llm.bench.vision import (print_result, print_table, program_main, run_engines, test_image,
                                   time_images)

IMAGE_TOKEN = 32000      # "<image>", as llava-hf's vocabulary has it

CLIP_L14 = dict(patch_size=14, hidden_act="quick_gelu", layer_norm_eps=1e-5)    # CLIP ViT-L/14's, at every width
LLAMA_32K = dict(vocab_size=32064, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                 bos_token_id=1, eos_token_id=2)
SHAPES = {
    "1b": dict(vision=dict(CLIP_L14, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                           num_attention_heads=16, image_size=336, projection_dim=768),
               text=dict(LLAMA_32K, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                         num_attention_heads=32, num_key_value_heads=4)),
    "tiny": dict(vision=dict(CLIP_L14, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                             image_size=56, projection_dim=32),
                 text=dict(LLAMA_32K, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2)),
}


def build(shape: str, root: str) -> tuple[str, str, str]:
    """(HF directory, language model GGUF, mmproj GGUF) of a random-weight LLaVA of `shape`
    under root (reused when present)."""
    base = os.path.join(root, f"llava-{shape}-random")
    hf, lm, mm = os.path.join(base, "hf"), os.path.join(base, "lm-f16.gguf"), os.path.join(base, "mmproj-f16.gguf")
    if all(os.path.exists(p) for p in (os.path.join(hf, "config.json"), lm, mm)):
        return hf, lm, mm
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    s = SHAPES[shape]
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        cfg = LlavaConfig(vision_config=dict(s["vision"], model_type="clip_vision_model"),
                          text_config=dict(s["text"], model_type="llama"), image_token_id=IMAGE_TOKEN,
                          vision_feature_layer=-2, vision_feature_select_strategy="default",
                          projector_hidden_act="gelu", tie_word_embeddings=False)
        model = LlavaForConditionalGeneration(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():   # small weights: no overflow in F16
                if p.ndim >= 2:
                    p.normal_(0.0, 0.02)
    finally:
        torch.set_default_dtype(torch.float32)
    os.makedirs(base, exist_ok=True)
    model.save_pretrained(hf, safe_serialization=True)
    with open(os.path.join(hf, "preprocessor_config.json"), "w") as fh:
        size = s["vision"]["image_size"]
        json.dump({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": size},
                   "crop_size": {"height": size, "width": size}, "do_center_crop": True, "resample": 3}, fh)
    del model
    from safetensors.torch import load_file     # the names as saved (the hub's layout)
    sd = {}
    for name in sorted(os.listdir(hf)):
        if name.endswith(".safetensors"):
            sd.update({k: v.float().numpy() for k, v in load_file(os.path.join(hf, name)).items()})
    _write_lm(sd, s["text"], lm)
    _write_mmproj(sd, s["vision"], mm)
    return hf, lm, mm


def _tensor(sd: dict, *names: str):
    for n in names:
        if n in sd:
            return sd[n]
    raise KeyError(names[0])


def _write_lm(sd: dict, t: dict, path: str) -> None:
    """The language model as a llama.cpp "llama" GGUF: F16 matrices, F32 norms, q/k rows permuted
    as llama.cpp's converter does, a SentencePiece-style vocabulary with "<image>" at 32000."""
    import gguf
    import numpy as np
    H, Hkv, E = t["num_attention_heads"], t["num_key_value_heads"], t["hidden_size"]

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    w = gguf.GGUFWriter(path, "llama")
    add_text_header(w, t, t["rms_norm_eps"], t["rope_theta"])
    w.add_rope_dimension_count(E // H)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    V = t["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(IMAGE_TOKEN - len(tokens))] + ["<image>"]
    tokens += [f"<pad{i}>" for i in range(V - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (IMAGE_TOKEN - 259) + [4] + [4] * (V - IMAGE_TOKEN - 1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    lm = "language_model.model." if "language_model.model.embed_tokens.weight" in sd else "model.language_model."
    head = _tensor(sd, "language_model.lm_head.weight", "lm_head.weight")
    w.add_tensor("token_embd.weight", sd[lm + "embed_tokens.weight"].astype(np.float16))
    w.add_tensor("output_norm.weight", sd[lm + "norm.weight"].astype(np.float32))
    w.add_tensor("output.weight", head.astype(np.float16))
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(t["num_hidden_layers"]):
        for ours, theirs in names.items():
            a = sd[f"{lm}layers.{i}.{theirs}.weight"]
            if ours in ("attn_q", "attn_k"):
                a = permute(a, H if ours == "attn_q" else Hkv)
            w.add_tensor(f"blk.{i}.{ours}.weight", a.astype(np.float32 if a.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_mmproj(sd: dict, v: dict, path: str) -> None:
    """CLIP + projector as llama.cpp's mmproj GGUF (clip.cpp's names and keys): F16 matrices,
    F32 vectors; every block stored (clip.cpp runs block_count - 1), no post_ln."""
    import gguf
    import numpy as np
    p = "vision_tower.vision_model." if "vision_tower.vision_model.pre_layrnorm.weight" in sd else "vision_tower."
    w = gguf.GGUFWriter(path, "clip")
    for key, value in (("clip.has_text_encoder", False), ("clip.has_vision_encoder", True),
                       ("clip.has_llava_projector", True), ("clip.use_gelu", False)):
        w.add_bool(key, value)
    w.add_string("clip.projector_type", "mlp")
    for key, value in (("image_size", v["image_size"]), ("patch_size", v["patch_size"]),
                       ("embedding_length", v["hidden_size"]), ("feed_forward_length", v["intermediate_size"]),
                       ("projection_dim", v["projection_dim"]), ("attention.head_count", v["num_attention_heads"]),
                       ("block_count", v["num_hidden_layers"])):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", v["layer_norm_eps"])
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    w.add_uint32("general.file_type", 1)

    def add(name, a):
        w.add_tensor(name, a.astype(np.float16 if a.ndim >= 2 else np.float32))
    add("v.patch_embd.weight", sd[p + "embeddings.patch_embedding.weight"])
    add("v.class_embd", sd[p + "embeddings.class_embedding"])
    add("v.position_embd.weight", sd[p + "embeddings.position_embedding.weight"])
    add("v.pre_ln.weight", sd[p + "pre_layrnorm.weight"])
    add("v.pre_ln.bias", sd[p + "pre_layrnorm.bias"])
    for i in range(v["num_hidden_layers"]):
        q = f"{p}encoder.layers.{i}."
        for ours, theirs in (("ln1", "layer_norm1"), ("ln2", "layer_norm2"), ("attn_q", "self_attn.q_proj"),
                             ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                             ("attn_out", "self_attn.out_proj"), ("ffn_up", "mlp.fc1"), ("ffn_down", "mlp.fc2")):
            for part in ("weight", "bias"):
                add(f"v.blk.{i}.{ours}.{part}", sd[f"{q}{theirs}.{part}"])
    mp = "multi_modal_projector." if "multi_modal_projector.linear_1.weight" in sd else "model.multi_modal_projector."
    for ours, theirs in (("mm.0", "linear_1"), ("mm.2", "linear_2")):
        for part in ("weight", "bias"):
            add(f"{ours}.{part}", sd[f"{mp}{theirs}.{part}"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def prompt_ids(text_len: int, seed: int) -> list[int]:
    """<s> text <image> text: the image between two halves of text_len random text tokens."""
    import random
    rng = random.Random(seed)
    text = [rng.randrange(300, 30000) for _ in range(text_len)]
    return [1] + text[:text_len // 2] + [IMAGE_TOKEN] + text[text_len // 2:]


def run_lite(files, args) -> dict:
    from lite_llm import LLM
    _, lm, mm = files
    llm = LLM(lm, mmproj=mm, dtype=args.dtype, skip_tokenizer_init=True, max_model_len=2048,
              max_num_batched_tokens=2048, kv_cache_space=1, enable_prefix_caching=False)
    out = time_images(llm, args, prompt_ids)
    return {**out, "image_tokens": llm._engine.engine.runner.vision.vision.num_image_tokens}


def run_transformers(files, args) -> dict:
    import torch
    from transformers import LlavaForConditionalGeneration
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    torch.set_num_threads(args.threads)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = LlavaForConditionalGeneration.from_pretrained(files[0], dtype=dtype).eval()
    proc = CLIPImageProcessorPil.from_pretrained(files[0])
    n = (model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2
    encode, ttft = [], []
    with torch.inference_mode():
        for r in range(args.repeats):
            pixels = proc(images=[test_image(args.image, 100 + r)], return_tensors="pt")["pixel_values"].to(dtype)
            t0 = time.perf_counter()
            model.model.get_image_features(pixel_values=pixels, vision_feature_layer=-2,
                                           vision_feature_select_strategy="default")
            encode.append(time.perf_counter() - t0)
        for r in range(args.repeats):
            img = test_image(args.image, 200 + r)
            t0 = time.perf_counter()
            pixels = proc(images=[img], return_tensors="pt")["pixel_values"].to(dtype)
            ids = prompt_ids(args.text_len, r)
            at = ids.index(IMAGE_TOKEN)
            ids = ids[:at] + [IMAGE_TOKEN] * n + ids[at + 1:]
            logits = model(input_ids=torch.tensor([ids]), pixel_values=pixels, logits_to_keep=1).logits
            int(logits[0, -1].argmax())
            ttft.append(time.perf_counter() - t0)
    return {"encode_s": min(encode), "ttft_s": min(ttft), "prompt_tokens": len(ids)}


def run_llamacpp(files, args) -> dict:
    """llama.cpp through llama-cpp-python's mtmd bindings: the image chunk encoded alone
    (encode), then a whole prompt tokenized with the image, evaluated, its last logits read."""
    import ctypes

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    import numpy as np
    _, lm, mm = files
    llm = llama_cpp.Llama(model_path=lm, n_ctx=2048, n_batch=2048, n_ubatch=2048, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = args.threads
    params.print_timings = False
    ctx = mtmd.mtmd_init_from_file(mm.encode(), llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp's mtmd cannot load {mm}")
    marker = mtmd.mtmd_default_marker()

    def chunks_of(img, text: bytes):
        rgb = np.ascontiguousarray(np.asarray(img.convert("RGB"), np.uint8))
        bitmap = mtmd.mtmd_bitmap_init(img.size[0], img.size[1], rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        chunks = mtmd.mtmd_input_chunks_init()
        inp = mtmd.mtmd_input_text(text, len(text), True, True)
        if mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (ctypes.c_void_p * 1)(bitmap), 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        return chunks, bitmap

    half = " ".join(f"t{i}" for i in range(args.text_len // 2)).encode()
    encode, ttft = [], []
    n_tokens = 0
    for r in range(args.repeats):
        chunks, bitmap = chunks_of(test_image(args.image, 100 + r), marker)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(c) != 0:      # the image chunk
                t0 = time.perf_counter()
                if mtmd.mtmd_encode_chunk(ctx, c) != 0:
                    raise RuntimeError("mtmd_encode_chunk failed")
                encode.append(time.perf_counter() - t0)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    for r in range(args.repeats):
        img = test_image(args.image, 200 + r)
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        t0 = time.perf_counter()
        chunks, bitmap = chunks_of(img, half + marker + half)
        n_past = ctypes.c_int(0)
        if mtmd.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, 2048, True, ctypes.byref(n_past)) != 0:
            raise RuntimeError("mtmd_helper_eval_chunks failed")
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        int(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).argmax())
        ttft.append(time.perf_counter() - t0)
        n_tokens = n_past.value
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(ctx)
    return {"encode_s": min(encode), "ttft_s": min(ttft), "prompt_tokens": n_tokens}


RUNNERS = {"lite": run_lite, "transformers": run_transformers, "llama.cpp": run_llamacpp}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="lite-llm's and transformers' compute type (the GGUF pair stores F16)")
    ap.add_argument("--image", type=int, default=448, help="side of the square test image, pixels")
    ap.add_argument("--text-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "lite_llm_bench_llava"))
    ap.add_argument("--engine", choices=["all", *RUNNERS], default="all")


def run(args: argparse.Namespace) -> int:
    files = build(args.shape, args.root)
    if args.engine != "all":
        return print_result(RUNNERS[args.engine](files, args))
    results = run_engines("lite_llm.bench.llava", list(RUNNERS), args, dict(os.environ))
    if "lite" not in results:
        return 1
    lite = results["lite"]
    print_table(f"LLaVA-1.5 {args.shape} shape (random weights; lite-llm / llama.cpp on the F16 GGUF + mmproj pair, "
                f"transformers on the same weights in {args.dtype}), {args.image}x{args.image} image "
                f"({lite['image_tokens']} image tokens, {lite['prompt_tokens']}-token prompt), {args.threads} threads",
                results, [e for e in RUNNERS if e != "lite" and e in results])
    return 0


def main(argv: list[str] | None = None) -> int:
    return program_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
