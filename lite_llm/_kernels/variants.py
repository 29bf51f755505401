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


# Compiler settings of every kernel module (setup.py, and the cross builds of .ci/emulated.py).
CFLAGS = ("-O2", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-std=gnu11",
          "-Wno-unused-function", "-Wno-unreachable-code")
OPENMP = ("-fopenmp",)
CYTHON_DIRECTIVES = {"language_level": 3, "boundscheck": False, "wraparound": False,
                     "cdivision": True, "initializedcheck": False, "embedsignature": True}

_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c", "-mavx2")

X86 = (
    # Zen 4+, Sapphire Rapids+: bf16 and int8 dot products, VBMI's byte permutes and BITALG's bit
    # shuffle (the codebook types' decode); Cooper Lake (bf16 without VBMI) runs `avx512`
    Variant("avx512bf16", flags=(*_AVX512, "-mavx512bf16", "-mavx512vnni", "-mavx512vbmi", "-mavx512bitalg"),
            needs=("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni", "avx512vbmi",
                   "avx512bitalg")),
    Variant("avx512", flags=_AVX512, needs=("avx512f", "avx512bw", "avx512vl", "avx512dq")),  # Skylake-X
    Variant("avx2", flags=("-mavx2", "-mfma", "-mf16c"), needs=("avx2", "fma", "f16c")),
    Variant("generic", flags=(), needs=()),
)
# aarch64 (src/simd/vec_neon.h): ASIMD is baseline, so `neon` is the floor in practice.
AARCH64 = (
    # +fp16: gcc 12 emits half-precision moves (fmov .8h) for bf16 code; every CPU with bf16
    # and i8mm has FEAT_FP16 too
    Variant("neon_bf16_i8mm", flags=("-march=armv8.6-a+bf16+i8mm+fp16",),
            needs=("asimd", "asimdhp", "dotprod", "bf16", "i8mm")),   # Graviton3/4, Neoverse V1/V2/N2, Apple M2+
    Variant("neon_dotprod", flags=("-march=armv8.2-a+dotprod",), needs=("asimd", "dotprod")),  # Graviton2, Ampere Altra
    Variant("neon", flags=("-march=armv8-a",), needs=("asimd",)),     # Cortex-A72 (Raspberry Pi 4, Graviton1)
    # the plain-C reference (vec_scalar.h), never chosen here (NEON is baseline): no -O3 regions (src/simd/hot.h),
    # which cost gcc ~4x the compile time of the whole module in the plain-C backend; no FMA
    # contraction, which gcc applied in some tile shapes and not others, so a panel's bits would
    # follow how the step's panels fell to threads (x86-64's baseline has no FMA to fuse into)
    Variant("generic", flags=("-march=armv8-a", "-DLL_FORCE_SCALAR", "-ffp-contract=off", "-DLL_HOT_OFF"), needs=()),
)
# s390x (src/simd/vec_vxe.h): z14 vector enhancements for single precision, else plain C.
S390X = (
    Variant("vxe", flags=("-march=z14", "-mzvector"), needs=("vx", "vxe")),   # z14 and later
    # z13 and older (no vector enhancements facility): plain C without the -O3 regions (src/simd/hot.h),
    # which cost gcc several times the rest of the module's compile in the plain-C backend (x86's
    # generic: 1041 s of CPU with them, 249 s without); no FMA contraction (as aarch64's)
    Variant("generic", flags=("-ffp-contract=off", "-DLL_HOT_OFF"), needs=()),
)
OTHER = (Variant("generic", flags=(), needs=()),)


def variants_for(machine: str) -> tuple[Variant, ...]:
    """Variants a build for `machine` (platform.machine()) contains, best first."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64"):
        return X86
    if machine in ("aarch64", "arm64"):
        return AARCH64
    if machine == "s390x":
        return S390X
    return OTHER
