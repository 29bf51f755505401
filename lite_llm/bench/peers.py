"""The same benchmark workload on other engines, for ratios in the same run: llama.cpp
(through llama-cpp-python), Hugging Face transformers (PyTorch, bf16), and ik_llama.cpp through
a llama-bench binary the user built (`--peers ik_llama.cpp=PATH`).

Runs as a child process (`python -m lite_llm.bench.peers SPEC.json RESULT.json`, started by
common.run_peer) so the peers' OpenMP pools, allocations and imports never touch the lite_llm
process being measured. Optional extras (`pip install lite-llm[bench]`); imported only here.

Fair comparison means the same weights: llama.cpp runs the same GGUF file lite_llm runs (a
quantized file stays quantized in both engines); with --peer-weights bf16 it gets a BF16
GGUF written once from the source instead (every metadata field and tokenizer field copied,
each quantized tensor dequantized to float32 then rounded to BF16, F32 tensors kept;
llama.cpp's own tensor layout untouched), cached under ~/.cache/lite_llm/: the comparison
for lite_llm running such a file dequantized. transformers loads an HF directory as it is
and a GGUF source through that BF16 copy (a quantized GGUF may stay packed in transformers
and be unpacked in every forward), in bf16. Both use our thread count.

Timing, per batch of prompts (all starting together, greedy, exactly output_len tokens):
- llama.cpp: prefill = llama_decode over the prompt tokens of every sequence, packed into
  llama_batch'es of n_batch tokens (several seq_ids per batch when there are several
  sequences), logits of each sequence's last token only; decode = one llama_batch per step
  holding one token of every sequence; greedy argmax in NumPy.
- transformers: prefill = one forward over the prompts (last-position logits only); decode
  = model.generate(max_new_tokens=min_new_tokens=output_len), timed token by token with a
  streamer from its first new token to its last.
- ik_llama.cpp (its llama-bench, on the same GGUF file, one sequence): `-p N -n 0 -gp N,M
  -rtr 1`: prefill = its pp N test (N prompt tokens in ubatches), decode = its tg M@pp N test
  (M one-token steps after an N-token prompt); as many repetitions as our measured iterations,
  after its own warm-up; the prompt tokens are its own (llama-bench's), not ours.
Deliberately not here: sampling other than greedy, speculative decoding, GPU.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from typing import Any

import numpy as np

from lite_llm.bench.common import (CACHE_DIR, BatchFigures, RequestTiming, batch_figures, copy_gguf_keys, describe,
                                   median_figures, peak_rss_bytes, progress)

LLAMA_CPP_N_BATCH = 512


# ---- the BF16 GGUF for llama.cpp --------------------------------------------------------------


_KEY_HEAD = 4 << 20        # the GGUF header (metadata, tensor table) and the first weights
_KEY_SAMPLES, _KEY_SAMPLE = 16, 64 << 10


def content_key(path: str) -> str:
    """A key of a large file's content, not of where it lies: its size, its first 4 MiB and 16
    slices of 64 KiB spread over the rest (a copy of the same file elsewhere, e.g. the default
    model in another venv, has the same key; a re-quantized or edited file another)."""
    size = os.path.getsize(path)
    h = hashlib.sha1(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_KEY_HEAD))
        if size > _KEY_HEAD:
            for i in range(_KEY_SAMPLES):
                f.seek(_KEY_HEAD + (size - _KEY_HEAD) * i // _KEY_SAMPLES)
                h.update(f.read(_KEY_SAMPLE))
    return h.hexdigest()[:12]


def bf16_gguf_path(source: str, cache_dir: str = CACHE_DIR) -> str:
    """The BF16 copy of GGUF `source`, written on first use; keyed by the source's content
    (content_key), so the same file at another path reuses the copy and a changed one gets its own."""
    key = content_key(source)
    stem = os.path.splitext(os.path.basename(source))[0]
    dest = os.path.join(cache_dir, "peers", f"{stem}.{key}.BF16.gguf")
    if not os.path.exists(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        progress(f"writing a BF16 GGUF with the dequantized weights of {source} -> {dest}")
        tmp = f"{dest}.{os.getpid()}.tmp"
        try:
            write_bf16_gguf(source, tmp)
            os.replace(tmp, dest)        # atomic: a concurrent reader never sees half a file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return dest


def write_bf16_gguf(source: str, dest: str) -> None:
    """Copy GGUF `source` to `dest` changing only tensor types: F32 tensors stay F32, every
    other tensor is dequantized (gguf.quants.dequantize) and stored as BF16."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dest, arch)
    copy_gguf_keys(reader, writer, gguf.LlamaFileType.MOSTLY_BF16)
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(t.name, np.asarray(t.data))
            continue
        f32 = gguf.quants.dequantize(t.data, t.tensor_type)           # [rows, cols] float32
        writer.add_tensor(t.name, gguf.quants.quantize(f32, gguf.GGMLQuantizationType.BF16),
                          raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---- llama.cpp -------------------------------------------------------------------------------


class LlamaCppPeer:
    """One llama.cpp model + context for num_seqs sequences of at most seq_len tokens each.
    The KV cache is split per sequence (kv_unified=False): in a unified cache every
    sequence's attention spans every cell in use, masked, which made 64 sequences x 256
    tokens five times slower than 32 x 192 here."""

    name = "llama.cpp"

    def __init__(self, gguf_path: str, num_threads: int, num_seqs: int, seq_len: int):
        import llama_cpp as L
        import llama_cpp._logger as llama_logger

        llama_logger.set_verbose(False)
        self.L = L
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(gguf_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = num_seqs * -(-max(seq_len, 256) // 256) * 256
        cparams.n_batch = LLAMA_CPP_N_BATCH
        cparams.n_ubatch = LLAMA_CPP_N_BATCH
        cparams.n_seq_max = num_seqs
        cparams.n_threads = num_threads
        cparams.n_threads_batch = num_threads
        cparams.kv_unified = False
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {cparams.n_ctx} tokens "
                               f"for {num_seqs} sequences")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(LLAMA_CPP_N_BATCH, 0, 1)
        self.version = L.__version__
        self.generated: list[list[int]] = []     # tokens of the latest run, per sequence
        self.config = {"n_ctx": cparams.n_ctx, "n_batch": LLAMA_CPP_N_BATCH, "n_seq_max": num_seqs,
                       "n_threads": num_threads, "kv_unified": False}

    def close(self) -> None:
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, seq_id, wants_logits) items."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(items)
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(items)} tokens")

    def _argmax(self, index: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, index)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def run(self, prompts: list[list[int]], output_len: int) -> list[RequestTiming]:
        """All prompts as sequences 0..N-1 from an empty cache; greedy, output_len tokens each."""
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        n = len(prompts)
        self.generated = [[] for _ in range(n)]
        first = [0.0] * n
        last = [0.0] * n
        next_tok = [0] * n
        start = time.monotonic()
        # prefill: prompt tokens of every sequence packed into n_batch-token batches
        items: list[tuple[int, int, int, bool]] = []
        owners: list[int] = []            # sequences whose last prompt token is in `items`
        for seq, ids in enumerate(prompts):
            for pos, tok in enumerate(ids):
                is_last = pos == len(ids) - 1
                items.append((tok, pos, seq, is_last))
                if is_last:
                    owners.append(seq)
                if len(items) == LLAMA_CPP_N_BATCH:
                    self._flush_prefill(items, owners, next_tok, first, last)
                    items, owners = [], []
        if items:
            self._flush_prefill(items, owners, next_tok, first, last)
        # decode: one token of every sequence per step
        for step in range(output_len - 1):
            for lo in range(0, n, LLAMA_CPP_N_BATCH):
                seqs = range(lo, min(n, lo + LLAMA_CPP_N_BATCH))
                self._decode([(next_tok[seq], len(prompts[seq]) + step, seq, True) for seq in seqs])
                for row, seq in enumerate(seqs):
                    next_tok[seq] = self._argmax(row)
                    self.generated[seq].append(next_tok[seq])
            now = time.monotonic()
            last = [now] * n
        return [RequestTiming(start, first[s], last[s], len(prompts[s]), output_len, 0) for s in range(n)]

    def _flush_prefill(self, items, owners, next_tok, first, last) -> None:
        self._decode(items)
        rows = [i for i, item in enumerate(items) if item[3]]
        for seq, row in zip(owners, rows):
            next_tok[seq] = self._argmax(row)
            self.generated[seq].append(next_tok[seq])
        now = time.monotonic()
        for seq in owners:
            first[seq] = last[seq] = now


# ---- transformers ----------------------------------------------------------------------------


class TransformersPeer:
    """An AutoModelForCausalLM in bf16 from the same source (a GGUF file or HF directory)."""

    name = "transformers"

    def __init__(self, model_path: str, num_threads: int):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(num_threads)
        self.torch = torch
        if os.path.isfile(model_path):
            self.model = AutoModelForCausalLM.from_pretrained(
                os.path.dirname(os.path.abspath(model_path)), gguf_file=os.path.basename(model_path),
                dtype=torch.bfloat16)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
        self.model.eval()
        with torch.no_grad():
            # fresh, owned tensors: weights loaded from a GGUF stay on the loader's buffers,
            # which made every forward several times slower here (prefill 80 vs 880 tok/s)
            for param in self.model.parameters():     # tied weights are one Parameter: copied once
                param.data = param.data.contiguous().clone()
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.config = {"dtype": "bfloat16", "num_threads": torch.get_num_threads()}
        self.generated: list[list[int]] = []     # tokens of the latest run, per sequence

    def close(self) -> None:
        del self.model

    def run(self, prompts: list[list[int]], output_len: int) -> list[RequestTiming]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)     # [N, width], left-padded
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        with torch.inference_mode():
            start = time.monotonic()
            self.model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
            prefill = time.monotonic() - start
            streamer = _TimingStreamer()
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=output_len,
                                min_new_tokens=output_len, do_sample=False, streamer=streamer,
                                pad_token_id=0)
        self.generated = out[:, width:].tolist()
        times = streamer.times[1:]        # the first put() is the prompt
        decode = times[-1] - times[0] if len(times) > 1 else 0.0
        first, end = start + prefill, start + prefill + decode
        return [RequestTiming(start, first, end, len(p), len(times), 0) for p in prompts]


class _TimingStreamer:
    """transformers streamer protocol: put() per new token batch (the prompt first), end()."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.monotonic())

    def end(self) -> None:
        pass


# ---- the child process -----------------------------------------------------------------------


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: peer, model_path, num_threads, output_len, probe (optional prompts run first for one
    token: start to first token), warmup (how many leading batches are
    warm-up), batches (list of lists of prompt token ids), peer_weights ("same": llama.cpp runs
    model_path itself; "bf16": a BF16 copy of its dequantized weights). Returns figures per measured batch,
    their medians, load time, first-token time after load, peak RSS and notes."""
    peer_name, batches, output_len = spec["peer"], spec["batches"], spec["output_len"]
    warmup = spec.get("warmup", 0)
    notes: list[str] = []
    t0 = time.monotonic()
    if peer_name == "llama.cpp":
        source = spec["model_path"]
        if not source.endswith(".gguf"):
            raise RuntimeError("the llama.cpp peer needs a GGUF model (llama.cpp reads no HF directories)")
        if spec.get("peer_weights", "same") == "bf16":
            weights = bf16_gguf_path(source, spec.get("cache_dir") or CACHE_DIR)
            notes.append(f"BF16 GGUF {weights}")
        else:
            weights = source
            notes.append(f"the same file {weights}")
        num_seqs = max(len(b) for b in batches)
        seq_len = max(len(p) for b in batches for p in b) + output_len
        t0 = time.monotonic()
        peer = LlamaCppPeer(weights, spec["num_threads"], num_seqs, seq_len)
        if num_seqs > 1:
            notes.append("multi-sequence batching: one llama_batch per step with every sequence's token")
    elif peer_name == "ik_llama.cpp":
        return run_llama_bench(spec)
    elif peer_name == "transformers":
        source = spec["model_path"]
        if source.endswith(".gguf"):
            # transformers may keep a quantized GGUF packed and unpack it in every forward;
            # the BF16 copy loads as the same dense bf16 weights the other engines use
            source = bf16_gguf_path(source, spec.get("cache_dir") or CACHE_DIR)
            notes.append(f"BF16 GGUF {source}")
        t0 = time.monotonic()
        peer = TransformersPeer(source, spec["num_threads"])
    else:
        raise RuntimeError(f"unknown peer {peer_name!r}")
    load_seconds = time.monotonic() - t0
    runs = []
    first_token_after_load = None
    try:
        if spec.get("probe"):            # the start-up probe: a short first request, one token
            timings = peer.run(spec["probe"], 1)
            first_token_after_load = max(t.first_token for t in timings) - t0
        for i, prompts in enumerate(batches):
            label = "warm-up" if i < warmup else f"iteration {i - warmup + 1}/{len(batches) - warmup}"
            progress(f"[{peer_name}] {label}: {len(prompts)} x {len(prompts[0])} tokens -> {output_len}")
            timings = peer.run(prompts, output_len)
            if first_token_after_load is None:
                first_token_after_load = max(t.first_token for t in timings) - t0
            figures = batch_figures(timings)
            progress(f"[{peer_name}] {label}: {describe(figures)}")
            if i >= warmup:
                runs.append(asdict(figures))
    finally:
        peer.close()
    return {"peer": peer_name, "version": peer.version, "config": peer.config, "load_seconds": load_seconds,
            "start_to_first_token_seconds": first_token_after_load, "runs": runs,
            "median": median_figures(runs) if runs else {}, "peak_rss_bytes": peak_rss_bytes(),
            "notes": notes}


def llama_bench_command(spec: dict[str, Any]) -> list[str]:
    """ik_llama.cpp's llama-bench on spec's file and shape: prefill and decode-after-the-prompt."""
    batches, warmup = spec["batches"], spec.get("warmup", 0)
    if any(len(b) != 1 for b in batches):
        raise RuntimeError("llama-bench times one sequence: run the ik_llama.cpp peer with --batch-size 1")
    if not spec["model_path"].endswith(".gguf"):
        raise RuntimeError("the ik_llama.cpp peer needs a GGUF model")
    input_len, output_len = len(batches[0][0]), spec["output_len"]
    reps = max(1, len(batches) - warmup)
    return [spec["peer_program"], "-m", spec["model_path"], "-p", str(input_len), "-n", "0",
            "-gp", f"{input_len},{output_len}", "-t", str(spec["num_threads"]), "-r", str(reps),
            "-rtr", "1", "-o", "json"]


def llama_bench_figures(records: list[dict[str, Any]], input_len: int, output_len: int) -> list[dict[str, float]]:
    """One BatchFigures dict per repetition from llama-bench's JSON records: its pp{N} test's
    samples for the prefill, its tg{M}@pp{N} test's for the decode."""
    by_test = {r.get("test"): r for r in records}
    pp, tg = by_test.get(f"pp{input_len}"), by_test.get(f"tg{output_len}@pp{input_len}")
    if pp is None or tg is None:
        raise RuntimeError(f"llama-bench gave no pp{input_len} and tg{output_len}@pp{input_len} results "
                           f"(got {sorted(str(k) for k in by_test)})")
    runs = []
    for prefill, decode in zip(pp["samples_ts"], tg["samples_ts"]):
        ttft = input_len / prefill
        e2e = ttft + output_len / decode
        runs.append(asdict(BatchFigures(
            ttft=ttft, prefill_tok_s=prefill, decode_tok_s=decode, tpot=1.0 / decode, e2e=e2e,
            output_tok_s=output_len / e2e, total_tok_s=(input_len + output_len) / e2e, requests_per_s=1.0 / e2e,
            num_prompt_tokens=input_len, num_output_tokens=output_len)))
    return runs


def run_llama_bench(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = llama_bench_command(spec)
    input_len, output_len = len(spec["batches"][0][0]), spec["output_len"]
    progress(f"[ik_llama.cpp] {' '.join(cmd)}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=dict(os.environ))   # its log: our stderr
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with status {proc.returncode} (its log is above)")
    records = json.loads(out)
    runs = llama_bench_figures(records, input_len, output_len)
    for i, r in enumerate(runs):
        progress(f"[ik_llama.cpp] repetition {i + 1}/{len(runs)}: {describe(r)}")
    first = records[0] if records else {}
    return {"peer": "ik_llama.cpp", "version": f"build {first.get('build_commit')} ({first.get('build_number')})",
            "config": {"command": cmd, "n_batch": first.get("n_batch"), "n_ubatch": first.get("n_ubatch"),
                       "flash_attn": first.get("flash_attn"), "repack": first.get("repack")},
            "load_seconds": None, "start_to_first_token_seconds": None, "runs": runs,
            "median": median_figures(runs), "peak_rss_bytes": usage.ru_maxrss * 1024,
            "wall_seconds": time.monotonic() - t0,
            "notes": [f"ik_llama.cpp's llama-bench on the same file: pp{input_len} and tg{output_len}@pp{input_len} "
                      f"with run-time repacking (-rtr 1), {len(runs)} repetitions after its warm-up; "
                      "peak RSS of the llama-bench process"]}


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = (sys.argv[1:] if argv is None else argv)[:2]
    with open(spec_path) as fh:
        spec = json.load(fh)
    try:
        result = run_spec(spec)
    except ImportError as e:
        extra = {"llama.cpp": "llama-cpp-python", "transformers": "transformers torch"}.get(spec["peer"], "")
        result = {"peer": spec["peer"], "error": f"{e}; install the peers with `pip install lite-llm[bench]` "
                                                 f"(or `pip install {extra}`)"}
    except Exception as e:  # noqa: BLE001 - reported in the parent's table, the run goes on
        traceback.print_exc()
        result = {"peer": spec["peer"], "error": f"{type(e).__name__}: {e}"}
    with open(out_path, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
