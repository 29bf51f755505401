"""A pooling model's model-level pieces: how its hidden states become one vector, and what
turns that vector into an answer (vLLM's `runner="pooling"`).

    PoolerConfig      how hidden states become one vector: MEAN / CLS / LAST, normalize,
                      Matryoshka dimensions (from sentence-transformers' modules.json,
                      1_Pooling/config.json, sentence_bert_config.json, or --pooler-config)
    PoolingSpec       a loaded pooling model's pooler, classifier head and limits: what a
                      front end needs to finish the engine's pooled rows (classify)
    pooling_spec      the PoolingSpec of a loaded checkpoint (its head: a cross-encoder's
                      dense + out, or vLLM's classifier_from_token rows of the LM head)
    finish_embedding  Matryoshka truncation then L2 normalization; scores_from_logits
    choose_runner     "pooling" or "generate" from a checkpoint

What does not live here: the step that pools (lite_llm/engine/pooling.py), the HTTP bodies
(lite_llm/server/pooling.py), the layers (lite_llm/_kernels/forward.pxi), the checkpoint
mapping (lite_llm/model/arch/bert.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lite_llm.model import arch
from lite_llm.model.arch import bert
from lite_llm.model.gguf import GGUF_MAGIC, GGUFFile
from lite_llm.model.hf import SafetensorsCheckpoint
from lite_llm.model.loader import resolve_model
from lite_llm.model.weights import convert

POOLING_TYPES = ("MEAN", "CLS", "LAST")
RUNNERS = ("auto", "generate", "pooling")


class PoolingInputError(ValueError):
    """A request the pooling model cannot take (HTTP 400)."""


# ---- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class PoolerConfig:
    """vLLM's --pooler-config names: pooling_type, normalize, dimensions (a Matryoshka model's
    allowed widths: is_matryoshka / matryoshka_dimensions in config.json)."""
    pooling_type: str = "MEAN"
    normalize: bool = True
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    max_seq_length: int | None = None       # sentence_bert_config.json: the input limit
    activation: bool = True                 # classify/score: sigmoid (1 label) or softmax

    def __post_init__(self):
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type {self.pooling_type!r}: expected one of {', '.join(POOLING_TYPES)}")


def _read_json(path: str) -> dict | list | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sentence_transformers_modules(path: str) -> list[dict]:
    """modules.json of a sentence-transformers directory, [] otherwise."""
    if not os.path.isdir(path):
        return []
    return _read_json(os.path.join(path, "modules.json")) or []


def pooler_config(path: str, config, overrides: dict | str | None = None) -> PoolerConfig:
    """The pooler of the checkpoint at `path` (an HF directory or a .gguf file), then
    `overrides` (--pooler-config: a dict or JSON text with vLLM's keys)."""
    values: dict = {}
    raw = _read_json(os.path.join(path, "config.json")) if os.path.isdir(path) else None
    modules = sentence_transformers_modules(path)
    if modules:
        values["normalize"] = any(m.get("type", "").endswith("Normalize") for m in modules)
        for m in modules:
            if m.get("type", "").endswith(".Pooling"):
                pc = _read_json(os.path.join(path, m.get("path", ""), "config.json")) or {}
                if pc.get("pooling_mode_cls_token"):
                    values["pooling_type"] = "CLS"
                elif pc.get("pooling_mode_lasttoken"):
                    values["pooling_type"] = "LAST"
                elif pc.get("pooling_mode_mean_tokens"):
                    values["pooling_type"] = "MEAN"
                else:
                    raise ValueError(f"{path}: sentence-transformers pooling {pc} is not supported "
                                     "(mean, cls or last token)")
        sb = _read_json(os.path.join(path, "sentence_bert_config.json")) or {}
        if sb.get("max_seq_length"):
            values["max_seq_length"] = int(sb["max_seq_length"])
    elif os.path.isfile(path) and gguf_arch(path) is not None:   # llama.cpp's {arch}.pooling_type
        f = GGUFFile(path)
        try:
            kind = f.metadata.get(f"{gguf_arch(path)}.pooling_type")
        finally:
            f.close()
        values.update(pooling_type={1: "MEAN", 2: "CLS", 3: "LAST"}.get(kind, "CLS" if not config.causal else "LAST"),
                      normalize=True)
    elif config.causal:
        values.update(pooling_type="LAST", normalize=True)        # decoder embedders (Qwen3-Embedding)
    elif config.architecture == "NomicBertModel":
        values.update(pooling_type="MEAN", normalize=True)        # nomic-embed-text's sentence-transformers set-up
    else:
        values.update(pooling_type="CLS", normalize=True)         # bge and most bare encoders
    if raw:
        dims = raw.get("matryoshka_dimensions")
        if raw.get("is_matryoshka") or dims:
            values["is_matryoshka"] = True
            values["matryoshka_dimensions"] = tuple(int(d) for d in dims or ())
    if isinstance(overrides, str):
        overrides = json.loads(overrides)
    known = {"pooling_type": "pooling_type", "normalize": "normalize", "softmax": "activation",
             "activation": "activation"}
    for key, value in (overrides or {}).items():
        if key not in known:
            raise ValueError(f"pooler_config: unknown key {key!r} (known: {', '.join(known)})")
        values[known[key]] = value.upper() if key == "pooling_type" and isinstance(value, str) else value
    return PoolerConfig(**values)


def token_head(path: str, config, tokenizer, tokens) -> dict[str, np.ndarray]:
    """vLLM's classifier_from_token: a one-label head from the LM head's rows of `tokens`
    (["no", "yes"]: logit(yes) - logit(no), as Qwen3-Reranker is scored; one token: its logit)."""
    if not isinstance(tokens, (list, tuple)) or not 1 <= len(tokens) <= 2:
        raise ValueError(f"classifier_from_token must list one or two tokens, got {tokens!r}")
    ids = []
    for t in tokens:
        i = tokenizer.token_to_id(t) if tokenizer is not None else None
        if i is None:
            raise ValueError(f"classifier_from_token: {t!r} is not a token of the vocabulary")
        ids.append(i)
    ckpt = SafetensorsCheckpoint(path)
    try:
        name = next(n for n in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight") if n in ckpt)
        rows = [convert(ckpt.read_rows(name, i, i + 1), "float32")[0] for i in ids]
    finally:
        ckpt.close()
    w = rows[-1] - rows[0] if len(rows) == 2 else rows[0]
    return {"out.weight": w[None, :].astype(np.float32), "out.bias": np.zeros(1, np.float32)}


def choose_runner(path: str, config, requested: str = "auto", hf_overrides: dict | None = None) -> str:
    """"pooling" or "generate": what `requested` says, else what the checkpoint says (an encoder,
    a *ForSequenceClassification head, a sentence-transformers directory, an embedding model)."""
    if requested not in RUNNERS:
        raise ValueError(f"runner {requested!r}: expected one of {', '.join(RUNNERS)}")
    if requested != "auto":
        return requested
    archs = (hf_overrides or {}).get("architectures") or [config.architecture]
    if (not config.causal or any(a.endswith(("ForSequenceClassification", "Model")) for a in archs)
            or sentence_transformers_modules(path)):
        return "pooling"
    return "generate"




def pooler_config_for(loaded, overrides=None) -> PoolerConfig:
    return pooler_config(loaded.source, loaded.config, overrides)


@dataclass
class PoolingSpec:
    """What finishes a pooling model's rows, known once it is loaded: its pooler, its
    classifier head (float32 arrays: "dense.weight/bias" [E, E] optional, "out.weight" [L, E],
    "out.bias" [L]; {} for an embedder), its config and its input limit. Small and picklable:
    a data-parallel replica sends it to the front end."""
    pooler: PoolerConfig
    config: Any                      # the model's config (dim, vocab_size, type_vocab_size, ...)
    max_model_len: int
    head: dict = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        return len(self.head.get("out.bias", ()))

    def classify(self, pooled: np.ndarray) -> np.ndarray:
        """The classifier head over pooled rows [S, E] -> logits [S, L]: a cross-encoder's
        dense + tanh then out, or (a reranker scored from two tokens) out alone."""
        if not self.head:
            raise PoolingInputError(f"{self.config.architecture} has no classifier head: it embeds, it does not score")
        h = pooled
        if "dense.weight" in self.head:
            h = np.tanh(h @ self.head["dense.weight"].T + self.head["dense.bias"])
        return h @ self.head["out.weight"].T + self.head["out.bias"]


def pooling_spec(loaded, pooler_config=None, hf_overrides=None, max_model_len: int | None = None):
    """(loaded, its PoolingSpec): the pooler from the checkpoint and --pooler-config, the head
    (hf_overrides' classifier_from_token: {"architectures": [...ForSequenceClassification],
    "classifier_from_token": ["no", "yes"]} scores a decoder from two tokens' logits), and
    loaded's max_model_len cut to sentence-transformers' max_seq_length unless max_model_len
    was given."""
    hf_overrides = parse_overrides(hf_overrides)
    cfg = loaded.config
    pooler = pooler_config if isinstance(pooler_config, PoolerConfig) else pooler_config_for(loaded, pooler_config)
    limit = min(loaded.max_model_len, pooler.max_seq_length or loaded.max_model_len)
    if max_model_len is None and limit != loaded.max_model_len:
        loaded = replace(loaded, max_model_len=limit)
    head = bert.head_tensors(loaded.source, cfg.architecture, cfg.dim) if os.path.isdir(loaded.source) else {}
    if hf_overrides.get("classifier_from_token"):
        if not os.path.isdir(loaded.source):
            raise ValueError("classifier_from_token needs a Hugging Face directory (its LM head rows)")
        head = token_head(loaded.source, cfg, loaded.tokenizer, hf_overrides["classifier_from_token"])
        if pooler_config is None:
            pooler = replace(pooler, pooling_type="LAST", normalize=False)
    return loaded, PoolingSpec(pooler, cfg, loaded.max_model_len, head)


def finish_embedding(vec: np.ndarray, pooler: PoolerConfig, dimensions: int | None = None,
                     normalize: bool | None = None) -> np.ndarray:
    """Matryoshka truncation to `dimensions`, then L2 normalization (as vLLM orders them)."""
    if dimensions is not None:
        vec = vec[:dimensions]
    if pooler.normalize if normalize is None else normalize:
        vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
    return vec


def check_dimensions(dimensions, pooler: PoolerConfig, dim: int, model: str) -> int | None:
    """The requested Matryoshka width, or a PoolingInputError naming why it cannot be given."""
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise PoolingInputError(f"dimensions must be an integer, got {dimensions!r}")
    if not pooler.is_matryoshka:
        raise PoolingInputError(f"model {model!r} does not support Matryoshka representation: "
                                "'dimensions' cannot be changed")
    if pooler.matryoshka_dimensions and dimensions not in pooler.matryoshka_dimensions:
        raise PoolingInputError(f"dimensions {dimensions} is not one of the model's {list(pooler.matryoshka_dimensions)}")
    if not 1 <= dimensions <= dim:
        raise PoolingInputError(f"dimensions {dimensions} must be within 1..{dim}")
    return dimensions


def scores_from_logits(logits: np.ndarray, activation: bool = True) -> np.ndarray:
    """[S, L] -> [S] scores (one label: sigmoid) or [S, L] probabilities (softmax)."""
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0])) if activation else logits[:, 0]
    if not activation:
        return logits
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def parse_overrides(value) -> dict:
    """--hf-overrides: a dict, JSON text or None -> dict."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"hf_overrides must be a JSON object, got {type(value).__name__}")
    return value


def runner_for_model(model: str | None, requested: str = "auto", hf_overrides=None) -> str:
    """The runner of model argument `model` (loader.resolve_model's forms): `requested`, or
    what the checkpoint's config says under "auto"."""
    if requested not in RUNNERS:
        raise ValueError(f"runner {requested!r}: expected one of {', '.join(RUNNERS)}")
    if requested != "auto":
        return requested
    path = resolve_model(model)
    if os.path.isdir(path):
        config, _ = arch.read_config(path)
        return choose_runner(path, config, hf_overrides=parse_overrides(hf_overrides))
    return "pooling" if gguf_arch(path) in ("bert", "nomic-bert") else "generate"


def check_parallel(tensor_parallel_size: int, model: str | None) -> None:
    """Tensor parallelism is refused for pooling models, by name and with what to do instead."""
    if tensor_parallel_size and tensor_parallel_size > 1:
        raise ValueError(
            f"--tensor-parallel-size {tensor_parallel_size}: tensor parallelism is not supported for pooling "
            f"models ({model or 'this model'} runs the 'pooling' runner, whose model runs whole in one process). "
            "An embedding or reranking model fits one NUMA node: drop --tensor-parallel-size, and use "
            "--data-parallel-size N for N replicas (serve) when one is not enough")


def gguf_arch(path: str) -> str | None:
    """general.architecture of a GGUF file (None for anything else)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                return None
    except OSError:
        return None
    f = GGUFFile(path)
    try:
        return f.metadata.get("general.architecture")
    finally:
        f.close()
