"""Build: the kernel module once per ISA variant (lite_llm/_kernels/variants.py), plus the
CPU probe, the sampler and the step-batch helpers built once with baseline flags. All with OpenMP."""
import os
import platform
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lite_llm", "_kernels"))
from variants import variants_for  # noqa: E402  (the one variant table, shared with the dispatcher)

CFLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-std=gnu11",
          "-Wno-unused-function", "-Wno-unreachable-code"]
OPENMP = ["-fopenmp"]
CYTHON_DIRECTIVES = {"language_level": 3, "boundscheck": False, "wraparound": False,
                     "cdivision": True, "initializedcheck": False, "embedsignature": True}


def _ext(name, source, flags=()):
    return Extension(name, [source], include_dirs=["src"],
                     extra_compile_args=[*CFLAGS, *OPENMP, *flags], extra_link_args=OPENMP)


# LITE_LLM_BUILD_VARIANTS=avx512bf16,generic builds only those (a quicker build while developing
# kernels; the dispatcher chooses among what is built).
_only = {n for n in os.environ.get("LITE_LLM_BUILD_VARIANTS", "").split(",") if n}
ext_modules = []
for v in variants_for(platform.machine()):
    if _only and v.name not in _only:
        continue
    # Each variant in its own build dir: the generated C embeds the full module name.
    (ext,) = cythonize([_ext(f"lite_llm._kernels.{v.name}.kernels", "lite_llm/_kernels/kernels.pyx", v.flags)],
                       build_dir=f"build/cython/{v.name}", compiler_directives=CYTHON_DIRECTIVES)
    # cythonize remembers per-source options across calls and would hand this variant every
    # earlier variant's flags too (an AVX-512 "generic" build): set them again, exactly.
    ext.extra_compile_args = [*CFLAGS, *OPENMP, *v.flags]
    ext_modules.append(ext)
ext_modules += cythonize([_ext("lite_llm._kernels._cpu", "lite_llm/_kernels/_cpu.pyx"),
                          _ext("lite_llm.engine._sampler", "lite_llm/engine/_sampler.pyx"),
                          _ext("lite_llm.engine._batch", "lite_llm/engine/_batch.pyx")],
                         build_dir="build/cython/base", compiler_directives=CYTHON_DIRECTIVES)


class ParallelBuildExt(build_ext):
    """Compile the variants side by side: they are independent and each takes a while."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


setup(ext_modules=ext_modules, cmdclass={"build_ext": ParallelBuildExt})
