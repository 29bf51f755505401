"""The mixture-of-experts MLP shared by Mixtral, Qwen2-MoE and Qwen3-MoE: its config fields, and
its tensors in HF checkpoints and llama.cpp GGUF files, as canonical names
(lite_llm/model/arch/__init__.py moe_tensor_names):

    layers.{i}.router.weight            [X, E]   router logits = router . x (run in fp32)
    layers.{i}.experts.{j}.gate_up.weight  [2F, E] gate rows, then up rows
    layers.{i}.experts.{j}.down.weight  [E, F]
    layers.{i}.shared.gate_up.weight    [2Fs, E] Qwen2-MoE's shared expert
    layers.{i}.shared.down.weight       [E, Fs]
    layers.{i}.shared_gate.weight       [E]      its scale: sigmoid(shared_gate . x)

Experts stored as 3-D tensors (llama.cpp's ffn_gate_exps [X, F, E], transformers 5's
experts.gate_up_proj [X, 2F, E]) are cut into one row range per expert, each packed where it
lies in the mapped file (no full-size copy). Not a recipe itself: the family modules use it.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import split, stacked
from lite_llm.model.weights import StackedRows


# ---- config ------------------------------------------------------------------------------


def hf_fields(raw: dict, where: str, *, ffn_key: str | None, norm_topk: bool | None,
              shared: bool = False) -> dict[str, Any]:
    """ModelConfig fields of an HF MoE config: the expert count is num_experts (Qwen) or
    num_local_experts (Mixtral; transformers 5 writes it for Qwen too), ffn_key each expert's
    width (None: intermediate_size),
    norm_topk the renormalisation when the config has no norm_topk_prob (Mixtral: always).
    Layers that mix dense MLPs in (mlp_only_layers, decoder_sparse_step > 1) are refused."""
    if raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1) or 1) != 1:
        raise ModelLoadError(f"{where}: dense MLP layers among the expert layers (mlp_only_layers "
                             f"{raw.get('mlp_only_layers')}, decoder_sparse_step {raw.get('decoder_sparse_step')}) "
                             "are not supported")
    num_experts = raw.get("num_experts") or raw.get("num_local_experts")
    if not num_experts:
        raise ModelLoadError(f"{where}: neither num_experts nor num_local_experts gives the expert count")
    fields = dict(num_experts=int(num_experts), num_experts_per_tok=int(raw["num_experts_per_tok"]),
                  norm_topk_prob=bool(raw.get("norm_topk_prob", False)) if norm_topk is None else norm_topk)
    if ffn_key is not None:
        fields["ffn_dim"] = int(raw[ffn_key])
    if shared:
        fields["shared_ffn_dim"] = int(raw.get("shared_expert_intermediate_size") or 0)
    if not 0 < fields["num_experts_per_tok"] <= fields["num_experts"]:
        raise ModelLoadError(f"{where}: num_experts_per_tok {fields['num_experts_per_tok']} of "
                             f"{fields['num_experts']} experts")
    return fields


def gguf_fields(f, arch: str, *, norm_default: bool, shared: bool = False) -> dict[str, Any]:
    """The same from llama.cpp's metadata: {arch}.expert_count, expert_used_count,
    expert_feed_forward_length (else feed_forward_length), expert_shared_feed_forward_length,
    expert_weights_norm (else llama.cpp's choice for the graph: norm_default)."""
    meta = f.metadata
    if not meta.get(f"{arch}.expert_count"):
        raise ModelLoadError(f"{f.path}: metadata {arch}.expert_count is missing")
    fields = dict(num_experts=int(meta[f"{arch}.expert_count"]),
                  num_experts_per_tok=int(meta.get(f"{arch}.expert_used_count", 0)),
                  norm_topk_prob=bool(meta.get(f"{arch}.expert_weights_norm", norm_default)))
    if not 0 < fields["num_experts_per_tok"] <= fields["num_experts"]:
        raise ModelLoadError(f"{f.path}: {arch}.expert_used_count {fields['num_experts_per_tok']} of "
                             f"{fields['num_experts']} experts")
    if meta.get(f"{arch}.expert_feed_forward_length"):
        fields["ffn_dim"] = int(meta[f"{arch}.expert_feed_forward_length"])
    if shared:
        fields["shared_ffn_dim"] = int(meta.get(f"{arch}.expert_shared_feed_forward_length") or 0)
    return fields


# ---- HF tensors ----------------------------------------------------------------------------


def hf_mlp(ckpt, config: ModelConfig, h: str, p: str, *, block: str, names: tuple[str, str, str],
           shared: str | None = None) -> Iterator[tuple[str, Any]]:
    """The MoE MLP of HF layer prefix h as canonical tensors under p. block: the MLP's module
    ("mlp." or "block_sparse_moe."); names: the per-expert (gate, up, down) projections
    ("gate_proj", "up_proj", "down_proj" or Mixtral's "w1", "w3", "w2"); shared: the shared
    expert's module ("shared_expert") with its "shared_expert_gate". Experts stored fused as
    3-D experts.gate_up_proj [X, 2F, E] / experts.down_proj [X, E, F] are read per expert."""
    E, F, X = config.dim, config.ffn_dim, config.num_experts
    m = h + block
    yield p + "router.weight", stacked(ckpt, ((m + "gate.weight", (X, E)),))
    fused = m + "experts.gate_up_proj" in ckpt
    if fused:
        ckpt.entry(m + "experts.gate_up_proj", (X, 2 * F, E))
        ckpt.entry(m + "experts.down_proj", (X, E, F))
    g, u, d = names
    for j in range(X):
        e = f"{m}experts.{j}."
        if fused:
            yield p + f"experts.{j}.gate_up.weight", split(ckpt, m + "experts.gate_up_proj", (F, F), E,
                                                           first=j * 2 * F)
            yield p + f"experts.{j}.down.weight", split(ckpt, m + "experts.down_proj", (E,), F, first=j * E)
        else:
            yield p + f"experts.{j}.gate_up.weight", stacked(ckpt, ((e + g + ".weight", (F, E)),
                                                                    (e + u + ".weight", (F, E))))
            yield p + f"experts.{j}.down.weight", stacked(ckpt, ((e + d + ".weight", (E, F)),))
    if config.shared_ffn_dim:
        s, Fs = m + shared + ".", config.shared_ffn_dim
        yield p + "shared.gate_up.weight", stacked(ckpt, ((s + "gate_proj.weight", (Fs, E)),
                                                          (s + "up_proj.weight", (Fs, E))))
        yield p + "shared.down.weight", stacked(ckpt, ((s + "down_proj.weight", (E, Fs)),))
        yield p + "shared_gate.weight", ckpt.read(m + shared + "_gate.weight", (1, E)).reshape(E)


# ---- GGUF ------------------------------------------------------------------------------


def _rows(f, name: str, r0: int, n: int) -> tuple[tuple, Any, Any]:
    """(rows part, raw block reader or None, stored part) of rows r0..r0 + n of tensor `name`
    seen as 2-D [prod(shape[:-1]), shape[-1]] (an expert of a 3-D [X, F, E] tensor)."""
    type_name = f.tensors[name].type_name
    rows = (n, lambda a, b: f.read_rows(name, r0 + a, r0 + b, flat=True))
    raw = ((type_name, lambda a, b: f.read_raw_rows(name, r0 + a, r0 + b, flat=True))
           if type_name in NATIVE_TYPES else None)
    return rows, raw, f.stored(name, 0, r0, r0 + n, flat=True)


def _gguf_matrix(f, specs: list[tuple[str, int, int]], cols: int) -> StackedRows:
    """StackedRows of row ranges (tensor, first row, rows) of flattened GGUF tensors."""
    parts = [_rows(f, name, r0, n) for name, r0, n in specs]
    return StackedRows(tuple(p[0] for p in parts), cols, blocks=tuple(p[1] for p in parts),
                       stored=tuple(p[2] for p in parts))


def gguf_mlp(f, config: ModelConfig, b: str, p: str) -> Iterator[tuple[str, Any]]:
    """The MoE MLP of GGUF block prefix b ("blk.{i}.") as canonical tensors under p:
    ffn_gate_inp [X, E], ffn_gate_exps / ffn_up_exps [X, F, E], ffn_down_exps [X, E, F], and the
    shared expert's ffn_gate_shexp / ffn_up_shexp [Fs, E], ffn_down_shexp [E, Fs] with
    ffn_gate_inp_shexp [E] where the model gates it."""
    E, F, X = config.dim, config.ffn_dim, config.num_experts
    f.info(b + "ffn_gate_inp.weight", (X, E))
    yield p + "router.weight", _gguf_matrix(f, [(b + "ffn_gate_inp.weight", 0, X)], E)
    f.info(b + "ffn_gate_exps.weight", (X, F, E))
    f.info(b + "ffn_up_exps.weight", (X, F, E))
    f.info(b + "ffn_down_exps.weight", (X, E, F))
    for j in range(X):
        yield p + f"experts.{j}.gate_up.weight", _gguf_matrix(
            f, [(b + "ffn_gate_exps.weight", j * F, F), (b + "ffn_up_exps.weight", j * F, F)], E)
        yield p + f"experts.{j}.down.weight", _gguf_matrix(f, [(b + "ffn_down_exps.weight", j * E, E)], F)
    if config.shared_ffn_dim:
        Fs = config.shared_ffn_dim
        f.info(b + "ffn_gate_shexp.weight", (Fs, E))
        f.info(b + "ffn_up_shexp.weight", (Fs, E))
        f.info(b + "ffn_down_shexp.weight", (E, Fs))
        yield p + "shared.gate_up.weight", _gguf_matrix(f, [(b + "ffn_gate_shexp.weight", 0, Fs),
                                                            (b + "ffn_up_shexp.weight", 0, Fs)], E)
        yield p + "shared.down.weight", _gguf_matrix(f, [(b + "ffn_down_shexp.weight", 0, E)], Fs)
        if config.shared_gate:   # (Granite's shared MLP is ungated)
            f.info(b + "ffn_gate_inp_shexp.weight", (E,))
            yield p + "shared_gate.weight", np.asarray(f.read(b + "ffn_gate_inp_shexp.weight"), np.float32)


def active_fraction(name: str, config: ModelConfig) -> float:
    """Share of canonical weight `name` a decoded token reads: top-k of X for a routed expert,
    all of any other."""
    return config.num_experts_per_tok / config.num_experts if ".experts." in name and config.num_experts else 1.0

