"""whisper.cpp itself (pywhispercpp's build of it) on the files the tests write as its converter
and quantizer do (whisper_ggml_files.py): it loads them (every tensor's name, type and shape as
its loader expects), and its special token ids and vocabulary are the ones whisper_ggml.py
derives; `lite-llm bench transcribe` runs every engine on the tiny model. The peers tier
(pip install -e '.[test-peers]')."""
from __future__ import annotations

import pytest

from lite_llm.multimodal import whisper_ggml
from whisper_ggml_files import N_TEXT, whisper_ggml_checkpoint, write_ggml

pytestmark = pytest.mark.peers
cpp = pytest.importorskip("_pywhispercpp")


@pytest.mark.parametrize("ftype", ["F16", "Q8_0", "Q5_0"])
def test_whisper_cpp_loads_the_files(tmp_path, ftype):
    path = write_ggml(whisper_ggml_checkpoint(), tmp_path / f"ggml-{ftype}.bin", ftype)
    ctx = cpp.whisper_init_from_file_with_params(str(path), cpp.whisper_context_default_params())
    assert ctx is not None, "whisper.cpp refused the file"
    try:
        f = whisper_ggml.GGMLWhisperFile(str(path))
        special = whisper_ggml.SpecialIds(f.hparams["n_vocab"])
        ids = {n: special.eot + i for i, n in enumerate(special.names())}
        assert cpp.whisper_n_vocab(ctx) == f.hparams["n_vocab"] and cpp.whisper_is_multilingual(ctx) == 1
        for fn, name in ((cpp.whisper_token_eot, "<|endoftext|>"), (cpp.whisper_token_sot, "<|startoftranscript|>"),
                         (cpp.whisper_token_translate, "<|translate|>"),
                         (cpp.whisper_token_transcribe, "<|transcribe|>"),
                         (cpp.whisper_token_solm, "<|startoflm|>"), (cpp.whisper_token_prev, "<|startofprev|>"),
                         (cpp.whisper_token_not, "<|notimestamps|>"), (cpp.whisper_token_beg, "<|0.00|>")):
            assert fn(ctx) == ids[name], name
        assert cpp.whisper_token_lang(ctx, 2) == ids["<|de|>"]
        # its vocabulary is the file's (tokens without a NUL byte: the binding returns C strings)
        for i in (1, 65, 300, 5000, N_TEXT - 1):
            if b"\x00" not in f.vocab[i]:
                assert cpp.whisper_token_to_bytes(ctx, i) == f.vocab[i]
    finally:
        cpp.whisper_free(ctx)


def test_bench_transcribe_runs_every_engine(tmp_path):
    """`lite-llm bench transcribe` through lite-llm, faster-whisper (int8, float32) and whisper.cpp
    on the tiny model, 35 s of audio (two windows): every engine's row complete, no errors."""
    from lite_llm.bench.transcribe import ENGINES
    from test_whisper_bench import check_rows, run_bench
    check_rows(run_bench(tmp_path, ",".join(ENGINES), lengths="35"), list(ENGINES), lengths=(35.0,))


def test_a_made_model_decodes_the_same_number_of_tokens_in_every_engine(tmp_path):
    """`bench transcribe --make-model` writes a talker (it never ends a window early) and the bench
    stops every engine at the same number of tokens a window by default, so their rates compare:
    lite-llm, faster-whisper and whisper.cpp decode the same count of text tokens (within 2 %:
    whisper.cpp stops a few tokens short of the others) over two windows of audio."""
    import json
    import os
    import subprocess
    import sys

    from test_whisper_bench import ROOT
    model = tmp_path / "tiny"
    env = dict(os.environ, PYTHONPATH=ROOT, HOME=str(tmp_path))
    made = subprocess.run([sys.executable, "-m", "lite_llm", "bench", "transcribe", "--make-model", "tiny", str(model)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert made.returncode == 0, made.stderr
    out = subprocess.run([sys.executable, "-m", "lite_llm", "bench", "transcribe", "--model", str(model), "--engines",
                          "lite-llm-q8_0,faster-whisper-int8,whisper.cpp", "--lengths", "35", "--streams", "1",
                          "--threads", "2", "--json"], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    tokens = {r["engine"]: r["tokens"] for r in json.loads(out.stdout)["results"]}
    assert min(tokens.values()) >= 400, tokens          # two windows of ~220 text tokens each
    assert max(tokens.values()) <= 1.02 * min(tokens.values()), tokens
