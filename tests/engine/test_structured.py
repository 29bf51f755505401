"""Structured outputs through the engine: llguidance matchers, the step's bitmask (overlapped
with forward() or computed before it), the compiled sampler's masking, and grammar ends
finishing requests. The default model (SmolLM2-135M-Instruct), sampled at temperature 1."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jsonschema
import pytest

from lite_llm import LLM, SamplingParams, StructuredOutputsParams
from lite_llm.engine.structured import Grammars, StructuredOutputs, grammar_of

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "color", "tags", "address"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm():
    llm = LLM(None, max_model_len=1024, kv_cache_space=0.25)
    yield llm
    llm.shutdown()


def _structured(llm) -> StructuredOutputs:
    return llm.llm_engine.structured


@pytest.mark.slow      # one of the longest: the slow tier (tests/conftest.py TIERS), which CI runs
def test_json_schema_outputs_validate_and_stop_at_the_grammar_end(llm):
    prompt = [{"role": "user", "content": "Describe a person as JSON."}]
    params = SamplingParams(temperature=1.0, max_tokens=300, seed=7,
                            structured_outputs=StructuredOutputsParams(json=PERSON))
    outs = llm.chat([prompt] * 12, [params.replace(seed=7 + i) for i in range(12)])
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), PERSON)
        assert c.token_ids[-1] not in llm.config.eos_token_ids   # stopped by the grammar, not EOS
    assert not _structured(llm).matchers                        # finished requests drop theirs


def test_overlapped_masks_give_the_tokens_of_masks_computed_before_forward(llm):
    """The mask computed on the helper thread during forward() and the one computed on the
    engine thread before it are the same masks: seeded requests give the same tokens, in a
    batch mixing constrained and unconstrained requests."""
    prompts = ["A person:", "Colors:", "Numbers:", "Tell me a story."]
    params = [SamplingParams(temperature=1.0, max_tokens=80, seed=3,
                             structured_outputs=StructuredOutputsParams(json=PERSON)),
              SamplingParams(temperature=1.0, max_tokens=20, seed=4,
                             structured_outputs=StructuredOutputsParams(choice=["red", "green", "blue"])),
              SamplingParams(temperature=1.0, max_tokens=20, seed=5,
                             structured_outputs=StructuredOutputsParams(regex=r" [0-9]{3}-[0-9]{4}")),
              SamplingParams(temperature=1.0, max_tokens=30, seed=6)]
    runs = []
    for overlap in (True, False):
        _structured(llm).overlap = overlap
        try:
            runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        finally:
            _structured(llm).overlap = True
    assert runs[0] == runs[1]


def test_choice_and_regex(llm):
    choices = ["red", "green", "blue"]
    outs = llm.generate(["My favourite colour is"] * 6, [
        SamplingParams(temperature=1.0, max_tokens=10, seed=s,
                       structured_outputs=StructuredOutputsParams(choice=choices)) for s in range(6)])
    assert all(o.outputs[0].text in choices and o.outputs[0].finish_reason == "stop" for o in outs)
    outs = llm.generate(["Call me at"] * 6, [
        SamplingParams(temperature=1.0, max_tokens=20, seed=s,
                       structured_outputs=StructuredOutputsParams(regex=r" \(\d{3}\) \d{3}-\d{4}"))
        for s in range(6)])
    for o in outs:
        assert re.fullmatch(r" \(\d{3}\) \d{3}-\d{4}", o.outputs[0].text), o.outputs[0].text
        assert o.outputs[0].finish_reason == "stop"


def test_grammar_end_stops_even_when_eos_is_ignored(llm):
    out = llm.generate(["Answer yes or no:"], SamplingParams(
        temperature=1.0, max_tokens=50, ignore_eos=True,
        structured_outputs=StructuredOutputsParams(choice=["yes", "no"])))[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_lark_and_gbnf_grammars(llm):
    lark = 'start: "x=" NUM ";"\nNUM: /[0-9]{1,4}/'
    gbnf = 'root ::= "y=" [a-c]{2} "."'
    outs = llm.generate(["Code:", "Code:"], [
        SamplingParams(temperature=1.0, max_tokens=20, structured_outputs=StructuredOutputsParams(grammar=g))
        for g in (lark, gbnf)])
    assert re.fullmatch(r"x=[0-9]{1,4};", outs[0].outputs[0].text)
    assert re.fullmatch(r"y=[a-c]{2}\.", outs[1].outputs[0].text)


@pytest.mark.parametrize("so,problem", [
    (dict(json={"type": "wat"}), "invalid JSON schema"),
    (dict(json={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}), "invalid JSON schema"),
    (dict(regex="[a-"), "invalid regex"),
    (dict(grammar="start: undefined_rule"), "invalid grammar"),
])
def test_bad_grammars_are_refused_naming_the_problem(llm, so, problem):
    with pytest.raises(ValueError, match=problem):
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(**so)))
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2))[0].outputs[0].token_ids  # still serving


def test_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice="abc")
    p = SamplingParams(guided_decoding=StructuredOutputsParams(regex="a+"))   # vLLM's older name
    assert p.structured_outputs.regex == "a+" and p.guided_decoding is None
    assert SamplingParams(structured_outputs={"json": '{"type": "object"}'}).structured_outputs.json == \
        {"type": "object"}


def test_compiled_grammars_are_cached_per_grammar(llm):
    grammars = llm.llm_engine.grammars
    p = StructuredOutputsParams(json={"type": "object", "properties": {"k": {"type": "integer"}}})
    first = grammars.template(p)
    assert grammars.template(StructuredOutputsParams(json=dict(p.json))) is first
    a, b = grammars.matcher(p), grammars.matcher(p)
    assert a is not b and a is not first
    assert grammar_of(StructuredOutputsParams(json_object=True)) != grammar_of(p)


def test_steps_without_constrained_sampling_rows_do_no_mask_work():
    """No matcher at all, or matchers only for requests that do not sample this step (a
    prefill chunk): start_step returns None and the sampler gets no mask."""
    so = StructuredOutputs(Grammars(None, 64, (0,)))
    req = SimpleNamespace(request_id="a", sampling_params=SamplingParams())
    chunk = SimpleNamespace(request=req, sample=True)
    assert so.start_step(SimpleNamespace(chunks=[chunk])) is None
    so.matchers["b"] = object()     # never reached: b is not sampling in this step
    b_chunk = SimpleNamespace(request=SimpleNamespace(request_id="b"), sample=False)
    assert so.start_step(SimpleNamespace(chunks=[chunk, b_chunk])) is None
