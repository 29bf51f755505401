"""Whisper's decoder against transformers' WhisperForConditionalGeneration on tiny random
checkpoints: the NumPy reference and the compiled step (fp32 logits within 1e-4), several requests
of different lengths in one step, prefill then token by token, greedy tokens identical, and states
sharing one window's cross K/V filled in slices."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lite_llm import _kernels
from lite_llm.multimodal.whisper import WhisperEncoder
from lite_llm.multimodal.whisper_decoder import WhisperDecoder, WhisperError
from whisper_checkpoint import whisper_asr_checkpoint

VARIANTS = _kernels.available()


@pytest.fixture(scope="module")
def setup():
    """(path, transformers' model, encoder rows of two windows [2, 1500, C])."""
    from transformers import WhisperForConditionalGeneration
    path = whisper_asr_checkpoint()
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    feats = rng.uniform(-1, 1, (2, 80, 3000)).astype(np.float32)
    with torch.no_grad():
        rows = model.model.encoder(torch.from_numpy(feats)).last_hidden_state.numpy()
    return path, model, rows


def _theirs(model, rows, tokens) -> np.ndarray:
    """transformers' logits [n, V] of tokens over encoder rows [T, C]."""
    with torch.no_grad():
        out = model(encoder_outputs=(torch.from_numpy(rows[None]),),
                    decoder_input_ids=torch.tensor([tokens]))
    return out.logits[0].numpy()


PROMPTS = [[257, 258, 267, 271], [257, 260, 266, 271, 65, 66, 67, 32, 200]]   # sot, language, task, notimestamps


def _decoders(path):
    yield "reference", WhisperDecoder.from_pretrained(str(path), kernels=None)
    for v in VARIANTS:
        yield v, WhisperDecoder.from_pretrained(str(path), kernels=_kernels.load(v), num_threads=2, max_requests=4)


def test_logits_match_transformers(setup):
    path, model, rows = setup
    theirs = [_theirs(model, rows[i], PROMPTS[i]) for i in range(2)]
    for name, dec in _decoders(path):
        a, b = dec.start(rows[0]), dec.start(rows[1])
        got = dec.step([a, b], PROMPTS)                 # two prompts of different lengths: one step
        for i in range(2):
            np.testing.assert_allclose(got[i], theirs[i][-1], atol=1e-4, rtol=1e-4, err_msg=name)
        # then token by token, the requests interleaved with different lengths
        seqs = [list(PROMPTS[0]), list(PROMPTS[1])]
        for extra in ([70, 71], [72, 73], [74, 75]):
            got = dec.step([a, b], [[extra[0]], [extra[1]]])
            for i in range(2):
                seqs[i].append(extra[i])
                np.testing.assert_allclose(got[i], _theirs(model, rows[i], seqs[i])[-1], atol=1e-4, rtol=1e-4,
                                           err_msg=name)
        dec.release(a)
        dec.release(b)


def test_shorter_encoder_rows_and_fork(setup):
    """A request over fewer encoder rows (cross-attention reads only them) and a forked state."""
    path, model, rows = setup
    short = rows[0][:700]
    for name, dec in _decoders(path):
        st = dec.start(short)
        dec.step([st], [PROMPTS[0]])
        twin = dec.fork(st)
        got = dec.step([st, twin], [[80], [81]])
        np.testing.assert_allclose(got[0], _theirs(model, short, PROMPTS[0] + [80])[-1], atol=1e-4, rtol=1e-4,
                                   err_msg=name)
        np.testing.assert_allclose(got[1], _theirs(model, short, PROMPTS[0] + [81])[-1], atol=1e-4, rtol=1e-4,
                                   err_msg=name)


def test_forks_share_full_blocks_and_copy_the_last(setup):
    """A fork shares its parent's full self-attention blocks (ref counted) and copies only the partly
    filled last one; parent and forks then write only blocks of their own, across block
    boundaries, and each one's logits stay transformers' for its own tokens; released, every block
    is back in the pool. Forks of forks, a fork at a whole number of blocks, a parent released
    while its forks run on."""
    path, model, rows = setup
    r = rows[1]
    for name, dec in _decoders(path):
        if dec.kernels is None:
            continue
        pool = len(dec.free_blocks)
        a = dec.start(r)
        prefix = PROMPTS[1] + list(range(70, 93))            # 32 tokens: two whole blocks
        dec.step([a], [prefix[:20]])
        b = dec.fork(a)                                      # 20 tokens: block 0 shared, block 1 copied
        assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
        assert dec.block_refs[a.blocks[0]] == 2 and dec.block_refs[a.blocks[1]] == 1
        seqs = {id(a): prefix[:20], id(b): prefix[:20]}
        states = [a, b]
        for step in range(14):                               # through the end of block 1 and into block 2
            toks = [[100 + 3 * step + i] for i in range(len(states))]
            got = dec.step(states, toks)
            for st, t, g in zip(states, toks, got):
                seqs[id(st)] = seqs[id(st)] + t
                np.testing.assert_allclose(g, _theirs(model, r, seqs[id(st)])[-1], atol=1e-4, rtol=1e-4,
                                           err_msg=f"{name} step {step}")
            if step == 11:                                   # b holds 32 tokens: two whole blocks, both shared
                c = dec.fork(b)
                assert c.blocks == b.blocks and len(b.tokens) == 32
                seqs[id(c)] = list(seqs[id(b)])
                states.append(c)
            if step == 12:
                dec.release(a)                               # b and c run on over the blocks a shared
                states.remove(a)
        assert len({blk for st in states for blk in st.blocks[2:]}) == 2 * len(states[0].blocks[2:])
        for st in states:
            dec.release(st)
        assert len(dec.free_blocks) == pool and not dec.block_refs.any(), name


def test_greedy_tokens_identical(setup):
    """Greedy decoding from the prompt: the same tokens as transformers' generate without logits
    processors (its Whisper processors are the decoding module's, tested there)."""
    path, model, rows = setup
    from transformers import GenerationConfig, GenerationMixin
    from transformers.modeling_outputs import BaseModelOutput
    with torch.no_grad():       # the generic greedy loop (Whisper's generate adds its processors)
        out = GenerationMixin.generate(model, encoder_outputs=BaseModelOutput(torch.from_numpy(rows[:1])),
                             decoder_input_ids=torch.tensor([PROMPTS[0]]),
                             generation_config=GenerationConfig(max_new_tokens=40, do_sample=False, eos_token_id=256,
                                                                pad_token_id=256, decoder_start_token_id=257))
    theirs = out[0].tolist()[len(PROMPTS[0]):]
    for name, dec in _decoders(path):
        st = dec.start(rows[0])
        logits = dec.step([st], [PROMPTS[0]])
        ours = []
        while len(ours) < 40:
            tok = int(np.argmax(logits[0]))
            ours.append(tok)
            if tok == 256:
                break
            logits = dec.step([st], [[tok]])
        assert ours == theirs, name
        assert len(set(ours)) > 3        # the output is not one token repeated


def test_bounds():
    path = whisper_asr_checkpoint()
    dec = WhisperDecoder.from_pretrained(str(path), num_threads=1, max_requests=1)
    rows = np.zeros((10, 64), np.float32)
    st = dec.start(rows)
    with pytest.raises(WhisperError, match="at once"):
        dec.start(rows)
    with pytest.raises(WhisperError, match="vocabulary"):
        dec.step([st], [[5000]])
    with pytest.raises(WhisperError, match="holds 1 to 448"):
        dec.step([st], [[1] * 449])
    dec.release(st)
    dec.release(dec.start(rows))            # the slot is free again


@pytest.mark.parametrize("dtype,quantization", [("float32", None), ("bfloat16", None), ("float32", "q8_0")])
def test_a_request_gets_the_same_logits_batched_or_alone(setup, dtype, quantization):
    """The transcription engine steps several requests together: each one's logits (a prompt's
    prefill, then token by token) are the same bits as when it runs alone, for fp32 and bf16
    weights and Q8_0 blocks, with a team of 4 threads."""
    path, _, rows = setup
    dec = WhisperDecoder.from_pretrained(str(path), dtype=dtype, quantization=quantization, num_threads=4,
                                         max_requests=3)
    rng = np.random.default_rng(1)
    windows = [rows[0], rows[1], rows[0][:700]]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][:2]]
    nexts = rng.integers(0, 250, (6, 3))
    alone = []
    for w, prompt, col in zip(windows, prompts, nexts.T):
        st = dec.start(w)
        alone.append([dec.step([st], [prompt])[0]] + [dec.step([st], [[int(t)]])[0] for t in col])
        dec.release(st)
    states = [dec.start(w) for w in windows]
    together = [dec.step(states, prompts)] + [dec.step(states, [[int(t)] for t in row]) for row in nexts]
    for i in range(3):
        for n in range(len(together)):
            np.testing.assert_array_equal(together[n][i], alone[i][n], err_msg=f"request {i}, step {n}")


@pytest.mark.parametrize("dtype,quantization", [("float32", None), ("bfloat16", None), ("float32", "q8_0")])
def test_a_step_gives_the_same_bits_on_any_number_of_threads(setup, monkeypatch, dtype, quantization):
    """A decoder step is one parallel region whose every value one thread computes: teams of 1,
    2 and 3 threads (every step shared: no serial floor) give the same logits, one request or
    three of different lengths in a step, prefill then token by token."""
    import lite_llm.multimodal.whisper_decoder as wd
    monkeypatch.setattr(wd, "SERIAL_WORK", 0)
    path, _, rows = setup
    windows = [rows[0], rows[1], rows[0][:700]]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][:2]]
    nexts = np.random.default_rng(2).integers(0, 250, (5, 3))
    runs = []
    for nt in (1, 2, 3):
        dec = WhisperDecoder.from_pretrained(str(path), dtype=dtype, quantization=quantization, num_threads=nt,
                                             max_requests=4)
        one = dec.start(rows[1])
        out = [dec.step([one], [PROMPTS[1]])] + [dec.step([one], [[int(t)]]) for t in nexts[:, 0]]
        states = [dec.start(w) for w in windows]
        out += [dec.step(states, prompts)] + [dec.step(states, [[int(t)] for t in row]) for row in nexts]
        runs.append(out)
    for nt, run in zip((2, 3), runs[1:]):
        for n, (got, want) in enumerate(zip(run, runs[0])):
            np.testing.assert_array_equal(got, want, err_msg=f"{nt} threads, step {n}")


def test_the_compiled_layers_check_their_arrays():
    """whisper_decoder_step (a whole step in one call) refuses a slot, position or block
    outside its caches with a ValueError instead of writing past them."""
    dec = WhisperDecoder.from_pretrained(str(whisper_asr_checkpoint()), num_threads=1, max_requests=1)
    k, C = dec.kernels, dec.cfg.hidden_size
    good = dict(x=np.zeros((1, C), np.float32), slots=np.zeros(1, np.int64),
                self_tables=np.zeros((1, dec.self_blocks), np.int32), cross_tables=np.zeros((1, dec.cross_blocks), np.int32),
                tok_seq=np.zeros(1, np.int32), positions=np.zeros(1, np.int32), cross_last=np.zeros(1, np.int32),
                last_rows=np.zeros(1, np.int64), logits=np.zeros((1, dec.cfg.vocab_size), np.float32))

    def run(**change):
        a = {**good, **change}
        k.whisper_decoder_step(dec.layers, a["x"], a["slots"], a["self_tables"], a["cross_tables"], a["tok_seq"],
                               a["positions"], a["cross_last"], a["last_rows"], a["logits"], 1)
    run()
    for change in (dict(slots=np.full(1, dec.self_blocks * 16, np.int64)), dict(slots=np.full(1, -1, np.int64)),
                   dict(positions=np.full(1, dec.self_blocks * 16, np.int32)), dict(tok_seq=np.ones(1, np.int32)),
                   dict(cross_last=np.full(1, dec.cross_blocks * 16, np.int32)),
                   dict(self_tables=np.full((1, dec.self_blocks), dec.self_blocks, np.int32)),
                   dict(cross_tables=np.full((1, dec.cross_blocks), -1, np.int32)),
                   dict(x=np.zeros((1, C + 1), np.float32)), dict(slots=np.zeros(2, np.int64)),
                   dict(last_rows=np.ones(1, np.int64)), dict(logits=np.zeros((1, 3), np.float32))):
        with pytest.raises(ValueError, match="whisper_decoder_step"):
            run(**change)


def test_bf16_weights_are_close(setup):
    path, model, rows = setup
    dec = WhisperDecoder.from_pretrained(str(path), dtype="bfloat16", num_threads=2, max_requests=1)
    st = dec.start(rows[0])
    got = dec.step([st], [PROMPTS[0]])[0]
    want = _theirs(model, rows[0], PROMPTS[0])[-1]
    # bf16 weights: 8 bits of mantissa through 2 blocks; the ranking of the top logits holds
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_q8_0_at_load_is_close(setup):
    """quantization="q8_0": every matrix of the HF checkpoint but conv1 (3 x 80 columns) quantized
    at load to Q8_0 blocks (the int8 GEMMs), the encoder's attention in bf16, the decoder's K/V
    blocks in int8 rows (or bf16 when asked): encoder rows and logits, token after token, within
    the tolerances of a Q8_0 whisper.cpp file (test_whisper_ggml.py: ENC_TOL, DEC_TOL of the
    largest magnitude), the greedy token the same."""
    from test_whisper_ggml import DEC_TOL, ENC_TOL
    path, model, rows = setup
    feats = np.random.default_rng(1).uniform(-1, 1, (80, 3000)).astype(np.float32)
    with torch.no_grad():
        want_rows = model.model.encoder(torch.from_numpy(feats[None])).last_hidden_state.numpy()[0]
    enc = WhisperEncoder.from_pretrained(str(path), num_threads=2, quantization="q8_0")
    got_rows = enc.encode(feats)
    assert np.abs(got_rows - want_rows).max() / np.abs(want_rows).max() < ENC_TOL
    for kv, dtype in ((None, np.int8), ("bfloat16", np.uint16)):
        dec = WhisperDecoder.from_pretrained(str(path), num_threads=2, max_requests=1, quantization="q8_0",
                                             kv_cache_dtype=kv)
        assert {m[3] for m in dec.mats.values()} == {"Q8_0"}
        assert dec.k_cross[0].dtype == dec.k_self[0].dtype == dtype
        st = dec.start(rows[0])
        seq = list(PROMPTS[0])
        got = dec.step([st], [seq])[0]
        for _ in range(6):
            want = _theirs(model, rows[0], seq)[-1]
            print(f"K/V {dec.kv_dtype}: |logit error| / max |logit| {np.abs(got - want).max() / np.abs(want).max():.4f}")
            assert np.abs(got - want).max() / np.abs(want).max() < DEC_TOL
            assert int(np.argmax(got)) == int(np.argmax(want))
            seq.append(int(np.argmax(want)))
            got = dec.step([st], [[seq[-1]]])[0]
        dec.release(st)
    with pytest.raises(WhisperError, match="kv_cache_dtype 'fp8_e4m3'"):
        WhisperDecoder.from_pretrained(str(path), num_threads=2, quantization="q8_0", kv_cache_dtype="fp8_e4m3")


def test_states_started_on_a_cross_kv_filled_in_slices(setup):
    """cross + fill_cross a layer at a time: the states started on it (two at once, then one after
    the first is released: a language detection, then a fallback's retry) step the logits of a
    state started on the rows, bit for bit; the cross slot is held until it and they are released,
    and nothing starts on K/V not yet filled."""
    path, _, rows = setup
    for name, dec in _decoders(path):
        free = (len(dec.free_slots), len(dec.free_cross))
        st = dec.start(rows[0])
        want = [dec.step([st], [PROMPTS[0]])[0], dec.step([st], [[70]])[0]]
        dec.release(st)
        cross = dec.cross(rows[0])
        assert cross.layers == 0 and dec.cfg.num_layers == 2
        with pytest.raises(WhisperError, match="filled"):
            dec.start(cross)
        assert dec.fill_cross(cross, 1) is False and cross.layers == 1
        assert dec.fill_cross(cross, 1) is True and cross.layers == 2
        a, b = dec.start(cross), dec.start(cross)
        for st in (a, b):
            assert st.cross_slot == cross.slot
        got = dec.step([a, b], [PROMPTS[0], PROMPTS[0]])
        got2 = dec.step([a, b], [[70], [70]])
        for i in range(2):
            np.testing.assert_array_equal(got[i], want[0], err_msg=name)
            np.testing.assert_array_equal(got2[i], want[1], err_msg=name)
        dec.release(a)
        dec.release(b)
        c = dec.start(cross)
        np.testing.assert_array_equal(dec.step([c], [PROMPTS[0]])[0], want[0], err_msg=name)
        dec.release_cross(cross)                    # c still reads the K/V
        np.testing.assert_array_equal(dec.step([c], [[70]])[0], want[1], err_msg=name)
        if dec.kernels is not None:
            assert len(dec.free_cross) == free[1] - 1
        dec.release(c)
        assert (len(dec.free_slots), len(dec.free_cross)) == free, name
        with pytest.raises(WhisperError, match="released"):
            dec.fill_cross(cross, 1)
