"""A glibc 2.31 sysroot from Debian 11 (bullseye) packages, for manylinux wheels built without Docker.

    python wheels/sysroot.py x86_64|aarch64 [--work DIR]     # prints the sysroot's path

A wheel's manylinux tag is the newest glibc symbol version its modules and bundled libraries
need. Built against this machine's glibc (2.36), `_cpu`'s pthread_setaffinity_np binds to
GLIBC_2.34 and Debian 12's libgomp needs GLIBC_2.34 too: manylinux_2_34. Compiled by this
machine's gcc (which knows every variant's -m flags) with `--sysroot` set to Debian 11's libc6-dev
and linked with `-L` to its libgcc-s1 and libgomp1 (setup.py, LITE_LLM_SYSROOT) (gcc 10: GOMP_4.5 and OMP_5.0, all the
modules call), the modules and the libgomp auditwheel bundles need GLIBC_2.17 at most, so the
wheel takes the manylinux_2_28 tag wheels/README.md promises (.ci/wheel.sh checks it).

The packages come from Debian's archive through apt-get, with a private apt configuration and
state under DIR (the machine's own apt sources and dpkg database are not touched), and are
unpacked with dpkg -x. Debian 11 is the oldest Debian the archive still serves, for amd64 and
arm64 only: its s390x packages are gone (Debian 11's long-term support dropped s390x), so the
s390x sysroot is made from other sources (sysroot_s390x.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHES = {"x86_64": ("amd64", "x86_64-linux-gnu"), "aarch64": ("arm64", "aarch64-linux-gnu"),
          "s390x": ("s390x", "s390x-linux-gnu")}      # s390x: made by sysroot_s390x.py, not from Debian 11
DEBS = ["libc6", "libc6-dev", "linux-libc-dev", "libgcc-s1", "libgomp1", "libcrypt1", "libcrypt-dev"]
SUITE = "bullseye"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _apt(work: Path, deb_arch: str) -> list[str]:
    etc, state = work / "apt" / "etc", work / "apt" / "state"
    for d in (etc, state / "lists" / "partial", work / "apt" / "cache" / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    (etc / "sources.list").write_text(f"deb [signed-by={KEYRING}] http://deb.debian.org/debian {SUITE} main\n")
    (state / "status").touch()
    return ["-o", f"Dir::Etc::SourceList={etc / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::State::status={state / 'status'}",
            "-o", f"Dir::Cache={work / 'apt' / 'cache'}", "-o", f"APT::Architecture={deb_arch}",
            "-o", f"APT::Architectures={deb_arch}", "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root", "-qq"]


def ensure(arch: str, work: Path) -> Path:
    """work/<arch>/sysroot, made once: Debian 11's libc, libgcc_s and libgomp for `arch`
    (s390x: glibc 2.17's stubs and a libgomp built against them, sysroot_s390x.py)."""
    if arch == "s390x":
        import sysroot_s390x
        return sysroot_s390x.ensure(work)
    deb_arch, triplet = ARCHES[arch]
    sysroot = work / arch / "sysroot"
    stamp = sysroot / ".complete"
    if stamp.is_file():
        return sysroot
    subprocess.run(["rm", "-rf", str(sysroot)], check=True)
    debs = work / arch / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    apt = _apt(work / arch, deb_arch)
    # apt's and dpkg's output to stderr: stdout is for the lines a shell evaluates (--env)
    subprocess.run(["apt-get", *apt, "update"], check=True, stdout=sys.stderr)
    subprocess.run(["apt-get", *apt, "download", *[f"{p}:{deb_arch}" for p in DEBS]], cwd=debs, check=True,
                   stdout=sys.stderr)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(sysroot)], check=True, stdout=sys.stderr)
    # the packages' absolute symlinks (/lib64/ld-linux-x86-64.so.2 -> /lib/...) point into the
    # sysroot, not at this machine's files
    for link in [p for p in sysroot.rglob("*") if p.is_symlink() and os.readlink(p).startswith("/")]:
        target = sysroot / os.readlink(link).lstrip("/")
        link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))
    libdir = sysroot / "usr" / "lib" / triplet
    (libdir / "libgomp.so").symlink_to("libgomp.so.1")       # what -fopenmp's -lgomp finds (-L libdir)
    stamp.write_text(f"Debian {SUITE} {deb_arch}\n")
    return sysroot


def flags(arch: str, sysroot: Path) -> dict[str, str]:
    """What setup.py takes (LITE_LLM_SYSROOT: --sysroot and -L to its libdir, for the compile and
    the link) and where auditwheel finds the libgomp to bundle (LIBDIR)."""
    return {"LITE_LLM_SYSROOT": str(sysroot), "LIBDIR": str(sysroot / "usr" / "lib" / ARCHES[arch][1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(ARCHES))
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "sysroot")
    parser.add_argument("--env", action="store_true", help="print LITE_LLM_SYSROOT= and LIBDIR= lines for a shell")
    args = parser.parse_args()
    sysroot = ensure(args.arch, args.work.resolve())
    if args.env:
        for k, v in flags(args.arch, sysroot).items():
            print(f"{k}={v}")
    else:
        print(sysroot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
