"""Compiled per-sequence work of a plain decode step: what Scheduler.update_from_output and
LLMEngine._process_plain do for a step without drafts or grammars, for the whole batch in one
call (no Python frame per sequence).

    chunks   [ A: 1 token, samples | B: prefill chunk, no sample | C: 1 token, samples ]
    results  [ SampleResult(a)      | None                        | SampleResult(c)      ]
      phase 1 (update_from_output): computed tokens advanced; a, c appended to the requests'
               token lists; a token in the request's stop ids or at its length limit calls
               the scheduler's full stop check (which may finish the request)
      phase 2 (_process_plain): a plain sample (still running, not its first token, no
               logprobs, no stop strings) has its ITL counted and its token detokenized here
               (ByteDetokenizer: a table lookup, the token's text cached); any other goes to
               LLMEngine._process_sample, unchanged. Requests with a delta join `touched`.

The two phases run one after the other, as the Python code does, so every finish, free and
stats record happens in the same order. The Python functions stay the reference
(LLMEngine.batched_decode = False runs them; tests/engine/test_step_batched.py compares).

What does not live here: the stop strings and every non-plain sample (engine.py), the runner's
per-slot arrays (_batch.pyx: the sampled ids reach them in the runner's own compiled call).
"""
from cpython.list cimport PyList_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR

from lite_llm.engine.detokenizer import ByteDetokenizer
from lite_llm.engine.request import RequestStatus

cdef object RUNNING = RequestStatus.RUNNING
cdef object WAITING = RequestStatus.WAITING
cdef object _BYTE_DETOKENIZER = ByteDetokenizer
cdef Py_UCS4 _REPLACEMENT = 0xFFFD     # what a lossy decode yields for incomplete UTF-8
# id(byte table) -> (the table, its tokens' texts): texts[t] is None until token t is first
# decoded, then its text when its bytes end on a whole character ("" for no bytes), else False
cdef dict _TEXTS = {}


cdef list _texts_of(list table):
    entry = _TEXTS.get(id(table))
    if entry is None or (<tuple>entry)[0] is not table:
        entry = (table, [None] * len(table))      # the table is kept: its id stays its own
        _TEXTS[id(table)] = entry
    return <list>(<tuple>entry)[1]


cdef object _byte_add(object det, object token_obj, long token):
    """ByteDetokenizer.add(token), with the token's text decoded once per tokenizer."""
    cdef list table = det._table
    cdef Py_ssize_t size = PyList_GET_SIZE(table)
    cdef object pending = det._pending
    cdef object text
    cdef list texts
    if token < 0 or token >= size or len(pending):
        return det.add(token_obj)            # rare: bytes held from earlier tokens, or no table entry
    det.token_ids.append(token_obj)
    texts = _texts_of(table)
    text = texts[token]
    if text is None:
        piece = table[token]
        if not piece:
            text = ""
        else:
            text = (<bytes>piece).decode("utf-8", "replace")
            if PyUnicode_READ_CHAR(text, PyUnicode_GET_LENGTH(text) - 1) == _REPLACEMENT:
                text = False
        texts[token] = text
    if text is False:                        # an incomplete character: held
        det._pending = table[token]
        return ""
    if text:
        det._pieces.append(text)
    return text


def byte_add(det, token_id) -> str:
    """ByteDetokenizer.add as plain_step runs it (tests compare the two)."""
    return _byte_add(det, token_id, token_id)


def plain_step(list chunks, list results, object now, scheduler, engine, dict touched) -> dict:
    """Scheduler.update_from_output(chunks, results) then LLMEngine._process_plain for a step
    without drafts or grammars. touched: parent id -> group, grown in sample order. Returns the
    ITL counts {previous token time: samples} the engine adds to its stats."""
    cdef Py_ssize_t i, n = len(chunks)
    cdef tuple c
    cdef list reqs = [], samples = []
    cdef list outs
    cdef dict itl = {}
    cdef dict groups = engine._groups
    cdef long token
    if len(results) != n:
        raise AssertionError("runner results must align with chunks")
    # ---- phase 1: Scheduler.update_from_output ---------------------------------------------
    for i in range(n):
        c = <tuple>chunks[i]             # ScheduledChunk: (request, start, num_new, blocks, sample, is_new, spec)
        request = c[0]
        status = request.status
        if status is not RUNNING and status is not WAITING:
            continue
        if c[6]:
            raise AssertionError("plain_step: a chunk with drafts")
        request.num_computed_tokens = c[1] + c[2]
        if not c[4]:
            continue
        result = results[i]
        if result is None:
            raise AssertionError(f"no sample for {request}")
        token_obj = (<tuple>result)[0]
        outs = request.output_token_ids
        outs.append(token_obj)
        request._all_token_ids.append(token_obj)
        reqs.append(request)
        samples.append(result)
        stop = <tuple>request.stop_check
        if token_obj in stop[0] or len(outs) >= stop[1]:
            status = scheduler._check_token_stop(request)
            if status is not None:
                scheduler.finish_requests(request.request_id, status)
    # ---- phase 2: LLMEngine._process_plain --------------------------------------------------
    for i in range(len(reqs)):
        request = reqs[i]
        result = samples[i]
        metrics = request.metrics
        last = metrics.last_token_time
        parent_id = request.parent_id
        group = groups[parent_id]
        if request.status is not RUNNING or last is None or request.logprobs is not None \
                or request.sampling_params.stop:
            engine._process_sample(request, result, now)
            if not group.final_only or request.is_finished:
                touched[parent_id] = group
            continue
        itl[last] = itl.get(last, 0) + 1
        metrics.last_token_time = now
        comp = group.completions[request.index]
        det = comp.detokenizer
        if det is not None:
            token_obj = (<tuple>result)[0]
            if type(det) is _BYTE_DETOKENIZER:
                token = token_obj
                new_text = _byte_add(det, token_obj, token)
            else:
                new_text = det.add(token_obj)
            if new_text:                     # _Completion.add_text without stop strings (no tail)
                comp._pending.append(new_text)
                comp.num_chars += len(new_text)
        if not group.final_only:
            touched[parent_id] = group
    return itl
