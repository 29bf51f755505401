"""Each backend's GEMM register tile fits its register file: the hot loop of every tile shape
the backend declares (LL_TT_FMA x LL_NP_FMA for fp32, fp16 and widened bf16 weights, the gated
MLP's LL_TT_FMA x 2, and LL_TT_DOT x LL_NP_DOT for bf16 dot products) keeps its accumulators
in registers: compiled on its own with the variant's flags, the function has no vector load
or store on the stack. (4 tokens x 4 panels on AVX2 spills 60-70 registers; the test of that
shape below proves the check sees spills.)

Needs gcc and objdump (binutils), which build this package anyway.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lite_llm._kernels.variants import CFLAGS as MODULE_CFLAGS, variants_for  # noqa: E402

CC = shutil.which("gcc") or shutil.which("cc")
OBJDUMP = shutil.which("objdump")
# x86 disassembly: an x86_64 host's test (tests/conftest.py deselects it elsewhere)
pytestmark = [pytest.mark.x86_host,
              pytest.mark.skipif(not (CC and OBJDUMP), reason="reads x86 disassembly: needs gcc and objdump")]

# setup.py's code generation options, minus the Cython and OpenMP parts; the tiles sit in an
# LL_HOT_BEGIN/END region as the kernel headers' code does (src/simd/hot.h: -O3 in a -O2 module).
CFLAGS = [*MODULE_CFLAGS, "-fPIC"]

SOURCE = r"""
#include "kernels/gemm.h"
LL_HOT_BEGIN
#define TILE(NAME, WT, TT, NP) \
    __attribute__((noinline)) void NAME(const float *x, ptrdiff_t ldx, const void *const *wp, ptrdiff_t k, \
                                        ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]) { \
        ll_gemm_acc_fma(x, ldx, wp, WT, k, TT, NP, acc); }
TILE(tile_f32, LL_W_F32, LL_TT_FMA, LL_NP_FMA)
TILE(tile_f16, LL_W_F16, LL_TT_FMA, LL_NP_FMA)
TILE(tile_bf16, LL_W_BF16, LL_TT_FMA, LL_NP_FMA)
TILE(tile_gated_bf16, LL_W_BF16, LL_TT_FMA, 2)
#ifdef LL_HAVE_BF16_DOT
__attribute__((noinline)) void tile_dot(const uint32_t *xb, ptrdiff_t ldx, const void *const *wp, ptrdiff_t k,
                                        ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]) {
    ll_gemm_acc_dot(xb, ldx, wp, k, LL_TT_DOT, LL_NP_DOT, acc);
}
#endif
LL_HOT_END
"""
# a vector register moved to or from the stack frame (a spill or a reload), or an FMA reading one
SPILL = re.compile(r"[xyz]mm\d+,\s*-?(0x[0-9a-f]+)?\(%r[sb]p\)|\(%r[sb]p\)(,%[xyz]mm\d+)+$")


def _spills(tmp_path: Path, flags: tuple[str, ...], defines: tuple[str, ...] = ()) -> dict[str, int]:
    """Stack accesses of vector registers in each tile function, compiled with `flags`."""
    src, obj = tmp_path / "tiles.c", tmp_path / "tiles.o"
    src.write_text("".join(f"#define {d}\n" for d in defines) + SOURCE)
    subprocess.run([CC, *CFLAGS, *flags, f"-I{ROOT / 'src'}", "-c", str(src), "-o", str(obj)], check=True)
    asm = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    counts: dict[str, int] = {}
    name = None
    for line in asm.splitlines():
        m = re.match(r"^[0-9a-f]+ <(\w+)>:", line)
        if m:
            name = m.group(1)
            counts[name] = 0
        elif name and SPILL.search(line):
            counts[name] += 1
    return counts


# generic is the plain-C spec (vec_scalar.h): arrays of 16 floats, tuned for nothing
@pytest.mark.parametrize("variant", [v.name for v in variants_for("x86_64") if v.name != "generic"])
def test_every_tile_of_the_variant_stays_in_registers(variant, tmp_path):
    flags = next(v.flags for v in variants_for("x86_64") if v.name == variant)
    counts = _spills(tmp_path, flags)
    tiles = {n: c for n, c in counts.items() if n.startswith("tile_")}
    assert {"tile_f32", "tile_f16", "tile_bf16", "tile_gated_bf16"} <= set(tiles)
    if variant == "avx512bf16":
        assert "tile_dot" in tiles
    assert all(c == 0 for c in tiles.values()), f"{variant}: vector registers spilled in {tiles}"


def test_the_check_sees_spills(tmp_path):
    """AVX-512's 4 x 4 tile on AVX2's 16 registers must spill, or the check above proves nothing."""
    flags = next(v.flags for v in variants_for("x86_64") if v.name == "avx2")
    # the AVX2 backend with a 4 x 4 tile, from a copy of src/ (the real headers stay as they are)
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src)
    backend = src / "simd" / "vec_avx2.h"
    text = backend.read_text()
    text = re.sub(r"#define LL_TT_FMA \d+", "#define LL_TT_FMA 4", text)
    text = re.sub(r"#define LL_NP_FMA \d+", "#define LL_NP_FMA 4", text)
    backend.write_text(text)
    c, obj = tmp_path / "tiles.c", tmp_path / "tiles.o"
    c.write_text(SOURCE)
    subprocess.run([CC, *CFLAGS, *flags, f"-I{src}", "-c", str(c), "-o", str(obj)], check=True)
    asm = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    assert sum(1 for line in asm.splitlines() if SPILL.search(line)) > 20
