"""`lite-llm bench transcribe` on the tiny Whisper of whisper_ggml_files.py: lite-llm from the HF
directory and from the whisper.cpp file the bench writes of it, 1 and 2 streams, short and
two-window audio, every figure in its --json; the bench's whisper.cpp writer gives the file the
tests' writer (written from the format's definition) gives. The peers (faster-whisper, whisper.cpp)
run in test_whisper_cpp_peers.py (the peers tier)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lite_llm.multimodal.whisper_ggml import GGMLWhisperFile, StoredMatrix
from whisper_ggml_files import whisper_ggml_checkpoint, write_ggml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = ("load_s", "encoder_s", "wall_s", "rtf", "x_realtime", "tokens", "tok_s", "peak_rss_mib")


def run_bench(tmp_path, engines: str, lengths: str = "5,35") -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, HOME=str(tmp_path))        # conversions cached under this HOME
    out = subprocess.run([sys.executable, "-m", "lite_llm", "bench", "transcribe", "--model",
                          str(whisper_ggml_checkpoint()), "--engines", engines, "--lengths", lengths,
                          "--streams", "1,2", "--threads", "2", "--max-new-tokens", "8", "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def check_rows(result: dict, engines: list[str], lengths=(5.0, 35.0)) -> list[dict]:
    rows = result["results"]
    assert [(r["engine"], r["audio_s"], r["streams"]) for r in rows] == \
        [(e, s, n) for s in lengths for n in (1, 2) for e in engines]
    for r in rows:
        assert "error" not in r, r
        assert all(r[k] > 0 for k in FIGURES), r
        assert abs(r["rtf"] * r["x_realtime"] - 1) < 1e-9
        # 1 stream: the decoder's own rate, None when the window's encoder time (timed apart, on a
        # shared machine) exceeds the whole run's
        assert r["decode_tok_s"] is None if r["streams"] > 1 else r["decode_tok_s"] is None or \
            r["decode_tok_s"] > r["tok_s"]
    return rows


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_bench_runs_lite_llm_from_the_directory_and_the_file(tmp_path):
    rows = check_rows(run_bench(tmp_path, "lite-llm,lite-llm-ggml"), ["lite-llm", "lite-llm-ggml"])
    # the F16 file holds the directory's model (its weights are float16 values): the same tokens
    for a, b in zip(rows[0::2], rows[1::2]):
        assert a["tokens"] == b["tokens"]


def test_bench_runs_lite_llm_quantized_at_load(tmp_path):
    check_rows(run_bench(tmp_path, "lite-llm-q8_0", lengths="5"), ["lite-llm-q8_0"], lengths=(5.0,))


def test_the_bench_writes_the_converters_file(tmp_path):
    from lite_llm.bench import transcribe as bench
    hf = whisper_ggml_checkpoint()
    cache, bench.CACHE_DIR = bench.CACHE_DIR, str(tmp_path / ".cache")
    try:
        ours = GGMLWhisperFile(bench.ggml_model(str(hf)))
    finally:
        bench.CACHE_DIR = cache
    ref = GGMLWhisperFile(str(write_ggml(hf, tmp_path / "ref.bin", "F16")))
    assert ours.hparams == ref.hparams and ours.vocab == ref.vocab
    np.testing.assert_allclose(ours.filters, ref.filters, atol=1e-6)     # Slaney filters, two implementations
    assert ours.tensors.keys() == ref.tensors.keys()
    for name, e in ref.tensors.items():
        o = ours.tensors[name]
        assert (o.type_name, o.shape, o.nbytes) == (e.type_name, e.shape, e.nbytes), name
        a = StoredMatrix(ours.path, o.type_name, (1, o.nbytes), o.offset, o.nbytes).raw()
        b = StoredMatrix(ref.path, e.type_name, (1, e.nbytes), e.offset, e.nbytes).raw()
        assert np.array_equal(a, b), name
