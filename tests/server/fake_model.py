"""The server tests' engine: the product's AsyncEngine over an LLMEngine whose runner is a fake model.

Everything a client can observe of generation (n, max_tokens, min_tokens, stop strings and
their holdback, stop_token_ids, EOS, logprobs, abort, the waiting-queue limit, stats and
/metrics) comes from the real engine code; only the model is fake. ServerRunner is
tests/engine/fake_runner.py's FakeRunner (the real InputBatch, KV bookkeeping checked every
step) with three changes a server needs:

- tokens come from `vocab`, the tokenizer's ids that decode to clean printable text on their
  own, so texts stay readable and exact: at temperature 0 `hashed_token(all token ids so far,
  None, vocab)`, otherwise the same with the request's seed (the engine draws one when the
  request gives none); bans (min_tokens) and structured-output masks the sampler would apply
  are honoured by leaving those tokens out;
- logprobs=k gives the sampled token (rank 1) and k top entries, as the real sampler does;
- `step_seconds` of sleep in each execute(), so requests stay in flight long enough to be
  aborted, queued or counted.

ScriptedRunner answers the tokens of a fixed text instead (one a step, from its start again
when it runs out); GuidedScriptedRunner does too where a request's grammar allows the script's
token, and otherwise what ServerRunner would choose under the grammar (so a script can try
what a grammar must refuse). Deliberately not here: penalties, top_p/top_k, logit_bias, prompt logprobs
(nothing the fake model's tokens would show).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from lite_llm.engine.async_engine import AsyncEngine
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.input_batch import I_BAN_END, I_BAN_START
from lite_llm.engine.request import SampleResult
from tests.engine.fake_runner import FakeRunner, next_token

BLOCK_SIZE = 16


def clean_vocab(tokenizer: Any) -> list[int]:
    """Ids that decode, alone, to printable text without replacement characters (no special
    tokens): any sequence of them decodes to the concatenation of their texts."""
    specials = getattr(tokenizer, "all_special_ids", set())
    return [i for i in range(tokenizer.vocab_size) if i not in specials
            and (t := tokenizer.decode([i])) and t.isprintable() and "\ufffd" not in t]


def hashed_token(token_ids: list[int], seed: int | None, vocab: list[int]) -> int:
    """ServerRunner's next token after token_ids (prompt + output so far), from vocab."""
    return vocab[next_token(token_ids, seed, len(vocab))]


def hashed_completion(prompt_token_ids: list[int], num_tokens: int, vocab: list[int],
                      seed: int | None = None) -> list[int]:
    """The num_tokens tokens ServerRunner generates for a prompt when nothing stops it."""
    ids = list(prompt_token_ids)
    for _ in range(num_tokens):
        ids.append(hashed_token(ids, seed, vocab))
    return ids[len(prompt_token_ids):]


class ServerRunner(FakeRunner):
    def __init__(self, tokenizer: Any, num_blocks: int, block_size: int, *, step_seconds: float = 0.0,
                 **kwargs: Any):
        super().__init__(num_blocks, block_size, tokenizer.vocab_size, **kwargs)
        self.tokenizer = tokenizer
        self.vocab = clean_vocab(tokenizer)
        self.step_seconds = step_seconds
        self._masks = None

    def execute(self, sched_out, masks=None):
        if self.step_seconds:
            time.sleep(self.step_seconds)
        self._masks = masks.wait() if masks is not None else None
        return super().execute(sched_out)

    def allowed(self, row: int) -> list[int]:
        """The vocabulary less what the sampler would mask out for sampling row `row`: its
        banned ids (min_tokens) and, under a grammar, every id its bitmask row clears (then
        any id the grammar allows, special ones too, when no clean one is left)."""
        _, ip, _, banned = self.last_sampling
        ban = set(banned[ip[row, I_BAN_START]:ip[row, I_BAN_END]].tolist())
        vocab = [t for t in self.vocab if t not in ban]
        if self._masks is not None and self._masks[1][row] >= 0:
            bitmask, mask_rows = self._masks
            words = bitmask[mask_rows[row]].view(np.uint32)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:self.vocab_size]
            grammar = set(np.flatnonzero(bits).tolist())
            vocab = [t for t in vocab if t in grammar] or sorted(grammar - ban)
        return vocab

    def choose(self, request, tokens: list[int], row: int) -> int:
        params = request.sampling_params
        return hashed_token(tokens, None if params.temperature == 0 else request.seed, self.allowed(row))

    def sample(self, request, tokens: list[int], row: int) -> SampleResult:
        token = self.choose(request, tokens, row)
        k = request.sampling_params.logprobs
        if k is None:
            return SampleResult(token)
        pos = len(tokens)
        logprob = -0.25 - 0.001 * pos
        top = [(token, logprob)]
        for j in range(1, len(self.vocab)):
            if len(top) >= k:
                break
            other = self.vocab[(token + 7919 * j) % len(self.vocab)]
            if all(other != t for t, _ in top):
                top.append((other, -1.0 * (len(top) + 1) - 0.001 * pos))
        return SampleResult(token, logprob, top[:k], 1)


class ScriptedRunner(ServerRunner):
    """Every request answers the tokens of `script`, one a step."""
    script = "<think>I should greet.</think>Hello there!"

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any):
        super().__init__(tokenizer, *args, **kwargs)
        self.script_ids = tokenizer.encode(self.script, add_special_tokens=False)

    def choose(self, request, tokens: list[int], row: int) -> int:
        return self.script_ids[request.num_output_tokens % len(self.script_ids)]


class GuidedScriptedRunner(ScriptedRunner):
    """ScriptedRunner under a grammar: the script's token when the request's grammar allows it,
    else the hashed choice among the tokens it allows."""

    def choose(self, request, tokens: list[int], row: int) -> int:
        want = super().choose(request, tokens, row)
        if self._masks is None or self._masks[1][row] < 0:
            return want
        allowed = self.allowed(row)
        return want if want in allowed else hashed_token(tokens, None, allowed)


def fake_runner_engine(tokenizer: Any, *, runner_cls: type = ServerRunner, step_seconds: float = 0.002,
                       max_num_seqs: int = 256, max_queue: int | None = 1024, max_model_len: int = 512,
                       max_num_batched_tokens: int = 2048, num_blocks: int = 4096) -> AsyncEngine:
    """A started AsyncEngine over runner_cls; its `aborted` lists the ids of requests an abort
    finished (the engine's own outputs say which)."""
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          block_size=BLOCK_SIZE, num_blocks=num_blocks, max_model_len=max_model_len,
                          eos_token_ids=tuple(t for t in [getattr(tokenizer, "eos_token_id", None)] if t is not None),
                          vocab_size=tokenizer.vocab_size)
    runner = runner_cls(tokenizer, num_blocks, BLOCK_SIZE, step_seconds=step_seconds,
                        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len)
    engine = AsyncEngine(LLMEngine(runner, tokenizer, config), max_queue=max_queue)
    record_aborts(engine)
    engine.start()
    return engine


def record_aborts(engine: AsyncEngine) -> None:
    """engine.aborted: ids of the requests its LLMEngine finished by abort, in order."""
    engine.aborted = []
    inner = engine.engine
    abort_request = inner.abort_request

    def recording(request_ids):
        outputs = abort_request(request_ids)
        engine.aborted.extend(out.request_id for out in outputs)
        return outputs

    inner.abort_request = recording
