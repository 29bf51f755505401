"""Model runner: loaded weights -> packed kernel model + paged KV cache; a SchedulerOutput ->
the persistent batch's step arrays (input_batch.py) -> ONE forward() call -> the compiled
sampler, whose tokens join the batch's rows in place.

    chunks of the step      [ req A: tokens 0..5 (prefill) | req B: token 17 | req C: 9..12 ]
    token_ids / positions   [ a0 a1 a2 a3 a4 a5 | b17 | c9 c10 c11 c12 ]     T = 11
    tok_seq                 [ 3  3  3  3  3  3  | 0   | 1  1   1   1   ]   batch slot of each token
    slot of token t at pos p = block_table[tok_seq[t], p // B] * B + p % B
    logits_rows             [ 5, 6, 10 ]   last token of each chunk that samples
"""
from __future__ import annotations

import ctypes
import logging
import time
from collections import Counter
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from lite_llm import _kernels
from lite_llm._kernels import gemm_path, layout
from lite_llm.config import KV_CACHE_DTYPES, QUANTIZATIONS, attention_path_override, check_quantization  # noqa: F401
from lite_llm.engine import _batch, _sampler
from lite_llm.engine.args import check_kv_cache_dtype  # noqa: F401  (callers import it here)
from lite_llm.engine.input_batch import InputBatch, StepArrays
from lite_llm.engine.request import SampleResult
from lite_llm.engine.runner_output import PromptLogprobs, RunnerOutput
from lite_llm.engine.sampler import Sampler, add_logit_bias
from lite_llm.model import arch, pack
from lite_llm.model.rope import longrope_rows, longrope_switch, rope_tables
from lite_llm.multimodal import load_vision

log = logging.getLogger("lite_llm")


def trim_heap() -> None:
    """Give the load's freed intermediates (fp32 dequantized tensors) back to the OS: glibc
    keeps freed heap memory resident unless asked."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass   # not glibc: nothing to trim this way


_trim_heap = trim_heap     # its former name, for code written against it


def kv_cache_format(dtype: str, requested: str | None = "auto") -> str:
    """KV cache format (layout.KV_DTYPES) for a model dtype and a --kv-cache-dtype. auto: fp32
    stays fp32, 16-bit types store bf16 (same bytes as fp16, fp32's exponent range: no overflow
    in long contexts); int8 / fp8 store a byte per value and a scale per row (layout.py)."""
    chosen = KV_CACHE_DTYPES[check_kv_cache_dtype(requested)]
    if chosen is None:
        return "float32" if dtype == "float32" else "bfloat16"
    return chosen


def kv_bytes_per_block(config, block_size: int, dtype: str, requested: str | None = "auto") -> int:
    """Bytes of one block over all layers, K and V."""
    region = layout.kv_region_bytes(kv_cache_format(dtype, requested), block_size, config.cache_head_dim)
    if config.is_mla:   # one latent row per token, read as both K and V (src/kernels/mla.h)
        return config.num_layers * region
    # a hybrid model's conv layers keep a fixed-size state instead (ModelRunner.conv_states)
    return 2 * config.num_attention_layers * config.num_kv_heads * region


def describe_formats(formats: dict[str, tuple[tuple[str, ...], str]]) -> str:
    """"Q4_K+Q4_K+Q6_K x 10, Q4_K x 20 (int8 blocks); bfloat16 x 2 (bfloat16 pairs)": how many
    matrices run in each combination of part formats, grouped by their activation form."""
    by_input: dict[str, Counter] = {}
    for parts, form in formats.values():
        by_input.setdefault(form, Counter())["+".join(parts)] += 1
    return "; ".join(", ".join(f"{fmt} x {n}" for fmt, n in counts.most_common()) + f" ({form})"
                     for form, counts in by_input.items())


def _attention_plan(path: str, kv_cache_dtype: str, bf16_path: str, dtype: str) -> str:
    """What prefill tiles do under attention path `path` (src/kernels/attention.h LL_ATTN_*)."""
    if kv_cache_dtype == "float32" or path == "direct":
        return "run direct"
    stage = {"bf16": "bf16", "fma": "fma"}.get(path, "fma" if bf16_path == "fma" or dtype == "float32" else "bf16")
    if stage == "fma":
        return "are staged to fp32 (FMA)"
    return "run direct (vdpbf16ps)" if kv_cache_dtype == "bfloat16" else "are staged to bf16 pairs (vdpbf16ps)"


class _PromptRows(NamedTuple):
    """One chunk's prompt positions whose logits the step keeps (prompt logprobs)."""
    request: Any
    first: int                  # the first prompt token they predict
    rows: np.ndarray            # [n] int32 token indices of the step
    targets: np.ndarray         # [n] int32 the prompt tokens they predict


class _PlainBinding(NamedTuple):
    """The latest plain step's bound sampling, reused while the batch stays the same shape."""
    num_rows: int
    logits: np.ndarray          # [R, V] the logits view forward() writes
    prefix: bool                # the sampling slots were 0..R-1
    call: Any                   # _sampler.PreparedSample
    tokens: np.ndarray          # [R] int32 its sampled tokens


def _prompt_rows(sched_out) -> list[_PromptRows]:
    """The _PromptRows of each chunk whose request still wants prompt logprobs. Position p's logits predict token p + 1:
    prompt tokens done .. num_prompt - 1 are wanted (done = len(request.prompt_logprobs), the
    first having none); the last prompt position predicts the first output (a sampling row)."""
    out = []
    offset = 0
    for c in sched_out.chunks:
        req = c.request
        if req.wants_prompt_logits:
            lo = max(c.start, len(req.prompt_logprobs) - 1)
            hi = min(c.start + c.num_new_tokens, req.num_prompt_tokens - 1)
            if hi > lo:
                rows = np.arange(offset + lo - c.start, offset + hi - c.start, dtype=np.int32)
                targets = np.asarray(req.prompt_token_ids[lo + 1:hi + 1], np.int32)
                out.append(_PromptRows(req, lo + 1, rows, targets))
        offset += c.num_new_tokens
    return out


class ModelRunner:
    """Owns the packed weights, the KV cache and the activation workspace of one model."""

    # plain steps (execute): one compiled call after forward(); False runs the general path
    # (the tests compare the two)
    plain_fast_path = True

    def __init__(self, loaded, *, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int, num_threads: int, disable_sliding_window: bool = False,
                 kernels=None, quantization: str | None = None, kv_cache_dtype: str | None = "auto",
                 proposer=None, shard=None, tp_group=None,
                 max_loras: int = 0, max_lora_rank: int = 16, batch_invariant: bool = False):
        """proposer: speculative decoding's draft proposer (spec_decode.py), or None.
        max_loras > 0: room for that many LoRA adapters of rank <= max_lora_rank (lora.py).
        shard: this process's rank of a tensor-parallel group (a tp.RankShard), None without
        tensor parallel: it packs and caches only its part. tp_group: rank 0's TPGroup (workers
        get None). batch_invariant: deterministic mode (config.KernelConfig.batch_invariant)."""
        cfg = loaded.config
        tp_rank, tp_size = (shard.rank, shard.size) if shard is not None else (0, 1)
        self.tp_rank, self.tp_size, self.tp_group = tp_rank, tp_size, tp_group
        local = shard.config if shard is not None else cfg
        if cfg.is_mla and (tp_size > 1 or max_loras > 0):
            raise ValueError(f"{cfg.architecture} (latent attention) runs without tensor parallel and LoRA adapters")
        if batch_invariant and cfg.is_hybrid and ("mamba" in cfg.layer_types or "deltanet" in cfg.layer_types):
            # the scan sums by chunks of 64 tokens counted from each step's first: a prompt chunked
            # elsewhere gives other sums (LFM2's short convolutions are exact per token)
            raise ValueError(f"{cfg.architecture}: deterministic mode does not cover Mamba2 or Gated DeltaNet layers "
                             "(their chunked "
                             "scan sums in an order that follows the step's chunks)")
        if cfg.is_hybrid and (tp_size > 1 or max_loras > 0 or proposer is not None):
            # a conv layer's state would need sharding (tensor parallel), its in/out projections
            # adapters (LoRA), and rejected draft tokens would already be in the state (speculation)
            raise ValueError(f"{cfg.architecture} (recurrent layers: short convolutions, Mamba2 or Gated DeltaNet, a state per "
                             "sequence) runs without "
                             "tensor parallel, LoRA adapters and speculative decoding")
        self.config = cfg
        self.dtype = loaded.dtype
        self.kernels = kernels or _kernels.kernels
        self.num_threads = num_threads
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = loaded.max_model_len
        self.quantization = check_quantization(quantization)
        self.kv_cache_dtype = kv_cache_format(self.dtype, kv_cache_dtype)
        max_pos = max(self.max_model_len, 1)
        # how bf16 weights run prefill and batches on this machine: measured once, cached
        self.gemm_paths = gemm_path.choose(self.kernels)
        # the kernel model's typed configuration, checked here before anything is packed
        self.kernel_config = arch.kernel_config(local, dtype=self.dtype, block_size=block_size, max_positions=max_pos,
                                                kv_cache_dtype=self.kv_cache_dtype,
                                                bf16_path=self.gemm_paths.chosen["bf16"],
                                                attn_path=attention_path_override(),
                                                disable_sliding_window=disable_sliding_window,
                                                batch_invariant=batch_invariant)
        self.attention_path = "direct" if batch_invariant else self.kernel_config.attn_path
        self.batch_invariant = batch_invariant

        start = time.perf_counter()
        # the image encoder of a vision-language model, else None; under tensor parallel rank 0's
        # alone (the step's image rows travel to the other ranks with the step, tp.py)
        self.vision = load_vision(loaded, self.kernels, num_threads, self.gemm_paths.chosen["bf16"]) \
            if tp_rank == 0 else None
        self.packed = pack.packed_weights(loaded, self.dtype, num_threads, self.quantization, shard, self.kernels)
        packed = self.packed.model
        loaded.release()
        trim_heap()
        kv_np = layout.KV_NUMPY[self.kv_cache_dtype]
        k_shape, v_shape = layout.kv_cache_shapes(num_blocks, local.cache_kv_heads, block_size, cfg.cache_head_dim,
                                                  self.kv_cache_dtype)
        if cfg.is_mla:   # the latent rows alone: no separate V (src/kernels/mla.h)
            v_shape = (0,) + v_shape[1:]
        kinds = [cfg.layer_types[i] if cfg.is_hybrid else "" for i in range(cfg.num_layers)]
        conv = [k in ("conv", "mamba", "deltanet") for k in kinds]
        # a conv layer keeps no KV: an empty array in its place
        self.k_caches = [layout.aligned_zeros((0,) + k_shape[1:] if c else k_shape, kv_np) for c in conv]
        self.v_caches = [layout.aligned_zeros((0,) + v_shape[1:] if c else v_shape, kv_np) for c in conv]
        # the state cache: per conv layer one fixed-size row per batch slot (input_batch.py: a
        # request holds its slot from admission until it finishes or is preempted), the last
        # conv_L_cache - 1 gated inputs of every channel; forward() starts a slot afresh when its
        # sequence's step begins at position 0, so a new or recomputed request needs no clearing
        # (a Mamba2 layer's: its convolution's last d_conv - 1 inputs, and its scan's [H, P, N]; a
        # Gated DeltaNet layer's: its convolution's last taps - 1 inputs, and its [Hv, Dk, Dv])
        conv_dim = {"mamba": cfg.mamba_conv_dim, "deltanet": cfg.deltanet_conv_dim}
        self.conv_states = [layout.aligned_zeros((max_num_seqs, cfg.recurrent_len - 1, conv_dim.get(k, cfg.dim)),
                                                 np.float32) for k, c in zip(kinds, conv) if c]
        scan_shape = {"mamba": (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state),
                      "deltanet": (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)}
        self.ssm_states = [layout.aligned_zeros((max_num_seqs,) + scan_shape[k], np.float32)
                           for k in kinds if k in scan_shape]
        self.state_bytes = sum(s.nbytes for s in self.conv_states + self.ssm_states)
        tables = [tuple(np.ascontiguousarray(a, np.float32) for a in rope_tables(c, max_pos))
                  for c in arch.rope_configs(cfg)] if cfg.rope else []
        states = {"conv_states": self.conv_states, "ssm_states": self.ssm_states} if cfg.is_hybrid else {}
        self.model = self.kernels.Model(self.kernel_config, packed, self.k_caches, self.v_caches, tables, **states)
        # LongRoPE whose factors switch within max_model_len: O (its original context), else 0
        self.rope_switch = longrope_switch(cfg, max_pos) if cfg.rope else 0
        self._max_pos = max_pos
        self.packed.keep()      # a fresh pack is written for the next start, in the background
        # rows: the sampling rows, plus every prompt position of requests asking prompt logprobs
        # (at most one per token of the step; the buffers are max(tokens, rows) long anyway)
        self.lora_weights = None    # the kernel's LoraWeights: adapters stacked per slot
        if max_loras > 0:
            if tp_size > 1:
                raise ValueError("LoRA adapters are not supported with tensor parallel yet")
            self.lora_weights = self.kernels.LoraWeights(self.kernel_config, max_loras, max_lora_rank)
        self.workspace = self.kernels.Workspace(self.model, max_num_batched_tokens,
                                                max(max_num_seqs, max_num_batched_tokens), num_threads,
                                                lora_rank=max_lora_rank if max_loras > 0 else 0)
        self.max_num_batched_tokens = max_num_batched_tokens
        self._logits = np.empty((0, cfg.vocab_size), np.float32)
        self._logits_view: tuple = (-1, None)   # (R, self._logits[:R]) of the latest step: reused
        self.max_num_seqs = max_num_seqs
        eos = tuple(cfg.eos_token_ids)
        self.sampler = Sampler(cfg.vocab_size, eos, num_threads=num_threads)
        self.input_batch = InputBatch(max_num_seqs, max_pos, block_size, eos, max_num_batched_tokens)
        self._plain_bound: _PlainBinding | None = None   # of the latest plain step
        self.plain_steps = 0         # steps _execute_plain ran
        self._steady_size = 0        # S when the latest step was a plain one a steady step may repeat
        self._steady = None          # its _batch.SteadyDecode, bound at the first steady step
        self._steady_runs = 0        # steps the SteadyDecodes before it ran
        self.weight_bytes = packed.nbytes
        # a decode step streams every matrix once (of the experts, the top-k of X a token runs);
        # an untied embedding only gives a few rows
        self.bytes_per_token = int(sum(v.nbytes * arch.moe.active_fraction(k, cfg) for k, v in packed.arrays())
                                   - (packed.matrices["embed"].data.nbytes if "lm_head" in packed.matrices else 0))
        self.kv_cache_bytes = sum(c.nbytes for c in self.k_caches + self.v_caches)
        self.kv_bytes_per_token = self.kv_cache_bytes // (num_blocks * block_size)   # all layers, K and V
        # speculative decoding (spec_decode.py): each execute() drafts for the next step
        self.proposer = proposer
        # multiply-adds per token of the layers' matrices, and per logits row (the benchmarks'
        # share of peak; attention's grow with the context: bench/common.py)
        self.layer_macs_per_token = int(sum(n * k * arch.moe.active_fraction(name, cfg)
                                            for name, m in packed.matrices.items() if name.startswith("layers.")
                                            for n, k in (m.shape,)))
        head = packed.lm_head.shape
        self.head_macs_per_row = head[0] * head[1]
        self.formats = self.model.formats()
        log.info("model ready in %.2f s: %.1f MB of weights (%s), %.1f MB read per decoded token; "
                 "KV cache %.1f MB (%d blocks of %d, %s)", time.perf_counter() - start, self.weight_bytes / 2**20,
                 describe_formats(self.formats), self.bytes_per_token / 2**20, self.kv_cache_bytes / 2**20,
                 num_blocks, block_size, self.kv_cache_dtype)
        log.info("GEMM paths (%s kernels): %s", self.gemm_paths.variant, "; ".join(self.gemm_paths.describe()))
        if batch_invariant:
            log.info("deterministic: batch-invariant kernels (every step shape through the same GEMM tiles "
                     "and direct attention tiles, no key splits): a sequence's logits do not depend on its batch")
        if cfg.is_hybrid:
            log.info("recurrent state: %.1f MB (%d slots, one per running sequence, x %.1f KB over %d "
                     "recurrent layers; constant in the context length), KV cache in %d attention layers", self.state_bytes / 2**20,
                     max_num_seqs, cfg.state_bytes_per_seq / 1024, cfg.num_layers - cfg.num_attention_layers,
                     cfg.num_attention_layers)
        if cfg.is_mla:
            log.info("attention: latent (a %s cache of %d values per token and layer: the latent and the RoPE key)",
                     self.kv_cache_dtype, cfg.cache_head_dim)
        else:
            log.info("attention: %s (prefill tiles of a %s cache %s)", self.attention_path, self.kv_cache_dtype,
                     _attention_plan(self.attention_path, self.kv_cache_dtype, self.gemm_paths.chosen["bf16"],
                                     self.dtype))

    # ---- one step ---------------------------------------------------------------------

    def _prompt_logprobs(self, logits: np.ndarray, prompt_rows: list) -> list[PromptLogprobs]:
        """The PromptLogprobs of each chunk of prompt rows, from their raw logits (one compiled
        call)."""
        targets = np.concatenate([r.targets for r in prompt_rows])
        n = len(targets)
        k = max(r.request.sampling_params.prompt_logprobs for r in prompt_rows)
        ranks, lps = np.empty(n, np.int32), np.empty(n, np.float32)
        top_ids, top_lps = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
        _sampler.prompt_logprobs(logits, targets, ranks, lps, top_ids, top_lps, self.num_threads)
        out, at = [], 0
        for request, first, rows, _ in prompt_rows:
            m, kk = len(rows), request.sampling_params.prompt_logprobs
            out.append(PromptLogprobs(request, first, lps[at:at + m], ranks[at:at + m], top_ids[at:at + m, :kk],
                                      top_lps[at:at + m, :kk]))
            at += m
        return out

    def prepare(self, sched_out) -> StepArrays:
        """Apply sched_out's deltas to the persistent batch; the step's flat arrays."""
        return self.input_batch.prepare(sched_out)

    def rope_rows(self, positions: np.ndarray, tok_seq: np.ndarray, seq_lens: np.ndarray) -> np.ndarray | None:
        """The RoPE table row of each token of a step (rope.longrope_rows), given the tokens of
        each sequence (block-table row) so far, prompt and outputs; None: every token's own
        position."""
        if not self.rope_switch or not len(positions) or positions.min() >= self.rope_switch:
            return None
        return longrope_rows(positions, seq_lens[tok_seq] > self.rope_switch, self.rope_switch, self._max_pos)

    def forward(self, token_ids, positions, slot_mapping, tok_seq, block_tables, logits_rows,
                mm: tuple = (None, None, None, None), rope_rows: np.ndarray | None = None) -> np.ndarray:
        """One kernel call; returns logits [R, V] of the rows asked for (tests use this directly).
        The array is a view of a buffer reused by the next call (fresh pages every step would
        cost page faults). mm: (image rows [M, E], embed_src [T], rope_pos [T, 3], attn_pos [T]) of
        a vision-language model's step (multimodal.VisionRunner.step_inputs), Nones otherwise.
        rope_rows: [T] the RoPE table row of each token (self.rope_rows), None: its position."""
        group = self.tp_group
        if group is None:
            logits = self._logits_rows(len(logits_rows))
            if self.lora_weights is None and mm[0] is None and mm[1] is None and mm[2] is None and rope_rows is None:
                self.kernels.forward(self.model, self.workspace, token_ids, positions, slot_mapping, tok_seq,
                                     block_tables, logits_rows, logits, self.num_threads)
                return logits
            # each sequence's adapter slot: its batch row's
            adapters = {} if self.lora_weights is None else {"lora": self.lora_weights,
                                                             "seq_lora": self.input_batch.seq_lora}
            mm_embeds, embed_src, rope_pos, attn_pos = mm
            self.kernels.forward(self.model, self.workspace, token_ids, positions, slot_mapping, tok_seq,
                                 block_tables, logits_rows, logits, self.num_threads, attn_positions=attn_pos,
                                 mm_embeds=mm_embeds, embed_src=embed_src, rope_pos=rope_pos, rope_rows=rope_rows,
                                 **adapters)
            return logits
        # tensor parallel: every rank writes its vocabulary columns into the segment's rows
        logits = group.broadcast(token_ids, positions, slot_mapping, tok_seq, block_tables, logits_rows, mm, rope_rows)
        mm_embeds, embed_src, rope_pos, attn_pos = mm
        try:
            self.kernels.forward(self.model, self.workspace, token_ids, positions, slot_mapping, tok_seq,
                                 block_tables, logits_rows, logits, self.num_threads, tp=group.comm,
                                 attn_positions=attn_pos, mm_embeds=mm_embeds, embed_src=embed_src, rope_pos=rope_pos,
                                 rope_rows=rope_rows)
        except RuntimeError as e:
            group.raise_failure(e)
        return logits

    def _logits_rows(self, R: int) -> np.ndarray:
        """logits [R, V]: the first R rows of the buffer forward() writes (the same view while R
        stays the same)."""
        size, logits = self._logits_view
        if size != R:
            if self._logits.shape[0] < R:
                self._logits = np.empty((R, self.config.vocab_size), np.float32)
            logits = self._logits[:R]
            self._logits_view = R, logits
        return logits

    def _forward_step(self, sched_out, a: StepArrays, logits_rows: np.ndarray, masks):
        """The step's one forward call over logits_rows (the rows that sample) plus the rows of
        prompt logprobs the step's chunks want; waits for the structured-output masks either way.
        Returns (all logits, prompt rows or None, kernel seconds, bitmask, mask rows)."""
        prompt_rows = None
        if self.input_batch.any_prompt_logprobs:
            prompt_rows = _prompt_rows(sched_out)
            if prompt_rows:
                logits_rows = np.concatenate([logits_rows, np.concatenate([r.rows for r in prompt_rows])])
        start = time.perf_counter()
        mm = (None, None, None, None)
        try:
            if self.vision is not None:   # the step's images encoded (or from the cache) before its forward
                mm = self.vision.step_inputs(sched_out.chunks, len(a.token_ids), a.positions)
            rope_rows = self.rope_rows(a.positions, a.tok_seq, self.input_batch.num_tokens) \
                if self.rope_switch else None
            all_logits = self.forward(a.token_ids, a.positions, a.slot_mapping, a.tok_seq, a.block_tables,
                                      logits_rows, mm, rope_rows)
            kernel_seconds = time.perf_counter() - start
        finally:        # the mask's buffer is reused next step: never leave its work running
            bitmask, mask_rows = masks.wait() if masks is not None else (None, None)
        return all_logits, prompt_rows, kernel_seconds, bitmask, mask_rows

    def execute(self, sched_out, masks=None) -> RunnerOutput:
        """One step. masks: the step's structured-output MaskJob (structured.py), being computed
        while forward() runs; waited for before sampling. A steady step (SchedulerOutput.steady)
        after a plain step of the same sequences repeats that step's arrays, forward() call and
        bound sampling in one compiled call (_batch.SteadyDecode), with the same result."""
        steady = self._steady
        if sched_out.steady and masks is None:
            if steady is None and self._steady_size == len(sched_out.chunks):
                steady = self._steady = self._bind_steady()
            if steady is not None:
                return steady.run(sched_out.chunks)
        if steady is not None:
            self._steady_runs += steady.num_runs
        self._steady, self._steady_size = None, 0
        batch = self.input_batch
        a = batch.prepare(sched_out)
        if self.proposer is not None:
            return self._execute_speculative(sched_out, a, masks)
        num_rows = len(a.sample_slots)
        # the common step (no grammar masks, logit biases, prompt logprobs or tensor parallel)
        # binds its sampling before forward(): after it, while every cache is cold, one call samples
        bound = num_rows and masks is None and self.tp_group is None and not batch.any_logit_bias \
            and not batch.any_prompt_logprobs
        if bound and self.plain_fast_path and not batch.any_logprobs and not batch.any_banning:
            return self._execute_plain(sched_out, a, num_rows)
        if bound:
            self.sampler.prepare(self._logits_rows(num_rows),
                                 *batch.sampling_arrays(a.sample_slots, a.sample_slots_are_prefix),
                                 any_logprobs=batch.any_logprobs)
        all_logits, prompt_rows, kernel_seconds, bitmask, mask_rows = self._forward_step(
            sched_out, a, a.logits_rows, masks)
        sampled = []
        if bound:
            sampled = self.sampler.run_prepared()
            kernel_seconds += self.sampler.last_kernel_seconds
            batch.append_step(self.sampler.last_tokens)
        elif num_rows:
            logits = all_logits[:len(a.logits_rows)]
            if batch.any_logit_bias:
                add_logit_bias(logits, [c.request for c in sched_out.chunks if c.sample])
            sampled = self.sampler.run(logits, *batch.sampling_arrays(a.sample_slots, a.sample_slots_are_prefix),
                                       bitmask=bitmask, mask_rows=mask_rows, any_logprobs=batch.any_logprobs)
            kernel_seconds += self.sampler.last_kernel_seconds
            batch.append_step(self.sampler.last_tokens)
        prompt_logprobs = self._prompt_logprobs(all_logits[len(a.logits_rows):], prompt_rows) if prompt_rows else []
        # weights stream once per step; attention reads each sequence's context once
        return RunnerOutput(_align(sampled, sched_out.chunks), None, prompt_logprobs, kernel_seconds,
                            self.bytes_per_token + a.num_context_tokens * self.kv_bytes_per_token)

    def _execute_plain(self, sched_out, a: StepArrays, num_rows: int) -> RunnerOutput:
        """execute() for a plain step: no logprobs, min_tokens bans, biases, masks, prompt
        logprobs or tensor parallel. A steady batch (the same R, logits view and slot order kind
        as the latest plain step) reuses its bound sampling, checked again (slots other than
        0..R-1 first gather their parameter rows into the same step buffers); after forward()
        one compiled call samples, appends the tokens to the batch rows and builds the results
        (_batch.StepBuffers.finish_plain). The same sampling and rows as the general path."""
        batch = self.input_batch
        logits = self._logits_rows(num_rows)
        prefix = a.sample_slots_are_prefix
        cached = self._plain_bound
        if cached is not None and cached.num_rows == num_rows and cached.logits is logits and cached.prefix == prefix:
            call, tokens = cached.call, cached.tokens
            if not prefix:
                batch.gather_params(a.sample_slots)
            call.check()
        else:
            call, tokens = self.sampler.prepare(logits, *batch.sampling_arrays(a.sample_slots, prefix),
                                                any_logprobs=False)
            self._plain_bound = _PlainBinding(num_rows, logits, prefix, call, tokens)
        _, _, kernel_seconds, _, _ = self._forward_step(sched_out, a, a.logits_rows, None)
        sampled, sample_seconds = batch.finish_plain(call.run, tokens, SampleResult)
        self.plain_steps += 1
        if len(a.token_ids) == num_rows == len(sched_out.chunks) and self.lora_weights is None \
                and self.vision is None and self.tp_group is None and not self.rope_switch:
            self._steady_size = num_rows     # a steady step of these sequences may repeat this one
        # a prefill chunk that does not sample yet: None
        return RunnerOutput(_align(sampled, sched_out.chunks), None, [], kernel_seconds + sample_seconds,
                            self.bytes_per_token + a.num_context_tokens * self.kv_bytes_per_token)

    @property
    def steady_decode(self):
        """The _batch.SteadyDecode the latest step ran when it was a steady one, else None:
        while the scheduler's steps stay steady its run(chunks) is this runner's execute() of
        them (the engine's compiled steady step calls it directly)."""
        return self._steady

    @property
    def steady_steps(self) -> int:
        """Steps a SteadyDecode ran."""
        return self._steady_runs + (self._steady.num_runs if self._steady is not None else 0)

    def _bind_steady(self):
        """The latest plain step (S sequences, one token each) bound for the steady steps that
        repeat it (_batch.SteadyDecode), or None."""
        cached = self._plain_bound
        bound = self.input_batch.bind_decode(self._steady_size)
        if cached is None or bound is None or cached.num_rows != self._steady_size:
            return None
        batch = self.input_batch
        gather_params = None if cached.prefix else partial(batch.gather_params, bound.slots)
        args = (self.model, self.workspace, bound.token_ids, bound.positions, bound.slot_mapping, bound.tok_seq,
                batch.block_table, bound.logits_rows, cached.logits, self.num_threads)
        return _batch.SteadyDecode(bound.buffers, batch, bound.slots, cached.tokens, cached.call, gather_params,
                                   self.kernels.forward, args, self.bytes_per_token, self.kv_bytes_per_token,
                                   SampleResult, RunnerOutput)

    # ---- speculative decoding -------------------------------------------------------------

    def _execute_speculative(self, sched_out, a: StepArrays, masks) -> RunnerOutput:
        """execute() with drafts: each sampling chunk with s drafts brings its last s + 1
        logits rows to the compiled verifier (_sampler.verify); its result is then a list of
        SampleResults (accepted drafts, then one more token). Afterwards the proposer drafts
        for the next step (RunnerOutput.spec_token_ids)."""
        batch = self.input_batch
        sampling = [c for c in sched_out.chunks if c.sample]
        num_rows = [1 + len(c.spec_token_ids) for c in sampling]
        seq_rows = np.zeros(len(sampling) + 1, np.int32)          # [S + 1]
        np.cumsum(num_rows, out=seq_rows[1:])
        R = int(seq_rows[-1])
        # row r of sequence i is token logits_rows[i] - (num_rows[i] - 1) + (r - seq_rows[i])
        logits_rows = (np.repeat(a.logits_rows - np.asarray(num_rows, np.int32) + 1, num_rows)
                       + np.arange(R, dtype=np.int32) - np.repeat(seq_rows[:-1], num_rows)).astype(np.int32)
        draft_ids = np.zeros(R, np.int32)
        for i, c in enumerate(sampling):
            if c.spec_token_ids:
                draft_ids[seq_rows[i]:seq_rows[i + 1] - 1] = c.spec_token_ids
        all_logits, prompt_rows, kernel_seconds, bitmask, mask_rows = self._forward_step(
            sched_out, a, logits_rows, masks)
        logits = all_logits[:R]
        results: list = []
        if sampling:
            if batch.any_logit_bias:       # a biased request has no drafts: its one row
                for i, c in enumerate(sampling):
                    if c.request.sampling_params.logit_bias:
                        add_logit_bias(logits[seq_rows[i]:seq_rows[i] + 1], [c.request])
            results = self.sampler.verify(logits, seq_rows, draft_ids,
                                          *batch.sampling_arrays(a.sample_slots, a.sample_slots_are_prefix),
                                          bitmask=bitmask, mask_rows=mask_rows)
            kernel_seconds += self.sampler.last_kernel_seconds
            counts = self.sampler.last_counts
            tokens = self.sampler.last_tokens
            keep = np.repeat(seq_rows[:-1], counts) + (np.arange(int(counts.sum()), dtype=np.int32)
                                                       - np.repeat(np.cumsum(counts) - counts, counts))
            batch.append_sampled(np.repeat(a.sample_slots, counts).astype(np.int32), tokens[keep])
            spec_start = time.perf_counter()
            spec_token_ids = self.proposer.propose(batch, [c.request for c in sampling], a.sample_slots, sched_out)
            kernel_seconds += time.perf_counter() - spec_start
        else:
            spec_token_ids = {}
        prompt_logprobs = self._prompt_logprobs(all_logits[R:], prompt_rows) if prompt_rows else []
        return RunnerOutput(_align(results, sched_out.chunks), spec_token_ids, prompt_logprobs, kernel_seconds,
                            self.bytes_per_token + a.num_context_tokens * self.kv_bytes_per_token)


def _align(sampled: list, chunks: list) -> list:
    """The sampling rows' results aligned with the step's chunks: None where a chunk does not
    sample (a prefill chunk before its prompt's end)."""
    if len(sampled) == len(chunks):
        return sampled
    results = iter(sampled)
    return [next(results) if c.sample else None for c in chunks]
