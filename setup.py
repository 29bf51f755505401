"""Build: the kernel module once per ISA variant (lite_llm/_kernels/variants.py), plus the
CPU probe, the sampler and the step-batch helpers built once with baseline flags. All with OpenMP.

Each variant is a whole optimised C module (~2.8 MB of generated C), so a first build takes
minutes of CPU. Extensions compile side by side, and every compiled module is kept in a build
cache keyed by the hash of its sources (the .pyx, every .pxi/.pxd and src/ header), its flags,
the compiler, Cython and the Python ABI: a second `pip install -e` (README: the serve command,
then the test command) or a rebuild of unchanged sources copies the cached module instead of
compiling again. Cache: $LITE_LLM_BUILD_CACHE, else $XDG_CACHE_HOME/lite_llm/build, else
~/.cache/lite_llm/build; LITE_LLM_BUILD_CACHE=off disables it.

Which variants: every variant of the architecture for a wheel or a plain build (a wheel must run on
every CPU of its architecture); an editable install (`pip install -e .`, README's serve command)
compiles only the variant this CPU runs (asked through src/cpu_probe.c), so serve is ready in about
a minute from a fresh venv on 2 cores, and the test suite
(tests/kernel_build.py, README's test command) compiles the other variants this CPU can run, which
the tests compare. LITE_LLM_BUILD_VARIANTS=avx2,generic builds exactly those, =all every variant.
With gcc, a kernel module is compiled for link-time optimisation so its code generation, almost all
of its build, runs in parallel partitions (-flto=auto): one variant uses both cores of a small VM. The
modules are -O2 (Cython's glue gains nothing from -O3) and the kernel headers raise their own code to
-O3 (src/simd/hot.h), and each attention tile copy and GEMM tile shape is a function gcc optimises on its
own (src/kernels/attention.h, gemm.h): an editable install's four modules take about 60 CPU s on a Zen 4,
where the kernel module alone took 92 at -O3 throughout with one function per kernel.

LITE_LLM_BUILD_MACHINE=aarch64 builds another machine's variant table (with CC a cross compiler);
the emulated tier (.ci/emulated.py) cross-compiles with the same flags.
"""
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "lite_llm" / "_kernels"))
# the one variant table, shared with the dispatcher, and the flags every module is built with
from variants import CFLAGS, CYTHON_DIRECTIVES, OPENMP, variants_for  # noqa: E402
MACHINE = os.environ.get("LITE_LLM_BUILD_MACHINE") or platform.machine()


# Headers included by headers are invisible to Cython's dependency tracking: list them all, so
# a change to any of them rebuilds every module.
_DEPENDS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("src/**/*.h"), *ROOT.glob("lite_llm/**/*.pxi")])


if sys.platform == "darwin":   # Apple clang: OpenMP from Homebrew's libomp (wheels/cibuildwheel.toml)
    OPENMP_COMPILE, OPENMP_LINK = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
else:
    OPENMP_COMPILE, OPENMP_LINK = list(OPENMP), list(OPENMP)
# LITE_LLM_SYSROOT=DIR: compile and link against another glibc (wheels/sysroot.py: Debian 11's glibc
# 2.31 and libgomp, for manylinux wheels built without Docker); -L first, so -fopenmp's libgomp is
# the sysroot's and not the one beside the compiler
SYSROOT = os.environ.get("LITE_LLM_SYSROOT", "")
if SYSROOT:
    _libdir = Path(SYSROOT, "usr", "lib", sysconfig.get_config_var("MULTIARCH") or "")
    OPENMP_COMPILE = [f"--sysroot={SYSROOT}", *OPENMP_COMPILE]
    OPENMP_LINK = [f"--sysroot={SYSROOT}", f"-L{_libdir}", *OPENMP_LINK]


class _Ext(Extension):
    """An extension from one .pyx, cythonized only when the build cache lacks it."""

    def __init__(self, name, pyx, flags=(), cython_dir="base"):
        super().__init__(name, [pyx], include_dirs=["src"], depends=_DEPENDS,
                         extra_compile_args=[*CFLAGS, *OPENMP_COMPILE, *flags], extra_link_args=OPENMP_LINK)
        self.pyx, self.cython_dir, self.flags = pyx, cython_dir, tuple(flags)
        self.variant = cython_dir if name.endswith(".kernels") else None


# LITE_LLM_BUILD_VARIANTS=avx512bf16,generic builds only those (a quicker build while developing
# kernels; the dispatcher chooses among what is built), =all every variant of the architecture.
# Unset: every variant, except in an editable install for this machine (`pip install -e .`: this
# checkout, run here), which builds the variant the dispatcher picks on this CPU only; the test
# suite builds the others this CPU can run before it compares them (tests/kernel_build.py).
_wanted = os.environ.get("LITE_LLM_BUILD_VARIANTS", "").strip()
_only = {n for n in _wanted.split(",") if n and n != "all"}
_EDITABLE = any(a in ("editable_wheel", "develop") for a in sys.argv[1:])
HOST_ONLY = not _wanted and _EDITABLE and not os.environ.get("LITE_LLM_BUILD_MACHINE")
ext_modules = [_Ext(f"lite_llm._kernels.{v.name}.kernels", "lite_llm/_kernels/kernels.pyx", v.flags, v.name)
               for v in variants_for(MACHINE) if not _only or v.name in _only]
ext_modules += [_Ext("lite_llm._kernels._cpu", "lite_llm/_kernels/_cpu.pyx"),
                _Ext("lite_llm.engine._sampler", "lite_llm/engine/_sampler.pyx"),
                _Ext("lite_llm.engine._batch", "lite_llm/engine/_batch.pyx"),
                _Ext("lite_llm.engine._step", "lite_llm/engine/_step.pyx")]


def _say(line: str) -> None:
    """A progress line on stderr, and on the terminal too when pip captures stderr (it shows a
    build's output only with -v), so a first install says what it compiles and why it takes a while."""
    print(line, file=sys.stderr, flush=True)
    if not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as tty:
                tty.write(line + "\n")
        except OSError:
            pass


_CYTHONIZE = threading.Lock()


def _cache_dir() -> Path | None:
    where = os.environ.get("LITE_LLM_BUILD_CACHE", "")
    if where.lower() in ("off", "0", "none"):
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lite_llm" / "build"


def _source_digest() -> str:
    """Hash of every file a module's C can depend on: .pyx/.pxi/.pxd under lite_llm, .h/.c under src."""
    h = hashlib.sha256()
    files = sorted([*ROOT.glob("lite_llm/**/*.pyx"), *ROOT.glob("lite_llm/**/*.pxi"), *ROOT.glob("lite_llm/**/*.pxd"),
                    *ROOT.glob("src/**/*.h"), *ROOT.glob("src/**/*.c")])
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class CachedParallelBuildExt(build_ext):
    """Compile the extensions side by side (they are independent and each takes a while), each
    taken from the build cache when its sources, flags and tools are unchanged."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        # Python's own CFLAGS carry -g: debug info for megabytes of inlined kernels costs build
        # time and wheel size and serves nobody; the kernels' flags are the variants' own.
        for attr in ("compiler_so", "compiler", "linker_so"):
            if hasattr(self.compiler, attr):
                setattr(self.compiler, attr, [a for a in getattr(self.compiler, attr) if a != "-g"])
        self._cache = _cache_dir()
        if self._cache is not None:
            # a miss must compile: distutils would skip a module whose build/ output is newer than
            # its sources (say the empty file a killed link leaves) and the cache would keep it
            self.force = True
        self._digest = _source_digest()
        cc = self.compiler.compiler_so[0]
        try:
            self._cc_version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
        except OSError:
            self._cc_version = cc
        if "Free Software Foundation" in self._cc_version and sys.platform.startswith("linux"):
            # gcc: a kernel module's code generation (nearly all of its build: a few functions of
            # 100-200 KB of machine code each) in parallel link-time partitions, one per core
            for e in self.extensions:
                if e.variant:
                    e.extra_compile_args = [*e.extra_compile_args, "-flto"]
                    e.extra_link_args = [*e.extra_link_args, *e.extra_compile_args, "-flto=auto"]
        self._early = set()
        if HOST_ONLY:
            self.extensions = self._host_variant_only()
        todo = [e for e in self.extensions if not self._cached(e) and e.name not in self._early]
        if todo:
            kernels = [e.variant for e in todo if e.variant]
            why = ("an editable install compiles the kernels for this CPU only (the tests build the other "
                   "variants they compare; LITE_LLM_BUILD_VARIANTS=all builds every one)" if HOST_ONLY else
                   "the kernels are compiled once per instruction set so one install runs the fastest code each CPU has")
            _say(f"lite-llm: compiling {len(todo)} modules ({', '.join(e.name for e in todo)}), {self.parallel} at a time"
                 + (f", kernel variant{'s' * (len(kernels) > 1)} {', '.join(kernels)}: one to two minutes of CPU each"
                    + (" (generic, plain C: four)" if "generic" in kernels else "") + f"; {why}" if kernels else "")
                 + "; the result is cached for later installs" + (f" in {self._cache}" if self._cache else "") + ".")
        super().build_extensions()

    def _host_variant_only(self) -> list:
        """The extensions minus every kernel variant but the one the dispatcher picks on this CPU.
        The CPU is asked through src/cpu_probe.c, a small program on the dispatcher's own probe
        (cpu_features.h) that compiles in a fraction of a second, so the kernels' build starts at
        once; where that program cannot be built or run, through the CPU probe module, built first."""
        wanted = [f for v in variants_for(MACHINE) for f in v.needs]
        has = self._probe_program(sorted(set(wanted)))
        if has is None:
            has = self._probe_module()
        pick = next(v.name for v in variants_for(MACHINE) if all(has(f) for f in v.needs))
        return [e for e in self.extensions if e.variant in (None, pick)]

    def _probe_program(self, names):
        import tempfile
        try:
            with tempfile.TemporaryDirectory() as tmp:
                objs = self.compiler.compile([str(ROOT / "src" / "cpu_probe.c")], output_dir=tmp,
                                             include_dirs=[str(ROOT / "src")])
                exe = str(Path(tmp) / "cpu_probe")
                self.compiler.link_executable(objs, exe)
                out = subprocess.run([exe, *names], capture_output=True, text=True, check=True).stdout.split()
        except Exception as e:   # a compiler that cannot link programs, a temp dir that cannot run them
            print(f"lite-llm: CPU probe program not usable ({e}); building the probe module first", file=sys.stderr)
            return None
        found = dict(zip(names, (int(v) for v in out)))
        return lambda f: found.get(f) == 1

    def _probe_module(self):
        import importlib.util
        (cpu_ext,) = [e for e in self.extensions if e.name == "lite_llm._kernels._cpu"]
        self.build_extension(cpu_ext)
        self._early = {cpu_ext.name}
        spec = importlib.util.spec_from_file_location(cpu_ext.name, self.get_ext_fullpath(cpu_ext.name))
        cpu = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cpu)
        return cpu.has

    def _key(self, ext) -> str:
        import Cython
        h = hashlib.sha256()
        for part in (self._digest, ext.name, ext.pyx, repr(ext.extra_compile_args), repr(ext.extra_link_args),
                     repr(self.compiler.compiler_so), repr(getattr(self.compiler, "linker_so", "")), self._cc_version, Cython.__version__,
                     sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version, repr(CYTHON_DIRECTIVES)):
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:32]

    def _cached(self, ext) -> Path | None:
        if self._cache is None:
            return None
        path = self._cache / self._key(ext) / Path(self.get_ext_filename(ext.name)).name
        return path if path.is_file() and path.stat().st_size > 0 else None

    def build_extension(self, ext):
        if ext.name in self._early:          # the CPU probe, built before the variant was chosen
            return
        out = Path(self.get_ext_fullpath(ext.name))
        hit = self._cached(ext)
        if hit is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(hit, out)
            print(f"lite-llm: {ext.name} unchanged, reused from the build cache", file=sys.stderr)
            return
        from Cython.Build import cythonize
        # one cythonize at a time: the parallel build's threads share Cython's per-source state,
        # and two variants of one .pyx translated at once can each get the other's module name
        with _CYTHONIZE:
            (cext,) = cythonize([Extension(ext.name, [ext.pyx], include_dirs=ext.include_dirs)],
                                build_dir=f"build/cython/{ext.cython_dir}", compiler_directives=CYTHON_DIRECTIVES,
                                quiet=True, force=True)
        if ext.name.encode() not in Path(cext.sources[0]).read_bytes():
            raise RuntimeError(f"{cext.sources[0]} was not translated as {ext.name}")
        # cythonize remembers per-source options across calls and would hand this variant every
        # earlier variant's flags too (an AVX-512 "generic" build): set them here, exactly.
        ext.sources = cext.sources
        super().build_extension(ext)
        ext.sources = [ext.pyx]
        if self._cache is not None and out.stat().st_size > 0:
            dest = self._cache / self._key(ext)
            try:
                dest.mkdir(parents=True, exist_ok=True)
                tmp = dest / f".{out.name}.{os.getpid()}"
                shutil.copyfile(out, tmp)
                os.replace(tmp, dest / out.name)   # atomic: a concurrent build never sees half a file
            except OSError as e:                    # a read-only cache only costs the next build
                print(f"lite-llm: build cache not written ({e})", file=sys.stderr)


setup(ext_modules=ext_modules, cmdclass={"build_ext": CachedParallelBuildExt})
