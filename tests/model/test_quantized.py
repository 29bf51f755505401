"""Block-quantized GGUF files run as stored: tiny random Llama / Qwen2 / Qwen3 checkpoints
quantized by llama.cpp's own quantizer to each type, lite_llm's logits against transformers
loading the same file (it dequantizes every tensor to fp32), and the format each matrix
runs in."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from conftest import checkpoint_copy, gguf_from_hf
from test_parity import lite_logits, make_runner

# hidden 256 / ffn 512: rows of whole 256-value super-blocks, so the K-quant files hold
# Q4_K / Q6_K tensors and not llama.cpp's fallback types for odd row lengths
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
FTYPES = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
          "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0", "Q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
          "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
          "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
          "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS", "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
          "Q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S", "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
          "Q3_K_L": "LLAMA_FTYPE_MOSTLY_Q3_K_L", "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0",
          "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0", "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S"}
# (llama.cpp's IQ1_*, IQ2_* and IQ3_XXS need an importance matrix: gguf-written files test those)
NATIVE = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "IQ2_XXS",
          "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
          "TQ1_0", "TQ2_0", "MXFP4"}
PROMPTS = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41, 300, 12, 9, 77], [8, 1, 99]]


def quantize_with_llama_cpp(src, dst, ftype: str):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[ftype])
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize returned {rc}"
    return dst


@pytest.fixture(scope="module")
def f32_gguf(tiny_checkpoint, tmp_path_factory):
    """{arch: F32 GGUF of a tiny random checkpoint}."""
    out = {}
    # qwen3 with head_dim 128: transformers' GGUF config for qwen3 keeps its default head_dim
    for arch, extra in (("llama", {}), ("qwen2", {}), ("qwen3", {"hidden_size": 512, "head_dim": 128})):
        ckpt = tiny_checkpoint(arch, **{**SHAPE, **extra}, std=0.08)
        out[arch] = gguf_from_hf(ckpt, tmp_path_factory.mktemp(arch) / "f32.gguf", arch)
    return out


def _reference_logits(path, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.peers
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("ftype", sorted(FTYPES))
def test_quantized_file_logits_match_the_dequantized_reference(arch, ftype, f32_gguf, tmp_path):
    path = quantize_with_llama_cpp(f32_gguf[arch], tmp_path / f"{ftype}.gguf", ftype)
    kinds = _check_against_the_dequantized_reference(path, ftype)
    assert (ftype[:4] if "_K_" in ftype else ftype) in kinds, kinds   # the file's own type (Q3_K_M: Q3_K)


def _check_against_the_dequantized_reference(path, ftype: str) -> set[str]:
    """lite_llm's logits on the file against transformers on the same file; returns the formats
    the matrices ran in."""
    want = [_reference_logits(path, p) for p in PROMPTS]
    runner, _ = make_runner(path)
    kinds = {p for parts, _ in runner.formats.values() for p in parts}
    assert kinds and kinds <= NATIVE, kinds   # every matrix as stored
    # one shot (token tiles of 8 and a partial one), and a token at a time (the decode path)
    for chunk in (None, 1):
        for got, ref in zip(lite_logits(runner, PROMPTS, chunk), want):
            scale = ref.max(-1, keepdims=True) - ref.min(-1, keepdims=True)
            err = np.abs(got - ref) / scale
            # the int8 activation blocks (llama.cpp quantizes them alike) carry ~0.4 % error per
            # value; measured: max 1-3.3 %, median ~0.3 % of the logit range (llama.cpp on the
            # same files: max 2-4 %, median 0.3-0.5 %)
            assert err.max() < 0.04 and np.median(err) < 0.005, (ftype, chunk, err.max(), np.median(err))
    return kinds


@pytest.mark.parametrize("qname", ["MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"])
def test_gguf_written_file_logits_match_the_dequantized_reference(qname, tiny_checkpoint, tmp_path):
    """Types llama.cpp's quantizer does not write here (MXFP4: only for mixture-of-experts
    tensors; IQ1/IQ2: only with an importance matrix): every matrix, embedding and output
    included, written in that type by the gguf package (quantized, or random blocks of the
    codebook types scaled like the model's weights), run as stored."""
    from conftest import gguf_from_hf as write
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    kinds = _check_against_the_dequantized_reference(write(ckpt, tmp_path / f"{qname}.gguf", "llama", qname), qname)
    assert kinds == {qname}, kinds


def _llama_cpp_logits(path, ids: list[int]) -> np.ndarray:
    import llama_cpp
    model = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    model.eval(ids)
    out = np.asarray(model.scores[:len(ids)], np.float64)
    model.close()
    return out


@pytest.mark.peers
@pytest.mark.parametrize("ftype", ["Q2_K", "Q3_K_M"])
def test_low_bit_k_quant_files_agree_with_llama_cpp(ftype, f32_gguf, tmp_path):
    """Q2_K and Q3_K_M files as llama.cpp's quantizer writes them (no importance matrix; Q2_K /
    Q3_K matrices beside Q4_K / Q5_K / Q6_K ones): both engines run them as stored, on int8
    activation blocks; their logits agree within what those blocks carry, and so do their
    greedy picks."""
    path = quantize_with_llama_cpp(f32_gguf["llama"], tmp_path / f"{ftype}.gguf", ftype)
    runner, _ = make_runner(path)
    kinds = {p for parts, _ in runner.formats.values() for p in parts}
    assert ftype[:4] in kinds and kinds <= NATIVE, kinds
    same = total = 0
    for ids in PROMPTS:
        theirs = _llama_cpp_logits(path, ids)
        ours = lite_logits(runner, [ids])[0].astype(np.float64)
        err = np.abs(ours - theirs) / (theirs.max(-1, keepdims=True) - theirs.min(-1, keepdims=True))
        assert err.max() < 0.06 and np.median(err) < 0.01, (ftype, err.max(), np.median(err))
        same += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        total += len(ids)
    assert same / total >= 0.85, same / total


@pytest.mark.peers
def test_q8_0_at_load_runs_what_llama_cpp_writes(tiny_checkpoint, tmp_path):
    """A float checkpoint quantized at load to Q8_0 is the Q8_0 file llama.cpp writes from the
    same weights: the same packed bytes, so the same logits."""
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    path = quantize_with_llama_cpp(gguf_from_hf(ckpt, tmp_path / "f32.gguf", "llama"), tmp_path / "q8.gguf", "Q8_0")
    prompts = [[5, 17, 200, 33, 90, 250, 7, 64, 128, 3]]
    at_load, _ = make_runner(ckpt, quantization="q8_0")
    as_stored, _ = make_runner(path)
    assert at_load.formats == as_stored.formats
    assert {p for parts, _ in at_load.formats.values() for p in parts} == {"Q8_0"}
    np.testing.assert_array_equal(lite_logits(at_load, prompts)[0], lite_logits(as_stored, prompts)[0])


def test_q4_0_at_load_matches_the_dequantized_reference(tiny_checkpoint, tmp_path):
    """q4_0: the matrices in Q4_0, the LM head in Q8_0; against transformers on a copy of the
    checkpoint whose weights went through gguf's quantize + dequantize the same way."""
    import gguf
    from safetensors.numpy import save_file
    ckpt = tiny_checkpoint("llama", **SHAPE, std=0.08)
    ref_dir = tmp_path / "roundtrip"
    sd = checkpoint_copy(ckpt, ref_dir)
    for name, w in sd.items():
        if w.ndim == 2:
            qtype = gguf.GGMLQuantizationType.Q8_0 if name == "lm_head.weight" else gguf.GGMLQuantizationType.Q4_0
            sd[name] = gguf.quants.dequantize(gguf.quants.quantize(w.astype(np.float32), qtype), qtype).astype(w.dtype)
    save_file(sd, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    from transformers import AutoModelForCausalLM
    ref_model = AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    ids = [5, 17, 200, 33, 90, 250, 7, 64, 128, 3, 41]
    with torch.no_grad():
        want = ref_model(torch.tensor([ids])).logits[0].double().numpy()
    runner, _ = make_runner(ckpt, quantization="q4_0")
    assert runner.formats["lm_head"][0] == ("Q8_0",) and runner.formats["layers.0.down"][0] == ("Q4_0",)
    got = lite_logits(runner, [ids])[0]
    err = np.abs(got - want) / (want.max(-1, keepdims=True) - want.min(-1, keepdims=True))
    assert err.max() < 0.03 and np.median(err) < 0.005, (err.max(), np.median(err))


def test_bad_quantization_is_refused_with_the_choices(tiny_checkpoint):
    with pytest.raises(ValueError, match="quantization 'q3_k' is not supported; choose none, q8_0, q4_0"):
        make_runner(tiny_checkpoint("llama"), quantization="q3_k")
