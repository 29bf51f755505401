# cython: language_level=3
"""The kernel module, compiled once per ISA variant (setup.py; flags in variants.py).

Cython owns the loops over rows, heads and tokens (prange); the math of one row or block is
C in src/kernels/ written on src/simd/vec.h. `def` functions check shapes and are what the
tests call; `forward` runs a whole engine step in one nogil call.
"""
include "common.pxi"
include "ops.pxi"
include "tp.pxi"
include "lora.pxi"
include "forward.pxi"
include "convert.pxi"
include "vision.pxi"
include "audio.pxi"
