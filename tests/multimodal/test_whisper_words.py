"""Word-level timestamps (lite_llm/multimodal/word_timing.py) against what others wrote: the
dynamic time warping and the median filter against transformers' (_dynamic_time_warping,
_median_filter) on drawn inputs; the alignment heads' cross-attention against transformers'
eager attention; the alignment cost against transformers' normalization; and (the peers tier)
the words and their times against faster-whisper's (CTranslate2's align, its word split, its
punctuation merging and clamps) on the same tokens of a tiny random Whisper converted for it.
Then the transcription's words: on every segment, within it, the NumPy decoder's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_llm._kernels import kernels
from lite_llm.multimodal import word_timing
from lite_llm.multimodal.transcribe import TranscribeOptions, WhisperModel
from test_whisper_transcribe import speechy
from whisper_checkpoint import whisper_asr_checkpoint

gw = pytest.importorskip("transformers.models.whisper.generation_whisper")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 12), m=st.integers(1, 40), ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_dtw_is_transformers(n, m, ties, seed):
    """The same path, ties included (small integers make many equal costs)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, (n, m)).astype(np.float64) if ties else rng.standard_normal((n, m))
    text, time = kernels.whisper_dtw(np.ascontiguousarray(x))
    want_text, want_time = gw._dynamic_time_warping(x)
    np.testing.assert_array_equal(text, want_text)
    np.testing.assert_array_equal(time, want_time)


def test_dtw_refuses_an_empty_matrix():
    with pytest.raises(ValueError, match="empty"):
        kernels.whisper_dtw(np.zeros((0, 5)))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 30)), width=st.sampled_from([1, 3, 5, 7]),
       seed=st.integers(0, 2 ** 16))
def test_median_filter_is_transformers(shape, width, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = gw._median_filter(torch.from_numpy(x), width).numpy()
    np.testing.assert_array_equal(word_timing.median_filter(x, width), want)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 40)),
       width=st.sampled_from([1, 3, 5, 7, 15, 63]), ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_compiled_median_filter_is_the_numpy_one(shape, width, ties, seed):
    """The compiled loop (kernels.median_filter_rows) gives the NumPy reference's values, rows
    shorter than the window's reach (reflected more than once in NumPy: left as they are) too."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(-2, 3, shape) if ties else rng.standard_normal(shape)).astype(np.float32)
    want = word_timing.median_filter(x, width)
    if shape[-1] <= width // 2:
        assert word_timing.median_filter(x, width, kernels) is x
        return
    np.testing.assert_array_equal(word_timing.median_filter(x, width, kernels), want)


def test_the_compiled_median_filter_refuses_what_it_cannot_filter():
    x = np.zeros((2, 5), np.float32)
    for width, out in ((4, x.copy()), (65, x.copy()), (11, x.copy()), (3, np.zeros((2, 4), np.float32))):
        with pytest.raises(ValueError, match="median_filter_rows"):
            kernels.median_filter_rows(x, width, out)


@pytest.fixture(scope="module")
def models():
    from transformers import WhisperForConditionalGeneration
    path = whisper_asr_checkpoint()
    theirs = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    ours = {k: WhisperModel.from_pretrained(str(path), kernels=None if k == "numpy" else "auto", num_threads=2,
                                            quantization="q8_0" if k == "q8_0" else None)
            for k in ("compiled", "numpy", "q8_0")}
    return path, theirs, ours


def _theirs_cross(theirs, rows: np.ndarray, tokens: list[int]) -> list[np.ndarray]:
    """transformers' cross-attention probabilities per layer [heads, tokens, rows]."""
    with torch.no_grad():
        out = theirs.model.decoder(input_ids=torch.tensor([tokens]), encoder_hidden_states=torch.from_numpy(rows)[None],
                                   output_attentions=True)
    return [a[0].numpy() for a in out.cross_attentions]


def _rows_and_tokens(ours: WhisperModel, seconds: float = 12.0):
    x = speechy(seconds, seed=5)
    rows = ours.encoder.encode(ours.features(x))
    r = ours.transcribe(x, TranscribeOptions(language="en", temperature=0.0, compression_ratio_threshold=None,
                                             logprob_threshold=None))
    text = [t for s in r.segments for t in s.tokens if t < ours.eot][:40]
    assert len(text) >= 10, "the random model said too little to align"
    return x, rows, ours.prompt_tokens("en", "transcribe", False, None) + text + [ours.eot]


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["compiled", "numpy"])
def test_cross_attention_of_the_alignment_heads_is_transformers(models, kind):
    """cross_scores' softmax over all encoder rows equals transformers' cross-attention probabilities
    for every head asked, and the pass leaves no state or K/V behind."""
    _, theirs, ours = models
    m = ours[kind]
    _, rows, tokens = _rows_and_tokens(ours["compiled"])
    heads = [(0, 0), (0, 3), (1, 1), (1, 2)]
    cross = m.decoder.cross(rows)
    try:
        m.decoder.fill_cross(cross, m.decoder.cfg.num_layers)
        got = _softmax(m.decoder.cross_scores(cross, tokens, heads))
    finally:
        m.decoder.release_cross(cross)
    want = _theirs_cross(theirs, rows, tokens)
    for i, (l, h) in enumerate(heads):
        np.testing.assert_allclose(got[i], want[l][h], atol=1e-5)
    if kind == "compiled":
        assert len(m.decoder.free_slots) == m.decoder.max_sequences and not m.decoder.cross_refs


@pytest.mark.parametrize("kv,tol", [("bfloat16", 2 ** -8), ("int8", None)])
def test_the_keys_read_back_from_8_and_16_bit_blocks(models, kv, tol):
    """The keys the scores use, read back from bf16 or int8 K blocks, are the float32 decoder's
    within the format's rounding (int8: half a step of the row's scale)."""
    from lite_llm.multimodal.whisper_decoder import WhisperDecoder
    path, _, ours = models
    _, rows, _ = _rows_and_tokens(ours["compiled"])
    ref = ours["compiled"].decoder
    dec = WhisperDecoder.from_pretrained(str(path), kv_cache_dtype=kv, num_threads=2)
    a, b = ref.cross(rows), dec.cross(rows)
    try:
        ref.fill_cross(a, 2)
        dec.fill_cross(b, 2)
        for layer, head in ((0, 1), (1, 3)):
            want, got = ref._cross_keys(a, layer)[head], dec._cross_keys(b, layer)[head]
            assert got.shape == want.shape == (rows.shape[0], ref.cfg.head_dim)
            if tol is not None:
                np.testing.assert_allclose(got, want, rtol=tol, atol=1e-30)
            else:
                step = np.abs(want).max(axis=1, keepdims=True) / 127
                assert np.all(np.abs(got - want) <= step / 2 + 1e-6)
    finally:
        ref.release_cross(a)
        dec.release_cross(b)


def test_alignment_cost_is_transformers_normalization(models):
    """Over a whole window (3000 frames: nothing cropped before the softmax) the cost is what
    transformers' _extract_token_timestamps computes from its cross-attentions: standardized over
    the tokens, median-filtered over the rows, averaged over the heads."""
    _, theirs, ours = models
    m = ours["compiled"]
    _, rows, tokens = _rows_and_tokens(m)
    heads = word_timing.alignment_heads({}, 2, 4)
    assert heads == [(1, 0), (1, 1), (1, 2), (1, 3)]        # the upper half of the layers
    cross = m.decoder.cross(rows)
    try:
        m.decoder.fill_cross(cross, 2)
        cost = word_timing.alignment_cost(m.decoder.cross_scores(cross, tokens, heads), 3000)
    finally:
        m.decoder.release_cross(cross)
    att = _theirs_cross(theirs, rows, tokens)
    w = torch.from_numpy(np.stack([att[l][h] for l, h in heads]))[None]       # [1, heads, tokens, rows]
    w = (w - w.mean(dim=-2, keepdim=True)) / w.std(dim=-2, keepdim=True, unbiased=False)
    want = gw._median_filter(w, 7).mean(dim=1)[0].numpy()
    np.testing.assert_allclose(cost, want, atol=2e-4)


def test_alignment_heads_from_the_settings_or_the_upper_half():
    assert word_timing.alignment_heads({"alignment_heads": [[1, 2], [0, 1], [1, 2]]}, 2, 4) == [(0, 1), (1, 2)]
    for bad in ([[2, 0]], [[0, 9]], [["a", 1]], [[1]], "x"):       # beyond the model, or not pairs
        assert word_timing.alignment_heads({"alignment_heads": bad}, 2, 4) == [(1, h) for h in range(4)]
    assert word_timing.alignment_heads({}, 5, 2) == [(2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (4, 1)]
    assert word_timing.openai_heads(6, 512, 51865, 80) == [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4),
                                                           (5, 6)]


def test_words_cover_each_segment_and_the_numpy_decoder_agrees(models):
    """Word timestamps on short and long audio (two windows, the second seeking from the first's last
    word): the words in order, within the audio, holding the text tokens; the compiled decoder's
    words are the NumPy reference's."""
    _, _, ours = models
    opts = TranscribeOptions(language="en", temperature=0.0, compression_ratio_threshold=None, logprob_threshold=None,
                             word_timestamps=True)
    for seconds in (9.0, 41.0):
        x = speechy(seconds, seed=3)
        got = ours["compiled"].transcribe(x, opts)
        ref = ours["numpy"].transcribe(x, opts)
        assert got.segments and [s.tokens for s in got.segments] == [s.tokens for s in ref.segments]
        words = [w for s in got.segments for w in s.words]
        assert words and [(w.word, w.start, w.end) for w in words] == \
            [(w.word, w.start, w.end) for s in ref.segments for w in s.words]
        eot = ours["compiled"].eot
        # the words hold the text tokens in order (a word across a segment boundary is the first one's;
        # an instantaneous segment is dropped with its words, so its neighbour's may miss a few)
        held, text = sum((w.tokens for w in words), []), [t for s in got.segments for t in s.tokens if t < eot]
        it = iter(text)
        assert all(t in it for t in held) and len(held) >= 0.9 * len(text)
        assert all(s.start != s.end and s.text.strip() for s in got.segments)
        for w in words:
            assert 0.0 <= w.start <= w.end <= seconds + 0.02
        assert all(a.start <= b.start for a, b in zip(words, words[1:]))


def test_word_split_and_punctuation():
    """split_to_word_tokens groups at spaces and keeps multi-byte characters whole; punctuation joins
    its neighbour (openai-whisper's rules), emptied entries left in place."""
    vocab = {1: " Hel", 2: "lo", 3: ",", 4: " (", 5: "world", 6: ")", 7: " caf", 8: "\xc3", 9: "\xa9", 10: "!"}
    eot = 100

    def decode(ids):
        raw = b"".join(vocab[i].encode("latin-1") if i < eot else b"<|endoftext|>" for i in ids)
        return raw.decode("utf-8", errors="replace")
    words, toks = word_timing.split_to_word_tokens(decode, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, eot], eot, "en")
    assert words == [" Hello", ",", " (world", ")", " café", "!", "<|endoftext|>"]
    assert toks == [[1, 2], [3], [4, 5], [6], [7, 8, 9], [10], [eot]]
    zh, _ = word_timing.split_to_word_tokens(decode, [7, 8, 9, 10, eot], eot, "zh")
    assert zh == [" caf", "é", "!", "<|endoftext|>"]
    timing = [word_timing.WordTiming(w, t, float(i), float(i) + 0.5) for i, (w, t) in
              enumerate(zip([" (", "Hi", ",", " there", "!"], [[4], [1], [3], [7], [10]]))]
    word_timing.merge_punctuations(timing)
    assert [(t.word, t.tokens) for t in timing] == [("", []), (" (Hi,", [4, 1, 3]), ("", []), (" there!", [7, 10]),
                                                    ("", [])]


# ---- against faster-whisper (CTranslate2's align) --------------------------------------------------

@pytest.fixture(scope="module")
def ct2(models, tmp_path_factory):
    pytest.importorskip("faster_whisper")
    from ctranslate2.converters import TransformersConverter
    path = models[0]
    out = tmp_path_factory.mktemp("ct2") / "model"
    TransformersConverter(str(path), copy_files=["tokenizer.json"]).convert(str(out), quantization="float32")
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer
    from tokenizers import Tokenizer as HFTokenizer
    model = ctranslate2.models.Whisper(str(out), device="cpu", compute_type="float32")
    return model, Tokenizer(HFTokenizer.from_file(str(path / "tokenizer.json")), True, "transcribe", "en")


@pytest.mark.peers
def test_words_and_times_are_faster_whispers(models, ct2):
    """The same text tokens over the same encoder rows: the words, their tokens and their start
    and end times are faster-whisper's (its find_alignment: CTranslate2's align, then its word
    split), then after the punctuation merge and the clamps (its add_word_timestamps) too."""
    import ctranslate2
    from faster_whisper.transcribe import WhisperModel as FW
    _, _, ours = models
    m = ours["compiled"]
    ct, tok = ct2
    x, rows, _ = _rows_and_tokens(m, 20.0)
    # text to align (the random model's own is bytes that are not UTF-8, whose tail openai-whisper's
    # split, and so faster-whisper's, drops): words, punctuation, two-byte characters
    text = m.tokenizer.encode(" Hello there, this is a (small) test of the café's words! \"Yes\" - said Zoë.",
                              add_special_tokens=False)
    frames = x.shape[0] // 160
    cross = m.decoder.cross(rows)
    try:
        m.decoder.fill_cross(cross, 2)
        mine = m.align_words(cross, text, "en", "transcribe", frames)
    finally:
        m.decoder.release_cross(cross)
    fw = FW.__new__(FW)             # find_alignment and add_word_timestamps read these alone
    fw.model, fw.tokens_per_second, fw.frames_per_second = ct, 50, 100
    enc = ctranslate2.StorageView.from_array(np.ascontiguousarray(rows[None], np.float32))
    theirs = fw.find_alignment(tok, [text], enc, frames)[0]
    assert [(w.word, w.tokens) for w in mine] == [(w["word"], w["tokens"]) for w in theirs]
    np.testing.assert_allclose([(w.start, w.end) for w in mine], [(w["start"], w["end"]) for w in theirs], atol=0.021)
    exact = np.mean([(a.start, a.end) == (b["start"], b["end"]) for a, b in zip(mine, theirs)])
    assert exact > 0.8, exact
    # the clamps and merges on the same alignment: two segments of the window's text
    cut = len(text) // 2

    class Seg:
        def __init__(self, start, end):
            self.start, self.end, self.words = start, end, None
    segs = [Seg(0.4, 6.0), Seg(6.0, frames / 100)]
    fw_segs = [[{"seek": 0, "start": 0.4, "end": 6.0, "tokens": text[:cut]},
                {"seek": 0, "start": 6.0, "end": frames / 100, "tokens": text[cut:]}]]
    fw.find_alignment = lambda *a, **k: [[{"word": w.word, "tokens": list(w.tokens), "start": w.start, "end": w.end,
                                           "probability": 1.0} for w in mine]]
    last = fw.add_word_timestamps(fw_segs, tok, enc, frames, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、", 0.0)
    my_last = word_timing.add_word_timestamps(segs, [text[:cut], text[cut:]], mine, 0.0, 0.0)
    for s, f in zip(segs, fw_segs[0]):       # theirs unrounded where a clamp moved a time, ours to the ms
        assert [w.word for w in s.words] == [w["word"] for w in f["words"]]
        np.testing.assert_allclose([(w.start, w.end) for w in s.words], [(w["start"], w["end"]) for w in f["words"]],
                                   atol=5e-4)
        np.testing.assert_allclose((s.start, s.end), (f["start"], f["end"]), atol=5e-4)
    assert my_last == pytest.approx(last, abs=5e-4)
