"""Before the tests are collected: build the kernel variants this CPU can run that the install left out.

An editable install (README's serve command, `pip install -e .`) compiles only the kernel variant
this CPU runs, so the server is ready in about a minute. The tests compare every variant this CPU
can run with each other and with the plain-C `generic` one, so README's test command builds the
rest here, once: setup.py's build cache keeps every compiled module, so nothing is compiled twice
(the variant the install built is reused, not rebuilt). Only a checkout that lite_llm is imported
from is completed, and only when LITE_LLM_BUILD_VARIANTS is unset (a developer who set it chose
which variants to build).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path, register: bool = False):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:                       # a dataclass module must be found in sys.modules
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def missing_variants(root: Path = ROOT) -> list[str]:
    """Kernel variants this CPU can run that are not built in the checkout `root`, best first; []
    when its CPU probe is not built (nothing installed there)."""
    kernels = root / "lite_llm" / "_kernels"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cpu_path = kernels / f"_cpu{suffix}"
    if not cpu_path.is_file():
        return []
    # by path: importing the package lite_llm._kernels would choose a variant now
    variants = _load("_lite_llm_build_variants", kernels / "variants.py", register=True)
    cpu = _load("lite_llm._kernels._cpu", cpu_path)
    return [v.name for v in variants.variants_for(platform.machine())
            if all(cpu.has(f) for f in v.needs) and not (kernels / v.name / f"kernels{suffix}").is_file()]


def _imported_from_here() -> bool:
    found = importlib.util.find_spec("lite_llm")
    return found is not None and found.origin is not None and Path(found.origin).resolve() == ROOT / "lite_llm" / "__init__.py"


def complete(say=print) -> list[str]:
    """Build the missing variants in place (setup.py build_ext --inplace); returns their names.
    Raises RuntimeError, naming the command, when the build fails."""
    if os.environ.get("LITE_LLM_BUILD_VARIANTS") or not _imported_from_here():
        return []
    missing = missing_variants()
    if not missing:
        return []
    say(f"lite-llm tests: compiling kernel variant{'s' * (len(missing) > 1)} {', '.join(missing)} before "
        f"the tests compare every variant this CPU can run (the editable install built only the one it "
        f"runs): one to four minutes of CPU each, once: the build cache keeps them.")
    cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
    env = {**os.environ, "LITE_LLM_BUILD_VARIANTS": ",".join(missing)}
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        raise RuntimeError(f"building kernel variants {', '.join(missing)} failed: "
                           f"LITE_LLM_BUILD_VARIANTS={env['LITE_LLM_BUILD_VARIANTS']} {' '.join(cmd)} in {ROOT}")
    importlib.invalidate_caches()
    return missing
