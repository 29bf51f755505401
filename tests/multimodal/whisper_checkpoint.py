"""Tiny random Whisper checkpoints built by transformers (WhisperConfig at tiny widths), saved as HF
WhisperForConditionalGeneration directories."""
from __future__ import annotations

from pathlib import Path

from conftest import cache_dir, randomize_weights

# width 64 of 4 heads (head size 16: the attention tiles); width 72 of 3 heads (24: the plain loop)
SHAPES = {"tiny80": dict(d_model=64, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=80),
          "tiny128": dict(d_model=64, encoder_attention_heads=4, encoder_ffn_dim=96, num_mel_bins=128),
          "odd_heads": dict(d_model=72, encoder_attention_heads=3, encoder_ffn_dim=80, num_mel_bins=80)}
_BUILT: dict[str, Path] = {}


def whisper_checkpoint(shape: str = "tiny80", std: float = 0.05, seed: int = 0) -> Path:
    """The HF directory of one tiny random Whisper (2 encoder and 2 decoder layers)."""
    key = f"{shape}-{std}-{seed}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(seed)
    s = SHAPES[shape]
    config = WhisperConfig(vocab_size=300, encoder_layers=2, decoder_layers=2, decoder_attention_heads=s[
        "encoder_attention_heads"], decoder_ffn_dim=s["encoder_ffn_dim"], max_source_positions=1500,
        max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        **s)
    model = WhisperForConditionalGeneration(config).eval()
    randomize_weights(model, std)
    out = cache_dir(f"whisper_{shape}_")
    model.save_pretrained(out, safe_serialization=True)
    _BUILT[key] = out
    return out
