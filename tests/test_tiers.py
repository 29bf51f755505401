"""The test tiers (tests/conftest.py TIERS): README's test command runs the fast tier, `-m <tier>`
chooses others, a tier's files are not imported when it is not chosen, and under CI=true a skipped
test fails the run. Each case runs pytest in a subprocess on a scratch tree with this conftest."""
from __future__ import annotations

import ast
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "test_plain.py": "def test_plain():\n    pass\n",
    "test_peer.py": "import pytest\n\n@pytest.mark.peers\ndef test_peer():\n    pass\n",
    # a tier given by place (TIER_PATHS): importing it without the tier's package would fail
    "browser/test_page.py": "raise ImportError('imported although the browser tier was not chosen')\n",
    "test_skips.py": "import pytest\n\ndef test_skipped():\n    pytest.skip('a missing tool')\n",
}


def _run(tmp_path: Path, *args: str, ci: bool = False, files: dict = FILES) -> subprocess.CompletedProcess:
    tests = tmp_path / "tests"
    if not tests.exists():
        tests.mkdir()
        shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
        for name, text in files.items():
            (tests / name).parent.mkdir(exist_ok=True)
            (tests / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=str(ROOT), **({"CI": "true"} if ci else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args, "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_without_m_the_fast_tier_runs_and_tier_files_are_not_imported(tmp_path):
    r = _run(tmp_path, "-k", "not skipped")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 2 deselected" in r.stdout, r.stdout


def test_m_chooses_a_tier(tmp_path):
    r = _run(tmp_path, "-m", "peers")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 2 deselected" in r.stdout, r.stdout


def test_a_chosen_tier_by_place_is_collected(tmp_path):
    r = _run(tmp_path, "-m", "browser")
    assert r.returncode != 0 and "imported although the browser tier was not chosen" in r.stdout, r.stdout


def test_under_ci_a_skipped_test_fails_the_run(tmp_path):
    outside = _run(tmp_path, "-k", "skipped")
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    ci = _run(tmp_path, "-k", "skipped", ci=True)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "CI=true: 1 test(s) skipped" in ci.stdout, ci.stdout


def test_what_this_machine_cannot_hold_is_deselected_not_skipped(tmp_path):
    """A test parametrized over an empty set (a kernel feature this CPU's builds lack) and, off
    x86, one marked x86_host leave the run green under CI=true, counted as deselected."""
    files = {"test_machine.py": "import pytest\n\n@pytest.mark.parametrize('v', [])\ndef test_none(v):\n    pass\n\n"
                                "@pytest.mark.x86_host\ndef test_x86():\n    pass\n\ndef test_plain():\n    pass\n"}
    r = _run(tmp_path, ci=True, files=files)
    assert r.returncode == 0, r.stdout + r.stderr
    on_x86 = platform.machine() in ("x86_64", "AMD64")
    assert f"{2 if on_x86 else 1} passed, {1 if on_x86 else 2} deselected" in r.stdout, r.stdout


def test_the_kernel_suites_import_nothing_the_emulated_sysroots_lack():
    """tests/kernels also runs under qemu-user on aarch64 and s390x (.ci/emulated.py) in a sysroot
    with numpy, gguf, tokenizers, safetensors and pytest: no torch, no transformers there."""
    absent = {"torch", "transformers", "llama_cpp", "huggingface_hub"}
    found = []
    for path in sorted((ROOT / "tests" / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in absent]
    assert not found, found
