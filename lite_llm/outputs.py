"""What the engine hands back: vLLM's RequestOutput / CompletionOutput shapes.

The engine produces DELTAS only (one output mode for the server and the offline API): each
RequestOutput holds, per completion index, only the token ids, text and logprobs produced
since the previous one for that index; `finished` is True on the last. fold() turns a
request's deltas into the whole (cumulative) output LLM.generate returns.

A pooling request's one output is a PoolingRequestOutput (vLLM's names below): its pooled
row as the engine made it (PoolingOutput); LLM.embed / classify / score hand back the same
type holding an EmbeddingOutput, ClassificationOutput or ScoringOutput.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None          # 1 = most likely token
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token: token id -> Logprob
    finish_reason: str | None = None   # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0         # prompt tokens served from the prefix cache
    # per prompt token (None for the first): token id -> Logprob, when prompt_logprobs was asked;
    # in one delta only (the first after the prompt is done)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


def fold(deltas: Iterable[RequestOutput]) -> RequestOutput:
    """One request's delta RequestOutputs, in order, folded into its cumulative output."""
    final: RequestOutput | None = None
    by_index: dict[int, CompletionOutput] = {}
    texts: dict[int, list[str]] = {}
    for delta in deltas:
        if final is None:
            final = RequestOutput(delta.request_id, delta.prompt, delta.prompt_token_ids, [])
        for out in delta.outputs:
            acc = by_index.get(out.index)
            if acc is None:
                acc = by_index[out.index] = CompletionOutput(
                    out.index, "", [], None, [] if out.logprobs is not None else None)
                texts[out.index] = []
            texts[out.index].append(out.text)
            acc.token_ids.extend(out.token_ids)
            if out.logprobs is not None:
                if acc.logprobs is None:
                    acc.logprobs = []
                acc.logprobs.extend(out.logprobs)
            acc.cumulative_logprob = out.cumulative_logprob
            acc.finish_reason, acc.stop_reason = out.finish_reason, out.stop_reason
        final.finished, final.metrics = delta.finished, delta.metrics
        final.num_cached_tokens = delta.num_cached_tokens
        if delta.prompt_logprobs is not None:
            final.prompt_logprobs = delta.prompt_logprobs
    if final is None:
        raise RuntimeError("the engine ended the request without any output")
    for index, acc in by_index.items():
        acc.text = "".join(texts[index])
    final.outputs = [by_index[i] for i in sorted(by_index)]
    return final


# ---- pooling (vLLM's names) ---------------------------------------------------------------


@dataclass
class PoolingOutput:
    data: Any                        # [E] float32 numpy array: the pooled row, before any head


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: Any                     # PoolingOutput from the engine; Embedding/Classification/ScoringOutput
    finished: bool = True
