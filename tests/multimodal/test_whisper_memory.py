"""What a Whisper model built from an HF directory keeps resident: its packed weights, vectors and
caches, not a float32 copy of every matrix beside the panels (which doubled the resident set of
an fp32 checkpoint)."""
from __future__ import annotations

import gc
import os
import tracemalloc
import types

import numpy as np

from lite_llm.multimodal.transcribe import WhisperModel
from whisper_checkpoint import whisper_asr_checkpoint


def _arrays(obj, seen: set, out: list, depth: int = 0) -> None:
    """Every ndarray reachable from obj through dicts, lists, tuples and instance attributes."""
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        out.append(obj)
        if isinstance(obj.base, np.ndarray):
            _arrays(obj.base, seen, out, depth + 1)
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)) and callable(obj) is False:
        items = list(vars(obj).values())
    else:
        return
    for v in items:
        _arrays(v, seen, out, depth + 1)


def test_packed_matrices_leave_no_float32_copy():
    path = whisper_asr_checkpoint()
    m = WhisperModel.from_pretrained(str(path), num_threads=1)
    enc, dec = m.encoder.cfg, m.decoder.cfg
    C, V = dec.hidden_size, dec.vocab_size
    shapes = {(C, C), (3 * C, C), (2 * C, C), (enc.intermediate_size, C), (C, enc.intermediate_size),
              (dec.intermediate_size, C), (C, dec.intermediate_size), (V, C), (C, 3 * enc.num_mel_bins), (C, 3 * C)}
    positions = {id(m.encoder.t["pos"]), id(m.decoder.t["pos"])}       # tables the forward reads as they are
    found = []
    _arrays(m.encoder, set(), found)
    _arrays(m.decoder, set(), found)
    kept = sorted({a.shape for a in found if a.dtype == np.float32 and a.shape in shapes and id(a) not in positions})
    assert not kept, f"float32 matrices kept beside their packed panels: {kept}"


def test_resident_bytes_after_load_are_the_packed_weights():
    """Bytes allocated by the load and still held, beyond the decoder's K/V pools: the packed
    weights (the fp32 checkpoint's bytes, panels padded to 16 rows) and small tables (the mel
    model, the tokenizer, vectors) under half of them at this width; a second float32 copy of
    the weights would double the first term."""
    path = whisper_asr_checkpoint(d_model=256)
    weights = os.path.getsize(os.path.join(path, "model.safetensors"))       # fp32: the packed panels' size
    gc.collect()
    tracemalloc.start()
    try:
        m = WhisperModel.from_pretrained(str(path), num_threads=1, max_requests=1, max_sequences=1)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    d = m.decoder
    pools = sum(a.nbytes for a in d.k_self + d.v_self + d.k_cross + d.v_cross)
    assert held - pools < 1.5 * weights, (held, pools, weights)


def _largest_matrix_bytes(path) -> int:
    from lite_llm.model.hf import SafetensorsCheckpoint
    ckpt = SafetensorsCheckpoint(str(path))
    return max(4 * int(np.prod(e.shape)) for e in ckpt.entries.values() if len(e.shape) >= 2)


def test_quantizing_at_load_holds_one_float32_matrix_at_most():
    """quantization="q8_0" from an fp32 checkpoint: the bytes alive at the load's peak beyond what
    the model keeps are under one float32 matrix of the checkpoint (a slice of rows is read,
    quantized and packed at a time). Reading the encoder's, then the decoder's float32 tensors
    whole before quantizing them held all of the decoder's at once: ~4x the largest here."""
    path = whisper_asr_checkpoint(d_model=512)
    largest = _largest_matrix_bytes(path)              # the embedding [V, C]: V 1774, C 512
    gc.collect()
    tracemalloc.start()
    try:
        m = WhisperModel.from_pretrained(str(path), num_threads=1, max_requests=1, max_sequences=1,
                                         quantization="q8_0")
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert m.decoder.mats["embed"][3] == "Q8_0"
    assert peak - held < largest, (peak, held, largest)


def test_quantized_slices_pack_as_the_whole_matrix(tmp_path):
    """pack_quantized's panels, a slice of rows at a time from parts whose ends are not on panel
    boundaries, given as arrays or read from a checkpoint, are the bytes of quantizing the
    stacked matrix whole and packing it (as it was packed before it was read in slices)."""
    from safetensors.numpy import save_file

    from lite_llm._kernels import kernels, layout
    from lite_llm.model.hf import SafetensorsCheckpoint
    from lite_llm.multimodal.whisper_stored import CheckpointMatrix, pack_quantized
    rng = np.random.default_rng(0)
    k = 64
    sizes = (layout.STREAM_ELEMENTS // k + 8, 1000, layout.STREAM_ELEMENTS // k - 3)   # slices straddle parts
    parts = [rng.standard_normal((n, k)).astype(np.float32) for n in sizes]
    whole = np.concatenate(parts)
    save_file({f"p{i}": p for i, p in enumerate(parts)}, str(tmp_path / "model.safetensors"))
    ckpt = SafetensorsCheckpoint(str(tmp_path))
    stored = [CheckpointMatrix.of(ckpt, f"p{i}") for i in range(len(parts))]
    for fmt in ("Q8_0", "Q4_0"):
        want = np.empty((-(-whole.shape[0] // 16), kernels.qpanel_bytes(fmt, k)), np.uint8)
        kernels.qpack_into(kernels.quantize_ggml(whole, fmt, 1), want, fmt, k, 1)
        for given in (parts, stored):
            got = pack_quantized(given, None, fmt, threads=2)
            assert got.shape == whole.shape and got.parts[0].format == fmt
            assert np.array_equal(got.data, want)
