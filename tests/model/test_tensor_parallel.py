"""Tensor parallel over 2 ranks (bind 0|1: one core each) against one rank, on the tiny random
checkpoints of the parity tests: GQA, MQA (its one KV head replicated on both ranks), qkv bias,
q/k norm, OPT (biases, LayerNorm, no gate). fp32: the same logits up to summation order and the
same greedy tokens; bf16: within the parity tests' tolerance of transformers. Also: each
rank's threads run on its own CPU, a killed rank is an error naming it (no hang), and the
shared-memory all-reduce on its own."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import tiny_checkpoint_path, wait_until_serving
from lite_llm import LLM, SamplingParams, _kernels, cpu
from lite_llm.engine import tp
from lite_llm.engine.runner import ModelRunner
from lite_llm.model.loader import load_model
from model.test_parity import BLOCK, hf_logits, lite_logits, make_runner, prompts_for

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                                reason="tensor parallel tests bind rank 0 to CPU 0 and rank 1 to CPU 1")

CASES = [("llama", {}),                             # GQA: 4 heads, 2 KV heads -> 2 + 1 per rank
         ("llama", {"num_key_value_heads": 1}),     # MQA: the KV head replicated
         ("qwen2", {}),                             # qkv bias
         ("qwen3", {"head_dim": 32}),               # q/k norm
         ("opt", {})]                               # o / fc2 biases once, LayerNorm, ReLU MLP
IDS = ["gqa", "mqa", "qkv_bias", "qk_norm", "opt"]


def tp_runner(path, dtype="float32", num_blocks=64, max_tokens=256, quantization=None, mmproj=None):
    """Rank 0's runner of a 2-rank group bound by "0|1" (the worker on CPU 1), and its group."""
    loaded = load_model(str(path), dtype=dtype, progress=False, mmproj=mmproj)
    plan = cpu.plan_threads(cpu.read_topology(), bind="0|1")
    group = tp.start_group(loaded, plan, num_blocks=num_blocks, block_size=BLOCK, quantization=quantization,
                           max_num_batched_tokens=max_tokens, max_num_seqs=max_tokens)
    try:
        runner = ModelRunner(loaded, num_blocks=num_blocks, block_size=BLOCK, max_num_batched_tokens=max_tokens,
                             max_num_seqs=max_tokens, num_threads=1, shard=tp.RankShard(loaded.config, 0, 2), tp_group=group,
                             quantization=quantization)
        group.wait_ready()
    except BaseException:
        group.close()
        raise
    return runner, group


def two_ranks_match_one(path, chunks=(None, 1)):
    """fp32 logits of two ranks equal one rank's up to summation order: a mixed batch in one
    shot, then (chunk 1) token by token through the paged cache (decode). Returns the config."""
    one, loaded = make_runner(path)
    two, group = tp_runner(path)
    try:
        prompts = prompts_for(loaded.config.vocab_size)
        for chunk in chunks:
            for a, b in zip(lite_logits(one, prompts, chunk), lite_logits(two, prompts, chunk)):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    finally:
        group.close()
    return loaded.config


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fp32_two_ranks_give_one_ranks_logits(case):
    two_ranks_match_one(tiny_checkpoint_path(case[0], **case[1]))


@pytest.mark.parametrize("case", [("llama", {"tie_word_embeddings": True}), ("gemma2", {})], ids=["tied", "softcap"])
def test_vocabulary_parallel_lm_head_of_a_tied_embedding_and_a_softcap(case):
    """The LM head's rows cut from a tied embedding on each rank (the whole table kept for the
    tokens' rows); Gemma 2's final soft-cap applied to each rank's own columns."""
    assert two_ranks_match_one(tiny_checkpoint_path(case[0], **case[1]), chunks=(None,)).tie_word_embeddings


def test_fp32_two_ranks_of_a_gguf_file_give_one_ranks_logits(tmp_path):
    """A llama.cpp-style GGUF (q/k rows in llama.cpp's order, undone when read): the shards are
    cut from the rows as the model uses them."""
    from conftest import gguf_from_hf
    two_ranks_match_one(gguf_from_hf(tiny_checkpoint_path("llama"), tmp_path / "tiny.gguf", "llama"), chunks=(None,))


@pytest.mark.peers
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0", "Q4_K_M"])
def test_a_quantized_file_runs_as_stored_on_two_ranks(ftype, tmp_path):
    """A llama.cpp-quantized file: each rank packs its rows (qkv, gate/up) and its whole
    blocks of each row (o, down) as stored. Where a rank's column range is not whole blocks
    (o: 128 columns a rank, Q4_K's 256-value blocks) that weight is read dequantized and runs
    in the engine dtype. Blocks kept: one rank's logits up to summation order. A weight
    dequantized skips the int8 activation blocks: within the quantized-file tolerance of the
    dequantized reference (test_quantized)."""
    from conftest import gguf_from_hf
    from model.test_quantized import SHAPE, _reference_logits, quantize_with_llama_cpp
    f32 = gguf_from_hf(tiny_checkpoint_path("llama", **SHAPE, std=0.08), tmp_path / "f32.gguf", "llama")
    path = quantize_with_llama_cpp(f32, tmp_path / f"{ftype}.gguf", ftype)
    one, loaded = make_runner(path)
    two, group = tp_runner(path)
    try:
        stored = {"Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_K_M": "Q4_K"}[ftype]
        assert stored in two.formats["layers.0.qkv"][0] and stored in two.formats["layers.0.down"][0]
        assert two.formats["layers.0.o"][0] == (("float32",) if ftype == "Q4_K_M" else (stored,))
        prompts = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300, 12, 9, 77], [8, 1, 99]]
        for chunk in (None, 1):
            got, want = lite_logits(two, prompts, chunk), lite_logits(one, prompts, chunk)
            for g, w, p in zip(got, want, prompts):
                if ftype != "Q4_K_M":
                    _close_up_to_int8_flips(g, w)
                    continue
                ref = _reference_logits(path, p)
                err = np.abs(g - ref) / (ref.max(-1, keepdims=True) - ref.min(-1, keepdims=True))
                assert err.max() < 0.04 and np.median(err) < 0.005, (chunk, err.max(), np.median(err))
    finally:
        group.close()


def test_quantization_at_load_on_two_ranks_is_one_ranks():
    """--quantization q8_0 on a float checkpoint: every rank quantizes its own part, in the
    same 32-value blocks one rank quantizes (the o and down cuts fall on block boundaries)."""
    from model.test_quantized import SHAPE
    path = tiny_checkpoint_path("llama", **SHAPE, std=0.08)
    one, loaded = make_runner(path, quantization="q8_0")
    two, group = tp_runner(path, quantization="q8_0")
    try:
        assert {p for name in ("layers.0.qkv", "layers.0.o", "layers.0.gate_up", "layers.0.down")
                for p in two.formats[name][0]} == {"Q8_0"}
        prompts = prompts_for(loaded.config.vocab_size)
        for a, b in zip(lite_logits(one, prompts), lite_logits(two, prompts)):
            _close_up_to_int8_flips(b, a)
    finally:
        group.close()


def _close_up_to_int8_flips(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to fp32 summation order, except where that order moved an activation across
    an int8 rounding boundary of the next layer's input blocks: a few rows then differ by up
    to ~1 % of the logits' scale (measured 0.7 %), the rest stay within 1e-4."""
    scale = np.abs(want).max()
    close = np.abs(got - want) <= 1e-4 * scale
    assert close.mean() >= 0.9, close.mean()
    assert np.abs(got - want).max() <= 0.02 * scale, np.abs(got - want).max() / scale


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4]], ids=[IDS[0], IDS[2], IDS[4]])
def test_bf16_two_ranks_within_tolerance(case):
    """bf16 weights and KV cache: every logit within 0.03 x max |logit| of transformers' fp32
    (the single-rank parity tolerance), and within 0.005 x max of one rank's bf16 logits (the
    ranks' partial sums are rounded nowhere: only the order of fp32 additions differs)."""
    path = tiny_checkpoint_path(case[0], **case[1])
    one, loaded = make_runner(path, dtype="bfloat16")
    two, group = tp_runner(path, dtype="bfloat16")
    try:
        prompts = prompts_for(loaded.config.vocab_size)
        ref = hf_logits(path, prompts)
        for r, a, b in zip(ref, lite_logits(one, prompts), lite_logits(two, prompts)):
            assert np.abs(b - r).max() <= 0.03 * np.abs(r).max()
            assert np.abs(b - a).max() <= 0.005 * np.abs(a).max()
    finally:
        group.close()


def _greedy(path, **kw) -> list[list[int]]:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 320, n).tolist() for n in (1, 4, 17, 33)]
    with LLM(str(path), dtype="float32", block_size=16, max_num_batched_tokens=32, kv_cache_space=0.01, **kw) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fp32_greedy_tokens_identical_to_one_rank(case, monkeypatch):
    path = tiny_checkpoint_path(case[0], **case[1])
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0-1")
    want = _greedy(path)
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0|1")
    assert _greedy(path, tensor_parallel_size=2) == want


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (Cpus_allowed_list, CPU it last ran on) of every thread of process pid."""
    out = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        allowed = next(line.split()[1] for line in open(f"/proc/{pid}/task/{tid}/status")
                       if line.startswith("Cpus_allowed_list:"))
        text = open(f"/proc/{pid}/task/{tid}/stat").read()
        out[tid] = (allowed, int(text[text.rindex(")") + 2:].split()[39 - 3]))
    return out


def test_each_rank_runs_on_its_own_cpu_and_info_shows_the_ranks(monkeypatch):
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0|1")
    with LLM(str(tiny_checkpoint_path("llama")), dtype="float32", kv_cache_space=0.01,
             tensor_parallel_size=2) as llm:
        llm.generate([{"prompt_token_ids": list(range(3, 60))}], SamplingParams(max_tokens=8))
        ranks = llm.info["tensor_parallel_ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert [(r["cpus"], r["observed"], r["ok"]) for r in ranks] == [([0], [0], True), ([1], [1], True)]
        assert "query heads 2-3 of 4, KV heads 1-1 of 2, MLP features 48-95 of 96" in ranks[1]["holds"]
        assert "LM head rows 0-159 of 320" in ranks[0]["holds"] and "LM head rows 160-319 of 320" in ranks[1]["holds"]
        # seen from outside: every thread of the worker may only run on CPU 1 (its OpenMP team
        # reported above where it ran; idle threads started at import last ran before binding)
        worker = _threads(ranks[1]["pid"])
        assert worker and all(allowed == "1" for allowed, _ in worker.values())
        # rank 0's compute thread (the engine thread, OpenMP's master) is pinned to CPU 0
        engine = [t for t in threading.enumerate() if t.name == "lite-llm-engine"]
        assert engine and _threads(os.getpid())[engine[0].native_id] == ("0", 0)


def test_a_killed_rank_is_an_error_naming_it(monkeypatch):
    """No hang: the monitor sees the worker die and every wait returns."""
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0|1")
    llm = LLM(str(tiny_checkpoint_path("llama")), dtype="float32", kv_cache_space=0.01, tensor_parallel_size=2)
    try:
        pid = llm.info["tensor_parallel_ranks"][1]["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception) as e:
            llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4))
        chain, err = [], e.value
        while err is not None:
            chain.append(str(err))
            err = err.__cause__
        assert any(f"tensor parallel rank 1 (pid {pid}) exited (killed by SIGKILL)" in m for m in chain), chain
    finally:
        llm.shutdown()


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of `pid` is in the stopped state: a stop signal takes effect on each
    thread when the scheduler next runs it, and a worker still spinning on its CPU could take
    the step published meanwhile and finish it."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    states.append(fh.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass     # a thread that ended meanwhile
        if states and all(st in "tT" for st in states):
            return
        assert time.monotonic() < deadline, f"worker {pid} did not stop: thread states {states}"
        time.sleep(0.001)


def test_a_rank_killed_mid_step_ends_the_others_wait():
    """Rank 0 inside forward(), spinning in an all-reduce, gives up when the worker dies."""
    path = tiny_checkpoint_path("llama")
    runner, group = tp_runner(path)
    try:
        os.kill(group.procs[0].pid, signal.SIGSTOP)      # the worker stops before its all-reduce
        _wait_stopped(group.procs[0].pid)    # kill() returns before every thread has stopped
        killer = threading.Timer(0.5, lambda: os.kill(group.procs[0].pid, signal.SIGKILL))
        killer.start()
        with pytest.raises(tp.TensorParallelError, match=r"rank 1 \(pid \d+\) exited \(killed by SIGKILL\)"):
            lite_logits(runner, [[5, 6, 7]])
        killer.join()
    finally:
        group.close()


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "gpt_oss"])
def test_a_mixture_of_experts_on_two_ranks_gives_one_ranks_logits(arch):
    """Every expert (and Qwen2-MoE's shared expert) cut like a dense MLP, the router on both
    ranks: the routed sum of each rank's features summed over ranks is one rank's (gpt-oss: each
    rank its heads' sinks, the experts' gate/up biases cut with their rows, the down biases once)."""
    two_ranks_match_one(tiny_checkpoint_path(arch))


def test_model_that_does_not_split_is_refused():
    cfg = load_model(str(tiny_checkpoint_path("llama")), dtype="float32", progress=False).config
    with pytest.raises(ValueError, match="4 attention heads do not split over 3 ranks"):
        tp.check_tensor_parallel(cfg, 3)
    tp.check_tensor_parallel(cfg, 4)         # 2 KV heads replicated over 4 ranks


def test_experts_after_dense_layers_are_refused():
    """A dense MLP layer before the experts (DeepSeek's, Nemotron-H's first layers) has a width
    of its own that the ranks' cuts (the experts' width) do not follow: refused by name, not run
    with the wrong rows."""
    from dataclasses import replace
    cfg = load_model(str(tiny_checkpoint_path("llama")), dtype="float32", progress=False).config
    moe = replace(cfg, num_experts=4, num_experts_per_tok=2)
    tp.check_tensor_parallel(moe, 2)
    with pytest.raises(ValueError, match="first 1 dense MLP layer"):
        tp.check_tensor_parallel(replace(moe, first_dense_layers=1, dense_ffn_dim=2 * cfg.ffn_dim), 2)


@pytest.mark.parametrize("size,kv_heads", [(2, 2), (2, 1), (4, 2), (4, 4)])
def test_shards_put_back_together_are_the_weights(size, kv_heads):
    """Column-split rows and row-split columns of every rank reassemble the full matrices; the
    replicated KV heads are the ones their query heads read."""
    from dataclasses import replace
    cfg = load_model(str(tiny_checkpoint_path("llama")), dtype="float32", progress=False).config
    cfg = replace(cfg, num_heads=4, num_kv_heads=kv_heads, head_dim=16, ffn_dim=96, dim=64)
    H, Hkv, D, F, E = 4, kv_heads, 16, 96, 64
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal(((H + 2 * Hkv) * D, E)).astype(np.float32)
    o = rng.standard_normal((E, H * D)).astype(np.float32)
    gate_up = rng.standard_normal((2 * F, E)).astype(np.float32)
    parts = [(tp.shard_tensor("layers.0.qkv.weight", qkv, cfg, r, size),
              tp.shard_tensor("layers.0.o.weight", o, cfg, r, size),
              tp.shard_tensor("layers.0.gate_up.weight", gate_up, cfg, r, size)) for r in range(size)]
    hq = H // size
    assert np.array_equal(np.concatenate([p[0][:hq * D] for p in parts]), qkv[:H * D])
    assert np.array_equal(np.concatenate([p[1] for p in parts], axis=1), o)
    f = F // size
    assert np.array_equal(np.concatenate([p[2][:f] for p in parts]), gate_up[:F])
    assert np.array_equal(np.concatenate([p[2][f:] for p in parts]), gate_up[F:])
    for r, p in enumerate(parts):
        local = tp.rank_config(cfg, r, size)
        kv_of_first_q = (r * hq) // (H // Hkv)
        k = p[0][hq * D:(hq + local.num_kv_heads) * D]
        assert np.array_equal(k[:D], qkv[(H + kv_of_first_q) * D:(H + kv_of_first_q + 1) * D])
    from lite_llm.model.weights import StackedRows    # the loader's path: cut before reading
    for r, p in enumerate(parts):
        for name, full, want in (("layers.0.qkv.weight", qkv, p[0]), ("layers.0.o.weight", o, p[1]),
                                 ("layers.0.gate_up.weight", gate_up, p[2])):
            halves = np.split(full, 2)     # two stored parts, as gate and up are
            t = StackedRows(parts=tuple((len(h), lambda a, b, h=h: h[a:b].copy()) for h in halves), cols=full.shape[1])
            cut = tp.shard_rows(name, t, cfg, r, size)
            assert np.array_equal(cut.read(0, cut.shape[0]), want)
    assert tp.shard_tensor("layers.0.o.bias", np.ones(E, np.float32), cfg, 1, size) is None
    head = rng.standard_normal((cfg.vocab_size, E)).astype(np.float32)     # vocabulary-parallel rows
    assert np.array_equal(np.concatenate([tp.shard_tensor("lm_head.weight", head, cfg, r, size)
                                          for r in range(size)]), head)


def _segment(size, cap):
    import mmap
    header, slots = _kernels.kernels.tp_segment_bytes(size, cap)
    return mmap.mmap(-1, header + slots), header


def test_allreduce_sums_in_rank_order_on_every_rank():
    size, n = 3, 1000
    buf, offset = _segment(size, 1024)
    comms = [_kernels.kernels.TPComm(buf, r, size, 1024, offset, 10.0) for r in range(size)]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    want = (xs[0] + xs[1]) + xs[2]
    for _ in range(3):          # generations alternate the slots
        outs = [x.copy() for x in xs]
        threads = [threading.Thread(target=comms[r].allreduce, args=(outs[r], 1)) for r in range(1, size)]
        for t in threads:
            t.start()
        comms[0].allreduce(outs[0], 2)
        for t in threads:
            t.join()
        for out in outs:
            assert np.array_equal(out, want)


def test_allreduce_gives_up_on_abort_and_on_timeout():
    buf, offset = _segment(2, 64)
    lonely = _kernels.kernels.TPComm(buf, 0, 2, 64, offset, 0.2)     # rank 1 never comes
    with pytest.raises(RuntimeError, match="timed out"):
        lonely.allreduce(np.ones(64, np.float32))
    buf, offset = _segment(2, 64)
    comm = _kernels.kernels.TPComm(buf, 0, 2, 64, offset, 3600.0)
    threading.Timer(0.2, comm.set_abort, args=(1,)).start()
    with pytest.raises(RuntimeError, match="aborted"):
        comm.allreduce(np.ones(64, np.float32))
    assert comm.failed == "aborted"


def test_a_killed_rank_stops_the_server_with_a_clear_message():
    """`serve -tp 2`: kill rank 1 and the server exits (code 1) saying which rank died."""
    import http.client
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, LITE_LLM_CPU_OMP_THREADS_BIND="0|1")
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", str(tiny_checkpoint_path("llama")),
                             "--port", "0", "--dtype", "float32", "--kv-cache-space", "0.01", "-tp", "2"],
                            cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url, _ = wait_until_serving(proc)
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        workers = [int(p) for tid in os.listdir(f"/proc/{proc.pid}/task")     # spawned by the engine thread
                   for p in open(f"/proc/{proc.pid}/task/{tid}/children").read().split()]
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1        # a hang fails here instead of blocking the suite
        tail = proc.stderr.read()
        assert f"tensor parallel rank 1 (pid {workers[0]}) exited (killed by SIGKILL)" in tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_allreduce_runs_on_the_planned_cpus(monkeypatch, capsys):
    import json

    from lite_llm import cli
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0|1")
    assert cli.main(["bench", "allreduce", "--iters", "20", "--repeats", "1", "--tokens", "1,3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 2 and out["cpus"] == [0, 1]
    assert sorted(out["us_per_allreduce"]) == ["1", "3"] and all(v > 0 for v in out["us_per_allreduce"].values())


@pytest.mark.parametrize("head_dim,o_format", [(64, "F8_E4M3"), (32, "float32")])
def test_an_fp8_checkpoint_runs_as_stored_on_two_ranks(head_dim, o_format, tmp_path):
    """FP8 blocks on two ranks: each rank packs its rows (qkv, gate/up) and its columns of o and
    down, kept in FP8 where a rank's columns are whole 128-column chunks (o: 4 heads x 64 = 128
    a rank), else read dequantized (4 x 32: 64 a rank) in the engine dtype. One rank's logits up
    to summation order."""
    from model.test_fp8 import write_fp8
    ckpt = tiny_checkpoint_path("qwen3", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=head_dim, std=0.08)
    write_fp8(ckpt, tmp_path / "fp8", "block")
    one, _ = make_runner(tmp_path / "fp8")
    two, group = tp_runner(tmp_path / "fp8")
    try:
        assert two.formats["layers.0.qkv"][0] == ("F8_E4M3",) and two.formats["layers.0.down"][0] == ("F8_E4M3",)
        assert two.formats["layers.0.o"][0] == (o_format,)
        prompts = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300, 12, 9, 77], [8, 1, 99]]
        for chunk in (None, 1):
            for a, b in zip(lite_logits(one, prompts, chunk), lite_logits(two, prompts, chunk)):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    finally:
        group.close()


def test_longrope_rows_reach_the_other_rank():
    """Phi-3 LongRoPE (short context 32): a 40-token prompt turns its first 32 tokens with the
    long factors through table rows past max_model_len, which travel with the step; two ranks
    give one rank's logits (and one rank gives transformers', test_longrope.py)."""
    path = tiny_checkpoint_path("phi3")
    one, loaded = make_runner(path)
    two, group = tp_runner(path)
    try:
        prompts = prompts_for(loaded.config.vocab_size, [12, 40])
        for chunk in (None, 7):
            for a, b in zip(lite_logits(one, prompts, chunk), lite_logits(two, prompts, chunk)):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
    finally:
        group.close()
