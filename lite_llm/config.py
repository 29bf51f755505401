"""Frozen configuration values, and the only module that reads environment variables.

ModelConfig is what a checkpoint (HF directory or GGUF file) says about the network, in one
vocabulary for every supported architecture; the forward pass reads nothing else.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    architecture: str            # HF name, e.g. "LlamaForCausalLM", "OPTForCausalLM"
    vocab_size: int              # V
    dim: int                     # E
    ffn_dim: int                 # F
    num_layers: int
    num_heads: int               # H
    num_kv_heads: int            # Hkv (H for MHA, 1 for MQA)
    head_dim: int                # D
    max_position_embeddings: int
    norm_eps: float = 1e-6
    norm: str = "rms"            # "rms" (RMSNorm) | "layer" (LayerNorm with bias)
    act: str = "silu"            # "silu" | "gelu" | "gelu_tanh" | "relu"
    gated_mlp: bool = True       # down(act(gate(x)) * up(x)); False: down(act(up(x))) (OPT fc1/fc2)
    qkv_bias: bool = False       # Qwen2, OPT
    o_bias: bool = False         # OPT
    mlp_bias: bool = False       # OPT
    qk_norm: bool = False        # Qwen3: RMSNorm over each head of q and k before RoPE
    rope: bool = True            # False: learned absolute positions (OPT), or none with nope
    nope: bool = False           # attention without any position encoding (Granite 4.0-H: its Mamba2 layers
                                 # carry the order); rope is then False and there is no pos_embed
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # HF's dict: {"rope_type": "linear"|"llama3"|"yarn", ...}
    pos_offset: int = 0          # learned positions: row of position 0 (OPT stores 2 extra rows)
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # attend to at most the last W positions (incl. self)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None     # what the checkpoint says, for dtype="auto" hints only
    # per-layer attention: "sliding_attention" | "full_attention" per layer; () = every layer
    # alike (sliding when sliding_window is set: Mistral)
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None   # RoPE base of the sliding layers (Gemma 3; no scaling)
    embed_scale: bool = False    # Gemma: embeddings x sqrt(dim) in the model dtype
    post_norms: bool = False     # Gemma 2/3: a norm after attention and after the MLP, before each residual add
    query_pre_attn_scalar: float | None = None   # attention scale = this ** -0.5 (Gemma), else head_dim ** -0.5
    attn_softcap: float | None = None    # Gemma 2: scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None   # Gemma 2: logits -> cap * tanh(logits / cap)
    partial_rotary_factor: float = 1.0   # RoPE rotates the first head_dim x this components (Phi-4-mini)
    # Granite: embeddings x embedding_multiplier, each sub-layer's output x residual_multiplier
    # before its residual add, attention scale attention_multiplier, logits / logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): every layer's MLP is num_experts
    # gated MLPs of ffn_dim features each, of which a router (softmax over experts, top
    # num_experts_per_tok) runs num_experts_per_tok per token, weighted by their probabilities
    # (renormalised over the chosen ones when norm_topk_prob); plus, with shared_ffn_dim, a
    # shared gated MLP every token runs, scaled by sigmoid(shared_gate . x) (Qwen2-MoE); with
    # gated_mlp False the experts and the shared MLP are ungated, down(act(up x)) (Nemotron-H's relu^2)
    num_experts: int = 0         # X; 0: a dense MLP
    num_experts_per_tok: int = 0     # K
    norm_topk_prob: bool = False
    shared_ffn_dim: int = 0      # Fs; 0: no shared expert
    # gpt-oss: the top num_experts_per_tok router logits first, then a softmax over those
    # ("topk_softmax"; else "softmax_topk" as above); the router and every expert's projections
    # carry biases (expert_bias); each attention head has a learned sink logit (attn_sinks)
    moe_routing: str = "softmax_topk"
    expert_bias: bool = False
    attn_sinks: bool = False
    # Encoders (BERT family): x = LayerNorm(x + sub-layer(x)) after each sub-layer, the embeddings
    # normed too; token-type rows added to the embeddings; attention over the whole sequence
    post_ln: bool = False
    type_vocab_size: int = 0
    causal: bool = True
    # multimodal RoPE (Qwen2-VL, Qwen2.5-VL): the RoPE frequency pairs turned by each token's
    # temporal, height and width position, in that order (lite_llm/multimodal); (): one position
    mrope_section: tuple[int, ...] = ()
    # DeepSeek's routing ("grouped_softmax": V2, "grouped_sigmoid": V3, moe_routing): the choice
    # limited to the topk_group best of n_group expert groups, the weights x routed_scale, V3's
    # per-expert correction bias (router.correction_bias) added to the scores it chooses by; its
    # shared experts run ungated (shared_gate False); its first first_dense_layers layers are a
    # dense MLP of dense_ffn_dim features instead
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0
    shared_gate: bool = True
    first_dense_layers: int = 0
    dense_ffn_dim: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none): keys and values come
    # from a per-token latent of kv_lora_rank values (kv_a_proj, kv_a_layernorm) and one shared
    # RoPE key of head_dim (= qk_rope_head_dim) values; each query head has qk_nope_head_dim +
    # head_dim components and v_head_dim outputs; q from a q_lora_rank latent (q_a_proj,
    # q_a_layernorm, q_b_proj) or, with q_lora_rank 0, from x (q_proj). The cache holds the latent
    # and the RoPE key: kv_lora_rank + head_dim values per token and layer (mla_cache_dim)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False     # MLA: the checkpoint's RoPE rows in interleaved pairs (DeepSeek's)
    # Hybrid recurrent models (LFM2): layers whose layer_types entry is "conv" run a gated short
    # convolution of conv_L_cache taps instead of attention (in_proj, B * x, a causal depthwise
    # conv over time, C * it, out_proj); their per-sequence state is the last conv_L_cache - 1
    # gated inputs of every channel, a fixed size, kept beside the paged KV cache
    conv_L_cache: int = 0
    conv_bias: bool = False
    # Mamba2 layers (layer_types "mamba": Bamba): in_proj -> z, x | B | C, dt; a causal conv of
    # mamba_d_conv taps with SiLU over x | B | C; the selective state-space scan of mamba_n_heads
    # heads of mamba_d_head channels with a state of mamba_d_state per channel, B and C shared by
    # the heads of each of mamba_n_groups groups; RMSNorm of y * silu(z) per group; out_proj.
    # Their state per sequence: the conv's last d_conv - 1 inputs and the scan's [H, P, N]
    mamba_n_heads: int = 0
    mamba_d_head: int = 0
    mamba_n_groups: int = 1
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    # Gated DeltaNet layers (layer_types "deltanet": Qwen3-Next's linear attention): in_proj ->
    # q, k (linear_num_key_heads of linear_key_head_dim), v, z (linear_num_value_heads of
    # linear_value_head_dim), b, a (one per value head); a causal conv of linear_conv_kernel_dim
    # taps with SiLU over q | k | v; L2-normed q and k; the gated delta rule with beta =
    # sigmoid(b), decay exp(-exp(A_log) softplus(a + dt_bias)), a state [Dk, Dv] per value head;
    # RMSNorm(o) * silu(z) per head; out_proj. Their state per sequence: the conv's last taps - 1
    # inputs and the [Hv, Dk, Dv] states
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # attention whose q_proj also gives a gate per query channel: out = attention * sigmoid(gate)
    # before o (Qwen3-Next's gated attention)
    attn_output_gate: bool = False
    mamba_dt_min: float = 0.0    # dt's floor after the softplus (Nemotron-H's time_step_min); 0: none
    # Nemotron-H: layers that are a mixer alone, without the MLP after it (its blocks are one
    # sub-layer each: a mixer block followed by an MLP block is one layer here)
    no_mlp_layers: tuple[int, ...] = ()
    # Falcon-H1: layers whose mixer reads the previous layer's normed rows instead of norming x
    # again, so the two mixers run side by side on one input, each adding into x (its Mamba2
    # mixer is a layer without an MLP, its attention the layer after it, reading the same rows)
    shared_input_layers: tuple[int, ...] = ()
    # the Mamba2 layers' gated norm: "after_gate" rmsnorm(y * silu(z)) (Bamba, Granite 4.0-H,
    # Nemotron-H), "before_gate" rmsnorm(y) * silu(z), "none" y * silu(z) (Falcon-H1's
    # mamba_rms_norm false); and out_proj's bias where it differs from in_proj's (None: the same,
    # mamba_proj_bias; Falcon-H1's projectors_bias)
    mamba_norm: str = "after_gate"
    mamba_out_bias: bool | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_conv_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "conv")

    @property
    def num_mamba_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "mamba")

    @property
    def num_deltanet_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "deltanet")

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers keep a recurrent state instead of KV (short convolutions, Mamba2,
        Gated DeltaNet)."""
        return self.num_conv_layers + self.num_mamba_layers + self.num_deltanet_layers > 0

    @property
    def num_attention_layers(self) -> int:
        """Layers with a KV cache."""
        return self.num_layers - self.num_conv_layers - self.num_mamba_layers - self.num_deltanet_layers

    @property
    def model_layers(self) -> int:
        """The model's own layer count, as its config states it: num_layers less the layers that
        run beside the one before them on its rows (shared_input_layers: each Falcon-H1 layer is
        a Mamba2 layer and an attention layer here)."""
        return self.num_layers - len(self.shared_input_layers)

    @property
    def deltanet_conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's convolution: q and k of every key head, then v."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of a Mamba2 layer's convolution: x, then B and C of every group."""
        return self.mamba_n_heads * self.mamba_d_head + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def recurrent_len(self) -> int:
        """Taps of the model's convolutions (LFM2's conv_L_cache or Mamba2's d_conv)."""
        if self.num_deltanet_layers:
            return self.linear_conv_kernel_dim
        return self.mamba_d_conv if self.num_mamba_layers else self.conv_L_cache

    @property
    def state_bytes_per_seq(self) -> int:
        """The recurrent state of one sequence over all layers (float32), fixed in its length."""
        mamba = (max(self.mamba_d_conv - 1, 0) * self.mamba_conv_dim
                 + self.mamba_n_heads * self.mamba_d_head * self.mamba_d_state)
        deltanet = (max(self.linear_conv_kernel_dim - 1, 0) * self.deltanet_conv_dim
                    + self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim)
        return 4 * (self.num_conv_layers * max(self.conv_L_cache - 1, 0) * self.dim + self.num_mamba_layers * mamba
                    + self.num_deltanet_layers * deltanet)

    @property
    def cache_kv_heads(self) -> int:
        """KV heads of the cache: MLA's one latent row per token, else num_kv_heads."""
        return 1 if self.is_mla else self.num_kv_heads

    @property
    def cache_head_dim(self) -> int:
        """Values per cached K (and V) row: MLA's latent + RoPE key, else head_dim."""
        return self.kv_lora_rank + self.head_dim if self.is_mla else self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class LayerConfig:
    """What differs between the layers of one model (the kernel's LayerW)."""
    sliding_window: int = 0      # attend to the last W positions (incl. self); 0: every earlier position
    rope_table: int = 0          # which of the Model's RoPE tables rotates q and k (Gemma 3: 1 = local)
    mlp: bool = True             # an MLP after the mixer (False: Nemotron-H's mixer blocks alone)
    kind: str = "attention"      # LAYER_KINDS: "conv" is a short-convolution layer (LFM2), KernelConfig.conv_len;
                                 # "mamba" a Mamba2 layer (KernelConfig.mamba_*); "deltanet" a
                                 # Gated DeltaNet layer (KernelConfig.gdn_*)
    shared_input: bool = False   # the mixer reads the previous layer's normed rows (ModelConfig.shared_input_layers)


LAYER_KINDS = ("attention", "conv", "mamba", "deltanet")
MAMBA_NORMS = ("after_gate", "before_gate", "none")   # ModelConfig.mamba_norm
KERNEL_NORMS = ("rms", "layer")
# swiglu_oai: gpt-oss's clamped SwiGLU; relu2: relu(x)^2 (Nemotron-H)
KERNEL_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "swiglu_oai", "relu2")
MOE_ROUTINGS = ("softmax_topk", "topk_softmax", "grouped_softmax", "grouped_sigmoid")


@dataclass(frozen=True)
class KernelConfig:
    """The kernel model's configuration (lite_llm/_kernels/forward.pxi Model), filled by
    lite_llm/model/arch.kernel_config and checked here, once."""
    dtype: str                   # engine dtype of the weights: "float32" | "bfloat16" | "float16"
    num_layers: int
    dim: int                     # E
    ffn_dim: int                 # F
    vocab_size: int              # V
    num_heads: int               # H
    num_kv_heads: int            # Hkv
    head_dim: int                # D
    block_size: int              # B, tokens per KV block
    max_positions: int           # rows of the RoPE tables / learned positions the step may use
    norm: str                    # KERNEL_NORMS
    norm_eps: float
    act: str                     # KERNEL_ACTIVATIONS
    gated_mlp: bool
    rope: bool
    rope_dim: int                # components of each head RoPE rotates (the first ones; partial rotary)
    qk_norm: bool
    post_norms: bool
    attn_scale: float            # multiplies q . k
    embed_scale: float           # multiplies the embedding rows (1.0: none)
    residual_scale: float        # multiplies each sub-layer's output before its residual add (1.0: none)
    logit_scale: float           # multiplies the logits, before final_softcap (1.0: none)
    attn_softcap: float          # scaled scores -> cap * tanh(scores / cap); 0: none
    final_softcap: float         # logits -> cap * tanh(logits / cap); 0: none
    kv_cache_dtype: str          # lite_llm/_kernels/layout.py KV_DTYPES
    bf16_path: str | None        # lite_llm/_kernels/gemm_path.py; None: the build's default
    layers: tuple[LayerConfig, ...]
    attn_path: str = "auto"      # ATTENTION_PATHS: how attention tiles compute (src/kernels/attention.h)
    # deterministic mode: each row through the same kernels whatever else the step holds (no key
    # splits, no one-token streaming GEMV, one bf16 input form, attention direct), so a sequence's
    # logits are the same bits in any batch, chunking or after a preemption
    batch_invariant: bool = False
    # mixture of experts (ModelConfig's fields): ffn_dim is then each expert's width
    num_experts: int = 0         # X; 0: dense MLP
    num_experts_per_tok: int = 0     # K
    norm_topk_prob: bool = False
    shared_ffn_dim: int = 0      # Fs: the shared expert's width (Qwen2-MoE); 0: none
    moe_routing: str = "softmax_topk"   # MOE_ROUTINGS (ModelConfig.moe_routing)
    post_ln: bool = False        # BERT: LayerNorm after each residual add (ModelConfig.post_ln)
    mrope_section: tuple[int, ...] = ()   # multimodal RoPE (Qwen2-VL): frequency pairs per (t, h, w) position
    # DeepSeek (ModelConfig's fields of the same names): grouped routing, ungated shared experts,
    # the first dense layers
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0
    shared_gate: bool = True
    first_dense_layers: int = 0
    dense_ffn_dim: int = 0
    # multi-head latent attention (kv_lora_rank > 0): head_dim is then the cached row's width
    # kv_lora_rank + rope_dim (the absorbed query rows are as wide), num_kv_heads 1; q_lora_rank
    # 0: q from x. q (qk_nope_head_dim + rope_dim per head) and o (v_head_dim per head) run as
    # stored; each head's W_UK / W_UV (kv_b_proj's halves) is applied to the activations
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False    # MLA: q's and k's RoPE components stored in interleaved pairs
    nope: bool = False           # no position encoding at all (ModelConfig.nope): rope False, no pos_embed
    conv_len: int = 0            # L of the short-convolution or Mamba2 layers' convolution; 0: none
    mamba_heads: int = 0         # Mamba2 layers (ModelConfig.mamba_*): heads, their channels, groups, state
    mamba_head_dim: int = 0
    mamba_groups: int = 1
    mamba_state: int = 0
    gdn_k_heads: int = 0         # Gated DeltaNet layers (ModelConfig.linear_*): key heads, value heads,
    gdn_v_heads: int = 0         # their channels
    gdn_k_dim: int = 0
    gdn_v_dim: int = 0
    attn_gate: bool = False      # attention output x sigmoid(gate) from q's rows (ModelConfig.attn_output_gate)
    mamba_dt_min: float = 0.0    # dt's floor after the softplus (ModelConfig.mamba_dt_min)
    mamba_norm: str = "after_gate"   # MAMBA_NORMS: the Mamba2 layers' gated norm (ModelConfig.mamba_norm)

    MAX_HEAD_DIM = 512
    MAX_CONV_LEN = 8             # LL_CONV_MAX_LEN, src/kernels/conv.h           # LL_MAX_HEAD_DIM, src/kernels/attention.h

    def __post_init__(self):
        if self.kv_lora_rank:
            if (self.num_kv_heads != 1 or self.head_dim != self.kv_lora_rank + self.rope_dim or self.head_dim % 16
                    or self.qk_nope_head_dim <= 0 or self.v_head_dim <= 0
                    or self.kv_cache_dtype not in ("float32", "bfloat16")):
                raise ValueError(f"latent attention: one cached row of kv_lora_rank {self.kv_lora_rank} + "
                                 f"RoPE {self.rope_dim} values (a multiple of 16), heads of qk_nope_head_dim "
                                 f"{self.qk_nope_head_dim} and v_head_dim {self.v_head_dim} (above 0), a float32 "
                                 f"or bfloat16 cache (not {self.kv_cache_dtype})")
        elif self.head_dim % 16 or not 0 < self.head_dim <= self.MAX_HEAD_DIM:
            raise ValueError(f"head_dim {self.head_dim} is not supported: it must be a multiple of 16, "
                             f"at most {self.MAX_HEAD_DIM}")
        if self.block_size <= 0 or self.block_size % 16:
            raise ValueError(f"block_size {self.block_size} must be a positive multiple of 16")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not share {self.num_kv_heads} KV heads evenly")
        if self.norm not in KERNEL_NORMS or self.act not in KERNEL_ACTIVATIONS:
            raise ValueError(f"norm {self.norm!r} / activation {self.act!r}: the kernels run "
                             f"{', '.join(KERNEL_NORMS)} / {', '.join(KERNEL_ACTIVATIONS)}")
        if self.rope and (self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim):
            raise ValueError(f"RoPE over {self.rope_dim} of {self.head_dim} components: an even count, at most head_dim")
        if len(self.layers) != self.num_layers:
            raise ValueError(f"{len(self.layers)} layer configs for {self.num_layers} layers")
        if any(layer.sliding_window < 0 for layer in self.layers):
            raise ValueError("a sliding window cannot be negative")
        if (self.post_norms or self.residual_scale != 1.0) and (self.norm != "rms" or not self.gated_mlp):
            raise ValueError("post-sub-layer norms and residual scales are RMSNorm models' with a gated MLP "
                             "(Gemma, Granite)")
        if self.attn_path not in ATTENTION_PATHS:
            raise ValueError(f"attention path {self.attn_path!r}: expected one of {', '.join(ATTENTION_PATHS)}")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError(f"top-{self.num_experts_per_tok} of {self.num_experts} experts: expected 1..{self.num_experts}")
        if self.num_experts and self.post_norms:   # (gated or not: gated_mlp)
            raise ValueError("experts are MLPs without post-MLP norms")
        if self.num_experts and (self.n_group < 1 or self.num_experts % self.n_group
                                 or not 0 < self.topk_group <= self.n_group):
            raise ValueError(f"{self.num_experts} experts in {self.n_group} groups, the best {self.topk_group} kept")
        if self.first_dense_layers and not self.dense_ffn_dim:
            raise ValueError("dense layers before the expert layers need their MLP width")
        if self.moe_routing not in MOE_ROUTINGS:
            raise ValueError(f"expert routing {self.moe_routing!r}: expected one of {', '.join(MOE_ROUTINGS)}")
        if self.act == "swiglu_oai" and not self.gated_mlp:
            raise ValueError("the clamped SwiGLU is a gated MLP's activation")
        if self.shared_ffn_dim and not self.num_experts:
            raise ValueError("a shared expert belongs to a mixture-of-experts model")
        if self.post_ln and (self.norm != "layer" or self.post_norms or self.residual_scale != 1.0 or self.num_experts):
            raise ValueError("post-LayerNorm (BERT) models are dense LayerNorm models without other sub-layer norms")
        if any(layer.kind not in LAYER_KINDS for layer in self.layers):
            raise ValueError(f"layer kinds: expected {', '.join(LAYER_KINDS)}")
        if any(layer.kind == "mamba" for layer in self.layers) and (
                self.mamba_heads < 1 or self.mamba_head_dim < 1 or self.mamba_state < 1 or self.mamba_groups < 1
                or self.mamba_heads % self.mamba_groups or any(layer.kind == "conv" for layer in self.layers)):
            raise ValueError(f"Mamba2 layers: {self.mamba_heads} heads of {self.mamba_head_dim} in "
                             f"{self.mamba_groups} groups (dividing them), a state of {self.mamba_state}")
        if any(layer.kind == "deltanet" for layer in self.layers) and (
                min(self.gdn_k_heads, self.gdn_v_heads, self.gdn_k_dim, self.gdn_v_dim) < 1
                or self.gdn_v_heads % self.gdn_k_heads
                or any(layer.kind in ("conv", "mamba") for layer in self.layers)):
            raise ValueError(f"Gated DeltaNet layers: {self.gdn_v_heads} value heads of {self.gdn_v_dim} sharing "
                             f"{self.gdn_k_heads} key heads of {self.gdn_k_dim} (dividing them)")
        if self.attn_gate and self.kv_lora_rank:
            raise ValueError("an attention output gate with latent attention is not supported")
        if any(layer.kind != "attention" for layer in self.layers):
            if not 1 <= self.conv_len <= self.MAX_CONV_LEN:
                raise ValueError(f"short convolutions of {self.conv_len} taps: the kernels run 1..{self.MAX_CONV_LEN}")
            if self.post_norms or self.kv_lora_rank or self.post_ln:
                raise ValueError("short-convolution layers sit in pre-norm decoders without post-sub-layer norms "
                                 "or latent attention")
            if self.residual_scale != 1.0 and any(layer.kind == "conv" for layer in self.layers):
                raise ValueError("short-convolution layers add their output unscaled (residual scales: Mamba2 "
                                 "and attention layers)")
            if all(layer.kind != "attention" for layer in self.layers):
                raise ValueError("a model with short-convolution layers needs at least one attention layer")
        if self.mamba_norm not in MAMBA_NORMS:
            raise ValueError(f"Mamba2 norm {self.mamba_norm!r}: expected one of {', '.join(MAMBA_NORMS)}")
        for i, layer in enumerate(self.layers):
            # the rows it reads are the previous layer's h: that layer a Mamba2 mixer alone whose
            # out_proj adds into x directly (no residual scale), in a pre-norm decoder
            if layer.shared_input and (i == 0 or self.layers[i - 1].kind != "mamba" or self.layers[i - 1].mlp
                                       or layer.kind != "attention" or self.residual_scale != 1.0
                                       or self.post_norms or self.post_ln or self.kv_lora_rank):
                raise ValueError(f"layer {i} reads its input from layer {i - 1}: an attention layer after a "
                                 "Mamba2 layer without an MLP, no residual scale or post-sub-layer norms")
        if self.attn_softcap < 0 or self.final_softcap < 0:
            raise ValueError(f"soft-caps {self.attn_softcap} / {self.final_softcap} cannot be negative")

    @property
    def num_rope_tables(self) -> int:
        return 1 + max((layer.rope_table for layer in self.layers), default=0)


# --kv-cache-dtype (vLLM's names) -> the cache format (lite_llm/_kernels/layout.py KV_DTYPES);
# auto: float32 for fp32 models, bfloat16 for 16-bit ones; fp8 is e4m3, as in vLLM
KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bfloat16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
                   "fp8_e5m2": "fp8_e5m2", "int8": "int8"}


QUANTIZATIONS = {"q8_0": "Q8_0", "q4_0": "Q4_0"}   # --quantization: the ggml type float weights become


def check_quantization(name: str | None) -> str | None:
    """None / "none" (weights as stored), or a key of QUANTIZATIONS; else a ValueError listing them."""
    if name is None or str(name).lower() == "none":
        return None
    if str(name).lower() not in QUANTIZATIONS:
        raise ValueError(f"quantization {name!r} is not supported; choose none, {', '.join(QUANTIZATIONS)}")
    return str(name).lower()


def env(name: str, default: str | None = None) -> str | None:
    """LITE_LLM_<name>, else its vLLM alias VLLM_<name>, else default."""
    for key in (f"LITE_LLM_{name}", f"VLLM_{name}"):
        value = os.environ.get(key)
        if value not in (None, ""):
            return value
    return default


def hf_env(name: str) -> str | None:
    """A Hugging Face variable (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE) as set now, or None:
    huggingface_hub reads them once, at its import (model/hub.py follows later changes too)."""
    return os.environ.get(name) or None


# Inner-product paths of the GEMMs, by the operation they serve (lite_llm/_kernels/gemm_path.py):
# bf16 weights in steps of several tokens, and int8 blocks (block-quantized weights).
# int8 paths by instruction (src/simd LL_I8DOT_NAME): x86 vpdpbusd / vpmaddubsw, aarch64 usdot /
# sdot / smull (ARMv8.0 widening multiplies), s390x vxe, plain C scalar
GEMM_PATHS = {"dpbf16": "bf16", "fma": "bf16", "vpdpbusd": "int8", "vpmaddubsw": "int8", "usdot": "int8",
              "sdot": "int8", "smull": "int8", "vxe": "int8", "scalar": "int8"}


def gemm_path_override(value: str | None = None) -> dict[str, str]:
    """LITE_LLM_GEMM_PATH (or `value`): unset or "auto" measures and chooses; else paths to force,
    comma-separated, at most one per operation: "fma", "dpbf16", "fma,vpdpbusd",
    "bf16=fma". -> {operation: path}; a ValueError naming the valid values otherwise."""
    text = os.environ.get("LITE_LLM_GEMM_PATH", "") if value is None else value
    text = text.strip().lower()
    if text in ("", "auto"):
        return {}
    out: dict[str, str] = {}
    for item in text.split(","):
        op, _, path = item.strip().rpartition("=")
        if path not in GEMM_PATHS or (op and op != GEMM_PATHS[path]) or GEMM_PATHS[path] in out:
            raise ValueError(f"LITE_LLM_GEMM_PATH={text!r}: expected 'auto' or a comma-separated list of "
                             f"paths, at most one per operation: bf16: dpbf16 | fma; int8: vpdpbusd | "
                             f"vpmaddubsw | usdot | sdot | smull | vxe | scalar (optionally as op=path, e.g. bf16=fma)")
        out[GEMM_PATHS[path]] = path
    return out


ATTENTION_PATHS = ("auto", "direct", "bf16", "fma")


def attention_path_override(value: str | None = None) -> str:
    """LITE_LLM_ATTENTION_PATH (or `value`): how attention tiles compute (src/kernels/attention.h):
    "auto" (the default: prefill tiles of bf16 and 8-bit caches staged into the bf16 GEMM path's
    type, decode direct), "direct", "bf16" or "fma" for every tile; a ValueError otherwise."""
    text = (os.environ.get("LITE_LLM_ATTENTION_PATH", "") if value is None else value).strip().lower() or "auto"
    if text not in ATTENTION_PATHS:
        raise ValueError(f"LITE_LLM_ATTENTION_PATH={text!r}: expected one of {', '.join(ATTENTION_PATHS)}")
    return text


def allow_long_max_model_len() -> bool:
    """LITE_LLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN): a max_model_len
    past the model's max_position_embeddings is run (with a warning) instead of refused."""
    return (env("ALLOW_LONG_MAX_MODEL_LEN", "0") or "0").strip().lower() in ("1", "true", "yes")


def user_cache_dir() -> str:
    """Where lite_llm keeps per-machine measurements: $XDG_CACHE_HOME/lite_llm, else
    ~/.cache/lite_llm."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lite_llm")


def packed_cache_dir() -> str | None:
    """Where packed weights are kept between starts (model/packed_cache.py):
    LITE_LLM_PACKED_CACHE, else <user cache>/packed; None when that is 0 / off / false / no."""
    value = os.environ.get("LITE_LLM_PACKED_CACHE")
    if value is not None and value.strip().lower() in ("0", "off", "false", "no", "none"):
        return None
    return value or os.path.join(user_cache_dir(), "packed")


SPEC_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """--speculative-config, as vLLM spells it: {"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": 4, "prompt_lookup_min": 1} (drafts looked up in the sequence itself)
    or {"method": "draft_model", "model": PATH, "num_speculative_tokens": k} (a small model of
    the same vocabulary drafts greedily)."""
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4        # ngram: longest suffix looked up
    prompt_lookup_min: int = 1        # ngram: shortest
    model: str | None = None          # draft_model: HF directory or .gguf of the draft

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative_config: unknown method {self.method!r}; "
                             f"choose one of {', '.join(SPEC_METHODS)}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or lo < 1 or hi < lo:
                raise ValueError(f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                                 f"got {lo!r}, {hi!r}")
            if self.model is not None:
                raise ValueError("speculative_config: method 'ngram' takes no draft 'model'")
        elif not self.model or not isinstance(self.model, str):
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (the draft's path)")

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """From a JSON string, a dict, a SpeculativeConfig or None; a ValueError naming what is wrong."""
        import json
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        value = dict(value)
        if "method" not in value and "model" in value:        # vLLM: a model alone means a draft model
            value["method"] = "ngram" if value["model"] in ("ngram", "[ngram]") else "draft_model"
            if value["method"] == "ngram":
                del value["model"]
        if value.get("method") == "[ngram]":
            value["method"] = "ngram"
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config: num_speculative_tokens is required")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unsupported keys {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError("speculative_config: method is required ('ngram' or 'draft_model')")
        if value.get("method") == "ngram" and "prompt_lookup_max" in value and "prompt_lookup_min" not in value:
            value["prompt_lookup_min"] = min(1, value["prompt_lookup_max"])
        return cls(**value)


def speculative_config_arg(text: str) -> SpeculativeConfig:
    """argparse type of --speculative-config: a bad value is a usage error naming the problem."""
    import argparse
    try:
        return SpeculativeConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
