"""`python -m lite_llm.bench.vision`: image encode time, time to first token of a one-image
chat and (--decode-tokens) decode speed on a random-weight Qwen2.5-VL, against transformers on
the same checkpoint and image and (--peers llama.cpp) llama.cpp on the same weights written as a
GGUF + mmproj pair (bench.qwen2_5_vl_gguf; clip.cpp's qwen2.5vl_merger layout; --gguf-type bf16,
the checkpoint's own bits, or f16).

    --shape 3b     Qwen2.5-VL-3B's shape (text: width 2048, 36 layers, 16 q / 2 kv heads, vocab
                   151936, tied embeddings; vision: width 1280, 32 blocks, 16 heads), bf16
    --shape tiny   a tiny shape, to check the program runs

Each engine runs in its own process, one after the other (both at once would not fit a small
machine's memory), on the same --threads. Figures: encode = the vision tower alone on the
preprocessed image (best of --repeats; lite-llm: its engine thread's time in the tower while it
serves the TTFT requests, time_images; llama.cpp: mtmd_encode_chunk); TTFT = preprocessing +
encode + prefill + the first token of a prompt of the image and --text-len text tokens (best of
--repeats, each with a new image so no cache helps; llama.cpp takes the same token ids); decode =
seconds per greedy token after the first. Weights are random: speed does not depend on their
values. llama.cpp computes the image rows with F16 roundings of its own and a larger least image
(tests/multimodal/test_qwen2_5_vl_llamacpp.py); at 448x448 both take the image as it is.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from lite_llm.bench.qwen2_5_vl_gguf import write_pair

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
    seed), a fresh args.image-pixel image each), with args.decode_tokens (when set, > 1) the best
    seconds per token after the first of args.repeats more, and the best of their encodes: the time the
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
    result = {"encode_s": min(encode), "ttft_s": min(ttft), "prompt_tokens": len(out.prompt_token_ids)}
    decode_tokens = getattr(args, "decode_tokens", 0)
    if decode_tokens > 1:   # seconds per token after the first, from the engine's token times
        params = SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True)
        per_token = []
        for r in range(args.repeats):
            m = llm.generate({"prompt_token_ids": prompt_ids(args.text_len, r),
                              "multi_modal_data": {"image": test_image(args.image, 300 + r)}},
                             params, use_tqdm=False)[0].metrics
            per_token.append((m.last_token_time - m.first_token_time) / (decode_tokens - 1))
        result["decode_s"] = min(per_token)
    llm.shutdown()
    return result


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


class LlamaCppQwenVL:
    """llama.cpp through llama-cpp-python's low-level API and its mtmd library on a Qwen2.5-VL
    GGUF + mmproj pair (bench.qwen2_5_vl_gguf): the prompt goes in as token ids (the files'
    vocabulary is synthetic), the image through mtmd, which encodes it with clip.cpp and
    decodes its rows at their multimodal RoPE positions. flash_attn False runs the vision
    tower's and the language model's attention in F32 (the tests' comparison); the benchmark
    uses llama.cpp's default (auto: on for CPU)."""

    def __init__(self, lm: str, mmproj: str, threads: int, n_ctx: int = 4096, flash_attn: bool | None = None,
                 warmup: bool = True):
        import llama_cpp as L
        import llama_cpp._logger as llama_logger
        import llama_cpp.mtmd_cpp as mtmd
        llama_logger.set_verbose(False)
        self.L, self.mtmd = L, mtmd
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(lm.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {lm}")
        attn = {None: L.LLAMA_FLASH_ATTN_TYPE_AUTO, True: L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                False: L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        cparams = L.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = attn
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        self.n_ctx = n_ctx
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(n_ctx, 0, 1)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = threads
        params.print_timings = False
        params.warmup = warmup
        params.flash_attn_type = attn
        self.mctx = mtmd.mtmd_init_from_file(mmproj.encode(), self.model, params)
        if not self.mctx:
            raise RuntimeError(f"llama.cpp's mtmd cannot load {mmproj}")

    def close(self) -> None:
        self.mtmd.mtmd_free(self.mctx)
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)

    def _chunks(self, img):
        """mtmd's chunks of the marker alone with img: (chunks, the image chunk, bitmap, pixels)."""
        import ctypes

        import numpy as np
        mtmd = self.mtmd
        rgb = np.ascontiguousarray(np.asarray(img.convert("RGB"), np.uint8))
        bitmap = mtmd.mtmd_bitmap_init(img.size[0], img.size[1], rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        chunks = mtmd.mtmd_input_chunks_init()
        marker = mtmd.mtmd_default_marker()
        text = mtmd.mtmd_input_text(marker, len(marker), False, True)
        if mtmd.mtmd_tokenize(self.mctx, chunks, ctypes.byref(text), (ctypes.c_void_p * 1)(bitmap), 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        image = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))
                 if mtmd.mtmd_input_chunk_get_type(mtmd.mtmd_input_chunks_get(chunks, i)) != 0]
        return chunks, image[0], bitmap, rgb

    def _free(self, chunks, bitmap) -> None:
        self.mtmd.mtmd_input_chunks_free(chunks)
        self.mtmd.mtmd_bitmap_free(bitmap)

    def encode(self, img):
        """(seconds in mtmd_encode_chunk, the image's rows [N, E]) of one image."""
        import numpy as np
        chunks, chunk, bitmap, _ = self._chunks(img)
        try:
            t0 = time.perf_counter()
            if self.mtmd.mtmd_encode_chunk(self.mctx, chunk) != 0:
                raise RuntimeError("mtmd_encode_chunk failed")
            seconds = time.perf_counter() - t0
            n = self.mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            rows = np.ctypeslib.as_array(self.mtmd.mtmd_get_output_embd(self.mctx), shape=(n * self._n_embd(),))
            return seconds, rows.reshape(n, -1).copy()
        finally:
            self._free(chunks, bitmap)

    def _n_embd(self) -> int:
        return self.L.llama_model_n_embd(self.model)

    def _decode(self, ids: list[int], start: int, all_logits: bool) -> None:
        b = self.batch
        for i, tok in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = tok, start + i, 1, 0
            b.logits[i] = all_logits or i == len(ids) - 1
        b.n_tokens = len(ids)
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError(f"llama_decode failed for {len(ids)} tokens at position {start}")

    def _logits(self, i: int):
        import numpy as np
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()

    def prefill(self, before: list[int], img, after: list[int], all_logits: bool = False):
        """From an empty cache: the tokens `before` (ending in <|vision_start|>), the image's rows,
        the tokens `after` (from <|vision_end|>). Returns (the logits of `after`'s positions
        [len(after), V], or of its last [1, V]; the position after the prompt)."""
        import ctypes

        import numpy as np
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        chunks, chunk, bitmap, _ = self._chunks(img)
        try:
            self._decode(before, 0, False)
            n_past = self.L.llama_pos(0)
            if self.mtmd.mtmd_helper_eval_chunk_single(self.mctx, self.ctx, chunk, len(before), 0, self.n_ctx, False,
                                                       ctypes.byref(n_past)) != 0:
                raise RuntimeError("mtmd_helper_eval_chunk_single failed on the image")
            self._decode(after, n_past.value, all_logits)
        finally:
            self._free(chunks, bitmap)
        rows = range(len(after)) if all_logits else [len(after) - 1]
        return np.stack([self._logits(i) for i in rows]), n_past.value + len(after)

    def generate(self, before: list[int], img, after: list[int], max_tokens: int) -> tuple[float, float]:
        """Greedy: (seconds to the first token, seconds per later token)."""
        t0 = time.perf_counter()
        logits, pos = self.prefill(before, img, after)
        tok = int(logits[-1].argmax())
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        for step in range(max_tokens - 1):
            self._decode([tok], pos + step, False)
            tok = int(self._logits(0).argmax())
        return ttft, (time.perf_counter() - t1) / max(max_tokens - 1, 1)


def gguf_pair(path: str, kind: str) -> tuple[str, str]:
    """The GGUF + mmproj pair of the checkpoint at path, `kind` matrices (written once, beside it)."""
    return write_pair(path, path + "-gguf", kind=kind)


def run_llamacpp(path: str, args) -> dict:
    """llama.cpp on the checkpoint's GGUF pair (--gguf-type): encode = mtmd_encode_chunk of the image
    (best of --repeats); TTFT = the prompt's text, the image (encoded and decoded) and the first
    token from an empty cache; decode = seconds per generated token after it (--decode-tokens)."""
    lm, mm = gguf_pair(path, args.gguf_type)
    peer = LlamaCppQwenVL(lm, mm, args.threads)
    encode, ttft, decode = [], [], []
    for r in range(args.repeats + 1):       # the first of each warms up: not counted
        seconds, rows = peer.encode(test_image(args.image, 100 + r))
        if r:
            encode.append(seconds)
    for r in range(args.repeats + 1):
        ids = prompt_ids(args.text_len, r)
        at = ids.index(151655)
        first, per_token = peer.generate(ids[:at], test_image(args.image, 200 + r), ids[at + 1:], args.decode_tokens)
        if r:
            ttft.append(first)
            decode.append(per_token)
    peer.close()
    return {"encode_s": min(encode), "ttft_s": min(ttft), "decode_s": min(decode), "image_tokens": len(rows),
            "prompt_tokens": len(ids) - 1 + len(rows)}


RUNNERS = {"lite": run_lite, "transformers": run_transformers, "llama.cpp": run_llamacpp}


def print_result(figures: dict) -> int:
    """What one engine's child process (`--engine E`) prints for run_engines to read."""
    print("RESULT " + json.dumps(figures), flush=True)
    return 0


def run_engines(module: str, engines: list[str], args, env: dict) -> dict[str, dict]:
    """Each engine's figures, each engine in its own process one after the other (`python -m
    module --engine E` with args, printing a RESULT line: print_result) on args.threads threads; an engine
    that fails is reported on stderr and left out."""
    import importlib
    env = dict(env, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    own = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(own)
    options = [a for k in vars(own.parse_args([])) if k != "engine"          # the module's own options alone
               for a in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]   # (not the CLI's command names)
    results = {}
    for engine in engines:
        cmd = [sys.executable, "-m", module, "--engine", engine, *options]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            print(f"{engine}: failed\n", out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            continue
        results[engine] = json.loads(line[-1][len("RESULT "):])
    return results


def print_table(title: str, results: dict[str, dict], peers: list[str]) -> None:
    """title with the load average, then lite-llm's encode / TTFT / decode figures beside each
    peer's, with the peer / lite-llm ratio."""
    print(f"{title}, load {open('/proc/loadavg').read().split()[0:3]}")
    lite = results["lite"]
    print(f"{'':16}{'lite-llm':>12}" + "".join(f"{e:>14}{'ratio':>8}" for e in peers))
    for key, name in (("encode_s", "encode (s)"), ("ttft_s", "TTFT (s)"), ("decode_s", "decode (s/tok)")):
        if key not in lite:
            continue
        row = f"{name:16}{lite[key]:12.3f}"
        for e in peers:
            row += (f"{results[e][key]:14.3f}{results[e][key] / lite[key]:7.2f}x" if key in results[e]
                    else f"{'-':>14}{'':8}")
        print(row)


def program_main(program, argv: list[str] | None) -> int:
    """main() of an image bench module (this one, bench.llava): its docstring as --help, its
    add_arguments and run; the same command line its engines' child processes get."""
    ap = argparse.ArgumentParser(description=program.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    program.add_arguments(ap)
    return program.run(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--image", type=int, default=448, help="side of the square test image, pixels")
    ap.add_argument("--text-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=0,
                    help="also time greedy decoding of this many tokens (lite-llm and llama.cpp; 0: not)")
    ap.add_argument("--peers", default="transformers",
                    help="comma-separated engines to run beside lite-llm: transformers, llama.cpp "
                         "(on a GGUF + mmproj pair written from the same checkpoint)")
    ap.add_argument("--gguf-type", choices=["f16", "bf16"], default="bf16",
                    help="llama.cpp's weights: bf16 (the checkpoint's own bits, as lite-llm and transformers "
                         "run them) or f16 (llama.cpp's converters' default)")
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "lite_llm_bench_vision"))
    ap.add_argument("--engine", choices=["all", *RUNNERS], default="all")


def run(args: argparse.Namespace) -> int:
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in RUNNERS or p == "lite"]
    if unknown:
        print(f"--peers: unknown engine(s) {unknown}; choose from transformers, llama.cpp", file=sys.stderr)
        return 2
    path = build_checkpoint(args.shape, args.root)
    if args.engine != "all":
        return print_result(RUNNERS[args.engine](path, args))
    if "llama.cpp" in peers:
        gguf_pair(path, args.gguf_type)         # written before any engine is timed
    env = dict(os.environ, LITE_LLM_CPU_OMP_THREADS_BIND=os.environ.get("LITE_LLM_CPU_OMP_THREADS_BIND", "auto"))
    results = run_engines("lite_llm.bench.vision", ["lite", *peers], args, env)
    if "lite" not in results:
        return 1
    lite = results["lite"]
    peers = [e for e in peers if e in results]
    print_table(f"Qwen2.5-VL {args.shape} shape (random weights; lite-llm and transformers in {args.dtype}"
                + (f", llama.cpp on the {args.gguf_type.upper()} GGUF + mmproj pair" if "llama.cpp" in peers else "")
                + f"), {args.image}x{args.image} image ({lite['image_tokens']} image tokens, "
                f"{lite['prompt_tokens']}-token prompt), {args.threads} threads", results, peers)
    return 0


def main(argv: list[str] | None = None) -> int:
    return program_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
