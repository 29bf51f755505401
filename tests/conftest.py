"""Shared fixtures: rng, and tiny random transformers checkpoints of every supported architecture.

`tiny_checkpoint(arch, **overrides) -> Path` saves a small random model with save_pretrained
(safetensors) plus a small byte-level BPE tokenizer and a chat template; results are cached
per (arch, overrides) for the session. `build_tiny_checkpoint` is the same without the
fixture, for helpers outside pytest.
"""
from __future__ import annotations

import atexit
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY_VOCAB = 320            # 256 byte symbols + learned merges + special tokens
TINY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Hello world! Hello there, how are you today?",
    "def main():\n    return 42\n",
    "Unicode: héllo wörld, naïve café, 日本語のテキスト.",
    "the cat sat on the mat; the dog ate the bone.",
] * 20

# shared geometry: hidden 64, 2 layers, 4 heads of 16, 2 kv heads
_BASE = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             bos_token_id=0, eos_token_id=2, pad_token_id=None)

ARCH_DEFAULTS: dict[str, dict] = {
    "llama": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0),
    "mistral": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=8),
    "qwen2": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0),
    "qwen3": dict(_BASE, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1000000.0, head_dim=24),
    "opt": dict(vocab_size=TINY_VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, word_embed_proj_dim=64, do_layer_norm_before=True,
                activation_function="relu", bos_token_id=0, eos_token_id=2, pad_token_id=1,
                tie_word_embeddings=True, dropout=0.0, attention_dropout=0.0),
}


def tiny_tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json (TINY_VOCAB entries) trained in-process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=TINY_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return tok.to_str()


def _model_class(arch: str):
    import transformers
    return {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
            "opt": (transformers.OPTConfig, transformers.OPTForCausalLM)}[arch]


def build_tiny_checkpoint(arch: str, out_dir: Path, std: float = 0.05, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `arch` model (safetensors) with tokenizer files into out_dir."""
    import torch
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer as HFTokenizer

    config_cls, model_cls = _model_class(arch)
    config = config_cls(**copy.deepcopy({**ARCH_DEFAULTS[arch], **overrides}))   # configs mutate dicts
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        # non-trivial weights: norms and biases off their 1/0 init so every tensor matters
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std)
            elif "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, std)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(tiny_tokenizer_json()),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token=None)
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.save_pretrained(out_dir)
    with open(out_dir / "generation_config.json", "w") as fh:
        json.dump({"bos_token_id": 0, "eos_token_id": [2], "temperature": 0.7, "top_p": 0.9,
                   "do_sample": True}, fh)
    return out_dir


_CACHE_ROOT = Path(tempfile.mkdtemp(prefix="lite_llm_tiny_"))
atexit.register(shutil.rmtree, _CACHE_ROOT, ignore_errors=True)
_BUILT: dict[tuple, Path] = {}


def tiny_checkpoint_path(arch: str, **overrides) -> Path:
    """Cached build_tiny_checkpoint: one directory per (arch, overrides) for the process."""
    key = (arch, json.dumps(overrides, sort_keys=True, default=str))
    if key not in _BUILT:
        _BUILT[key] = build_tiny_checkpoint(arch, _CACHE_ROOT / f"{arch}-{len(_BUILT)}", **overrides)
    return _BUILT[key]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """Factory: tiny_checkpoint("llama", tie_word_embeddings=True) -> Path of a saved checkpoint."""
    return tiny_checkpoint_path
