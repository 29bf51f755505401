"""whisper.cpp's model files (whisper_ggml.py), written from the format's definition
(whisper_ggml_files.py) from a tiny random HF Whisper numbered as the released ones: the F16 file
gives transformers' encoder output and fp32 logits within 1e-4 and the HF path's greedy and
beam-search tokens; quantized files (Q8_0, Q5_0, Q5_1, Q4_0) stay within a stated tolerance of the
reference over their dequantized weights; the tokenizer and generation settings rebuilt from the
file equal the HF checkpoint's; LLM(), the CLI and `serve` take the file; damaged files are one
clear line."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lite_llm import LLM, _kernels
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.multimodal import whisper_ggml
from lite_llm.multimodal.transcribe import TranscribeOptions, WhisperModel
from lite_llm.multimodal.whisper import WhisperError
from test_whisper_offline import wav_bytes
from test_whisper_transcribe import speechy
from whisper_ggml_files import N_TEXT, whisper_ggml_checkpoint, write_ggml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = _kernels.available()
PROMPT = [N_TEXT + 1, N_TEXT + 2, N_TEXT + 2 + 99 + 2, N_TEXT + 2 + 99 + 6]    # sot, <|en|>, transcribe, notimestamps
# quantized files against the plain reference over their own dequantized weights, as a fraction of
# the reference's largest magnitude: the block GEMMs quantize activations to int8 blocks too, which
# dominates (Q8_0 and Q5_0 measure alike: encoder ~0.013, decoder logits ~0.035 on this model,
# whose decoder weights are large, std 0.3)
ENC_TOL, DEC_TOL = 0.03, 0.07
QTYPES = ("Q8_0", "Q5_0", "Q5_1", "Q4_0")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    hf = whisper_ggml_checkpoint()
    d = tmp_path_factory.mktemp("ggml")
    return hf, {t: write_ggml(hf, d / f"ggml-tiny-{t.lower()}.bin", t) for t in ("F16", "F32") + QTYPES}


@pytest.fixture(scope="module")
def theirs(files):
    from transformers import WhisperForConditionalGeneration
    return WhisperForConditionalGeneration.from_pretrained(files[0], dtype=torch.float32).eval()


def _features(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (80, 3000)).astype(np.float32)


def test_header_and_stored_types(files):
    _, paths = files
    f = whisper_ggml.GGMLWhisperFile(str(paths["Q5_0"]))
    assert f.hparams["n_vocab"] == 51865 and f.hparams["ftype"] == 2008 and f.ftype == "Q5_0"
    assert len(f.vocab) == N_TEXT and f.filters.shape == (80, 201)
    types = {n: e.type_name for n, e in f.tensors.items()}
    assert types["encoder.conv1.weight"] == "F16" and types["encoder.conv1.bias"] == "F32"
    assert types["encoder.positional_embedding"] == "F32" and types["decoder.token_embedding.weight"] == "Q5_0"
    assert types["decoder.blocks.1.cross_attn.key.weight"] == "Q5_0" and types["decoder.ln.bias"] == "F32"
    f16 = whisper_ggml.GGMLWhisperFile(str(paths["F16"]))
    assert f16.ftype == "F16" and f16.tensors["encoder.blocks.0.mlp.0.weight"].type_name == "F16"


@pytest.mark.parametrize("variant", VARIANTS)
def test_f16_file_matches_transformers(files, theirs, variant):
    """Encoder rows and fp32 decoder logits within 1e-4 of transformers (the HF model's weights
    are float16 values, so the F16 file holds the same model), matrices run as F16 panels."""
    _, paths = files
    enc, dec, _, _ = whisper_ggml.load(str(paths["F16"]), kernels=_kernels.load(variant), num_threads=2)
    assert {m[3] for m in dec.mats.values()} == {"float16"}
    feats = np.stack([_features(0), _features(1)])
    with torch.no_grad():
        rows = theirs.model.encoder(torch.from_numpy(feats)).last_hidden_state.numpy()
    got = enc.encode_many(list(feats))
    for g, t in zip(got, rows):
        np.testing.assert_allclose(g, t, atol=1e-4, rtol=1e-4)
    st = dec.start(rows[0])
    seq = PROMPT + [300, 301, 4000]
    logits = dec.step([st], [seq[:4]])[0]
    with torch.no_grad():
        want = theirs(encoder_outputs=(torch.from_numpy(rows[0][None]),),
                      decoder_input_ids=torch.tensor([seq])).logits[0].numpy()
    np.testing.assert_allclose(logits, want[3], atol=1e-4, rtol=1e-4)
    for i in range(4, len(seq)):
        np.testing.assert_allclose(dec.step([st], [[seq[i]]])[0], want[i], atol=1e-4, rtol=1e-4)
    dec.release(st)


def test_f32_file_reads_as_the_checkpoint(files):
    """The F32 file's tensors equal the HF checkpoint's (names mapped as whisper.cpp's converter does)."""
    hf, paths = files
    from lite_llm.multimodal import whisper as w, whisper_decoder as wd
    f = whisper_ggml.GGMLWhisperFile(str(paths["F32"]))
    ecfg, dcfg = f.encoder_config(), f.decoder_config()
    ours_e = whisper_ggml.dense(whisper_ggml.read_encoder(f, ecfg))
    ours_d = whisper_ggml.dense(whisper_ggml.read_decoder(f, dcfg))
    raw = json.loads((hf / "config.json").read_text())
    ref_e = w.read_hf(str(hf), w.WhisperEncoderConfig.from_hf(raw))
    ref_d = wd.read_hf(str(hf), wd.WhisperDecoderConfig.from_hf(raw))
    for ours, ref in ((ours_e, ref_e), (ours_d, ref_d)):
        assert ours.keys() == ref.keys()
        for k in ref:
            np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)


@pytest.mark.parametrize("qtype", QTYPES)
def test_quantized_files_within_tolerance(files, qtype):
    """Q8_0 / Q5_0 / Q5_1 / Q4_0 matrices run as stored blocks: encoder rows and logits within ENC_TOL /
    DEC_TOL (of the reference's largest magnitude) of the NumPy reference over the file's
    dequantized weights, token after token."""
    _, paths = files
    enc, dec, _, _ = whisper_ggml.load(str(paths[qtype]), num_threads=2)
    assert {m[3] for n, m in dec.mats.items()} == {qtype}
    r_enc, r_dec, _, _ = whisper_ggml.load(str(paths[qtype]), kernels=None)
    feats = _features(2)
    ref_rows = r_enc.encode(feats)
    rows = enc.encode(feats)
    err = np.abs(rows - ref_rows).max() / np.abs(ref_rows).max()
    assert err < ENC_TOL, err
    a, b = dec.start(ref_rows), r_dec.start(ref_rows)
    la, lb = dec.step([a], [PROMPT])[0], r_dec.step([b], [PROMPT])[0]
    for _ in range(6):
        err = np.abs(la - lb).max() / np.abs(lb).max()
        assert err < DEC_TOL, err
        tok = int(np.argmax(lb))
        la, lb = dec.step([a], [[tok]])[0], r_dec.step([b], [[tok]])[0]
    dec.release(a)


def test_tokenizer_and_generation_settings_equal_the_checkpoints(files):
    hf, paths = files
    enc, dec, tok, gen = whisper_ggml.load(str(paths["Q8_0"]), kernels=None)
    ref = Tokenizer.from_dir(str(hf))
    for text in ("the cat sat on a mat", " hello, world!", "naïve café — 東京 ♪♪", "<<a>> ((b)) --- q'x"):
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    ids = ref.encode(" the end of the tape", add_special_tokens=False)
    assert tok.decode(ids) == ref.decode(ids) == " the end of the tape"
    want = json.loads((hf / "generation_config.json").read_text())
    for key in ("decoder_start_token_id", "eos_token_id", "lang_to_id", "task_to_id", "no_timestamps_token_id",
                "prev_sot_token_id", "max_initial_timestamp_index", "begin_suppress_tokens", "suppress_tokens",
                "is_multilingual"):
        assert gen[key] == want[key], key
    assert tok.token_to_id("<|notimestamps|>") == want["no_timestamps_token_id"]


def test_merges_from_ranks_are_tiktokens():
    # " the": th (rank 256) first, then the (258), leaving " " + "the" (" t", 259, never gets its turn)
    vocab = [bytes([b]) for b in range(256)] + [b"th", b"he", b"the", b" t", b" the", b"ab", b"abc"]
    merges = whisper_ggml.merges_from_ranks(vocab)
    assert merges == [(b"t", b"h"), (b"h", b"e"), (b"th", b"e"), (b" ", b"t"), (b" ", b"the"), (b"a", b"b"),
                      (b"ab", b"c")]


@pytest.mark.parametrize("beam_size", [None, 3])
def test_transcripts_equal_the_hf_path(files, beam_size):
    """Greedy and beam-search transcription (timestamps, two windows) from the F16 file: the HF
    checkpoint's tokens, segments and text."""
    hf, paths = files
    x = speechy(37.0, seed=3)
    opts = TranscribeOptions(language="en", temperature=0.0, compression_ratio_threshold=None, logprob_threshold=None,
                             timestamps=True, beam_size=beam_size, max_new_tokens=40)
    want = WhisperModel.from_pretrained(str(hf), num_threads=2).transcribe(x, opts)
    got = WhisperModel.from_pretrained(str(paths["F16"]), num_threads=2).transcribe(x, opts)
    assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
    assert [(s.start, s.end) for s in got.segments] == [(s.start, s.end) for s in want.segments]
    assert got.text == want.text and len(want.segments) >= 2


def test_llm_and_cli_take_the_file(files, tmp_path):
    hf, paths = files
    x = speechy(12.0, seed=4)
    llm = LLM(model=str(paths["Q8_0"]))
    assert llm.runner_type == "transcription"
    r = llm.transcribe(x, language="en", temperature=0.0)
    ref = WhisperModel.from_pretrained(str(paths["Q8_0"])).transcribe(
        x, TranscribeOptions(language="en", temperature=0.0))
    assert r.text == ref.text and r.segments[0].tokens == ref.segments[0].tokens
    wav = tmp_path / "clip.wav"
    wav.write_bytes(wav_bytes(x))
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "lite_llm", "transcribe", str(wav), "--model", str(paths["Q8_0"]),
                          "--language", "en", "--temperature", "0", "--format", "json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["text"] == llm.transcribe(str(wav), language="en", temperature=0.0).text.strip()


def test_serve_takes_the_file(files):
    from lite_llm.server import app
    from lite_llm.server.startup import build_server, start_engine
    from tests.server.conftest import request
    _, paths = files
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    args = p.parse_args([str(paths["Q5_0"]), "--port", "0", "--host", "127.0.0.1"])
    engine, tokenizer, info = start_engine(args)
    srv = build_server(args, engine, tokenizer, info)
    srv.start()
    try:
        boundary = "xx-boundary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nggml-tiny-q5_0.bin\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
                f"Content-Type: audio/wav\r\n\r\n").encode() + wav_bytes(speechy(5.0, seed=5)) + \
            f"\r\n--{boundary}--\r\n".encode()
        status, _, data = request(srv.server_address[1], "POST", "/v1/audio/transcriptions", raw=body,
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert status == 200, data
        assert "text" in json.loads(data)
        assert info["runner"] == "transcription"
    finally:
        srv.drain(5.0)
        engine.shutdown()


def test_damaged_files_are_one_clear_line(files, tmp_path):
    _, paths = files
    raw = paths["Q8_0"].read_bytes()
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes(b"GGJT" + raw[4:])
    cut = tmp_path / "cut.bin"
    cut.write_bytes(raw[:len(raw) * 2 // 3])
    head = tmp_path / "head.bin"
    head.write_bytes(raw[:30])
    for path, words in ((wrong, "not a whisper.cpp model file"), (cut, "truncated whisper.cpp model file"),
                        (head, "truncated whisper.cpp model file")):
        with pytest.raises(WhisperError) as e:
            WhisperModel.from_pretrained(str(path))
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(WhisperError, match="truncated"):
        LLM(model=str(cut))
    with pytest.raises(ValueError, match="whisper.cpp model file") as e:
        LLM(model=str(wrong))
    assert "\n" not in str(e.value)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "lite_llm", "transcribe", "x.wav", "--model", str(cut)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "truncated whisper.cpp model file" in out.stderr.splitlines()[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("n_vocab,eot,translate,beg,langs", [(51864, 50256, 50357, 50363, 99),
                                                               (51865, 50257, 50358, 50364, 99),
                                                               (51866, 50257, 50359, 50365, 100)])
def test_special_ids_are_whisper_cpps(n_vocab, eot, translate, beg, langs):
    """whisper.cpp's whisper_vocab ids for English-only, multilingual and large-v3 vocabularies:
    eot/sot 50256/50257 (+1 multilingual), task and later tokens from 50357 shifted by the
    languages past 98 (multilingual), 1501 timestamps."""
    s = whisper_ggml.SpecialIds(n_vocab)
    ids = {n: s.eot + i for i, n in enumerate(s.names())}
    assert (s.eot, ids["<|startoftranscript|>"], ids["<|translate|>"], ids["<|0.00|>"]) == \
        (eot, eot + 1, translate, beg)
    assert s.num_languages == langs and len(ids) == n_vocab - eot and ids["<|30.00|>"] == n_vocab - 1
    assert ids["<|transcribe|>"] == translate + 1 and ids["<|notimestamps|>"] == beg - 1
    assert ids["<|en|>"] == eot + 2 and (ids.get("<|yue|>") == eot + 101) == (langs == 100)
