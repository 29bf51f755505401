"""LoRA adapters served per request: reading them (PEFT directories, llama.cpp GGUF LoRA files)
and the slots they occupy in the stacked weights the forward pass reads.

    LoRARequest("sql", 1, "/adapters/sql")     vLLM's request object: name, id, path
    load_adapter(path, config, max_rank)        -> LoRAAdapter: per (layer, target) its A [r, K]
                                                   and B^T [r, N] with the scale folded in
    LoRAManager                                 names -> slots of the kernel's LoraWeights, with
                                                   a reference count per slot (requests using it)

An adapter is checked against the base model when it is read (rank, targets, shapes): a bad
one never reaches a slot. What is not here: the arithmetic (lite_llm/_kernels/lora.pxi, run
inside the one forward call), choosing a slot per sequence (engine: Request.lora_slot).
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from hashlib import blake2b

import numpy as np

from lite_llm.model.gguf import GGUFFile
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.weights import bf16_to_f32

# PEFT module names and llama.cpp tensor names -> the kernel's target names
PEFT_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o",
                "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
GGUF_TARGETS = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
# llama.cpp's converter permutes q/k rows (interleaved rope) for these GGUF architectures
_GGUF_PERMUTED = ("llama", "granite", "mistral")


@dataclass(eq=False)
class LoRARequest:
    """Which adapter a request runs with (vLLM's LoRARequest): lora_name is what clients
    call it (the server's `model`), lora_int_id a positive id, lora_path a PEFT directory or a
    GGUF LoRA file."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self):
        if not self.lora_name:
            raise ValueError("LoRARequest: lora_name must not be empty")
        if int(self.lora_int_id) < 1:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_int_id must be > 0, not {self.lora_int_id}")

    def __eq__(self, other):
        return isinstance(other, LoRARequest) and other.lora_int_id == self.lora_int_id

    def __hash__(self):
        return hash(self.lora_int_id)


@dataclass
class LoRAAdapter:
    """One adapter read and checked against a base model."""
    name: str
    path: str
    rank: int                                  # the largest rank of its targets
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # (layer, target) -> (A [r, K] float32, B^T [r, N] float32 scaled)

    @property
    def targets(self) -> list[str]:
        return sorted({t for _, t in self.weights})


def target_shapes(config) -> dict[str, tuple[int, int]]:
    """[N, K] (out, in) of each target's base matrix."""
    E, F = config.dim, config.ffn_dim
    HD, KD = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"q": (HD, E), "k": (KD, E), "v": (KD, E), "o": (E, HD), "gate": (F, E), "up": (F, E), "down": (E, F)}


def _check_pair(where: str, layer: int, target: str, a: np.ndarray, b: np.ndarray, config, max_rank: int) -> None:
    """A [r, K] and B [N, r] of one target fit the base model and the rank limit."""
    if not 0 <= layer < config.num_layers:
        raise ValueError(f"{where}: layer {layer} of {target}, but the base model has {config.num_layers} layers")
    n, k = target_shapes(config)[target]
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise ValueError(f"{where}: layer {layer} {target}: lora_A {a.shape} and lora_B {b.shape} "
                         "do not share a rank")
    if a.shape[1] != k or b.shape[0] != n:
        raise ValueError(f"{where}: layer {layer} {target}: lora_A {a.shape} / lora_B {b.shape} do not fit the "
                         f"base model's {target} projection [{n}, {k}] (expected lora_A [r, {k}], lora_B [{n}, r]): "
                         "an adapter for another base model?")
    if a.shape[0] > max_rank:
        raise ValueError(f"{where}: layer {layer} {target} has rank {a.shape[0]}, above --max-lora-rank {max_rank}")


def _f32(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint16:    # bf16 bits
        return bf16_to_f32(x)
    return np.asarray(x, np.float32)


def _module_value(pattern: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern: the value of the longest key the module name ends with."""
    best = None
    for key in pattern or {}:
        if module == key or module.endswith("." + key) or re.fullmatch(key, module):
            best = key if best is None or len(key) > len(best) else best
    return default if best is None else pattern[best]


def _load_peft(path: str, name: str, config, max_rank: int) -> LoRAAdapter:
    with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    where = f"LoRA adapter {path}"
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{where}: peft_type {cfg.get('peft_type')!r}; only LORA adapters are served")
    if cfg.get("use_dora"):
        raise ValueError(f"{where}: DoRA adapters (use_dora) are not supported")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{where}: modules_to_save {cfg['modules_to_save']} (full copies of base modules) "
                         "are not supported")
    if not os.path.exists(os.path.join(path, "adapter_model.safetensors")):
        raise ValueError(f"{where}: adapter_model.safetensors is missing")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):    # a regex over module names: read the modules from the tensors
        targets = []
    for t in targets:
        if t not in PEFT_TARGETS:
            raise ValueError(f"{where}: target module {t!r} is not supported; LoRA targets are "
                             f"{', '.join(PEFT_TARGETS)}")
    default_r, default_alpha = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    rslora = bool(cfg.get("use_rslora", False))
    ckpt = SafetensorsCheckpoint(path)
    pat = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    try:
        for tensor_name in ckpt.entries:
            m = pat.search(tensor_name)
            if m is None or m.group(2) not in PEFT_TARGETS:
                raise ValueError(f"{where}: tensor {tensor_name!r} is not a LoRA A/B of "
                                 f"{', '.join(PEFT_TARGETS)} (embeddings, lm_head and biases are not supported)")
            pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = _f32(ckpt.read(tensor_name))
    finally:
        ckpt.close()
    found = {module for _, module in pairs}
    for t in targets:
        if t not in found:
            raise ValueError(f"{where}: adapter_config.json targets {t!r} but adapter_model.safetensors has no "
                             f"lora_A / lora_B for it")
    adapter = LoRAAdapter(name, path, 0)
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{where}: layer {layer} {module} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        target = PEFT_TARGETS[module]
        _check_pair(where, layer, target, a, b, config, max_rank)
        full = f"model.layers.{layer}.{'self_attn' if target in 'qkvo' else 'mlp'}.{module}"
        r = a.shape[0]
        alpha = float(_module_value(cfg.get("alpha_pattern"), full, default_alpha))
        if r != int(_module_value(cfg.get("rank_pattern"), full, r)):
            raise ValueError(f"{where}: layer {layer} {module} has rank {r}, adapter_config.json says "
                             f"{_module_value(cfg.get('rank_pattern'), full, default_r)}")
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        adapter.weights[(layer, target)] = (np.ascontiguousarray(a), np.ascontiguousarray((b * scale).T))
        adapter.rank = max(adapter.rank, r)
    if not adapter.weights:
        raise ValueError(f"{where}: no LoRA tensors")
    return adapter


def _unpermute_rows(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation of B [heads * D, r] (see model/arch/llama.py)."""
    heads = w.shape[0] // head_dim
    return w.reshape(heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: str, name: str, config, max_rank: int) -> LoRAAdapter:
    where = f"LoRA adapter {path}"
    f = GGUFFile(path)
    try:
        md = f.metadata
        if md.get("general.type") != "adapter" or md.get("adapter.type") != "lora":
            raise ValueError(f"{where}: not a GGUF LoRA adapter (general.type {md.get('general.type')!r}, "
                             f"adapter.type {md.get('adapter.type')!r})")
        alpha = float(md.get("adapter.lora.alpha", 0.0))
        permuted = md.get("general.architecture") in _GGUF_PERMUTED
        pat = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
        pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        for tensor_name in f.tensors:
            m = pat.match(tensor_name)
            if m is None or m.group(2) not in GGUF_TARGETS:
                raise ValueError(f"{where}: tensor {tensor_name!r} is not a LoRA a/b of "
                                 f"{', '.join(GGUF_TARGETS)}")
            pairs.setdefault((int(m.group(1)), GGUF_TARGETS[m.group(2)]), {})[m.group(3)] = f.read(tensor_name)
    finally:
        f.close()
    adapter = LoRAAdapter(name, path, 0)
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise ValueError(f"{where}: layer {layer} {target} has lora_{''.join(ab)} but not both lora_a and lora_b")
        a, b = _f32(ab["a"]), _f32(ab["b"])
        _check_pair(where, layer, target, a, b, config, max_rank)
        if permuted and target in ("q", "k"):
            b = _unpermute_rows(b, config.head_dim)
        r = a.shape[0]
        scale = alpha / r if alpha else 1.0     # llama.cpp: no alpha stored means a scale of 1
        adapter.weights[(layer, target)] = (np.ascontiguousarray(a), np.ascontiguousarray((b * scale).T))
        adapter.rank = max(adapter.rank, r)
    if not adapter.weights:
        raise ValueError(f"{where}: no LoRA tensors")
    return adapter


def load_adapter(path: str, config, max_rank: int, name: str | None = None) -> LoRAAdapter:
    """Read a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) or a
    llama.cpp GGUF LoRA file, checked against the base model's config; ValueError naming what
    does not fit."""
    name = name or os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "adapter_config.json")):
            raise ValueError(f"LoRA adapter {path}: no adapter_config.json (a PEFT adapter directory is expected)")
        return _load_peft(path, name, config, max_rank)
    if os.path.isfile(path):
        return _load_gguf(path, name, config, max_rank)
    raise ValueError(f"LoRA adapter {path!r} not found (a PEFT directory or a GGUF LoRA file)")


def parse_lora_modules(specs: list[str] | None) -> list[tuple[str, str]]:
    """--lora-modules entries: "name=path" or vLLM's JSON {"name": ..., "path": ...}."""
    out = []
    for spec in specs or []:
        if spec.lstrip().startswith("{"):
            d = json.loads(spec)
            if "name" not in d or "path" not in d:
                raise ValueError(f"--lora-modules {spec!r}: JSON needs \"name\" and \"path\"")
            out.append((str(d["name"]), str(d["path"])))
            continue
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {spec!r}: expected name=path")
        out.append((name, path))
    return out


class _Entry:
    __slots__ = ("name", "int_id", "path", "slot", "salt", "refs", "retired", "rank")

    def __init__(self, name, int_id, path, slot, salt, rank):
        self.name, self.int_id, self.path, self.slot, self.salt, self.rank = name, int_id, path, slot, salt, rank
        self.refs = 0
        self.retired = False


class LoRAManager:
    """Adapters by name in the slots of `weights` (the kernel's LoraWeights). Thread-safe:
    HTTP threads load, unload and acquire; the engine thread retains and releases. A slot is
    reused only once no request holds it, so a running request keeps its adapter even if it is
    unloaded meanwhile. Each load gets a fresh prefix-cache salt: no cached block is shared
    across adapters, or with an earlier adapter of the same name."""

    def __init__(self, config, weights, max_loras: int, max_rank: int):
        self.config, self.weights = config, weights
        self.max_loras, self.max_rank = max_loras, max_rank
        self._lock = threading.Lock()
        self._by_name: dict[str, _Entry] = {}
        self._slots: list[_Entry | None] = [None] * max_loras
        self._loads = 0

    def names(self) -> list[tuple[str, str]]:
        """(name, path) of each loaded adapter."""
        with self._lock:
            return [(e.name, e.path) for e in self._by_name.values()]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def load(self, name: str, path: str, int_id: int | None = None, evict: bool = False) -> None:
        """Read the adapter at path and give it a slot under `name`. ValueError: a bad adapter,
        the name taken, or every slot busy (evict: drop the least recently loaded adapter no
        request uses, as an offline LoRARequest may)."""
        self.add(load_adapter(path, self.config, self.max_rank, name), int_id, evict)   # reads files unlocked

    def add(self, adapter: LoRAAdapter, int_id: int | None = None, evict: bool = False) -> None:
        """Give an adapter already read (and checked against this base model) a slot."""
        name, path = adapter.name, adapter.path
        if adapter.rank > self.max_rank:
            raise ValueError(f"LoRA adapter {name!r} has rank {adapter.rank}, above --max-lora-rank {self.max_rank}")
        with self._lock:
            if name in self._by_name:
                raise ValueError(f"LoRA adapter {name!r} is already loaded")
            slot = next((i for i, e in enumerate(self._slots) if e is None), None)
            if slot is None and evict:
                idle = [e for e in self._by_name.values() if e.refs == 0]
                if idle:
                    self._drop(idle[0])
                    slot = idle[0].slot
            if slot is None:
                raise ValueError(f"all {self.max_loras} LoRA slots (--max-loras) are in use; unload an adapter first")
            self._loads += 1
            salt = blake2b(f"lora:{self._loads}:{name}".encode(), digest_size=16).digest()
            entry = _Entry(name, int_id, path, slot, salt, adapter.rank)
            self._slots[slot] = entry       # reserved before the weights land: nobody else takes it
            self._by_name[name] = entry
        # this slot has no rows in any step yet: writing it while a step runs is safe
        self.weights.clear_slot(slot)
        for (layer, target), (a, bt) in adapter.weights.items():
            self.weights.set_target(slot, layer, target, a, bt)

    def unload(self, name: str) -> None:
        with self._lock:
            entry = self._by_name.get(name)
            if entry is None:
                raise KeyError(name)
            self._drop(entry)

    def _drop(self, entry: _Entry) -> None:
        del self._by_name[entry.name]
        entry.retired = True
        if entry.refs == 0:
            self._slots[entry.slot] = None

    def acquire(self, lora) -> tuple[int, bytes]:
        """(slot, prefix-cache salt) of a LoRARequest or an adapter name, with one reference
        taken (give it back with release). A LoRARequest not loaded yet is loaded from its path."""
        name = lora.lora_name if isinstance(lora, LoRARequest) else str(lora)
        with self._lock:
            entry = self._by_name.get(name)
            if entry is not None:
                if isinstance(lora, LoRARequest) and entry.int_id is not None and entry.int_id != lora.lora_int_id:
                    raise ValueError(f"LoRA adapter {name!r} is loaded with id {entry.int_id}, "
                                     f"not {lora.lora_int_id}")
                entry.refs += 1
                return entry.slot, entry.salt
        if not isinstance(lora, LoRARequest) or not lora.lora_path:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        try:
            self.load(name, lora.lora_path, lora.lora_int_id, evict=True)
        except ValueError:
            if name not in self._by_name:    # another thread loaded it meanwhile: use that
                raise
        return self.acquire(name)

    def retain(self, slot: int) -> None:
        with self._lock:
            self._slots[slot].refs += 1

    def release(self, slot: int) -> None:
        with self._lock:
            entry = self._slots[slot]
            entry.refs -= 1
            assert entry.refs >= 0, f"LoRA slot {slot} released more often than taken"
            if entry.refs == 0 and entry.retired:
                self._slots[slot] = None
