"""The transcription engine (lite_llm/engine/transcription.py) on a tiny random multilingual Whisper:
concurrent requests share decoder steps (one WhisperDecoder.step holds the windows of several
requests) and each gets the transcription it gets alone, greedy, sampled, with the temperature
fallback and by beam search; a cancelled request leaves the others going and its decoder slots
free; a batch never holds more requests than max_num_seqs; a window being encoded (a layer a turn)
does not hold the other requests' tokens."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm.engine.transcription import TranscriptionEngine
from lite_llm.multimodal.transcribe import TranscribeOptions, WhisperModel
from test_whisper_transcribe import speechy
from whisper_checkpoint import whisper_asr_checkpoint

NO_FALLBACK = dict(compression_ratio_threshold=None, logprob_threshold=None)
# (seconds, seed, options): short and multi-window audio, each way of decoding a window
CASES = [(7.0, 1, TranscribeOptions(max_new_tokens=40)),                         # the default fallback
         (45.0, 2, TranscribeOptions(language="en", temperature=0.0, max_new_tokens=30, **NO_FALLBACK)),
         (5.0, 3, TranscribeOptions(language="de", temperature=0.6, seed=5, max_new_tokens=25, **NO_FALLBACK)),
         (10.0, 4, TranscribeOptions(language="en", temperature=0.0, beam_size=3, max_new_tokens=20,
                                     **NO_FALLBACK)),
         (3.0, 5, TranscribeOptions(timestamps=True, temperature=0.0, max_new_tokens=35, **NO_FALLBACK))]


@pytest.fixture(scope="module")
def model():
    return WhisperModel.from_pretrained(str(whisper_asr_checkpoint()), num_threads=2, max_requests=4,
                                        max_sequences=12)


class StepSpy:
    """Wraps a decoder's step: the number of distinct requests (cross K/V slots) in each call."""

    def __init__(self, decoder):
        self.decoder, self.inner = decoder, decoder.step
        self.requests: list[int] = []
        decoder.step = self

    def __call__(self, states, tokens):
        self.requests.append(len({st.cross_slot for st in states}))
        return self.inner(states, tokens)

    def close(self):
        del self.decoder.step


def _summary(r):
    return (r.text, r.language, [(s.start, s.end, s.tokens, s.temperature, s.avg_logprob) for s in r.segments])


def _free(dec) -> tuple[int, int]:
    return len(dec.free_slots), len(dec.free_cross)


def test_concurrent_requests_share_steps_and_match_alone(model):
    audios = [speechy(sec, seed) for sec, seed, _ in CASES]
    spy = StepSpy(model.decoder)
    try:
        alone = [_summary(model.transcribe(x, opts)) for x, (_, _, opts) in zip(audios, CASES)]
    finally:
        spy.close()
    steps_alone = len(spy.requests)
    free = _free(model.decoder)
    engine = TranscriptionEngine(model, max_num_seqs=4)
    spy = StepSpy(model.decoder)
    try:
        engine.start()
        jobs = [engine.submit(x, opts) for x, (_, _, opts) in zip(audios, CASES)]
        together = [_summary(j.result(timeout=300)) for j in jobs]
    finally:
        engine.shutdown()
        spy.close()
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"request {i} ({CASES[i][2]}) differs when batched"
    assert max(spy.requests) == 4                 # max_num_seqs requests in one step, never more
    # the requests' tokens ran in fewer steps than alone: by as many as were shared
    assert len(spy.requests) == steps_alone - sum(n - 1 for n in spy.requests) < steps_alone
    assert engine.num_step_seqs > engine.num_steps
    assert _free(model.decoder) == free           # every state released


def test_a_cancelled_request_leaves_the_others_going(model):
    short = speechy(4.0, 7)
    opts = TranscribeOptions(language="en", temperature=0.0, max_new_tokens=30, **NO_FALLBACK)
    alone = _summary(model.transcribe(short, opts))
    free = _free(model.decoder)
    engine = TranscriptionEngine(model, max_num_seqs=4)
    engine.start()
    try:
        long_job = engine.submit(speechy(120.0, 8), opts)
        events = long_job.events(timeout=120)
        assert next(events)[0] == "window"        # it is decoding
        short_job = engine.submit(short, opts)
        long_job.cancel()
        assert _summary(short_job.result(timeout=120)) == alone
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "error" and "done" not in kinds
        # the engine keeps serving after the cancel
        assert _summary(engine.submit(short, opts).result(timeout=120)) == alone
    finally:
        engine.shutdown()
    assert _free(model.decoder) == free


def test_beams_wait_for_slots_instead_of_failing(model):
    """Two beam searches of 4 beams (8 slots at most each) on a decoder of 12 slots: the second
    waits for the first's slots and both end as they do alone."""
    opts = TranscribeOptions(language="en", temperature=0.0, beam_size=4, max_new_tokens=12, **NO_FALLBACK)
    audios = [speechy(6.0, 9), speechy(6.0, 10)]
    alone = [_summary(model.transcribe(x, opts)) for x in audios]
    engine = TranscriptionEngine(model, max_num_seqs=4)
    engine.start()
    try:
        jobs = [engine.submit(x, opts) for x in audios]
        assert [_summary(j.result(timeout=120)) for j in jobs] == alone
    finally:
        engine.shutdown()


class EncoderSpy:
    """Wraps an encoder's kernels: each compiled encoder call as ("encoder", layers it ran)."""

    def __init__(self, encoder, events: list):
        self.inner, self.events, self.depth = encoder.kernels, events, encoder.cfg.num_layers
        self.encoder = encoder
        encoder.kernels = self

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def whisper_encoder_forward(self, *args):
        self.events.append(("encoder", self.depth))
        return self.inner.whisper_encoder_forward(*args)

    def whisper_encoder_layers(self, wm, features, x, out, first, last, nt):
        self.events.append(("encoder", last - first))
        return self.inner.whisper_encoder_layers(wm, features, x, out, first, last, nt)

    def close(self):
        self.encoder.kernels = self.inner


def test_a_window_being_encoded_does_not_hold_the_others_tokens(model):
    """Request A decodes one long window while request B, four windows of audio, is transcribed
    beside it: B's encoder passes run a layer a turn between the decoder steps, so A's tokens keep
    coming (never more than one encoder layer between two of A's steps), and both end as alone."""
    a_opts = TranscribeOptions(language="de", temperature=0.0, max_new_tokens=150, **NO_FALLBACK)
    b_opts = TranscribeOptions(language="en", temperature=0.0, timestamps=False, max_new_tokens=4, **NO_FALLBACK)
    a_audio, b_audio = speechy(10.0, 31), speechy(95.0, 32)
    want = [_summary(model.transcribe(a_audio, a_opts)), _summary(model.transcribe(b_audio, b_opts))]
    # a model whose encoder cache holds A's window (encoded alone): every encoder call below is B's
    fresh = WhisperModel.from_pretrained(str(whisper_asr_checkpoint()), num_threads=2, max_requests=4,
                                         max_sequences=12)
    fresh.transcribe(a_audio, a_opts)
    de = fresh.lang_to_id["de"]
    events: list = []
    inner = fresh.decoder.step

    def step(states, tokens):
        # A's states: their prompt's language token is de
        events.append(("step", any((st.tokens + new)[1:2] == [de] for st, new in zip(states, tokens))))
        return inner(states, tokens)
    fresh.decoder.step = step
    spy = EncoderSpy(fresh.encoder, events)
    engine = TranscriptionEngine(fresh, max_num_seqs=4)
    try:
        jobs = [engine.submit(a_audio, a_opts), engine.submit(b_audio, b_opts)]     # both in the first turn
        engine.start()
        got = [_summary(j.result(timeout=300)) for j in jobs]
    finally:
        engine.shutdown()
        spy.close()
    assert got == want
    a_steps = [i for i, e in enumerate(events) if e == ("step", True)]
    during = events[a_steps[0]:a_steps[-1]]           # while A decodes
    layers = [e[1] for e in events if e[0] == "encoder"]
    assert sum(layers) == 4 * fresh.encoder.cfg.num_layers == 8      # B's 4 windows, 2 layers each
    assert sum(e[1] for e in during if e[0] == "encoder") >= 3 * 2    # most of them while A decodes
    # between two of A's steps: at most one encoder layer
    run = 0
    for e in during:
        run = 0 if e == ("step", True) else run + (e[1] if e[0] == "encoder" else 0)
        assert run <= 1, f"{run} encoder layers between two of A's decoder steps"
    assert engine.num_encoder_slices >= len(layers)


def test_a_failing_encoder_slice_fails_its_request_only(model):
    """An encoder slice that raises: its request gets the error, its decoder slots are freed, and the
    request decoding beside it ends as alone."""
    opts = TranscribeOptions(language="en", temperature=0.0, max_new_tokens=40, **NO_FALLBACK)
    good, bad = speechy(6.0, 33), speechy(8.0, 34)
    want = _summary(model.transcribe(good, opts))
    free = _free(model.decoder)
    bad_rows = model.features(bad)[:, :3000]

    class Failing:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def whisper_encoder_layers(self, wm, features, x, out, first, last, nt):
            if first == 1 and np.array_equal(features[0], bad_rows):
                raise RuntimeError("a slice failed")
            return self.inner.whisper_encoder_layers(wm, features, x, out, first, last, nt)
    inner = model.encoder.kernels
    model.encoder.kernels = Failing(inner)
    engine = TranscriptionEngine(model, max_num_seqs=4)
    try:
        jobs = [engine.submit(good, opts), engine.submit(bad, opts)]
        engine.start()
        assert _summary(jobs[0].result(timeout=120)) == want
        with pytest.raises(RuntimeError, match="a slice failed"):
            jobs[1].result(timeout=120)
        assert engine.is_alive()
    finally:
        engine.shutdown()
        model.encoder.kernels = inner
    assert _free(model.decoder) == free
