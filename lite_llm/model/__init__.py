"""Checkpoint loading: a local HF directory, a .gguf file or a Hugging Face name (hub.py: from
its cache, fetched when missing) becomes a LoadedModel (see loader.py): ModelConfig + tokenizer + weight tensors.

Canonical tensor names (i = layer), rows are output features as in HF ([out, in]):
    embed                     [V, E]
    pos_embed                 [P, E]        learned positions (config.rope False), row 0 = position 0
    layers.{i}.attn_norm.weight / .bias    [E]   (.bias only for LayerNorm)
    layers.{i}.qkv.weight     [(H + 2*Hkv)*D, E]  q rows, then k rows, then v rows (fused at load)
    layers.{i}.qkv.bias       [(H + 2*Hkv)*D]     when config.qkv_bias
    layers.{i}.q_norm.weight / k_norm.weight  [D] when config.qk_norm
    layers.{i}.o.weight       [E, H*D]      (.bias [E] when config.o_bias)
    layers.{i}.post_attn_norm.weight [E]    norm of the attention output, when config.post_norms (Gemma)
    layers.{i}.mlp_norm.weight / .bias     [E]
    layers.{i}.gate_up.weight [2F, E]       gate rows then up rows, when config.gated_mlp
    layers.{i}.up.weight      [F, E]        when not gated (OPT fc1); .bias when config.mlp_bias
    layers.{i}.down.weight    [E, F]        (.bias [E] when config.mlp_bias)
    layers.{i}.post_mlp_norm.weight  [E]    norm of the MLP output, when config.post_norms
  a mixture of experts (config.num_experts X > 0) has, in place of gate_up / down:
    layers.{i}.router.weight  [X, E]        router logits (kept float32)
    layers.{i}.experts.{j}.gate_up.weight [2F, E] / .down.weight [E, F]   expert j, F = config.ffn_dim
    layers.{i}.shared.gate_up.weight [2Fs, E] / shared.down.weight [E, Fs] / shared_gate.weight [E]
                                            the shared expert, when config.shared_ffn_dim Fs (Qwen2-MoE)
    (ungated experts, not config.gated_mlp: experts.{j}.up.weight [F, E], shared.up.weight [Fs, E])
    final_norm.weight / .bias [E]
    lm_head.weight            [V, E]        absent when config.tie_word_embeddings
dtypes: 2-D tensors in the engine dtype (np.float32, np.float16, or bf16 bits as np.uint16);
1-D tensors (norm weights, biases) always np.float32. GGUF llama q/k weights are un-permuted
back to HF's rotate-half order, so one RoPE kernel (neox style) serves every source. Each
family's mapping onto these names is its recipe in lite_llm/model/arch/ (fused projections
split into parts, Gemma's (1 + w) norms folded at load).
"""
