"""Beam search over the engine (vLLM's LLM.beam_search and the server's use_beam_search).

Design: every step forks one engine request per running beam whose prompt is the prompt plus
that beam's tokens, asking for one token and its top logprobs (vLLM's own design). Beams that
share a parent share its KV blocks through the prefix cache (block_pool.py's hashed, ref
counted full blocks); only the partly filled last block is recomputed per child. This reuses
the scheduler unchanged: beams are ordinary requests, batched with everyone else's, admitted
fairly under the caller's owner (all beams of one HTTP request are one owner, as n samples are).

Selection follows transformers' beam search (GenerationMixin._beam_search), so outputs match
`generate(num_beams=k, num_return_sequences=..., do_sample=False, length_penalty=...)`:
- each step keeps the best (1 + #eos, at least 2) x k continuations of all running beams by
  cumulative logprob; of those, the best k that did not end (EOS, or max_tokens reached) run on;
- an ending continuation among the best k becomes a finished hypothesis scored
  cumulative logprob / generated_length ** length_penalty (the length counts the generated
  tokens, the EOS included; vLLM counts the prompt too, which changes which beams win);
- at most k hypotheses are kept; the search stops when no running beam can still beat the worst
  kept one (transformers' default early_stopping=False heuristic; True: once k are kept;
  "never": with length_penalty > 0 the bound assumes max_tokens), or when every continuation ends.
Logprobs are the raw model's (log_softmax of the logits): temperature does not change them.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lite_llm.outputs import Logprob, fold
from lite_llm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


@dataclass
class BeamSearchSequence:
    """One returned beam (vLLM's shape): tokens hold the prompt and the generated ones."""
    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)   # per generated token: its own
    cum_logprob: float = 0.0
    text: str | None = None            # the whole sequence's text (prompt included), as vLLM
    finish_reason: str | None = None   # "stop" (an EOS) or "length"
    stop_reason: int | None = None     # the EOS id that ended it
    score: float = 0.0                 # cum_logprob / generated_length ** length_penalty
    num_prompt_tokens: int = 0

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


@dataclass
class _Beam:
    tokens: list[int]                  # generated only
    cum: float
    logprobs: list[float]


class _Instance:
    """One prompt's search state."""

    def __init__(self, prompt: list[int], max_new: int):
        self.prompt = prompt
        self.max_new = max_new
        self.running = [_Beam([], 0.0, [])]
        self.finished: list[tuple[float, _Beam]] = []    # (score, beam), best first, at most k
        self.improvable = True
        self.done = False


# step(contexts, top) -> for each context, its top (token id, logprob) pairs, best first
StepFn = Callable[[list[list[int]], int], list[list[tuple[int, float]]]]


def search(step: StepFn, prompts: Sequence[list[int]], params: BeamSearchParams, eos_token_ids: Sequence[int],
           max_model_len: int) -> list[list[tuple[float, _Beam, str]]]:
    """For each prompt, its finished hypotheses best first: (score, beam, finish reason)."""
    k, lp = params.beam_width, float(params.length_penalty)
    eos = frozenset() if params.ignore_eos else frozenset(int(e) for e in eos_token_ids)
    keep = max(2, 1 + len(eos)) * k
    insts = [_Instance(list(p), min(params.max_tokens, max_model_len - len(p))) for p in prompts]
    for inst in insts:
        if inst.max_new < 1:
            raise ValueError(f"the prompt has {len(inst.prompt)} tokens, which leaves no room in the "
                             f"maximum model length of {max_model_len}")
    gen_len = 0
    while True:
        live = [inst for inst in insts if not inst.done]
        if not live:
            break
        contexts = [inst.prompt + b.tokens for inst in live for b in inst.running]
        tops = iter(step(contexts, keep))
        gen_len += 1
        for inst in live:
            cands = []      # (cumulative, beam index, token, logprob)
            for bi, beam in enumerate(inst.running):
                for tok, tlp in next(tops)[:keep]:
                    cands.append((beam.cum + tlp, bi, tok, tlp))
            cands.sort(key=lambda c: (-c[0], c[1], c[2]))
            cands = cands[:keep]
            hits = [c[2] in eos or gen_len >= inst.max_new for c in cands]

            def child(c):
                parent = inst.running[c[1]]
                return _Beam(parent.tokens + [c[2]], c[0], parent.logprobs + [c[3]])
            full = params.early_stopping is True and len(inst.finished) == k
            if inst.improvable and not full:
                new = [(c[0] / gen_len ** lp, child(c)) for c, hit in zip(cands[:k], hits[:k]) if hit]
                if new:   # stable: of equal scores, the older hypothesis stays first
                    inst.finished = sorted(inst.finished + new, key=lambda f: -f[0])[:k]
            inst.running = [child(c) for c, hit in zip(cands, hits) if not hit][:k]
            if inst.running and len(inst.finished) == k:
                best_len = inst.max_new if params.early_stopping == "never" and lp > 0 else gen_len
                best_possible = inst.running[0].cum / best_len ** lp
                inst.improvable = inst.improvable and best_possible > inst.finished[-1][0]
            inst.done = (not inst.improvable or all(hits) or not inst.running
                         or (params.early_stopping is True and len(inst.finished) == k))
    return [[(score, beam, "stop" if beam.tokens and beam.tokens[-1] in eos else "length")
             for score, beam in inst.finished] for inst in insts]


def engine_step(engine: Any, owner: str | None = None,
                on_submit: Callable[[list[str]], None] | None = None, lora_request: Any = None) -> StepFn:
    """A StepFn on an AsyncEngine (or anything with its add_request / abort): one request of one
    token per context, all submitted before any is awaited, so they batch in the same steps.
    on_submit(ids) is told each step's engine request ids (a caller that may abort them);
    lora_request: the adapter every beam runs with (None: the base model)."""
    extra = {} if lora_request is None else {"lora_request": lora_request}
    def step(contexts: list[list[int]], top: int) -> list[list[tuple[int, float]]]:
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY, logprobs=0)
        params.logprobs = top        # may exceed the API's cap of 20: set past validation on purpose
        submitted: list[tuple[str, Any]] = []
        try:
            for ctx in contexts:
                rid = f"beam-{uuid.uuid4().hex}"
                submitted.append((rid, engine.add_request(rid, ctx, params, owner=owner, **extra)))
            if on_submit is not None:
                on_submit([rid for rid, _ in submitted])
            results = []
            for _, stream in submitted:
                out = fold(stream).outputs[0]
                if out.finish_reason == "abort" or not out.logprobs:
                    raise BeamSearchAborted("the engine aborted a beam")
                entries = sorted(out.logprobs[0].items(), key=lambda e: -e[1].logprob)
                results.append([(int(t), float(e.logprob)) for t, e in entries[:top]])
            submitted = []
            return results
        finally:
            for rid, _ in submitted:       # left unfinished: an error or an abort
                engine.abort(rid)
    return step


class BeamSearchAborted(RuntimeError):
    """A beam's engine request ended without its token (aborted: shutdown, client gone)."""


def finish_text(tokenizer: Any, beam: _Beam, reason: str, include_stop_str: bool) -> str:
    """The generated text of a beam: without its EOS unless include_stop_str_in_output."""
    if tokenizer is None:
        return ""
    ids = beam.tokens if include_stop_str or reason != "stop" else beam.tokens[:-1]
    return tokenizer.decode(ids, skip_special_tokens=not include_stop_str)


def to_outputs(found: list[list[tuple[float, _Beam, str]]], prompts: Sequence[list[int]], tokenizer: Any,
               num_return: int | None = None) -> list[BeamSearchOutput]:
    """search()'s hypotheses as vLLM's BeamSearchOutputs, each sequence's text the whole of it."""
    outs = []
    for prompt, hyps in zip(prompts, found):
        seqs = []
        for score, beam, reason in hyps[:num_return]:
            tokens = list(prompt) + beam.tokens
            text = tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None
            seqs.append(BeamSearchSequence(
                tokens=tokens, logprobs=[{t: Logprob(v)} for t, v in zip(beam.tokens, beam.logprobs)],
                cum_logprob=beam.cum, text=text, finish_reason=reason,
                stop_reason=beam.tokens[-1] if reason == "stop" else None, score=score,
                num_prompt_tokens=len(prompt)))
        outs.append(BeamSearchOutput(seqs))
    return outs
