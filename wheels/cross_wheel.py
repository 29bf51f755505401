"""aarch64 and s390x manylinux (2_28 or older) wheels cross-compiled on x86_64 without Docker, smoke-tested under qemu-user.

    python wheels/cross_wheel.py aarch64|s390x --from build/wheelhouse-raw/lite_llm-*-linux_x86_64.whl \
        [--emu build/emu] [--out build/wheelhouse]

- the kernel modules: cythonized here (the C is the same for every target), compiled by Debian's
  cross gcc with setup.py's flags (each variant's own, link-time optimisation, src/simd/hot.h's
  -O3 regions) against Debian 11's glibc 2.31 and libgomp (wheels/sysroot.py), with the
  target's Python 3.11 headers from the emulated tier's Debian 12 sysroot (.ci/emulated.py);
- the wheel: the x86_64 wheel's Python files with the aarch64 modules in place of its own,
  tagged cp311-cp311-linux_aarch64, then `auditwheel repair --plat auto` (its --plat choices
  are this machine's architecture's) with libgomp bundled from the sysroot, and `auditwheel
  show` must say manylinux_2_28 or older;
- the smoke test: `pip install --target` of the repaired wheel (pip checks its tags for
  manylinux_2_28_aarch64), then under qemu-aarch64, with the emulated tier's Python 3.11 and
  NumPy and nothing of the source tree on sys.path: the dispatcher's choice on qemu's default CPU
  (neon_bf16_i8mm) and on a Cortex-A72 (neon), one GEMM per variant against NumPy, and the tiny
  model's greedy tokens equal to x86's (tests/emulated/dispatch.py, copied out of the tree).

s390x the same way against the sysroot wheels/sysroot_s390x.py makes (Debian 11 ships no s390x
packages any more, and Debian 12's libgomp needs GLIBC_2.34): glibc 2.17's stub libraries and a
libgomp compiled against them, so the wheel is manylinux_2_17 (manylinux2014); qemu's default
s390x CPU picks vxe.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lite_llm" / "_kernels"))
sys.path.insert(0, str(ROOT / "wheels"))
import sysroot as sysroots  # noqa: E402
from variants import CFLAGS, CYTHON_DIRECTIVES, OPENMP, variants_for  # noqa: E402

TARGETS = {"aarch64": dict(triplet="aarch64-linux-gnu", qemu="qemu-aarch64", plat="manylinux_2_28_aarch64",
                           checks=[(None, "neon_bf16_i8mm"), ("cortex-a72", "neon")]),
           # qemu's default s390x CPU has the z14 vector facility
           "s390x": dict(triplet="s390x-linux-gnu", qemu="qemu-s390x", plat="manylinux_2_17_s390x",
                         checks=[(None, "vxe")])}
BASE = [("lite_llm._kernels._cpu", "lite_llm/_kernels/_cpu.pyx"), ("lite_llm.engine._sampler", "lite_llm/engine/_sampler.pyx"),
        ("lite_llm.engine._batch", "lite_llm/engine/_batch.pyx"), ("lite_llm.engine._step", "lite_llm/engine/_step.pyx")]


def log(msg: str) -> None:
    print(f"[cross-wheel {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_modules(arch: str, sr: Path, pyinc: Path, out: Path, jobs: int) -> list[Path]:
    """Every variant of `arch` and the baseline modules, as out/<package path>/<module>.<suffix>."""
    from Cython.Build import cythonize
    from setuptools import Extension

    t = TARGETS[arch]
    cc = f"{t['triplet']}-gcc"
    suffix = f".cpython-311-{t['triplet']}.so"
    libdir = sr / "usr" / "lib" / t["triplet"]
    # the sysroot's headers before the cross compiler's own (Debian 12's glibc headers)
    inc = ["-isystem", f"{sr}/usr/include/{t['triplet']}", "-isystem", f"{sr}/usr/include", f"-I{ROOT / 'src'}",
           f"-I{pyinc}/usr/include/python3.11", "-idirafter", f"{pyinc}/usr/include"]
    mods = [(f"lite_llm._kernels.{v.name}.kernels", "lite_llm/_kernels/kernels.pyx", v.flags, v.name)
            for v in variants_for(arch)] + [(n, p, (), "base") for n, p in BASE]
    jobs_list = []
    for name, pyx, vflags, cdir in mods:
        (ext,) = cythonize([Extension(name, [pyx], include_dirs=["src"])], build_dir=f"build/cython-{arch}/{cdir}",
                           compiler_directives=CYTHON_DIRECTIVES, quiet=True, force=True)
        dest = out / (name.replace(".", "/") + suffix)
        dest.parent.mkdir(parents=True, exist_ok=True)
        lto = ["-flto"] if cdir != "base" else []
        compile_flags = ["-DNDEBUG", "-fwrapv", "-Wall", "-fPIC", *CFLAGS, *OPENMP, *vflags, *lto]
        cmd = [cc, f"--sysroot={sr}", *inc, *compile_flags, ext.sources[0], "-shared",
               f"-L{libdir}", f"-L{sr}/lib/{t['triplet']}", f"-Wl,-rpath-link,{libdir}",
               *(["-flto=auto"] if lto else []), "-o", str(dest)]
        jobs_list.append((cmd, name, dest))
    log(f"{arch}: compiling {len(jobs_list)} modules, {jobs} at a time")

    def one(job):
        cmd, name, dest = job
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            raise SystemExit(f"cross compile of {name} failed:\n{proc.stderr[-4000:]}")
        if proc.stderr.strip():          # warnings: shown, as a native build shows them
            print(proc.stderr, file=sys.stderr)
        return dest

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, jobs_list))


def _stamp(arch: str, sr: Path, pyinc: Path) -> str:
    """What the modules of `arch` are made from: the sources, the flags, the compiler and the headers."""
    import hashlib

    t = TARGETS[arch]
    h = hashlib.sha256(repr((CFLAGS, OPENMP, CYTHON_DIRECTIVES, [(v.name, v.flags) for v in variants_for(arch)],
                             str(sr), str(pyinc))).encode())
    h.update(subprocess.run([f"{t['triplet']}-gcc", "--version"], capture_output=True, text=True).stdout.encode())
    for path in sorted([*ROOT.glob("lite_llm/**/*.pyx"), *ROOT.glob("lite_llm/**/*.pxi"),
                        *ROOT.glob("lite_llm/**/*.pxd"), *ROOT.glob("src/**/*.[ch]")]):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _stamp_file(arch: str) -> Path:
    return ROOT / "build" / f"cross-{arch}-modules.json"


def build_into_tree(arch: str, sr: Path, pyinc: Path, jobs: int) -> list[Path]:
    """The wheel's modules of `arch`, next to the host's in the source tree (where the emulated tier
    tests them), recorded with what they were made from so the wheel build takes them as they are."""
    modules = build_modules(arch, sr, pyinc, ROOT, jobs)
    _stamp_file(arch).parent.mkdir(parents=True, exist_ok=True)
    _stamp_file(arch).write_text(json.dumps({"stamp": _stamp(arch, sr, pyinc),
                                             "modules": [str(m.relative_to(ROOT)) for m in modules]}))
    return modules


def tree_modules(arch: str, sr: Path, pyinc: Path) -> list[Path] | None:
    """The modules build_into_tree left in the tree, if they were made from what is here now."""
    try:
        record = json.loads(_stamp_file(arch).read_text())
    except (OSError, ValueError):
        return None
    modules = [ROOT / m for m in record.get("modules", [])]
    if record.get("stamp") != _stamp(arch, sr, pyinc) or not modules or not all(m.is_file() for m in modules):
        return None
    return modules


def assemble(arch: str, x86_wheel: Path, modules_root: Path, modules: list[Path], out_dir: Path) -> Path:
    """The x86_64 wheel's files without its compiled modules, plus `modules`, tagged for `arch`."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        with zipfile.ZipFile(x86_wheel) as z:
            z.extractall(tree)
        for so in tree.rglob("*.so"):
            so.unlink()
        for m in modules:
            dest = tree / m.relative_to(modules_root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(m, dest)
        (dist_info,) = tree.glob("*.dist-info")
        wheel_file = dist_info / "WHEEL"
        lines = [ln for ln in wheel_file.read_text().splitlines() if ln.strip() and not ln.startswith("Tag:")]
        wheel_file.write_text("\n".join([*lines, f"Tag: cp311-cp311-linux_{arch}", ""]))
        (dist_info / "RECORD").unlink()
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "wheel", "pack", str(tree), "-d", str(out_dir)], check=True)
    (built,) = out_dir.glob(f"*linux_{arch}.whl")
    return built


def smoke(arch: str, wheel: Path, emu: Path) -> list[str]:
    """Install the wheel for `arch` into a fresh directory and run it under qemu: the failures."""
    t = TARGETS[arch]
    emu_sysroot = emu / arch / "sysroot"
    failures = []
    with tempfile.TemporaryDirectory(prefix="lite_llm_cross_smoke_") as tmp:
        target = Path(tmp) / "site"
        # pip takes --platform literally: every manylinux tag a glibc 2.28 system accepts
        plats = [a for minor in range(17, 29) for a in ("--platform", f"manylinux_2_{minor}_{arch}")]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                        *plats, "--python-version", "3.11", "--implementation", "cp",
                        "--target", str(target), str(wheel)], check=True)
        # dispatch.py and greedy.py copied out of the tree: nothing of the source tree importable
        for f in ("dispatch.py", "greedy.py"):
            shutil.copy(ROOT / "tests" / "emulated" / f, tmp)
        check = Path(tmp) / "gemm_check.py"
        check.write_text(GEMM_CHECK)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LITE_LLM_ISA", "VIRTUAL_ENV"))}
        env.update(PYTHONPATH=str(target), OMP_NUM_THREADS="2", PYTHONDONTWRITEBYTECODE="1",
                   LITE_LLM_CPU_OMP_THREADS_BIND="nobind", XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        for cpu, expect in t["checks"]:
            py = [t["qemu"], *(["-cpu", cpu] if cpu else []), "-L", str(emu_sysroot), str(emu_sysroot / "usr/bin/python3.11")]
            for what, cmd in (("gemm", [*py, str(check), str(target)]),
                              ("dispatch", [*py, str(Path(tmp) / "dispatch.py"), "--expect", expect, "--model",
                                            str(emu / "tiny-llama"), "--tokens", str(emu / "greedy-x86.json")])):
                t0 = time.time()
                proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
                name = f"{arch}{' -cpu ' + cpu if cpu else ''}: {what}"
                log(f"{name}: exit {proc.returncode} in {time.time() - t0:.0f} s\n"
                    + "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:]))
                if proc.returncode:
                    failures.append(name)
    return failures


GEMM_CHECK = '''
import sys
from pathlib import Path
import numpy as np
import lite_llm
from lite_llm import _kernels
from lite_llm._kernels import layout
where = Path(lite_llm.__file__).resolve()
assert Path(sys.argv[1]).resolve() in where.parents, f"lite_llm imported from {where}, not the installed wheel"
print(f"lite_llm from {where.parent}; chosen {_kernels.VARIANT.name}; runnable {', '.join(_kernels.available())}")
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 37), dtype=np.float32)
w = rng.standard_normal((21, 37), dtype=np.float32)
want = x.astype(np.float64) @ w.T.astype(np.float64)
packed = layout.pack(w, "float32")
for name in _kernels.available():
    mod = _kernels.load(name)
    assert mod.ISA == {"generic": "scalar"}.get(name, name), f"variant {name} reports ISA {mod.ISA}"
    out = np.empty((3, 21), np.float32)
    mod.gemm(x, packed, "float32", 21, out, num_threads=2)
    err = float(np.abs(out - want).max())
    assert err < 1e-4, f"{name}: gemm differs from NumPy by {err}"
    print(f"  {name}: gemm ok (max error {err:.1e})")
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(TARGETS))
    parser.add_argument("--from", dest="x86_wheel", type=Path, help="the x86_64 wheel (its Python files)")
    parser.add_argument("--raw", type=Path, help="an assembled linux_<arch> wheel: repair and smoke-test it only")
    parser.add_argument("--emu", type=Path, default=ROOT / "build" / "emu",
                        help="the emulated tier's work directory (its sysroot, tiny model and x86 tokens)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "wheelhouse")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    arch, t = args.arch, TARGETS[args.arch]
    if not args.raw and not args.x86_wheel:
        parser.error("give --from X86_WHEEL (or --raw WHEEL)")
    emu = args.emu.resolve()
    if not (emu / arch / "sysroot" / ".complete").is_file() or not (emu / "greedy-x86.json").is_file():
        raise SystemExit(f"no emulated-tier sysroot in {emu}: run `python .ci/emulated.py --arch {arch}` first")
    sr = sysroots.ensure(arch, ROOT / "build" / "sysroot")
    with tempfile.TemporaryDirectory() as tmp:
        if args.raw:
            raw = args.raw.resolve()
        else:
            # the emulated tier tests the wheel's modules in the tree (.ci/emulated.py): taken as they are
            # when made from these sources with these flags, else compiled here
            mods_root, modules = ROOT, tree_modules(arch, sr, emu / arch / "sysroot")
            if modules is None:
                mods_root = Path(tmp) / "mods"
                modules = build_modules(arch, sr, emu / arch / "sysroot", mods_root, args.jobs)
            else:
                log(f"{arch}: the emulated tier's modules, made from these sources: {len(modules)} modules")
            raw = assemble(arch, args.x86_wheel.resolve(), mods_root, modules, Path(tmp) / "raw")
        # auditwheel's --plat names this machine's architecture only: `auto` takes the wheel's,
        # and the most compatible tag its symbols allow; libraries from the sysroot only
        libs = f"{sr}/usr/lib/{t['triplet']}:{sr}/lib/{t['triplet']}"
        subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--plat", "auto", "--ldpaths", libs,
                        "--wheel-dir", str(args.out), str(raw)], check=True)
    (wheel,) = args.out.glob(f"*manylinux*_{arch}.whl")
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True,
                          check=True).stdout
    print(show)
    tag = show.split('platform tag:')[1].split('"')[1]          # "manylinux_2_17_aarch64"
    if not tag.startswith("manylinux_2_") or int(tag.split("_")[2]) > 28:
        raise SystemExit(f"{wheel.name}: auditwheel says {tag}, not manylinux_2_28 or older")
    (args.out / f"auditwheel-show-{arch}.txt").write_text(show)
    failures = smoke(arch, wheel, emu)
    if failures:
        log(f"FAILED: {', '.join(failures)}")
        return 1
    log(f"{wheel.name}: smoke test passed under qemu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
