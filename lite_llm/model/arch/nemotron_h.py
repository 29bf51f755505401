"""Nemotron-H (HF NemotronHForCausalLM: Nemotron-H 8B / 47B, NVIDIA-Nemotron-Nano-9B-v2): a
stack of blocks, each one sub-layer x + mixer(rmsnorm(x)) whose mixer is a Mamba2 layer (Bamba's
mixer, bamba.py, with dt floored at time_step_min), attention without positions, or an ungated
MLP down(relu(up(x))^2); layers_block_type names them ("linear_attention", "full_attention",
"mlp"), or hybrid_override_pattern does ("M", "*", "-").

A mixer block and the MLP block after it are one layer here (its mixer, then its MLP); a mixer
block without one is a layer of ModelConfig.no_mlp_layers. Checkpoints name the model
"backbone." (NVIDIA's) or "model." (transformers 5), the embeddings "embeddings" and the final
norm "norm_f". Not supported: an MLP block that does not follow a mixer block.

Mixture-of-experts blocks ("moe", "E": Nemotron 3 Nano) follow a mixer block as an MLP block
does. Their router is DeepSeek-V3's (deepseek.py: sigmoid scores, e_score_correction_bias added
to the scores it chooses by, the best topk_group of n_group groups by their two best scores, top
num_experts_per_tok, renormalised when norm_topk_prob, x routed_scaling_factor); each of the
n_routed_experts is an ungated relu^2 MLP of moe_intermediate_size features, and one shared
relu^2 MLP of moe_shared_expert_intermediate_size features runs on every token, ungated
(transformers builds exactly one, whatever n_shared_experts says). They run on the engine's
ungated expert path (gated_mlp False: up, relu^2, down), each stored row read once. In a model
with experts the dense MLP blocks must all come before the first expert block (the engine runs
dense MLPs on the leading layers only). Not supported: moe_latent_size (the latent
projections around the experts, Nemotron 3 Super), biases on the MLPs of a model with experts.
Multi-token prediction layers (num_nextn_predict_layers) are not loaded.

llama.cpp's "nemotron_h" graph keeps one GGUF block per block: a Mamba2 block has 0 in both its
attention.head_count_kv and feed_forward_length entries (Granite 4.0-H's ssm_* tensors,
granite_hybrid.py), an attention block head_count_kv, an MLP block feed_forward_length (ffn_up,
ffn_down); each its attn_norm. It keeps no dt floor (time_step_min is not in the file), as
llama.cpp computes without one. A model with experts is a "nemotron_h_moe" file: an expert block
has feed_forward_length expert_feed_forward_length, the router ffn_gate_inp, exp_probs_b.bias,
ffn_up_exps [X, F, E], ffn_down_exps [X, E, F], the shared MLP ffn_up_shexp / ffn_down_shexp
(expert_shared_feed_forward_length), the routing in expert_count / expert_used_count /
expert_weights_norm / expert_weights_scale / expert_group_count (llama.cpp's graph routes by
sigmoid); moe_latent_size and the ffn_latent_down / ffn_latent_up tensors are refused.
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
import numpy as np

from lite_llm.model.arch import bamba, llama, moe
from lite_llm.model.arch.granite_hybrid import _qk_rows
from lite_llm.model.arch.lfm2 import _gguf_rows
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import split, stacked
from lite_llm.model.weights import StackedRows, convert

HF_ARCHITECTURES = ("NemotronHForCausalLM",)
GGUF_ARCHITECTURES = {"nemotron_h": "NemotronHForCausalLM", "nemotron_h_moe": "NemotronHForCausalLM"}
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "full_attention",
          "attention": "full_attention", "mlp": "mlp", "moe": "moe"}


def _blocks(raw: dict, where: str) -> list[str]:
    """Each block's kind: "mamba", "full_attention", "mlp" or "moe"."""
    types = raw.get("layers_block_type") or raw.get("layer_types")
    if types is None:
        types = [_PATTERN.get(c, c) for c in str(raw.get("hybrid_override_pattern") or "")]
    kinds = [_KINDS.get(t) for t in types]
    if not kinds or None in kinds:
        raise ModelLoadError(f"{where}: layers_block_type / hybrid_override_pattern must name a mixer for every block")
    return kinds


def _layers(kinds: list[str], where: str) -> list[tuple[str, int, int | None]]:
    """(mixer kind, its block, the MLP or expert block after it or None) of each layer."""
    layers: list[tuple[str, int, int | None]] = []
    for b, kind in enumerate(kinds):
        if kind not in ("mlp", "moe"):
            layers.append((kind, b, None))
        elif layers and layers[-1][2] is None:
            layers[-1] = (layers[-1][0], layers[-1][1], b)
        else:
            raise ModelLoadError(f"{where}: block {b}: an MLP block that does not follow a mixer block is not supported")
    return layers


def _first_expert_layer(kinds: list[str], layers: list[tuple[str, int, int | None]], where: str) -> int | None:
    """The first layer whose MLP is an expert block (None: no experts); the dense MLPs must all
    come before it."""
    first = next((j for j, (_, _, m) in enumerate(layers) if m is not None and kinds[m] == "moe"), None)
    if first is not None:
        late = [m for _, _, m in layers[first:] if m is not None and kinds[m] == "mlp"]
        if late:
            raise ModelLoadError(f"{where}: block {late[0]}: a dense MLP block after a mixture-of-experts block is "
                                 "not supported (dense MLP blocks must all come before the first expert block)")
    return first


def _experts_fields(raw: dict, where: str, first: int) -> dict[str, Any]:
    """ModelConfig fields of the expert blocks (the module docstring) from config.json."""
    if raw.get("moe_latent_size") is not None:
        raise ModelLoadError(f"{where}: moe_latent_size {raw['moe_latent_size']}: Nemotron-H's latent projections "
                             "around the experts are not supported")
    if raw.get("mlp_bias"):
        raise ModelLoadError(f"{where}: mlp_bias true in a Nemotron-H model with experts is not supported")
    if raw.get("mlp_hidden_act", "relu2") != "relu2":
        raise ModelLoadError(f"{where}: mlp_hidden_act {raw['mlp_hidden_act']!r} with experts is not supported (relu2)")
    X, K = int(raw.get("n_routed_experts") or 0), int(raw.get("num_experts_per_tok") or 0)
    n_group, topk_group = int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1)   # NemotronHConfig's defaults
    # (groups of one expert or a top-k past the kept groups' experts: transformers' router fails or
    # picks masked experts)
    if (not 0 < K <= X or X % n_group or not 0 < topk_group <= n_group or X // n_group < 2
            or K > topk_group * (X // n_group)):
        raise ModelLoadError(f"{where}: top-{K} of {X} experts in {n_group} groups (best {topk_group}) "
                             "is not supported")
    return dict(act="relu2", gated_mlp=False, ffn_dim=int(raw["moe_intermediate_size"]), num_experts=X,
                num_experts_per_tok=K, norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
                moe_routing="grouped_sigmoid", n_group=n_group, topk_group=topk_group,
                routed_scale=float(raw.get("routed_scaling_factor") or 1.0),
                shared_ffn_dim=int(raw["moe_shared_expert_intermediate_size"]), shared_gate=False,
                first_dense_layers=first, dense_ffn_dim=int(raw.get("intermediate_size") or 0))


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    kinds = _blocks(raw, where)
    layers = _layers(kinds, where)
    first = _first_expert_layer(kinds, layers, where)
    experts = _experts_fields(raw, where, first) if first is not None else {}
    types = tuple(kind for kind, _, _ in layers)
    if "mamba" not in types or "full_attention" not in types:
        raise ModelLoadError(f"{where}: a Nemotron-H model needs Mamba2 and attention blocks")
    if raw.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: mamba_hidden_act {raw['mamba_hidden_act']!r} is not supported (silu)")
    dim, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    raw = dict(raw, num_hidden_layers=len(layers))
    dense = dict(act=llama.activation(raw.get("mlp_hidden_act", "relu2"), where), gated_mlp=False)
    return llama.decoder_config(
        raw, arch, where, **(experts or dense),
        mlp_bias=bool(raw.get("mlp_bias", False)), qkv_bias=False, o_bias=False,   # its q/k/v/o have none
        head_dim=int(raw.get("head_dim") or dim // heads), norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        rope=False, nope=True, layer_types=types,
        tie_word_embeddings=False,   # transformers' NemotronH never ties lm_head, whatever the config says
        no_mlp_layers=tuple(j for j, (_, _, mlp) in enumerate(layers) if mlp is None),
        mamba_n_heads=int(raw.get("mamba_num_heads", 128)), mamba_d_head=int(raw.get("mamba_head_dim", 64)),
        mamba_n_groups=int(raw.get("n_groups", 8)), mamba_d_state=int(raw.get("ssm_state_size", 128)),
        mamba_d_conv=int(raw.get("conv_kernel", 4)), mamba_conv_bias=bool(raw.get("use_conv_bias", True)),
        mamba_proj_bias=bool(raw.get("use_bias", False)),
        mamba_dt_min=float(raw.get("time_step_min", raw.get("mamba_dt_min", 0.001))))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    pre = "backbone." if "backbone.embeddings.weight" in ckpt else "model."
    get = ckpt.read
    yield "embed", stacked(ckpt, ((pre + "embeddings.weight", (V, E)),))
    block = 0
    for j in range(config.num_layers):
        h, p = f"{pre}layers.{block}.", f"layers.{j}."
        yield p + "attn_norm.weight", get(h + "norm.weight", (E,))
        if config.layer_types[j] == "mamba":
            yield from bamba.mamba_hf_tensors(ckpt, config, h + "mixer.", p)
        else:
            yield from bamba.attention_hf_tensors(ckpt, config, h + "mixer.", p)
        block += 1
        if j in config.no_mlp_layers:
            continue
        m = f"{pre}layers.{block}."
        yield p + "mlp_norm.weight", get(m + "norm.weight", (E,))
        block += 1
        if config.is_moe:
            yield from _hf_experts(ckpt, config, m + "mixer.", p, j)
            continue
        yield p + "up.weight", stacked(ckpt, ((m + "mixer.up_proj.weight", (F, E)),))
        if config.mlp_bias:
            yield p + "up.bias", get(m + "mixer.up_proj.bias", (F,))
        yield p + "down.weight", stacked(ckpt, ((m + "mixer.down_proj.weight", (E, F)),))
        if config.mlp_bias:
            yield p + "down.bias", get(m + "mixer.down_proj.bias", (E,))
    yield "final_norm.weight", get(pre + "norm_f.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


def _hf_experts(ckpt, config: ModelConfig, m: str, p: str, j: int) -> Iterator[tuple[str, Any]]:
    """Layer j's MLP of a model with experts, mixer prefix m: a dense MLP block before the first
    expert layer, else the router, its correction bias, the experts (per expert, or 3-D
    experts.up_proj [X, F, E] / experts.down_proj [X, E, F] as transformers 5 keeps them) and the
    shared MLP, each ungated (up, down)."""
    E, X = config.dim, config.num_experts
    if j < config.first_dense_layers:
        F = config.dense_ffn_dim
        yield p + "up.weight", stacked(ckpt, ((m + "up_proj.weight", (F, E)),))
        yield p + "down.weight", stacked(ckpt, ((m + "down_proj.weight", (E, F)),))
        return
    F, Fs = config.ffn_dim, config.shared_ffn_dim
    yield p + "router.weight", stacked(ckpt, ((m + "gate.weight", (X, E)),))
    fused = m + "experts.up_proj" in ckpt
    if fused:
        ckpt.entry(m + "experts.up_proj", (X, F, E))
        ckpt.entry(m + "experts.down_proj", (X, E, F))
    for e in range(X):
        if fused:
            yield p + f"experts.{e}.up.weight", split(ckpt, m + "experts.up_proj", (F,), E, first=e * F)
            yield p + f"experts.{e}.down.weight", split(ckpt, m + "experts.down_proj", (E,), F, first=e * E)
        else:
            x = f"{m}experts.{e}."
            yield p + f"experts.{e}.up.weight", stacked(ckpt, ((x + "up_proj.weight", (F, E)),))
            yield p + f"experts.{e}.down.weight", stacked(ckpt, ((x + "down_proj.weight", (E, F)),))
    bias = m + "gate.e_score_correction_bias"
    yield p + "router.correction_bias", (convert(ckpt.read(bias, (X,)), "float32") if bias in ckpt
                                         else np.zeros(X, np.float32))
    s = m + "shared_experts."
    yield p + "shared.up.weight", stacked(ckpt, ((s + "up_proj.weight", (Fs, E)),))
    yield p + "shared.down.weight", stacked(ckpt, ((s + "down_proj.weight", (E, Fs)),))


# ---- GGUF --------------------------------------------------------------------------------


def _per_block(f, arch: str, name: str, n: int) -> list[int]:
    value = llama.gguf_key(f, arch)(name)
    value = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * n
    if len(value) != n:
        raise ModelLoadError(f"{f.path}: {arch}.{name} must have one entry per block ({n})")
    return value


def _gguf_kinds(f, arch: str) -> list[str]:
    """Each block's kind; a feed-forward block with a router (ffn_gate_inp) is an expert block."""
    n = int(llama.gguf_key(f, arch)("block_count"))
    kv, ff = _per_block(f, arch, "attention.head_count_kv", n), _per_block(f, arch, "feed_forward_length", n)
    return [("moe" if f"blk.{b}.ffn_gate_inp.weight" in f.tensors else "mlp") if ff[b]
            else "full_attention" if kv[b] else "mamba" for b in range(n)]


def _gguf_layers(f, arch: str) -> list[tuple[str, int, int | None]]:
    return _layers(_gguf_kinds(f, arch), f.path)


def _gguf_experts_fields(f, arch: str, kinds: list[str], first: int, ff: list[int]) -> dict[str, Any]:
    """ModelConfig fields of the expert blocks from llama.cpp's metadata (the module docstring)."""
    key = llama.gguf_key(f, arch)
    latent = [name for name in f.tensors if ".ffn_latent_" in name]
    if f.metadata.get(f"{arch}.moe_latent_size") or latent:
        raise ModelLoadError(f"{f.path}: {arch}.moe_latent_size / ffn_latent_down / ffn_latent_up: Nemotron-H's "
                             "latent projections around the experts are not supported")
    if any(".ffn_up.bias" in name or ".ffn_down.bias" in name for name in f.tensors):
        raise ModelLoadError(f"{f.path}: MLP biases in a Nemotron-H model with experts are not supported")
    fields = moe.gguf_fields(f, arch, norm_default=False, shared=True)
    n_group = int(key("expert_group_count", 1) or 1)
    topk_group = int(key("expert_group_used_count", n_group) or n_group)
    X = fields["num_experts"]
    if X % n_group or not 0 < topk_group <= n_group or X // n_group < 2 or not fields["shared_ffn_dim"]:
        raise ModelLoadError(f"{f.path}: {X} experts in {n_group} groups (best {topk_group}), a shared MLP of "
                             f"{fields['shared_ffn_dim']} features: not supported")
    moe_ff = sorted(set(ff[b] for b, k in enumerate(kinds) if k == "moe"))
    dense_ff = sorted(set(ff[b] for b, k in enumerate(kinds) if k == "mlp"))
    if len(moe_ff) != 1 or len(dense_ff) > 1 or fields.get("ffn_dim", moe_ff[0]) != moe_ff[0]:
        raise ModelLoadError(f"{f.path}: expert widths {moe_ff}, MLP widths {dense_ff}: not supported")
    return dict(fields, act="relu2", gated_mlp=False, ffn_dim=moe_ff[0], moe_routing="grouped_sigmoid",
                n_group=n_group, topk_group=topk_group, routed_scale=float(key("expert_weights_scale", 1.0) or 1.0),
                shared_gate=False, first_dense_layers=first, dense_ffn_dim=dense_ff[0] if dense_ff else 0)


def gguf_config(f, arch: str) -> ModelConfig:
    meta, key = f.metadata, llama.gguf_key(f, arch)
    kinds = _gguf_kinds(f, arch)
    layers = _layers(kinds, f.path)
    n = int(key("block_count"))
    kv, ff = _per_block(f, arch, "attention.head_count_kv", n), _per_block(f, arch, "feed_forward_length", n)
    first = _first_expert_layer(kinds, layers, f.path)
    experts = _gguf_experts_fields(f, arch, kinds, first, ff) if first is not None else {}
    if experts:   # the width checks below are the dense model's
        ff = [0] * n
    types = tuple(kind for kind, _, _ in layers)
    if "mamba" not in types or "full_attention" not in types or len(set(v for v in kv if v)) != 1:
        raise ModelLoadError(f"{f.path}: a Nemotron-H file needs Mamba2 blocks and attention blocks of one KV head count")
    widths = sorted(set(v for v in ff if v))
    dim, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    inner, H = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    if inner % H or len(widths) > 1:
        raise ModelLoadError(f"{f.path}: {H} Mamba2 heads over ssm.inner_size {inner}, MLP widths {widths}")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    mamba = next(b for kind, b, _ in layers if kind == "mamba")
    mlp = next((m for _, _, m in layers if m is not None), None)
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    dense = dict(act="relu2", gated_mlp=False, ffn_dim=widths[0] if widths else 0)
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch], vocab_size=int(vocab), dim=dim, **(experts or dense),
        num_layers=len(layers), num_heads=num_heads, num_kv_heads=max(kv),
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0)) or dim // num_heads,
        max_position_embeddings=int(key("context_length")), norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        mlp_bias=mlp is not None and f"blk.{mlp}.ffn_up.bias" in f.tensors,
        rope=False, nope=True, tie_word_embeddings="output.weight" not in f.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_ids=(int(eos_id),) if eos_id is not None else (),
        layer_types=types, no_mlp_layers=tuple(j for j, (_, _, m) in enumerate(layers) if m is None),
        mamba_n_heads=H, mamba_d_head=inner // H, mamba_n_groups=int(key("ssm.group_count")),
        mamba_d_state=int(key("ssm.state_size")), mamba_d_conv=int(key("ssm.conv_kernel")),
        mamba_conv_bias=f"blk.{mamba}.ssm_conv1d.bias" in f.tensors,
        mamba_proj_bias=f"blk.{mamba}.ssm_in.bias" in f.tensors)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V, D = config.dim, config.ffn_dim, config.vocab_size, config.head_dim

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", _gguf_rows(f, [("token_embd.weight", (V, E))])
    arch = f.metadata["general.architecture"]
    for j, (kind, b, m) in enumerate(_gguf_layers(f, arch)):
        g, p = f"blk.{b}.", f"layers.{j}."
        yield p + "attn_norm.weight", vec(g + "attn_norm.weight", (E,))
        if kind == "mamba":
            yield from bamba.gguf_mixer(f, config, g, p)
        else:   # q/k rows permuted by the converter (no RoPE here: undone all the same)
            q = _qk_rows(f, g + "attn_q.weight", (config.q_size, E), D)
            k = _qk_rows(f, g + "attn_k.weight", (config.kv_size, E), D)
            v = _gguf_rows(f, [(g + "attn_v.weight", (config.kv_size, E))])
            yield p + "qkv.weight", StackedRows(q.parts + k.parts + v.parts, E, align=D,
                                                blocks=q.blocks + k.blocks + v.blocks, stored=q.stored + k.stored + v.stored)
            yield p + "o.weight", _gguf_rows(f, [(g + "attn_output.weight", (E, config.q_size))])
        if m is None:
            continue
        g = f"blk.{m}."
        yield p + "mlp_norm.weight", vec(g + "attn_norm.weight", (E,))
        if config.is_moe:
            yield from _gguf_experts(f, config, g, p, j, vec)
            continue
        yield p + "up.weight", _gguf_rows(f, [(g + "ffn_up.weight", (F, E))])
        if config.mlp_bias:
            yield p + "up.bias", vec(g + "ffn_up.bias", (F,))
        yield p + "down.weight", _gguf_rows(f, [(g + "ffn_down.weight", (E, F))])
        if config.mlp_bias:
            yield p + "down.bias", vec(g + "ffn_down.bias", (E,))
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_rows(f, [("output.weight", (V, E))])


def _gguf_experts(f, config: ModelConfig, g: str, p: str, j: int, vec) -> Iterator[tuple[str, Any]]:
    """Layer j's MLP of a "nemotron_h_moe" file, block prefix g, as _hf_experts gives it."""
    E, X = config.dim, config.num_experts
    matrix = moe._gguf_matrix
    if j < config.first_dense_layers:
        F = config.dense_ffn_dim
        f.info(g + "ffn_up.weight", (F, E))
        f.info(g + "ffn_down.weight", (E, F))
        yield p + "up.weight", matrix(f, [(g + "ffn_up.weight", 0, F)], E)
        yield p + "down.weight", matrix(f, [(g + "ffn_down.weight", 0, E)], F)
        return
    F, Fs = config.ffn_dim, config.shared_ffn_dim
    f.info(g + "ffn_gate_inp.weight", (X, E))
    yield p + "router.weight", matrix(f, [(g + "ffn_gate_inp.weight", 0, X)], E)
    f.info(g + "ffn_up_exps.weight", (X, F, E))
    f.info(g + "ffn_down_exps.weight", (X, E, F))
    for e in range(X):
        yield p + f"experts.{e}.up.weight", matrix(f, [(g + "ffn_up_exps.weight", e * F, F)], E)
        yield p + f"experts.{e}.down.weight", matrix(f, [(g + "ffn_down_exps.weight", e * E, E)], F)
    name = g + "exp_probs_b.bias"
    yield p + "router.correction_bias", vec(name, (X,)) if name in f.tensors else np.zeros(X, np.float32)
    f.info(g + "ffn_up_shexp.weight", (Fs, E))
    f.info(g + "ffn_down_shexp.weight", (E, Fs))
    yield p + "shared.up.weight", matrix(f, [(g + "ffn_up_shexp.weight", 0, Fs)], E)
    yield p + "shared.down.weight", matrix(f, [(g + "ffn_down_shexp.weight", 0, E)], Fs)
