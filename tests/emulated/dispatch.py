"""Run under emulation (qemu-user): the dispatcher picks the expected variant on this CPU and
says why, and the tiny model's greedy tokens equal the x86 run's (tests/emulated/greedy.py).

    dispatch.py --expect neon --model DIR --tokens tokens.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect", required=True, help="the variant the dispatcher must choose")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=Path, required=True)
    args = parser.parse_args()
    from lite_llm import _kernels
    print(f"{platform.machine()}: chose {_kernels.VARIANT.name} (ISA {_kernels.kernels.ISA}); "
          f"runnable: {', '.join(_kernels.available())}")
    for line in _kernels.explain():
        print(f"  {line}")
    ok = True
    if _kernels.VARIANT.name != args.expect or _kernels.kernels.ISA != args.expect:
        print(f"FAIL: expected {args.expect}")
        ok = False
    import greedy
    want = json.loads(args.tokens.read_text())["tokens"]
    got = greedy.generate(args.model)
    print(f"greedy tokens: {got}")
    if got != want:
        print(f"FAIL: x86 gave {want}")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
