"""README's test command completes what its serve command's editable install left out: every kernel
variant this CPU can run, built before collection (kernel_build.py, conftest's pytest_configure)."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sysconfig

import kernel_build
import pytest

from lite_llm import _kernels

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _tree(root, built):
    """A checkout at `root` with the real CPU probe and variant table, and stand-in files for the
    kernel variants in `built`."""
    k = root / "lite_llm" / "_kernels"
    k.mkdir(parents=True)
    shutil.copy(kernel_build.ROOT / "lite_llm" / "_kernels" / "variants.py", k)
    shutil.copy(kernel_build.ROOT / "lite_llm" / "_kernels" / f"_cpu{SUFFIX}", k)
    for name in built:
        (k / name).mkdir()
        (k / name / f"kernels{SUFFIX}").write_bytes(b"")
    return root


@pytest.mark.variants          # the variants tier builds them (conftest.py)
def test_after_configure_every_runnable_variant_is_built():
    assert kernel_build.missing_variants() == []
    assert "generic" in _kernels.available()


@pytest.mark.variants
def test_an_editable_install_misses_the_runnable_variants_but_its_own(tmp_path):
    runnable = _kernels.available()
    assert kernel_build.missing_variants(_tree(tmp_path, runnable[:1])) == runnable[1:]


def test_nothing_to_complete_where_nothing_is_installed(tmp_path):
    (tmp_path / "lite_llm" / "_kernels").mkdir(parents=True)
    assert kernel_build.missing_variants(tmp_path) == []


def test_a_developers_variant_choice_is_left_alone(monkeypatch):
    monkeypatch.setenv("LITE_LLM_BUILD_VARIANTS", "generic")
    monkeypatch.setattr(kernel_build, "missing_variants", lambda root=None: pytest.fail("looked for variants"))
    assert kernel_build.complete() == []


def test_a_failed_build_names_its_command(monkeypatch):
    monkeypatch.delenv("LITE_LLM_BUILD_VARIANTS", raising=False)
    monkeypatch.setattr(kernel_build, "missing_variants", lambda root=None: ["no_such_variant"])
    monkeypatch.setattr(kernel_build.subprocess, "run", lambda *a, **k: type("R", (), {"returncode": 1})())
    with pytest.raises(RuntimeError, match="LITE_LLM_BUILD_VARIANTS=no_such_variant .*setup.py build_ext --inplace"):
        kernel_build.complete(say=lambda line: None)


def test_setups_probe_program_answers_as_the_dispatchers_probe(tmp_path):
    """setup.py picks an editable install's one variant by running src/cpu_probe.c: for every
    feature a variant of any architecture needs (and an unknown name), its answer is the probe
    module's, so the install builds the variant the dispatcher then chooses."""
    from lite_llm._kernels import _cpu, variants

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler: the kernels could not have been built either")
    exe = tmp_path / "cpu_probe"
    src = kernel_build.ROOT / "src"
    subprocess.run([cc, f"-I{src}", str(src / "cpu_probe.c"), "-o", str(exe)], check=True)
    names = sorted({f for table in (variants.X86, variants.AARCH64, variants.S390X) for v in table for f in v.needs}
                   | {"no_such_feature"})
    answers = subprocess.run([str(exe), *names], capture_output=True, text=True, check=True).stdout.split()
    assert len(answers) == len(names)
    for name, answer in zip(names, answers):
        try:
            expected = 1 if _cpu.has(name) else 0
        except ValueError:                      # a name this machine's probe does not know
            expected = -1
        assert int(answer) == expected, name
    pick = next(v.name for v in variants.variants_for(platform.machine())
                if all(dict(zip(names, answers))[f] == "1" for f in v.needs))
    assert pick == _kernels.available()[0]     # the dispatcher's choice unless LITE_LLM_ISA forces one
