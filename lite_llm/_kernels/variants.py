"""THE table of kernel build variants: setup.py builds one extension per row that the
build machine's architecture allows, and the dispatcher picks the first one, in this order,
whose CPU features the running machine has.

Never -march=native: a wheel must run wherever its generic variant runs.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]  # compiler flags on top of the common ones
    needs: tuple[str, ...]  # CPU features (as lite_llm._kernels._cpu.has names them)


_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c", "-mavx2")

X86 = (
    Variant("avx512bf16", flags=(*_AVX512, "-mavx512bf16", "-mavx512vnni"),
            needs=("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni")),  # Zen 4+, SPR
    Variant("avx512", flags=_AVX512, needs=("avx512f", "avx512bw", "avx512vl", "avx512dq")),  # Skylake-X
    Variant("avx2", flags=("-mavx2", "-mfma", "-mf16c"), needs=("avx2", "fma", "f16c")),
    Variant("generic", flags=(), needs=()),
)
# NEON and s390x VXE variants slot in here when src/simd grows vec_neon.h / vec_vxe.h.
OTHER = (Variant("generic", flags=(), needs=()),)


def variants_for(machine: str) -> tuple[Variant, ...]:
    """Variants a build for `machine` (platform.machine()) contains, best first."""
    if machine.lower() in ("x86_64", "amd64"):
        return X86
    return OTHER
