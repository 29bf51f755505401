"""whisper.cpp's model files (ggml-tiny.bin ... ggml-large-v3-turbo-q5_0.bin): the legacy GGML
format its converters (models/convert-pt-to-ggml.py, convert-h5-to-ggml.py) and its quantize tool
write, read into Whisper's encoder and decoder with each matrix kept in its stored format (F16
panels, or Q8_0 / Q5_0 / Q5_1 / Q4_0 / ... blocks on the GEMM kernels GGUF models run on).

The file, every integer int32 and every value little-endian:

    magic 0x67676d6c ("ggml")
    hparams   n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer, n_text_ctx,
              n_text_state, n_text_head, n_text_layer, n_mels, ftype (+ 1000 x the quantization
              version in quantized files: 2 today)
    mel filters  n_mel, n_fft, then n_mel x n_fft float32
    vocab     count, then per token its length and its bytes (the text tokens; the special
              tokens' ids follow from n_vocab, as whisper.cpp computes them)
    tensors   until the end: n_dims, name length, ggml type, dims innermost first, name, data
              (no padding); names are openai-whisper's (encoder.conv1.weight,
              encoder.blocks.N.attn.query.weight, decoder.token_embedding.weight, ...)

Stored F32 whatever ftype says: vectors (biases, LayerNorms), the convolutions' biases (stored
[C, 1]) and both positional embeddings; the convolutions' weights (3-D) are F16 in every file
but an F32 one; every other matrix is of ftype's type.

The tokenizer: the file's token bytes are the byte-level BPE's vocabulary with ranks = ids (as
tiktoken's, which the converters read), so its merges are rebuilt from the ranks; the generation
settings an HF checkpoint ships in generation_config.json (special ids, suppressed tokens) are
derived as openai-whisper derives them. A lone ggml-*.bin is a complete model.
What does not live here: the encoder and decoder themselves (whisper.py, whisper_decoder.py).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace

import numpy as np

from lite_llm.model.files import ModelLoadError, pread_into
from lite_llm.model.gguf import NATIVE_TYPES, TENSOR_TYPES, dequantize
from lite_llm.model.tokenizer import Tokenizer, _byte_alphabet
from lite_llm.multimodal.whisper import WhisperEncoder, WhisperEncoderConfig, WhisperError
from lite_llm.multimodal.whisper_decoder import LANGUAGES, WhisperDecoder, WhisperDecoderConfig
from lite_llm.multimodal.whisper_stored import StoredMatrix, dense, is_stored, pack_encoder, pack_stored  # noqa: F401

MAGIC = 0x67676d6c
MAGIC_BYTES = struct.pack("<I", MAGIC)          # b"lmgg": the int written little-endian
QNT_VERSION_FACTOR = 1000
# ftype (ggml's enum ggml_ftype) -> the type of the file's matrices
FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K",
          12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
           "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")
MAX_NAME = 256                  # bytes of a tensor name (openai's are < 50)
MAX_TOKEN = 1 << 10             # bytes of a vocabulary token (whisper.cpp's buffer is 128)


class GGMLFileError(WhisperError, ModelLoadError):
    """A whisper.cpp model file that cannot be read (wrong magic, truncated, out-of-range header):
    a user's mistake, one line naming the file and what is wrong (the CLI prints it as such)."""


def is_ggml_file(path: str) -> bool:
    """Whether path is a file that opens with the ggml magic."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == MAGIC_BYTES
    except OSError:
        return False




@dataclass(frozen=True)
class TensorEntry:
    name: str
    type_name: str
    shape: tuple[int, ...]          # numpy order (outermost first): the file's dims reversed
    offset: int
    nbytes: int


class GGMLWhisperFile:
    """The header, mel filters, vocabulary and tensor index of a whisper.cpp model file; tensor
    data stays in the file until read."""

    def __init__(self, path: str):
        self.path = str(path)
        try:
            self.size = os.path.getsize(self.path)
            with open(self.path, "rb") as fh:
                self._parse(fh)
        except OSError as e:
            raise GGMLFileError(f"{self.path}: cannot be read ({e.strerror})") from None

    def _need(self, fh, n: int, what: str) -> bytes:
        b = fh.read(n)
        if len(b) != n:
            raise GGMLFileError(f"{self.path}: truncated whisper.cpp model file (it ends inside {what})")
        return b

    def _ints(self, fh, n: int, what: str) -> tuple[int, ...]:
        return struct.unpack(f"<{n}i", self._need(fh, 4 * n, what))

    def _parse(self, fh) -> None:
        head = fh.read(4)
        if head != MAGIC_BYTES:
            raise GGMLFileError(f"{self.path}: not a whisper.cpp model file (no ggml magic at its start)")
        self.hparams = dict(zip(HPARAMS, self._ints(fh, len(HPARAMS), "the hyperparameters")))
        ftype = self.hparams["ftype"] % QNT_VERSION_FACTOR
        if ftype not in FTYPES:
            names = ", ".join(sorted(set(FTYPES.values())))
            raise GGMLFileError(f"{self.path}: ftype {ftype} is not supported ({names})")
        self.ftype = FTYPES[ftype]
        h = self.hparams
        if min(h[k] for k in HPARAMS[:-1]) <= 0 or h["n_audio_state"] != h["n_text_state"]:
            raise GGMLFileError(f"{self.path}: hyperparameters out of range")
        n_mel, n_fft = self._ints(fh, 2, "the mel filters")
        if not 0 < n_mel * n_fft <= 1 << 20:
            raise GGMLFileError(f"{self.path}: mel filters of {n_mel} x {n_fft} values are out of range")
        self.filters = np.frombuffer(self._need(fh, 4 * n_mel * n_fft, "the mel filters"), "<f4").reshape(n_mel, n_fft)
        (count,) = self._ints(fh, 1, "the vocabulary")
        if not 0 <= count <= h["n_vocab"]:
            raise GGMLFileError(f"{self.path}: {count} vocabulary tokens for n_vocab {h['n_vocab']}")
        self.vocab: list[bytes] = []
        for _ in range(count):
            (n,) = struct.unpack("<I", self._need(fh, 4, "the vocabulary"))
            if n > MAX_TOKEN:
                raise GGMLFileError(f"{self.path}: a vocabulary token of {n} bytes (at most {MAX_TOKEN})")
            self.vocab.append(self._need(fh, n, "the vocabulary"))
        self.tensors: dict[str, TensorEntry] = {}
        while True:
            first = fh.read(12)
            if not first:
                break
            if len(first) != 12:
                raise GGMLFileError(f"{self.path}: truncated whisper.cpp model file (it ends inside a tensor header)")
            n_dims, name_len, ttype = struct.unpack("<3i", first)
            if not 1 <= n_dims <= 4 or not 0 < name_len <= MAX_NAME:
                raise GGMLFileError(f"{self.path}: a tensor header out of range (n_dims {n_dims}, "
                                    f"name of {name_len} bytes)")
            dims = self._ints(fh, n_dims, "a tensor header")
            name = self._need(fh, name_len, "a tensor header").decode("utf-8", "replace")
            if ttype not in TENSOR_TYPES or min(dims) <= 0:
                raise GGMLFileError(f"{self.path}: tensor {name} has ggml type {ttype} or dims {dims}, not supported")
            tname, block, block_bytes = TENSOR_TYPES[ttype]
            if dims[0] % block:
                raise GGMLFileError(f"{self.path}: tensor {name}: rows of {dims[0]} values are not whole "
                                    f"{tname} blocks")
            nbytes = int(np.prod(dims, dtype=np.int64)) // block * block_bytes
            offset = fh.tell()
            if offset + nbytes > self.size:
                raise GGMLFileError(f"{self.path}: truncated whisper.cpp model file (tensor {name} runs past its end)")
            self.tensors[name] = TensorEntry(name, tname, tuple(reversed(dims)), offset, nbytes)
            fh.seek(nbytes, os.SEEK_CUR)

    # ---- tensors -----------------------------------------------------------------------------

    def entry(self, name: str) -> TensorEntry:
        e = self.tensors.get(name)
        if e is None:
            raise GGMLFileError(f"{self.path}: the model file has no tensor {name}")
        return e

    def vector(self, name: str, size: int) -> np.ndarray:
        """float32 [size] of a vector (the convolutions' biases are stored [C, 1])."""
        e = self.entry(name)
        if int(np.prod(e.shape)) != size:
            raise GGMLFileError(f"{self.path}: {name} is {e.shape}, expected [{size}]")
        return self._values(e).reshape(size)

    def array(self, name: str, shape: tuple[int, int]) -> np.ndarray:
        e = self.entry(name)
        if e.shape != shape:
            raise GGMLFileError(f"{self.path}: {name} is {e.shape}, expected {shape}")
        return self._values(e)

    def _values(self, e: TensorEntry) -> np.ndarray:
        return StoredMatrix(self.path, e.type_name, (int(np.prod(e.shape[:-1])), e.shape[-1]), e.offset,
                            e.nbytes).values().reshape(e.shape)

    def matrix(self, name: str, rows: int | None = None, cols: int | None = None) -> StoredMatrix:
        """A weight [N, K] as stored; a conv1d weight [C, C_in, 3] as [C, 3 C_in] (column c * 3 +
        tap: the same bytes)."""
        e = self.entry(name)
        n, k = e.shape[0], int(np.prod(e.shape[1:]))
        if (rows is not None and n != rows) or (cols is not None and k != cols):
            raise GGMLFileError(f"{self.path}: {name} is {e.shape}, expected [{rows}, {cols}]")
        return StoredMatrix(self.path, e.type_name, (n, k), e.offset, e.nbytes)

    # ---- configs -----------------------------------------------------------------------------

    def encoder_config(self) -> WhisperEncoderConfig:
        h = self.hparams
        ffn = self.entry("encoder.blocks.0.mlp.0.weight").shape[0] if h["n_audio_layer"] else 4 * h["n_audio_state"]
        return WhisperEncoderConfig(num_mel_bins=h["n_mels"], hidden_size=h["n_audio_state"],
                                    num_heads=h["n_audio_head"], num_layers=h["n_audio_layer"],
                                    intermediate_size=ffn, max_source_positions=h["n_audio_ctx"])

    def decoder_config(self) -> WhisperDecoderConfig:
        h = self.hparams
        ffn = self.entry("decoder.blocks.0.mlp.0.weight").shape[0] if h["n_text_layer"] else 4 * h["n_text_state"]
        return WhisperDecoderConfig(vocab_size=h["n_vocab"], hidden_size=h["n_text_state"], num_heads=h["n_text_head"],
                                    num_layers=h["n_text_layer"], intermediate_size=ffn,
                                    max_target_positions=h["n_text_ctx"], max_source_positions=h["n_audio_ctx"])


# ---- canonical tensors ----------------------------------------------------------------------------

# our block names (whisper.py, whisper_decoder.py) -> openai-whisper's
_ATTN = (("q", "attn.query"), ("k", "attn.key"), ("v", "attn.value"), ("o", "attn.out"))
_CROSS = (("cq", "cross_attn.query"), ("ck", "cross_attn.key"), ("cv", "cross_attn.value"), ("co", "cross_attn.out"))
_MLP = (("up", "mlp.0"), ("down", "mlp.2"))


def _block(f: GGMLWhisperFile, t: dict, p: str, q: str, C: int, F: int, mats, norms) -> None:
    for ours, theirs in mats:
        n, k = {"up": (F, C), "down": (C, F)}.get(ours, (C, C))
        t[q + ours + ".w"] = f.matrix(p + theirs + ".weight", n, k)
        t[q + ours + ".b"] = np.zeros(n, np.float32) if ours in ("k", "ck") else f.vector(p + theirs + ".bias", n)
    for ours, theirs in norms:
        t[q + ours + ".w"], t[q + ours + ".b"] = f.vector(p + theirs + ".weight", C), f.vector(p + theirs + ".bias", C)


def read_encoder(f: GGMLWhisperFile, cfg: WhisperEncoderConfig) -> dict:
    """whisper.read_hf's tensors of the file's encoder: vectors float32, matrices StoredMatrix."""
    C, M, F = cfg.hidden_size, cfg.num_mel_bins, cfg.intermediate_size
    t = {"conv1.w": f.matrix("encoder.conv1.weight", C, 3 * M), "conv1.b": f.vector("encoder.conv1.bias", C),
         "conv2.w": f.matrix("encoder.conv2.weight", C, 3 * C), "conv2.b": f.vector("encoder.conv2.bias", C),
         "pos": f.array("encoder.positional_embedding", (cfg.max_source_positions, C)),
         "ln.w": f.vector("encoder.ln_post.weight", C), "ln.b": f.vector("encoder.ln_post.bias", C)}
    for i in range(cfg.num_layers):
        _block(f, t, f"encoder.blocks.{i}.", f"blk.{i}.", C, F, _ATTN + _MLP, (("ln1", "attn_ln"), ("ln2", "mlp_ln")))
    if C % cfg.num_heads:
        raise WhisperError(f"{f.path}: n_audio_state {C} is not {cfg.num_heads} heads")
    return t


def read_decoder(f: GGMLWhisperFile, cfg: WhisperDecoderConfig) -> dict:
    """whisper_decoder.read_hf's tensors of the file's decoder: vectors float32, matrices
    StoredMatrix ("embed" too: its rows are looked up as stored)."""
    C, F = cfg.hidden_size, cfg.intermediate_size
    t = {"embed": f.matrix("decoder.token_embedding.weight", cfg.vocab_size, C),
         "pos": f.array("decoder.positional_embedding", (cfg.max_target_positions, C)),
         "ln.w": f.vector("decoder.ln.weight", C), "ln.b": f.vector("decoder.ln.bias", C)}
    for i in range(cfg.num_layers):
        _block(f, t, f"decoder.blocks.{i}.", f"blk.{i}.", C, F, _ATTN + _CROSS + _MLP,
               (("ln1", "attn_ln"), ("ln2", "cross_attn_ln"), ("ln3", "mlp_ln")))
    if C % cfg.num_heads:
        raise WhisperError(f"{f.path}: n_text_state {C} is not {cfg.num_heads} heads")
    return t


# ---- tokenizer and generation settings ----------------------------------------------------------

@dataclass(frozen=True)
class SpecialIds:
    """Whisper's special tokens by n_vocab (whisper.cpp's whisper_vocab; openai-whisper's
    tokenizer): <|endoftext|>, <|startoftranscript|>, one token per language, <|translate|>,
    <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|>, then the
    timestamps."""
    n_vocab: int

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.multilingual)

    @property
    def eot(self) -> int:
        return 50256 + int(self.multilingual)

    def names(self) -> list[str]:
        """The special tokens' names from id eot to n_vocab - 1."""
        langs = list(LANGUAGES)[:self.num_languages]
        if len(langs) < self.num_languages:
            langs += [f"lang{i}" for i in range(len(langs), self.num_languages)]
        names = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in langs), "<|translate|>",
                 "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
        names += [f"<|{i * 0.02:.2f}|>" for i in range(self.n_vocab - self.eot - len(names))]
        return names


def merges_from_ranks(vocab: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The BPE merges of a byte-level vocabulary whose ids are merge ranks (tiktoken's): each
    token of two or more bytes is the merge of the two pieces byte-pair encoding with the lower
    ranks leaves of it (transformers' TikTokenConverter does the same); tokens no merge reaches
    give none."""
    ranks: dict[bytes, int] = {}
    for i, tok in enumerate(vocab):
        ranks.setdefault(tok, i)
    out = []
    for tok, rank in ranks.items():
        if len(tok) < 2 or ranks.get(tok) != rank:
            continue
        parts = [tok[i:i + 1] for i in range(len(tok))]
        while len(parts) > 2:
            best, at = None, -1
            for j in range(len(parts) - 1):
                r = ranks.get(parts[j] + parts[j + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, at = r, j
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2 and parts[0] in ranks and parts[1] in ranks:
            out.append((parts[0], parts[1]))
    return out


def build_tokenizer(vocab: list[bytes], special: SpecialIds):
    """lite_llm's Tokenizer of the file's vocabulary: byte-level BPE over text ids 0..eot-1 (a
    token the file lacks or leaves empty gets a placeholder no text encodes to), Whisper's special
    tokens from eot on."""
    import tokenizers
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    spelling = _byte_alphabet()
    text = list(vocab[:special.eot]) + [b""] * max(0, special.eot - len(vocab))
    spelled: dict[str, int] = {}
    for i, tok in enumerate(text):
        key = "".join(spelling[b] for b in tok)
        if not tok or key in spelled:
            key = f"<|unused{i}|>"
        spelled[key] = i
    merges = [("".join(spelling[x] for x in a), "".join(spelling[x] for x in b))
              for a, b in merges_from_ranks([t for t in text])]
    backend = tokenizers.Tokenizer(models.BPE(vocab=spelled, merges=merges, dropout=None, continuing_subword_prefix="",
                                              end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in special.names()])
    return Tokenizer(backend, eos_token="<|endoftext|>")


# openai-whisper's non-speech symbols (tokenizer.non_speech_tokens): suppressed unless asked not to
_SYMBOLS = list("\"#()*+/:;<=>@[\\]^_`{|}~「」『』") + \
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
_MISC = "♩♪♫♬♭♮♯"


def generation_settings(tokenizer, special: SpecialIds) -> dict:
    """What an HF checkpoint's generation_config.json holds for WhisperModel, derived as
    openai-whisper derives it (suppress_tokens "-1": the non-speech tokens and the special tokens
    that never appear in a transcript; begin_suppress_tokens: the space and <|endoftext|>)."""
    ids = {n: special.eot + i for i, n in enumerate(special.names())}

    def enc(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False)
    non_speech = {enc(" -")[0], enc(" '")[0]}
    for sym in _SYMBOLS + list(_MISC):
        for toks in (enc(sym), enc(" " + sym)):
            if toks and (len(toks) == 1 or sym in _MISC):
                non_speech.add(toks[0])
    sot = ids["<|startoftranscript|>"]
    suppress = non_speech | {ids[n] for n in ("<|translate|>", "<|transcribe|>", "<|startoftranscript|>",
                                              "<|startofprev|>", "<|startoflm|>", "<|nospeech|>")}
    langs = {n: i for n, i in ids.items() if sot < i < ids["<|translate|>"]}
    return {"decoder_start_token_id": sot, "eos_token_id": special.eot, "is_multilingual": special.multilingual,
            "lang_to_id": langs if special.multilingual else {},
            "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
            "no_timestamps_token_id": ids["<|notimestamps|>"], "prev_sot_token_id": ids["<|startofprev|>"],
            "max_initial_timestamp_index": 50, "begin_suppress_tokens": [enc(" ")[0], special.eot],
            "suppress_tokens": sorted(suppress)}


# ---- the model ------------------------------------------------------------------------------------

def load(path: str, kernels="auto", num_threads: int | None = None, max_requests: int = 2, max_sequences: int = 12):
    """(encoder, decoder, tokenizer, generation settings) of a whisper.cpp model file."""
    f = GGMLWhisperFile(path)
    if kernels == "auto":
        from lite_llm._kernels import kernels   # deferred: the reader works where no kernel build loads
    if num_threads is None:
        num_threads = max(1, len(os.sched_getaffinity(0)))
    ecfg, dcfg = f.encoder_config(), f.decoder_config()
    enc_t, dec_t = read_encoder(f, ecfg), read_decoder(f, dcfg)
    if kernels is None:
        enc_t, dec_t = dense(enc_t), dense(dec_t)
    # a quantized file's attention in bf16 (the encoder's) and the decoder's K/V blocks in int8 rows,
    # as weights quantized at load run (WhisperDecoder); F32 / F16 files keep float32 attention
    dtype = "float32" if f.ftype in ("F32", "F16") else "bfloat16"
    enc = WhisperEncoder(ecfg, enc_t, kernels, dtype, num_threads)
    dec = WhisperDecoder(dcfg, dec_t, kernels, dtype, num_threads, max_requests=max_requests,
                         max_sequences=max_sequences, kv_cache_dtype=None if dtype == "float32" else "int8")
    special = SpecialIds(dcfg.vocab_size)
    if special.eot + len(special.names()) != dcfg.vocab_size or special.num_languages < 1:
        raise WhisperError(f"{path}: n_vocab {dcfg.vocab_size} is not a Whisper vocabulary (51864 English, "
                           "51865 or 51866 multilingual)")
    tok = build_tokenizer(f.vocab, special)
    return enc, dec, tok, generation_settings(tok, special)
