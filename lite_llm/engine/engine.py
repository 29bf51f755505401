"""LLMEngine: the synchronous step loop (schedule -> runner -> update -> outputs).

The engine turns user requests into scheduler Requests (n > 1 fans out into n of them),
runs one scheduler step per step() through the model runner, detokenizes new tokens,
applies stop strings, and builds vLLM-shaped delta RequestOutputs (outputs.fold adds them
up). It is not thread-safe: one thread owns it (async_engine.py runs it on its engine
thread, for the server and LLM.generate alike). The model math lives in runner.py; KV block
bookkeeping in kv_cache.py; every figure /metrics shows in stats.py.

Runner protocol (Runner below; runner_output.py):
    runner.execute(sched_out: SchedulerOutput[, masks]) -> RunnerOutput
        its sampled list aligned with sched_out.chunks; None where chunk.sample is False.
        masks, passed only when some sampling row of the step follows a grammar, is
        structured.MaskJob: its wait() gives the bitmask the sampler applies. Every
        SchedulerOutput that has chunks reaches the runner in order, through execute() or,
        for the steady steps after one the runner repeated, runner.steady_decode.run(chunks)
        (_step.SteadyStep): its chunks and removed ids are deltas to the runner's persistent
        batch (see scheduler.py, input_batch.py).
        Within one step a chunk may read KV slots another chunk of the same step writes
        (prefix-cache hit on a block published this step), so all new KV of a layer is
        written before that layer's attention reads any. The step's Python time is its wall
        time minus the output's kernel_seconds.

Every step takes the same path (schedule -> execute -> update -> outputs). Its per-sequence
parts are compiled (_step.pyx: the scheduler's decode chunks, the update and detokenizing, the
outputs), with the Python code beside them as their reference (batched_decode = False); a
steady decode batch's steps run the scheduler's, the runner's and the engine's compiled parts
from one compiled call (_step.SteadyStep; compiled_steady = False: through the frames).

Pooling requests (a pooling model's engine, EngineConfig.pooling; add_request with
PoolingParams): a Request of the same Scheduler that takes its whole prompt in one step (never
split), generates nothing, and finishes when that step ends, its blocks freed; the runner's
RunnerOutput.pooled holds its row, which leaves as a PoolingRequestOutput.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from lite_llm.engine import _step
from lite_llm.engine.detokenizer import find_stop, make_detokenizer, stop_holdback
from lite_llm.engine.kv_cache import KVCacheManager
from lite_llm.engine.request import Request, RequestStatus, SampleResult
from lite_llm.engine.runner_output import PromptLogprobs, RunnerOutput
from lite_llm.engine.scheduler import Scheduler, SchedulerOutput
from lite_llm.engine.stats import EngineStats, FinishedRequestRecord, StatsCollector, StepRecord
from lite_llm.engine.structured import Grammars, StructuredOutputs
from lite_llm.multimodal import check_images_fit
from lite_llm.outputs import CompletionOutput, Logprob, PoolingOutput, PoolingRequestOutput, RequestMetrics, RequestOutput
from lite_llm.sampling_params import PoolingParams, RequestOutputKind, SamplingParams

_MAX_SEED = 2**63 - 1
_NO_OUTPUT = RunnerOutput([])    # a step without chunks runs nothing (never changed)
# what a pooling request's Request carries as its sampling parameters: it samples nothing
_POOLING_SAMPLING = SamplingParams(max_tokens=1, detokenize=False)


class Runner(Protocol):
    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput: ...

    # after a steady step (SchedulerOutput.steady) the runner repeated as one compiled call: that
    # call's object, whose run(chunks) gives what execute() would for the next steady steps (the
    # engine's SteadyStep calls it); None after any other step, or always for a runner without one
    steady_decode: Any


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048       # token budget per step (chunked prefill splits prompts)
    block_size: int = 16                     # tokens per KV block
    num_blocks: int = 1024                   # KV blocks the runner allocates
    enable_prefix_caching: bool = True
    max_model_len: int = 2048                # prompt + output tokens per sequence
    seed: int = 0                            # draws the seed of requests that give none
    eos_token_ids: tuple[int, ...] = ()
    scheduling_policy: str = "fcfs"          # "fcfs" | "priority" (lower value first)
    vocab_size: int | None = None            # the model's (logits width); None: the tokenizer's
    overlap_grammar_masks: bool = True       # structured outputs' masks computed during forward()
    num_lookahead_tokens: int = 0            # KV slots a draft model writes past each sampling chunk
    pooling: bool = False                    # a pooling model's engine: every request pools, none generates

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks",
                     "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', "
                             f"got {self.scheduling_policy!r}")

    @property
    def effective_max_model_len(self) -> int:
        """max_model_len capped by the KV cache: one sequence alone always fits."""
        return min(self.max_model_len, self.num_blocks * self.block_size)


class _Completion:
    """Text state of one child request: detokenizer, its text so far, what was streamed.

    The text is never held as one growing string (appending to one copies it: O(n) per token):
    what is not streamed yet is a list of pieces, joined when an output takes it, and the stop
    strings are searched in the new characters plus the few before them that a stop string
    could start in (tail)."""
    __slots__ = ("request", "detokenizer", "stop_strings", "num_chars", "pending", "_keep", "_tail",
                 "num_sent_tokens", "num_sent_chars", "sent_finished")

    def __init__(self, request: Request, tokenizer: Any):
        params = request.sampling_params
        self.request = request
        self.detokenizer = None
        if tokenizer is not None and params.detokenize:
            self.detokenizer = make_detokenizer(tokenizer, request.prompt_token_ids,
                                                params.skip_special_tokens)
        # a stop string may be arriving: keep its possible beginning out of streamed text
        self.stop_strings = params.stop if not params.include_stop_str_in_output else []
        self.num_chars = 0                 # length of the text
        self.pending: list[str] = []      # text[num_sent_chars:], in pieces
        # the text's last characters a stop string can begin in (its longest, less one)
        self._keep = max((len(s) for s in params.stop), default=1) - 1 if params.stop else 0
        self._tail = ""
        self.num_sent_tokens = 0
        self.num_sent_chars = 0
        self.sent_finished = False

    def add_text(self, new_text: str) -> str:
        """Append new_text; returns the window a newly completed stop string lies in: the
        tail before it, then new_text (it starts at num_chars - len(window))."""
        self.pending.append(new_text)
        self.num_chars += len(new_text)
        window = self._tail + new_text if self._keep else new_text
        if self._keep:
            self._tail = window[-self._keep:]
        return window

    def truncate(self, length: int) -> None:
        """Cut the text to its first length characters (a stop string ends it; never before
        what was streamed, which holdback kept short of any stop string)."""
        assert length >= self.num_sent_chars, "a stop string began in text already streamed"
        text = "".join(self.pending)[:length - self.num_sent_chars]
        self.pending = [text] if text else []
        self.num_chars = length

    def visible_chars(self) -> int:
        """How much of the text may be streamed: all of it once finished or without stop
        strings, else all but a suffix that may still become a stop string."""
        if self.request.is_finished or not self.stop_strings:
            return self.num_chars
        return max(self.num_sent_chars, self.num_chars - stop_holdback(self._tail, self.stop_strings))

    def take_text(self, end: int) -> str:
        """text[num_sent_chars:end], now streamed."""
        num = end - self.num_sent_chars
        if num <= 0:
            return ""
        pending = self.pending
        text = pending[0] if len(pending) == 1 else "".join(pending)
        self.pending = [text[num:]] if num < len(text) else []
        self.num_sent_chars = end
        return text[:num] if num < len(text) else text


class _Group:
    """A user request: its n child Requests and their completions."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 children: list[Request], tokenizer: Any):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.children = children
        self.completions = [_Completion(child, tokenizer) for child in children]
        self.sent_prompt_logprobs = False     # prompt_logprobs go out once, in one delta
        # FINAL_ONLY: no output until the request finishes, then one delta holding it all
        self.final_only = children[0].sampling_params.output_kind is RequestOutputKind.FINAL_ONLY

    @property
    def is_finished(self) -> bool:
        children = self.children
        if len(children) == 1:
            return children[0].is_finished
        return all(child.is_finished for child in children)


def check_request(prompt_token_ids: list[int], sampling_params: SamplingParams, max_model_len: int,
                  max_num_seqs: int, grammars) -> None:
    """ValueError if a request can never run on an engine of these limits (an LLMEngine, or the
    data-parallel front end before it picks a replica); grammars compiles (and caches) a
    structured-output grammar, so a bad one fails here."""
    if not prompt_token_ids:
        raise ValueError("the prompt is empty: at least one token is needed")
    if len(prompt_token_ids) > max_model_len:
        raise ValueError(f"the prompt has {len(prompt_token_ids)} tokens, more than the "
                         f"maximum model length of {max_model_len}")
    if sampling_params.n > max_num_seqs:
        raise ValueError(f"n={sampling_params.n} is more than max_num_seqs={max_num_seqs}")
    if sampling_params.structured_outputs is not None:
        grammars.template(sampling_params.structured_outputs)


def check_kind(params, pooling: bool) -> None:
    """ValueError unless params fit the engine: PoolingParams for a pooling model's, else
    SamplingParams."""
    if pooling and not isinstance(params, PoolingParams):
        raise ValueError("this model runs the 'pooling' runner: it embeds, classifies and scores; it cannot generate")
    if not pooling and isinstance(params, PoolingParams):
        raise ValueError("this model runs the 'generate' runner: it cannot embed, classify or score")


def check_pooling_request(prompt_token_ids: list[int], params: PoolingParams, max_model_len: int,
                          vocab_size: int | None) -> None:
    """ValueError if a pooling request can never run (an LLMEngine's, or the data-parallel front
    end's check before it picks a replica)."""
    n = len(prompt_token_ids)
    if not 0 < n <= max_model_len:
        raise ValueError(f"an input of {n} tokens: the model takes 1 to {max_model_len}")
    if vocab_size and (min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size):
        bad = next(t for t in prompt_token_ids if not 0 <= t < vocab_size)
        raise ValueError(f"the prompt holds token id {bad}, outside the model's vocabulary [0, {vocab_size})")
    types = params.token_type_ids
    if types is not None and len(types) != n:
        raise ValueError(f"token_type_ids has {len(types)} entries for {n} prompt tokens")


class LLMEngine:
    # a step without drafts or grammars runs update_from_output + process_plain, its outputs and
    # its record as one compiled call (_step.finish_plain: plain_step, make_outputs, the stats),
    # and every other step's outputs come from _step.make_outputs; False runs the Python
    # references (the tests compare the two)
    batched_decode = True
    # a steady decode batch's step (the scheduler's steady schedule, the runner's repeated step,
    # finish_plain) as one compiled call, _step.SteadyStep; False runs it through schedule(),
    # execute() and finish_plain as any other step (the tests compare the two)
    compiled_steady = True

    def __init__(self, runner: Runner | None, tokenizer: Any, config: EngineConfig, vision=None):
        """runner: None when it is attached later (attach_runner); vision: see attach_runner."""
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = config.effective_max_model_len
        self.kv_cache_manager = KVCacheManager(config.num_blocks, config.block_size,
                                               config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv_cache_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len,
                                   policy=config.scheduling_policy,
                                   num_lookahead_tokens=config.num_lookahead_tokens)
        self.attach_runner(runner, vision)
        self._rng = random.Random(config.seed)   # not numpy.random: its import costs ~6 MiB resident
        vocab_size = config.vocab_size or getattr(tokenizer, "vocab_size", 0)
        self.grammars = Grammars(tokenizer, vocab_size, config.eos_token_ids)   # thread-safe
        self.structured = StructuredOutputs(self.grammars, overlap=config.overlap_grammar_masks)
        self._groups: dict[str, _Group] = {}
        if hasattr(tokenizer, "byte_table"):
            tokenizer.byte_table()     # built once now, not in the first request's time to first token
        self._stats = StatsCollector()
        self._stopped_in_step: set[str] = set()   # finished by a stop string before its last token
        self.lora = None     # lora.LoRAManager when adapters are enabled (llm.build_engine)
        self.step_seqs: list = []    # the latest plain step's sequence records (_step.plain_step)
        self.step_simple = False     # each of them its group's only plain child, sampling

    def attach_runner(self, runner: Runner | None, vision=None) -> None:
        """The runner steps run on (an engine assembled on its engine thread gets it here, after
        it is built). vision: the runner's image encoder (multimodal), whose cache of encoded
        images the scheduler reads: an image it holds costs a request no encoder budget."""
        self.runner = runner
        self._steady_step = None     # _step.SteadyStep while the batch is steady
        self._steady_runs = 0        # steps the SteadySteps before it ran
        self.scheduler.encoder_cache = vision.cache if vision is not None else None
        self.kv_cache_manager.rope_switch = getattr(runner, "rope_switch", 0) or 0

    # ---- requests in ----------------------------------------------------------------------

    def validate_request(self, prompt_token_ids: list[int], sampling_params: SamplingParams, mm=None) -> None:
        """Raise ValueError if the request can never run; reads only config (thread-safe)."""
        if isinstance(sampling_params, PoolingParams) or self.config.pooling:
            check_kind(sampling_params, self.config.pooling)
            check_pooling_request(prompt_token_ids, sampling_params, self.max_model_len, self.config.vocab_size)
            return
        check_request(prompt_token_ids, sampling_params, self.max_model_len, self.config.max_num_seqs,
                      self.grammars)
        vocab = self.config.vocab_size     # the embedding table's rows: an id past them reads past it
        if vocab and (min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab):
            bad = next(t for t in prompt_token_ids if not 0 <= t < vocab)
            raise ValueError(f"the prompt holds token id {bad}, outside the model's vocabulary [0, {vocab})")
        if mm is not None:
            check_images_fit(mm, self.config.max_num_batched_tokens)

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling_params: SamplingParams, prompt: str | None = None,
                    arrival_time: float | None = None, priority: int = 0,
                    lora: tuple[int, bytes] | None = None, mm=None, owner: str | None = None) -> None:
        """Queue a request. arrival_time is time.monotonic() based (now if None). lora: the
        (slot, salt) of its adapter from self.lora.acquire(): each sequence takes a reference
        of its own, given back when it finishes. mm: the prompt's images (multimodal.MMPrompt),
        its placeholders already expanded in the ids. owner: whom the scheduler shares slots
        between (fair admission, scheduler.py), e.g. the HTTP request of several prompts;
        None: this request."""
        if request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate_request(prompt_token_ids, sampling_params, mm)
        if isinstance(sampling_params, PoolingParams):
            self._add_pooling(request_id, prompt_token_ids, sampling_params, prompt, arrival_time, priority, owner)
            return
        params = sampling_params.clone()     # later edits by the caller must not reach us
        n = params.n
        child_ids = [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]
        for child_id in child_ids:
            if child_id in self.scheduler.requests:
                raise ValueError(f"request id {child_id!r} is already in use")
        base_seed = params.seed if params.seed is not None else self._rng.randrange(_MAX_SEED)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        prompt_token_ids = list(prompt_token_ids)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len
        children = [Request(child_id, prompt_token_ids, params, base_seed + i, prompt=prompt,
                            arrival_time=arrival, priority=priority,
                            eos_token_ids=self.config.eos_token_ids, max_tokens=max_tokens,
                            parent_id=request_id, index=i, owner=owner)
                    for i, child_id in enumerate(child_ids)]
        for child in children:
            child.mm = mm
            self.structured.add(child)
            if lora is not None:
                child.lora_slot, child.lora_salt = lora
                self.lora.retain(child.lora_slot)
        self._groups[request_id] = _Group(request_id, prompt, prompt_token_ids, children,
                                          self.tokenizer)
        for child in children:
            self.scheduler.add_request(child)

    def _add_pooling(self, request_id: str, prompt_token_ids: list[int], params: PoolingParams,
                     prompt: str | None, arrival_time: float | None, priority: int, owner: str | None) -> None:
        """A pooling request: one Request that computes its prompt and nothing more."""
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, prompt_token_ids, _POOLING_SAMPLING, 0, prompt=prompt,
                          arrival_time=time.monotonic() if arrival_time is None else arrival_time,
                          priority=priority, max_tokens=0, owner=owner)
        request.pooling = params
        self._groups[request_id] = _Group(request_id, prompt, request.prompt_token_ids, [request], None)
        self.scheduler.add_request(request)

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Finish requests with "abort" now (blocks freed at once); returns their last delta
        outputs. Unknown or already finished ids are ignored."""
        outputs = []
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            group = self._groups.get(rid)
            if group is None:
                continue
            live = [c.request_id for c in group.children if not c.is_finished]
            for request in self.scheduler.finish_requests(live, RequestStatus.FINISHED_ABORTED):
                self._record_finished(request)
            outputs.append(self.make_output(group))
            del self._groups[rid]
        return outputs

    # ---- one step -------------------------------------------------------------------------

    def step(self, lazy: bool = False) -> list[RequestOutput]:
        """Run one scheduler step. Returns an output for each request that got tokens or
        finished, holding only what is new since its previous output (outputs.fold adds
        a request's deltas up). lazy: the output of a request of one plain sequence may be a
        _step.PendingOutput, whose materialize() gives its RequestOutput (AsyncEngine passes
        True: its readers build them, off the engine thread)."""
        steady = self._steady_step
        if steady is not None:
            # a steady decode batch: schedule, execute and the plain step's end in one compiled
            # call; None when the scheduler's step is not steady (the path below continues it)
            outputs = steady.run(lazy)
            if outputs is not None:
                return outputs
            self._steady_runs += steady.num_steps
            self._steady_step = None
        start = time.perf_counter()
        touched: dict[str, _Group] = {}
        sched_out = self.scheduler.schedule()
        if sched_out.aborted:
            for request in sched_out.aborted:
                self._record_finished(request)
                touched[request.parent_id] = self._groups[request.parent_id]
        ran = _NO_OUTPUT
        matchers = self.structured.matchers
        if sched_out.chunks:
            masks = self.structured.start_step(sched_out) if matchers else None
            ran = self.runner.execute(sched_out, masks) if masks is not None else self.runner.execute(sched_out)
            if ran.pooled is not None:
                return self._finish_pooled(sched_out, ran, start, touched)
            if ran.prompt_logprobs:
                for entry in ran.prompt_logprobs:
                    self._add_prompt_logprobs(entry)
        results = ran.sampled
        now = time.monotonic()
        spec_ids = ran.spec_token_ids
        if spec_ids is not None:
            self._record_drafts(sched_out, results)
        if spec_ids is None and not matchers and self.batched_decode:
            # no drafts, no grammar: the per-sequence work, the outputs and the step's record in
            # one compiled call (_step.finish_plain), the Python below its reference
            outputs = _step.finish_plain(self, self._stats, sched_out.chunks, results, now, touched, sched_out.steady,
                                         lazy, start, ran.kernel_seconds, ran.bytes_read, sched_out.num_tokens)
            schedule = self.scheduler.steady
            if sched_out.steady and self.compiled_steady and schedule is not None:
                decode = self.runner.steady_decode
                if decode is not None:       # the runner repeated its step: the next steps may too
                    self._steady_step = _step.SteadyStep(self, schedule, decode, self._stats)
            return outputs
        sampled = self.scheduler.update_from_output(sched_out, results, spec_ids)
        # a request may get several tokens (accepted drafts): tokens after a stop string go
        left = None
        if spec_ids is not None and any(c.spec_token_ids for c in sched_out.chunks):
            left = Counter(r.request_id for r, _ in sampled)
        if left is None and not matchers and sampled:
            self.process_plain(sampled, now, touched)
            sampled = ()
        for request, result in sampled:
            remaining = 0
            if left is not None:
                left[request.request_id] -= 1
                remaining = left[request.request_id]
                if request.request_id in self._stopped_in_step:
                    continue
            self.process_sample(request, result, now, remaining)
            if matchers and request.request_id in matchers:
                self._advance_grammar(request, result.token_id)
            group = self._groups[request.parent_id]
            if not group.final_only or request.is_finished:    # a running FINAL_ONLY one has no output
                touched[request.parent_id] = group
            if remaining and isinstance(request.stop_reason, str) and request.is_finished:
                # a stop string ended it before this step's later tokens: they are dropped
                request.truncate_outputs(remaining)
                self._stopped_in_step.add(request.request_id)
                self._record_finished(request)
        self._stopped_in_step.clear()
        if self.batched_decode:
            outputs = _step.make_outputs(touched, self, lazy)
        else:
            outputs = []
            for rid, group in touched.items():
                if group.final_only and not group.is_finished:
                    continue
                out = self.make_output(group)
                if out.finished:
                    del self._groups[rid]
                    outputs.append(out)
                elif out.outputs:
                    outputs.append(out)
        if sched_out.chunks:
            self._stats.record_step(StepRecord(len(sched_out.chunks), sched_out.num_tokens,
                                               time.perf_counter() - start - ran.kernel_seconds, ran.kernel_seconds,
                                               ran.bytes_read))
        return outputs

    def _finish_pooled(self, sched_out: SchedulerOutput, ran: RunnerOutput, start: float,
                       touched: dict[str, _Group]) -> list:
        """A pooling step's end: every request of it finished (its blocks freed) with its row."""
        now = time.monotonic()
        outputs: list = [self.make_output(group) for group in touched.values()]   # refused in schedule()
        for group in touched.values():
            self._groups.pop(group.request_id, None)
        rows = {c.request.request_id: row for c, row in zip(sched_out.chunks, ran.pooled)}
        for request in self.scheduler.finish_requests(list(rows), RequestStatus.FINISHED_STOPPED):
            row = rows[request.request_id]
            request.metrics.first_token_time = request.metrics.last_token_time = now
            self._stats.prompt_tokens_total += request.num_prompt_tokens
            self._record_finished(request)
            del self._groups[request.request_id]
            outputs.append(PoolingRequestOutput(request.request_id, request.prompt_token_ids, PoolingOutput(row)))
        self._stats.record_step(StepRecord(
            sched_out.num_seqs, sched_out.num_tokens, time.perf_counter() - start - ran.kernel_seconds,
            ran.kernel_seconds, ran.bytes_read))
        return outputs

    def process_plain(self, sampled: list, now: float, touched: dict) -> None:
        """step()'s loop over the samples when none has drafts or a grammar (the reference of
        _step.plain_step's second phase, which step() runs instead). A plain sample (one
        token, no logprobs, no stop strings, not the first token, the request still running)
        is detokenized here, its ITL counted per distinct previous token time (in a steady
        batch, one for all); any other goes through process_sample."""
        itl: dict[float, int] = {}
        groups = self._groups
        running = RequestStatus.RUNNING
        for request, result in sampled:
            metrics = request.metrics
            last = metrics.last_token_time
            group = groups[request.parent_id]
            if request.status is not running or last is None or request.logprobs is not None \
                    or request.sampling_params.stop:
                self.process_sample(request, result, now)
                if not group.final_only or request.is_finished:
                    touched[request.parent_id] = group
                continue
            itl[last] = itl.get(last, 0) + 1
            metrics.last_token_time = now
            comp = group.completions[request.index]
            if comp.detokenizer is not None:
                new_text = comp.detokenizer.add(result.token_id)
                if new_text:
                    comp.add_text(new_text)
            if not group.final_only:
                touched[request.parent_id] = group
        self._stats.add_itl(itl, now)

    def _record_drafts(self, sched_out: SchedulerOutput, results: list) -> None:
        """Speculative decoding's acceptance counts (vLLM's spec_decode_* metrics)."""
        for chunk, result in zip(sched_out.chunks, results):
            if chunk.spec_token_ids:
                self._stats.record_drafts(len(chunk.spec_token_ids), len(result) - 1)

    def process_sample(self, request: Request, result: SampleResult, now: float, remaining: int = 0) -> None:
        """One new token of request; remaining: how many of its tokens this step come after
        this one (accepted drafts), whose stops the request's status already reflects."""
        params = request.sampling_params
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self._stats.prompt_tokens_total += request.num_prompt_tokens
        else:
            self._stats.itl.observe(now - metrics.last_token_time)
        metrics.last_token_time = now
        self._stats.generation_tokens_total += 1
        token_id = result.token_id
        if request.logprobs is not None:
            request.logprobs.append(self._logprob_entry(result))
            if result.logprob is not None:
                request.cumulative_logprob += result.logprob
        comp = self._groups[request.parent_id].completions[request.index]
        status = request.status if not remaining else RequestStatus.RUNNING   # as of this token
        stopped_by_token = status == RequestStatus.FINISHED_STOPPED
        if comp.detokenizer is not None and not (stopped_by_token
                                                 and not params.include_stop_str_in_output):
            new_text = comp.detokenizer.add(token_id)
            window = comp.add_text(new_text) if new_text else ""
            # a stop string completed by the token that hit the length limit still wins
            if (params.stop and new_text and request.num_output_tokens - remaining > params.min_tokens
                    and status in (RequestStatus.RUNNING, RequestStatus.FINISHED_LENGTH)):
                match = find_stop(window, len(new_text), params.stop,
                                  params.include_stop_str_in_output)
                if match is not None:
                    stop_str, truncate_to = match
                    comp.truncate(comp.num_chars - len(window) + truncate_to)
                    request.stop_reason = stop_str
                    if request.is_finished:
                        request.status = RequestStatus.FINISHED_STOPPED
                        request.finish_reason = request.status.finish_reason
                    else:
                        self.scheduler.finish_requests(request.request_id,
                                                       RequestStatus.FINISHED_STOPPED)
                    if remaining:
                        return           # step() drops the later tokens and records the finish
        if request.is_finished and not remaining:
            self._record_finished(request)

    def _add_prompt_logprobs(self, p: PromptLogprobs) -> None:
        """Prompt tokens p.first.. p.first + n - 1 get their Logprob entries (prompt_logprobs)."""
        request, first = p.request, p.first
        have = request.prompt_logprobs
        if have is None or len(have) != first:       # a duplicate (recomputed) range: keep the first
            return
        targets = request.prompt_token_ids[first:first + len(p.logprobs)]
        for target, lp, rank, ids, lps in zip(targets, p.logprobs.tolist(), p.ranks.tolist(), p.top_ids.tolist(),
                                              p.top_logprobs.tolist()):
            have.append(self._logprob_entry(SampleResult(target, lp, list(zip(ids, lps)), rank)))

    def _advance_grammar(self, request: Request, token_id: int) -> None:
        """The request's matcher takes its new token; a grammar that has ended stops it (after
        process_sample, so the token's text is part of the output)."""
        if self.structured.accept(request.request_id, token_id) and not request.is_finished:
            self.scheduler.finish_requests(request.request_id, RequestStatus.FINISHED_STOPPED)
            if request.is_finished:
                self._record_finished(request)

    def _logprob_entry(self, result: SampleResult) -> dict[int, Logprob]:
        """token id -> Logprob for one generated token: the sampled one first, then the top ones."""
        top = result.top_logprobs or []
        rank = result.rank
        if rank is None:
            rank = next((r for r, (t, _) in enumerate(top, start=1) if t == result.token_id), None)
        logprob = result.logprob if result.logprob is not None else float("nan")
        entry = {result.token_id: Logprob(logprob, rank, self._decode_token(result.token_id))}
        for r, (token_id, lp) in enumerate(top, start=1):
            if token_id not in entry:
                entry[token_id] = Logprob(lp, r, self._decode_token(token_id))
        return entry

    def _decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # ---- outputs --------------------------------------------------------------------------

    def make_output(self, group: _Group) -> RequestOutput:
        """The group's delta: per completion, what was produced since its previous output."""
        completions = []
        for comp in group.completions:
            request = comp.request
            is_finished = request.is_finished
            end = comp.num_chars if is_finished or not comp.stop_strings else comp.visible_chars()
            num_tokens = len(request.output_token_ids)
            if num_tokens == comp.num_sent_tokens and end == comp.num_sent_chars \
                    and (comp.sent_finished or not is_finished):
                continue
            completions.append(CompletionOutput(
                request.index, comp.take_text(end),
                request.output_token_ids[comp.num_sent_tokens:], request.cumulative_logprob,
                request.logprobs[comp.num_sent_tokens:] if request.logprobs is not None else None,
                request.finish_reason, request.stop_reason))
            comp.num_sent_tokens = num_tokens
            comp.sent_finished = is_finished
        first = group.children[0]
        prompt_logprobs = None
        if first.prompt_logprobs is not None and not group.sent_prompt_logprobs \
                and len(first.prompt_logprobs) == first.num_prompt_tokens:
            prompt_logprobs, group.sent_prompt_logprobs = first.prompt_logprobs, True
        return RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, completions,
                             finished=group.is_finished, metrics=self._group_metrics(group),
                             num_cached_tokens=max(first.num_cached_tokens, 0),
                             prompt_logprobs=prompt_logprobs)

    @staticmethod
    def _group_metrics(group: _Group) -> RequestMetrics:
        if len(group.children) == 1:   # a copy: the engine thread goes on updating its own
            m = group.children[0].metrics
            return RequestMetrics(m.arrival_time, m.first_scheduled_time, m.first_token_time,
                                  m.last_token_time, m.finished_time, m.num_preemptions)
        ms = [c.metrics for c in group.children]

        def pick(values, fn):
            values = [v for v in values if v is not None]
            return fn(values) if values else None

        finished = [m.finished_time for m in ms]
        return RequestMetrics(
            arrival_time=ms[0].arrival_time,
            first_scheduled_time=pick([m.first_scheduled_time for m in ms], min),
            first_token_time=pick([m.first_token_time for m in ms], min),
            last_token_time=pick([m.last_token_time for m in ms], max),
            finished_time=max(finished) if None not in finished else None,
            num_preemptions=sum(m.num_preemptions for m in ms))

    # ---- state and stats ------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    def get_num_unfinished_requests(self) -> int:
        return len(self._groups)

    @property
    def groups(self) -> dict[str, _Group]:
        """The user requests in flight by id (the compiled step, _step.pyx, works on them)."""
        return self._groups

    @property
    def unfinished_request_ids(self) -> list[str]:
        return list(self._groups)

    def _record_finished(self, request: Request) -> None:
        self.structured.remove(request.request_id)
        if request.lora_slot >= 0:
            self.lora.release(request.lora_slot)
            request.lora_slot = -1
        m = request.metrics
        finished = m.finished_time if m.finished_time is not None else time.monotonic()
        tpot = None
        if m.first_token_time is not None and request.num_output_tokens > 1:
            tpot = (m.last_token_time - m.first_token_time) / (request.num_output_tokens - 1)
        self._stats.record_finished(FinishedRequestRecord(
            request_id=request.request_id, finish_reason=request.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_generation_tokens=request.num_output_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_preemptions=request.num_preemptions,
            queue_time=None if m.first_scheduled_time is None else m.first_scheduled_time - m.arrival_time,
            ttft=None if m.first_token_time is None else m.first_token_time - m.arrival_time,
            tpot=tpot, e2e=finished - m.arrival_time))

    @property
    def steady_steps(self) -> int:
        """Steps the compiled steady step (_step.SteadyStep) ran since the runner was attached."""
        return self._steady_runs + (self._steady_step.num_steps if self._steady_step is not None else 0)

    def stats(self, fresh: bool = True) -> EngineStats:
        """A snapshot; fresh=False lets per-step figures lag by up to a fraction of a second
        (cheap enough to call after every step)."""
        kv = self.kv_cache_manager
        return self._stats.snapshot(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            num_preempted_total=self.scheduler.num_preemptions_total, kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
            fresh=fresh)
