"""Incremental detokenization with real tokenizers trained in-process (byte-level BPE as in
GPT-2/SmolLM2, and a Metaspace BPE as in SentencePiece models), and stop-string matching."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lite_llm.engine.detokenizer import (ByteDetokenizer, IncrementalDetokenizer, find_stop, make_detokenizer,
                                         stop_holdback)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello there, how are you today?",
    "def add(a, b):\n    return a + b\n",
    "Numbers 12345 and symbols #@%&*.",
    "The weather is nice, the dog is happy.",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MULTIBYTE = "Grüße 😀 and 東京 🍣 café 🙂!"


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # small vocabulary and no multi-byte characters in the corpus: emoji and CJK characters
    # are encoded as several single-byte tokens
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="module")
def metaspace_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", *SPECIALS])
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def stream(tok, prompt_ids, output_ids, **kw) -> tuple[IncrementalDetokenizer, list[str]]:
    det = IncrementalDetokenizer(tok, prompt_ids, **kw)
    return det, [det.add(t) for t in output_ids]


@pytest.mark.parametrize("prompt,output", [
    ("Hello world", " and 東京 🍣 café"),
    ("The dog 😀", "😀🙂 Grüße!"),
    ("x", MULTIBYTE),
    ("東", "京"),
])
def test_byte_level_deltas_rebuild_the_text_without_broken_characters(byte_bpe, prompt, output):
    prompt_ids = byte_bpe.encode(prompt).ids
    output_ids = byte_bpe.encode(output).ids
    det, deltas = stream(byte_bpe, prompt_ids, output_ids)
    assert "".join(deltas) == det.text == byte_bpe.decode(output_ids) == output
    assert all("\ufffd" not in d for d in deltas)
    # the characters really were split across tokens: some tokens released nothing
    assert len(output_ids) > len(output.encode("utf-8")) // 2 and "" in deltas
    assert det.token_ids == output_ids


def test_emoji_split_across_tokens_is_held_back_until_complete(byte_bpe):
    ids = byte_bpe.encode("🍣").ids
    assert len(ids) == 4          # one token per UTF-8 byte
    det, deltas = stream(byte_bpe, byte_bpe.encode("I like").ids, ids)
    assert deltas == ["", "", "", "🍣"]


def test_special_tokens_skipped_or_kept(byte_bpe):
    prompt_ids = byte_bpe.encode("<|im_start|>user Hello<|im_end|>").ids
    out_ids = byte_bpe.encode("Hi there<|im_end|>").ids
    assert byte_bpe.token_to_id("<|im_end|>") in out_ids
    _, deltas = stream(byte_bpe, prompt_ids, out_ids, skip_special_tokens=True)
    assert "".join(deltas) == "Hi there"
    _, deltas = stream(byte_bpe, prompt_ids, out_ids, skip_special_tokens=False)
    assert "".join(deltas) == "Hi there<|im_end|>"


def test_metaspace_keeps_the_leading_space_of_a_continuation(metaspace_bpe):
    prompt_ids = metaspace_bpe.encode("The quick brown").ids
    out_ids = metaspace_bpe.encode("fox jumps over the dog", add_special_tokens=False).ids
    det, deltas = stream(metaspace_bpe, prompt_ids, out_ids)
    full = metaspace_bpe.decode(prompt_ids + out_ids)
    prefix = metaspace_bpe.decode(prompt_ids)
    assert det.text == full[len(prefix):] == " fox jumps over the dog"
    assert sum(1 for d in deltas if d) >= 5      # words arrive as they complete, not at the end


def test_long_generation_matches_full_decode(byte_bpe):
    text = (MULTIBYTE + " The quick brown fox. ") * 30
    ids = byte_bpe.encode(text).ids
    windows = []

    class Counting:        # the tokenizer as the detokenizer sees it, counting the ids of each decode
        def decode(self, window, **kw):
            windows.append(len(window))
            return byte_bpe.decode(window, **kw)

    det, deltas = stream(Counting(), [], ids)
    assert det.text == text
    assert max(windows) < 64     # the decode window stays short however long the output grows


@pytest.fixture(scope="module")
def byte_fallback_bpe() -> Tokenizer:
    """Llama/SentencePiece style: "▁" word pieces, and characters outside the vocabulary as
    <0xNN> byte tokens that the ByteFallback decoder joins back into UTF-8."""
    pieces = ["<unk>", *SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), "▁", "▁The", "▁quick", "▁brown",
              "▁fox", "▁and", "▁caf", "▁G", "r", "e", "!", "T", "h"]
    tok = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [], unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens(SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


@pytest.mark.parametrize("output", ["The quick brown fox and 東京 🍣 café Grüße!", MULTIBYTE, "🙂"])
def test_byte_fallback_tokens_release_whole_characters(byte_fallback_bpe, output):
    tok = byte_fallback_bpe
    prompt_ids = tok.encode("The quick").ids
    out_ids = tok.encode(output).ids
    assert any(tok.id_to_token(i).startswith("<0x") for i in out_ids)   # bytes really fell back
    det, deltas = stream(tok, prompt_ids, out_ids)
    full, prefix = tok.decode(prompt_ids + out_ids), tok.decode(prompt_ids)
    assert det.text == "".join(deltas) == full[len(prefix):]
    assert all("\ufffd" not in d for d in deltas)


def test_long_generation_is_incremental_with_the_project_tokenizer(byte_bpe):
    """The engine's Tokenizer (decode_ints: no per-call id conversion) gives the same text,
    and each token decodes a window of a few ids however long the output grows."""
    from lite_llm.model.tokenizer import Tokenizer as ProjectTokenizer
    text = (MULTIBYTE + " The quick brown fox. ") * 60
    ids = byte_bpe.encode(text).ids
    calls = []

    class Counting(ProjectTokenizer):     # counts the ids each decode_ints call is given
        def decode_ints(self, window, *args, **kw):
            calls.append(len(window))
            return super().decode_ints(window, *args, **kw)

    det = IncrementalDetokenizer(Counting(byte_bpe), byte_bpe.encode("Hello").ids)
    deltas = [det.add(t) for t in ids]
    assert "".join(deltas) == det.text == text
    assert len(calls) <= 2 * len(ids) + 1 and max(calls) < 16


# ---------------------------------------------------------------- byte table

def _project(tok):
    from lite_llm.model.tokenizer import Tokenizer as ProjectTokenizer
    return ProjectTokenizer(tok)


def _smollm2():
    """The default model's tokenizer (byte-level BPE, 49152 ids, added special tokens)."""
    from lite_llm.model.gguf import GGUFFile
    from lite_llm.model.loader import default_model_path
    from lite_llm.model.tokenizer import Tokenizer as ProjectTokenizer
    return ProjectTokenizer.from_gguf_metadata(GGUFFile(default_model_path()).metadata)


def _random_ids(rng, tok, vocab_size: int, num: int) -> list[int]:
    """Mostly random ids (single-byte tokens split characters, so invalid UTF-8 is common), some
    ids past the vocabulary, and some real text with multibyte characters and special tokens."""
    kind = rng.randrange(4)
    if kind == 0:
        return tok.encode(rng.choice([MULTIBYTE, "<|im_start|>user 東京<|im_end|>", "🍣🙂 é"]))[:num] or [0]
    return [rng.randrange(vocab_size + (8 if kind == 1 else 0)) for _ in range(num)]


@pytest.mark.parametrize("which", ["trained", "smollm2"])
def test_byte_table_decodes_as_the_tokenizer_does(byte_bpe, which):
    """decode(ids) == the lossy UTF-8 of the table's bytes joined, with special tokens kept or
    skipped, on many random id sequences (torn multibyte characters, unknown ids included)."""
    import random
    tok = _project(byte_bpe) if which == "trained" else _smollm2()
    vocab_size = tok.vocab_size
    rng = random.Random(0)
    num_replaced = 0
    for _ in range(1500):
        ids = _random_ids(rng, tok, vocab_size, rng.randrange(1, 14))
        for skip in (True, False):
            table = tok.byte_table(skip)
            ours = b"".join(table[i] if i < len(table) else b"" for i in ids).decode("utf-8", "replace")
            assert ours == tok.decode(ids, skip_special_tokens=skip), (ids, skip)
            num_replaced += "\ufffd" in ours
    assert num_replaced > 100        # invalid and torn sequences really were exercised


def test_sentencepiece_style_tokenizers_have_no_byte_table(metaspace_bpe, byte_fallback_bpe):
    """Their decoders strip a leading space and turn each bad byte into its own U+FFFD: decode is
    not a plain concatenation, so they keep the tokenizer-driven detokenizer."""
    for tok in (metaspace_bpe, byte_fallback_bpe):
        project = _project(tok)
        assert project.byte_table() is None
        assert isinstance(make_detokenizer(project, tok.encode("The quick").ids), IncrementalDetokenizer)


@pytest.mark.parametrize("which", ["trained", "smollm2"])
def test_byte_detokenizer_gives_the_reference_deltas(byte_bpe, which):
    """make_detokenizer's ByteDetokenizer releases exactly IncrementalDetokenizer's deltas, token by
    token, on random prompts and outputs; a prompt context ending inside a character keeps the
    reference detokenizer."""
    import random
    tok = _project(byte_bpe) if which == "trained" else _smollm2()
    vocab_size = tok.vocab_size
    rng = random.Random(1)
    kinds = set()
    for _ in range(400):
        prompt = _random_ids(rng, tok, vocab_size, rng.randrange(1, 8))
        output = _random_ids(rng, tok, vocab_size, rng.randrange(1, 40))
        skip = rng.random() < 0.7
        fast = make_detokenizer(tok, prompt, skip)
        ref = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        kinds.add(type(fast))
        assert [fast.add(t) for t in output] == [ref.add(t) for t in output], (prompt, output, skip)
        assert fast.text == ref.text and fast.token_ids == ref.token_ids == output
    assert kinds == {ByteDetokenizer, IncrementalDetokenizer}


def test_byte_detokenizer_holds_a_split_emoji_until_complete(byte_bpe):
    ids = byte_bpe.encode("🍣").ids
    det = make_detokenizer(_project(byte_bpe), byte_bpe.encode("I like").ids)
    assert isinstance(det, ByteDetokenizer)
    assert [det.add(t) for t in ids] == ["", "", "", "🍣"]


# ---------------------------------------------------------------- stop strings

def test_find_stop_truncates_before_or_after_the_stop_string():
    assert find_stop("Hello STOP there", 16, ["STOP"], False) == ("STOP", 6)
    assert find_stop("Hello STOP there", 16, ["STOP"], True) == ("STOP", 10)
    assert find_stop("Hello world", 11, ["STOP"], False) is None


def test_find_stop_only_searches_where_a_new_match_can_end():
    text = "abc STOP def STO"
    # "STOP" lies wholly in old text: the search must not find it again
    assert find_stop(text, 3, ["STOP"], False) is None
    text += "P"
    # the match straddles old and new text: found, and truncated at its start
    assert find_stop(text, 1, ["STOP"], False) == ("STOP", 13)
    assert find_stop(text, 1, ["STOP"], True) == ("STOP", len(text))


def test_find_stop_picks_the_earliest_of_several():
    text = "one two three"
    assert find_stop(text, len(text), ["three", "two"], False) == ("two", 4)
    assert find_stop(text, len(text), ["tw", "two"], False) == ("tw", 4)
    assert find_stop("x\n\n", 1, ["\n\n", "\n"], False) == ("\n\n", 1)


def test_stop_holdback_keeps_possible_beginnings():
    assert stop_holdback("Hello wor", ["world"]) == 3
    assert stop_holdback("Hello w", ["world", "xyz"]) == 1
    assert stop_holdback("Hello", ["world"]) == 0
    assert stop_holdback("ab", ["abc"]) == 2
    assert stop_holdback("aab", ["aabx", "bq"]) == 3
    assert stop_holdback("anything", []) == 0
    # a full stop string is for find_stop, not held back: only proper prefixes count
    assert stop_holdback("the end", ["end"]) == 0


def test_streaming_with_holdback_emits_exactly_the_truncated_text(byte_bpe):
    """Engine-style loop: detokenize, look for a stop, emit all but the held-back tail."""
    stop = ["東京", "STOP"]
    ids = byte_bpe.encode("Go to 東京 now").ids
    det = IncrementalDetokenizer(byte_bpe, byte_bpe.encode("Where?").ids)
    emitted = ""
    for t in ids:
        delta = det.add(t)
        text = det.text
        hit = find_stop(text, len(delta), stop, False)
        if hit:
            emitted += text[len(emitted):hit[1]]
            break
        safe = len(text) - stop_holdback(text, stop)
        assert safe >= len(emitted)
        emitted += text[len(emitted):safe]
        assert "東" not in emitted
    assert hit == ("東京", 6)
    assert emitted == "Go to "
