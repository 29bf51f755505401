"""Greedy tokens of a tiny random llama checkpoint: the x86 reference of the emulated tier.

    python tests/emulated/greedy.py --make DIR --out tokens.json

Saves the checkpoint (tests/conftest.build_tiny_checkpoint: transformers, safetensors) into DIR
once, then runs the same prompts greedily in fp32 with every kernel variant this machine runs
(each in its own interpreter, LITE_LLM_ISA forcing it); they must all agree, and their tokens
go to tokens.json. tests/emulated/dispatch.py generates the same under qemu and compares.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# token ids of the tiny byte-level vocabulary (320 entries): three prompts of different lengths
PROMPTS = [[1, 72, 101, 108, 108, 111], [1, 84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114], [1, 100]]
MAX_TOKENS = 12


def generate(model: str) -> list[list[int]]:
    """Greedy tokens of PROMPTS, fp32, with the dispatched kernel variant."""
    sys.path.insert(0, str(ROOT))
    from lite_llm import LLM, SamplingParams
    llm = LLM(model, dtype="float32", max_model_len=64, kv_cache_space=0.01, max_num_seqs=4)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make", type=Path, help="checkpoint directory (built when missing)")
    parser.add_argument("--out", type=Path, help="where the tokens go (JSON)")
    parser.add_argument("--one", help="print this model's tokens with the dispatched variant (internal)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(generate(args.one)))
        return 0
    if not (args.make / "config.json").is_file():
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import build_tiny_checkpoint
        build_tiny_checkpoint("llama", args.make, std=0.5, seed=1)
    sys.path.insert(0, str(ROOT))
    from lite_llm import _kernels
    results = {}
    for variant in _kernels.available():
        env = {**os.environ, "LITE_LLM_ISA": variant, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, __file__, "--one", str(args.make)], env=env, capture_output=True,
                             text=True, check=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    first = next(iter(results.values()))
    differ = [v for v, toks in results.items() if toks != first]
    if differ:
        raise SystemExit(f"x86 variants disagree on the greedy tokens: {results}")
    args.out.write_text(json.dumps({"prompts": PROMPTS, "tokens": first, "variants": sorted(results)}))
    print(f"greedy tokens agree across {', '.join(results)}: {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
