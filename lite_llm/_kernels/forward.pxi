# The whole model for one engine step, in ONE nogil call: every layer, OpenMP inside each op,
# no Python between ops. Model holds pointers into the packed weights and the KV cache;
# Workspace holds activations sized once for the largest step.

from libc.math cimport log1pf, sqrtf

cdef enum:
    MROPE_MAX_PAIRS = 256   # multimodal RoPE's per-token angle rows live on the stack: rope_dim <= 512
    MLA_MAX_ROPE = 256      # latent attention's RoPE key is taken to the halves order on the stack
    MLA_TOKENS = 32         # tokens per work unit of latent attention's per-head projections
    CONV_CHANNELS = 64      # channels per work unit of a short-convolution layer (conv.h)
    # KernelConfig.mamba_norm (config.MAMBA_NORMS, in order): rmsnorm(y * silu(z)), rmsnorm(y) * silu(z), y * silu(z)
    MAMBA_NORM_AFTER_GATE = 0
    MAMBA_NORM_BEFORE_GATE = 1
    MAMBA_NORM_NONE = 2
    # a layer's MLP block (LayerW.mlp), resolved when the Model is built: the forward runs that
    # block's phases (_step), one branch per kind, not a test of the model's flags in each phase
    MLP_NONE = 0            # the mixer alone (LayerConfig.mlp False: Nemotron-H's blocks, Falcon-H1's Mamba2)
    MLP_GATED = 1           # gate_up with the activation fused, then down
    MLP_UP_ACT = 2          # up, the activation, then down (BERT, OPT, Nemotron-H's relu^2)
    MLP_EXPERTS = 3         # a mixture of experts (shared expert included)


cdef struct LayerW:
    const float *attn_norm_w      # [E]
    const float *attn_norm_b      # [E] LayerNorm only
    const float *q_norm_w         # [D] qk_norm only
    const float *k_norm_w         # [D]
    const float *post_attn_norm_w # [E] post_norms only: norm of the attention output before the residual add
    const float *mlp_norm_w       # [E]
    const float *mlp_norm_b       # [E]
    const float *post_mlp_norm_w  # [E] post_norms only: norm of the MLP output before the residual add
    const float *rope_cos         # [P, R/2] this layer's RoPE table (LayerConfig.rope_table), R = rope_dim
    const float *rope_sin         # [P, R/2]
    int window                    # sliding window (LayerConfig.sliding_window); 0: global
    const float *sinks            # [H] attention sinks (gpt-oss): a logit per head in the softmax's denominator, or NULL
    Mat qkv                       # [(H + 2 Hkv) D, E]
    Mat o                         # [E, H D]
    Mat up                        # [2F, E] gate then up rows (gated), or [F, E]; MoE: the shared expert's [2Fs, E] ([Fs, E])
    Mat down                      # [E, F]; MoE: the shared expert's [E, Fs] (both zero without one)
    const float *router           # [X, E] MoE only: router logits = router . h (+ router_b)
    const float *router_b         # [X] the router's bias (gpt-oss), or NULL
    const float *shared_gate_w    # [E] MoE with a shared expert: its scale sigmoid(shared_gate_w . h)
    Mat *experts                  # [2 X] MoE only: expert j's gate_up [2F, E] (ungated: up [F, E]) at j, its down [E, F] at X + j
                                  # (NULL on a dense layer of a MoE model: DeepSeek's first layers)
    const float *router_corr      # [X] the choice's correction bias (DeepSeek-V3), or NULL
    int ffn                       # the dense MLP's width on this layer (ffn_dim; DeepSeek's dense layers their own)
    # latent attention (ModelC.kv_lora > 0, mla.h): qkv is [q | c, k_pe] or [q_a | c, k_pe], o
    # [E, H dv]; every matrix as stored (arch/deepseek.py)
    const float *q_a_norm_w       # [ql] q_a_layernorm (q latent only)
    const float *kv_a_norm_w      # [r] kv_a_layernorm
    Mat q_b                       # [H (dn + dr), ql] q_b_proj (q latent only)
    Mat *mla_heads                # [2 H] head h's W_UK transposed [r, dn] at h, its W_UV [dv, r] at H + h
    void *k_cache                 # [num_blocks, Hkv, ...] layouts: attention.h, layout.py (MLA: mla.h's rows)
    void *v_cache                 # (NULL on a conv layer: it keeps no KV)
    # a short-convolution layer (LFM2's conv, conv.h; ModelC.conv_len L): qkv is its in_proj
    # [3E, E] (B | C | x rows), o its out_proj [E, E]
    int conv                      # 1: a short-convolution layer, 2: a Mamba2 layer, 3: a Gated DeltaNet layer
                                  # (LayerConfig.kind, at build time)
    const float *conv_w           # [L, E] the taps, tap L - 1 the token's own
    const float *conv_b           # [E] or NULL
    float *conv_state             # [slots, L - 1, E] each batch slot's last L - 1 gated inputs
    # a Mamba2 layer (conv 2; conv.h, ssm.h; ModelC.mamba_*: Di = H P channels, Cd = Di + 2 G N):
    # qkv is its in_proj [Di + Cd + H, E] (z | x, B, C | dt rows), o its out_proj [E, Di];
    # conv_w [L, Cd], conv_b [Cd] and conv_state [slots, L - 1, Cd] its convolution's
    const float *ssm_a            # [H] A = -exp(A_log)
    const float *ssm_d            # [H] D
    const float *dt_bias          # [H]
    const float *gnorm_w          # [Di] the gated RMSNorm's weight (NULL with ModelC.mamba_norm MAMBA_NORM_NONE)
    float *ssm_state              # [slots, H, P, N] each batch slot's scan state
    # a Gated DeltaNet layer (conv 3; conv.h, delta.h; ModelC.gdn_*: Cd = 2 Hk Dk + Hv Dv): qkv is
    # its in_proj [Cd + Hv Dv + 2 Hv, E] (q | k | v | z | b | a rows), o its out_proj [E, Hv Dv];
    # conv_w [L, Cd] and conv_state [slots, L - 1, Cd] its convolution's, ssm_a [Hv] -exp(A_log),
    # dt_bias [Hv], gnorm_w [Dv] the gated norm's weight (every head's), ssm_state [slots, Hv, Dk, Dv]
    int mlp                       # its MLP block: MLP_NONE / MLP_GATED / MLP_UP_ACT / MLP_EXPERTS
    int shared_input              # 1: the mixer reads the previous layer's normed rows h, not a norm of x
                                  # (LayerConfig.shared_input: Falcon-H1's attention beside its Mamba2)


cdef struct ModelC:
    LayerW *layers
    Mat embed, lm_head
    const float *pos_embed        # [P, E] learned positions or NULL
    const float *type_embed       # [num_types, E] token-type rows (BERT) or NULL
    const float *embed_norm_w     # [E] post_ln: LayerNorm of the embeddings (BERT)
    const float *embed_norm_b     # [E]
    const float *final_norm_w
    const float *final_norm_b
    int num_layers, dim, ffn_dim, vocab_size, num_heads, num_kv_heads, head_dim, rope_dim
    int block_size, num_blocks, max_positions
    int rope_rows                  # rows of each RoPE table: max_positions, or more (LongRoPE, rope.py)
    int rms, act, gated, use_rope, qk_norm, post_norms, kv_type   # kv_type: LL_KV_* (attention.h)
    int post_ln                    # BERT: x = LN(x + sub-layer(x)); attn_norm / mlp_norm are the LNs after
    int num_types                  # rows of type_embed
    int attn_path                  # LL_ATTN_* (attention.h): direct or staged dot products
    int batch_invariant            # deterministic mode: no attention key splits (KernelConfig.batch_invariant)
    int num_experts, top_k, norm_topk, shared_dim   # MoE (X, K, renormalise, Fs); num_experts 0: dense MLP
    int moe_routing                # LL_MOE_* (moe.h): softmax then top-k, or top-k then softmax, or DeepSeek's
    int n_group, topk_group, shared_gate   # DeepSeek's grouped routing; shared_gate 0: the shared expert ungated
    float routed_scale             # multiplies the routed experts' weights (DeepSeek's routed_scaling_factor)
    int kv_lora, q_lora            # latent attention (mla.h): r and ql (0: no q latent); kv_lora 0: none
    int mla_dn, mla_dv             # its heads' q_nope and value widths (dn, dv; rope_dim is dr)
    int mla_interleave             # 1: q's and k's RoPE components stored in interleaved pairs
    int conv_len                   # L of the short-convolution / Mamba2 layers' convolution (0: none)
    int mamba_h, mamba_p, mamba_g, mamba_n   # Mamba2 layers: heads H, their channels P, groups G, state N
    int gdn_hk, gdn_hv, gdn_dk, gdn_dv       # Gated DeltaNet layers: key heads, value heads, their channels
    int attn_gate                  # attention rows x sigmoid(gate) before o; qkv rows q | k | v | gate
    int num_state_slots            # rows of each conv layer's state: the batch slots a step's tok_seq indexes
    int vocab0                     # lm_head's rows are vocabulary entries vocab0.. (a tensor-parallel rank's share)
    int mrope_t, mrope_h          # multimodal RoPE: frequency pairs [0, mrope_t) turn by the temporal
                                  # position, [mrope_t, mrope_h) by the height one, the rest by the width
                                  # one (Qwen2-VL's mrope_section, summed); 0: one position per token
    float eps, scale, embed_scale, residual_scale, logit_scale, attn_softcap, final_softcap   # softcaps 0: none
    float mamba_dt_min            # Mamba2's dt floor after the softplus (KernelConfig.mamba_dt_min; 0: none)
    int mamba_norm                # MAMBA_NORM_*: the Mamba2 layers' gated norm (KernelConfig.mamba_norm)


cdef struct WorkC:
    float *x        # [T, E] residual stream
    float *h        # [max(T, R), E] normalised rows
    float *qkv      # [T, (H + 2 Hkv) D]
    float *attn     # [T, H D]
    float *mlp      # [T, F] up projection (not gated; the gated one is fused with its activation)
    float *act      # [T, F]
    float *scores   # [num_threads, scratch_len] attention scratch
    Py_ssize_t scratch_len
    int32_t *tiles  # [T + 1] query tiles of the attention phase
    int32_t *runs   # [T + 1] first token of each sequence's run in the step, then T (conv layers)
    float *ssm_x    # [T, Cd] a Mamba2 layer's convolved x | B | C, a DeltaNet layer's q | k | v (NULL without one)
    float *ssm_y    # [T, Di] its scan's output, then gated and normed (DeltaNet: Di = Hv Dv)
    uint32_t *xb    # [max(T, R), max_k / 2 + 1] bf16 pairs of the next GEMM input
    uint32_t *xb2   # [T, F / 2 + 1] bf16 pairs of the gated activation (xb holds its input)
    int8_t *xq      # [max(T, R), max_k] int8 blocks of the next GEMM input (quantized weights)
    float *xqd      # [max(T, R), max_k / 32] their scales
    float *xqs      # [max(T, R), max_k / 16] scale x sum of each half-block
    int32_t *xqn    # [max(T, R), max_k / 16] sum of each half-block's int8 values
    int8_t *xq2     # [T, F] int8 blocks of the MLP activation (the down projection's input)
    float *xqd2     # [T, F / 32]
    float *xqs2     # [T, F / 16]
    int32_t *xqn2   # [T, F / 16]
    long long *work # [8] the team's work counter (work.h), its own cache line: every dynamic phase
    int *barrier    # [2 x 16] the step barrier's count and sense, one cache line each (omp_util.h)
    # mixture of experts (A = T K routed rows, grouped by expert): NULL for dense models
    float *router   # [T, X + 1] router logits, the shared gate's at X (then its sigmoid)
    float *moe_wt   # [T, K] weight of each token's k-th expert
    int32_t *moe_sel    # [T, K] each token's experts
    int32_t *moe_slot   # [T, K] the grouped row of (token, k)
    int32_t *moe_tok    # [A] token of each grouped row
    int32_t *moe_exp    # [A] expert of each grouped row
    int32_t *moe_off    # [X + 1] first grouped row of each expert
    int32_t *moe_cur    # [X] fill cursor while grouping
    int32_t *moe_active # [X + 1] experts with rows, their count at X
    float *gx       # [A, E] gathered normed rows
    uint32_t *gxb   # [A, E / 2 + 1] as bf16 pairs
    int8_t *gxq     # [A, E] as int8 blocks, scales gxqd [A, E / 32 + 1], gxqs [A, E / 16 + 1],
    float *gxqd     #   half-block sums gxqn [A, E / 16 + 1]
    float *gxqs
    int32_t *gxqn
    float *gact     # [A, F] experts' gated activations, and their forms:
    uint32_t *gactb # [A, F / 2 + 1]
    int8_t *gactq   # [A, F], gactqd [A, F / 32 + 1], gactqs [A, F / 16 + 1], gactqn [A, F / 16 + 1]
    float *gactqd
    float *gactqs
    int32_t *gactqn
    float *gout     # [A, E] experts' outputs, before their weighted sum
    float *partials # [_max_split_items, _partial_stride] attention split results (decode of few sequences)
    float *qlat     # [T, ql] latent attention's normed q latent (q_b's input), or NULL
    float *mla_q    # [T, H (r + dr)] latent attention's absorbed queries, or NULL
    float *mla_v    # [T, H dv] its per-head values W_UV out_h (o's input), or NULL
    # LoRA (lora.pxi): NULL without adapters
    float *ltmp     # [T, 3 r] shrink results
    float *lgu      # [T, 2F] raw gate then up rows of a step with adapters (the unfused gated MLP)
    int32_t *lgrp   # [3 T + 1] rows grouped by adapter: slots [T], offsets [T + 1], rows [T]


cdef Mat _mat(object packed, str name, list keep, bint fma, bint stream=True) except *:
    """The Mat of matrix `name` of a PackedModel (packed.py): its panels, [N, K], parts (see
    _make_mat) and bias. fma: bf16 weights run bigger steps on the fp32-FMA path."""
    m = packed.matrices.get(name)
    if m is None:
        raise ValueError(f"the packed model has no matrix {name!r}")
    n, k = m.shape
    return _make_mat(m.data, list(m.parts), n, k, m.bias, keep, fma, stream)


def _bf16_fma(path):
    """Whether bf16 path name `path` (None: this build's default) is the fp32-FMA path."""
    if path is None:
        return not ll_gemm_wants_xb(LL_W_BF16)
    if path not in BF16_PATHS:
        raise ValueError(f"bf16 GEMM path {path!r}: this {ISA} build runs {', '.join(BF16_PATHS)}")
    return path == "fma"


cdef tuple _describe(const Mat *m):
    names = {v: k for k, v in WTYPES.items()}
    form = INPUT_FORMS[m.input] + (" at 1 token, float32 rows (FMA) above" if m.fma else "")
    return tuple(names[m.part[i].wtype] for i in range(m.num_parts)), form


cdef const float *_vec(dict tensors, str name, list keep) except? NULL:
    a = tensors.get(name)
    if a is None:
        return NULL
    if a.dtype != np.float32:
        raise ValueError(f"{name}: expected float32, got {a.dtype}")
    keep.append(a)
    return <const float *>_ptr(a)


cdef class Model:
    """Pointers to one loaded model's packed weights and KV cache, for forward().

    cfg: the typed KernelConfig (lite_llm/config.py, checked there), per-layer properties in
    cfg.layers. packed: the PackedModel (lite_llm/_kernels/packed.py): matrices by canonical
    name without ".weight", float32 vectors by canonical name (lite_llm/model/__init__.py);
    "embed" is packed like a weight (the tied lm_head streams it), rows are gathered from the
    panels. rope_tables:
    [(cos, sin) float32 [N, rope_dim / 2], ...], indexed by LayerConfig.rope_table, N >= max_positions
    rows alike (rows past max_positions: LongRoPE's long factors, forward()'s rope_rows).
    cfg.bf16_path: how bf16 weights run steps of more than one token, "dpbf16" (vdpbf16ps, the
    default where the build has it) or "fma" (widened to fp32, FMA); see gemm_path.py.
    cfg.attn_path: how attention tiles compute (config.ATTENTION_PATHS)."""
    cdef ModelC c
    cdef list keep

    def __cinit__(self):
        self.c.layers = NULL

    def __init__(self, cfg, packed, list k_caches, list v_caches, list rope_tables, list conv_states=None,
                 list ssm_states=None):
        """conv_states: a model with short-convolution or Mamba2 layers: one float32 [slots, L - 1,
        channels] array per such layer, in layer order (each batch slot's state; forward() resets a
        slot whose run starts at position 0); ssm_states: one [slots, H, P, N] per Mamba2 layer;
        their entries of k_caches / v_caches are not read."""
        cdef int i, a0
        cdef str p, dtype = cfg.dtype
        cdef dict tensors = packed.vectors
        # deterministic mode: one bf16 input form and the tiles for every step shape (gemm.h), no
        # key splits, attention tiles direct (attention.h): a row's bits do not depend on the step
        cdef bint invariant = cfg.batch_invariant
        cdef bint fma = _bf16_fma(cfg.bf16_path) and not invariant
        cdef bint stream = not invariant
        self.keep = []
        self.c.batch_invariant = invariant
        self.c.num_layers, self.c.dim, self.c.ffn_dim = cfg.num_layers, cfg.dim, cfg.ffn_dim
        self.c.vocab_size, self.c.num_heads, self.c.num_kv_heads = cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads
        self.c.head_dim, self.c.rope_dim, self.c.eps = cfg.head_dim, cfg.rope_dim, cfg.norm_eps
        self.c.rms, self.c.act, self.c.gated = cfg.norm == "rms", ACTIVATIONS[cfg.act], cfg.gated_mlp
        self.c.use_rope, self.c.qk_norm, self.c.post_norms = cfg.rope, cfg.qk_norm, cfg.post_norms
        self.c.scale, self.c.embed_scale = cfg.attn_scale, cfg.embed_scale
        self.c.residual_scale, self.c.logit_scale = cfg.residual_scale, cfg.logit_scale
        self.c.mamba_dt_min = cfg.mamba_dt_min
        self.c.mamba_norm = ("after_gate", "before_gate", "none").index(cfg.mamba_norm)
        self.c.attn_softcap, self.c.final_softcap = cfg.attn_softcap, cfg.final_softcap
        self.c.max_positions = cfg.max_positions
        self.c.num_experts, self.c.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.c.norm_topk, self.c.shared_dim = cfg.norm_topk_prob, cfg.shared_ffn_dim
        self.c.moe_routing = MOE_ROUTINGS[cfg.moe_routing]
        self.c.n_group, self.c.topk_group = cfg.n_group, cfg.topk_group
        self.c.routed_scale, self.c.shared_gate = cfg.routed_scale, cfg.shared_gate
        self.c.kv_lora, self.c.q_lora = cfg.kv_lora_rank, cfg.q_lora_rank
        self.c.mla_dn, self.c.mla_dv, self.c.mla_interleave = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.rope_interleave
        if self.c.kv_lora and self.c.rope_dim > MLA_MAX_ROPE:
            raise ValueError(f"latent attention's RoPE key of {self.c.rope_dim} values: at most {MLA_MAX_ROPE}")
        if self.c.moe_routing in (LL_MOE_GROUPED_SOFTMAX, LL_MOE_GROUPED_SIGMOID) and cfg.num_experts > LL_MOE_MAX_EXPERTS:
            raise ValueError(f"grouped routing over {cfg.num_experts} experts: at most {LL_MOE_MAX_EXPERTS}")
        sections = tuple(getattr(cfg, "mrope_section", ()) or ())
        self.c.mrope_t = self.c.mrope_h = 0
        if sections:
            if len(sections) != 3 or sum(sections) != cfg.rope_dim // 2 or cfg.rope_dim // 2 > MROPE_MAX_PAIRS:
                raise ValueError(f"mrope_section {sections}: three sections of the {cfg.rope_dim // 2} "
                                 f"frequency pairs (at most {MROPE_MAX_PAIRS})")
            self.c.mrope_t, self.c.mrope_h = sections[0], sections[0] + sections[1]
        if self.c.head_dim > LL_MAX_HEAD_DIM and not self.c.kv_lora:   # KernelConfig checks the same bound: keep them one
            raise ValueError(f"head_dim {self.c.head_dim} is above this build's LL_MAX_HEAD_DIM {LL_MAX_HEAD_DIM}")
        if len(k_caches) != self.c.num_layers or len(v_caches) != self.c.num_layers:
            raise ValueError("one K and one V cache per layer")
        if cfg.rope and len(rope_tables) != cfg.num_rope_tables:
            raise ValueError(f"{len(rope_tables)} RoPE tables for layers that use {cfg.num_rope_tables}")
        is_conv = [lc.kind != "attention" for lc in cfg.layers]   # no KV: a recurrent state instead
        self.c.conv_len = cfg.conv_len if any(is_conv) else 0
        self.c.mamba_h, self.c.mamba_p = cfg.mamba_heads, cfg.mamba_head_dim
        self.c.mamba_g, self.c.mamba_n = cfg.mamba_groups, cfg.mamba_state
        self.c.gdn_hk, self.c.gdn_hv = cfg.gdn_k_heads, cfg.gdn_v_heads
        self.c.gdn_dk, self.c.gdn_dv = cfg.gdn_k_dim, cfg.gdn_v_dim
        self.c.attn_gate = cfg.attn_gate
        if False not in is_conv:
            raise ValueError("a model needs at least one attention layer")
        a0 = is_conv.index(False)
        states, ssm = list(conv_states or []), list(ssm_states or [])
        num_mamba = sum(lc.kind in ("mamba", "deltanet") for lc in cfg.layers)
        if len(states) != sum(is_conv) or len(ssm) != num_mamba:
            raise ValueError(f"{sum(is_conv)} recurrent layers need as many conv states and {num_mamba} scan "
                             f"states, got {len(states)} and {len(ssm)}")
        self.c.num_state_slots = states[0].shape[0] if states else 0
        kc, vc = k_caches[a0], v_caches[a0]
        geometry = kv_geometry(kc if self.c.kv_lora else vc, "k" if self.c.kv_lora else "v")
        if self.c.kv_lora:   # one latent row per token in the K array (mla.h's rows); V holds nothing
            vc = kc
        if (kc.dtype != vc.dtype or kv_geometry(kc, "k") != geometry or geometry[1] != self.c.num_kv_heads
                or geometry[3] != self.c.head_dim or geometry[2] != cfg.block_size):
            raise ValueError(f"KV cache K {kc.shape} / V {vc.shape} does not fit the model "
                             f"({self.c.num_kv_heads} KV heads of {self.c.head_dim}, blocks of {cfg.block_size}; "
                             "layouts in lite_llm/_kernels/layout.py)")
        self.c.num_blocks, self.c.block_size = geometry[0], geometry[2]
        self.c.kv_type = kv_type(kc, cfg.kv_cache_dtype)
        # fp32 models stage into fp32 (an 8-bit cache's tiles keep fp32 q and probabilities)
        self.c.attn_path = LL_ATTN_ROWS if invariant else attention_path(cfg.attn_path, fma or dtype == "float32")
        self.c.rope_rows = rope_tables[0][0].shape[0] if cfg.rope and rope_tables else self.c.max_positions
        for table in (rope_tables if cfg.rope else ()):
            if (len(table) != 2 or table[0].shape != (self.c.rope_rows, self.c.rope_dim // 2)
                    or table[1].shape != table[0].shape or self.c.rope_rows < self.c.max_positions):
                raise ValueError(f"a RoPE table must be (cos, sin) of [N >= {self.c.max_positions}, "
                                 f"{self.c.rope_dim // 2}], N alike")
        self.c.layers = <LayerW *>calloc(self.c.num_layers, sizeof(LayerW))
        for i in range(self.c.num_layers):
            p = f"layers.{i}."
            lc = cfg.layers[i]
            self.c.layers[i].attn_norm_w = _vec(tensors, p + "attn_norm.weight", self.keep)
            self.c.layers[i].attn_norm_b = _vec(tensors, p + "attn_norm.bias", self.keep)
            self.c.layers[i].mlp_norm_w = _vec(tensors, p + "mlp_norm.weight", self.keep)
            self.c.layers[i].mlp_norm_b = _vec(tensors, p + "mlp_norm.bias", self.keep)
            self.c.layers[i].q_norm_w = _vec(tensors, p + "q_norm.weight", self.keep)
            self.c.layers[i].k_norm_w = _vec(tensors, p + "k_norm.weight", self.keep)
            self.c.layers[i].post_attn_norm_w = _vec(tensors, p + "post_attn_norm.weight", self.keep)
            self.c.layers[i].post_mlp_norm_w = _vec(tensors, p + "post_mlp_norm.weight", self.keep)
            if cfg.layers[i].kind == "mamba":
                self._load_mamba(i, packed, states.pop(0), ssm.pop(0), fma, stream)
            elif cfg.layers[i].kind == "deltanet":
                self._load_deltanet(i, packed, states.pop(0), ssm.pop(0), fma, stream)
            elif is_conv[i]:
                self._load_conv(i, packed, states.pop(0), fma, stream)
            if self.c.qk_norm and not is_conv[i] and (self.c.layers[i].q_norm_w is NULL or self.c.layers[i].k_norm_w is NULL):
                raise ValueError(f"{p}: qk_norm needs q_norm.weight and k_norm.weight")
            if self.c.post_norms and (self.c.layers[i].post_attn_norm_w is NULL or self.c.layers[i].post_mlp_norm_w is NULL):
                raise ValueError(f"{p}: post_norms needs post_attn_norm.weight and post_mlp_norm.weight")
            self.c.layers[i].window = lc.sliding_window
            self.c.layers[i].sinks = _vec(tensors, p + "sinks", self.keep)
            if self.c.layers[i].sinks != NULL and tensors[p + "sinks"].shape != (self.c.num_heads,):
                raise ValueError(f"{p}sinks: expected [{self.c.num_heads}] float32")
            if cfg.rope:
                self.c.layers[i].rope_cos = _vec({"c": rope_tables[lc.rope_table][0]}, "c", self.keep)
                self.c.layers[i].rope_sin = _vec({"s": rope_tables[lc.rope_table][1]}, "s", self.keep)
            if not is_conv[i]:
                self.c.layers[i].qkv = _mat(packed, p + "qkv", self.keep, fma, stream)
                self.c.layers[i].o = _mat(packed, p + "o", self.keep, fma, stream)
                if (not self.c.kv_lora and self.c.layers[i].qkv.n
                        != ((2 if self.c.attn_gate else 1) * self.c.num_heads + 2 * self.c.num_kv_heads) * self.c.head_dim):
                    raise ValueError(f"{p}qkv: {self.c.layers[i].qkv.n} rows do not fit the heads"
                                     f"{' (q | k | v | gate)' if self.c.attn_gate else ''}")
            if self.c.kv_lora:
                self._load_mla(i, packed, fma, stream)
            self.c.layers[i].ffn = cfg.dense_ffn_dim if i < cfg.first_dense_layers else self.c.ffn_dim
            self.c.layers[i].shared_input = lc.shared_input
            if not lc.mlp:   # no MLP weights
                self.c.layers[i].mlp = MLP_NONE
            elif self.c.num_experts and i >= cfg.first_dense_layers:
                self.c.layers[i].mlp = MLP_EXPERTS
                self._load_experts(i, packed, fma, stream)
            else:
                self.c.layers[i].mlp = MLP_GATED if self.c.gated else MLP_UP_ACT
                self.c.layers[i].up = _mat(packed, p + ("gate_up" if self.c.gated else "up"), self.keep, fma, stream)
                _check_gated(&self.c.layers[i].up, self.c.gated, self.c.layers[i].ffn, p + "gate_up")
                self.c.layers[i].down = _mat(packed, p + "down", self.keep, fma, stream)
            if is_conv[i]:   # no KV cache
                continue
            if (self.c.layers[i].o.input == LL_IN_Q8 and not self.c.kv_lora
                    and (self.c.num_heads // self.c.num_kv_heads * self.c.head_dim) % 32):
                raise ValueError(f"{p}o: int8 inputs need 32-value blocks within a KV group "
                                 f"({self.c.num_heads // self.c.num_kv_heads} x {self.c.head_dim} values)")
            if (k_caches[i].shape != kc.shape or k_caches[i].dtype != kc.dtype
                    or (v_caches[i].shape != vc.shape and not self.c.kv_lora)):
                raise ValueError("all KV caches must have one shape and dtype")
            self.c.layers[i].k_cache = <void *>_ptr(k_caches[i])
            self.c.layers[i].v_cache = <void *>_ptr(k_caches[i] if self.c.kv_lora else v_caches[i])
            self.keep += [k_caches[i], v_caches[i]]
        self.c.embed = _mat(packed, "embed", self.keep, fma, stream)
        self.c.lm_head = _mat(packed, "lm_head" if "lm_head" in packed.matrices else "embed", self.keep, fma, stream)
        # a tensor-parallel rank's LM head: vocabulary rows vocab0 .. vocab0 + n (tp.py); else all
        self.c.vocab0 = packed.vocab_first_row
        if self.c.vocab0 < 0 or self.c.vocab0 + self.c.lm_head.n > self.c.vocab_size:
            raise ValueError(f"lm_head rows {self.c.vocab0}..{self.c.vocab0 + self.c.lm_head.n} outside the "
                             f"vocabulary of {self.c.vocab_size}")
        self.c.pos_embed = _vec(tensors, "pos_embed", self.keep)
        self.c.post_ln = cfg.post_ln
        self.c.type_embed = _vec(tensors, "type_embed", self.keep)
        self.c.num_types = tensors["type_embed"].shape[0] if "type_embed" in tensors else 0
        if self.c.type_embed != NULL and tensors["type_embed"].shape != (self.c.num_types, self.c.dim):
            raise ValueError(f"type_embed: expected [types, {self.c.dim}], got {tensors['type_embed'].shape}")
        self.c.embed_norm_w = _vec(tensors, "embed_norm.weight", self.keep)
        self.c.embed_norm_b = _vec(tensors, "embed_norm.bias", self.keep)
        if self.c.post_ln and (self.c.embed_norm_w is NULL or self.c.embed_norm_b is NULL or self.c.rms):
            raise ValueError("a post-LayerNorm model needs embed_norm.weight and embed_norm.bias")
        self.c.final_norm_w = _vec(tensors, "final_norm.weight", self.keep)
        self.c.final_norm_b = _vec(tensors, "final_norm.bias", self.keep)
        if not self.c.use_rope and not cfg.nope and (self.c.pos_embed is NULL or tensors["pos_embed"].shape[0] < self.c.max_positions):
            raise ValueError("a model without rope needs pos_embed with max_positions rows")

    cdef _load_conv(self, int i, object packed, object state, bint fma, bint stream):
        """Layer i's short convolution (LayerW): in_proj into qkv, out_proj into o, the taps, the
        bias and its state array."""
        cdef str p = f"layers.{i}."
        cdef LayerW *L = &self.c.layers[i]
        cdef dict tensors = packed.vectors
        cdef Py_ssize_t E = self.c.dim, n = self.c.conv_len
        L.conv = 1
        L.qkv = _mat(packed, p + "in_proj", self.keep, fma, stream)
        L.o = _mat(packed, p + "out_proj", self.keep, fma, stream)
        if L.qkv.n != 3 * E or L.qkv.k != E or L.o.n != E or L.o.k != E:
            raise ValueError(f"{p}: a conv layer's in_proj is [{3 * E}, {E}] and out_proj [{E}, {E}]")
        L.conv_w = _vec(tensors, p + "conv.weight", self.keep)
        if L.conv_w is NULL or tensors[p + "conv.weight"].shape != (n, E):
            raise ValueError(f"{p}conv.weight: expected [{n}, {E}] float32 (taps, channel-minor)")
        L.conv_b = _vec(tensors, p + "conv.bias", self.keep)
        if L.conv_b != NULL and tensors[p + "conv.bias"].shape != (E,):
            raise ValueError(f"{p}conv.bias: expected [{E}] float32")
        L.conv_state = self._state(state, (self.c.conv_len - 1, E))

    cdef _load_deltanet(self, int i, object packed, object conv_state, object ssm_state, bint fma, bint stream):
        """Layer i's Gated DeltaNet (LayerW): in_proj into qkv, out_proj into o, its convolution's
        taps, A, dt_bias, the gated norm's weight and its two state arrays."""
        cdef str p = f"layers.{i}."
        cdef LayerW *L = &self.c.layers[i]
        cdef dict tensors = packed.vectors
        cdef Py_ssize_t E = self.c.dim, Hk = self.c.gdn_hk, Hv = self.c.gdn_hv, Dk = self.c.gdn_dk, Dv = self.c.gdn_dv
        cdef Py_ssize_t Cd = 2 * Hk * Dk + Hv * Dv
        L.conv = 3
        L.qkv = _mat(packed, p + "in_proj", self.keep, fma, stream)
        L.o = _mat(packed, p + "out_proj", self.keep, fma, stream)
        if L.qkv.n != Cd + Hv * Dv + 2 * Hv or L.qkv.k != E or L.o.n != E or L.o.k != Hv * Dv:
            raise ValueError(f"{p}: a Gated DeltaNet layer's in_proj is [{Cd + Hv * Dv + 2 * Hv}, {E}] and out_proj "
                             f"[{E}, {Hv * Dv}]")
        for name, shape in (("conv.weight", (self.c.conv_len, Cd)), ("ssm_a", (Hv,)), ("dt_bias", (Hv,)),
                            ("gnorm.weight", (Dv,))):
            if p + name not in tensors or tensors[p + name].shape != shape:
                raise ValueError(f"{p}{name}: expected {list(shape)} float32")
        L.conv_w = _vec(tensors, p + "conv.weight", self.keep)
        L.conv_b = NULL
        L.ssm_a = _vec(tensors, p + "ssm_a", self.keep)
        L.dt_bias, L.gnorm_w = _vec(tensors, p + "dt_bias", self.keep), _vec(tensors, p + "gnorm.weight", self.keep)
        L.conv_state = self._state(conv_state, (self.c.conv_len - 1, Cd))
        L.ssm_state = self._state(ssm_state, (Hv, Dk, Dv))

    cdef float *_state(self, object state, tuple shape) except NULL:
        """A float32 [slots, *shape] state array's data (kept alive), checked."""
        if (state.dtype != np.float32 or state.shape != (self.c.num_state_slots,) + shape or self.c.num_state_slots < 1
                or not 1 <= self.c.conv_len <= LL_CONV_MAX_LEN):
            raise ValueError(f"a recurrent state must be float32 [slots, {', '.join(map(str, shape))}] (L at most "
                             f"{LL_CONV_MAX_LEN}), got {state.dtype} {state.shape}")
        self.keep.append(state)
        return <float *>_ptr(state)

    cdef _load_mamba(self, int i, object packed, object conv_state, object ssm_state, bint fma, bint stream):
        """Layer i's Mamba2 mixer (LayerW): in_proj into qkv, out_proj into o, its convolution's
        taps and bias, A, D, dt_bias, the gated norm's weight and its two state arrays."""
        cdef str p = f"layers.{i}."
        cdef LayerW *L = &self.c.layers[i]
        cdef dict tensors = packed.vectors
        cdef Py_ssize_t E = self.c.dim, H = self.c.mamba_h, P = self.c.mamba_p, G = self.c.mamba_g
        cdef Py_ssize_t N = self.c.mamba_n, Di = H * P, Cd = Di + 2 * G * N
        L.conv = 2
        L.qkv = _mat(packed, p + "in_proj", self.keep, fma, stream)
        L.o = _mat(packed, p + "out_proj", self.keep, fma, stream)
        if L.qkv.n != Di + Cd + H or L.qkv.k != E or L.o.n != E or L.o.k != Di:
            raise ValueError(f"{p}: a Mamba2 layer's in_proj is [{Di + Cd + H}, {E}] and out_proj [{E}, {Di}]")
        for name, shape in (("conv.weight", (self.c.conv_len, Cd)), ("ssm_a", (H,)), ("ssm_d", (H,)),
                            ("dt_bias", (H,))) + ((("gnorm.weight", (Di,)),) if self.c.mamba_norm != MAMBA_NORM_NONE else ()):
            if p + name not in tensors or tensors[p + name].shape != shape:
                raise ValueError(f"{p}{name}: expected {list(shape)} float32")
        L.conv_w = _vec(tensors, p + "conv.weight", self.keep)
        L.conv_b = _vec(tensors, p + "conv.bias", self.keep)
        if L.conv_b != NULL and tensors[p + "conv.bias"].shape != (Cd,):
            raise ValueError(f"{p}conv.bias: expected [{Cd}] float32")
        L.ssm_a, L.ssm_d = _vec(tensors, p + "ssm_a", self.keep), _vec(tensors, p + "ssm_d", self.keep)
        L.dt_bias, L.gnorm_w = _vec(tensors, p + "dt_bias", self.keep), _vec(tensors, p + "gnorm.weight", self.keep)
        L.conv_state = self._state(conv_state, (self.c.conv_len - 1, Cd))
        L.ssm_state = self._state(ssm_state, (H, P, N))

    cdef _load_mla(self, int i, object packed, bint fma, bint stream):
        """Layer i's latent-attention pieces (LayerW): the norms of the latents, q_b, each head's
        W_UK^T and W_UV; qkv's and o's widths checked against the heads and the cache row (Dk =
        r + dr)."""
        cdef str p = f"layers.{i}."
        cdef LayerW *L = &self.c.layers[i]
        cdef dict tensors = packed.vectors
        cdef Py_ssize_t H = self.c.num_heads, Dk = self.c.head_dim, r = self.c.kv_lora, ql = self.c.q_lora
        cdef Py_ssize_t dn = self.c.mla_dn, dv = self.c.mla_dv, dq = dn + self.c.rope_dim, h
        L.kv_a_norm_w = _vec(tensors, p + "kv_a_norm.weight", self.keep)
        if L.kv_a_norm_w is NULL or tensors[p + "kv_a_norm.weight"].shape != (r,):
            raise ValueError(f"{p}kv_a_norm.weight: expected [{r}] float32")
        if L.qkv.n != (ql if ql else H * dq) + Dk or L.o.k != H * dv:
            raise ValueError(f"{p}: latent attention's qkv [{L.qkv.n}, .] / o [., {L.o.k}] do not fit "
                             f"{H} heads of {dn} + {self.c.rope_dim} (values {dv}; kv_lora_rank {r}, "
                             f"q_lora_rank {ql})")
        if ql:
            L.q_a_norm_w = _vec(tensors, p + "q_a_norm.weight", self.keep)
            if L.q_a_norm_w is NULL or tensors[p + "q_a_norm.weight"].shape != (ql,):
                raise ValueError(f"{p}q_a_norm.weight: expected [{ql}] float32")
            L.q_b = _mat(packed, p + "q_b", self.keep, fma, stream)
            if L.q_b.n != H * dq or L.q_b.k != ql:
                raise ValueError(f"{p}q_b: expected [{H * dq}, {ql}]")
        L.mla_heads = <Mat *>calloc(2 * H, sizeof(Mat))
        for h in range(2 * H):
            name = p + (f"k_b.{h}" if h < H else f"v_b.{h - H}")
            L.mla_heads[h] = _mat(packed, name, self.keep, fma, stream)
            if (L.mla_heads[h].n, L.mla_heads[h].k) != ((r, dn) if h < H else (dv, r)):
                raise ValueError(f"{name}: expected [{r if h < H else dv}, {dn if h < H else r}]")
            if _describe(&L.mla_heads[h]) != _describe(&L.mla_heads[0 if h < H else H]):
                raise ValueError(f"{name}: its format differs from head 0's")

    cdef _load_experts(self, int i, object packed, bint fma, bint stream):
        """Layer i's router, experts and shared expert (see LayerW); every expert of a layer in
        one format (one 3-D tensor in a file), so the gathered rows have one input form."""
        cdef str p = f"layers.{i}."
        cdef int j, X = self.c.num_experts
        cdef LayerW *L = &self.c.layers[i]
        cdef dict tensors = packed.vectors
        router = tensors.get(p + "router.weight")
        if router is None or router.shape != (X, self.c.dim):
            raise ValueError(f"{p}router.weight: expected [{X}, {self.c.dim}] float32")
        L.router = _vec(tensors, p + "router.weight", self.keep)
        L.router_b = _vec(tensors, p + "router.bias", self.keep)
        if L.router_b != NULL and tensors[p + "router.bias"].shape != (X,):
            raise ValueError(f"{p}router.bias: expected [{X}] float32")
        L.router_corr = _vec(tensors, p + "router.correction_bias", self.keep)
        if L.router_corr != NULL and tensors[p + "router.correction_bias"].shape != (X,):
            raise ValueError(f"{p}router.correction_bias: expected [{X}] float32")
        cdef str up = "gate_up" if self.c.gated else "up"   # ungated experts: up, act, down (Nemotron-H's relu^2)
        L.experts = <Mat *>calloc(2 * X, sizeof(Mat))
        for j in range(X):
            L.experts[j] = _mat(packed, p + f"experts.{j}.{up}", self.keep, fma, stream)
            _check_up(&L.experts[j], self.c.gated, self.c.ffn_dim, p + f"experts.{j}.{up}")
            L.experts[X + j] = _mat(packed, p + f"experts.{j}.down", self.keep, fma, stream)
            if (_describe(&L.experts[j]) != _describe(&L.experts[0])
                    or _describe(&L.experts[X + j]) != _describe(&L.experts[X])):
                raise ValueError(f"{p}experts.{j}: its format differs from expert 0's")
        if self.c.shared_dim:
            L.up = _mat(packed, p + f"shared.{up}", self.keep, fma, stream)
            _check_up(&L.up, self.c.gated, self.c.shared_dim, p + f"shared.{up}")
            L.down = _mat(packed, p + "shared.down", self.keep, fma, stream)
            L.shared_gate_w = _vec(tensors, p + "shared_gate.weight", self.keep) if self.c.shared_gate else NULL
            if self.c.shared_gate and (L.shared_gate_w is NULL
                                       or tensors[p + "shared_gate.weight"].shape != (self.c.dim,)):
                raise ValueError(f"{p}shared_gate.weight: expected [{self.c.dim}] float32")

    def __dealloc__(self):
        cdef int i
        if self.c.layers != NULL:
            for i in range(self.c.num_layers):
                free(self.c.layers[i].experts)
                free(self.c.layers[i].mla_heads)
        free(self.c.layers)

    def formats(self):
        """{matrix name: (part types, input form)}: the format each matrix runs in (a tied
        embedding is the LM head: listed once, as "lm_head")."""
        cdef int i
        out = {"lm_head": _describe(&self.c.lm_head)}
        if self.c.embed.part[0].w != self.c.lm_head.part[0].w:
            out["embed"] = _describe(&self.c.embed)
        for i in range(self.c.num_layers):
            out[f"layers.{i}.{'in_proj' if self.c.layers[i].conv else 'qkv'}"] = _describe(&self.c.layers[i].qkv)
            out[f"layers.{i}.{'out_proj' if self.c.layers[i].conv else 'o'}"] = _describe(&self.c.layers[i].o)
            if self.c.q_lora:
                out[f"layers.{i}.q_b"] = _describe(&self.c.layers[i].q_b)
            if self.c.kv_lora:   # every head in one format (_load_mla)
                out[f"layers.{i}.k_b"] = _describe(&self.c.layers[i].mla_heads[0])
                out[f"layers.{i}.v_b"] = _describe(&self.c.layers[i].mla_heads[self.c.num_heads])
            if self.c.layers[i].mlp == MLP_NONE:
                continue
            if self.c.layers[i].mlp == MLP_EXPERTS:   # one entry for all of a layer's experts: they share a format
                up = "gate_up" if self.c.gated else "up"
                out[f"layers.{i}.experts.{up}"] = _describe(&self.c.layers[i].experts[0])
                out[f"layers.{i}.experts.down"] = _describe(&self.c.layers[i].experts[self.c.num_experts])
                if self.c.shared_dim:
                    out[f"layers.{i}.shared.{up}"] = _describe(&self.c.layers[i].up)
                    out[f"layers.{i}.shared.down"] = _describe(&self.c.layers[i].down)
                continue
            out[f"layers.{i}.{'gate_up' if self.c.gated else 'up'}"] = _describe(&self.c.layers[i].up)
            out[f"layers.{i}.down"] = _describe(&self.c.layers[i].down)
        return out


    @property
    def num_blocks(self):
        return self.c.num_blocks

    @property
    def block_size(self):
        return self.c.block_size

    @property
    def vocab_size(self):
        return self.c.vocab_size


cdef _check_gated(const Mat *w, bint gated, int ffn_dim, str name):
    """A gated MLP's [2F, E] weight in layout.pack_gated's panels: a quantized one is a gate
    part and an up part."""
    if gated and w.num_panels != 2 * ((ffn_dim + 15) // 16):
        raise ValueError(f"{name}: expected layout.pack_gated panels")
    if gated and w.input == LL_IN_Q8 and w.num_parts != 2:
        raise ValueError(f"{name}: a block-quantized gated MLP is a gate part and an up part")


cdef _check_up(const Mat *w, bint gated, int ffn_dim, str name):
    """An expert's (or a shared expert's) first matrix: gated, as _check_gated; else [F, E]."""
    if gated:
        _check_gated(w, True, ffn_dim, name)
    elif w.n != ffn_dim:
        raise ValueError(f"{name}: expected {ffn_dim} rows")


cdef bint _experts_quantized(const ModelC *mc):
    """Whether some layer's experts take int8 inputs (they share a format within a layer)."""
    cdef int i
    for i in range(mc.num_layers if mc.num_experts else 0):
        if mc.layers[i].experts == NULL:
            continue
        if mc.layers[i].experts[0].input == LL_IN_Q8 or mc.layers[i].experts[mc.num_experts].input == LL_IN_Q8:
            return True
    return False


cdef bint _any_quantized(const ModelC *mc):
    """Whether some GEMM takes int8 inputs (the embedding is only gathered: not a GEMM)."""
    cdef int i
    if mc.lm_head.input == LL_IN_Q8:
        return True
    for i in range(mc.num_layers):
        if (mc.layers[i].qkv.input == LL_IN_Q8 or mc.layers[i].o.input == LL_IN_Q8
                or mc.layers[i].up.input == LL_IN_Q8 or mc.layers[i].down.input == LL_IN_Q8
                or (mc.q_lora and mc.layers[i].q_b.input == LL_IN_Q8)):
            return True
    return False


def barrier_spins() -> int:
    """Busy-wait iterations of the step barrier before it yields its CPU between checks
    (omp_util.h): LITE_LLM_BARRIER_SPINS, default 2000 (tens of microseconds); -1 selects
    libgomp's barrier (spin GOMP_SPINCOUNT, then sleep)."""
    raw = os.environ.get("LITE_LLM_BARRIER_SPINS", "2000")
    try:
        spins = int(raw)
    except ValueError:
        spins = -2
    if spins < -1:
        raise ValueError(f"LITE_LLM_BARRIER_SPINS={raw!r}: want an integer >= 0, or -1 for libgomp's barrier")
    return spins


cdef class Workspace:
    """Activation buffers for steps of up to max_tokens tokens and max_rows logits rows
    (lora_rank > 0: and for LoRA adapters of up to that rank, lora.pxi)."""
    cdef readonly int max_tokens, max_rows, num_threads, lora_rank
    cdef WorkC c
    cdef list keep

    def __init__(self, Model m, int max_tokens, int max_rows, int num_threads, int lora_rank=0):
        ll_set_barrier_spins(barrier_spins())
        cdef ModelC *mc = &m.c
        cdef int di = mc.mamba_h * mc.mamba_p, cd = di + 2 * mc.mamba_g * mc.mamba_n
        cdef int gdi = mc.gdn_hv * mc.gdn_dv, gcd = 2 * mc.gdn_hk * mc.gdn_dk + gdi
        cdef int qkv_n = max((mc.num_heads * (2 if mc.attn_gate else 1) + 2 * mc.num_kv_heads) * mc.head_dim,
                             3 * mc.dim if mc.conv_len else 0, di + cd + mc.mamba_h, gcd + gdi + 2 * mc.gdn_hv,
                             _mla_qoff(mc) + mc.head_dim if mc.kv_lora else 0)
        di, cd = max(di, gdi), max(cd, gcd)   # ssm_x / ssm_y serve either kind of layer
        cdef int ffn = max(mc.ffn_dim, mc.shared_dim)   # MoE: act / xb2 / xq2 hold the shared expert's
        cdef int i
        for i in range(mc.num_layers):   # and dense layers of their own width (DeepSeek's first)
            ffn = max(ffn, mc.layers[i].ffn)
        cdef int up_n = 0 if mc.gated else ffn
        cdef int max_k = max(mc.dim, ffn, mc.num_heads * mc.head_dim, mc.q_lora, di, mc.num_heads * mc.mla_dv)
        cdef Py_ssize_t scratch = ll_attention_scratch(mc.head_dim, mc.num_heads // mc.num_kv_heads)
        if mc.kv_lora:   # the attention's, and a head projection's input rows in their form (_mla_heads)
            scratch = max(scratch, ll_mla_scratch(mc.num_heads, mc.head_dim),
                          MLA_TOKENS * (max(mc.mla_dn, mc.kv_lora) + 64))
        scratch = (scratch + 15) // 16 * 16   # each thread's row on a 64-byte line
        if mc.mamba_h:
            scratch = max(scratch, ll_ssd_scratch())
        if mc.gdn_hv:
            scratch = max(scratch, ll_gdn_scratch(mc.gdn_dv))
        self.max_tokens, self.max_rows, self.num_threads = max_tokens, max_rows, num_threads
        bufs = [aligned_zeros((max_tokens, mc.dim), np.float32),
                aligned_zeros((max(max_tokens, max_rows), mc.dim), np.float32),
                aligned_zeros((max_tokens, qkv_n), np.float32),
                aligned_zeros((max_tokens, mc.num_heads * mc.head_dim), np.float32),
                aligned_zeros((max_tokens, up_n), np.float32),
                aligned_zeros((max_tokens, ffn), np.float32),
                aligned_zeros((max(num_threads, 1), scratch), np.float32),
                aligned_zeros((max(max_tokens, max_rows), (max_k + 1) // 2 + 1), np.uint32),
                aligned_zeros((3 * 16,), np.int32),
                aligned_zeros((max_tokens + 1,), np.int32),
                aligned_zeros((max_tokens, (ffn + 1) // 2 + 1), np.uint32),
                aligned_zeros((_max_split_items(max(num_threads, 1)),
                               _partial_stride(mc.num_heads // mc.num_kv_heads, mc.head_dim)), np.float32)]
        rows = max(max_tokens, max_rows)
        if _any_quantized(mc) or _experts_quantized(mc):   # int8 blocks of GEMM inputs, for block-quantized weights
            bufs += [aligned_zeros((rows, max_k), np.int8), aligned_zeros((rows, max_k // 32 + 1), np.float32),
                     aligned_zeros((rows, max_k // 16 + 1), np.float32),
                     aligned_zeros((max_tokens, ffn), np.int8),
                     aligned_zeros((max_tokens, ffn // 32 + 1), np.float32),
                     aligned_zeros((max_tokens, ffn // 16 + 1), np.float32),
                     aligned_zeros((rows, max_k // 16 + 1), np.int32),
                     aligned_zeros((max_tokens, ffn // 16 + 1), np.int32)]
        else:
            bufs += [None] * 8
        self.keep = bufs
        self.c.x, self.c.h, self.c.qkv = <float *>_ptr(bufs[0]), <float *>_ptr(bufs[1]), <float *>_ptr(bufs[2])
        self.c.attn, self.c.mlp, self.c.act = <float *>_ptr(bufs[3]), <float *>_ptr(bufs[4]), <float *>_ptr(bufs[5])
        self.c.scores, self.c.xb = <float *>_ptr(bufs[6]), <uint32_t *>_ptr(bufs[7])
        self.c.work = <long long *>_ptr(bufs[8])          # the first line: the work counter
        self.c.barrier = <int *>_ptr(bufs[8]) + 16        # the next two: the barrier's count and sense
        self.c.tiles = <int32_t *>_ptr(bufs[9])
        self.c.xb2 = <uint32_t *>_ptr(bufs[10])
        self.c.partials = <float *>_ptr(bufs[11])
        self.c.xq = self.c.xq2 = NULL
        self.c.xqd = self.c.xqs = self.c.xqd2 = self.c.xqs2 = NULL
        self.c.xqn = self.c.xqn2 = NULL
        if bufs[12] is not None:
            self.c.xq, self.c.xqd, self.c.xqs = <int8_t *>_ptr(bufs[12]), <float *>_ptr(bufs[13]), <float *>_ptr(bufs[14])
            self.c.xq2, self.c.xqd2, self.c.xqs2 = <int8_t *>_ptr(bufs[15]), <float *>_ptr(bufs[16]), <float *>_ptr(bufs[17])
            self.c.xqn, self.c.xqn2 = <int32_t *>_ptr(bufs[18]), <int32_t *>_ptr(bufs[19])
        self.c.scratch_len = bufs[6].shape[1]
        runs = aligned_zeros((max_tokens + 1,), np.int32)
        self.keep.append(runs)
        self.c.runs = <int32_t *>_ptr(runs)
        self.c.ssm_x = self.c.ssm_y = NULL
        if di:
            ssm = [aligned_zeros((max_tokens, cd), np.float32), aligned_zeros((max_tokens, di), np.float32)]
            self.keep.append(ssm)
            self.c.ssm_x, self.c.ssm_y = <float *>_ptr(ssm[0]), <float *>_ptr(ssm[1])
        self._moe_buffers(mc, max_tokens)
        self.c.qlat = self.c.mla_q = self.c.mla_v = NULL
        if mc.q_lora:
            qlat = aligned_zeros((max_tokens, mc.q_lora), np.float32)
            self.keep.append(qlat)
            self.c.qlat = <float *>_ptr(qlat)
        if mc.kv_lora:
            mla = [aligned_zeros((max_tokens, mc.num_heads * mc.head_dim), np.float32),
                   aligned_zeros((max_tokens, mc.num_heads * mc.mla_dv), np.float32)]
            self.keep.append(mla)
            self.c.mla_q, self.c.mla_v = <float *>_ptr(mla[0]), <float *>_ptr(mla[1])
        self.c.ltmp = self.c.lgu = NULL
        self.c.lgrp = NULL
        if lora_rank > 0:
            lb = [aligned_zeros((max_tokens, 3 * lora_rank), np.float32),
                  aligned_zeros((max_tokens, 2 * mc.ffn_dim), np.float32), aligned_zeros((3 * max_tokens + 1,), np.int32)]
            self.keep.append(lb)
            self.c.ltmp, self.c.lgu, self.c.lgrp = <float *>_ptr(lb[0]), <float *>_ptr(lb[1]), <int32_t *>_ptr(lb[2])
        self.lora_rank = lora_rank

    cdef _moe_buffers(self, const ModelC *mc, int max_tokens):
        """The MoE phase's buffers (WorkC), sized for A = max_tokens x K routed rows."""
        cdef Py_ssize_t X = mc.num_experts, K = mc.top_k, A = max_tokens * mc.top_k, E = mc.dim, F = mc.ffn_dim
        self.c.router = self.c.moe_wt = self.c.gx = self.c.gxqd = self.c.gxqs = self.c.gact = NULL
        self.c.gactqd = self.c.gactqs = self.c.gout = NULL
        self.c.gxqn = self.c.gactqn = NULL
        self.c.moe_sel = self.c.moe_slot = self.c.moe_tok = self.c.moe_exp = NULL
        self.c.moe_off = self.c.moe_cur = self.c.moe_active = NULL
        self.c.gxb = self.c.gactb = NULL
        self.c.gxq = self.c.gactq = NULL
        if not X:
            return
        idx = aligned_zeros((2 * A + 2 * A + 3 * (X + 1),), np.int32)
        bufs = {"router": aligned_zeros((max_tokens, X + 1), np.float32), "wt": aligned_zeros((A,), np.float32),
                "gx": aligned_zeros((A, E), np.float32), "gxb": aligned_zeros((A, (E + 1) // 2 + 1), np.uint32),
                "gact": aligned_zeros((A, F), np.float32), "gactb": aligned_zeros((A, (F + 1) // 2 + 1), np.uint32),
                "gout": aligned_zeros((A, E), np.float32), "idx": idx}
        self.keep.append(bufs)
        self.c.router, self.c.moe_wt = <float *>_ptr(bufs["router"]), <float *>_ptr(bufs["wt"])
        self.c.gx, self.c.gxb = <float *>_ptr(bufs["gx"]), <uint32_t *>_ptr(bufs["gxb"])
        self.c.gact, self.c.gactb = <float *>_ptr(bufs["gact"]), <uint32_t *>_ptr(bufs["gactb"])
        self.c.gout = <float *>_ptr(bufs["gout"])
        cdef int32_t *base = <int32_t *>_ptr(idx)
        self.c.moe_sel, self.c.moe_slot = base, base + A
        self.c.moe_tok, self.c.moe_exp = base + 2 * A, base + 3 * A
        self.c.moe_off, self.c.moe_cur, self.c.moe_active = base + 4 * A, base + 4 * A + X + 1, base + 4 * A + 2 * (X + 1)
        if _experts_quantized(mc):
            q = [aligned_zeros((A, E), np.int8), aligned_zeros((A, E // 32 + 1), np.float32),
                 aligned_zeros((A, E // 16 + 1), np.float32), aligned_zeros((A, F), np.int8),
                 aligned_zeros((A, F // 32 + 1), np.float32), aligned_zeros((A, F // 16 + 1), np.float32),
                 aligned_zeros((A, E // 16 + 1), np.int32), aligned_zeros((A, F // 16 + 1), np.int32)]
            self.keep.append(q)
            self.c.gxq, self.c.gxqd, self.c.gxqs = <int8_t *>_ptr(q[0]), <float *>_ptr(q[1]), <float *>_ptr(q[2])
            self.c.gactq, self.c.gactqd, self.c.gactqs = <int8_t *>_ptr(q[3]), <float *>_ptr(q[4]), <float *>_ptr(q[5])
            self.c.gxqn, self.c.gactqn = <int32_t *>_ptr(q[6]), <int32_t *>_ptr(q[7])

    @property
    def hidden(self):
        """The residual stream [max_tokens, E] after the last forward (tests)."""
        return self.keep[0]


def forward(Model m, Workspace ws,
            const int32_t[::1] token_ids,      # IN [T]
            const int32_t[::1] positions,      # IN [T]
            const int64_t[::1] slot_mapping,   # IN [T] KV slot of each token
            const int32_t[::1] tok_seq,        # IN [T] sequence index of each token
            const int32_t[:, ::1] block_tables,  # IN [S, max_blocks]
            const int32_t[::1] logits_rows,    # IN [R] token indices whose logits are wanted
            float[:, ::1] logits,              # OUT [R, V], or [R, E] with hidden
            int num_threads, TPComm tp=None,
            const int32_t[::1] attn_positions=None,   # IN [T] last position each token attends to; None: its own
            const int32_t[::1] token_types=None,      # IN [T] token-type rows (type_embed); None: row 0
            bint hidden=False, LoraWeights lora=None,
            const int32_t[::1] seq_lora=None,   # IN [S] adapter slot of each sequence (block table row), -1: none
            const float[:, ::1] mm_embeds=None,  # IN [M, E] rows of encoded images (multimodal.py)
            const int32_t[::1] embed_src=None,   # IN [T] row of mm_embeds token t takes in place of its
                                                 #    token's embedding; -1: its token's
            const int32_t[:, ::1] rope_pos=None,   # IN [T, 3] multimodal RoPE (temporal, height, width)
            const int32_t[::1] rope_rows=None):    # IN [T] RoPE table row of each token; None: its position
    """Run all layers over a flat batch of T tokens from S sequences; the KV of every token is
    written to its slot first, then each token attends to its sequence's positions <= its own
    (causal), or <= attn_positions[t] (an encoder: the sequence's last position, every token of
    it in this step; a Gemma 3 image token: its image's last, the whole image in this step),
    from the sliding window behind its own position on windowed layers. hidden: logits gets the rows' final hidden states (after the final norm,
    if any) instead of the LM head's logits (pooling models). lora / seq_lora: the adapters'
    stacked weights and each sequence's slot in them (lora.pxi). An image's tokens take their
    rows of mm_embeds (embed_src); a model with mrope_section turns q and k by rope_pos
    (positions then only order the cache and the mask), one with rope_rows by those rows of
    its RoPE tables (LongRoPE's long factors for a long prompt's first tokens, rope.py)."""
    cdef Py_ssize_t t, r, T = token_ids.shape[0], R = logits_rows.shape[0]
    cdef ModelC *mc = &m.c
    cdef const int32_t *apos = &positions[0] if T else NULL
    cdef LoraStep ls
    ls.nl, ls.groups, ls.tmp, ls.ldt = 0, NULL, NULL, 0
    cdef const float *mm_ptr = NULL
    cdef const int32_t *src_ptr = NULL
    cdef const int32_t *rpos_ptr = NULL
    cdef const int32_t *rrow_ptr = NULL
    if T > ws.max_tokens or R > ws.max_rows or num_threads > ws.num_threads:
        raise ValueError(f"step of {T} tokens / {R} rows / {num_threads} threads exceeds the workspace")
    if positions.shape[0] != T or slot_mapping.shape[0] != T or tok_seq.shape[0] != T:
        raise ValueError("forward: per-token arrays differ in length")
    if logits.shape[0] != R or logits.shape[1] != (mc.dim if hidden else mc.vocab_size):
        raise ValueError(f"forward: logits {tuple(logits.shape)} != ({R}, {mc.dim if hidden else mc.vocab_size})")
    if (attn_positions is not None and attn_positions.shape[0] != T) or (token_types is not None and token_types.shape[0] != T):
        raise ValueError("forward: attn_positions / token_types differ in length from the tokens")
    if hidden and tp is not None:
        raise ValueError("forward: hidden rows are not computed under tensor parallel")
    if tp is not None and T * mc.dim > tp.c.cap:
        raise ValueError(f"step of {T} tokens: the tensor-parallel slots hold {tp.c.cap // mc.dim}")
    if T == 0:
        return
    for t in range(T):   # the kernels trust these; a bad index must not reach them
        if token_ids[t] < 0 or token_ids[t] >= mc.vocab_size:
            raise ValueError(f"token id {token_ids[t]} outside the vocabulary of {mc.vocab_size}")
        if positions[t] < 0 or positions[t] >= mc.max_positions:
            raise ValueError(f"position {positions[t]} outside 0..{mc.max_positions - 1}")
        if slot_mapping[t] < 0 or slot_mapping[t] >= <int64_t>mc.num_blocks * mc.block_size:
            raise ValueError(f"slot {slot_mapping[t]} outside the KV cache")
        if tok_seq[t] < 0 or tok_seq[t] >= block_tables.shape[0] or positions[t] // mc.block_size >= block_tables.shape[1]:
            raise ValueError("token's sequence or position beyond the block tables")
        if attn_positions is not None and (attn_positions[t] < 0 or attn_positions[t] >= mc.max_positions
                                           or attn_positions[t] // mc.block_size >= block_tables.shape[1]):
            raise ValueError(f"attention position {attn_positions[t]} beyond the block tables")
        if token_types is not None and (token_types[t] < 0 or token_types[t] >= max(mc.num_types, 1)):
            raise ValueError(f"token type {token_types[t]} outside 0..{max(mc.num_types, 1) - 1}")
    if mc.conv_len:   # a conv layer runs each sequence's tokens in one pass from its slot's state
        seen = set()
        for t in range(T):
            if tok_seq[t] >= mc.num_state_slots:
                raise ValueError(f"sequence {tok_seq[t]} beyond the {mc.num_state_slots} state slots")
            if t and tok_seq[t] == tok_seq[t - 1]:
                if positions[t] != positions[t - 1] + 1:
                    raise ValueError("a sequence's tokens in a step must have consecutive positions")
            elif tok_seq[t] in seen:
                raise ValueError("a sequence's tokens in a step must be contiguous")
            seen.add(tok_seq[t])
    if attn_positions is not None:
        apos = &attn_positions[0]
    for r in range(R):
        if logits_rows[r] < 0 or logits_rows[r] >= T:
            raise ValueError(f"logits row {logits_rows[r]} outside the step")
    if lora is not None and seq_lora is not None:
        if tp is not None or ws.c.ltmp == NULL or lora.max_rank > ws.lora_rank or lora.num_layers != mc.num_layers \
                or lora.dim != mc.dim or lora.ffn_dim != mc.ffn_dim:
            raise ValueError("forward: LoRA weights that do not fit this model and workspace (or tensor parallel)")
        if seq_lora.shape[0] < block_tables.shape[0]:
            raise ValueError(f"forward: seq_lora [{seq_lora.shape[0]}] shorter than the {block_tables.shape[0]} block tables")
        for t in range(block_tables.shape[0]):
            if seq_lora[t] < -1 or seq_lora[t] >= lora.max_loras:
                raise ValueError(f"adapter slot {seq_lora[t]} outside -1..{lora.max_loras - 1}")
        ls.groups, ls.tmp, ls.ldt = lora.g, ws.c.ltmp, 3 * ws.lora_rank
        ls.lslot, ls.loff, ls.lrows = ws.c.lgrp, ws.c.lgrp + T, ws.c.lgrp + 2 * T + 1
        ls.nl = _lora_group(lora, &seq_lora[0], &tok_seq[0], T, ws.c.lgrp, ws.c.lgrp + T, ws.c.lgrp + 2 * T + 1)
    if embed_src is not None:
        if embed_src.shape[0] != T or mm_embeds is None or mm_embeds.shape[1] != mc.dim:
            raise ValueError(f"forward: embed_src needs [T] entries and mm_embeds [M, {mc.dim}]")
        for t in range(T):
            if embed_src[t] < -1 or embed_src[t] >= mm_embeds.shape[0]:
                raise ValueError(f"embed_src {embed_src[t]} outside the {mm_embeds.shape[0]} image rows")
        src_ptr = &embed_src[0]
        mm_ptr = &mm_embeds[0, 0] if mm_embeds.shape[0] else NULL
    if mc.mrope_t:
        if rope_pos is None or rope_pos.shape[0] != T or rope_pos.shape[1] != 3:
            raise ValueError("forward: a multimodal-RoPE model needs rope_pos [T, 3]")
        for t in range(T):
            for r in range(3):
                if rope_pos[t, r] < 0 or rope_pos[t, r] >= mc.max_positions:
                    raise ValueError(f"rope position {rope_pos[t, r]} outside 0..{mc.max_positions - 1}")
        rpos_ptr = &rope_pos[0, 0]
    if rope_rows is not None:
        if rope_rows.shape[0] != T or mc.mrope_t:
            raise ValueError("forward: rope_rows needs [T] entries (and a model without multimodal RoPE)")
        for t in range(T):
            if rope_rows[t] < 0 or rope_rows[t] >= mc.rope_rows:
                raise ValueError(f"rope row {rope_rows[t]} outside 0..{mc.rope_rows - 1}")
        rrow_ptr = &rope_rows[0]
    with nogil:
        _forward(mc, &ws.c, T, &token_ids[0], &positions[0], &slot_mapping[0], &tok_seq[0],
                 &block_tables[0, 0], block_tables.shape[1], R, &logits_rows[0] if R else NULL,
                 &logits[0, 0] if R else NULL, num_threads, &tp.c if tp is not None else NULL,
                 apos, &token_types[0] if token_types is not None else NULL, hidden, &ls,
                 mm_ptr, src_ptr, rpos_ptr, rrow_ptr)
    if tp is not None and tp.c.failed:
        raise RuntimeError(f"tensor parallel rank {tp.c.rank}: an all-reduce {TP_FAILURES[tp.c.failed]} "
                           "(another rank died or stopped)")


cdef inline void _embed_row(const Mat *e, Py_ssize_t row, float *out) noexcept nogil:
    """Row `row` of the packed [V, E] embedding (one part), widened to fp32."""
    cdef Py_ssize_t i, panel = row // 16, lane = row % 16, k = e.k, k2 = (e.k + 1) // 2
    cdef const float *wf
    cdef const uint16_t *wh
    cdef const uint8_t *wb
    cdef const uint8_t *wc = NULL
    cdef uint8_t v
    cdef float sc = 0
    cdef int wtype = e.part[0].wtype
    if ll_wtype_is_quant(wtype):
        ll_qdequant_lane(<const uint8_t *>e.part[0].w + panel * ll_qpanel_bytes(wtype, k), wtype, k, <int>lane, out)
    elif wtype == LL_W_BF16:
        wh = <const uint16_t *>e.part[0].w + panel * k2 * 32 + lane * 2
        for i in range(k):
            out[i] = ll_bf16_to_f32(wh[(i // 2) * 32 + (i % 2)])
    elif wtype == LL_W_FP8:    # as the GEMM widens it (gemm.h): value x 2^-8 times the scale x 256
        wb = <const uint8_t *>e.part[0].w + panel * ll_panel_bytes(wtype, k)
        for i in range(k):
            if i % LL_FP8_CHUNK == 0:
                wc = wb + (i // LL_FP8_CHUNK) * LL_FP8_CHUNK_BYTES
                sc = (<const float *>wc)[lane]
            v = wc[64 + (i % LL_FP8_CHUNK) * 16 + lane]
            out[i] = ll_f16_to_f32(<uint16_t>(((v & 0x80) << 8) | ((v & 0x7f) << 7))) * sc
    elif wtype == LL_W_F32:
        wf = <const float *>e.part[0].w + panel * k * 16 + lane
        for i in range(k):
            out[i] = wf[i * 16]
    else:
        wh = <const uint16_t *>e.part[0].w + panel * k * 16 + lane
        for i in range(k):
            out[i] = ll_f16_to_f32(wh[i * 16])


cdef inline void _norm(const ModelC *m, const float *w, const float *b, const float *x, float *out) noexcept nogil:
    if m.rms:
        ll_rmsnorm_f32(x, w, out, m.dim, m.eps)
    else:
        ll_layernorm_f32(x, w, b, out, m.dim, m.eps)


cdef struct StepC:
    # One engine step's flat arrays (see forward()).
    Py_ssize_t T, R, max_blocks, num_tiles, max_keys, num_runs
    const int32_t *token_ids
    const int32_t *positions
    const int64_t *slot_mapping
    const int32_t *tok_seq
    const int32_t *block_tables
    const int32_t *logits_rows
    float *logits
    const int32_t *attn_pos       # [T] last position each token attends to (positions: causal)
    const int32_t *token_types    # [T] or NULL
    int hidden                    # logits gets [R, E] hidden rows
    ll_tp *tp                     # tensor parallel: this rank's group, or NULL
    uint64_t gen0                 # all-reduces the group did before this step
    LoraStep lora                 # the step's adapters (lora.nl 0: none)
    const float *mm_embeds        # [M, E] image rows, or NULL
    const int32_t *embed_src      # [T] row of mm_embeds per token, -1: the token's embedding; or NULL
    const int32_t *rope_pos       # [T, 3] multimodal RoPE positions, or NULL
    const int32_t *rope_rows      # [T] RoPE table row of each token, or NULL: its position


cdef void _forward(const ModelC *m, const WorkC *ws, Py_ssize_t T, const int32_t *token_ids, const int32_t *positions,
                   const int64_t *slot_mapping, const int32_t *tok_seq, const int32_t *block_tables,
                   Py_ssize_t max_blocks, Py_ssize_t R, const int32_t *logits_rows, float *logits,
                   int nt, ll_tp *tp, const int32_t *attn_pos, const int32_t *token_types, int hidden,
                   const LoraStep *lora, const float *mm_embeds=NULL, const int32_t *embed_src=NULL,
                   const int32_t *rope_pos=NULL, const int32_t *rope_rows=NULL) noexcept nogil:
    """ONE parallel region for the whole step: every thread runs _step over its share of each
    phase, with a barrier between dependent phases (far cheaper than a fork/join per op)."""
    cdef StepC s
    cdef int tid = 0      # Cython hands it to the region as firstprivate: never copied uninitialised
    s.T, s.R, s.max_blocks = T, R, max_blocks
    s.token_ids, s.positions, s.slot_mapping, s.tok_seq = token_ids, positions, slot_mapping, tok_seq
    s.block_tables, s.logits_rows, s.logits = block_tables, logits_rows, logits
    s.tp, s.gen0 = tp, tp.gen if tp != NULL else 0
    s.attn_pos, s.token_types, s.hidden = attn_pos, token_types, hidden
    s.lora = lora[0]
    s.mm_embeds, s.embed_src, s.rope_pos, s.rope_rows = mm_embeds, embed_src, rope_pos, rope_rows
    ws.work[0] = 0   # the one reset of the step: phases after it follow by generation (work.h)
    ll_barrier_reset(ws.barrier, ws.barrier + 16)
    s.num_tiles = _build_tiles(tok_seq, T, ws.tiles)
    s.num_runs = _build_runs(tok_seq, T, ws.runs) if m.conv_len else 0
    s.max_keys = _max_keys(attn_pos, T) if not m.batch_invariant else 0   # 0: no key splits (_num_splits)
    with parallel(num_threads=nt):
        tid = openmp.omp_get_thread_num()
        ll_barrier_enter(ws.barrier, ws.barrier + 16, openmp.omp_get_num_threads())
        _step(m, ws, &s, tid, openmp.omp_get_num_threads())
        ll_barrier_leave()
    if tp != NULL:   # two all-reduces per layer and the logits' wait: the same count on every rank
        tp.gen = s.gen0 + 2 * m.num_layers + (1 if R > 0 else 0)


cdef inline void _norm_rows(const ModelC *m, const float *w, const float *b, const float *x,
                            const int32_t *rows, float *out, uint32_t *xb, const ll_qact *xq, int form,
                            Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """out[t] = norm(x[rows[t] or t]) for t in [t0, t1), and in the input form of the next GEMM."""
    cdef Py_ssize_t t, E = m.dim
    for t in range(t0, t1):
        _norm(m, w, b, x + (rows[t] if rows != NULL else t) * E, out + t * E)
    _to_input(form, out, E, t0, t1, E, xb, xq)


cdef inline void _post_ln_rows(const ModelC *m, const float *w, const float *b, float *x, float *h, uint32_t *xb,
                               const ll_qact *xq, int form, Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """Post-norm models (BERT): x[t] = LN(x[t]) (the previous sub-layer's norm, after its residual
    add), and h[t] the same rows in the next GEMM's input form."""
    cdef Py_ssize_t t
    _norm_rows(m, w, b, x, NULL, h, xb, xq, form, t0, t1)
    for t in range(t0, t1):
        memcpy(x + t * m.dim, h + t * m.dim, m.dim * sizeof(float))


cdef inline void _residual_add(const ModelC *m, const float *w, float *h, float *x,
                               Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """x[t] += residual_scale * (rmsnorm(h[t]) * w, or h[t] when w is NULL) for t in [t0, t1):
    a sub-layer's output normed (Gemma's post-attention and post-MLP norms) or scaled
    (Granite's residual multiplier) before its residual add; h is overwritten."""
    cdef Py_ssize_t t, i, E = m.dim
    cdef float r = m.residual_scale
    for t in range(t0, t1):
        if w != NULL:
            ll_rmsnorm_f32(h + t * E, w, h + t * E, E, m.eps)
        for i in range(E):
            x[t * E + i] += r * h[t * E + i]


cdef inline void _gated_phase(const float *x, const uint32_t *xb, const ll_qact *xq, Py_ssize_t ldx,
                              Py_ssize_t T, const Mat *w, Py_ssize_t F, int act, float *ao, Py_ssize_t lda,
                              uint32_t *ao_b, int8_t *aq, float *aqd, float *aqs, int32_t *aqn,
                              ll_team *tm) noexcept nogil:
    """This thread's share of the gated MLP's fused phase, ao = act(x Wg) * (x Wu) (and its bf16
    pairs ao_b or int8 blocks aq, the down projection's input, where not NULL): feature panels
    handed out like a GEMM phase's (_gemm_mode), in pairs (32 features: an int8 block of the down
    projection's input is made whole by one thread)."""
    cdef Py_ssize_t ng = (F + 15) // 16, q0, q1
    cdef int mode = _gemm_mode(T)
    cdef ll_work wk = ll_work_begin(tm, mode, ng, 2 * _panel_chunk(mode, (ng + 1) // 2, tm.nth))
    while ll_work_take(&wk, &q0, &q1):
        ll_mat_gated(x, xb, xq, ldx, T, w, F, act, ao, lda, ao_b, aq, aqd, aqs, aqn, q0, q1)


cdef inline void _mlp_gated(const ModelC *m, const WorkC *ws, const Mat *w, const Mat *down, Py_ssize_t T,
                            Py_ssize_t F, ll_team *tm) noexcept nogil:
    """forward()'s gated phase of F features: h in, act out, in the down projection's input form."""
    cdef ll_qact xq = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, m.dim)
    cdef int form = ll_mat_form(down, T)
    _gated_phase(ws.h, ws.xb, &xq, m.dim, T, w, F, m.act, ws.act, F,
                 ws.xb2 if form == LL_IN_BF16 else NULL, ws.xq2 if form == LL_IN_Q8 else NULL, ws.xqd2, ws.xqs2,
                 ws.xqn2, tm)


cdef void _residual_out(const ModelC *m, const WorkC *ws, const StepC *s, const float *a, Py_ssize_t K,
                        const uint32_t *xb, const ll_qact *xq, const Mat *W, const float *norm_w, Py_ssize_t gen,
                        int mode, const LoraG *lora, ll_team *tm, Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """A block's output projection W (its input a [T, K], or a's input form xb / xq) joined to the
    residual stream x the one way the model and the step call for: under tensor parallel this
    rank's share into its slot (generation gen), the sum over ranks into h, then x += h; with
    post norms or a residual scale (Gemma 2/3, Granite) W's rows into h, then x += scale *
    norm(h); otherwise W's rows added into x by the GEMM itself. lora: the step's adapters'
    expand of this projection (NULL: none; adapters never run with tensor parallel). t0..t1:
    this thread's rows."""
    cdef Py_ssize_t T = s.T, E = m.dim
    if s.tp != NULL:
        _gemm_phase(a, K, xb, xq, T, W, ll_tp_slot(s.tp, gen, s.tp.rank), E, 0, mode, tm)
        _tp_reduce(s.tp, gen, ws.h, T * E, tm)
        _residual_add(m, norm_w, ws.h, ws.x, t0, t1)
    elif m.post_norms or m.residual_scale != 1.0:   # into h (free: the block's first GEMM has read it)
        _gemm_phase(a, K, xb, xq, T, W, ws.h, E, 0, mode, tm)
        ll_omp_barrier()
        if lora != NULL:
            _lora_expand(&s.lora, lora, ws.h, E, tm)
            ll_omp_barrier()
        _residual_add(m, norm_w, ws.h, ws.x, t0, t1)
    else:
        _gemm_phase(a, K, xb, xq, T, W, ws.x, E, 1, mode, tm)
        if lora != NULL:
            ll_omp_barrier()
            _lora_expand(&s.lora, lora, ws.x, E, tm)


cdef void _mlp_up_act(const ModelC *m, const WorkC *ws, const LayerW *L, Py_ssize_t T, Py_ssize_t F,
                      const ll_qact *xq_e, ll_team *tm) noexcept nogil:
    """An ungated MLP's first half: up [F, E] over the normed rows h, then the activation into act
    and down's input form (bf16 pairs in xb, or int8 blocks in xq2), each thread a slice of
    every row (all threads busy even for one decode token)."""
    cdef Py_ssize_t t, c0, c1, E = m.dim
    cdef int form = ll_mat_form(&L.down, T)
    _gemm_phase(ws.h, E, ws.xb, xq_e, T, &L.up, ws.mlp, F, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    ll_work_static(tm, F, 32, &c0, &c1)
    if c1 > c0:
        for t in range(T):
            ll_act_mul_f32(ws.mlp + t * F + c0, NULL, ws.act + t * F + c0, c1 - c0, m.act)
            if form == LL_IN_BF16:
                ll_f32_to_bf16_pairs(ws.act + t * F + c0, 0, ws.xb + t * ((F + 1) // 2) + c0 // 2, 0, 1, c1 - c0)
            elif form == LL_IN_Q8:   # F is whole blocks: the down weight's rows are
                ll_quantize_rows_q8(ws.act + t * F + c0, 0, 0, 1, c1 - c0, ws.xq2 + t * F + c0,
                                    ws.xqd2 + t * (F // 32) + c0 // 32, ws.xqs2 + t * (F // 16) + c0 // 16,
                                    ws.xqn2 + t * (F // 16) + c0 // 16)


cdef void _lora_mlp(const ModelC *m, const WorkC *ws, const StepC *s, const LayerW *L, const LoraG *G,
                    ll_team *tm) noexcept nogil:
    """x += the gated MLP of the normed rows h with the step's adapters (lora.pxi), inside
    _step's parallel region. The gate/up GEMM runs unfused, raw gate and up rows into lgu, so
    the adapters' gate / up products join them before the activation:

      gate/up   lgu [T, 2F] = h . W_gate_up (dynamic panels when small), adapters' shrink beside it
      expand    lgu += adapters' gate / up products
      act       act = act(gate) * up, in the down projection's input form, split by columns
      down      x (or h, then the post norm) += act . W_down, adapters' shrink before, expand after"""
    cdef Py_ssize_t t, T = s.T, E = m.dim, F = m.ffn_dim, c0, c1
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    cdef ll_qact xq_f = _qact(ws.xq2, ws.xqd2, ws.xqs2, ws.xqn2, F)
    cdef int form = ll_mat_form(&L.down, T)
    cdef bint via_h = m.post_norms or m.residual_scale != 1.0
    _lora_shrink(&s.lora, G + LORA_GATE_UP, ws.h, E, tm)
    _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.up, ws.lgu, 2 * F, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    _lora_expand(&s.lora, G + LORA_GATE_UP, ws.lgu, 2 * F, tm)
    ll_omp_barrier()
    ll_work_static(tm, F, 32, &c0, &c1)   # whole 32-value blocks per thread: an int8 block is made by one
    if c1 > c0:
        for t in range(T):
            ll_act_mul_f32(ws.lgu + t * 2 * F + c0, ws.lgu + t * 2 * F + F + c0, ws.act + t * F + c0, c1 - c0, m.act)
            if form == LL_IN_BF16:
                ll_f32_to_bf16_pairs(ws.act + t * F + c0, 0, ws.xb2 + t * ((F + 1) // 2) + c0 // 2, 0, 1, c1 - c0)
            elif form == LL_IN_Q8:
                ll_quantize_rows_q8(ws.act + t * F + c0, 0, 0, 1, c1 - c0, ws.xq2 + t * F + c0,
                                    ws.xqd2 + t * (F // 32) + c0 // 32, ws.xqs2 + t * (F // 16) + c0 // 16,
                                    ws.xqn2 + t * (F // 16) + c0 // 16)
    ll_omp_barrier()
    _lora_shrink(&s.lora, G + LORA_DOWN, ws.act, F, tm)
    _gemm_phase(ws.act, F, ws.xb2, &xq_f, T, &L.down, ws.h if via_h else ws.x, E, 0 if via_h else 1,
                _gemm_mode(T), tm)
    ll_omp_barrier()
    _lora_expand(&s.lora, G + LORA_DOWN, ws.h if via_h else ws.x, E, tm)
    if via_h:
        ll_omp_barrier()
        ll_work_static(tm, T, 1, &c0, &c1)
        _residual_add(m, L.post_mlp_norm_w, ws.h, ws.x, c0, c1)


# ---- mixture of experts -------------------------------------------------------------------

cdef enum:
    MOE_DOWN_PANELS = 4   # output panels per work unit of the experts' down projections
    MOE_RUN_PANELS = 16   # panels per work unit of a few-token step (decode): long runs of
                          # one matrix, which stream faster than short ones handed out in turn


cdef inline ll_qact _qrows(int8_t *q, float *d, float *s, int32_t *n, Py_ssize_t k, Py_ssize_t row) noexcept nogil:
    """The int8 blocks of rows from `row` of a [rows, k] buffer (NULL where it has none)."""
    if q == NULL:
        return _qact(NULL, NULL, NULL, NULL, k)
    return _qact(q + row * k, d + row * (k // 32), s + row * (k // 16), n + row * (k // 16), k)


cdef inline void _expert_gated(const ModelC *m, const WorkC *ws, const LayerW *L, Py_ssize_t e,
                               Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    """Expert e's fused gate/up + activation (ungated: up, then the activation) over feature
    panels q0..q1 of its grouped rows."""
    cdef Py_ssize_t E = m.dim, F = m.ffn_dim, r = ws.moe_off[e], n = ws.moe_off[e + 1] - ws.moe_off[e]
    cdef ll_qact xq = _qrows(ws.gxq, ws.gxqd, ws.gxqs, ws.gxqn, E, r)
    cdef int form = ll_mat_form(&L.experts[m.num_experts + e], n)
    _mat_first(ws.gx + r * E, ws.gxb + r * ((E + 1) // 2), &xq, E, n, &L.experts[e], F, m.act, m.gated,
               ws.gact + r * F, F,
               ws.gactb + r * ((F + 1) // 2) if form == LL_IN_BF16 else NULL,
               ws.gactq + r * F if form == LL_IN_Q8 else NULL,
               ws.gactqd + r * (F // 32) if form == LL_IN_Q8 else NULL,
               ws.gactqs + r * (F // 16) if form == LL_IN_Q8 else NULL,
               ws.gactqn + r * (F // 16) if form == LL_IN_Q8 else NULL, q0, q1)


cdef inline void _mat_up_act(const float *x, const uint32_t *xb, const ll_qact *xq, Py_ssize_t ldx,
                             Py_ssize_t T, const Mat *w, Py_ssize_t F, int act, float *ao, Py_ssize_t lda,
                             uint32_t *ao_b, int8_t *aq, float *aqd, float *aqs, int32_t *aqn,
                             Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    """An ungated MLP's first phase over feature panels q0..q1, as ll_mat_gated's for a gated
    one: ao = act(x Wu) [T, F] (stride lda), and its bf16 pairs ao_b or int8 blocks aq (the down
    projection's input) where not NULL; each up row read once. q0 even and q1 even or the last
    panel, so a 32-feature block is made whole by one call."""
    cdef Py_ssize_t t, b, c0 = 16 * q0, c1 = min(16 * q1, F)
    if c1 <= c0:
        return
    ll_mat_gemm(x, xb, xq, ldx, T, w, ao, lda, 0, q0, q1)
    for t in range(T):
        ll_act_mul_f32(ao + t * lda + c0, NULL, ao + t * lda + c0, c1 - c0, act)
        if aq != NULL:
            for b in range(q0 // 2, (q1 + 1) // 2):
                ll_quantize_block_q8(ao + t * lda + 32 * b, aq + t * F + 32 * b, aqd + t * (F // 32) + b,
                                     aqs + t * (F // 16) + 2 * b, aqn + t * (F // 16) + 2 * b)
        elif ao_b != NULL:
            ll_f32_to_bf16_pairs(ao + t * lda + c0, 0, ao_b + t * ((F + 1) // 2) + c0 // 2, 0, 1, c1 - c0)


cdef inline void _mat_first(const float *x, const uint32_t *xb, const ll_qact *xq, Py_ssize_t ldx,
                            Py_ssize_t T, const Mat *w, Py_ssize_t F, int act, bint gated, float *ao, Py_ssize_t lda,
                            uint32_t *ao_b, int8_t *aq, float *aqd, float *aqs, int32_t *aqn,
                            Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    """An expert's first phase over feature panels q0..q1: gated (ll_mat_gated) or not (_mat_up_act)."""
    if gated:
        ll_mat_gated(x, xb, xq, ldx, T, w, F, act, ao, lda, ao_b, aq, aqd, aqs, aqn, q0, q1)
    else:
        _mat_up_act(x, xb, xq, ldx, T, w, F, act, ao, lda, ao_b, aq, aqd, aqs, aqn, q0, q1)


cdef inline void _expert_down(const ModelC *m, const WorkC *ws, const LayerW *L, Py_ssize_t e,
                              Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Expert e's down projection, output panels p0..p1, of its grouped rows into gout."""
    cdef Py_ssize_t E = m.dim, F = m.ffn_dim, r = ws.moe_off[e], n = ws.moe_off[e + 1] - ws.moe_off[e]
    cdef ll_qact aq = _qrows(ws.gactq, ws.gactqd, ws.gactqs, ws.gactqn, F, r)
    ll_mat_gemm(ws.gact + r * F, ws.gactb + r * ((F + 1) // 2), &aq, F, n, &L.experts[m.num_experts + e],
                ws.gout + r * E, E, 0, p0, p1)


cdef void _moe_block(const ModelC *m, const WorkC *ws, const LayerW *L, Py_ssize_t T, float *out, int accumulate,
                     ll_team *tm) noexcept nogil:
    """out (+)= the MoE MLP of the normed rows h [T, E] (ws.h; in L.up's input form for a
    shared expert), inside _step's parallel region; out is x (accumulate 1), or a tensor-
    parallel rank's slot (accumulate 0: its features' share of every expert):

      router    logits [T, X] = h . router (and the shared gate's), split over (token, expert)
      top-k     each token's K experts and weights (ll_moe_route)
      group     one thread: rows by expert, A = T K of them (moe_off, moe_tok, moe_slot)
      gather    each routed row copied to gx in its expert's input form
      gated     (expert with rows, run of gu feature panels) units, then the shared expert's,
                handed out dynamically: one GEMM per expert over its rows (decode: K GEMVs);
                ungated experts (not m.gated): their up rows, then the activation
      down      (expert, du output panels) units likewise, into gout [A, E]
                (the shared expert's into h, which nobody reads any more)
      combine   out[t] (+)= sum_k w[t, k] gout[slot[t, k]] (+ sigmoid gate x shared), split by columns;
                added into x (accumulate), all of it x residual_scale (Granite)
    Only the chosen experts' weights are read."""
    cdef Py_ssize_t E = m.dim, F = m.ffn_dim, Fs = m.shared_dim, X = m.num_experts, K = m.top_k
    cdef Py_ssize_t Xp = X + 1, A = T * K, t, k, e, a, r, item, n_items, c0, c1
    # work units: (expert, gu feature panels) and (expert, du output panels); a step of a few
    # tokens reads each panel for little work, so its units are long runs of one matrix
    cdef Py_ssize_t gu = MOE_RUN_PANELS if T <= LL_QT else 2, du = MOE_RUN_PANELS if T <= LL_QT else MOE_DOWN_PANELS
    cdef Py_ssize_t ng = (F + 15) // 16, units = (ng + gu - 1) // gu, ngs = (Fs + 15) // 16
    cdef Py_ssize_t sunits = (ngs + gu - 1) // gu   # gated units per routed expert and of the shared one
    cdef Py_ssize_t npd = (E + 15) // 16, chunks = (npd + du - 1) // du
    cdef Py_ssize_t n_active, routed, i0, i1
    cdef ll_work wk
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E), gq = _qact(ws.gxq, ws.gxqd, ws.gxqs, ws.gxqn, E)
    cdef ll_qact xq_s = _qact(ws.xq2, ws.xqd2, ws.xqs2, ws.xqn2, Fs)
    cdef int form
    cdef float *logit
    cdef float rs = m.residual_scale if accumulate else 1.0   # a rank's slot is scaled after its reduce

    n_items = T * Xp
    ll_work_static(tm, n_items, 1, &i0, &i1)
    for item in range(i0, i1):
        t, e = item // Xp, item % Xp
        if e < X:
            ws.router[item] = ll_dot_f32(ws.h + t * E, L.router + e * E, E)
            if L.router_b != NULL:
                ws.router[item] += L.router_b[e]
        elif L.shared_gate_w != NULL:
            ws.router[item] = ll_dot_f32(ws.h + t * E, L.shared_gate_w, E)
    ll_omp_barrier()
    ll_work_static(tm, T, 1, &i0, &i1)
    for t in range(i0, i1):
        logit = ws.router + t * Xp
        if m.moe_routing == LL_MOE_GROUPED_SOFTMAX or m.moe_routing == LL_MOE_GROUPED_SIGMOID:
            ll_moe_route_grouped(logit, L.router_corr, <int>X, <int>K, m.n_group, m.topk_group, m.norm_topk,
                                 m.moe_routing == LL_MOE_GROUPED_SIGMOID, m.routed_scale, ws.moe_sel + t * K,
                                 ws.moe_wt + t * K)
        else:
            ll_moe_route(logit, <int>X, <int>K, m.norm_topk, m.moe_routing, ws.moe_sel + t * K, ws.moe_wt + t * K)
        if L.shared_gate_w != NULL:
            logit[X] = 1.0 / (1.0 + expf(-logit[X]))
        else:   # an ungated shared expert (DeepSeek's)
            logit[X] = 1.0
    ll_omp_barrier()
    if tm.tid == 0:   # group the T K (token, expert) pairs by expert, tokens in order within each
        for e in range(Xp):
            ws.moe_off[e] = 0
        for a in range(A):
            ws.moe_off[ws.moe_sel[a] + 1] += 1
        n_active = 0
        for e in range(X):
            if ws.moe_off[e + 1]:
                ws.moe_active[n_active] = <int32_t>e
                n_active += 1
            ws.moe_off[e + 1] += ws.moe_off[e]
            ws.moe_cur[e] = ws.moe_off[e]
        ws.moe_active[X] = <int32_t>n_active
        for a in range(A):
            e = ws.moe_sel[a]
            r = ws.moe_cur[e]
            ws.moe_cur[e] += 1
            ws.moe_slot[a], ws.moe_tok[r], ws.moe_exp[r] = <int32_t>r, <int32_t>(a // K), <int32_t>e
    ll_omp_barrier()
    n_active = ws.moe_active[X]
    ll_work_static(tm, A, 1, &i0, &i1)
    for r in range(i0, i1):
        e = ws.moe_exp[r]
        memcpy(ws.gx + r * E, ws.h + ws.moe_tok[r] * E, E * sizeof(float))
        form = ll_mat_form(&L.experts[e], ws.moe_off[e + 1] - ws.moe_off[e])
        _to_input(form, ws.gx, E, r, r + 1, E, ws.gxb, &gq)
    ll_omp_barrier()
    # experts hold unequal numbers of rows: units handed out dynamically
    routed = n_active * units
    n_items = routed + (sunits if Fs else 0)
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, n_items, 1)
    while ll_work_take(&wk, &item, &i1):
        if item < routed:
            _expert_gated(m, ws, L, ws.moe_active[item // units], gu * (item % units), min(gu * (item % units) + gu, ng))
        else:
            r = item - routed
            form = ll_mat_form(&L.down, T)
            _mat_first(ws.h, ws.xb, &xq_e, E, T, &L.up, Fs, m.act, m.gated, ws.act, Fs,
                       ws.xb2 if form == LL_IN_BF16 else NULL, ws.xq2 if form == LL_IN_Q8 else NULL, ws.xqd2,
                       ws.xqs2, ws.xqn2, gu * r, min(gu * r + gu, ngs))
    ll_omp_barrier()
    routed = n_active * chunks
    n_items = routed + (chunks if Fs else 0)
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, n_items, 1)
    while ll_work_take(&wk, &item, &i1):
        r = item % chunks
        if item < routed:
            _expert_down(m, ws, L, ws.moe_active[item // chunks], r * du, min((r + 1) * du, npd))
        else:
            ll_mat_gemm(ws.act, ws.xb2, &xq_s, Fs, T, &L.down, ws.h, E, 0, r * du, min((r + 1) * du, npd))
    ll_omp_barrier()
    ll_work_static(tm, E, 16, &c0, &c1)   # whole output panels, as the down projections wrote them
    if c1 > c0:
        for t in range(T):
            if not accumulate:
                memset(out + t * E + c0, 0, (c1 - c0) * sizeof(float))
            for k in range(K):
                ll_axpy_f32(rs * ws.moe_wt[t * K + k], ws.gout + ws.moe_slot[t * K + k] * E + c0, out + t * E + c0,
                            c1 - c0)
            if Fs:
                ll_axpy_f32(rs * ws.router[t * Xp + X], ws.h + t * E + c0, out + t * E + c0, c1 - c0)


cdef inline Py_ssize_t _mla_qoff(const ModelC *m) noexcept nogil:
    """Where a latent-attention qkv row's [c, k_pe] starts: after q [H (dn + dr)] or q_a [ql]
    (q_b's output q is written over q_a's place, from the normed copy in qlat)."""
    cdef Py_ssize_t q_n = m.num_heads * (m.mla_dn + m.rope_dim)
    return q_n if q_n > m.q_lora else m.q_lora


cdef void _mla_heads(const Mat *heads, Py_ssize_t H, const float *x, Py_ssize_t ldx, Py_ssize_t hx, Py_ssize_t k,
                     Py_ssize_t T, float *out, Py_ssize_t ldo, Py_ssize_t ho, float *scratch,
                     ll_team *tm) noexcept nogil:
    """This thread's share of out[t, h ho ...] = x[t, h hx .. h hx + k] . heads[h]^T for every token
    t and head h (latent attention's per-head W_UK^T and W_UV, each head its own small matrix):
    (head, run of MLA_TOKENS tokens) units handed out dynamically, each unit's rows put in its
    head's input form in this thread's scratch (MLA_TOKENS (k + 64) floats)."""
    cdef Py_ssize_t nc = (T + MLA_TOKENS - 1) // MLA_TOKENS, lo, hi, u, h, ta, n
    cdef int form
    cdef const float *src
    cdef uint32_t *xb = <uint32_t *>scratch
    cdef int8_t *q = <int8_t *>scratch
    cdef float *d = scratch + MLA_TOKENS * k // 4
    cdef float *sc = d + MLA_TOKENS * (k // 32) + 1
    cdef int32_t *qn = <int32_t *>(sc + MLA_TOKENS * (k // 16) + 1)
    cdef ll_qact xq = _qact(q, d, sc, qn, k)
    cdef ll_work wk = ll_work_begin(tm, LL_WORK_DYNAMIC, H * nc, 1)
    while ll_work_take(&wk, &lo, &hi):
        for u in range(lo, hi):
            h, ta = u // nc, (u % nc) * MLA_TOKENS
            n = min(<Py_ssize_t>MLA_TOKENS, T - ta)
            src = x + ta * ldx + h * hx
            form = ll_mat_form(&heads[h], n)
            if form == LL_IN_BF16:
                ll_f32_to_bf16_pairs(src, ldx, xb, 0, n, k)
            elif form == LL_IN_Q8:
                ll_quantize_rows_q8(src, ldx, 0, n, k, q, d, sc, qn)
            ll_mat_gemm(src, xb, &xq, ldx, n, &heads[h], out + ta * ldo + h * ho, ldo, 0, 0, heads[h].num_panels)


cdef inline void _mla_rope_halves(float *x, const float *src, Py_ssize_t dr, int interleaved) noexcept nogil:
    """x[0..dr) = src's RoPE components in the halves order the kernels rotate: (s0, s2, ... |
    s1, s3, ...) from interleaved pairs, else as they are; x and src may be the same row."""
    cdef float tmp[MLA_MAX_ROPE]
    cdef Py_ssize_t i
    if not interleaved:
        if x != src:
            memcpy(x, src, dr * sizeof(float))
        return
    for i in range(dr // 2):
        tmp[i], tmp[dr // 2 + i] = src[2 * i], src[2 * i + 1]
    memcpy(x, tmp, dr * sizeof(float))


cdef void _mla_block(const ModelC *m, const WorkC *ws, const StepC *s, const LayerW *L, ll_team *tm,
                     Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """x += the latent attention (DeepSeek's MLA, src/kernels/mla.h) of the normed rows h (in
    L.qkv's input form), inside _step's parallel region; dq = dn + dr per stored query head,
    Dk = r + dr per cached row and absorbed query head, every weight as stored:

      qkv      [q | c, k_pe] = h . qkv (no q latent); with one, the [q_a | c, k_pe] rows land
               just before the cache row's place (_mla_qoff) and
      q_b      qlat = rmsnorm(q_a) in q_b's input form, q [T, H dq] = qlat . q_b
      rows     c = rmsnorm(c) (kv_a_layernorm), RoPE on k_pe, the token's [c, k_pe] row into
               the cache; each head's q_pe, rotated, to the end of its absorbed query (mla_q)
      W_UK     (head, token run) units: mla_q[t, h, :r] = W_UK,h^T q_nope[t, h]
      attend   (token, head range) units: each head's latent output [r] into attn [T, H r]
      W_UV     (head, token run) units: mla_v[t, h] = W_UV,h attn[t, h] [dv]
      o        x += mla_v . o, mla_v first in o's input form"""
    cdef Py_ssize_t T = s.T, E = m.dim, H = m.num_heads, Dk = m.head_dim, r = m.kv_lora, ql = m.q_lora
    cdef Py_ssize_t dn = m.mla_dn, dr = m.rope_dim, dv = m.mla_dv, dq = dn + dr
    cdef Py_ssize_t qoff = _mla_qoff(m), qkv_n = qoff + Dk, Hr = H * r, Hv = H * dv, half = dr // 2
    cdef Py_ssize_t t, head, item, i1, h0, hc, nc
    cdef float *row
    cdef float *qa
    cdef const float *cos_row
    cdef const float *sin_row
    cdef float *scratch = ws.scores + tm.tid * ws.scratch_len
    cdef ll_work wk
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    cdef ll_qact xq_l = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, ql)
    cdef ll_qact xq_o = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, Hv)
    cdef int bf16 = m.kv_type == LL_KV_BF16
    if ql:
        _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv + qoff - ql, qkv_n, 0, _gemm_mode(T), tm)
        ll_omp_barrier()
        for t in range(t0, t1):
            ll_rmsnorm_f32(ws.qkv + t * qkv_n + qoff - ql, L.q_a_norm_w, ws.qlat + t * ql, ql, m.eps)
        _to_input(ll_mat_form(&L.q_b, T), ws.qlat, ql, t0, t1, ql, ws.xb, &xq_l)
        ll_omp_barrier()
        _gemm_phase(ws.qlat, ql, ws.xb, &xq_l, T, &L.q_b, ws.qkv, qkv_n, 0, _gemm_mode(T), tm)
    else:
        _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv, qkv_n, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    for t in range(t0, t1):
        row = ws.qkv + t * qkv_n
        cos_row = L.rope_cos + s.positions[t] * half
        sin_row = L.rope_sin + s.positions[t] * half
        ll_rmsnorm_f32(row + qoff, L.kv_a_norm_w, row + qoff, r, m.eps)
        _mla_rope_halves(row + qoff + r, row + qoff + r, dr, m.mla_interleave)
        ll_rope_neox_f32(row + qoff + r, cos_row, sin_row, dr)
        ll_mla_write_row(row + qoff, L.k_cache, bf16, s.slot_mapping[t], Dk)
        for head in range(H):
            qa = ws.mla_q + (t * H + head) * Dk + r
            _mla_rope_halves(qa, row + head * dq + dn, dr, m.mla_interleave)
            ll_rope_neox_f32(qa, cos_row, sin_row, dr)
    # each head's q_nope through its W_UK^T, beside the rows (they read other columns of qkv)
    _mla_heads(L.mla_heads, H, ws.qkv, qkv_n, dq, dn, T, ws.mla_q, H * Dk, Dk, scratch, tm)
    ll_omp_barrier()      # every token's row is in the cache and every query whole before anyone attends
    # a decode step of few tokens splits each token's heads across the team
    hc = H if T >= 2 * tm.nth else max(1, (H + tm.nth - 1) // tm.nth)
    nc = (H + hc - 1) // hc
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, T * nc, 1)
    while ll_work_take(&wk, &item, &i1):
        t, h0 = item // nc, (item % nc) * hc
        ll_mla_attention(ws.mla_q + t * H * Dk, Dk, r, <int>h0, <int>min(H, h0 + hc), L.k_cache, bf16,
                         s.block_tables + s.tok_seq[t] * s.max_blocks, m.block_size, 0, s.attn_pos[t], m.scale,
                         ws.attn + t * Hr, scratch)
    ll_omp_barrier()
    _mla_heads(L.mla_heads + H, H, ws.attn, Hr, r, r, T, ws.mla_v, Hv, dv, scratch, tm)
    ll_omp_barrier()
    _to_input(ll_mat_form(&L.o, T), ws.mla_v, Hv, t0, t1, Hv, ws.xb, &xq_o)
    ll_omp_barrier()
    _gemm_phase(ws.mla_v, Hv, ws.xb, &xq_o, T, &L.o, ws.x, E, 1, _gemm_mode(T), tm)


cdef Py_ssize_t _build_runs(const int32_t *tok_seq, Py_ssize_t T, int32_t *runs) noexcept nogil:
    """runs[r] = the first token of the r-th run of one sequence's tokens, runs[count] = T; the count."""
    cdef Py_ssize_t t, n = 0
    for t in range(T):
        if t == 0 or tok_seq[t] != tok_seq[t - 1]:
            runs[n] = <int32_t>t
            n += 1
    runs[n] = <int32_t>T
    return n


cdef void _conv_block(const ModelC *m, const WorkC *ws, const StepC *s, const LayerW *L, ll_team *tm,
                      Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """x += LFM2's short-convolution operator of the normed rows h (in L.qkv's input form),
    inside _step's parallel region (src/kernels/conv.h):

      in_proj   bcx [T, 3E] = h . in_proj (B | C | x rows, in ws.qkv)
      conv      (sequence run, CONV_CHANNELS channels) units: h = C * conv(B * x), each run from
                its batch slot's state (zeros when the run starts at position 0: a new or
                recomputed sequence), the state left for the next step; a chunk of a prefill
                runs its tokens in one pass, a decode token is a state update
      out_proj  x += h . out_proj, h first in its input form"""
    cdef Py_ssize_t E = m.dim, T = s.T, n3 = 3 * E, nc = (E + CONV_CHANNELS - 1) // CONV_CHANNELS
    cdef Py_ssize_t item, i1, r, a, b, c0, S = m.conv_len - 1
    cdef ll_work wk
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv, n3, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    # runs differ in length (a prefill chunk beside decode tokens): units handed out dynamically
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, s.num_runs * nc, 1)
    while ll_work_take(&wk, &item, &i1):
        r, c0 = item // nc, (item % nc) * CONV_CHANNELS
        a, b = ws.runs[r], ws.runs[r + 1]
        ll_short_conv_f32(ws.qkv + a * n3, n3, ws.h + a * E, E, L.conv_state + s.tok_seq[a] * S * E, L.conv_w,
                          L.conv_b, b - a, E, m.conv_len, s.positions[a] == 0, c0, min(E, c0 + CONV_CHANNELS))
    ll_omp_barrier()
    _to_input(ll_mat_form(&L.o, T), ws.h, E, t0, t1, E, ws.xb, &xq_e)
    ll_omp_barrier()
    _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.o, ws.x, E, 1, _gemm_mode(T), tm)


cdef void _mamba_block(const ModelC *m, const WorkC *ws, const StepC *s, const LayerW *L, ll_team *tm,
                       Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """x += a Mamba2 mixer of the normed rows h (in L.qkv's input form), inside _step's parallel
    region (with a residual scale: the mixer's output into h, then x += residual_scale h);
    Di = H P channels, Cd = Di + 2 G N:

      in_proj   [z | x, B, C | dt] [T, Di + Cd + H] = h . in_proj (in ws.qkv); dt = softplus(dt + dt_bias)
      conv      (sequence run, CONV_CHANNELS channels) units: silu(causal conv of x | B | C) into
                ssm_x from the batch slot's conv state (zeros when the run starts at position 0)
      scan      (sequence run, head) units: the chunked state-space scan (ssm.h) into ssm_y from
                the slot's scan state; a decode token is a state update
      norm      ssm_y = rmsnorm(ssm_y * silu(z)) per group of Di / G channels, x gnorm_w (m.mamba_norm:
                or rmsnorm(ssm_y) * silu(z), or ssm_y * silu(z) unnormed)
      out_proj  x += ssm_y . out_proj, ssm_y first in its input form"""
    cdef Py_ssize_t E = m.dim, T = s.T, H = m.mamba_h, P = m.mamba_p, G = m.mamba_g, N = m.mamba_n
    cdef Py_ssize_t Di = H * P, Cd = Di + 2 * G * N, dproj = Di + Cd + H, per = H // G, gs = Di // G
    cdef Py_ssize_t nc = (Cd + CONV_CHANNELS - 1) // CONV_CHANNELS, S = m.conv_len - 1
    cdef Py_ssize_t item, i1, r, a, b, c0, t, h, g, i
    cdef float v
    cdef float *row
    cdef ll_work wk
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    cdef ll_qact xq_y = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, Di)
    _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv, dproj, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    for t in range(t0, t1):   # softplus as torch computes it (linear above 20)
        row = ws.qkv + t * dproj + Di + Cd
        for h in range(H):
            v = row[h] + L.dt_bias[h]
            v = v if v > 20.0 else log1pf(expf(v))
            row[h] = v if v > m.mamba_dt_min else m.mamba_dt_min   # Nemotron-H's floor (time_step_min)
    # runs differ in length: units handed out dynamically
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, s.num_runs * nc, 1)
    while ll_work_take(&wk, &item, &i1):
        r, c0 = item // nc, (item % nc) * CONV_CHANNELS
        a, b = ws.runs[r], ws.runs[r + 1]
        ll_causal_conv_silu_f32(ws.qkv + a * dproj + Di, dproj, ws.ssm_x + a * Cd, Cd,
                                L.conv_state + s.tok_seq[a] * S * Cd, L.conv_w, L.conv_b, b - a, Cd, m.conv_len,
                                s.positions[a] == 0, c0, min(Cd, c0 + CONV_CHANNELS))
    ll_omp_barrier()
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, s.num_runs * H, 1)
    while ll_work_take(&wk, &item, &i1):
        r, h = item // H, item % H
        a, b = ws.runs[r], ws.runs[r + 1]
        g = h // per
        ll_ssd_scan_f32(ws.ssm_x + a * Cd + h * P, Cd, ws.qkv + a * dproj + Di + Cd + h, dproj, L.ssm_a[h],
                        L.ssm_d[h], ws.ssm_x + a * Cd + Di + g * N, Cd, ws.ssm_x + a * Cd + Di + (G + g) * N, Cd,
                        ws.ssm_y + a * Di + h * P, Di, L.ssm_state + (s.tok_seq[a] * H + h) * P * N, b - a, P, N,
                        s.positions[a] == 0, ws.scores + tm.tid * ws.scratch_len)
    ll_omp_barrier()
    for t in range(t0, t1):
        row = ws.ssm_y + t * Di
        if m.mamba_norm == MAMBA_NORM_BEFORE_GATE:
            for g in range(G):
                ll_rmsnorm_f32(row + g * gs, L.gnorm_w + g * gs, row + g * gs, gs, m.eps)
        for i in range(Di):
            v = ws.qkv[t * dproj + i]
            row[i] = row[i] * v / (1.0 + expf(-v))
        if m.mamba_norm == MAMBA_NORM_AFTER_GATE:
            for g in range(G):
                ll_rmsnorm_f32(row + g * gs, L.gnorm_w + g * gs, row + g * gs, gs, m.eps)
    _to_input(ll_mat_form(&L.o, T), ws.ssm_y, Di, t0, t1, Di, ws.xb, &xq_y)
    ll_omp_barrier()
    if m.residual_scale != 1.0:   # out_proj into h (in_proj has read it), then x += scale h (Granite 4.0-H)
        _gemm_phase(ws.ssm_y, Di, ws.xb, &xq_y, T, &L.o, ws.h, E, 0, _gemm_mode(T), tm)
        ll_omp_barrier()
        _residual_add(m, NULL, ws.h, ws.x, t0, t1)
    else:
        _gemm_phase(ws.ssm_y, Di, ws.xb, &xq_y, T, &L.o, ws.x, E, 1, _gemm_mode(T), tm)


cdef void _deltanet_block(const ModelC *m, const WorkC *ws, const StepC *s, const LayerW *L, ll_team *tm,
                          Py_ssize_t t0, Py_ssize_t t1) noexcept nogil:
    """x += a Gated DeltaNet layer of the normed rows h (in L.qkv's input form), inside _step's
    parallel region; Cd = 2 Hk Dk + Hv Dv channels of q | k | v, Di = Hv Dv:

      in_proj   [q | k | v | z | b | a] [T, Cd + Di + 2 Hv] = h . in_proj (in ws.qkv), then per row
                b = sigmoid(b) (beta) and a = -exp(A_log) softplus(a + dt_bias) (g, the log decay)
      conv      (sequence run, CONV_CHANNELS channels) units: silu(causal conv of q | k | v) into
                ssm_x from the batch slot's conv state (zeros when the run starts at position 0)
      l2norm    per row and key head: q = l2norm(q) / sqrt(Dk), k = l2norm(k)
      rule      (sequence run, value head) units: the chunked gated delta rule (delta.h) into
                ssm_y from the batch slot's state (zeros when the run starts at position 0)
      norm      ssm_y = rmsnorm(ssm_y) x gnorm_w x silu(z) per value head
      out_proj  x += ssm_y . out_proj, ssm_y first in its input form"""
    cdef Py_ssize_t E = m.dim, T = s.T, Hk = m.gdn_hk, Hv = m.gdn_hv, Dk = m.gdn_dk, Dv = m.gdn_dv
    cdef Py_ssize_t Di = Hv * Dv, Cd = 2 * Hk * Dk + Di, dproj = Cd + Di + 2 * Hv, per = Hv // Hk
    cdef Py_ssize_t nc = (Cd + CONV_CHANNELS - 1) // CONV_CHANNELS, S = m.conv_len - 1
    cdef Py_ssize_t item, i1, r, a, b, c0, t, h, kh, i
    cdef float v, ss
    cdef float qscale = 1.0 / sqrtf(<float>Dk)
    cdef float *row
    cdef const float *z
    cdef ll_work wk
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    cdef ll_qact xq_y = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, Di)
    _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv, dproj, 0, _gemm_mode(T), tm)
    ll_omp_barrier()
    for t in range(t0, t1):   # softplus as torch computes it (linear above 20)
        row = ws.qkv + t * dproj + Cd + Di
        for h in range(Hv):
            row[h] = 1.0 / (1.0 + expf(-row[h]))
            v = row[Hv + h] + L.dt_bias[h]
            row[Hv + h] = L.ssm_a[h] * (v if v > 20.0 else log1pf(expf(v)))
    # runs differ in length: units handed out dynamically
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, s.num_runs * nc, 1)
    while ll_work_take(&wk, &item, &i1):
        r, c0 = item // nc, (item % nc) * CONV_CHANNELS
        a, b = ws.runs[r], ws.runs[r + 1]
        ll_causal_conv_silu_f32(ws.qkv + a * dproj, dproj, ws.ssm_x + a * Cd, Cd, L.conv_state + s.tok_seq[a] * S * Cd,
                                L.conv_w, NULL, b - a, Cd, m.conv_len, s.positions[a] == 0, c0,
                                min(Cd, c0 + CONV_CHANNELS))
    ll_omp_barrier()
    for t in range(t0, t1):   # as transformers' l2norm: x / sqrt(sum x^2 + 1e-6)
        row = ws.ssm_x + t * Cd
        for kh in range(2 * Hk):   # the query heads, then the key heads
            ss = 0.0
            for i in range(Dk):
                ss = ss + row[kh * Dk + i] * row[kh * Dk + i]
            ss = (qscale if kh < Hk else 1.0) / sqrtf(ss + 1e-6)
            for i in range(Dk):
                row[kh * Dk + i] *= ss
    ll_omp_barrier()
    wk = ll_work_begin(tm, LL_WORK_DYNAMIC, s.num_runs * Hv, 1)
    while ll_work_take(&wk, &item, &i1):
        r, h = item // Hv, item % Hv
        a, b = ws.runs[r], ws.runs[r + 1]
        kh = h // per
        ll_gated_delta_f32(ws.ssm_x + a * Cd + kh * Dk, Cd, ws.ssm_x + a * Cd + (Hk + kh) * Dk, Cd,
                           ws.ssm_x + a * Cd + 2 * Hk * Dk + h * Dv, Cd, ws.qkv + a * dproj + Cd + Di + Hv + h, dproj,
                           ws.qkv + a * dproj + Cd + Di + h, dproj, ws.ssm_y + a * Di + h * Dv, Di,
                           L.ssm_state + (s.tok_seq[a] * Hv + h) * Dk * Dv, b - a, Dk, Dv, s.positions[a] == 0,
                           ws.scores + tm.tid * ws.scratch_len)
    ll_omp_barrier()
    for t in range(t0, t1):
        row = ws.ssm_y + t * Di
        z = ws.qkv + t * dproj + Cd
        for h in range(Hv):
            ll_rmsnorm_f32(row + h * Dv, L.gnorm_w, row + h * Dv, Dv, m.eps)
        for i in range(Di):
            row[i] = row[i] * z[i] / (1.0 + expf(-z[i]))
    _to_input(ll_mat_form(&L.o, T), ws.ssm_y, Di, t0, t1, Di, ws.xb, &xq_y)
    ll_omp_barrier()
    _gemm_phase(ws.ssm_y, Di, ws.xb, &xq_y, T, &L.o, ws.x, E, 1, _gemm_mode(T), tm)


cdef void _step(const ModelC *m, const WorkC *ws, const StepC *s, int tid, int nth) noexcept nogil:
    # every phase hands out its units through this thread's view of the team (work.h)
    cdef ll_team team = ll_team_make(ws.work, tid, nth)
    cdef ll_team *tm = &team
    cdef Py_ssize_t t, r, head, i, l, t0, t1, p0, p1
    cdef Py_ssize_t T = s.T, E = m.dim, F = m.ffn_dim, H = m.num_heads, Hkv = m.num_kv_heads, D = m.head_dim
    cdef Py_ssize_t q_n = H * D, qkv_n = ((2 if m.attn_gate else 1) * H + 2 * Hkv) * D   # gate rows after v
    cdef const float *gate
    cdef AttnC at   # the attention phase's arguments; per layer: its caches, window, o input form
    cdef float *row
    cdef const float *trow
    cdef const LayerW *L
    cdef const LoraG *G = NULL
    cdef float mcos[MROPE_MAX_PAIRS]   # multimodal RoPE: this token's angles, gathered per section
    cdef float msin[MROPE_MAX_PAIRS]
    cdef const float *cos_row
    cdef const float *sin_row
    cdef Py_ssize_t half = m.rope_dim // 2, sec, rope_row
    # int8 blocks of the GEMM inputs: rows of E (qkv, gate/up, lm_head), H D (o) or F (down) values
    cdef ll_qact xq_e = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, E)
    cdef ll_qact xq_o = _qact(ws.xq, ws.xqd, ws.xqs, ws.xqn, q_n)
    cdef ll_qact xq_f = _qact(ws.xq2, ws.xqd2, ws.xqs2, ws.xqn2, F)
    ll_work_static(tm, T, 1, &t0, &t1)   # this thread's rows in every row phase
    at.q, at.ldq, at.out, at.ldo, at.tiles = ws.qkv, qkv_n, ws.attn, q_n, ws.tiles
    at.num_tiles, at.max_keys, at.h, at.hkv, at.d, at.bs = s.num_tiles, s.max_keys, H, Hkv, D, m.block_size
    at.max_blocks, at.kv_type, at.path, at.block_tables = s.max_blocks, m.kv_type, m.attn_path, s.block_tables
    at.tok_seq, at.positions, at.last, at.scale, at.softcap = s.tok_seq, s.positions, s.attn_pos, m.scale, m.attn_softcap
    at.scratch, at.scratch_len, at.partials = ws.scores, ws.scratch_len, ws.partials
    at.xb, at.xq, at.xqd, at.xqs, at.xqn = ws.xb, ws.xq, ws.xqd, ws.xqs, ws.xqn

    for t in range(t0, t1):
        if s.embed_src != NULL and s.embed_src[t] >= 0:   # an image's token: its encoder row, unscaled
            for i in range(E):
                ws.x[t * E + i] = s.mm_embeds[s.embed_src[t] * E + i]
            continue
        _embed_row(&m.embed, s.token_ids[t], ws.x + t * E)
        if m.embed_scale != 1.0:
            for i in range(E):
                ws.x[t * E + i] *= m.embed_scale
        if m.pos_embed != NULL:
            for i in range(E):
                ws.x[t * E + i] += m.pos_embed[s.positions[t] * E + i]
        if m.type_embed != NULL:
            trow = m.type_embed + (s.token_types[t] if s.token_types != NULL else 0) * E
            for i in range(E):
                ws.x[t * E + i] += trow[i]
    ll_omp_barrier()

    for l in range(m.num_layers):
        L = &m.layers[l]
        # --- attention block: norm, qkv, (qk norm), rope, KV write, paged attention, o + residual
        if m.post_ln:   # the embeddings' LayerNorm, or the previous layer's after its MLP
            _post_ln_rows(m, m.embed_norm_w if l == 0 else m.layers[l - 1].mlp_norm_w,
                          m.embed_norm_b if l == 0 else m.layers[l - 1].mlp_norm_b, ws.x, ws.h, ws.xb, &xq_e,
                          ll_mat_form(&L.qkv, T), t0, t1)
        elif L.shared_input:   # h still holds the previous layer's normed rows (its Mamba2 added into x): only
            _to_input(ll_mat_form(&L.qkv, T), ws.h, E, t0, t1, E, ws.xb, &xq_e)   # their input form is redone
        else:
            _norm_rows(m, L.attn_norm_w, L.attn_norm_b, ws.x, NULL, ws.h, ws.xb, &xq_e, ll_mat_form(&L.qkv, T), t0, t1)
        ll_omp_barrier()
        if L.conv == 1:   # a short-convolution layer (LFM2): its own block, out_proj included
            _conv_block(m, ws, s, L, tm, t0, t1)
        elif L.conv == 2:   # a Mamba2 layer: likewise
            _mamba_block(m, ws, s, L, tm, t0, t1)
        elif L.conv == 3:   # a Gated DeltaNet layer: likewise
            _deltanet_block(m, ws, s, L, tm, t0, t1)
        elif m.kv_lora:   # latent attention (DeepSeek): its own block, o included
            _mla_block(m, ws, s, L, tm, t0, t1)
        else:
            if s.lora.nl:   # adapters' q/k/v shrink beside the base GEMM (both only read h)
                G = s.lora.groups + l * LORA_GROUPS
                _lora_shrink(&s.lora, G + LORA_QKV, ws.h, E, tm)
            _gemm_phase(ws.h, E, ws.xb, &xq_e, T, &L.qkv, ws.qkv, qkv_n, 0, _gemm_mode(T), tm)
            ll_omp_barrier()
            if s.lora.nl:
                _lora_expand(&s.lora, G + LORA_QKV, ws.qkv, qkv_n, tm)
                ll_omp_barrier()
            for t in range(t0, t1):
                row = ws.qkv + t * qkv_n
                rope_row = s.rope_rows[t] if s.rope_rows != NULL else s.positions[t]
                cos_row = L.rope_cos + rope_row * half
                sin_row = L.rope_sin + rope_row * half
                if m.use_rope and m.mrope_t:   # angle of pair i from the table row of its section's position
                    for i in range(half):
                        sec = 0 if i < m.mrope_t else (1 if i < m.mrope_h else 2)
                        mcos[i] = L.rope_cos[s.rope_pos[t * 3 + sec] * half + i]
                        msin[i] = L.rope_sin[s.rope_pos[t * 3 + sec] * half + i]
                    cos_row, sin_row = mcos, msin
                for head in range(H + Hkv):   # q heads then k heads
                    if m.qk_norm:
                        ll_rmsnorm_f32(row + head * D, L.q_norm_w if head < H else L.k_norm_w, row + head * D, D, m.eps)
                    if m.use_rope:
                        ll_rope_neox_f32(row + head * D, cos_row, sin_row, m.rope_dim)
                ll_write_kv_row(row + q_n, L.k_cache, m.kv_type, s.slot_mapping[t], m.block_size, Hkv, D, 1)
                ll_write_kv_row(row + q_n + Hkv * D, L.v_cache, m.kv_type, s.slot_mapping[t], m.block_size, Hkv, D, 0)
            ll_omp_barrier()      # every token's K/V is in the cache before anyone attends
            at.k_cache, at.v_cache, at.window, at.form = L.k_cache, L.v_cache, L.window, ll_mat_form(&L.o, T)
            if m.attn_gate:   # the gate first, then o's input form (below)
                at.form = LL_IN_F32
            at.sinks = L.sinks
            at.prefetch = &L.o if T <= DYN_MAX_TOKENS else NULL   # decode: the o panels come in while attention waits
            _attention_phase(&at, tm)
            if m.attn_gate:   # attention x sigmoid(gate), each row by the thread that owns it
                for t in range(t0, t1):
                    row = ws.attn + t * q_n
                    gate = ws.qkv + t * qkv_n + q_n + 2 * Hkv * D
                    for i in range(q_n):
                        row[i] = row[i] / (1.0 + expf(-gate[i]))
                _to_input(ll_mat_form(&L.o, T), ws.attn, q_n, t0, t1, q_n, ws.xb, &xq_o)
                ll_omp_barrier()
            if s.lora.nl:   # reads the final attention rows; expanded once the o GEMM is done
                _lora_shrink(&s.lora, G + LORA_O, ws.attn, q_n, tm)
            # (LL_WORK_STATIC: the panels prefetched during attention, in order)
            _residual_out(m, ws, s, ws.attn, q_n, ws.xb, &xq_o, &L.o, L.post_attn_norm_w, s.gen0 + 2 * l + 1,
                          LL_WORK_STATIC, G + LORA_O if s.lora.nl else NULL, tm, t0, t1)
        ll_omp_barrier()
        if L.mlp == MLP_NONE:   # a mixer alone (Nemotron-H's blocks)
            continue
        # --- MLP block: norm, gate/up with the activation fused (or up, act), down + residual
        if m.post_ln:   # BERT: x = LN(x + attention), the MLP's input
            _post_ln_rows(m, L.attn_norm_w, L.attn_norm_b, ws.x, ws.h, ws.xb, &xq_e, ll_mat_form(&L.up, T), t0, t1)
        else:
            _norm_rows(m, L.mlp_norm_w, L.mlp_norm_b, ws.x, NULL, ws.h, ws.xb, &xq_e, ll_mat_form(&L.up, T), t0, t1)
        ll_omp_barrier()
        F = L.ffn   # a dense MLP's width on this layer
        xq_f = _qact(ws.xq2, ws.xqd2, ws.xqs2, ws.xqn2, F)
        # one branch per block kind; each joins the residual through _residual_out (or, experts,
        # through _moe_block's own accumulation)
        if L.mlp == MLP_EXPERTS:
            if s.tp != NULL:   # this rank's features of every expert into its slot; the sum into h
                _moe_block(m, ws, L, T, ll_tp_slot(s.tp, s.gen0 + 2 * l + 2, s.tp.rank), 0, tm)
                _tp_reduce(s.tp, s.gen0 + 2 * l + 2, ws.h, T * E, tm)
                _residual_add(m, L.post_mlp_norm_w, ws.h, ws.x, t0, t1)
            else:
                _moe_block(m, ws, L, T, ws.x, 1, tm)
        elif s.lora.nl:   # adapters on gate_up / down: the dense block with their shrink and expand beside it
            _lora_mlp(m, ws, s, L, G, tm)
        elif L.mlp == MLP_GATED:
            _mlp_gated(m, ws, &L.up, &L.down, T, F, tm)
            ll_omp_barrier()
            _residual_out(m, ws, s, ws.act, F, ws.xb2, &xq_f, &L.down, L.post_mlp_norm_w, s.gen0 + 2 * l + 2,
                          _gemm_mode(T), NULL, tm, t0, t1)
        else:   # MLP_UP_ACT
            _mlp_up_act(m, ws, L, T, F, &xq_e, tm)
            ll_omp_barrier()
            _residual_out(m, ws, s, ws.act, F, ws.xb, &xq_f, &L.down, L.post_mlp_norm_w, s.gen0 + 2 * l + 2,
                          _gemm_mode(T), NULL, tm, t0, t1)
        ll_omp_barrier()

    if m.post_ln:   # the last layer's LayerNorm after its MLP: x is the encoder's output
        for t in range(t0, t1):
            _norm(m, m.layers[m.num_layers - 1].mlp_norm_w, m.layers[m.num_layers - 1].mlp_norm_b, ws.x + t * E,
                  ws.x + t * E)
        ll_omp_barrier()
    if s.R == 0:
        return
    if s.hidden:   # pooling: the rows' final hidden states, no LM head
        ll_work_static(tm, s.R, 1, &p0, &p1)
        for r in range(p0, p1):
            if m.final_norm_w != NULL:
                _norm(m, m.final_norm_w, m.final_norm_b, ws.x + s.logits_rows[r] * E, s.logits + r * E)
            else:
                memcpy(s.logits + r * E, ws.x + s.logits_rows[r] * E, E * sizeof(float))
        return
    # the LM head: this rank's vocabulary columns vocab0.. of each logits row (all of them on
    # one rank); under tensor parallel every rank writes its columns of the shared logits rows
    ll_work_static(tm, s.R, 1, &p0, &p1)
    _norm_rows(m, m.final_norm_w, m.final_norm_b, ws.x, s.logits_rows, ws.h, ws.xb, &xq_e, ll_mat_form(&m.lm_head, s.R),
               p0, p1)
    ll_omp_barrier()
    _gemm_phase(ws.h, E, ws.xb, &xq_e, s.R, &m.lm_head, s.logits + m.vocab0, m.vocab_size, 0, _gemm_mode(s.R),
                tm)
    if m.final_softcap > 0 or m.logit_scale != 1.0:
        ll_omp_barrier()
        for r in range(p0, p1):
            row = s.logits + r * m.vocab_size + m.vocab0
            if m.logit_scale != 1.0:
                for i in range(m.lm_head.n):
                    row[i] *= m.logit_scale
            if m.final_softcap > 0:
                ll_softcap_f32(row, m.lm_head.n, m.final_softcap)
    if s.tp != NULL:   # rank 0 samples once every rank's columns are in
        ll_omp_barrier()
        if tid == 0:
            ll_tp_arrive_and_wait(s.tp, s.gen0 + 2 * m.num_layers + 1)
