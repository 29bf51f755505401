"""An s390x sysroot for a manylinux_2_17 wheel, built without Docker and without an old Debian.

    python wheels/sysroot_s390x.py [--work DIR]      # prints the sysroot's path

wheels/sysroot.py takes x86_64's and aarch64's glibc and libgomp from Debian 11, whose archive no
longer serves s390x, and Debian 12's s390x libgomp needs GLIBC_2.34. So for s390x the pieces are
made here, each from a maintained source:
  - glibc 2.17's link-time interface: the stub libraries (libc.so.6, libpthread.so.0, libdl.so.2,
    librt.so.1, libm.so.6, ld64.so.1) Zig generates for a `s390x-linux-gnu.2.17` target from its
    glibc symbol lists (PyPI's `ziglang` package). Only the stubs are wanted: Zig cannot finish a
    link for s390x (its start files for the target are not shipped), but it writes the stubs
    first, and those are checked here (each its soname, no symbol version past GLIBC_2.17);
  - the headers, start files and libc_nonshared.a: Debian 12's s390x cross libc (libc6-dev-s390x-cross,
    installed with the cross compiler by .ci/emulated.py);
  - libgomp: compiled here by Debian's s390x cross gcc from the same GCC's sources (Debian 12's
    gcc-12-source package), linked against the stubs, so it needs GLIBC_2.17 at most.
A module linked against this sysroot (-L its libdir first) binds to glibc 2.17's symbol versions,
and auditwheel bundles this libgomp: the wheel is manylinux_2_17 (manylinux2014).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRIPLET = "s390x-linux-gnu"
GLIBC = "2.17"
ZIG = "ziglang==0.13.0"
STUBS = {"libc.so.6": "libc.so.6", "libpthread.so.0": "libpthread.so.0", "libdl.so.2": "libdl.so.2",
         "librt.so.1": "librt.so.1", "libm.so.6": "libm.so.6", "libld.so.2": "ld64.so.1"}   # zig's name: ours
CROSS_LIBC = Path("/usr") / TRIPLET            # Debian 12's s390x cross libc (headers, start files)
GCC_SOURCE = "gcc-12-source"                   # the cross compiler's own version (gcc-s390x-linux-gnu 12)


def _say(msg: str) -> None:
    print(f"[sysroot s390x] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def _readelf(*args: str) -> str:
    return subprocess.run([f"{TRIPLET}-readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def _newest_glibc(path: Path) -> tuple[int, ...]:
    versions = re.findall(r"GLIBC_(\d+(?:\.\d+)+)", _readelf("--dyn-syms", "-V", str(path)))
    return max((tuple(int(p) for p in v.split(".")) for v in versions), default=(0,))


def glibc_stubs(work: Path, libdir: Path) -> None:
    """Zig's glibc 2.17 stub libraries for s390x, into libdir."""
    zig_dir = work / "zig"
    exe = zig_dir / "ziglang" / "zig"
    if not exe.is_file():
        wheels = work / "zig-wheel"
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), ZIG])
        (whl,) = wheels.glob("ziglang-*.whl")
        with zipfile.ZipFile(whl) as z:
            z.extractall(zig_dir)
        exe.chmod(0o755)
    cache = work / "zig-cache"
    shutil.rmtree(cache, ignore_errors=True)
    (work / "stub.c").write_text("int lite_llm_stub(void) { return 0; }\n")
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(cache), "ZIG_LOCAL_CACHE_DIR": str(cache)}
    # fails after the stubs are written (no s390x start files in Zig's distribution): not checked
    subprocess.run([str(exe), "build-lib", str(work / "stub.c"), "-dynamic", "-target", f"{TRIPLET}.{GLIBC}",
                    "-mcpu=z13", "-lc", "-fno-compiler-rt", f"-femit-bin={work / 'stub.so'}"],
                   env=env, cwd=work, capture_output=True)
    found = [Path(p).parent for p in glob.glob(str(cache / "o" / "*" / "libc.so.6"))]
    if len(found) != 1:
        raise SystemExit(f"zig wrote no glibc {GLIBC} stubs for s390x under {cache}")
    for name, ours in STUBS.items():
        src = found[0] / name
        soname = re.search(r"Library soname: \[([^\]]+)\]", _readelf("-d", str(src)))
        if soname is None or soname.group(1) != ours:
            raise SystemExit(f"{src}: not the {ours} stub zig should have written")
        if _newest_glibc(src) > tuple(int(p) for p in GLIBC.split(".")):
            raise SystemExit(f"{src}: defines a symbol version past GLIBC_{GLIBC}")
        shutil.copyfile(src, libdir / ours)
    # what -lc, -lpthread, -ldl, -lrt, -lm find (-L libdir before the cross compiler's own)
    (libdir / "libc.so").write_text("OUTPUT_FORMAT(elf64-s390)\n"
                                     "GROUP ( libc.so.6 libc_nonshared.a AS_NEEDED ( ld64.so.1 ) )\n")
    for lib in ("libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6"):
        (libdir / lib.split(".so")[0]).with_suffix(".so").symlink_to(lib)


def libgomp(work: Path, sysroot: Path, libdir: Path, jobs: int) -> None:
    """libgomp from the cross gcc's own sources, linked against the stubs, into libdir."""
    src = work / "gcc"
    if not (src / "libgomp" / "configure").is_file():
        debs = work / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        if not list(debs.glob(f"{GCC_SOURCE}_*.deb")):
            _run(["apt-get", "download", "-qq", GCC_SOURCE], cwd=debs)
        (deb,) = debs.glob(f"{GCC_SOURCE}_*.deb")
        unpacked = work / "gcc-source"
        shutil.rmtree(unpacked, ignore_errors=True)
        _run(["dpkg", "-x", str(deb), str(unpacked)])
        (tarball,) = unpacked.glob("usr/src/gcc-*/gcc-*.tar.*")
        wanted = ("libgomp/", "include/", "config/", "config.sub", "config.guess", "ltmain.sh", "install-sh",
                  "missing", "config-ml.in", "mkinstalldirs", "compile", "depcomp", "libtool.m4", "ltoptions.m4",
                  "ltsugar.m4", "ltversion.m4", "lt~obsolete.m4", "multilib.am", "test-driver",
                  "libtool-ldflags", "gcc/BASE-VER", "gcc/DATESTAMP", "gcc/DEV-PHASE")
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers()
                       if any(m.name.split("/", 1)[-1].startswith(w) for w in wanted)]
            tar.extractall(unpacked, members=members)
        (top,) = [p for p in unpacked.iterdir() if p.name.startswith("gcc-") and p.is_dir()]
        shutil.rmtree(src, ignore_errors=True)
        top.rename(src)
    build = work / "libgomp-build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    cc = f"{TRIPLET}-gcc --sysroot={sysroot} -L{libdir} -Wl,-rpath-link,{libdir}"
    _say("configuring and compiling libgomp against glibc 2.17's stubs")
    _run([str(src / "libgomp" / "configure"), f"--host={TRIPLET}", "--build=x86_64-linux-gnu", f"--target={TRIPLET}",
          "--disable-multilib", "--enable-shared", "--disable-static", "--disable-werror", f"CC={cc}",
          "CFLAGS=-O2 -fPIC", "FC=false"], cwd=build, stdout=subprocess.DEVNULL)
    _run(["make", f"-j{jobs}", "libgomp.la"], cwd=build, stdout=subprocess.DEVNULL)
    built = build / ".libs" / "libgomp.so.1.0.0"
    if _newest_glibc(built) > tuple(int(p) for p in GLIBC.split(".")):
        raise SystemExit(f"{built} needs a glibc past {GLIBC}")
    shutil.copyfile(built, libdir / "libgomp.so.1")
    (libdir / "libgomp.so").symlink_to("libgomp.so.1")


def ensure(work: Path, jobs: int = os.cpu_count() or 2) -> Path:
    """work/s390x/sysroot, made once (see the module docstring)."""
    base = work / "s390x"
    sysroot = base / "sysroot"
    stamp = sysroot / ".complete"
    if stamp.is_file():
        return sysroot
    if not (CROSS_LIBC / "include" / "stdio.h").is_file() or shutil.which(f"{TRIPLET}-gcc") is None:
        raise SystemExit(f"no s390x cross compiler and libc: apt-get install gcc-{TRIPLET} (.ci/emulated.py does)")
    shutil.rmtree(sysroot, ignore_errors=True)
    libdir = sysroot / "usr" / "lib" / TRIPLET
    libdir.mkdir(parents=True)
    shutil.copytree(CROSS_LIBC / "include", sysroot / "usr" / "include")
    for f in ("crti.o", "crtn.o", "crt1.o", "Scrt1.o", "libc_nonshared.a"):
        shutil.copyfile(CROSS_LIBC / "lib" / f, libdir / f)
    glibc_stubs(base, libdir)
    libgomp(base, sysroot, libdir, jobs)
    stamp.write_text(f"glibc {GLIBC} stubs (zig), Debian 12 s390x headers, libgomp from {GCC_SOURCE}\n")
    return sysroot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "sysroot")
    args = parser.parse_args()
    print(ensure(args.work.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
