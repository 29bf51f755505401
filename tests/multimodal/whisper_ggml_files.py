"""whisper.cpp model files written from the format's definition (as whisper.cpp's
models/convert-h5-to-ggml.py writes them, and examples/quantize its quantized ones), of a tiny
random HF Whisper with Whisper's real token numbering (n_vocab 51865: 50257 text tokens, then the
special and timestamp tokens), so whisper.cpp's id rules apply to it."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from conftest import cache_dir, randomize_weights

N_VOCAB = 51865
N_TEXT = 50257
LANGS = ("en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
         "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
         "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
         "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
         "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
         "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su")      # openai-whisper's 99 (before yue)
_BUILT: dict[str, Path] = {}


def _byte_chars() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def text_tokens() -> list[bytes]:
    """The 50257 text tokens by id: the 256 bytes, then two-byte tokens (printable pairs first,
    so words merge), then three-byte ones built on them."""
    out = [bytes([b]) for b in range(256)]
    seen = set(out)
    letters = b" etaoinshrdlucmfwypvbgkjqxz"
    for a in letters:                       # the likeliest pairs first: low ranks merge first
        for b in letters:
            out.append(bytes([a, b]))
    seen.update(out)
    for a in letters:
        for b in letters:
            for c in letters[:12]:
                if len(out) < 20000 and bytes([a, b]) in seen and bytes([b, c]) in seen:
                    t = bytes([a, b, c])
                    if t not in seen:
                        out.append(t)
                        seen.add(t)
    for a in range(256):
        for b in range(256):
            if len(out) >= N_TEXT:
                return out
            t = bytes([a, b])
            if t not in seen:
                out.append(t)
                seen.add(t)
    return out


def special_names() -> list[str]:
    names = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in LANGS), "<|translate|>", "<|transcribe|>",
             "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    return names + [f"<|{i * 0.02:.2f}|>" for i in range(N_VOCAB - N_TEXT - len(names))]


def _tiktoken_merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """transformers' TikTokenConverter: each token the merge of what byte-pair encoding by rank leaves."""
    ranks = {t: i for i, t in enumerate(tokens)}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        parts = [bytes([b]) for b in tok]
        while True:
            pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            pairs = [(r, i) for r, i in pairs if r is not None and r < rank]
            if not pairs:
                break
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, tok
        merges.append((parts[0], parts[1]))
    return merges


def _save_tokenizer(out: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    chars = _byte_chars()

    def spell(b: bytes) -> str:
        return "".join(chars[x] for x in b)
    toks = text_tokens()
    tok = Tokenizer(models.BPE(vocab={spell(t): i for i, t in enumerate(toks)},
                               merges=[(spell(a), spell(b)) for a, b in _tiktoken_merges(toks)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_names()])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "WhisperTokenizer",
                                                           "eos_token": "<|endoftext|>"}))
    return {n: N_TEXT + i for i, n in enumerate(special_names())}, tok


def _generation_config(ids: dict[str, int], tok) -> dict:
    """openai-whisper's settings, as the openai/whisper-* generation_config.json hold them."""

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids
    symbols = list("\"#()*+/:;<=>@[\\]^_`{|}~「」『』") + \
        "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
    misc = "♩♪♫♬♭♮♯"
    sup = {enc(" -")[0], enc(" '")[0]}
    for s in symbols + list(misc):
        for t in (enc(s), enc(" " + s)):
            if len(t) == 1 or s in misc:
                sup.add(t[0])
    sup |= {ids[n] for n in ("<|translate|>", "<|transcribe|>", "<|startoftranscript|>", "<|startofprev|>",
                             "<|startoflm|>", "<|nospeech|>")}
    return {"decoder_start_token_id": ids["<|startoftranscript|>"], "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|endoftext|>"], "is_multilingual": True,
            "max_length": 448, "lang_to_id": {f"<|{c}|>": ids[f"<|{c}|>"] for c in LANGS},
            "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
            "no_timestamps_token_id": ids["<|notimestamps|>"], "prev_sot_token_id": ids["<|startofprev|>"],
            "max_initial_timestamp_index": 50, "begin_suppress_tokens": [enc(" ")[0], ids["<|endoftext|>"]],
            "suppress_tokens": sorted(sup)}


def whisper_ggml_checkpoint(d_model: int = 64, heads: int = 4, layers: int = 2, seed: int = 0) -> Path:
    """The HF directory of a tiny random multilingual Whisper numbered as the released ones (n_vocab
    51865), MLP 4 x d_model (whisper.cpp's), every weight a float16 value (so an F16 file holds the
    same model)."""
    key = f"{d_model}-{heads}-{layers}-{seed}"
    if key in _BUILT:
        return _BUILT[key]
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=N_VOCAB, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d_model,
                           decoder_ffn_dim=4 * d_model, num_mel_bins=80, max_source_positions=1500,
                           max_target_positions=448, pad_token_id=N_TEXT, bos_token_id=N_TEXT, eos_token_id=N_TEXT,
                           decoder_start_token_id=N_TEXT + 1, suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(config).eval()
    randomize_weights(model, 0.05)
    with torch.no_grad():       # a spread of logits over the text tokens the audio moves
        for p in model.model.decoder.layers.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.3)
        model.model.decoder.embed_tokens.weight.normal_(0.0, 0.3)
        model.model.decoder.embed_tokens.weight[N_TEXT + 16:] *= 0.3
        model.model.decoder.embed_positions.weight.normal_(0.0, 0.3)
        for layer in model.model.decoder.layers:
            for proj in (layer.encoder_attn.v_proj, layer.encoder_attn.out_proj):
                proj.weight.normal_(0.0, 0.25)
        for p in model.parameters():
            p.copy_(p.half().float())
    out = cache_dir("whisper_ggml_")
    model.save_pretrained(out, safe_serialization=True)
    ids, tok = _save_tokenizer(out)
    (out / "generation_config.json").write_text(json.dumps(_generation_config(ids, tok), indent=1))
    _BUILT[key] = out
    return out


# ---- the writer ---------------------------------------------------------------------------------

CONV_MAP = {"self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
            "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
            "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
            "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
            "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
            "encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
            "encoder.embed_positions.weight": "encoder.positional_embedding",
            "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
            "decoder.embed_positions.weight": "decoder.positional_embedding",
            "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}
F32_NAMES = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding", "decoder.positional_embedding")
FTYPE = {"F32": 0, "F16": 1, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_0": 2}
GGML_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8}


def ggml_name(hf: str) -> str | None:
    """openai-whisper's name of an HF tensor (convert-h5-to-ggml.py's mapping); None: not written."""
    nn = hf.removeprefix("model.").split(".")
    if nn[0] == "proj_out":
        return None
    if nn[1] == "layers":
        return ".".join([nn[0], "blocks", nn[2], CONV_MAP[".".join(nn[3:-1])], nn[-1]])
    name = ".".join(nn)
    return CONV_MAP.get(name, name)


def write_ggml(hf_dir: Path, out: Path, ftype: str = "F16") -> Path:
    """A whisper.cpp model file of the HF Whisper in hf_dir: F32, F16 (convert-h5-to-ggml.py's
    output) or a quantized type (examples/quantize applied to the F16 file: every 2-D tensor but
    the convolutions' biases and the positional embeddings, ftype + 1000 x GGML_QNT_VERSION 2)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from safetensors.numpy import load_file
    from transformers import WhisperFeatureExtractor
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    weights = load_file(str(hf_dir / "model.safetensors"))
    filters = WhisperFeatureExtractor(feature_size=cfg["num_mel_bins"]).mel_filters.T.astype("<f4")   # [n_mels, 201]
    quant = ftype not in ("F32", "F16")
    b = bytearray(struct.pack("<I", 0x67676D6C))
    b += struct.pack("<11i", cfg["vocab_size"], cfg["max_source_positions"], cfg["d_model"],
                     cfg["encoder_attention_heads"], cfg["encoder_layers"], cfg["max_target_positions"], cfg["d_model"],
                     cfg["decoder_attention_heads"], cfg["decoder_layers"], cfg["num_mel_bins"],
                     FTYPE[ftype] + (2000 if quant else 0))
    b += struct.pack("<2i", *filters.shape) + filters.tobytes()
    decoder = {c: byte for byte, c in _byte_chars().items()}
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    b += struct.pack("<i", len(vocab))
    for text, _ in vocab:
        raw = bytes(decoder[c] for c in text)
        b += struct.pack("<i", len(raw)) + raw
    for hf, data in weights.items():
        name = ggml_name(hf)
        if name is None:
            continue
        data = np.asarray(data, np.float32).squeeze()
        if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
            data = data.reshape(-1, 1)
        n_dims = data.ndim
        kind = "F32" if ftype == "F32" or n_dims < 2 or name in F32_NAMES else "F16"
        if quant and n_dims == 2 and name not in F32_NAMES:
            kind = ftype
        if kind == "F32":
            payload = data.astype("<f4").tobytes()
        elif kind == "F16":
            payload = data.astype("<f2").tobytes()
        else:       # quantize tool: the F16 file's values widened, then blocks
            payload = quantize(data.astype(np.float16).astype(np.float32), GGMLQuantizationType[kind]).tobytes()
        enc = name.encode()
        b += struct.pack("<3i", n_dims, len(enc), GGML_TYPE[kind])
        b += struct.pack(f"<{n_dims}i", *reversed(data.shape)) + enc + payload
    out.write_bytes(bytes(b))
    return out
