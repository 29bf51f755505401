"""Parity with transformers on configs drawn by hypothesis over each family's config space, so
what passes is the family and not the one config a test picked: head dims (48 among them), GQA ratios (MQA to MHA, groups of 3), RoPE bases and scaling kinds, sliding
windows and layer patterns, tied and untied heads, activations, expert counts and top-k,
soft-caps, multipliers. Each drawn config becomes a tiny random checkpoint saved by
transformers' own classes; fp32 logits of a mixed batch of prompts within 1e-4 of
transformers (eager attention), and greedy tokens through the paged cache identical to its
generate().

A few examples per family with a fixed seed (derandomize) in the default run;
LITE_LLM_DRAWN_CONFIGS=N draws N random ones per family (e.g. 50 before a release).
Only configs the loader accepts are drawn: what it refuses is test_loader.py's."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import build_tiny_checkpoint, cache_dir
from test_parity import lite_logits, make_runner, paged_greedy, prompts_for

DRAWN = int(os.environ.get("LITE_LLM_DRAWN_CONFIGS") or 0)
DRAWN_SETTINGS = settings(max_examples=DRAWN or 2, derandomize=not DRAWN, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROMPT_LENS = [1, 6, 19, 33]
NEW_TOKENS = 8


def check_drawn(arch: str, overrides: dict, lens: list[int] = PROMPT_LENS, uncached: bool = False) -> None:
    """The drawn checkpoint against transformers: logits of `lens` prompts in one mixed batch,
    prefilled in one step and 5 tokens a step, then greedy decode of NEW_TOKENS after a
    9-token prompt (uncached: transformers' tokens each recomputed from the whole sequence
    instead of its generate(), where its cached decode step computes another function than its
    forward over the sequence)."""
    from transformers import AutoModelForCausalLM
    path = build_tiny_checkpoint(arch, cache_dir(f"drawn-{arch}-"), **overrides)
    runner, loaded = make_runner(path, num_blocks=48, max_tokens=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    prompts = prompts_for(loaded.config.vocab_size, lens, seed=len(lens))
    with torch.no_grad():
        want = [model(torch.tensor([p])).logits[0].numpy() for p in prompts]
    for chunk in (None, 5):
        for p, g, w in zip(prompts, lite_logits(runner, prompts, chunk), want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max(),
                                       err_msg=f"{arch} {overrides}: prompt of {len(p)}, chunks of {chunk}")
    prompt = prompts_for(loaded.config.vocab_size, [9], seed=9)[0]
    with torch.no_grad():
        if uncached:
            tokens = []
            for _ in range(NEW_TOKENS):
                tokens.append(int(model(torch.tensor([prompt + tokens])).logits[0, -1].argmax()))
        else:
            tokens = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert paged_greedy(runner, prompt, NEW_TOKENS)[0] == tokens, (arch, overrides)


# ---- the shared pieces of the spaces ------------------------------------------------------

@st.composite
def attention(draw, head_dims=(16, 32, 48, 64, 128), explicit_head_dim: bool = True) -> dict:
    """Heads, KV heads (MQA, GQA with groups of 2 or 3, MHA), head_dim, and a hidden size that
    is heads x head_dim or (explicit_head_dim) another multiple of the heads."""
    kv = draw(st.sampled_from([2, 1, 4]))
    heads = kv * draw(st.sampled_from([2, 1, 3]))
    head_dim = draw(st.sampled_from(head_dims))
    hidden = heads * head_dim
    if explicit_head_dim and draw(st.booleans()):   # transformers wants a multiple of the heads
        hidden = heads * draw(st.sampled_from([16, 8, 24, 32]))
    out = dict(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=hidden)
    if explicit_head_dim:
        out["head_dim"] = head_dim
    return out


def common(act=("silu", "gelu", "gelu_pytorch_tanh", "relu"), act_key: str = "hidden_act"):
    return st.fixed_dictionaries({
        "num_hidden_layers": st.integers(1, 3),
        "intermediate_size": st.sampled_from([96, 40, 128]),
        "tie_word_embeddings": st.booleans(),
        "rms_norm_eps": st.sampled_from([1e-5, 1e-6]),
        act_key: st.sampled_from(act),
    })


THETAS = st.sampled_from([10000.0, 500000.0, 1000000.0])


@st.composite
def llama_rope(draw) -> dict:
    """rope_parameters: default, linear, llama3 or yarn (the kinds Llama checkpoints carry)."""
    theta = draw(THETAS)
    kind = draw(st.sampled_from(["default", "linear", "llama3", "yarn"]))
    params = {"rope_type": kind, "rope_theta": theta}
    original = draw(st.sampled_from([32, 16, 64]))
    if kind == "linear":
        params["factor"] = draw(st.sampled_from([2.0, 4.0, 8.0]))
    elif kind == "llama3":
        params.update(factor=draw(st.sampled_from([8.0, 2.0, 32.0])), low_freq_factor=1.0,
                      high_freq_factor=draw(st.sampled_from([4.0, 2.0])), original_max_position_embeddings=original)
    elif kind == "yarn":
        params.update(factor=draw(st.sampled_from([4.0, 2.0, 8.0])), original_max_position_embeddings=original,
                      beta_fast=draw(st.sampled_from([32.0, 16.0])), beta_slow=draw(st.sampled_from([1.0, 2.0])),
                      truncate=draw(st.booleans()))
        if draw(st.booleans()):
            params["attention_factor"] = draw(st.sampled_from([1.3, 0.9]))
    return {"rope_theta": theta, "rope_parameters": params}


def merged(*parts) -> st.SearchStrategy:
    return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})


# ---- the families -------------------------------------------------------------------------

BIASES = st.fixed_dictionaries({"attention_bias": st.booleans(), "mlp_bias": st.booleans()})


@DRAWN_SETTINGS
@given(merged(attention(), common(), llama_rope(), BIASES))
def test_llama(overrides):
    check_drawn("llama", overrides)


@DRAWN_SETTINGS
@given(merged(attention(), common(), st.fixed_dictionaries({"rope_theta": THETAS,
                                                            "sliding_window": st.sampled_from([8, 3, 16, None])})))
def test_mistral(overrides):
    check_drawn("mistral", overrides)


@st.composite
def qwen_window(draw) -> dict:
    """use_sliding_window with max_window_layers: the layers from that index on are sliding."""
    if not draw(st.booleans()):
        return {"use_sliding_window": False}
    return {"use_sliding_window": True, "sliding_window": draw(st.sampled_from([8, 4])),
            "max_window_layers": draw(st.integers(0, 2))}


@DRAWN_SETTINGS
@given(merged(attention(), common(act=("silu",)), st.fixed_dictionaries({"rope_theta": THETAS}), qwen_window()))
def test_qwen2(overrides):
    check_drawn("qwen2", overrides)


@DRAWN_SETTINGS
@given(merged(attention(), common(act=("silu",)), st.fixed_dictionaries({"rope_theta": THETAS,
                                                                         "attention_bias": st.booleans()}),
              qwen_window()))
def test_qwen3(overrides):
    check_drawn("qwen3", overrides)


@st.composite
def experts(draw, count_key: str) -> dict:
    n = draw(st.sampled_from([8, 4, 16, 2]))
    return {count_key: n, "num_experts_per_tok": draw(st.integers(1, n))}


@DRAWN_SETTINGS
@given(merged(attention(), common(act=("silu",)), experts("num_experts"),
              st.fixed_dictionaries({"norm_topk_prob": st.booleans(), "moe_intermediate_size": st.sampled_from([32, 24]),
                                     "rope_theta": THETAS, "use_sliding_window": st.booleans(),
                                     "sliding_window": st.sampled_from([8, 4])})))
def test_qwen3_moe(overrides):
    check_drawn("qwen3_moe", overrides)


@DRAWN_SETTINGS
@given(merged(attention(), common(act=("silu",)), experts("num_local_experts"),
              st.fixed_dictionaries({"intermediate_size": st.sampled_from([64, 40]), "rope_theta": THETAS,
                                     "sliding_window": st.sampled_from([None, 8])})))
def test_mixtral(overrides):
    check_drawn("mixtral", overrides)


@DRAWN_SETTINGS
@given(merged(attention(), common(act=("silu",)), experts("num_experts"), qwen_window(),
              st.fixed_dictionaries({"norm_topk_prob": st.booleans(), "moe_intermediate_size": st.sampled_from([32, 24]),
                                     "shared_expert_intermediate_size": st.sampled_from([48, 16]),
                                     "rope_theta": THETAS})))
def test_qwen2_moe(overrides):
    check_drawn("qwen2_moe", overrides)


@st.composite
def layer_types(draw, n: int) -> list[str]:
    return draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=n, max_size=n))


@st.composite
def gemma2(draw) -> dict:
    out = draw(merged(attention(head_dims=(16, 32, 48, 256)), common(act=("gelu_pytorch_tanh",), act_key="hidden_activation")))
    out.update(layer_types=draw(layer_types(out["num_hidden_layers"])), sliding_window=draw(st.sampled_from([8, 4, 16])),
               query_pre_attn_scalar=draw(st.sampled_from([24, 16, 64])),
               attn_logit_softcapping=draw(st.sampled_from([0.1, None, 1.0, 50.0])),
               final_logit_softcapping=draw(st.sampled_from([2.0, None, 0.5, 30.0])),
               rope_theta=draw(THETAS))
    return out


@DRAWN_SETTINGS
@given(gemma2())
def test_gemma2(overrides):
    check_drawn("gemma2", overrides)


@st.composite
def gemma3(draw) -> dict:
    out = draw(merged(attention(head_dims=(16, 32, 48, 256)), common(act=("gelu_pytorch_tanh",), act_key="hidden_activation")))
    full = {"rope_type": "default", "rope_theta": draw(THETAS)}
    if draw(st.booleans()):
        full.update(rope_type="linear", factor=draw(st.sampled_from([8.0, 4.0])))
    out.update(layer_types=draw(layer_types(out["num_hidden_layers"])), sliding_window=draw(st.sampled_from([8, 4, 16])),
               query_pre_attn_scalar=draw(st.sampled_from([24, 16, 64])),
               attn_logit_softcapping=draw(st.sampled_from([None, 1.0])),
               final_logit_softcapping=draw(st.sampled_from([None, 2.0])),
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": draw(st.sampled_from([10000.0, 20000.0]))},
                                "full_attention": full})
    return out


@DRAWN_SETTINGS
@given(gemma3())
def test_gemma3(overrides):
    check_drawn("gemma3", overrides)


@st.composite
def phi3(draw) -> dict:
    """LongRoPE factors drawn per frequency pair, a short context below the prompts' lengths
    (long factors) or above them (short), partial rotary."""
    out = draw(merged(attention(head_dims=(16, 32, 48), explicit_head_dim=False), common(act=("silu",))))
    partial = draw(st.sampled_from([1.0, 0.5]))
    pairs = int(out["hidden_size"] // out["num_attention_heads"] * partial) // 2
    factors = st.lists(st.floats(1.0, 24.0, width=32), min_size=pairs, max_size=pairs)
    out.update(original_max_position_embeddings=draw(st.sampled_from([32, 16, 64])), partial_rotary_factor=partial,
               sliding_window=draw(st.sampled_from([None, 8])),
               rope_scaling={"rope_type": "longrope", "rope_theta": draw(THETAS), "short_factor": draw(factors),
                             "long_factor": draw(factors), "partial_rotary_factor": partial})
    return out


@DRAWN_SETTINGS
@given(phi3())
def test_phi3(overrides):
    check_drawn("phi3", overrides)


@DRAWN_SETTINGS
@given(merged(attention(), common(), st.fixed_dictionaries({
    "rope_theta": THETAS, "embedding_multiplier": st.sampled_from([6.0, 1.0, 12.0]),
    "residual_multiplier": st.sampled_from([0.4, 0.22, 1.0]), "attention_multiplier": st.sampled_from([0.09, 0.0078125, 0.25]),
    "logits_scaling": st.sampled_from([3.0, 1.0, 8.0])}), BIASES))
def test_granite(overrides):
    check_drawn("granite", overrides)


@st.composite
def granite_hybrid(draw) -> dict:
    """Granite 4.0-H: a pattern of Mamba2 and attention layers (both kinds present), Mamba2 heads,
    groups, state and conv taps, experts (0: the shared MLP alone) and their top-k, RoPE or no
    positions, the four multipliers."""
    n = draw(st.integers(2, 4))
    kinds = draw(st.lists(st.sampled_from(["mamba", "attention"]), min_size=n, max_size=n)
                 .filter(lambda t: "mamba" in t and "attention" in t))
    heads = draw(st.sampled_from([8, 4, 2]))
    experts = draw(st.sampled_from([4, 0, 8]))
    out = dict(num_hidden_layers=n, layer_types=kinds, mamba_n_heads=heads,
               mamba_n_groups=draw(st.sampled_from([g for g in (2, 1, 4) if heads % g == 0])),
               mamba_d_state=draw(st.sampled_from([16, 8, 32])), mamba_d_conv=draw(st.sampled_from([4, 2, 3])),
               mamba_chunk_size=draw(st.sampled_from([16, 8])), mamba_conv_bias=draw(st.booleans()),
               mamba_proj_bias=draw(st.booleans()), num_local_experts=experts,
               intermediate_size=draw(st.sampled_from([32, 24])), shared_intermediate_size=draw(st.sampled_from([48, 32])),
               position_embedding_type=draw(st.sampled_from(["nope", "rope"])),
               embedding_multiplier=draw(st.sampled_from([6.0, 1.0, 12.0])),
               residual_multiplier=draw(st.sampled_from([0.4, 0.22, 1.0])),
               attention_multiplier=draw(st.sampled_from([0.09, 0.0078125, 0.25])),
               logits_scaling=draw(st.sampled_from([3.0, 1.0, 8.0])), tie_word_embeddings=draw(st.booleans()),
               rms_norm_eps=draw(st.sampled_from([1e-5, 1e-6])))
    if experts:
        out["num_experts_per_tok"] = draw(st.integers(1, experts))
    return out


@DRAWN_SETTINGS
@given(merged(attention(head_dims=(16, 32, 48), explicit_head_dim=False), granite_hybrid()))
def test_granite_hybrid(overrides):
    check_drawn("granite_hybrid", overrides)


@st.composite
def nemotron_h(draw) -> dict:
    """Nemotron-H: a block pattern of Mamba2 ("M"), attention ("*"), MLP ("-") and expert ("E")
    blocks, each MLP or expert block after a mixer block (both mixers present; the dense MLP
    blocks before the first expert block), Mamba2 heads / head width / groups / state / taps,
    biases, the dt floor; the experts' count, groups and the best groups kept, top-k, widths,
    the shared MLP's width, the routed scale and renormalisation."""
    mixers = draw(st.lists(st.sampled_from("M*"), min_size=2, max_size=4).filter(lambda m: "M" in m and "*" in m))
    pattern = "".join(m + draw(st.sampled_from(["-", "", "E"])) for m in mixers)
    if "E" in pattern:   # dense MLP blocks after the first expert block become expert blocks
        first = pattern.index("E")
        pattern = pattern[:first] + pattern[first:].replace("-", "E")
    heads = draw(st.sampled_from([8, 4, 2]))
    out = {}
    if "E" in pattern:
        n = draw(st.sampled_from([4, 8, 6]))
        n_group = draw(st.sampled_from([g for g in (1, 2) if n // g >= 2]))
        topk_group = draw(st.integers(1, n_group))
        out = dict(n_routed_experts=n, n_group=n_group, topk_group=topk_group,
                   num_experts_per_tok=draw(st.integers(1, topk_group * n // n_group)),
                   moe_intermediate_size=draw(st.sampled_from([32, 48, 16])),
                   moe_shared_expert_intermediate_size=draw(st.sampled_from([48, 32, 16])),
                   routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])), norm_topk_prob=draw(st.booleans()))
    return dict(out, hybrid_override_pattern=pattern, mamba_num_heads=heads, mamba_head_dim=draw(st.sampled_from([16, 8, 24])),
                n_groups=draw(st.sampled_from([g for g in (2, 1, 4) if heads % g == 0])),
                ssm_state_size=draw(st.sampled_from([16, 8, 32])), conv_kernel=draw(st.sampled_from([4, 2, 3])),
                chunk_size=draw(st.sampled_from([16, 8])), use_conv_bias=draw(st.booleans()),
                use_bias=draw(st.booleans()), mlp_bias="E" not in pattern and draw(st.booleans()),
                time_step_min=draw(st.sampled_from([0.001, 0.7])), intermediate_size=draw(st.sampled_from([96, 40])),
                tie_word_embeddings=draw(st.booleans()), layer_norm_epsilon=draw(st.sampled_from([1e-5, 1e-6])))


@DRAWN_SETTINGS
@given(merged(attention(head_dims=(16, 32, 48)), nemotron_h()))
def test_nemotron_h(overrides):
    # transformers floors dt at time_step_min over a sequence but not in its one-token cached
    # step: its forward over the whole sequence is the reference (as for the prefill's logits)
    check_drawn("nemotron_h", overrides, uncached=True)


@st.composite
def falcon_h1(draw) -> dict:
    """Falcon-H1: Mamba2 heads / head width (the mixer's width mamba_d_ssm apart from hidden_size)
    / groups / state / taps, the gated norm (none, before or after the gate), the projections'
    biases, every µP multiplier (in_proj's five segments each its own)."""
    heads = draw(st.sampled_from([8, 4, 2]))
    d_head = draw(st.sampled_from([16, 8, 24]))
    mult = st.sampled_from([1.0, 0.5, 1.75, 3.0])
    return dict(mamba_n_heads=heads, mamba_d_head=d_head, mamba_d_ssm=heads * d_head,
                mamba_n_groups=draw(st.sampled_from([g for g in (2, 1, 4) if heads % g == 0])),
                mamba_d_state=draw(st.sampled_from([16, 8, 32])), mamba_d_conv=draw(st.sampled_from([4, 2, 3])),
                mamba_chunk_size=draw(st.sampled_from([16, 8])), mamba_conv_bias=draw(st.booleans()),
                mamba_proj_bias=draw(st.booleans()), projectors_bias=draw(st.booleans()),
                mamba_rms_norm=draw(st.booleans()), mamba_norm_before_gate=draw(st.booleans()),
                rope_parameters={"rope_type": "default", "rope_theta": draw(THETAS)},
                embedding_multiplier=draw(mult), lm_head_multiplier=draw(mult), key_multiplier=draw(mult),
                mlp_multipliers=[draw(mult), draw(mult)], attention_in_multiplier=draw(mult),
                attention_out_multiplier=draw(mult), ssm_multipliers=[draw(mult) for _ in range(5)],
                ssm_in_multiplier=draw(mult), ssm_out_multiplier=draw(mult))


@DRAWN_SETTINGS
@given(merged(attention(head_dims=(16, 32, 48)), common(act=("silu",)), BIASES, falcon_h1()))
def test_falcon_h1(overrides):
    check_drawn("falcon_h1", overrides)


@DRAWN_SETTINGS
@given(st.fixed_dictionaries({
    "num_attention_heads": st.sampled_from([4, 1, 2, 6]), "head_dim": st.sampled_from([16, 32, 48]),
    "ffn_dim": st.sampled_from([96, 40, 128]), "num_hidden_layers": st.integers(1, 3),
    "activation_function": st.sampled_from(["relu", "gelu", "gelu_new"]), "tie_word_embeddings": st.booleans()}))
def test_opt(overrides):
    """OPT's width is heads x head_dim (no separate head_dim field)."""
    overrides["hidden_size"] = overrides["word_embed_proj_dim"] = overrides.pop("head_dim") * overrides["num_attention_heads"]
    check_drawn("opt", overrides)


@st.composite
def qwen3_next(draw) -> dict:
    """Qwen3-Next: layer patterns of Gated DeltaNet and gated attention layers (one attention
    layer at least), key heads shared by 1-3 value heads, key / value head dims, conv taps,
    RoPE over a quarter, half or all of each head, experts with the shared expert."""
    out = draw(merged(attention(head_dims=(16, 32, 64)), common(act=("silu",)), experts("num_experts")))
    n = out["num_hidden_layers"]
    types = draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]), min_size=n, max_size=n))
    types[draw(st.integers(0, n - 1))] = "full_attention"
    hk = draw(st.sampled_from([1, 2, 4]))
    out.update(layer_types=types, linear_num_key_heads=hk, linear_num_value_heads=hk * draw(st.sampled_from([1, 2, 3])),
               linear_key_head_dim=draw(st.sampled_from([16, 8, 32])),
               linear_value_head_dim=draw(st.sampled_from([8, 16, 24])),
               linear_conv_kernel_dim=draw(st.sampled_from([4, 2, 3])), norm_topk_prob=draw(st.booleans()),
               moe_intermediate_size=draw(st.sampled_from([32, 24])),
               shared_expert_intermediate_size=draw(st.sampled_from([48, 16])),
               rope_parameters={"rope_type": "default", "rope_theta": draw(THETAS),
                                "partial_rotary_factor": draw(st.sampled_from([0.25, 0.5, 1.0]))})
    return out


@DRAWN_SETTINGS
@given(qwen3_next())
def test_qwen3_next(overrides):
    check_drawn("qwen3_next", overrides)


# ---- what the drawn configs found, each as its smallest case ------------------------------

@pytest.mark.parametrize("arch,max_window_layers", [("qwen2", 1), ("qwen2", 2), ("qwen3", 1), ("qwen2_moe", 1),
                                                    ("qwen2_moe", 3)])
def test_qwen_sliding_window_on_the_layers_max_window_layers_names(arch, max_window_layers):
    """use_sliding_window with max_window_layers: transformers slides the window on the
    layers from max_window_layers on (Qwen2, Qwen3), or on the even-numbered ones below it
    (Qwen2-MoE), and on no layer when none qualifies; every other layer attends fully.
    Prompts longer than the window of 4."""
    check_drawn(arch, {"num_hidden_layers": 3, "head_dim": 16, "use_sliding_window": True, "sliding_window": 4,
                       "max_window_layers": max_window_layers})


def test_gemma3_ignores_attn_logit_softcapping_as_transformers_does():
    """transformers' Gemma 3 keeps attn_logit_softcapping in its config but never caps the
    attention scores with it (Gemma 2 does; the released Gemma 3 configs set it null): a
    Gemma 3 config with a cap of 1.0, which would bite on these scores, gives uncapped logits."""
    check_drawn("gemma3", {"attn_logit_softcapping": 1.0})
