"""NomicBert (nomic-embed-text v1 / v1.5): transformers has no native class (nomic ships remote
code), so a tiny random checkpoint is written here twice from the same weights: an HF-layout
directory as nomic's config.json and state dict spell it, checked against the NumPy spec
(tests/ref_ops.py nomic_bert), and a GGUF in llama.cpp's "nomic-bert" layout (written with the
gguf package), checked against llama.cpp's own embedding mode (llama-cpp-python) on that file."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ref_ops  # noqa: E402

from lite_llm import LLM  # noqa: E402

E, HEADS, F, LAYERS, TYPES, THETA, EPS = 64, 4, 96, 2, 2, 1000.0, 1e-12
SENTENCES = ["the quick brown fox jumps over the lazy dog.",
             "a tiny model embeds every sentence, one at a time or in a batch!",
             "rotary positions, swiglu and post norm: nomic's encoder",
             "search, retrieval and clustering need embeddings",
             "why?", "zebra " * 40 + "end"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab() -> list[str]:
    words = sorted({w for s in SENTENCES for w in s.replace(",", " ").replace(".", " ").replace("!", " ")
                    .replace("?", " ").replace(":", " ").replace("'", " ").split()})
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    return SPECIAL + list(".,!?:'") + letters + ["##" + c for c in letters] + [w for w in words if len(w) > 1]


def _weights(vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """nomic's state dict, random: matrices N(0, 0.2) (large enough that the attention and the MLP
    move the output well past the tolerances), LayerNorm weights around 1, biases small."""
    rng = np.random.default_rng(seed)

    def m(*shape):
        return rng.normal(0.0, 0.2, shape).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": m(vocab_size, E), "embeddings.token_type_embeddings.weight": m(TYPES, E),
         "emb_ln.weight": rng.uniform(0.5, 1.5, E).astype(np.float32), "emb_ln.bias": m(E)}
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        w.update({p + "attn.Wqkv.weight": m(3 * E, E), p + "attn.out_proj.weight": m(E, E),
                  p + "mlp.fc11.weight": m(F, E), p + "mlp.fc12.weight": m(F, E), p + "mlp.fc2.weight": m(E, F)})
        for n in ("norm1", "norm2"):
            w[p + n + ".weight"] = rng.uniform(0.5, 1.5, E).astype(np.float32)
            w[p + n + ".bias"] = m(E)
    return w


def _hf_dir(out: Path, w: dict, vocab: list[str]) -> Path:
    """nomic-embed-text's layout: config.json with nomic's keys, model.safetensors, a WordPiece tokenizer."""
    from safetensors.numpy import save_file
    from transformers import BertTokenizerFast
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
              "n_embd": E, "n_head": HEADS, "n_inner": F, "n_layer": LAYERS, "n_positions": 256,
              "vocab_size": len(vocab), "type_vocab_size": TYPES, "layer_norm_epsilon": EPS,
              "rotary_emb_base": THETA, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
              "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
              "prenorm": False, "causal": False, "max_trained_positions": 256, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config))
    save_file(w, str(out / "model.safetensors"))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(str(out / "vocab.txt"), do_lower_case=True).save_pretrained(out)
    return out


def _gguf(out: Path, w: dict, hf_dir: Path, vocab_size: int, qtype: str = "F32") -> Path:
    """The same weights as llama.cpp's "nomic-bert" GGUF (mean pooling): F32, or the layers'
    matrices in block type qtype (quantized by the gguf package; embeddings and norms F32)."""
    import gguf
    from lite_llm.bench.embed import add_wordpiece_vocab
    g = gguf.GGUFWriter(str(out), "nomic-bert")
    g.add_context_length(256)
    g.add_embedding_length(E)
    g.add_feed_forward_length(F)
    g.add_block_count(LAYERS)
    g.add_head_count(HEADS)
    g.add_layer_norm_eps(EPS)
    g.add_rope_freq_base(THETA)
    g.add_causal_attention(False)
    g.add_pooling_type(gguf.PoolingType.MEAN)
    g.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))

    def matrix(name: str, a: np.ndarray) -> None:
        if qtype == "F32":
            g.add_tensor(name, a)
        else:
            t = gguf.GGMLQuantizationType[qtype]
            g.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)

    add_wordpiece_vocab(g, str(hf_dir / "vocab.txt"), vocab_size, TYPES)
    g.add_tensor("token_embd.weight", w["embeddings.word_embeddings.weight"])
    g.add_tensor("token_types.weight", w["embeddings.token_type_embeddings.weight"])
    g.add_tensor("token_embd_norm.weight", w["emb_ln.weight"])
    g.add_tensor("token_embd_norm.bias", w["emb_ln.bias"])
    for i in range(LAYERS):
        p, b = f"encoder.layers.{i}.", f"blk.{i}."
        for ours, theirs in (("attn_qkv", "attn.Wqkv"), ("attn_output", "attn.out_proj"), ("ffn_up", "mlp.fc11"),
                             ("ffn_gate", "mlp.fc12"), ("ffn_down", "mlp.fc2")):
            matrix(b + ours + ".weight", w[p + theirs + ".weight"])
        for ours, theirs in (("attn_output_norm", "norm1"), ("layer_output_norm", "norm2")):
            g.add_tensor(b + ours + ".weight", w[p + theirs + ".weight"])
            g.add_tensor(b + ours + ".bias", w[p + theirs + ".bias"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return out


@pytest.fixture(scope="module")
def nomic(tmp_path_factory):
    root = tmp_path_factory.mktemp("nomic")
    vocab = _vocab()
    w = _weights(len(vocab))
    hf_dir = _hf_dir(root / "hf", w, vocab)
    return w, hf_dir, _gguf(root / "nomic-f32.gguf", w, hf_dir, len(vocab))


def _llama_cpp_embeddings(path: Path) -> tuple[list[list[int]], list[np.ndarray]]:
    """llama.cpp's token ids and embeddings (mean pooling, normalized) of SENTENCES from the file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    theirs = llama_cpp.Llama(str(path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2,
                             pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
    try:
        return ([theirs.tokenize(s.encode(), add_bos=True, special=False) for s in SENTENCES],
                [np.array(theirs.embed(s, normalize=True), np.float64) for s in SENTENCES])
    finally:
        theirs.close()


def _spec_embedding(w: dict, ids: list[int]) -> np.ndarray:
    """Mean over the sequence of the spec's hidden states, L2-normalized (nomic's sentence-transformers set-up)."""
    v = ref_ops.nomic_bert(w, np.array(ids), HEADS, EPS, THETA).mean(0)
    return v / np.linalg.norm(v)


def test_hf_layout_nomic_bert_matches_the_numpy_spec(nomic):
    """fp32 within 1e-4 of the spec, batched and one at a time; nomic's tokenizer ([CLS] A [SEP]) as
    transformers' BertTokenizerFast gives it; mean pooling and normalization by default."""
    from transformers import AutoTokenizer
    w, hf_dir, _ = nomic
    hf_tok = AutoTokenizer.from_pretrained(hf_dir)
    llm = LLM(str(hf_dir), dtype="float32")
    try:
        assert llm.runner_type == "pooling" and llm.pooling_client.spec.pooler.pooling_type == "MEAN"
        batched = [o for o in llm.embed(SENTENCES)]
        single = [llm.embed(s)[0] for s in SENTENCES]
    finally:
        llm.shutdown()
    for s, b, one in zip(SENTENCES, batched, single):
        assert b.prompt_token_ids == hf_tok(s)["input_ids"], s
        want = _spec_embedding(w, b.prompt_token_ids)
        np.testing.assert_allclose(b.outputs.embedding, want, atol=1e-4, err_msg=s)
        np.testing.assert_allclose(one.outputs.embedding, want, atol=1e-4, err_msg=s)


def test_hf_layout_nomic_bert_in_bf16(nomic):
    w, hf_dir, _ = nomic
    llm = LLM(str(hf_dir), dtype="bfloat16")
    try:
        outs = llm.embed(SENTENCES)
    finally:
        llm.shutdown()
    for o in outs:
        cos = float(np.dot(o.outputs.embedding, _spec_embedding(w, o.prompt_token_ids)))
        assert cos >= 0.999, cos


@pytest.mark.peers
def test_nomic_bert_gguf_matches_llama_cpp(nomic):
    """The "nomic-bert" GGUF: llama.cpp's WordPiece token ids and its embedding mode's vectors
    (mean pooling, normalized) within cosine 0.9999 in fp32; the same vectors as the HF layout."""
    w, hf_dir, gguf_path = nomic
    their_ids, their_vecs = _llama_cpp_embeddings(gguf_path)
    llm = LLM(str(gguf_path), dtype="float32")
    try:
        assert llm.runner_type == "pooling" and llm.pooling_client.spec.pooler.pooling_type == "MEAN"
        ours = llm.embed(SENTENCES)
    finally:
        llm.shutdown()
    for s, o, ids, v in zip(SENTENCES, ours, their_ids, their_vecs):
        assert o.prompt_token_ids == ids, s
        got = np.array(o.outputs.embedding)
        cos = float(got @ v / np.linalg.norm(got) / np.linalg.norm(v))
        assert cos >= 0.9999, (s, cos)
        np.testing.assert_allclose(got, _spec_embedding(w, ids), atol=1e-4, err_msg=s)


@pytest.mark.peers
def test_quantized_nomic_bert_gguf_matches_llama_cpp(nomic, tmp_path):
    """A Q8_0 nomic-bert GGUF (a quantized embedder): its blocks run as stored on the int8
    kernels; within cosine 0.999 of llama.cpp's embeddings from the same file."""
    w, hf_dir, _ = nomic
    path = _gguf(tmp_path / "nomic-q8_0.gguf", w, hf_dir, len(_vocab()), "Q8_0")
    _, their_vecs = _llama_cpp_embeddings(path)
    llm = LLM(str(path), dtype="float32")
    try:
        assert llm.info["weight_formats"]["layers.0.qkv"][0] == ("Q8_0",)
        ours = llm.embed(SENTENCES)
    finally:
        llm.shutdown()
    for s, o, v in zip(SENTENCES, ours, their_vecs):
        got = np.array(o.outputs.embedding)
        cos = float(got @ v / np.linalg.norm(got) / np.linalg.norm(v))
        assert cos >= 0.999, (s, cos)


def test_nomic_bert_variants_we_do_not_compute_are_refused(nomic, tmp_path):
    """A config with biases or rotary scaling (other NomicBert variants) is a clear load error."""
    import shutil
    _, hf_dir, _ = nomic
    for key, value in (("qkv_proj_bias", True), ("rotary_scaling_factor", 2.0), ("activation_function", "gelu")):
        d = tmp_path / key
        shutil.copytree(hf_dir, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(Exception, match=key):
            LLM(str(d), dtype="float32")
    assert os.path.isdir(hf_dir)
