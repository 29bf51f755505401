"""Intrinsics live in src/simd/vec_<isa>.h only: every kernel, Cython file and C helper is
written on the vec.h ops, so a new ISA is one new backend header (DESIGN.md, Kernels).

The patterns are the intrinsic families of the backends: x86 `_mm*` functions and `__m128/256/512`
types, NEON `v...q_f32`-style functions and `*x*_t` vector types (and the dot products `vdot`,
`vbfdot`, `vusdot`), s390x `vec_*` functions and `__vector` types. The test first proves each
pattern matches the backend that uses it, so a pattern that silently matches nothing fails.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIMD = ROOT / "src" / "simd"

PATTERNS = {
    "x86 intrinsic": re.compile(r"\b_mm\d*_\w+|\b__m(64|128|256|512)\w*"),
    "NEON intrinsic": re.compile(r"\bv[a-z0-9]+q?_[suf](8|16|32|64)\b|\bv(bf|us)?dot\w*|\b(u?int|float|bfloat)\d+x\d+_t\b"),
    "s390x vector intrinsic": re.compile(r"\bvec_[a-z]\w*\s*\(|\b__vector\b"),
}
# which backend proves each pattern is live
WITNESS = {"x86 intrinsic": "vec_avx512.h", "NEON intrinsic": "vec_neon.h", "s390x vector intrinsic": "vec_vxe.h"}


def _sources() -> list[Path]:
    files = [*ROOT.glob("src/**/*.h"), *ROOT.glob("src/**/*.c"), *ROOT.glob("lite_llm/**/*.pyx"),
             *ROOT.glob("lite_llm/**/*.pxi"), *ROOT.glob("lite_llm/**/*.pxd")]
    return sorted(f for f in files if SIMD not in f.parents)


def _code(path: Path) -> str:
    """The file without comments (C block and line comments, Python/Cython # comments)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    if path.suffix in (".pyx", ".pxi", ".pxd"):
        text = re.sub(r"#[^\n]*", " ", text)
    return text


@pytest.mark.parametrize("kind", sorted(PATTERNS))
def test_pattern_matches_its_backend(kind):
    assert PATTERNS[kind].search(_code(SIMD / WITNESS[kind])), f"{kind} pattern matches nothing in {WITNESS[kind]}"


def test_sources_are_scanned():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"src/kernels/gemm.h", "src/kernels/attention.h", "src/kernels/qgemm.h", "src/kernels/peak.h",
            "lite_llm/_kernels/kernels.pyx", "lite_llm/engine/_sampler.pyx"} <= names


@pytest.mark.parametrize("kind", sorted(PATTERNS))
def test_no_intrinsics_outside_src_simd(kind):
    found = []
    for path in _sources():
        for lineno, line in enumerate(_code(path).splitlines(), 1):
            m = PATTERNS[kind].search(line)
            if m:
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)}")
    assert not found, f"{kind}s outside src/simd (add a vec.h op instead):\n" + "\n".join(found)
