"""LoRA adapters served per request against transformers + peft: a tiny random Llama with two
PEFT adapters of different ranks (random A and B: init_lora_weights=False, PEFT's default B of
zeros would make an adapter a no-op), the same adapter as a llama.cpp GGUF LoRA file, a batch
mixing the base and both adapters, the prefix cache keyed per adapter, an adapter over a Q8_0
base kept in its format, and the errors a bad adapter gets at load."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import _permute_qk, checkpoint_copy, make_peft_adapter, write_gguf
from test_parity import BLOCK, lite_logits

from lite_llm import LoRARequest, SamplingParams
from lite_llm.lora import LoRAManager, load_adapter

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300, 12], [8, 1, 99, 40], [60, 61, 62, 63, 64, 65, 66]]


def peft_logits(base, adapter, prompts) -> list[np.ndarray]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].double().numpy() for p in prompts]


def peft_greedy(base, adapter, prompt, n: int) -> list[int]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def setup(tiny_checkpoint, tmp_path_factory):
    """(base checkpoint, adapter 1 rank 8 on all seven targets, adapter 2 rank 4 rsLoRA on four)."""
    base = tiny_checkpoint("llama")
    root = tmp_path_factory.mktemp("lora")
    a1 = make_peft_adapter(base, root / "a1", 8, 16, ALL, seed=1)
    a2 = make_peft_adapter(base, root / "a2", 4, 8, ["q_proj", "v_proj", "up_proj", "down_proj"], seed=2, rslora=True)
    return base, a1, a2


def lora_runner(base, adapters, max_rank=8, quantization=None):
    from lite_llm.engine.runner import ModelRunner
    from lite_llm.model.loader import load_model
    loaded = load_model(str(base), dtype="float32", progress=False)
    runner = ModelRunner(loaded, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=256, max_num_seqs=256,
                         num_threads=2, quantization=quantization, max_loras=len(adapters), max_lora_rank=max_rank)
    manager = LoRAManager(loaded.config, runner.lora_weights, len(adapters), max_rank)
    for i, path in enumerate(adapters):
        manager.load(f"a{i}", str(path))
    return runner, manager


def logits_with(runner, prompts, slots, chunk=None):
    """lite_logits with sequence s on adapter slot slots[s] (-1: the base model)."""
    runner.input_batch.seq_lora[:len(slots)] = slots
    try:
        return lite_logits(runner, prompts, chunk)
    finally:
        runner.input_batch.seq_lora[:] = -1


def test_peft_adapters_match_transformers_and_differ_from_the_base(setup):
    base, a1, a2 = setup
    runner, manager = lora_runner(base, [a1, a2])
    base_ref = peft_logits(base, None, PROMPTS)
    for slot, adapter in ((0, a1), (1, a2)):
        want = peft_logits(base, adapter, PROMPTS)
        for chunk in (None, 3):     # one shot, and chunked prefill with paged decode-like steps
            got = logits_with(runner, PROMPTS, [slot] * len(PROMPTS), chunk)
            for g, w, b in zip(got, want, base_ref):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
                assert np.abs(w - b).max() > 0.05 * np.abs(b).max(), "the adapter must change the logits"
    # base rows in the same runner are the base model
    for g, w in zip(logits_with(runner, PROMPTS, [-1] * len(PROMPTS)), base_ref):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def test_a_batch_mixing_the_base_and_two_adapters_gives_each_request_its_own_output(setup):
    base, a1, a2 = setup
    runner, _ = lora_runner(base, [a1, a2])
    prompts = PROMPTS + [PROMPTS[0][:9]]
    slots = [-1, 0, 1, 0]
    for chunk in (None, 2):
        mixed = logits_with(runner, prompts, slots, chunk)
        for i, (p, s) in enumerate(zip(prompts, slots)):
            alone = logits_with(runner, [p], [s], chunk)[0]
            np.testing.assert_allclose(mixed[i], alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())


def test_gguf_lora_file_gives_the_peft_adapters_logits(setup, tmp_path):
    """Adapter 1 written as llama.cpp's convert_lora_to_gguf.py writes it: blk.N.<t>.weight.lora_a
    [r, K] / .lora_b [N, r], q/k rows of B permuted for the "llama" graph, adapter.lora.alpha."""
    from safetensors.numpy import load_file
    base, a1, _ = setup
    cfg = json.loads((a1 / "adapter_config.json").read_text())
    sd = load_file(str(a1 / "adapter_model.safetensors"))
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    heads = {"attn_q": 4, "attn_k": 2}
    tensors = {}
    for key, w in sd.items():
        parts = key.split(".")
        layer, module, ab = int(parts[parts.index("layers") + 1]), parts[-3], parts[-2]
        t = names[module]
        if ab == "lora_B" and t in heads:
            w = _permute_qk(w, heads[t])
        tensors[f"blk.{layer}.{t}.weight.lora_{ab[-1].lower()}"] = (np.ascontiguousarray(w), None)
    path = write_gguf(tmp_path / "a1.gguf", tensors, "llama",
                      {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": float(cfg["lora_alpha"])})
    runner, _ = lora_runner(base, [a1, path])
    from_peft = logits_with(runner, PROMPTS, [0] * 3)
    from_gguf = logits_with(runner, PROMPTS, [1] * 3)
    for p, g in zip(from_peft, from_gguf):
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-5 * np.abs(p).max())


def test_greedy_tokens_through_llm_generate_match_peft(setup):
    from lite_llm import LLM
    base, a1, a2 = setup
    llm = LLM(str(base), dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=8,
              kv_cache_space=0.01, block_size=16, max_model_len=128)
    try:
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        loras = [None, LoRARequest("a1", 1, str(a1)), LoRARequest("a2", 2, str(a2))]
        sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        outs = llm.generate(prompts, sp, lora_request=loras)
        for p, adapter, out in zip(PROMPTS, (None, a1, a2), outs):
            assert out.outputs[0].token_ids == peft_greedy(base, adapter, p, 8)
        # one LoRARequest for every prompt
        outs = llm.generate(prompts[:2], sp, lora_request=loras[1])
        for p, out in zip(PROMPTS, outs):
            assert out.outputs[0].token_ids == peft_greedy(base, a1, p, 8)
        with pytest.raises(ValueError, match="2 LoRA requests for 3 prompts"):
            llm.generate(prompts, sp, lora_request=loras[:2])
    finally:
        llm.shutdown()


def test_no_cached_block_is_shared_across_adapters(setup):
    from lite_llm import LLM
    base, a1, a2 = setup
    llm = LLM(str(base), dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=4,
              kv_cache_space=0.01, block_size=16, max_model_len=128, enable_prefix_caching=True)
    try:
        engine = llm.llm_engine
        prompt = {"prompt_token_ids": list(range(3, 3 + 40))}      # two full blocks of 16
        sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        r1, r2 = LoRARequest("a1", 1, str(a1)), LoRARequest("a2", 2, str(a2))
        pool = engine.kv_cache_manager.block_pool
        previous, tokens = set(), {}
        # freed blocks are reused least recently freed first: each request finds the blocks of
        # the one before it still cached, and must not hit them when its adapter differs
        for name, lora in (("base", None), ("a1", r1), ("a1 again", r1), ("a2", r2), ("base again", None)):
            assert previous <= set(pool.cached)
            out = llm.generate([prompt], sp, lora_request=lora)[0]
            if name == "a1 again":      # the same adapter: its own two full blocks are hits
                assert out.num_cached_tokens == 32
                assert out.outputs[0].token_ids == tokens["a1"]
            else:
                assert out.num_cached_tokens == 0, f"{name} reused another adapter's cached blocks"
            tokens[name] = out.outputs[0].token_ids
            previous = set(pool.cached)
            assert len(previous) >= 2
        assert tokens["base again"] == tokens["base"]
        assert tokens["a1"] != tokens["base"] or tokens["a2"] != tokens["base"]
    finally:
        llm.shutdown()


def test_an_adapter_over_a_q8_0_base_matches_the_dequantized_base_plus_the_adapter(setup, tmp_path):
    """The base quantized at load to Q8_0 stays Q8_0 (never merged with the adapter); against
    transformers + peft on a copy of the base whose weights went through Q8_0 and back."""
    import gguf
    from safetensors.numpy import save_file
    base, a1, _ = setup
    ref_dir = tmp_path / "roundtrip"
    sd = checkpoint_copy(base, ref_dir)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, w in sd.items():
        if w.ndim == 2:
            sd[name] = gguf.quants.dequantize(gguf.quants.quantize(w.astype(np.float32), q8), q8).astype(w.dtype)
    save_file(sd, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    runner, _ = lora_runner(base, [a1], quantization="q8_0")
    assert {p for parts, _ in runner.formats.values() for p in parts} == {"Q8_0"}
    want = peft_logits(ref_dir, a1, PROMPTS)
    plain = peft_logits(ref_dir, None, PROMPTS)
    for chunk in (None, 1):
        for got, ref, b in zip(logits_with(runner, PROMPTS, [0] * 3, chunk), want, plain):
            err = np.abs(got - ref) / (ref.max(-1, keepdims=True) - ref.min(-1, keepdims=True))
            # the int8 activation blocks of the Q8_0 GEMMs: see test_quantized.py
            assert err.max() < 0.04 and np.median(err) < 0.005, (chunk, err.max(), np.median(err))
            assert np.abs(ref - b).max() > 10 * np.abs(got - ref).max()


def test_bad_adapters_fail_at_load_with_a_clear_error(setup, tiny_checkpoint, tmp_path):
    from lite_llm.model.loader import load_model
    base, a1, _ = setup
    config = load_model(str(base), dtype="float32", progress=False).config
    with pytest.raises(ValueError, match="rank 8, above --max-lora-rank 4"):
        load_adapter(str(a1), config, max_rank=4)
    # a target module the config names but the weights lack
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "adapter_model.safetensors").write_bytes((a1 / "adapter_model.safetensors").read_bytes())
    cfg = json.loads((a1 / "adapter_config.json").read_text())
    (missing / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ALL + ["lm_head"]}))
    with pytest.raises(ValueError, match="target module 'lm_head' is not supported"):
        load_adapter(str(missing), config, max_rank=16)
    from safetensors.numpy import load_file, save_file
    sd = {k: v for k, v in load_file(str(a1 / "adapter_model.safetensors")).items() if "gate_proj" not in k}
    save_file(sd, str(missing / "adapter_model.safetensors"))
    (missing / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="targets 'gate_proj' but adapter_model.safetensors has no"):
        load_adapter(str(missing), config, max_rank=16)
    # an adapter of another base model: hidden 32 instead of 64
    other = tiny_checkpoint("llama", hidden_size=32, intermediate_size=64)
    wrong = make_peft_adapter(other, tmp_path / "wrong", 4, 8, ALL, seed=3)
    with pytest.raises(ValueError, match=r"do not fit the base model's \w+ projection"):
        load_adapter(str(wrong), config, max_rank=16)
    with pytest.raises(ValueError, match="not found"):
        load_adapter(str(tmp_path / "nowhere"), config, max_rank=16)
    # and through the engine: the request is refused before it runs
    from lite_llm import LLM
    llm = LLM(str(base), dtype="float32", enable_lora=True, max_loras=1, max_lora_rank=4, kv_cache_space=0.01,
              block_size=16, max_model_len=64, max_num_seqs=2)
    try:
        with pytest.raises(ValueError, match="above --max-lora-rank 4"):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                         lora_request=LoRARequest("a1", 1, str(a1)))
    finally:
        llm.shutdown()
    llm = LLM(str(base), dtype="float32", kv_cache_space=0.01, block_size=16, max_model_len=64, max_num_seqs=2)
    try:
        with pytest.raises(ValueError, match="LoRA is not enabled"):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2),
                         lora_request=LoRARequest("a1", 1, str(a1)))
    finally:
        llm.shutdown()
