"""`python -m lite_llm.bench.vision`: image encode time and time to first token of a one-image
chat on a random-weight Qwen2.5-VL, against transformers on the same checkpoint and image.

    --shape 3b     Qwen2.5-VL-3B's shape (text: width 2048, 36 layers, 16 q / 2 kv heads, vocab
                   151936, tied embeddings; vision: width 1280, 32 blocks, 16 heads), bf16
    --shape tiny   a tiny shape, to check the program runs

Each engine runs in its own process, one after the other (both at once would not fit a small
machine's memory), on the same --threads. Figures: encode = the vision tower alone on the
preprocessed image (best of --repeats; lite-llm: its engine thread's time in the tower while it
serves the TTFT requests, time_images); TTFT = preprocessing + encode + prefill + the first
token of a prompt of the image and --text-len text tokens (best of --repeats, each with a new
image so no cache helps). Weights are random: speed does not depend on their values.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = {
    "3b": dict(text_config=dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                                rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=151643, eos_token_id=151645,
                                rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}),
               vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                                  fullatt_block_indexes=[7, 15, 23, 31]),
               image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
               vision_end_token_id=151653, tie_word_embeddings=True),
    "tiny": dict(text_config=dict(vocab_size=152000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                  rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                 vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                                    fullatt_block_indexes=[1]),
                 image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                 vision_end_token_id=151653, tie_word_embeddings=True),
}


def build_checkpoint(shape: str, root: str) -> str:
    """A random-weight checkpoint of `shape` in bf16 under root (reused when present)."""
    path = os.path.join(root, f"qwen2_5_vl-{shape}-random")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)     # built in bf16: an fp32 3B model would need 15 GB
    try:
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**json.loads(json.dumps(SHAPES[shape])))).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    return path


def prompt_ids(text_len: int, seed: int) -> list[int]:
    """<|im_start|>user\\n <vision_start><image_pad><vision_end> text... <|im_end|>\\n<|im_start|>assistant\\n"""
    import random
    rng = random.Random(seed)
    text = [rng.randrange(1000, 100000) for _ in range(text_len)]
    return [151644, 872, 198, 151652, 151655, 151653] + text + [151645, 198, 151644, 77091, 198]


def test_image(size: int, seed: int):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")


def time_images(llm, args, prompt_ids) -> dict:
    """The best time to first token of args.repeats one-image requests (prompt_ids(args.text_len,
    seed), a fresh args.image-pixel image each) and the best of their encodes: the time the
    engine thread spent in the vision tower during each (VisionRunner.encode_seconds). A tower
    call timed from this thread would run a second OpenMP pool beside the engine thread's, and
    libgomp, counting more threads than CPUs, then sleeps at every barrier instead of spinning
    (lite_llm/llm.py): not what serving runs. Shuts llm down."""
    from lite_llm import SamplingParams
    vision = llm._engine.engine.runner.vision
    encode, ttft = [], []
    params = SamplingParams(temperature=0, max_tokens=1)
    for r in range(args.repeats + 1):       # the first request warms up: not counted
        img = test_image(args.image, 200 + r)
        before = vision.encode_seconds
        t0 = time.perf_counter()
        out = llm.generate({"prompt_token_ids": prompt_ids(args.text_len, r), "multi_modal_data": {"image": img}},
                           params, use_tqdm=False)[0]
        if r:
            ttft.append(time.perf_counter() - t0)
            encode.append(vision.encode_seconds - before)
    llm.shutdown()
    return {"encode_s": min(encode), "ttft_s": min(ttft), "prompt_tokens": len(out.prompt_token_ids)}


def run_lite(path: str, args) -> dict:
    from lite_llm import LLM
    from lite_llm.multimodal import qwen2_5_vl
    llm = LLM(path, dtype=args.dtype, skip_tokenizer_init=True, max_model_len=4096, max_num_batched_tokens=4096,
              kv_cache_space=1, enable_prefix_caching=False)
    grid = qwen2_5_vl.preprocess(test_image(args.image, 0), llm._engine.engine.runner.vision.vision)[1]
    out = time_images(llm, args, prompt_ids)
    return {**out, "image_tokens": grid[1] * grid[2] // 4}


def run_transformers(path: str, args) -> dict:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    torch.set_num_threads(args.threads)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()
    proc = Qwen2VLImageProcessorPil()
    encode, ttft = [], []
    with torch.inference_mode():
        for r in range(args.repeats):
            inputs = proc(images=[test_image(args.image, 100 + r)], return_tensors="pt")
            t0 = time.perf_counter()
            model.model.visual(inputs["pixel_values"].to(dtype), grid_thw=inputs["image_grid_thw"])
            encode.append(time.perf_counter() - t0)
        for r in range(args.repeats):
            img = test_image(args.image, 200 + r)
            t0 = time.perf_counter()
            inputs = proc(images=[img], return_tensors="pt")
            ids = prompt_ids(args.text_len, r)
            n = int(inputs["image_grid_thw"][0].prod()) // 4
            at = ids.index(151655)
            ids = ids[:at] + [151655] * n + ids[at + 1:]
            t = torch.tensor([ids])
            logits = model(input_ids=t, pixel_values=inputs["pixel_values"].to(dtype),
                           image_grid_thw=inputs["image_grid_thw"], mm_token_type_ids=(t == 151655).int(),
                           logits_to_keep=1).logits
            int(logits[0, -1].argmax())
            ttft.append(time.perf_counter() - t0)
    return {"encode_s": min(encode), "ttft_s": min(ttft), "prompt_tokens": len(ids)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--image", type=int, default=448, help="side of the square test image, pixels")
    ap.add_argument("--text-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "lite_llm_bench_vision"))
    ap.add_argument("--engine", choices=["both", "lite", "transformers"], default="both")
    args = ap.parse_args(argv)
    if args.engine != "both":
        path = build_checkpoint(args.shape, args.root)
        result = (run_lite if args.engine == "lite" else run_transformers)(path, args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    path = build_checkpoint(args.shape, args.root)
    results = {}
    env = dict(os.environ, LITE_LLM_CPU_OMP_THREADS_BIND=os.environ.get("LITE_LLM_CPU_OMP_THREADS_BIND", "auto"),
               OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    for engine in ("lite", "transformers"):
        cmd = [sys.executable, "-m", "lite_llm.bench.vision", "--engine", engine, *[
            a for k, v in vars(args).items() if k != "engine" for a in (f"--{k.replace('_', '-')}", str(v))]]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            return 1
        results[engine] = json.loads(line[-1][len("RESULT "):])
    lite, hf = results["lite"], results["transformers"]
    print(f"Qwen2.5-VL {args.shape} shape (random weights, {args.dtype}), {args.image}x{args.image} image "
          f"({lite['image_tokens']} image tokens, {lite['prompt_tokens']}-token prompt), {args.threads} threads, "
          f"load {open('/proc/loadavg').read().split()[0:3]}")
    print(f"{'':14}{'lite-llm':>12}{'transformers':>14}{'ratio':>8}")
    for key, name in (("encode_s", "encode (s)"), ("ttft_s", "TTFT (s)")):
        print(f"{name:14}{lite[key]:12.2f}{hf[key]:14.2f}{hf[key] / lite[key]:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
