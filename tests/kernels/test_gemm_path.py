"""Every inner-product path of the bf16 GEMM on every variant this machine runs, forced, vs
tests/ref_ops.py; the start-up micro-benchmark's choice, its cache and LITE_LLM_GEMM_PATH
(lite_llm/_kernels/gemm_path.py).

Shapes hit the tails of both tile families: T not a multiple of 4 (vdpbf16ps tiles) nor of 8
(fp32-FMA tiles of the AVX-512 builds), panel counts not a multiple of 3 or 4, odd K (the last
bf16 pair half empty), T = 1 (decode: vdpbf16ps streaming whatever the path).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ref_ops  # noqa: E402
from lite_llm import _kernels, config  # noqa: E402
from lite_llm._kernels import gemm_path, layout  # noqa: E402

VARIANTS = _kernels.available()
CASES = [(v, p) for v in VARIANTS for p in _kernels.load(v).BF16_PATHS]
SHAPES = [(1, 129, 40), (2, 64, 16), (7, 129, 33), (9, 301, 70), (17, 255, 100), (25, 1001, 200), (8, 33, 48)]


def _bf16_weight(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    bits = ref_ops.f32_to_bf16_bits(rng.standard_normal((n, k), dtype=np.float32))
    return bits, ref_ops.bf16_bits_to_f32(bits)


def _x_seen(mod, path: str, x: np.ndarray) -> np.ndarray:
    """What the kernels multiply: vdpbf16ps takes x rounded to bf16 (so does decode, T = 1,
    wherever the build has it); the fp32-FMA path takes x as it is."""
    dot = "dpbf16" in mod.BF16_PATHS and (path == "dpbf16" or x.shape[0] == 1)
    return ref_ops.bf16_round(x) if dot else x


@pytest.mark.parametrize("variant,path", CASES)
@pytest.mark.parametrize("num_tokens,k,n", SHAPES)
@pytest.mark.parametrize("num_threads", [1, 3])
def test_every_bf16_path_matches_reference(variant, path, num_tokens, k, n, num_threads, rng):
    mod = _kernels.load(variant)
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    bits, w = _bf16_weight(rng, n, k)
    bias = rng.standard_normal(n, dtype=np.float32)
    packed = layout.pack(bits, "bfloat16")
    out = np.full((num_tokens, n), np.nan, np.float32)
    mod.gemm(x, packed, "bfloat16", n, out, num_threads=num_threads, path=path)
    tol = dict(rtol=1e-5, atol=2e-6 * k + 1e-6)
    np.testing.assert_allclose(out, ref_ops.gemm(_x_seen(mod, path, x), w), **tol)
    start = rng.standard_normal((num_tokens, n), dtype=np.float32)
    out[...] = start
    mod.gemm(x, packed, "bfloat16", n, out, bias=bias, accumulate=True, num_threads=num_threads, path=path)
    np.testing.assert_allclose(out, start + ref_ops.gemm(_x_seen(mod, path, x), w, bias), **tol)


@pytest.mark.parametrize("variant,path", CASES)
@pytest.mark.parametrize("num_tokens,k,ffn_dim", [(1, 64, 40), (9, 129, 33), (17, 70, 48), (3, 31, 16)])
def test_every_bf16_path_of_the_gated_mlp_matches_reference(variant, path, num_tokens, k, ffn_dim, rng):
    mod = _kernels.load(variant)
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    bits, w = _bf16_weight(rng, 2 * ffn_dim, k)
    bias = rng.standard_normal(2 * ffn_dim, dtype=np.float32)
    out = np.full((num_tokens, ffn_dim), np.nan, np.float32)
    mod.gated_mlp(x, layout.pack_gated(bits, ffn_dim, "bfloat16"), "bfloat16", ffn_dim, out, "silu", bias=bias,
                  num_threads=2, path=path)
    h = ref_ops.gemm(_x_seen(mod, path, x), w, bias)
    expected = ref_ops.act_mul(h[:, :ffn_dim], h[:, ffn_dim:], "silu")
    tol = dict(rtol=1e-5, atol=2e-6 * k + 1e-6)
    if _x_seen(mod, path, x) is not x:   # vdpbf16ps hands its result on as bf16, as the next GEMM reads it
        expected = ref_ops.bf16_round(expected.astype(np.float32))
        tol = dict(rtol=8e-3, atol=tol["atol"] * 4)
    np.testing.assert_allclose(out, expected, **tol)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if "dpbf16" in _kernels.load(v).BF16_PATHS])
def test_fp32_fma_on_bf16_is_at_least_as_accurate_as_vdpbf16ps(variant, rng):
    """Against an fp64 product of the same bf16 weights and fp32 activations."""
    mod = _kernels.load(variant)
    t, k, n = 24, 2048, 96
    x = rng.standard_normal((t, k), dtype=np.float32)
    bits, w = _bf16_weight(rng, n, k)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    errors = {}
    for path in ("dpbf16", "fma"):
        out = np.empty((t, n), np.float32)
        mod.gemm(x, layout.pack(bits, "bfloat16"), "bfloat16", n, out, num_threads=2, path=path)
        errors[path] = np.abs(out - exact).mean()
    assert errors["fma"] <= errors["dpbf16"], errors


def test_a_path_the_variant_cannot_run_is_refused():
    mod = _kernels.load(VARIANTS[-1])
    x, out = np.ones((3, 4), np.float32), np.empty((3, 16), np.float32)
    packed = layout.pack(np.zeros((16, 4), np.uint16), "bfloat16")
    with pytest.raises(ValueError, match="bf16 GEMM path"):
        mod.gemm(x, packed, "bfloat16", 16, out, path="avx9000")
    if "dpbf16" not in mod.BF16_PATHS:
        with pytest.raises(ValueError, match="runs fma"):
            mod.gemm(x, packed, "bfloat16", 16, out, path="dpbf16")


@pytest.mark.parametrize("variant", VARIANTS)
def test_measured_rates_and_peaks_are_positive(variant):
    mod = _kernels.load(variant)
    for path in mod.BF16_PATHS:
        assert mod.gemm_tile_rate(path, num_tokens=16, k=64, n=48, repeats=1) > 0
    assert "fma" in mod.PEAK_KINDS
    for name in mod.PEAK_KINDS:
        assert mod.instruction_peak(name, rounds=64, repeats=1) > 0


# ----------------------------------------------------------------------------- choice and cache

@pytest.fixture
def fresh(monkeypatch):
    """No memoized choice (the process's set aside), and LITE_LLM_GEMM_PATH unset."""
    monkeypatch.delenv("LITE_LLM_GEMM_PATH", raising=False)
    with gemm_path.chosen_aside():
        yield


def _count_measures(monkeypatch) -> list[int]:
    calls = []
    real = gemm_path.measure

    def counted(kernels):
        calls.append(1)
        return real(kernels)
    monkeypatch.setattr(gemm_path, "measure", counted)
    return calls


def _forbid_measuring(monkeypatch):
    def fail(kernels):
        raise AssertionError("measured although the cache holds valid figures")
    monkeypatch.setattr(gemm_path, "measure", fail)


@pytest.mark.parametrize("variant", VARIANTS)
def test_first_start_measures_and_caches_then_the_cache_decides(variant, tmp_path, monkeypatch, fresh):
    mod = _kernels.load(variant)
    calls = _count_measures(monkeypatch)
    first = gemm_path.choose(mod, cache_dir=str(tmp_path))
    assert calls == [1] and first.source == "measured"
    assert first.chosen["bf16"] in mod.BF16_PATHS and first.chosen["int8"] == mod.INT8_PATH
    assert first.peak("bf16") > 0 and set(first.peaks) == set(mod.PEAK_KINDS)
    data = json.loads((tmp_path / gemm_path.CACHE_FILE).read_text())
    assert data["machine"] == gemm_path.machine_key() and mod.ISA in data["variants"]
    gemm_path.forget()
    _forbid_measuring(monkeypatch)
    again = gemm_path.choose(mod, cache_dir=str(tmp_path))
    assert again.source == "cache" and again.chosen == first.chosen and again.peaks == first.peaks


@pytest.mark.parametrize("variant", [v for v in VARIANTS if len(_kernels.load(v).BF16_PATHS) > 1])
@pytest.mark.parametrize("faster", ["fma", "dpbf16"])
def test_the_choice_is_deterministic_given_the_cache(variant, faster, tmp_path, monkeypatch, fresh):
    """The faster tile in the cache file wins, without measuring (as on an Intel machine where
    vdpbf16ps issues at half the FMA rate)."""
    mod = _kernels.load(variant)
    rates = {p: (90.0 if p == faster else 45.0) for p in mod.BF16_PATHS}
    entry = {"tile_rates": rates, "peaks": {name: 50.0 for name in mod.PEAK_KINDS}}
    (tmp_path / gemm_path.CACHE_FILE).write_text(json.dumps(
        {"machine": gemm_path.machine_key(), "variants": {mod.ISA: entry}}))
    _forbid_measuring(monkeypatch)
    for _ in range(3):
        gemm_path.forget()
        paths = gemm_path.choose(mod, cache_dir=str(tmp_path))
        assert paths.chosen["bf16"] == faster and paths.source == "cache"


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe\x00garbage", b"[]", b'{"machine": {"cpu_model": "another CPU"}, "variants": {}}',
    b"", b'{"machine": null, "variants": {"avx512bf16": {"tile_rates": {}}}}'])
def test_a_corrupt_or_foreign_cache_is_ignored_and_rewritten(content, tmp_path, monkeypatch, fresh):
    mod = _kernels.kernels
    cache = tmp_path / gemm_path.CACHE_FILE
    cache.write_bytes(content)
    calls = _count_measures(monkeypatch)
    paths = gemm_path.choose(mod, cache_dir=str(tmp_path))
    assert calls == [1] and paths.source == "measured"
    data = json.loads(cache.read_text())
    assert data["machine"] == gemm_path.machine_key() and mod.ISA in data["variants"]


def test_a_malformed_entry_of_this_machine_is_measured_again(tmp_path, monkeypatch, fresh):
    mod = _kernels.kernels
    cache = tmp_path / gemm_path.CACHE_FILE
    cache.write_text(json.dumps({"machine": gemm_path.machine_key(),
                                 "variants": {mod.ISA: {"tile_rates": {"fma": -1}, "peaks": "fast"}}}))
    calls = _count_measures(monkeypatch)
    assert gemm_path.choose(mod, cache_dir=str(tmp_path)).source == "measured" and calls == [1]
    assert gemm_path.valid_entry(mod, json.loads(cache.read_text())["variants"][mod.ISA])


def test_an_unreadable_cache_is_ignored(tmp_path, monkeypatch, fresh):
    """A directory where the file should be: neither readable nor replaceable; start-up goes on."""
    (tmp_path / gemm_path.CACHE_FILE).mkdir()
    paths = gemm_path.choose(_kernels.kernels, cache_dir=str(tmp_path))
    assert paths.source == "measured"


def test_the_cache_dir_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert config.user_cache_dir() == str(tmp_path / "lite_llm")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.user_cache_dir() == str(tmp_path / ".cache" / "lite_llm")


@pytest.mark.parametrize("variant", VARIANTS)
def test_lite_llm_gemm_path_forces_each_path(variant, tmp_path, monkeypatch, fresh):
    mod = _kernels.load(variant)
    for path in mod.BF16_PATHS:
        monkeypatch.setenv("LITE_LLM_GEMM_PATH", path)
        paths = gemm_path.choose(mod, cache_dir=str(tmp_path))
        assert paths.chosen["bf16"] == path and paths.forced == ("bf16",)
        assert any("forced by LITE_LLM_GEMM_PATH" in line for line in paths.describe())
    monkeypatch.setenv("LITE_LLM_GEMM_PATH", f"bf16={mod.BF16_PATHS[-1]},{mod.INT8_PATH}")
    paths = gemm_path.choose(mod, cache_dir=str(tmp_path))
    assert paths.chosen == {"bf16": mod.BF16_PATHS[-1], "int8": mod.INT8_PATH}
    assert paths.forced == ("bf16", "int8")


@pytest.mark.parametrize("value", ["fastest", "fma,dpbf16", "int8=fma", "fma;dpbf16", "=", "bf16=", "avx512"])
def test_a_bad_lite_llm_gemm_path_is_a_clear_error(value, monkeypatch):
    monkeypatch.setenv("LITE_LLM_GEMM_PATH", value)
    with pytest.raises(ValueError, match="LITE_LLM_GEMM_PATH=.*expected 'auto'"):
        config.gemm_path_override()


def test_auto_and_unset_choose_by_measurement(monkeypatch):
    for value in ("auto", "", " AUTO "):
        monkeypatch.setenv("LITE_LLM_GEMM_PATH", value)
        assert config.gemm_path_override() == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_path_this_variant_lacks_is_a_clear_error(variant, tmp_path, fresh):
    mod = _kernels.load(variant)
    other_int8 = next(p for p in ("vpdpbusd", "vpmaddubsw", "scalar") if p != mod.INT8_PATH)
    with pytest.raises(ValueError, match=f"cannot run in the {mod.ISA} kernels"):
        gemm_path.choose(mod, cache_dir=str(tmp_path), override={"int8": other_int8})
    if "dpbf16" not in mod.BF16_PATHS:
        with pytest.raises(ValueError, match="cannot run"):
            gemm_path.choose(mod, cache_dir=str(tmp_path), override={"bf16": "dpbf16"})
