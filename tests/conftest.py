"""Shared fixtures: rng, and tiny random transformers checkpoints of every supported architecture.

`tiny_checkpoint(arch, **overrides) -> Path` saves a small random model with save_pretrained
(safetensors) plus a small byte-level BPE tokenizer and a chat template; results are cached
per (arch, overrides) for the session. `build_tiny_checkpoint` is the same without the
fixture, for helpers outside pytest.
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# packed weights are kept between starts only where a test asks for it (tests/model/
# test_packed_cache.py, in its own temporary directory): every other load packs, as a first
# start does, and nothing is written to the user's cache
os.environ.setdefault("LITE_LLM_PACKED_CACHE", "off")


# ---- test tiers ------------------------------------------------------------------------
# README's test command runs the fast tier: every test outside the tiers below. `.ci/run` runs
# each tier too (`python -m pytest -q -m <tier>`, after installing what it needs); `-m` chooses
# tiers (`-m "peers or slow"`), and without `-m` the fast tier runs.
TIERS = {
    "variants": "each kernel variant this CPU can run besides the one the dispatcher picks, "
                "against the NumPy specs and the others (tests/kernel_build.py compiles them first: minutes of CPU)",
    "peers": "against llama.cpp, whisper.cpp and faster-whisper on the same weights (pip install -e "
             "'.[test-peers]': llama-cpp-python, compiled from source; pywhispercpp, faster-whisper)",
    "ray": "Ray Serve replicas (pip install -e '.[ray]')",
    "browser": "the web UI in Debian's chromium (pip install -e '.[test-browser]'; apt-get install chromium)",
    "slow": "the longest tests (whole models, long contexts, many threads)",
}
FAST_TIER = "not (" + " or ".join(TIERS) + ")"
# tiers given by place: these files are not even imported when their tier is not chosen
# (their imports need the tier's packages)
TIER_PATHS = {"peers": ("multimodal/test_qwen2_5_vl_llamacpp.py", "multimodal/test_whisper_cpp_peers.py"), "ray": ("server/test_serve_ray.py",),
              "browser": ("browser/",)}
_TESTS = Path(__file__).resolve().parent


def _chosen(config, tier: str) -> bool:
    """Whether the run's -m expression selects a test marked only `tier`."""
    from _pytest.mark.expression import Expression
    return Expression.compile(config.option.markexpr).evaluate(lambda name, **kw: name == tier)


def _tier_of_path(path: Path) -> str | None:
    rel = path.resolve().relative_to(_TESTS).as_posix() if path.resolve().is_relative_to(_TESTS) else ""
    return next((t for t, places in TIER_PATHS.items() for p in places if rel == p or rel.startswith(p)), None)


def pytest_configure(config):
    """The fast tier unless -m says otherwise; for the variants tier, build the kernel variants
    this CPU can run that the editable install left out (kernel_build.py) before a test module
    lists them."""
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: a tier of its own (-m {tier}): {what}")
    config.addinivalue_line("markers", "x86_host: needs an x86_64 host (deselected on other machines)")
    if not config.option.markexpr:
        config.option.markexpr = FAST_TIER
    if not _chosen(config, "variants"):
        return
    import kernel_build
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        try:
            kernel_build.complete()
        except RuntimeError as e:
            pytest.exit(str(e), returncode=pytest.ExitCode.INTERNAL_ERROR)


def pytest_ignore_collect(collection_path, config):
    tier = _tier_of_path(Path(collection_path))
    return True if tier is not None and not _chosen(config, tier) else None


def _not_for_this_machine(item) -> bool:
    if item.get_closest_marker("x86_host") and platform.machine() not in ("x86_64", "AMD64"):
        return True
    return any(m.name == "skip" and str(m.kwargs.get("reason", m.args[0] if m.args else "")).startswith(
        "got empty parameter set") for m in item.iter_markers())


def pytest_collection_modifyitems(config, items):
    """Each test's tier: by place (TIER_PATHS), and `variants` for a test given a kernel variant
    other than the one the dispatcher picks on this CPU. A test this machine cannot hold is
    deselected, not skipped (under CI=true a skip fails the run): one marked `x86_host` on another
    architecture (the emulated tier runs tests/kernels on aarch64 and s390x), and one parametrized
    over an empty set (the kernel variants with a feature this CPU's builds lack)."""
    try:
        from lite_llm import _kernels
        others = {v.name for v in _kernels.variants_for(platform.machine())} - {_kernels.VARIANT.name}
    except ImportError:      # nothing built: the tests say so themselves
        others = set()
    away = [item for item in items if _not_for_this_machine(item)]
    if away:
        config.hook.pytest_deselected(items=away)
        items[:] = [item for item in items if item not in away]
    for item in items:
        tier = _tier_of_path(Path(str(item.path)))
        if tier is not None:
            item.add_marker(tier)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v in others for v in params.values()):
            item.add_marker("variants")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Under CI=true a skipped test fails the run: every tier's packages and tools are there."""
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped and os.environ.get("CI") == "true":
        terminalreporter.write_line(f"CI=true: {len(skipped)} test(s) skipped, and CI runs every test: failing the run",
                                    red=True)


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if (reporter is not None and reporter.stats.get("skipped") and os.environ.get("CI") == "true"
            and exitstatus == pytest.ExitCode.OK):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


TINY_VOCAB = 320            # 256 byte symbols + learned merges + special tokens
TINY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Hello world! Hello there, how are you today?",
    "def main():\n    return 42\n",
    "Unicode: héllo wörld, naïve café, 日本語のテキスト.",
    "the cat sat on the mat; the dog ate the bone.",
] * 20

# shared geometry: hidden 64, 2 layers, 4 heads of 16, 2 kv heads
_BASE = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             bos_token_id=0, eos_token_id=2, pad_token_id=None)

ARCH_DEFAULTS: dict[str, dict] = {
    "llama": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0),
    "mistral": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=8),
    # LFM2: short-convolution layers (3 taps) around one attention layer with q/k norms, the
    # MLP width as given (no 2/3 adjustment), the tied embedding
    # Bamba: Mamba2 layers (8 heads of 16 channels in 2 groups, a state of 16, 4 conv taps)
    # around one attention layer (RoPE over half of each head)
    "bamba": dict(_BASE, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head="auto",
                  mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                  rms_norm_eps=1e-5, tie_word_embeddings=False),
    # Qwen3-Next: Gated DeltaNet layers (2 key heads of 16 serving 4 value heads of 8, 4 conv
    # taps) around one gated attention layer (RoPE over a quarter of each head), every layer's
    # MLP top-2 of 4 experts (renormalised) with a gated shared expert; prompts past two 64-token chunks
    "qwen3_next": dict(_BASE, head_dim=16, num_hidden_layers=4, max_position_embeddings=256,
                       layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
                       decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    # Granite 4.0-H: Bamba's Mamba2 layers around one attention layer (RoPE over whole heads;
    # position_embedding_type "nope": none), Granite's four multipliers (none of them 1), top-2 of
    # 4 experts of 32 (softmax after the top-k) beside the shared MLP of 48 (num_local_experts 0: it alone)
    "granite_hybrid": dict(_BASE, intermediate_size=32, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
                           mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
                           mamba_expand=2, mamba_chunk_size=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
                           position_embedding_type="rope", rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                           embedding_multiplier=6.0, residual_multiplier=0.4, attention_multiplier=0.09,
                           logits_scaling=3.0),
    # Nemotron-H: blocks of one mixer each (Mamba2 "M", attention "*" without positions, relu^2
    # MLP "-"), here M - * M - M: the attention block and the last Mamba2 block without an MLP after
    "nemotron_h": dict(_BASE, head_dim=16, hybrid_override_pattern="M-*M-M", mamba_num_heads=8, mamba_head_dim=16,
                       n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16, layer_norm_epsilon=1e-5,
                       tie_word_embeddings=False),
    # Falcon-H1: Mamba2 (6 heads of 16 in 2 groups: mamba_d_ssm 96, not 2 x hidden) beside attention
    # in each layer, every µP multiplier away from 1, the gated norm before the gate
    "falcon_h1": dict(_BASE, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
                      mamba_d_conv=4, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=True,
                      rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      embedding_multiplier=3.0, lm_head_multiplier=0.5, mlp_multipliers=[0.7, 1.3],
                      key_multiplier=0.6, attention_in_multiplier=1.5, attention_out_multiplier=0.8,
                      ssm_multipliers=[0.5, 1.2, 0.9, 1.1, 0.75], ssm_in_multiplier=1.4, ssm_out_multiplier=0.6),
    "lfm2": dict(_BASE, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"], conv_L_cache=3,
                 conv_bias=False, norm_eps=1e-5, block_auto_adjust_ff_dim=False, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "qwen2": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0),
    "qwen3": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0, head_dim=24),
    # Gemma: head_dim 16, an attention scale of query_pre_attn_scalar ** -0.5 != head_dim ** -0.5
    # Gemma 2: soft-caps small enough to bite on these weights (scores ~0.1, logits ~3)
    "gemma2": dict(_BASE, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=8,
                   query_pre_attn_scalar=24, final_logit_softcapping=2.0, attn_logit_softcapping=0.1,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # Gemma 3: sliding layers (window 8, RoPE base 10k) between global ones (1M, linear x 8), q/k norm
    "gemma3": dict(_BASE, head_dim=16, num_hidden_layers=4, rms_norm_eps=1e-6, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                       "rope_theta": 1000000.0}},
                   query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # Phi-3: LongRoPE with a short context of 32 (prompts run past it), distinct short / long factors
    "phi3": dict(_BASE, rms_norm_eps=1e-5, tie_word_embeddings=False, original_max_position_embeddings=32,
                 rope_scaling={"rope_type": "longrope", "rope_theta": 10000.0,
                               "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                               "long_factor": [1.0, 1.5, 2.2, 3.4, 5.0, 7.5, 11.0, 16.0]}),
    # Granite: its four multipliers, none of them 1
    "granite": dict(_BASE, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, embedding_multiplier=6.0,
                    residual_multiplier=0.4, attention_multiplier=0.09, logits_scaling=3.0),
    # mixtures of experts: Qwen3-MoE top-8 of 16 (renormalised, as the released models),
    # Mixtral top-2 of 4 (always renormalised), Qwen2-MoE top-2 of 4 (not) with its shared expert
    "qwen3_moe": dict(_BASE, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0,
                      num_experts=16, num_experts_per_tok=8, moe_intermediate_size=32, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "mixtral": dict(_BASE, intermediate_size=64, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=1000000.0,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen2_moe": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]),
    # gpt-oss: top-4 of 8 experts (softmax after the top-k), sliding (window 8) and full layers
    # alternating, YaRN (factor 4 over 32 positions, not truncated), biases everywhere, sinks
    "gpt_oss": dict(_BASE, head_dim=16, intermediate_size=32, num_hidden_layers=4, num_local_experts=8,
                    num_experts_per_tok=4, sliding_window=8, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 32,
                                     "rope_theta": 150000.0}),
    # DeepSeek-V2 (V2-Lite's shape: no q latent): latent attention (kv_lora_rank 32, query heads
    # of 16 + 16 RoPE components, values of 16), one dense layer then top-2 of 8 experts chosen
    # within the best 2 of 4 groups, weights x 1.5, two shared experts
    "deepseek_v2": dict(_BASE, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8,
                        num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1,
                        topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5,
                        norm_topk_prob=False, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0),
    # DeepSeek-V3: a q latent of 32, sigmoid routing with the correction bias, top-2 of 8 within
    # the best 2 of 4 groups, renormalised, x 2.5, YaRN with mscale (the softmax scale's too)
    "deepseek_v3": dict(_BASE, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8,
                        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
                        tie_word_embeddings=False,
                        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "rope_theta": 10000.0}),
    "opt": dict(vocab_size=TINY_VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, word_embed_proj_dim=64, do_layer_norm_before=True,
                activation_function="relu", bos_token_id=0, eos_token_id=2, pad_token_id=1,
                tie_word_embeddings=True, dropout=0.0, attention_dropout=0.0),
}
# encoders (pooling models): hidden 64, 2 layers, 4 heads of 16, post-norm LayerNorm, erf-GELU;
# XLM-R numbers positions from pad_token_id + 1; the *_cls variants carry a one-label head
_ENCODER = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=130, hidden_act="gelu", layer_norm_eps=1e-12,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
ARCH_DEFAULTS.update({
    "bert": dict(_ENCODER, type_vocab_size=2, pad_token_id=0),
    "bert_cls": dict(_ENCODER, type_vocab_size=2, pad_token_id=0, num_labels=1),
    "xlm_roberta": dict(_ENCODER, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "xlm_roberta_cls": dict(_ENCODER, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                            num_labels=1),
})
ENCODER_ARCHS = ("bert", "bert_cls", "xlm_roberta", "xlm_roberta_cls")
ARCH_DEFAULTS["qwen3_base"] = ARCH_DEFAULTS["qwen3"]     # a bare Qwen3Model (Qwen3-Embedding's layout)


def wait_until_serving(proc, timeout: float | None = None) -> tuple[str, list[str]]:
    """Read a `serve` subprocess's stderr (text mode) up to the line that says where it serves:
    (its http://127.0.0.1:PORT url, the lines so far). A server that exits first fails the test
    with everything it printed."""
    lines: list[str] = []
    while True:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError("server exited early:\n" + "".join(lines))
        lines.append(line)
        if " on http://127.0.0.1:" in line:
            return "http://127.0.0.1:" + line.split(" on http://127.0.0.1:")[1].split()[0], lines


def tiny_tokenizer_json(special: list[str] = TINY_SPECIAL) -> str:
    """A byte-level BPE tokenizer.json (TINY_VOCAB entries) trained in-process; `special` take
    ids 0, 1, ... in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=list(special), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return tok.to_str()


def _model_class(arch: str):
    import transformers
    return {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "lfm2": (transformers.Lfm2Config, transformers.Lfm2ForCausalLM),
            "bamba": (transformers.BambaConfig, transformers.BambaForCausalLM),
            "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM),
            "granite_hybrid": (transformers.GraniteMoeHybridConfig, transformers.GraniteMoeHybridForCausalLM),
            "nemotron_h": (transformers.NemotronHConfig, transformers.NemotronHForCausalLM),
            "falcon_h1": (transformers.FalconH1Config, transformers.FalconH1ForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
            "opt": (transformers.OPTConfig, transformers.OPTForCausalLM),
            "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
            "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
            "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
            "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
            "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
            "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
            "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
            "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM),
            "deepseek_v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
            "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
            "qwen3_base": (transformers.Qwen3Config, transformers.Qwen3Model),
            "bert": (transformers.BertConfig, transformers.BertModel),
            "bert_cls": (transformers.BertConfig, transformers.BertForSequenceClassification),
            "xlm_roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel),
            "xlm_roberta_cls": (transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification)}[arch]


def randomize_weights(model, std: float, norm_low: float | Callable[[str], float] = 0.5,
                      is_norm: Callable[[str], bool] = lambda name: "norm" in name and name.endswith("weight")) -> None:
    """Non-trivial weights in place, norms and biases off their 1/0 init so every tensor matters:
    matrices N(0, std) (a vision tower's patch embedding N(0, 0.02): its rows are 3 P^2 pixels
    long), norm weights U(low, low + 1) with low = norm_low (or norm_low(name)), every other
    vector N(0, std). Parameters are drawn in named_parameters() order from torch's global RNG."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02 if "patch_embed" in name else std)
            elif is_norm(name):
                low = norm_low(name) if callable(norm_low) else norm_low
                p.uniform_(low, low + 1.0)
            else:
                p.normal_(0.0, std)


def tiny_hf_tokenizer(special: list[str] = TINY_SPECIAL, *, backend=None,
                      chat_template: str | None = TINY_CHAT_TEMPLATE, **extra):
    """transformers' fast tokenizer over tiny_tokenizer_json(special) (or a tokenizers `backend`):
    bos and pad <|endoftext|>, eos <|im_end|>, no unknown token, chat_template set unless None;
    extra: further PreTrainedTokenizerFast arguments."""
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=backend or HFTokenizer.from_str(tiny_tokenizer_json(special)),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token=None, **extra)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def build_tiny_checkpoint(arch: str, out_dir: Path, std: float = 0.05, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `arch` model (safetensors) with tokenizer files into out_dir."""
    import torch
    from tokenizers import Tokenizer as HFTokenizer

    config_cls, model_cls = _model_class(arch)
    config = config_cls(**copy.deepcopy({**ARCH_DEFAULTS[arch], **overrides}))   # configs mutate dicts
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # Gemma's norms scale by (1 + w): w around 0 gives the other families' effective scales
    # (Qwen3-Next's too, but for its DeltaNet layers' gated norm, a plain scale)
    randomize_weights(model, std, norm_low=-0.5 if arch.startswith("gemma") else
                      (lambda name: 0.5 if "linear_attn.norm" in name else -0.5) if arch == "qwen3_next" else 0.5)
    if arch == "gpt_oss":   # sinks that outweigh some scores, gate / up values past the SwiGLU's clamp at 7
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
                layer.mlp.experts.gate_up_proj_bias.normal_(0.0, 6.0)
    if arch == "qwen3_next":   # decays of 0.7-0.99 a token: the DeltaNet state carries across a 64-token chunk
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer, "linear_attn"):
                    layer.linear_attn.A_log.uniform_(-4.0, -1.0)
    if arch == "deepseek_v3":   # a correction bias that changes which experts are chosen
        with torch.no_grad():
            for layer in model.model.layers[config.first_k_dense_replace:]:
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    if arch == "nemotron_h":   # its experts' correction bias too (a buffer the randomizer leaves at 0)
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mixer, "gate"):
                    layer.mixer.gate.e_score_correction_bias.normal_(0.0, 0.1)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    backend = HFTokenizer.from_str(tiny_tokenizer_json())
    if arch in ENCODER_ARCHS:   # BERT's [CLS] A [SEP] (B [SEP]) with token types, on the tiny vocabulary
        from tokenizers.processors import TemplateProcessing
        specials = [("<|endoftext|>", backend.token_to_id("<|endoftext|>")), ("<|im_end|>", backend.token_to_id("<|im_end|>"))]
        backend.post_processor = TemplateProcessing(single="<|endoftext|> $A <|im_end|>",
                                                    pair="<|endoftext|> $A <|im_end|> $B:1 <|im_end|>:1",
                                                    special_tokens=specials)
    # encoders take token types; a chat template would make sentence-transformers' CrossEncoder
    # format pairs as messages
    tok = tiny_hf_tokenizer(backend=backend, chat_template=None if arch in ENCODER_ARCHS else TINY_CHAT_TEMPLATE,
                            **({"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
                               if arch.startswith("bert") else {}))
    tok.save_pretrained(out_dir)
    with open(out_dir / "generation_config.json", "w") as fh:
        json.dump({"bos_token_id": 0, "eos_token_id": [2], "temperature": 0.7, "top_p": 0.9,
                   "do_sample": True}, fh)
    return out_dir


_CACHE_ROOT = Path(tempfile.mkdtemp(prefix="lite_llm_tiny_"))
atexit.register(shutil.rmtree, _CACHE_ROOT, ignore_errors=True)
_BUILT: dict[tuple, Path] = {}


def cache_dir(prefix: str) -> Path:
    """A new directory under the test run's cache root, removed when the run ends."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_CACHE_ROOT))


def checkpoint_copy(ckpt: Path, out_dir: Path) -> dict[str, np.ndarray]:
    """out_dir, made holding every file of the HF checkpoint `ckpt` but its weights; returns
    those weights (model.safetensors) as NumPy arrays, for the caller to change and save there."""
    out_dir.mkdir()
    for f in ckpt.iterdir():
        if f.name != "model.safetensors":
            (out_dir / f.name).write_bytes(f.read_bytes())
    return load_file(str(ckpt / "model.safetensors"))


def tiny_checkpoint_path(arch: str, **overrides) -> Path:
    """Cached build_tiny_checkpoint: one directory per (arch, overrides) for the process."""
    key = (arch, json.dumps(overrides, sort_keys=True, default=str))
    if key not in _BUILT:
        _BUILT[key] = build_tiny_checkpoint(arch, _CACHE_ROOT / f"{arch}-{len(_BUILT)}", **overrides)
    return _BUILT[key]


# The multi-byte fields of each ggml block, (byte offset, size): the fp16 scales, Q5_0/Q5_1's
# 32-bit mask of high bits, IQ4_XS's 16-bit high scale bits, the codebook types' sign/scale words
# (IQ2_XXS: 4 index bytes, then one such word, per 32 values); every other byte is a byte.
GGML_WIDE_FIELDS = {
    "Q8_0": ((0, 2),), "Q4_0": ((0, 2),), "Q4_1": ((0, 2), (2, 2)), "Q5_0": ((0, 2), (2, 4)),
    "Q5_1": ((0, 2), (2, 2), (4, 4)), "Q4_K": ((0, 2), (2, 2)), "Q5_K": ((0, 2), (2, 2)),
    "Q6_K": ((208, 2),), "IQ4_NL": ((0, 2),), "IQ4_XS": ((0, 2), (2, 2)),
    "Q2_K": ((80, 2), (82, 2)), "Q3_K": ((108, 2),), "TQ2_0": ((64, 2),), "TQ1_0": ((52, 2),), "MXFP4": (),
    "IQ2_XXS": ((0, 2), *((6 + 8 * i, 4) for i in range(8))), "IQ2_XS": ((0, 2), *((2 + 2 * i, 2) for i in range(32))),
    "IQ2_S": ((0, 2),), "IQ3_XXS": ((0, 2), *((66 + 4 * i, 4) for i in range(8))), "IQ3_S": ((0, 2),),
    "IQ1_S": ((0, 2), *((34 + 2 * i, 2) for i in range(8))), "IQ1_M": tuple((48 + 2 * i, 2) for i in range(4)),
}
# where ggml_rows puts sane fp16 scales in a block of random bytes (a block's d and, after it, dmin)
_SCALE_AT = {"Q4_K": 0, "Q5_K": 0, "IQ4_NL": 0, "IQ4_XS": 0, "Q6_K": 208, "Q2_K": 80, "Q3_K": 108, "TQ2_0": 64,
             "TQ1_0": 52, "IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "IQ1_M": 48}


def ggml_file_order(raw: np.ndarray, qname: str, byteorder: str = sys.byteorder) -> np.ndarray:
    """Block bytes as the gguf package makes and reads them (the machine's byte order) <-> as a
    GGUF file stores them (little-endian). The identity on a little-endian machine; on a big-endian
    one (s390x) every multi-byte field of every block is byte-swapped. Its own inverse."""
    if byteorder == "little":
        return raw
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qname]][1]
    blocks = np.array(raw, dtype=np.uint8, copy=True).reshape(-1, block)
    for off, size in GGML_WIDE_FIELDS[qname]:
        blocks[:, off:off + size] = blocks[:, off:off + size][:, ::-1]
    return blocks.reshape(raw.shape)


def set_iq1m_scale(raw: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M blocks raw [..., 56] given the fp16 scale d [..., 2] (its bytes as files store them):
    its 4 nibbles are the top nibbles of the block's 4 little-endian u16 scale words."""
    bits = d.copy().view("<u2")[..., 0]
    for i in range(4):
        raw[..., 49 + 2 * i] = (raw[..., 49 + 2 * i] & 0x0F) | (((bits >> (4 * i)) & 0x0F) << 4).astype(np.uint8)


CODEBOOK_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def random_ggml_matrix(rng: np.random.Generator, rows: int, cols: int, qname: str, rms: float = 0.05) -> np.ndarray:
    """Random blocks of type qname (ggml_rows' bytes) with each block's fp16 scale set so its
    values have about the given root mean square: a weight matrix [rows, bytes per row] of a
    tiny model in a type the gguf package cannot quantize to."""
    raw, values = ggml_rows(rng, rows, cols, qname)
    qtype = gguf.GGMLQuantizationType[qname]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(rows, cols // block, size)
    now = np.sqrt((values.reshape(rows, cols // block, block).astype(np.float64) ** 2).mean(-1)) + 1e-30
    at = _SCALE_AT[qname]
    old = (blocks[..., 48:56].copy().view("<u2") >> 12 << np.arange(0, 16, 4)).sum(-1).astype("<u2").view("<f2") \
        if qname == "IQ1_M" else blocks[..., at:at + 2].copy().view("<f2")[..., 0]
    d = (old.astype(np.float64) * rms / now).astype("<f2").reshape(rows, cols // block, 1).view(np.uint8)
    if qname == "IQ1_M":
        set_iq1m_scale(blocks, d)
    else:
        blocks[..., at:at + 2] = d
    return blocks.reshape(rows, -1)


def ggml_rows(rng: np.random.Generator, rows: int, cols: int, qname: str) -> tuple[np.ndarray, np.ndarray]:
    """(raw ggml bytes [rows, bytes per row] as a GGUF file stores them, their float32 values) of a
    random [rows, cols] tensor in block type qname: quantized by the gguf package where it can, else
    random block bytes (K-quants, IQ4) with sane fp16 scales (random bytes may be inf/NaN). The same
    bytes on every host: the gguf package's are put in file order (ggml_file_order)."""
    qtype = gguf.GGMLQuantizationType[qname]
    if qname in _SCALE_AT or qname == "MXFP4":
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scale = rng.uniform(0.001, 0.05, (rows, cols // block, 2)).astype("<f2").view(np.uint8)
        if qname == "MXFP4":                                              # e8m0: 2^-10 .. 2^1
            raw[..., 0] = rng.integers(117, 129, (rows, cols // block), dtype=np.uint8)
        elif qname == "IQ1_M":                                            # d in the top nibbles of 4 u16
            set_iq1m_scale(raw, scale[..., 0:2])
        elif qname in ("Q4_K", "Q5_K", "Q2_K"):
            at = _SCALE_AT[qname]
            raw[..., at:at + 4] = scale.reshape(rows, cols // block, 4)  # d, dmin
        else:
            at = _SCALE_AT[qname]
            raw[..., at:at + 2] = scale[..., 0:2]                         # d
        raw = raw.reshape(rows, -1)
    else:
        raw = ggml_file_order(gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype), qname)
    return raw, gguf.quants.dequantize(ggml_file_order(raw, qname), qtype).astype(np.float32)


# ---- GGUF files ------------------------------------------------------------------------


def add_gguf_metadata(w, meta: dict) -> None:
    """Each key of meta into the GGUFWriter w, typed by its Python value (bool, int as uint32,
    float as float32, str, else an array)."""
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, object]], arch: str = "llama",
                meta: dict | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    add_gguf_metadata(w, meta or {})
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of q/k rows (the inverse of the loader's)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _moe_gguf(cfg: dict, sd: dict, arch: str, tensors: dict, meta: dict) -> None:
    """A mixture of experts' llama.cpp tensors and metadata: each layer's experts stacked into
    ffn_gate_exps / ffn_up_exps [X, F, E] and ffn_down_exps [X, E, F], the router as
    ffn_gate_inp, the shared expert as ffn_*_shexp with ffn_gate_inp_shexp [E]."""
    num = cfg.get("num_experts") or cfg["num_local_experts"]
    mixtral = cfg["architectures"][0] == "MixtralForCausalLM"
    block, (g, u, d) = ("block_sparse_moe", ("w1", "w3", "w2")) if mixtral else ("mlp", ("gate_proj", "up_proj", "down_proj"))
    for i in range(cfg["num_hidden_layers"]):
        m = f"model.layers.{i}.{block}."
        tensors[f"blk.{i}.ffn_gate_inp.weight"] = sd[m + "gate.weight"]
        for ours, theirs in (("ffn_gate_exps", g), ("ffn_up_exps", u), ("ffn_down_exps", d)):
            tensors[f"blk.{i}.{ours}.weight"] = np.stack([sd[f"{m}experts.{j}.{theirs}.weight"] for j in range(num)])
        if cfg.get("shared_expert_intermediate_size"):
            for ours, theirs in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"),
                                 ("ffn_down_shexp", "down_proj")):
                tensors[f"blk.{i}.{ours}.weight"] = sd[f"{m}shared_expert.{theirs}.weight"]
            tensors[f"blk.{i}.ffn_gate_inp_shexp.weight"] = sd[m + "shared_expert_gate.weight"].reshape(-1)
    meta.update({f"{arch}.expert_count": num, f"{arch}.expert_used_count": cfg["num_experts_per_tok"]})
    if not mixtral:
        meta[f"{arch}.expert_feed_forward_length"] = cfg["moe_intermediate_size"]
        meta[f"{arch}.expert_weights_norm"] = bool(cfg["norm_topk_prob"])
    if cfg.get("shared_expert_intermediate_size"):
        meta[f"{arch}.expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]


def _gpt_oss_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict) -> None:
    """gpt-oss as llama.cpp's converter writes it: post_attention_norm for the MLP's norm,
    attn_sinks, the router (with its bias) as ffn_gate_inp, the interleaved gate_up_proj [X, E,
    2F] split into ffn_gate_exps / ffn_up_exps [X, F, E] (biases [X, F]), down_proj [X, F, E]
    as ffn_down_exps [X, E, F] (bias [X, E]); YaRN and the window in the metadata."""
    rope = cfg["rope_parameters"]
    for i in range(cfg["num_hidden_layers"]):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        tensors[b + "post_attention_norm.weight"] = tensors.pop(b + "ffn_norm.weight")
        tensors[b + "attn_sinks.weight"] = sd[h + "self_attn.sinks"]
        tensors[b + "ffn_gate_inp.weight"] = sd[h + "mlp.router.weight"]
        tensors[b + "ffn_gate_inp.bias"] = sd[h + "mlp.router.bias"]
        gate_up, bias = sd[h + "mlp.experts.gate_up_proj"], sd[h + "mlp.experts.gate_up_proj_bias"]
        tensors[b + "ffn_gate_exps.weight"] = gate_up[:, :, 0::2].transpose(0, 2, 1)
        tensors[b + "ffn_up_exps.weight"] = gate_up[:, :, 1::2].transpose(0, 2, 1)
        tensors[b + "ffn_gate_exps.bias"], tensors[b + "ffn_up_exps.bias"] = bias[:, 0::2], bias[:, 1::2]
        tensors[b + "ffn_down_exps.weight"] = sd[h + "mlp.experts.down_proj"].transpose(0, 2, 1)
        tensors[b + "ffn_down_exps.bias"] = sd[h + "mlp.experts.down_proj_bias"]
    arch = "gpt-oss"
    meta.update({f"{arch}.expert_count": cfg["num_local_experts"], f"{arch}.expert_used_count": cfg["num_experts_per_tok"],
                 f"{arch}.expert_feed_forward_length": cfg["intermediate_size"],
                 f"{arch}.attention.sliding_window": cfg["sliding_window"], f"{arch}.rope.scaling.type": "yarn",
                 f"{arch}.rope.scaling.factor": float(rope["factor"]),
                 f"{arch}.rope.scaling.original_context_length": rope["original_max_position_embeddings"]})


def _lfm2_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict) -> None:
    """llama.cpp's "lfm2" graph as its converter writes it: the final norm as token_embd_norm,
    head_count_kv per layer (0: a conv layer), the conv taps squeezed to [E, L], the MLP's width
    after transformers' adjustment, q/k as in the checkpoint."""
    ff = cfg["intermediate_size"]
    if cfg.get("block_auto_adjust_ff_dim"):
        ff = int(2 * ff / 3)
        if cfg.get("block_ffn_dim_multiplier") is not None:
            ff = int(cfg["block_ffn_dim_multiplier"] * ff)
            step = cfg["block_multiple_of"]
            ff = step * ((ff + step - 1) // step)
    kv = cfg["num_key_value_heads"]
    meta.update({"lfm2.feed_forward_length": ff, "lfm2.shortconv.l_cache": cfg["conv_L_cache"],
                 "lfm2.vocab_size": cfg["vocab_size"],
                 "lfm2.attention.head_count_kv": [0 if t == "conv" else kv for t in cfg["layer_types"]]})
    tensors["token_embd_norm.weight"] = sd["model.embedding_norm.weight"]
    names = {"attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "attn_output": "self_attn.out_proj",
             "attn_q_norm": "self_attn.q_layernorm", "attn_k_norm": "self_attn.k_layernorm",
             "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
             "shortconv.in_proj": "conv.in_proj", "shortconv.out_proj": "conv.out_proj", "shortconv.conv": "conv.conv"}
    for i in range(cfg["num_hidden_layers"]):
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                t = sd.get(f"model.layers.{i}.{theirs}.{part}")
                if t is not None:
                    tensors[f"blk.{i}.{ours}.{part}"] = t[:, 0] if ours == "shortconv.conv" and part == "weight" else t


def _granitehybrid_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict) -> None:
    """Granite 4.0-H as llama.cpp's converter writes it ("granitehybrid"): head_count_kv per layer
    (0: a Mamba2 layer), the mixer as ssm_in, ssm_conv1d [Cd, L], ssm_dt.bias, ssm_a = -exp(A_log)
    and ssm_d as [H, 1], ssm_norm as [G, Di / G], ssm_out; the fused SwiGLUs split into gate and
    up (the experts as ffn_*_exps beside the shared ffn_*_shexp; the dense models' shared MLP as
    ffn_gate / ffn_up / ffn_down); RoPE switched by rope.scaling.finetuned."""
    a, n, E = "granitehybrid", cfg["num_hidden_layers"], cfg["hidden_size"]
    X, F, Fs = cfg["num_local_experts"], cfg["intermediate_size"], cfg["shared_intermediate_size"]
    H, G, Di = cfg["mamba_n_heads"], cfg["mamba_n_groups"], cfg["mamba_expand"] * E
    mamba = [t in ("mamba", "linear_attention") for t in cfg["layer_types"]]
    for i in range(n):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        if mamba[i]:
            _mamba2_gguf(sd, h + "mamba.", b, H, G, Di, tensors)
        shared = sd[h + "shared_mlp.input_linear.weight"]
        sh = "_shexp" if X else ""
        tensors[f"{b}ffn_gate{sh}.weight"], tensors[f"{b}ffn_up{sh}.weight"] = shared[:Fs], shared[Fs:]
        tensors[f"{b}ffn_down{sh}.weight"] = sd[h + "shared_mlp.output_linear.weight"]
        if X:
            moe = h + "block_sparse_moe."
            tensors[b + "ffn_gate_inp.weight"] = sd[moe + "router.layer.weight"]
            gate_up = sd[moe + "input_linear.weight"]
            tensors[b + "ffn_gate_exps.weight"], tensors[b + "ffn_up_exps.weight"] = gate_up[:, :F], gate_up[:, F:]
            tensors[b + "ffn_down_exps.weight"] = sd[moe + "output_linear.weight"]
    meta.update({f"{a}.attention.head_count_kv": [0 if m else cfg["num_key_value_heads"] for m in mamba],
                 f"{a}.feed_forward_length": F if X else Fs, f"{a}.vocab_size": cfg["vocab_size"],
                 f"{a}.ssm.conv_kernel": cfg["mamba_d_conv"], f"{a}.ssm.state_size": cfg["mamba_d_state"],
                 f"{a}.ssm.group_count": G, f"{a}.ssm.inner_size": Di, f"{a}.ssm.time_step_rank": H,
                 f"{a}.rope.scaling.finetuned": cfg.get("position_embedding_type") == "rope",
                 f"{a}.embedding_scale": float(cfg["embedding_multiplier"]),
                 f"{a}.residual_scale": float(cfg["residual_multiplier"]),
                 f"{a}.attention.scale": float(cfg["attention_multiplier"]),
                 f"{a}.logit_scale": float(cfg["logits_scaling"])})
    if X:
        meta.update({f"{a}.expert_count": X, f"{a}.expert_used_count": cfg["num_experts_per_tok"],
                     f"{a}.expert_shared_feed_forward_length": Fs})


def _bamba_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict) -> None:
    """Bamba as llama.cpp's converter writes it (its GraniteHybridModel, "granitehybrid"): the
    Mamba2 layers as Granite 4.0-H's, the attention layers' q/k permuted over whole heads as for
    Llama, the dense SwiGLU as ffn_gate / ffn_up / ffn_down, RoPE on (rope.scaling.finetuned,
    written true for Bamba alone among the hybrids), rope.dimension_count attn_rotary_emb where
    the config has it (the released checkpoints: half a head) else the whole head, none of
    Granite's multipliers, no key_length (Granite's conversion drops head_dim)."""
    a, n, E = "granitehybrid", cfg["num_hidden_layers"], cfg["hidden_size"]
    H, G, Di = cfg["mamba_n_heads"], cfg["mamba_n_groups"], cfg["mamba_expand"] * E
    attn = set(cfg["attn_layer_indices"])
    for i in range(n):
        if i not in attn:
            _mamba2_gguf(sd, f"model.layers.{i}.mamba.", f"blk.{i}.", H, G, Di, tensors)
    del meta[f"{a}.attention.key_length"], meta[f"{a}.attention.value_length"]
    meta.update({f"{a}.attention.head_count_kv": [cfg["num_key_value_heads"] if i in attn else 0 for i in range(n)],
                 f"{a}.vocab_size": cfg["vocab_size"], f"{a}.ssm.conv_kernel": cfg["mamba_d_conv"],
                 f"{a}.ssm.state_size": cfg["mamba_d_state"], f"{a}.ssm.group_count": G, f"{a}.ssm.inner_size": Di,
                 f"{a}.ssm.time_step_rank": H, f"{a}.rope.scaling.finetuned": True,
                 f"{a}.rope.dimension_count": cfg.get("attn_rotary_emb") or E // cfg["num_attention_heads"]})


def _qwen3next_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict, split_qkvz: bool = True) -> None:
    """Qwen3-Next as llama.cpp's converter writes it ("qwen3next"): every (1 + w) norm stored with
    its + 1 (the DeltaNet's gated norm as it is), the MLP's norm as post_attention_norm, the
    attention's q_proj (each head's query, then its gate) as attn_q; a DeltaNet layer's
    in_proj_qkvz cut into attn_qkv (q, k, v of all heads) and attn_gate (z) (split_qkvz; earlier
    converters: whole, interleaved per key head, as ssm_in), in_proj_ba as ssm_ba, the conv taps
    [Cd, L], ssm_a = -exp(A_log), ssm_dt.bias, ssm_norm, ssm_out; the layer kinds as
    full_attention_interval, RoPE over rope.dimension_count of each head; the experts as moe."""
    a, E = "qwen3next", cfg["hidden_size"]
    Hk, Hv, Dk, Dv = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                      cfg["linear_value_head_dim"])
    r = Hv // Hk
    for name in [k for k in tensors if k.endswith("ffn_norm.weight")]:
        tensors[name.replace("ffn_norm", "post_attention_norm")] = tensors.pop(name)
    for name in tensors:
        if name == "output_norm.weight" or name.endswith(("attn_norm.weight", "post_attention_norm.weight",
                                                          "attn_q_norm.weight", "attn_k_norm.weight")):
            tensors[name] = tensors[name] + 1
    for i, kind in enumerate(cfg["layer_types"]):
        m, b = f"model.layers.{i}.linear_attn.", f"blk.{i}."
        if kind != "linear_attention":
            continue
        qkvz = sd[m + "in_proj_qkvz.weight"]
        if split_qkvz:
            q, k, v, z = np.split(qkvz.reshape(Hk, 2 * Dk + 2 * r * Dv, E), [Dk, 2 * Dk, 2 * Dk + r * Dv], axis=1)
            tensors[b + "attn_qkv.weight"] = np.concatenate([t.reshape(-1, E) for t in (q, k, v)])
            tensors[b + "attn_gate.weight"] = z.reshape(-1, E)
        else:
            tensors[b + "ssm_in.weight"] = qkvz
        tensors[b + "ssm_ba.weight"] = sd[m + "in_proj_ba.weight"]
        tensors[b + "ssm_conv1d.weight"] = sd[m + "conv1d.weight"][:, 0]
        tensors[b + "ssm_a"] = -np.exp(sd[m + "A_log"].astype(np.float32))
        tensors[b + "ssm_dt.bias"] = sd[m + "dt_bias"]
        tensors[b + "ssm_norm.weight"] = sd[m + "norm.weight"]
        tensors[b + "ssm_out.weight"] = sd[m + "out_proj.weight"]
    rope = cfg["rope_parameters"]
    meta.update({f"{a}.ssm.conv_kernel": cfg["linear_conv_kernel_dim"], f"{a}.ssm.state_size": Dk,
                 f"{a}.ssm.group_count": Hk, f"{a}.ssm.time_step_rank": Hv, f"{a}.ssm.inner_size": Hv * Dv,
                 f"{a}.full_attention_interval": cfg["full_attention_interval"],
                 f"{a}.rope.dimension_count": int(cfg["head_dim"] * rope.get("partial_rotary_factor", 0.25))})


def _mamba2_gguf(sd: dict, m: str, b: str, H: int, G: int, Di: int, tensors: dict) -> None:
    """A Mamba2 mixer's tensors (HF prefix m) as llama.cpp's converter writes them into block b:
    ssm_in / ssm_conv1d (taps only) / ssm_out, ssm_dt's bias, ssm_a = -exp(A_log), ssm_d, and the
    gated norm's weight per group."""
    for ours, theirs in (("ssm_in", "in_proj"), ("ssm_conv1d", "conv1d"), ("ssm_out", "out_proj")):
        for part in ("weight", "bias"):
            if f"{m}{theirs}.{part}" in sd:
                t = sd[f"{m}{theirs}.{part}"]
                tensors[f"{b}{ours}.{part}"] = t[:, 0] if ours == "ssm_conv1d" and part == "weight" else t
    tensors[b + "ssm_dt.bias"] = sd[m + "dt_bias"]
    tensors[b + "ssm_a"] = -np.exp(sd[m + "A_log"].astype(np.float32)).reshape(H, 1)
    tensors[b + "ssm_d"] = sd[m + "D"].reshape(H, 1)
    tensors[b + "ssm_norm.weight"] = sd[m + "norm.weight"].reshape(G, Di // G)


def _nemotron_h_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict, a: str = "nemotron_h",
                     moe_latent_size: int | None = None) -> None:
    """Nemotron-H as llama.cpp's converter writes it ("nemotron_h"): a GGUF block per block, each
    with its attn_norm; head_count_kv and feed_forward_length per block (both 0: Mamba2); the
    Mamba2 tensors as for "granitehybrid" (ssm_inner_size H P), the MLP's ffn_up / ffn_down, q/k
    permuted. With experts ("nemotron_h_moe", its NemotronHModel with is_moe): an expert block's
    feed_forward_length moe_intermediate_size, its router ffn_gate_inp, exp_probs_b.bias, the
    experts stacked as ffn_up_exps / ffn_down_exps, the shared MLP ffn_up_shexp / ffn_down_shexp,
    and the routing fields the converter writes (no expert_group_used_count); moe_latent_size: that
    key written as well (the field alone, without the latent tensors)."""
    types = cfg["layers_block_type"]
    H, G, Di = cfg["mamba_num_heads"], cfg["n_groups"], cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    for i, kind in enumerate(types):
        h, b = f"backbone.layers.{i}.", f"blk.{i}."
        tensors[b + "attn_norm.weight"] = sd[h + "norm.weight"]
        m = h + "mixer."
        if kind == "linear_attention":
            _mamba2_gguf(sd, m, b, H, G, Di, tensors)
        elif kind == "full_attention":
            for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                t = sd[f"{m}{theirs}.weight"]
                heads = cfg["num_attention_heads"] if ours == "attn_q" else cfg["num_key_value_heads"]
                tensors[f"{b}{ours}.weight"] = _permute_qk(t, heads) if ours in ("attn_q", "attn_k") else t
        elif kind == "moe":
            X = cfg["n_routed_experts"]
            tensors[b + "ffn_gate_inp.weight"] = sd[m + "gate.weight"]
            tensors[b + "exp_probs_b.bias"] = sd[m + "gate.e_score_correction_bias"]
            for ours, theirs in (("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                tensors[f"{b}{ours}_exps.weight"] = np.stack([sd[f"{m}experts.{j}.{theirs}.weight"] for j in range(X)])
                tensors[f"{b}{ours}_shexp.weight"] = sd[f"{m}shared_experts.{theirs}.weight"]
        else:
            for ours, theirs in (("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                for part in ("weight", "bias"):
                    if f"{m}{theirs}.{part}" in sd:
                        tensors[f"{b}{ours}.{part}"] = sd[f"{m}{theirs}.{part}"]
    if "moe" in types:
        meta.update({f"{a}.expert_count": cfg["n_routed_experts"], f"{a}.expert_used_count": cfg["num_experts_per_tok"],
                     f"{a}.expert_feed_forward_length": cfg["moe_intermediate_size"],
                     f"{a}.expert_shared_feed_forward_length": cfg["moe_shared_expert_intermediate_size"],
                     f"{a}.expert_shared_count": cfg["n_shared_experts"],
                     f"{a}.expert_weights_norm": bool(cfg["norm_topk_prob"]),
                     f"{a}.expert_weights_scale": float(cfg["routed_scaling_factor"]),
                     f"{a}.expert_group_count": cfg["n_group"]})
    if moe_latent_size:
        meta[f"{a}.moe_latent_size"] = moe_latent_size
    widths = {"mlp": cfg["intermediate_size"], "moe": cfg.get("moe_intermediate_size")}
    meta.update({f"{a}.attention.head_count_kv": [cfg["num_key_value_heads"] if t == "full_attention" else 0 for t in types],
                 f"{a}.feed_forward_length": [widths.get(t, 0) for t in types],
                 f"{a}.vocab_size": cfg["vocab_size"], f"{a}.ssm.conv_kernel": cfg["conv_kernel"],
                 f"{a}.ssm.state_size": cfg["ssm_state_size"], f"{a}.ssm.group_count": G,
                 f"{a}.ssm.inner_size": Di, f"{a}.ssm.time_step_rank": H,
                 f"{a}.attention.layer_norm_epsilon": float(cfg["layer_norm_epsilon"])})   # llama.cpp reads both


def _falcon_h1_sd(cfg: dict, sd: dict) -> dict:
    """Falcon-H1's tensors as llama.cpp's converter prepares them ("falcon-h1"): every µP
    multiplier folded into the weights (biases too, where transformers scales a projection's
    output; the embeddings' into token_embd, the logits' into an output matrix written even for
    a tied head), renamed for the Llama names gguf_from_hf maps."""
    E, H, G, N = cfg["hidden_size"], cfg["mamba_n_heads"], cfg["mamba_n_groups"], cfg["mamba_d_state"]
    Di = cfg.get("mamba_d_ssm") or cfg["mamba_expand"] * E
    mup = np.repeat(np.float32(cfg["ssm_multipliers"]), (Di, Di, G * N, G * N, H))
    gate, down = cfg["mlp_multipliers"]
    a_in, key = cfg["attention_in_multiplier"], cfg["key_multiplier"]
    out = {"lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]) * np.float32(cfg["lm_head_multiplier"])}
    for name, t in sd.items():
        t = t.astype(np.float32)
        scale = {"mamba.in_proj.weight": mup[:, None] * cfg["ssm_in_multiplier"], "mamba.in_proj.bias": mup,
                 "mamba.out_proj.weight": cfg["ssm_out_multiplier"], "mamba.out_proj.bias": cfg["ssm_out_multiplier"],
                 "self_attn.q_proj.weight": a_in, "self_attn.k_proj.weight": a_in * key, "self_attn.k_proj.bias": key,
                 "self_attn.v_proj.weight": a_in, "self_attn.o_proj.weight": cfg["attention_out_multiplier"],
                 "self_attn.o_proj.bias": cfg["attention_out_multiplier"], "feed_forward.gate_proj.weight": gate,
                 "feed_forward.gate_proj.bias": gate, "feed_forward.down_proj.weight": down,
                 "feed_forward.down_proj.bias": down, "model.embed_tokens.weight": cfg["embedding_multiplier"]}
        for suffix, s in scale.items():
            if name.endswith(suffix):
                t = t * np.float32(s)
        if name != "lm_head.weight":
            out[name.replace("model.final_layernorm.", "model.norm.").replace("pre_ff_layernorm", "post_attention_layernorm")
                .replace("feed_forward.", "mlp.")] = t
    return out


def _falcon_h1_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict) -> None:
    """Falcon-H1's Mamba2 tensors beside each block's attention (as for "granitehybrid", without
    ssm_norm when the model has no gated norm) and its SSM metadata."""
    a, E, H, G = "falcon-h1", cfg["hidden_size"], cfg["mamba_n_heads"], cfg["mamba_n_groups"]
    Di = cfg.get("mamba_d_ssm") or cfg["mamba_expand"] * E
    for i in range(cfg["num_hidden_layers"]):
        m, b = f"model.layers.{i}.mamba.", f"blk.{i}."
        _mamba2_gguf({m + "norm.weight": np.ones(Di, np.float32), **sd}, m, b, H, G, Di, tensors)
        if m + "norm.weight" not in sd:   # mamba_rms_norm false: y * silu(z), no ssm_norm
            del tensors[b + "ssm_norm.weight"]
        tensors[b + "ffn_norm"] = tensors.pop(b + "ffn_norm.weight")   # llama.cpp's name, no ".weight"
    meta.update({f"{a}.vocab_size": cfg["vocab_size"], f"{a}.ssm.conv_kernel": cfg["mamba_d_conv"],
                 f"{a}.ssm.state_size": cfg["mamba_d_state"], f"{a}.ssm.group_count": G, f"{a}.ssm.inner_size": Di,
                 f"{a}.ssm.time_step_rank": H})


def _deepseek2_gguf(cfg: dict, sd: dict, tensors: dict, meta: dict, split_kv_b: bool = True) -> None:
    """DeepSeek-V2 / V3 as llama.cpp's converter writes them ("deepseek2"): the latent
    projections under their names, kv_b_proj split into attn_k_b [H, r, dn] (W_UK transposed)
    and attn_v_b [H, dv, r] (split_kv_b; else whole as attn_kv_b), the experts stacked, the
    correction bias as exp_probs_b, the widths, routing and YaRN's mscale in the metadata."""
    arch, H = "deepseek2", cfg["num_attention_heads"]
    r, dr, dn, dv, ql = (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"],
                         cfg.get("q_lora_rank"))
    num, v3 = cfg["n_routed_experts"], cfg["architectures"][0] == "DeepseekV3ForCausalLM"
    for i in range(cfg["num_hidden_layers"]):
        a, m, b = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"blk.{i}."
        tensors[b + "attn_kv_a_mqa.weight"] = sd[a + "kv_a_proj_with_mqa.weight"]
        tensors[b + "attn_kv_a_norm.weight"] = sd[a + "kv_a_layernorm.weight"]
        if ql:
            tensors[b + "attn_q_a.weight"] = sd[a + "q_a_proj.weight"]
            tensors[b + "attn_q_a_norm.weight"] = sd[a + "q_a_layernorm.weight"]
            tensors[b + "attn_q_b.weight"] = sd[a + "q_b_proj.weight"]
        kv_b = sd[a + "kv_b_proj.weight"]
        if split_kv_b:
            heads = kv_b.reshape(H, dn + dv, r)
            tensors[b + "attn_k_b.weight"] = np.ascontiguousarray(heads[:, :dn].transpose(0, 2, 1))
            tensors[b + "attn_v_b.weight"] = np.ascontiguousarray(heads[:, dn:])
        else:
            tensors[b + "attn_kv_b.weight"] = kv_b
        if i < cfg["first_k_dense_replace"]:
            continue
        tensors[b + "ffn_gate_inp.weight"] = sd[m + "gate.weight"]
        for ours, theirs in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
            tensors[b + ours + ".weight"] = np.stack([sd[f"{m}experts.{j}.{theirs}.weight"] for j in range(num)])
            tensors[b + ours.replace("exps", "shexp") + ".weight"] = sd[f"{m}shared_experts.{theirs}.weight"]
        if v3:
            tensors[b + "exp_probs_b.bias"] = sd[m + "gate.e_score_correction_bias"]
    grouped = v3 or cfg.get("topk_method") == "group_limited_greedy"
    meta.update({f"{arch}.attention.head_count_kv": 1, f"{arch}.attention.kv_lora_rank": r,
                 f"{arch}.attention.key_length": r + dr, f"{arch}.attention.value_length": r,
                 f"{arch}.attention.key_length_mla": dn + dr, f"{arch}.attention.value_length_mla": dv,
                 f"{arch}.rope.dimension_count": dr, f"{arch}.leading_dense_block_count": cfg["first_k_dense_replace"],
                 f"{arch}.expert_count": num, f"{arch}.expert_used_count": cfg["num_experts_per_tok"],
                 f"{arch}.expert_feed_forward_length": cfg["moe_intermediate_size"],
                 f"{arch}.expert_shared_count": cfg["n_shared_experts"],
                 f"{arch}.expert_weights_scale": float(cfg["routed_scaling_factor"]),
                 f"{arch}.expert_weights_norm": bool(cfg["norm_topk_prob"]),
                 f"{arch}.expert_gating_func": 2 if v3 else 1,
                 f"{arch}.expert_group_count": cfg["n_group"] if grouped else 1,
                 f"{arch}.expert_group_used_count": cfg["topk_group"] if grouped else 1})
    meta[f"{arch}.attention.q_lora_rank"] = ql or 0     # 0: q_proj (llama.cpp wants the key either way)
    rope = cfg["rope_parameters"]
    if rope.get("rope_type") == "yarn":
        meta.update({f"{arch}.rope.scaling.type": "yarn", f"{arch}.rope.scaling.factor": float(rope["factor"]),
                     f"{arch}.rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                     f"{arch}.rope.scaling.yarn_log_multiplier": 0.1 * float(rope["mscale_all_dim"])})


def gguf_from_hf(ckpt: Path, out: Path, arch: str, block_type: str | None = None, **writer: Any) -> Path:
    """Write the tiny HF checkpoint as a llama.cpp-style F32 GGUF (q/k permuted for "llama";
    Gemma's norm weights stored with their + 1, as llama.cpp's converter writes them; a
    mixture of experts with 3-D expert tensors: arch "qwen3moe", "qwen2moe", or "llama" for
    Mixtral; "gpt_oss" or "gpt-oss": llama.cpp's "gpt-oss" graph; "granitehybrid" of a Bamba
    checkpoint: Bamba's file; writer: the family writer's options). block_type: every matrix
    (embedding, output and 3-D experts included; not the routers, nor rows that are not whole
    32-value blocks) quantized to that ggml type by the gguf package instead, or
    for the codebook types (which it cannot quantize) replaced by random blocks of that type
    (random_ggml_matrix) (types llama.cpp's quantizer does not write for dense models: MXFP4)."""
    arch = "gpt-oss" if arch == "gpt_oss" else arch     # llama.cpp's graph name
    cfg = json.loads((ckpt / "config.json").read_text())
    sd = load_file(str(ckpt / "model.safetensors"))
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    if arch in ("nemotron_h", "nemotron_h_moe"):   # its names and fields as the shared code below reads them
        sd = {k.replace("backbone.embeddings.", "model.embed_tokens.").replace("backbone.norm_f.", "model.norm."): v
              for k, v in sd.items()}
        cfg = dict(cfg, num_hidden_layers=len(cfg["layers_block_type"]), rms_norm_eps=cfg["layer_norm_epsilon"],
                   rope_parameters={"rope_theta": 10000.0})
    bamba = cfg["architectures"][0] == "BambaForCausalLM"
    if bamba:   # its names as the shared code below reads them
        sd = {k.replace("model.final_layernorm.", "model.norm.").replace(".pre_ff_layernorm.", ".post_attention_layernorm.")
              .replace(".feed_forward.", ".mlp."): v for k, v in sd.items()}
    if arch == "falcon-h1":
        sd = _falcon_h1_sd(cfg, sd)
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    if arch != "lfm2":
        tensors["output_norm.weight"] = sd["model.norm.weight"]
    if "lm_head.weight" in sd:
        tensors["output.weight"] = sd["lm_head.weight"]
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    gemma = arch.startswith("gemma")
    if arch == "phi3":   # fused projections, as llama.cpp keeps them
        names.update(attn_qkv="self_attn.qkv_proj", ffn_up="mlp.gate_up_proj")
    if gemma:
        names.update(post_attention_norm="post_attention_layernorm", ffn_norm="pre_feedforward_layernorm",
                     post_ffw_norm="post_feedforward_layernorm")
        tensors["output_norm.weight"] = tensors["output_norm.weight"] + 1
    for i in range(cfg["num_hidden_layers"]):
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                key = f"model.layers.{i}.{theirs}.{part}"
                if key in sd:
                    t = sd[key]
                    if arch in ("llama", "granite", "granitehybrid") and ours in ("attn_q", "attn_k"):
                        t = _permute_qk(t, H if ours == "attn_q" else Hkv)
                    if gemma and ours.endswith("norm"):
                        t = t + 1
                    tensors[f"blk.{i}.{ours}.{part}"] = t
    rope = cfg["rope_parameters"].get("full_attention", cfg["rope_parameters"])
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {a["content"]: a["id"] for a in tok["added_tokens"] if a.get("special", True)}
    user_defined = {a["content"] for a in tok["added_tokens"] if not a.get("special", True)}
    tokens = [t for t, _ in vocab]
    meta = {f"{arch}.block_count": cfg["num_hidden_layers"], f"{arch}.context_length": cfg["max_position_embeddings"],
            f"{arch}.embedding_length": cfg["hidden_size"], f"{arch}.feed_forward_length": cfg["intermediate_size"],
            f"{arch}.attention.head_count": H, f"{arch}.attention.head_count_kv": Hkv,
            f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", cfg.get("norm_eps"))),
            f"{arch}.rope.freq_base": float(rope["rope_theta"]),
            f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2" if arch != "llama" else "smollm",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in specials else 4 if t in user_defined else 1 for t in tokens],
            "tokenizer.ggml.merges": [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]],
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.chat_template": (ckpt / "chat_template.jinja").read_text()}
    if rope.get("rope_type") == "longrope":   # llama.cpp: the factors as tensors, rot dims as dimension_count
        tensors["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
        original = rope["original_max_position_embeddings"]
        factor = cfg["max_position_embeddings"] / original
        meta.update({f"{arch}.rope.scaling.original_context_length": original,
                     f"{arch}.rope.scaling.attn_factor": float(np.sqrt(1 + np.log(factor) / np.log(original))),
                     f"{arch}.rope.dimension_count": int(head_dim * rope.get("partial_rotary_factor", 1.0))})
        del meta[f"{arch}.attention.key_length"], meta[f"{arch}.attention.value_length"]
    if rope.get("rope_type") == "linear":
        meta.update({f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": float(rope["factor"])})
    if arch == "granite":   # llama.cpp's names of the four multipliers
        meta.update({f"{arch}.embedding_scale": float(cfg["embedding_multiplier"]),
                     f"{arch}.residual_scale": float(cfg["residual_multiplier"]),
                     f"{arch}.attention.scale": float(cfg["attention_multiplier"]),
                     f"{arch}.logit_scale": float(cfg["logits_scaling"])})
    if arch == "gpt-oss":
        _gpt_oss_gguf(cfg, sd, tensors, meta)
    elif arch == "deepseek2":
        _deepseek2_gguf(cfg, sd, tensors, meta, **writer)
    elif arch == "lfm2":
        _lfm2_gguf(cfg, sd, tensors, meta)
    elif arch == "granitehybrid" and bamba:
        _bamba_gguf(cfg, sd, tensors, meta)
    elif arch == "granitehybrid":
        _granitehybrid_gguf(cfg, sd, tensors, meta)
    elif arch == "qwen3next":
        _moe_gguf(cfg, sd, arch, tensors, meta)
        _qwen3next_gguf(cfg, sd, tensors, meta, **writer)
    elif arch in ("nemotron_h", "nemotron_h_moe"):
        _nemotron_h_gguf(cfg, sd, tensors, meta, arch, **writer)
    elif arch == "falcon-h1":
        _falcon_h1_gguf(cfg, sd, tensors, meta)
    elif cfg.get("num_experts") or cfg.get("num_local_experts"):
        _moe_gguf(cfg, sd, arch, tensors, meta)
    if gemma:
        meta[f"{arch}.attention.sliding_window"] = cfg["sliding_window"]
        meta[f"{arch}.attention.sliding_window_pattern"] = [int(t == "sliding_attention") for t in cfg["layer_types"]]
        if "sliding_attention" in cfg["rope_parameters"]:
            meta[f"{arch}.rope.freq_base_swa"] = float(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
        for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(cap):
                meta[f"{arch}.{cap}"] = float(cfg[cap])
    rng = np.random.default_rng(0)

    def stored(name, v):
        qtype = gguf.GGMLQuantizationType[block_type] if block_type else None
        if block_type and v.ndim == 2:
            if not hasattr(gguf.quants._type_traits[qtype], "quantize_blocks") or block_type in CODEBOOK_TYPES:
                return random_ggml_matrix(rng, *v.shape, block_type), qtype
        if block_type and v.ndim >= 2 and v.shape[-1] % 32 == 0 and not name.endswith("ffn_gate_inp.weight") \
                and "norm" not in name:   # as llama.cpp's quantizer: the experts too, not the routers nor norms
            return gguf.quants.quantize(np.ascontiguousarray(v, np.float32), qtype), qtype
        return np.ascontiguousarray(v), None
    return write_gguf(out, {k: stored(k, v) for k, v in tensors.items()}, arch, meta)


# ---- LoRA adapters --------------------------------------------------------------------


def make_peft_adapter(base, out, r: int, alpha: float, targets, seed: int, rslora: bool = False):
    """A PEFT adapter of `base` with random A and B, saved to out (adapter_config.json +
    adapter_model.safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
                     use_rslora=rslora, lora_dropout=0.0)
    model = get_peft_model(model, cfg)
    with torch.no_grad():   # B of the size of A's effect, so an adapter moves logits clearly, not wildly
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(str(out))
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """Factory: tiny_checkpoint("llama", tie_word_embeddings=True) -> Path of a saved checkpoint."""
    return tiny_checkpoint_path
