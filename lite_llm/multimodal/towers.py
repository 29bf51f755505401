"""What the vision towers share: their linear layers packed into the kernels' PackedModel
(_kernels/packed.py) for kernels.ClipModel (llava.py, gemma3.py) and kernels.VisionModel
(qwen2_5_vl.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from lite_llm.model.weights import bf16_to_f32, to_bf16


def float_tensors(ckpt, missing):
    """(names, get) of an HF safetensors checkpoint (model.hf.SafetensorsCheckpoint): its tensor
    names without a leading "model." (as transformers 5 saves them) to the stored names, and
    get(name) reading one as float32 (bf16 widened); a name it lacks raises missing(name)."""
    names = {n.removeprefix("model."): n for n in ckpt.entries}

    def get(name: str) -> np.ndarray:
        if name not in names:
            raise missing(name)
        a = ckpt.read(names[name])
        return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
    return names, get


def vit_packer(dtype: str):
    """(packed, mat) for a vision tower's kernel model (kernels.ClipModel, VisionModel): packed
    a PackedModel (_kernels/packed.py), mat(name, w, bias) packs one linear layer into it in the
    tower's dtype (bias kept float32)."""
    # deferred: the compiled kernels (which any _kernels module loads) load when an encoder is
    # built, so the processors work without them
    from lite_llm._kernels import layout
    from lite_llm._kernels.packed import PackedMatrix, PackedModel
    packed = PackedModel()

    def mat(name: str, w: np.ndarray, bias: np.ndarray | None = None) -> None:
        w = np.ascontiguousarray(w, np.float32)
        data = layout.pack(to_bf16(w) if dtype == "bfloat16" else w, dtype)
        packed.matrices[name] = replace(PackedMatrix.of_float(data, w.shape, dtype),
                                        bias=None if bias is None else np.ascontiguousarray(bias, np.float32))
    return packed, mat
