"""transformers' beam search as the reference of lite-llm's (tests/model/test_beam_search.py,
tests/server/test_beam_search_server.py), and a tiny checkpoint whose EOS the beams reach."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from conftest import cache_dir, tiny_checkpoint_path


def hf_beams(model, prompt: list[int], k: int, max_new: int, eos: int | None, length_penalty: float):
    """transformers' k best beams: (generated ids, score) best first; ids cut after their EOS."""
    out = model.generate(torch.tensor([prompt]), num_beams=k, num_return_sequences=k, do_sample=False,
                         max_new_tokens=max_new, length_penalty=length_penalty, eos_token_id=eos,
                         pad_token_id=eos if eos is not None else 0, early_stopping=False,
                         return_dict_in_generate=True, output_scores=True,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    beams = []
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()   # each beam's generated length
    for row, n, score in zip(out.sequences.tolist(), lengths, out.sequences_scores.tolist()):
        beams.append((row[len(prompt):len(prompt) + n], score))
    return beams


def frequent_token(model, prompts, k: int, max_new: int) -> int:
    """Of the tokens the unconstrained beams emit most, the first that, as EOS, ends transformers'
    returned beams at different lengths."""
    counts = Counter()
    for p in prompts:
        for ids, _ in hf_beams(model, p, k, max_new, None, 1.0):
            counts.update(ids)
    for tok, _ in counts.most_common(8):
        lengths = {len(ids) for p in prompts for ids, _ in hf_beams(model, p, k, max_new, tok, 1.0)}
        if len(lengths) > 2:
            return tok
    raise AssertionError("no frequent token ends the beams at different lengths")


def eos_checkpoint(arch: str, prompts, k: int, max_new: int, **overrides) -> tuple[Path, object, int]:
    """(a copy of the tiny `arch` checkpoint whose EOS is frequent_token's, the transformers
    model of the original, that EOS id)."""
    from transformers import AutoModelForCausalLM
    base = tiny_checkpoint_path(arch, **overrides)
    ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    eos = frequent_token(ref, prompts, k, max_new)
    path = cache_dir("beam-")
    for f in base.iterdir():
        path.joinpath(f.name).write_bytes(f.read_bytes())
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads(path.joinpath(name).read_text())
        cfg["eos_token_id"] = eos
        path.joinpath(name).write_text(json.dumps(cfg))
    return path, ref, eos
