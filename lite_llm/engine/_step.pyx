"""Compiled per-sequence work of a plain decode step: what Scheduler.update_from_output and
LLMEngine.process_plain do for a step without drafts or grammars, for the whole batch in one
call (no Python frame per sequence).

    chunks   [ A: 1 token, samples | B: prefill chunk, no sample | C: 1 token, samples ]
    results  [ SampleResult(a)      | None                        | SampleResult(c)      ]
      phase 1 (update_from_output): computed tokens advanced; a, c appended to the requests'
               token lists; a token in the request's stop ids or at its length limit calls
               the scheduler's full stop check (which may finish the request)
      phase 2 (process_plain): a plain sample (still running, not its first token, no
               logprobs, no stop strings) has its ITL counted and its token detokenized here
               (ByteDetokenizer: a table lookup, the token's text cached); any other goes to
               LLMEngine.process_sample, unchanged. Requests with a delta join `touched`.

The two phases run one after the other, as the Python code does, so every finish, free and
stats record happens in the same order; in a steady decode batch (every sequence its group's
only plain child, each sampling) a sequence's two phases run back to back, since none's
depends on another's. The Python functions stay the reference (LLMEngine.batched_decode =
False runs them; tests/engine/test_step_batched.py compares, and tests/engine/test_step_paths.py
compares every compiled path at once, the scheduler's and the runner's included, with the
Python reference alone, step by step).

What does not live here: the stop strings and every non-plain sample (engine.py), the runner's
per-slot arrays (_batch.pyx: the sampled ids reach them in the runner's own compiled call).
"""
from cpython cimport array
from cpython.list cimport PyList_GET_SIZE, PyList_GetSlice
from libc.stdint cimport int32_t
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR

from time import monotonic as _monotonic, perf_counter as _perf_counter

from lite_llm.engine.detokenizer import ByteDetokenizer

from lite_llm.engine.request import RequestStatus, SampleResult
from lite_llm.engine.runner_output import RunnerOutput
from lite_llm.engine.stats import StepRecord
from lite_llm.outputs import CompletionOutput, RequestMetrics, RequestOutput

include "_chunk.pxi"

cdef extern from *:
    """
    #define LL_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)
    #define LL_LIST_END(op) ((const void *)(((PyListObject *)(op))->ob_item + PyList_GET_SIZE(op)))
    #define LL_LIST_AT(op, i) ((const void *)(((PyListObject *)(op))->ob_item + (i)))
    #define LL_LIST_ITEM(op, i) ((const void *)(((PyListObject *)(op))->ob_item[i]))
    """
    void LL_PREFETCH(const void *p)
    const void *LL_LIST_END(object op)    # where the list's next item goes (an append writes there)
    const void *LL_LIST_AT(object op, Py_ssize_t i)     # where item i's pointer sits
    const void *LL_LIST_ITEM(object op, Py_ssize_t i)   # item i (a list of objects, none NULL)

# fields of the NamedTuples read here as tuple items (a pointer load, not a descriptor call),
# checked against their classes at import
cdef enum:
    SAMPLE_TOKEN_ID = 0          # SampleResult.token_id
    STEP_PYTHON_SECONDS = 2      # StepRecord.python_seconds
    STEP_KERNEL_SECONDS = 3      # StepRecord.kernel_seconds
    STEP_BYTES_READ = 4          # StepRecord.bytes_read
    RAN_SAMPLED = 0              # RunnerOutput.sampled
    RAN_KERNEL_SECONDS = 3       # RunnerOutput.kernel_seconds
    RAN_BYTES_READ = 4           # RunnerOutput.bytes_read
    PLAN_CHUNKS = 0              # SchedulerOutput.chunks (checked by SteadySchedule)
    PLAN_NUM_TOKENS = 1          # SchedulerOutput.num_tokens
if SampleResult._fields[SAMPLE_TOKEN_ID] != "token_id" or StepRecord._fields[STEP_PYTHON_SECONDS:] != \
        ("python_seconds", "kernel_seconds", "bytes_read") or RunnerOutput._fields[RAN_SAMPLED] != "sampled" \
        or RunnerOutput._fields[RAN_KERNEL_SECONDS:RAN_BYTES_READ + 1] != ("kernel_seconds", "bytes_read"):
    raise ImportError("_step.pyx: SampleResult / StepRecord / RunnerOutput fields moved; update its field indices")

cdef object RUNNING = RequestStatus.RUNNING
cdef object WAITING = RequestStatus.WAITING
cdef object _BYTE_DETOKENIZER = ByteDetokenizer
cdef object _COMPLETION_OUTPUT = CompletionOutput
cdef object _REQUEST_METRICS = RequestMetrics
cdef object _REQUEST_OUTPUT = RequestOutput
cdef object _SAMPLE_RESULT = SampleResult
cdef object _STEP_RECORD = StepRecord
cdef object _new_tuple = tuple.__new__    # a NamedTuple without its Python-level __new__
cdef Py_UCS4 _REPLACEMENT = 0xFFFD     # what a lossy decode yields for incomplete UTF-8
# id(byte table) -> (the table, its tokens' texts): texts[t] is None until token t is first
# decoded, then its text when its bytes end on a whole character ("" for no bytes), else False
# of the _TEXTS_KEPT tables seen last (each entry keeps its table and a vocabulary-sized list
# alive: a process that builds many engines does not keep them all; a dropped one is refilled)
cdef dict _TEXTS = {}
cdef Py_ssize_t _TEXTS_KEPT = 4


cdef list _texts_of(list table):
    entry = _TEXTS.get(id(table))
    if entry is None or (<tuple>entry)[0] is not table:
        entry = (table, [None] * len(table))      # the table is kept: its id stays its own
        _TEXTS.pop(id(table), None)
        while len(_TEXTS) >= _TEXTS_KEPT:
            del _TEXTS[next(iter(_TEXTS))]         # the oldest entry
        _TEXTS[id(table)] = entry
    return <list>(<tuple>entry)[1]


cdef class _Seq:
    """What plain_step reads of one request every step, looked up once (request.step_state):
    the objects and lists it appends to, which never change for the request's life."""
    cdef object request, group, comp, det, metrics, parent_id, stop_ids
    cdef list outs, all_ids, det_token_ids, det_pieces, table, texts
    cdef Py_ssize_t limit, table_size
    cdef bint plain          # no logprobs, no stop strings: process_plain's own path
    cdef bint final_only     # FINAL_ONLY: no output while running
    cdef bint byte_det       # its detokenizer is a ByteDetokenizer
    cdef bint simple         # the group's only child, plain, no prompt logprobs: make_outputs' own path
    cdef bint decodes        # no images, no prompt logprobs: schedule_decodes may schedule it
    cdef object request_id

    def __init__(self, request, group):
        self.request = request
        self.group = group
        self.comp = group.completions[request.index]
        self.metrics = request.metrics
        self.parent_id = request.parent_id
        self.stop_ids, self.limit = request.stop_check
        self.outs = request.output_token_ids
        self.all_ids = request.all_token_ids     # the list itself, appended in place
        self.plain = request.logprobs is None and not request.sampling_params.stop
        self.final_only = group.final_only
        self.request_id = request.request_id
        self.decodes = request.mm is None and request.prompt_logprobs is None
        self.simple = self.plain and len(group.children) == 1 and request.prompt_logprobs is None \
            and not self.comp.stop_strings
        self._set_detokenizer(self.comp.detokenizer)

    cdef _set_detokenizer(self, det):
        self.det = det
        self.byte_det = type(det) is _BYTE_DETOKENIZER
        if self.byte_det:
            self.det_token_ids = det.token_ids
            self.det_pieces = det.pieces
            self.table = det.table
            self.table_size = PyList_GET_SIZE(self.table)
            self.texts = _texts_of(self.table)


cdef inline _Seq _seq_of(request, dict groups):
    seq = request.step_state
    if seq is None:
        seq = request.step_state = _Seq(request, groups[request.parent_id])
    return <_Seq>seq


cdef object _byte_add(_Seq seq, object token_obj, long token):
    """ByteDetokenizer.add(token), with the token's text decoded once per tokenizer."""
    det = seq.det
    if token < 0 or token >= seq.table_size or len(det.pending):
        return det.add(token_obj)            # rare: bytes held from earlier tokens, or no table entry
    seq.det_token_ids.append(token_obj)
    text = seq.texts[token]
    if text is None:
        piece = seq.table[token]
        if not piece:
            text = ""
        else:
            text = (<bytes>piece).decode("utf-8", "replace")
            if PyUnicode_READ_CHAR(text, PyUnicode_GET_LENGTH(text) - 1) == _REPLACEMENT:
                text = False
        seq.texts[token] = text
    if text is False:                        # an incomplete character: held
        det.pending = seq.table[token]
        return ""
    if text:
        seq.det_pieces.append(text)
    return text


def byte_add(det, token_id) -> str:
    """ByteDetokenizer.add as plain_step runs it (tests compare the two)."""
    cdef _Seq seq = _Seq.__new__(_Seq)
    seq._set_detokenizer(det)
    return _byte_add(seq, token_id, token_id)


cdef void _prefetch(list chunks, list previous):
    """Start loading, level by level, what this step will touch: the forward pass has evicted
    every object from the caches, and walking the objects one pointer at a time waits for
    each line in turn (~2 us per sequence at batch 64 measured). In a steady batch, the
    previous step's sequences are this step's: their records, then the objects and list ends
    the records point to, all requested before any is needed."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(previous)
    cdef _Seq seq
    cdef const char *p
    for i in range(PyList_GET_SIZE(chunks)):
        LL_PREFETCH(<PyObject *>chunks[i])
    for i in range(n):
        p = <const char *><PyObject *>previous[i]
        LL_PREFETCH(p)
        LL_PREFETCH(p + 64)
        LL_PREFETCH(p + 128)
    for i in range(n):
        seq = <_Seq>previous[i]
        p = <const char *><PyObject *>seq.request
        LL_PREFETCH(p)                       # Request's slots a step reads: its first two lines
        LL_PREFETCH(p + 64)
        LL_PREFETCH(<PyObject *>seq.outs)
        LL_PREFETCH(<PyObject *>seq.all_ids)
        LL_PREFETCH(<PyObject *>seq.stop_ids)
        LL_PREFETCH(<PyObject *>seq.metrics)
        LL_PREFETCH(<PyObject *>seq.comp)
        LL_PREFETCH(<PyObject *>seq.parent_id)
        if seq.byte_det:
            LL_PREFETCH(<PyObject *>seq.det)
            LL_PREFETCH(<PyObject *>seq.det_token_ids)
            LL_PREFETCH(<PyObject *>seq.det_pieces)
    for i in range(n):
        seq = <_Seq>previous[i]
        LL_PREFETCH(LL_LIST_END(seq.outs))
        LL_PREFETCH(LL_LIST_END(seq.all_ids))
        if seq.byte_det:
            LL_PREFETCH(LL_LIST_END(seq.det_token_ids))
            LL_PREFETCH(LL_LIST_END(seq.det_pieces))


cdef class _ItlCounts:
    """ITL counts per previous token time, as plain_step returns them ({time: samples}): a
    steady batch's samples share one previous time, so a run of the same time object is
    counted here and reaches the dict once."""
    cdef object last
    cdef Py_ssize_t run
    cdef dict counts

    def __cinit__(self):
        self.counts = {}
        self.run = 0

    cdef inline int add(self, object last) except -1:
        if self.run and last is self.last:
            self.run += 1
            return 0
        self.flush()
        self.last, self.run = last, 1
        return 0

    cdef int flush(self) except -1:
        if self.run:
            self.counts[self.last] = self.counts.get(self.last, 0) + self.run
            self.run = 0
        return 0

    cdef dict done(self):
        self.flush()
        return self.counts


cdef inline int _take(_Seq seq, object request, object token_obj, scheduler) except -1:
    """Scheduler.update_from_output's work for one sampled token of a request still in the batch
    (its computed tokens already advanced): the token joins its lists, and a stop id or the
    length limit calls the scheduler's full stop check (which may finish the request)."""
    seq.outs.append(token_obj)
    seq.all_ids.append(token_obj)
    if token_obj in seq.stop_ids or PyList_GET_SIZE(seq.outs) >= seq.limit:
        status = scheduler.check_token_stop(request)
        if status is not None:
            scheduler.finish_requests(request.request_id, status)
    return 0


cdef inline int _emit(_Seq seq, object token_obj, object sample, object now, engine, dict touched,
                      _ItlCounts itl) except -1:
    """LLMEngine.process_plain for one sample (token_obj; sample its SampleResult, or None for
    a plain (token, None, None, None) one): a plain sample (still running, not its first token)
    has its ITL counted and its token detokenized here; any other goes to process_sample."""
    cdef long token
    request = seq.request
    metrics = seq.metrics
    last = metrics.last_token_time
    if not seq.plain or request.status is not RUNNING or last is None:
        if sample is None:
            sample = _new_tuple(_SAMPLE_RESULT, (token_obj, None, None, None))
        engine.process_sample(request, sample, now)
        if not seq.final_only or request.is_finished:
            touched[seq.parent_id] = seq.group
        return 0
    itl.add(last)
    metrics.last_token_time = now
    if seq.det is not None:
        if seq.byte_det:
            token = token_obj
            new_text = _byte_add(seq, token_obj, token)
        else:
            new_text = seq.det.add(token_obj)
        if new_text:                     # _Completion.add_text without stop strings (no tail)
            comp = seq.comp
            comp.pending.append(new_text)
            comp.num_chars += len(new_text)
    if not seq.final_only:
        touched[seq.parent_id] = seq.group
    return 0


cdef inline int _take_emit(_Seq seq, object result, object now, scheduler, engine, dict touched,
                           _ItlCounts itl) except -1:
    """Both phases for one sequence of a batch whose sequences' phases do not depend on each
    other (each its group's only plain child): _take then _emit of its sampled result."""
    if result is None:
        raise AssertionError(f"no sample for {seq.request}")
    token_obj = (<tuple>result)[SAMPLE_TOKEN_ID]
    _take(seq, seq.request, token_obj, scheduler)
    _emit(seq, token_obj, result, now, engine, touched, itl)
    return 0


cdef void _prefetch_texts(list seqs, list results):
    """Start loading the cached texts of a steady batch's sampled tokens (two levels: the table's
    slots, then the strings they point to), which the detokenizing reads one by one; seqs: the
    records of the sequences sampling results, in order."""
    cdef Py_ssize_t i, token, n = PyList_GET_SIZE(seqs)
    cdef _Seq seq
    for i in range(n):
        seq = <_Seq>seqs[i]
        token = (<tuple>results[i])[SAMPLE_TOKEN_ID]
        if seq.byte_det and 0 <= token < seq.table_size:
            LL_PREFETCH(LL_LIST_AT(seq.texts, token))
    for i in range(n):
        seq = <_Seq>seqs[i]
        token = (<tuple>results[i])[SAMPLE_TOKEN_ID]
        if seq.byte_det and 0 <= token < seq.table_size:
            LL_PREFETCH(LL_LIST_ITEM(seq.texts, token))


cdef list _NO_CHUNKS = []


cdef bint _all_simple(list chunks):
    """Whether every chunk is one of a running sequence seen before, that samples, without
    drafts, its group's only plain child (_Seq.simple): a steady decode batch's step."""
    cdef Py_ssize_t i
    cdef tuple c
    for i in range(PyList_GET_SIZE(chunks)):
        c = <tuple>chunks[i]
        request = c[CHUNK_REQUEST]
        state = request.step_state
        if state is None or not (<_Seq>state).simple or request.status is not RUNNING \
                or not c[CHUNK_SAMPLE] or c[CHUNK_SPEC]:
            return False
    return True


def plain_step(list chunks, list results, object now, scheduler, engine, dict touched, bint steady=False) -> dict:
    """Scheduler.update_from_output(chunks, results) then LLMEngine.process_plain for a step
    without drafts or grammars. touched: parent id -> group, grown in sample order. Returns the
    ITL counts {previous token time: samples} the engine adds to its stats. engine.step_seqs
    holds the step's sequence records for the next step's prefetch, engine.step_simple whether
    they all took the steady batch's path below. steady: SchedulerOutput.steady (the previous
    step's sequences again, in order, one sampling token each)."""
    return _plain_step(chunks, results, now, scheduler, engine, touched, steady)


cdef dict _plain_step(list chunks, list results, object now, scheduler, engine, dict touched, bint steady):
    cdef Py_ssize_t i, n = len(chunks)
    cdef tuple c
    cdef list seqs, samples = []
    cdef list previous = engine.step_seqs
    cdef _ItlCounts itl = _ItlCounts()
    cdef dict groups
    cdef _Seq seq
    if len(results) != n:
        raise AssertionError("runner results must align with chunks")
    if steady and engine.step_simple and PyList_GET_SIZE(previous) == n:
        # the previous step's records, each still its group's only plain child: the chunks
        # are theirs in the same order (the scheduler's promise; the runner checked each
        # chunk's position against its row), so they are not read again
        _prefetch(_NO_CHUNKS, previous)
        _prefetch_texts(previous, results)
        for i in range(n):
            seq = <_Seq>previous[i]
            seq.request.num_computed_tokens = PyList_GET_SIZE(seq.all_ids)
            _take_emit(seq, results[i], now, scheduler, engine, touched, itl)
        return itl.done()
    _prefetch(chunks, previous)
    seqs = []
    engine.step_simple = False
    if _all_simple(chunks):
        # every sequence its group's only plain child, sampling (a steady decode batch): what
        # _emit does for one depends on no other's finish, so each sequence's two phases run
        # back to back, its objects still cached
        for i in range(n):
            seqs.append((<tuple>chunks[i])[CHUNK_REQUEST].step_state)
        _prefetch_texts(seqs, results)
        for i in range(n):
            c = <tuple>chunks[i]
            (<_Seq>seqs[i]).request.num_computed_tokens = c[CHUNK_START] + c[CHUNK_NUM_NEW]
            _take_emit(<_Seq>seqs[i], results[i], now, scheduler, engine, touched, itl)
        engine.step_seqs = seqs
        engine.step_simple = True
        return itl.done()
    groups = engine.groups
    # ---- phase 1: Scheduler.update_from_output ---------------------------------------------
    for i in range(n):
        c = <tuple>chunks[i]             # a ScheduledChunk, its fields by name (_chunk.pxi)
        request = c[CHUNK_REQUEST]
        status = request.status
        if status is not RUNNING and status is not WAITING:
            continue
        if c[CHUNK_SPEC]:
            raise AssertionError("plain_step: a chunk with drafts")
        request.num_computed_tokens = c[CHUNK_START] + c[CHUNK_NUM_NEW]
        if not c[CHUNK_SAMPLE]:
            continue
        result = results[i]
        if result is None:
            raise AssertionError(f"no sample for {request}")
        seq = _seq_of(request, groups)
        _take(seq, request, (<tuple>result)[SAMPLE_TOKEN_ID], scheduler)
        seqs.append(seq)
        samples.append(result)
    # ---- phase 2: LLMEngine.process_plain --------------------------------------------------
    for i in range(len(seqs)):
        sample = samples[i]
        _emit(<_Seq>seqs[i], (<tuple>sample)[SAMPLE_TOKEN_ID], sample, now, engine, touched, itl)
    engine.step_seqs = seqs
    return itl.done()


cdef class PendingOutput:
    """A delta RequestOutput of a group with one plain child, as make_outputs(lazy=True) leaves
    it: its values captured on the engine thread (the token ids a fresh slice, the metrics'
    values as they are now), the dataclasses built by materialize() on the reader's thread
    (RequestStream.get). One object per request per step on the engine thread instead of a
    RequestOutput, a CompletionOutput, a RequestMetrics (each a Python-level __init__) and a list.
    request_id and finished are what AsyncEngine routes it by."""
    cdef readonly object request_id
    cdef readonly bint finished
    cdef bint has_completion       # False: no new tokens or text (a finish already sent)
    cdef object prompt, prompt_token_ids, index, text, token_ids, cumulative_logprob, finish_reason, stop_reason
    cdef object arrival_time, first_scheduled_time, first_token_time, last_token_time, finished_time
    cdef object num_preemptions, num_cached_tokens

    def materialize(self):
        """The RequestOutput make_outputs(lazy=False) returns for the same step."""
        completions = []
        if self.has_completion:
            completions.append(_COMPLETION_OUTPUT(self.index, self.text, self.token_ids, self.cumulative_logprob,
                                                  None, self.finish_reason, self.stop_reason))
        return _REQUEST_OUTPUT(self.request_id, self.prompt, self.prompt_token_ids, completions, self.finished,
                               _REQUEST_METRICS(self.arrival_time, self.first_scheduled_time, self.first_token_time,
                                                self.last_token_time, self.finished_time, self.num_preemptions),
                               self.num_cached_tokens, None)


cdef PendingOutput _simple_output(_Seq seq):
    """LLMEngine.make_output of a group whose only child is plain (no stop strings, logprobs
    or prompt logprobs): its delta since the previous output, as a PendingOutput."""
    request = seq.request
    comp = seq.comp
    group = seq.group
    status = request.status
    cdef bint is_finished = status is not RUNNING and status is not WAITING
    cdef Py_ssize_t end = comp.num_chars          # no stop strings: everything is visible
    cdef Py_ssize_t num_tokens = PyList_GET_SIZE(seq.outs)
    cdef Py_ssize_t num_sent = comp.num_sent_tokens, sent_chars = comp.num_sent_chars, num, size
    cdef list pending
    cdef PendingOutput out = PendingOutput.__new__(PendingOutput)
    out.request_id, out.prompt, out.prompt_token_ids = group.request_id, group.prompt, group.prompt_token_ids
    out.finished = is_finished
    out.has_completion = False
    if num_tokens != num_sent or end != sent_chars or (is_finished and not comp.sent_finished):
        num = end - sent_chars                    # _Completion.take_text(end)
        if num <= 0:
            text = ""
        else:
            pending = comp.pending
            text = pending[0] if PyList_GET_SIZE(pending) == 1 else "".join(pending)
            size = PyUnicode_GET_LENGTH(text)
            if num < size:
                comp.pending = [text[num:]]
                text = text[:num]
            else:
                comp.pending = []
            comp.num_sent_chars = end
        out.has_completion = True
        out.index, out.text, out.token_ids = request.index, text, PyList_GetSlice(seq.outs, num_sent, num_tokens)
        out.cumulative_logprob, out.finish_reason, out.stop_reason = \
            request.cumulative_logprob, request.finish_reason, request.stop_reason
        comp.num_sent_tokens = num_tokens
        comp.sent_finished = is_finished
    m = seq.metrics                               # values now: the engine thread goes on updating its own
    out.arrival_time, out.first_scheduled_time, out.first_token_time = \
        m.arrival_time, m.first_scheduled_time, m.first_token_time
    out.last_token_time, out.finished_time, out.num_preemptions = \
        m.last_token_time, m.finished_time, m.num_preemptions
    num_cached = request.num_cached_tokens
    out.num_cached_tokens = num_cached if num_cached > 0 else 0
    return out


def make_outputs(dict touched, engine, bint lazy=False) -> list:
    """step()'s outputs of the touched groups, in order: LLMEngine.make_output's delta per group
    (compiled for a group of one plain child, engine.make_output otherwise); a finished group
    leaves engine.groups, a running FINAL_ONLY one and an empty delta give no output. lazy: a
    group of one plain child gives its PendingOutput (its materialize() is that RequestOutput)."""
    return _make_outputs(touched, engine, lazy)


cdef list _make_outputs(dict touched, engine, bint lazy):
    cdef list outputs = []
    cdef dict groups = engine.groups
    cdef PendingOutput pending
    for rid, group in touched.items():
        children = group.children
        seq = (<list>children)[0].step_state if len(children) == 1 else None
        if seq is not None and (<_Seq>seq).simple:
            if (<_Seq>seq).final_only and not (<_Seq>seq).request.is_finished:
                continue
            pending = _simple_output(<_Seq>seq)
            if pending.finished:
                del groups[rid]
            elif not pending.has_completion:
                continue
            outputs.append(pending if lazy else pending.materialize())
            continue
        if group.final_only and not group.is_finished:
            continue
        out = engine.make_output(group)
        if out.finished:
            del groups[rid]
            outputs.append(out)
        elif out.outputs:
            outputs.append(out)
    return outputs


def schedule_decodes(list running, dict room, list chunks, Py_ssize_t budget, Py_ssize_t idx, chunk_type,
                     allocate):
    """Scheduler._schedule_running's common case from running[idx] on, for as long as it holds:
    a request plain_step has seen (step_state), without images, prompt logprobs or drafts, gets
    its chunk (a chunk_type, ScheduledChunk) without a Python frame: when its blocks already hold
    its new tokens (room: KVCacheManager.room) with no new blocks, else with the blocks
    allocate (KVCacheManager.allocate_slots) gives it. Returns (idx, budget) at the first
    request it leaves to the Python loop (or the end of running, or of the budget): one it
    does not take, or one the pool is short for (allocate returned None, which changes
    nothing: the loop asks again and preempts)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(running), start, num_new, total
    cdef _Seq seq
    cdef object no_drafts = ()
    while idx < n and budget > 0:
        request = running[idx]
        state = request.step_state
        if state is None:
            break
        seq = <_Seq>state
        if not seq.decodes or request.spec_token_ids:
            break
        start = request.num_computed_tokens
        total = PyList_GET_SIZE(seq.all_ids)
        num_new = total - start
        if num_new > budget:
            num_new = budget
        if num_new <= 0:
            break
        if start + num_new <= room.get(seq.request_id, -1):
            block_ids = _NO_BLOCKS
        else:
            block_ids = allocate(request, num_new, (), 0)
            if block_ids is None:
                break
        chunks.append(tuple.__new__(chunk_type, (request, start, num_new, block_ids, start + num_new == total,
                                                 False, no_drafts)))
        budget -= num_new
        idx += 1
    return idx, budget


cdef tuple _NO_BLOCKS = ()      # a chunk's new block ids when it needs none (shared: never changed)


cdef class SteadySchedule:
    """The scheduler's steady step (Scheduler.schedule's first case), compiled: when nobody
    waits and nothing left since the last step, the running requests' decode chunks
    (schedule_decodes) and, when they repeat the latest step's (repeats_decodes), the step's
    SchedulerOutput marked steady. It holds the scheduler's own queues (never rebound), so it
    reads them as they are; Scheduler.schedule takes it first and continues from where it
    stopped (take_pending), and the engine's compiled steady step (SteadyStep) calls it
    without a Python frame.

        schedule() -> SchedulerOutput  a steady step: its chunks, blocks allocated
                   -> None             not one: nothing changed, or (pending) the chunks it
                                       made so far, their blocks allocated, which the
                                       scheduler's loop must continue from"""
    cdef object waiting                  # the scheduler's deque of waiting requests
    cdef list running, finished, preempted
    cdef dict room
    cdef object allocate, chunk_type, output_type
    cdef Py_ssize_t max_tokens
    cdef public list last_chunks         # the chunks of the latest step that ran
    cdef tuple pending                   # (chunks, idx, budget) left for the scheduler's loop

    def __init__(self, waiting, list running, list finished, list preempted, dict room, allocate, chunk_type,
                 output_type, Py_ssize_t max_tokens):
        """The scheduler's waiting deque, running list, finished and preempted id lists (the
        objects it keeps for its lifetime), the KV manager's room and allocate_slots,
        ScheduledChunk, SchedulerOutput and the step's token budget."""
        self.waiting, self.running, self.finished, self.preempted = waiting, running, finished, preempted
        self.room, self.allocate, self.chunk_type, self.output_type = room, allocate, chunk_type, output_type
        self.max_tokens, self.last_chunks, self.pending = max_tokens, [], None
        if output_type._fields[:PLAN_NUM_TOKENS + 1] != ("chunks", "num_tokens") \
                or output_type._fields[5:] != ("steady", "aborted") or len(output_type._fields) != 7:
            raise TypeError("SteadySchedule: SchedulerOutput's fields moved; update _step.pyx")

    cpdef object schedule(self):
        cdef Py_ssize_t idx, budget
        cdef list chunks
        if self.pending is not None or self.waiting or PyList_GET_SIZE(self.finished) \
                or PyList_GET_SIZE(self.preempted) or not PyList_GET_SIZE(self.running):
            return None
        chunks = []
        idx, budget = schedule_decodes(self.running, self.room, chunks, self.max_tokens, 0, self.chunk_type,
                                       self.allocate)
        if idx == PyList_GET_SIZE(self.running) and _repeats_decodes(self.last_chunks, chunks):
            self.last_chunks = chunks
            return _new_tuple(self.output_type, (chunks, self.max_tokens - budget, (), (), 0, True, ()))
        self.pending = (chunks, idx, budget)
        return None

    def take_pending(self):
        """What the latest schedule() that returned None left: (chunks, idx, budget), the
        running requests from idx on still to schedule with budget tokens left; or None when it
        changed nothing."""
        pending, self.pending = self.pending, None
        return pending


cdef class SteadyStep:
    """LLMEngine.step for a steady decode batch in one compiled call: the scheduler's steady
    schedule (SteadySchedule), the runner's repeated step (_batch.SteadyDecode) and the end of a
    plain step (finish_plain), the same objects passing between them as in step()'s Python
    frames. run() returns None when the scheduler's step is not steady (step() then runs its
    Python path, which continues the scheduler's pending chunks); the engine makes one after a
    steady step the runner ran as a SteadyDecode and drops it when run() returns None."""
    cdef SteadySchedule schedule
    cdef object decode, engine, stats
    cdef readonly Py_ssize_t num_steps

    def __init__(self, engine, SteadySchedule schedule, decode, stats):
        self.engine, self.schedule, self.decode, self.stats = engine, schedule, decode, stats

    def run(self, bint lazy=False):
        cdef double start = _perf_counter()
        sched_out = self.schedule.schedule()
        if sched_out is None:
            return None
        chunks = (<tuple>sched_out)[PLAN_CHUNKS]
        ran = self.decode.run(chunks)
        self.num_steps += 1
        return finish_plain(self.engine, self.stats, chunks, (<tuple>ran)[RAN_SAMPLED], _monotonic(), {}, True, lazy,
                            start, (<tuple>ran)[RAN_KERNEL_SECONDS], (<tuple>ran)[RAN_BYTES_READ],
                            (<tuple>sched_out)[PLAN_NUM_TOKENS])


def repeats_decodes(list previous, list chunks) -> bool:
    """Whether chunks are a steady decode step after previous (the chunks of the step before):
    the same requests in the same order, each computing one token that samples, none new, no
    drafts (SchedulerOutput.steady)."""
    return _repeats_decodes(previous, chunks)


cdef bint _repeats_decodes(list previous, list chunks):
    cdef Py_ssize_t i, n = PyList_GET_SIZE(chunks)
    cdef tuple c
    if n == 0 or PyList_GET_SIZE(previous) != n:
        return False
    for i in range(n):
        c = <tuple>chunks[i]
        if c[CHUNK_REQUEST] is not (<tuple>previous[i])[CHUNK_REQUEST] or c[CHUNK_NUM_NEW] != 1 \
                or not c[CHUNK_SAMPLE] or c[CHUNK_IS_NEW] or c[CHUNK_SPEC]:
            return False
    return True


cdef int _observe(object hist, double value, Py_ssize_t count) except -1:
    """stats.HistogramAccumulator.observe(value, count), compiled: on its flat arrays."""
    cdef array.array lows = hist.lows
    cdef array.array counts = hist.counts
    cdef array.array total = hist.total
    cdef const double *b = lows.data.as_doubles
    cdef Py_ssize_t lo = 0, hi = len(lows), mid
    if len(counts) != hi + 1 or len(total) != 1:
        raise AssertionError("a histogram's arrays disagree")
    while lo < hi:                       # bisect.bisect_left
        mid = (lo + hi) >> 1
        if b[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    counts.data.as_longlongs[lo] += count
    total.data.as_doubles[0] += value * count
    return 0


def add_itl(stats, dict itl, double now):
    """StatsCollector.add_itl, compiled: the plain samples' inter-token latencies, counted per
    previous token time, into stats (a StatsCollector)."""
    _add_itl(stats, itl, now)


cdef int _add_itl(stats, dict itl, double now) except -1:
    cdef Py_ssize_t count, total = 0
    hist = stats.itl
    for last, c in itl.items():
        count = c
        _observe(hist, now - <double>last, count)
        total += count
    if total:
        stats.generation_tokens_total += total
    return 0


def record_step(stats, record):
    """StatsCollector.record_step(record), compiled."""
    _record_step(stats, record)


cdef int _record_step(stats, record) except -1:
    stats.num_steps_total += 1
    _observe(stats.step_python, (<tuple>record)[STEP_PYTHON_SECONDS], 1)
    _observe(stats.step_kernel, (<tuple>record)[STEP_KERNEL_SECONDS], 1)
    stats.step_bytes_read_total += (<tuple>record)[STEP_BYTES_READ]
    stats.recent_steps.append(record)
    return 0


def finish_plain(engine, stats, list chunks, list results, double now, dict touched, bint steady, bint lazy,
                 double start, double kernel, long long bytes_read, Py_ssize_t num_tokens) -> list:
    """The end of LLMEngine.step for a step without drafts or grammars, in one call: plain_step,
    the ITL counts into stats, make_outputs, and the step's StepRecord (its Python time counted
    from start, the step's perf_counter() at its beginning, up to here)."""
    _add_itl(stats, _plain_step(chunks, results, now, engine.scheduler, engine, touched, steady), now)
    outputs = _make_outputs(touched, engine, lazy)
    if PyList_GET_SIZE(chunks):
        _record_step(stats, _new_tuple(_STEP_RECORD, (PyList_GET_SIZE(chunks), num_tokens,
                                                      _perf_counter() - start - kernel, kernel, bytes_read)))
    return outputs
