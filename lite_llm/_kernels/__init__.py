"""Choose the fastest kernel build this CPU can run, once, at import.

Variants are probed best first (variants.py); a variant module is imported only after the
CPU and OS are known to support its instructions (importing an AVX-512 build on an AVX2 CPU
dies with SIGILL). LITE_LLM_ISA=<name> forces one, with a clear error if it cannot run.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from types import ModuleType

from lite_llm._kernels import _cpu
from lite_llm._kernels.variants import Variant, variants_for

_REASONS: list[str] = []


def built(v: Variant) -> bool:
    """Whether variant v's kernels module is built here (importing it may still need CPU features)."""
    return importlib.util.find_spec(f"{__name__}.{v.name}.kernels") is not None


def runnable(v: Variant) -> bool:
    """Built here and every CPU feature it needs is present and enabled by the OS."""
    return built(v) and all(_cpu.has(f) for f in v.needs)


def available() -> list[str]:
    """Names of every variant this machine can run, best first (tests compare them all)."""
    return [v.name for v in variants_for(platform.machine()) if runnable(v)]


def choose(reasons: list[str] | None = None) -> Variant:
    """The best variant this CPU runs (or LITE_LLM_ISA's, if it can), one line per variant
    considered appended to reasons (the import's choice: explain())."""
    reasons = _REASONS if reasons is None else reasons
    forced = os.environ.get("LITE_LLM_ISA") or None
    variants = variants_for(platform.machine())
    if forced and forced not in {v.name for v in variants}:
        raise ImportError(f"LITE_LLM_ISA={forced!r} is not a kernel variant of this build "
                          f"({', '.join(v.name for v in variants)})")
    for v in variants:
        if forced and v.name != forced:
            continue
        missing = [f for f in v.needs if not _cpu.has(f)]
        if not built(v):
            reasons.append(f"{v.name}: not built")
        elif missing:
            reasons.append(f"{v.name}: CPU lacks {', '.join(missing)}")
        else:
            reasons.append(f"{v.name}: chosen" + (" (forced by LITE_LLM_ISA)" if forced else ""))
            return v
    raise ImportError(f"no kernel variant can run on this CPU (LITE_LLM_ISA={forced!r}): {'; '.join(reasons)}")


def load(name: str) -> ModuleType:
    """The kernels module of variant `name` (it must be runnable here)."""
    v = next((v for v in variants_for(platform.machine()) if v.name == name), None)
    if v is None or not runnable(v):
        raise ImportError(f"kernel variant {name!r} cannot run on this CPU")
    return importlib.import_module(f"{__name__}.{name}.kernels")


def explain() -> list[str]:
    """Why the dispatcher chose what it chose, one line per variant it considered."""
    return list(_REASONS)


VARIANT: Variant = choose()
kernels: ModuleType = importlib.import_module(f"{__name__}.{VARIANT.name}.kernels")
