"""The kernel dispatcher (lite_llm/_kernels/__init__.py): the best runnable variant is chosen,
LITE_LLM_ISA forces one, unknown or unrunnable variants are refused with a clear error (and
never imported: an AVX-512 build on an AVX2 CPU dies with SIGILL), explain() says why.

The oracle for "what this CPU can run" is /proc/cpuinfo (the kernel lists a feature only when
the CPU has it and the OS enabled its registers), independent of the _cpu probe under test.
Each built variant must also really be compiled for its own ISA: the module reports it, and
its machine code holds no instruction of a wider ISA.
"""
from __future__ import annotations

import importlib.machinery
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lite_llm import _kernels  # noqa: E402
from lite_llm._kernels import _cpu, variants  # noqa: E402

TABLE = variants.variants_for(platform.machine())
ISA_OF = {"generic": "scalar"}          # the generic build uses the plain-C vec_scalar.h
# _cpu.has names -> /proc/cpuinfo flag names where they differ
CPUINFO_NAME = {"avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
                "neon": "asimd"}


def _cpuinfo_flags() -> set[str]:
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features", "features"):
            flags.update(value.split())
    return flags


CPU_FLAGS = _cpuinfo_flags()


def _cpu_really_has(feature: str) -> bool:
    return CPUINFO_NAME.get(feature, feature) in CPU_FLAGS


def _is_built(name: str) -> bool:
    """A module of this interpreter's ABI (cross builds for other machines may sit beside it)."""
    pkg = ROOT / "lite_llm" / "_kernels" / name
    return any((pkg / f"kernels{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _expected_choice(hidden: frozenset[str] = frozenset()) -> str:
    """First variant of the table that is built and whose needs the CPU (minus `hidden`) has."""
    return next(v.name for v in TABLE
                if _is_built(v.name) and all(_cpu_really_has(f) and f not in hidden for f in v.needs))


def _passed_over(name: str, hidden: frozenset[str]) -> str:
    """Why the dispatcher must skip variant `name` here, in explain()'s words."""
    if not _is_built(name):
        return "not built"
    needs = next(v.needs for v in TABLE if v.name == name)
    return "CPU lacks " + ", ".join(f for f in needs if f in hidden or not _cpu_really_has(f))


def _expected_explain(chosen: str, hidden: frozenset[str] = frozenset()) -> list[str]:
    """explain() after choosing `chosen` (_expected_choice): each better variant of the table
    with why it was passed over, then the chosen one."""
    names = [v.name for v in TABLE]
    return [f"{n}: {_passed_over(n, hidden)}" for n in names[:names.index(chosen)]] + [f"{chosen}: chosen"]


# A child interpreter that imports the dispatcher fresh. With HIDE set, the CPU probe module is
# loaded first under its own name and its has() reports those features missing, so the
# dispatcher's import-time choice runs exactly as on a CPU without them.
_CHILD = textwrap.dedent("""
    import importlib.util, json, os, sys, types
    hidden = set(json.loads(os.environ.get("HIDE", "[]")))
    if hidden:
        so = os.environ["CPU_SO"]
        spec = importlib.util.spec_from_file_location("lite_llm._kernels._cpu", so)
        real = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(real)
        fake = types.ModuleType("lite_llm._kernels._cpu")
        fake.__dict__.update({k: v for k, v in real.__dict__.items() if not k.startswith("__")})
        fake.has = lambda f: f not in hidden and real.has(f)
        sys.modules["lite_llm._kernels._cpu"] = fake
    try:
        import lite_llm._kernels as K
    except ImportError as e:
        imported = sorted(m for m in sys.modules if m.endswith(".kernels"))
        print(json.dumps({"error": str(e), "imported": imported}))
        sys.exit(3)
    import numpy as np
    from lite_llm._kernels import layout
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.array([[1, 0, 2], [0, -1, 1]], np.float32)
    out = np.empty((2, 2), np.float32)
    K.kernels.gemm(x, layout.pack(w, "float32"), "float32", 2, out)
    imported = sorted(m for m in sys.modules if m.endswith(".kernels"))
    print(json.dumps({"variant": K.VARIANT.name, "isa": K.kernels.ISA, "explain": K.explain(),
                      "imported": imported, "gemm": out.tolist()}))
""")


def _child(isa: str | None = None, hide: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    import json
    env = {k: v for k, v in os.environ.items() if k != "LITE_LLM_ISA"}
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    if isa is not None:
        env["LITE_LLM_ISA"] = isa
    if hide:
        env["HIDE"] = json.dumps(list(hide))
        env["CPU_SO"] = _cpu.__file__      # this interpreter's build, not a cross build beside it
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return proc.returncode, result, proc.stderr


GEMM_EXPECTED = [[4.0, 1.0], [13.0, 1.0]]   # x = [[0,1,2],[3,4,5]] @ [[1,0,2],[0,-1,1]].T


# ---- the CPU probe -----------------------------------------------------------------------


@pytest.mark.parametrize("feature", sorted({f for v in TABLE for f in v.needs}) or ["none"])
def test_cpu_probe_agrees_with_proc_cpuinfo(feature):
    if feature == "none":        # a table without feature-gated variants (not x86)
        assert [v.name for v in TABLE] == ["generic"]
        return
    assert _cpu.has(feature) == _cpu_really_has(feature), feature


def test_cpu_probe_rejects_unknown_feature_names():
    with pytest.raises(ValueError, match="no_such_feature"):
        _cpu.has("no_such_feature")


# ---- every built variant is what it claims to be ------------------------------------------


@pytest.mark.variants
def test_available_lists_exactly_the_runnable_built_variants():
    expected = [v.name for v in TABLE if _is_built(v.name) and all(map(_cpu_really_has, v.needs))]
    assert _kernels.available() == expected
    assert "generic" in expected


@pytest.mark.parametrize("name", _kernels.available())
def test_variant_module_reports_its_own_isa(name):
    assert _kernels.load(name).ISA == ISA_OF.get(name, name)


# Instructions a variant must not contain (a wider ISA leaked into its flags), and one it
# must contain (proves the disassembly check sees real code).
_FORBIDDEN = {"generic": ("%ymm", "%zmm"), "avx2": ("%zmm", "vdpbf16ps"),
              "avx512": ("vdpbf16ps", "vpermb", "vpmultishiftqb", "vpshufbitqmb"),
              "avx512bf16": ()}
_REQUIRED = {"generic": "%xmm", "avx2": "%ymm", "avx512": "%zmm", "avx512bf16": "vdpbf16ps"}


@pytest.mark.parametrize("name", [n for n in _kernels.available() if n in _FORBIDDEN])
def test_variant_machine_code_matches_its_isa(name):
    """objdump over the built .so: registers/instructions of wider ISAs must be absent.
    Where binutils is missing, the module's reported ISA (compiled in from the vec.h
    backend actually selected) is the check."""
    module = _kernels.load(name)
    assert module.ISA == ISA_OF.get(name, name)
    objdump = shutil.which("objdump")
    if objdump is None:
        return
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", module.__file__], capture_output=True,
                          text=True, check=True).stdout
    for word in _FORBIDDEN[name]:
        assert word not in text, f"{name} build contains {word} instructions: wrong compiler flags"
    assert _REQUIRED[name] in text


# ---- choosing -----------------------------------------------------------------------------


def test_best_variant_is_chosen_at_import():
    code, result, err = _child()
    assert code == 0, err
    best = _expected_choice()
    assert result["variant"] == best == _kernels.available()[0]
    assert result["isa"] == ISA_OF.get(best, best)
    assert result["gemm"] == GEMM_EXPECTED
    assert result["imported"] == [f"lite_llm._kernels.{best}.kernels"]   # only the chosen one loads
    assert result["explain"] == _expected_explain(best)
    if _cpu_really_has("avx512bf16") and _is_built("avx512bf16"):
        assert result["explain"] == ["avx512bf16: chosen"]


@pytest.mark.parametrize("name", _kernels.available())
def test_lite_llm_isa_forces_a_variant(name):
    code, result, err = _child(isa=name)
    assert code == 0, err
    assert result["variant"] == name and result["isa"] == ISA_OF.get(name, name)
    assert result["imported"] == [f"lite_llm._kernels.{name}.kernels"]
    assert result["explain"] == [f"{name}: chosen (forced by LITE_LLM_ISA)"]
    assert result["gemm"] == GEMM_EXPECTED


def test_unknown_variant_name_is_a_clear_import_error():
    code, result, err = _child(isa="avx9000")
    assert code == 3, err
    assert "LITE_LLM_ISA='avx9000'" in result["error"]
    for v in TABLE:                                        # the message lists the valid names
        assert v.name in result["error"]
    assert result["imported"] == []
    with pytest.raises(ImportError, match="avx9000"):
        _kernels.load("avx9000")


def _best_gated_feature() -> str | None:
    """A feature that the best available variant needs and the next one does not."""
    avail = _kernels.available()
    if len(avail) < 2:
        return None
    best, nxt = (next(v for v in TABLE if v.name == n) for n in avail[:2])
    return next(f for f in best.needs if f not in nxt.needs)


@pytest.mark.variants
def test_variant_with_missing_cpu_features_is_refused_at_import():
    """As on a CPU without the best variant's feature: the next one is chosen, the refused
    module is never imported, and forcing it fails with the missing feature named."""
    feature = _best_gated_feature()
    if feature is None:       # only generic runs here: hide nothing, generic must still load
        code, result, err = _child(hide=("avx2",))
        assert code == 0 and result["variant"] == "generic", err
        return
    refused = _kernels.available()[0]
    hidden = frozenset({feature})
    code, result, err = _child(hide=(feature,))
    assert code == 0, err
    expected = _expected_choice(hidden)
    assert result["variant"] == expected != refused
    assert result["isa"] == ISA_OF.get(expected, expected)
    assert f"lite_llm._kernels.{refused}.kernels" not in result["imported"]
    assert result["explain"] == _expected_explain(expected, hidden)
    assert f"{refused}: CPU lacks {feature}" in result["explain"]
    assert result["gemm"] == GEMM_EXPECTED

    code, result, err = _child(isa=refused, hide=(feature,))
    assert code == 3, err
    assert f"{refused}: CPU lacks {feature}" in result["error"] and "LITE_LLM_ISA" in result["error"]
    assert result["imported"] == []


@pytest.mark.variants
def test_no_simd_features_falls_back_to_generic():
    hide = tuple(sorted({f for v in TABLE for f in v.needs}))
    code, result, err = _child(hide=hide)
    assert code == 0, err
    assert result["variant"] == "generic" and result["isa"] == "scalar"
    assert result["imported"] == ["lite_llm._kernels.generic.kernels"]
    assert result["gemm"] == GEMM_EXPECTED


@pytest.mark.variants
def test_chooser_refuses_in_process(monkeypatch):
    """The same refusal through the chooser itself, with _cpu.has patched: available(),
    load() and a forced choice all refuse the variant whose feature is missing."""
    feature = _best_gated_feature() or "avx2"
    real_has = _cpu.has
    monkeypatch.setattr(_kernels._cpu, "has", lambda f: f != feature and real_has(f))
    monkeypatch.delenv("LITE_LLM_ISA", raising=False)
    hidden = frozenset({feature})
    gated = [v.name for v in TABLE if feature in v.needs]
    reasons = []
    chosen = _kernels.choose(reasons)
    assert chosen.name == _expected_choice(hidden) and chosen.name not in gated
    assert reasons == _expected_explain(chosen.name, hidden)
    assert not set(gated) & set(_kernels.available())
    for name in gated:
        with pytest.raises(ImportError, match=name):
            _kernels.load(name)
        monkeypatch.setenv("LITE_LLM_ISA", name)
        with pytest.raises(ImportError, match=f"CPU lacks {feature}"):
            _kernels.choose([])


@pytest.mark.variants
def test_unbuilt_variant_is_skipped_and_explained(monkeypatch):
    best = _kernels.available()[0]
    real_built = _kernels.built
    monkeypatch.setattr(_kernels, "built", lambda v: v.name != best and real_built(v))
    monkeypatch.delenv("LITE_LLM_ISA", raising=False)
    reasons = []
    chosen = _kernels.choose(reasons)
    assert chosen.name != best
    assert f"{best}: not built" in reasons
    assert reasons[-1] == f"{chosen.name}: chosen"


def test_dispatched_module_is_the_chosen_variant():
    assert _kernels.kernels.ISA == ISA_OF.get(_kernels.VARIANT.name, _kernels.VARIANT.name)
    assert _kernels.kernels is _kernels.load(_kernels.VARIANT.name)
    x = np.ones((1, 3), np.float32)
    out = np.empty((1, 1), np.float32)
    from lite_llm._kernels import layout
    _kernels.kernels.gemm(x, layout.pack(np.full((1, 3), 2.0, np.float32), "float32"), "float32", 1, out)
    assert out[0, 0] == 6.0
