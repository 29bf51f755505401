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


# ---- a tiny Whisper that transcribes: Whisper's special tokens, a byte-level vocabulary -------------

LANGS = ("en", "zh", "de", "es", "ru", "ko", "fr", "ja")     # the first languages of Whisper's table


def asr_vocab() -> list[str]:
    """Token strings by id, in Whisper's order: text (the 256 byte-level characters), <|endoftext|>,
    <|startoftranscript|>, the languages, the task and prompt tokens, <|notimestamps|>, then the
    1501 timestamps <|0.00|> .. <|30.00|>."""
    from tokenizers.pre_tokenizers import ByteLevel
    text = sorted(ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    special = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in LANGS), "<|translate|>",
               "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    return text + special + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]


def _byte_of(ch: str) -> int:
    """The byte a byte-level character stands for (GPT-2's table)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs[cs.index(ord(ch))]


def _save_asr_tokenizer(out: Path, vocab: list[str]) -> dict[str, int]:
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(models.BPE(vocab={t: i for t, i in ids.items() if i < 256}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in vocab[256:]])
    assert all(tok.token_to_id(t) == i for t, i in ids.items())
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "WhisperTokenizer",
                                                           "eos_token": "<|endoftext|>"}))
    return ids


def whisper_asr_checkpoint(std: float = 0.3, seed: int = 0, d_model: int = 64, heads: int = 4,
                           dec_std: float = 0.3, pos_std: float = 0.3) -> Path:
    """The HF directory of a tiny random multilingual Whisper with Whisper's special tokens: a
    tokenizer.json (byte-level text tokens, then Whisper's special and timestamp tokens) and a
    generation_config.json as openai/whisper-* ship them (lang_to_id, task_to_id,
    no_timestamps_token_id, suppress_tokens, begin_suppress_tokens, max_initial_timestamp_index)."""
    import json
    key = f"asr-{std}-{seed}-{d_model}-{heads}-{dec_std}-{pos_std}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    vocab = asr_vocab()
    ids = {t: i for i, t in enumerate(vocab)}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=len(vocab), d_model=d_model, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model,
                           decoder_ffn_dim=2 * d_model, num_mel_bins=80, max_source_positions=1500,
                           max_target_positions=448, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                           decoder_start_token_id=sot, suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(config).eval()
    randomize_weights(model, 0.05)
    with torch.no_grad():       # a spread of logits: the output differs from token to token
        for name, p in model.model.decoder.layers.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, dec_std)
        model.model.decoder.embed_tokens.weight.normal_(0.0, std)
        model.model.decoder.embed_positions.weight.normal_(0.0, pos_std)
        model.model.decoder.embed_tokens.weight[256 + 16:] *= 0.3     # timestamps less likely than text
        for layer in model.model.decoder.layers:      # ... which the audio moves
            for proj in (layer.encoder_attn.v_proj, layer.encoder_attn.out_proj):
                proj.weight.normal_(0.0, 0.25)
    out = cache_dir("whisper_asr_")
    model.save_pretrained(out, safe_serialization=True)
    _save_asr_tokenizer(out, vocab)
    gen = {"decoder_start_token_id": sot, "eos_token_id": eot, "pad_token_id": eot, "bos_token_id": eot,
           "is_multilingual": True, "max_length": 448, "forced_decoder_ids": None,
           "lang_to_id": {f"<|{c}|>": ids[f"<|{c}|>"] for c in LANGS},
           "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
           "no_timestamps_token_id": ids["<|notimestamps|>"], "prev_sot_token_id": ids["<|startofprev|>"],
           "max_initial_timestamp_index": 50, "return_timestamps": False,
           # Whisper's: the space and EOT at the start; a few symbols anywhere (bytes # * + / < = >)
           "begin_suppress_tokens": [32, eot], "suppress_tokens": [35, 42, 43, 47, 60, 61, 62]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=1))
    _BUILT[key] = out
    return out
