"""OpenAI's completions and chat completions requests -> PreparedRequest, and /tokenize and
/detokenize: the body's fields checked (validation.py), the prompt rendered (chat.py) and
tokenized within the context window, the sampling parameters resolved against the model's
generation_config and the server's defaults.

Pure: JSON bodies in, a PreparedRequest or an ApiError naming the field out; no sockets and no
engine calls (server/generation.py submits and answers). The answer bodies are answers.py's.
"""
from __future__ import annotations

import time
from typing import Any

from lite_llm.sampling_params import BeamSearchParams
from lite_llm.multimodal import MediaError
from lite_llm.sampling_params import MAX_GRAMMAR_BYTES, MAX_LOGPROBS
from lite_llm.server import harmony
from lite_llm.server.chat import declared_tools, parse_messages, read_template_kwargs, render_chat, request_template
from lite_llm.server.context import Prompt, PreparedRequest, ServingContext, TokenizeSlots
from lite_llm.server.parsers import forced_tool_calls
from lite_llm.server.validation import (BEAM_NEUTRAL, NOT_WITH_BEAMS, CHAT_FIELDS, COMPLETION_FIELDS,
                                        MAX_COMPLETIONS, MAX_N, MAX_PROMPTS, MAX_STOP,
                                        MAX_STOP_LEN, ApiError, bad, check_fields, check_token_ids, get_bool,
                                        get_float, get_int, is_int, new_id, sampling_params, stream_options,
                                        structured_outputs, INT64_MAX, INT64_MIN, check_logit_bias)


def _sampling_kwargs(body: dict, ctx: ServingContext) -> dict:
    """SamplingParams kwargs from the body, defaults from the model's generation_config."""
    kw: dict[str, Any] = {}
    defaults = ctx.generation_defaults
    vals = {
        "temperature": get_float(body, "temperature", 0.0, 1e6),
        "top_p": get_float(body, "top_p", 0.0, 1.0, lo_open=True),
        "top_k": get_int(body, "top_k", -1, 2 ** 31 - 1),
        "min_p": get_float(body, "min_p", 0.0, 1.0),
        "repetition_penalty": get_float(body, "repetition_penalty", 0.0, 1e6, lo_open=True),
    }
    for name, v in vals.items():
        v = defaults.get(name) if v is None else v
        if v is not None:
            kw[name] = v
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_float(body, name, -2.0, 2.0)
        if v is not None:
            kw[name] = v
    seed = get_int(body, "seed", INT64_MIN, INT64_MAX)
    if seed is not None:
        kw["seed"] = seed
    kw["n"] = get_int(body, "n", 1, MAX_N, 1)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if (not isinstance(stop, list) or len(stop) > MAX_STOP
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in stop)):
            raise bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} "
                      f"non-empty strings of at most {MAX_STOP_LEN} characters", "stop")
        if stop:
            kw["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        kw["stop_token_ids"] = check_token_ids(ids, ctx.vocab_size, "stop_token_ids", allow_empty=True)
    kw["ignore_eos"] = get_bool(body, "ignore_eos", False)
    kw["min_tokens"] = get_int(body, "min_tokens", 0, ctx.max_model_len, 0)
    kw["skip_special_tokens"] = get_bool(body, "skip_special_tokens", True)
    kw["include_stop_str_in_output"] = get_bool(body, "include_stop_str_in_output", False)
    bias = body.get("logit_bias")
    if bias is not None:
        kw["logit_bias"] = check_logit_bias(bias, ctx.vocab_size)
    prompt_logprobs = get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS)
    if prompt_logprobs is not None:
        if get_bool(body, "stream", False):
            raise bad("'prompt_logprobs' is not supported when streaming; ask without 'stream'",
                      "prompt_logprobs")
        kw["prompt_logprobs"] = prompt_logprobs
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("'user' must be a string", "user")
    if "parallel_tool_calls" in body and body["parallel_tool_calls"] is not None \
            and not isinstance(body["parallel_tool_calls"], bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    structured = structured_outputs(body)
    if structured is not None:
        kw["structured_outputs"] = structured
    return kw


def max_tokens_for(requested: int | None, prompt_len: int, ctx: ServingContext,
                   default: int | None) -> int:
    """max_tokens within the context window; prompt + max_tokens beyond it is a 400 (as vLLM).
    None asked: the room the prompt leaves, at most the route's default (completions: 16), the
    model's generation_config max_new_tokens and the server's --default-max-tokens."""
    room = ctx.max_model_len - prompt_len
    if requested is not None:
        if prompt_len + requested > ctx.max_model_len:
            raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens. However, "
                      f"you requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
                      f"{requested} in the completion). Please reduce the prompt or max_tokens.",
                      "max_tokens")
        return requested
    if room < 1:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the prompt "
                  f"has {prompt_len} tokens, which leaves no room for a completion.", "prompt")
    gen_default = ctx.generation_defaults.get("max_tokens")
    candidates = [room] + [d for d in (default, gen_default, ctx.default_max_tokens) if d]
    return min(candidates)


def _common_fields(body: dict, ctx: ServingContext, allowed) -> tuple[str, bool, tuple[bool, bool], dict]:
    """What completions and chat read alike: (model, stream, (include_usage, continuous usage),
    sampling kwargs), after checking that every field of the body is one of `allowed`."""
    # best_of is vLLM's beam width with use_beam_search (sampling n of best_of is not implemented)
    check_fields(body, allowed | {"best_of"} if get_bool(body, "use_beam_search", False) else allowed)
    model = ctx.check_model(body)
    stream = get_bool(body, "stream", False)
    return model, stream, stream_options(body, stream), _sampling_kwargs(body, ctx)


def prepare_completion(body: dict, ctx: ServingContext) -> PreparedRequest:
    model, stream, (include_usage, continuous_usage), kw = _common_fields(body, ctx, COMPLETION_FIELDS)
    logprobs = get_int(body, "logprobs", 0, MAX_LOGPROBS)
    echo = get_bool(body, "echo", False)
    if echo and logprobs is not None:      # the prompt's tokens come with their logprobs too
        kw["prompt_logprobs"] = max(logprobs, kw.get("prompt_logprobs") or 0)
        if stream:
            raise bad("'echo' with 'logprobs' is not supported when streaming (the prompt's logprobs "
                      "come after its prefill); ask without 'stream'", "echo")
    add_special = get_bool(body, "add_special_tokens", True)
    prompts = _completion_prompts(body.get("prompt"), ctx, add_special)
    if len(prompts) * kw["n"] > MAX_COMPLETIONS:
        raise bad(f"at most {MAX_COMPLETIONS} completions (prompts x n) per request", "n")
    requested = get_int(body, "max_tokens", 1, 2 ** 31 - 1)
    # One SamplingParams for every prompt: max_tokens must fit the longest one.
    longest = max(len(p.token_ids) for p in prompts)
    kw["max_tokens"] = max_tokens_for(requested, longest, ctx, default=16)
    if logprobs is not None:
        kw["logprobs"] = logprobs
    params = sampling_params(kw)
    beam = _beam_search(body, kw, len(prompts))
    return PreparedRequest("completion", new_id("cmpl", body), int(time.time()), model, prompts,
                           params, stream, include_usage, continuous_usage, echo=echo, logprobs=logprobs,
                           prompt_logprobs=get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS),
                           system_fingerprint=ctx.system_fingerprint, beam=beam)


def _beam_search(body: dict, kw: dict, num_prompts: int):
    """use_beam_search (vLLM's extra field): BeamSearchParams of beam width best_of (else n),
    the n best beams returned; None without it. temperature, top_p, top_k, min_p and seed shape
    sampling only: a beam search takes them and samples nothing."""
    length_penalty = get_float(body, "length_penalty", -1e6, 1e6)
    if not get_bool(body, "use_beam_search", False):
        return None
    for name in NOT_WITH_BEAMS:
        value = body.get(name)
        if value is None or value is False or value == BEAM_NEUTRAL.get(name, None):
            continue
        raise bad(f"'{name}' cannot be combined with 'use_beam_search'", name)
    n = kw["n"]
    width = get_int(body, "best_of", 1, MAX_N)
    if width is not None and width < n:
        raise bad(f"'best_of' must be >= n ({n})", "best_of")
    width = width or n
    if num_prompts * width > MAX_COMPLETIONS:
        raise bad(f"at most {MAX_COMPLETIONS} beams (prompts x beam width) per request", "best_of" if "best_of" in body else "n")
    return BeamSearchParams(beam_width=width, max_tokens=kw["max_tokens"], ignore_eos=kw["ignore_eos"],
                            temperature=kw.get("temperature", 0.0), include_stop_str_in_output=kw["include_stop_str_in_output"],
                            length_penalty=1.0 if length_penalty is None else length_penalty)


def _completion_prompts(prompt: Any, ctx: ServingContext, add_special: bool) -> list[Prompt]:
    """prompt: a string, a list of strings, a list of token ids or a list of lists of ids."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise bad("'prompt' must be a string, a list of strings, a list of token ids or a list "
                  "of lists of token ids (non-empty)", "prompt")
    if len(items) > MAX_PROMPTS:
        raise bad(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            ids = _encode(ctx, item, add_special_tokens=add_special)
            text = item
        elif isinstance(item, list):
            ids = check_token_ids(item, ctx.vocab_size, "prompt")
            text = None
        else:
            raise bad("'prompt' list items must all be strings or all lists of token ids", "prompt")
        if not ids:
            raise bad("the prompt is empty (no tokens)", "prompt")
        if len(ids) >= ctx.max_model_len:
            raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                      f"prompt has {len(ids)} tokens.", "prompt")
        out.append(Prompt(text, list(ids)))
    return out


def check_prompt_size(ctx: ServingContext, text: str, param: str = "prompt") -> None:
    """Refuse, before tokenizing it, a text that cannot fit the context window.

    A token stands for at most ctx.max_token_bytes bytes of text, so a text of B bytes yields
    at least ceil(B / max_token_bytes) tokens: beyond max_model_len - 1 of them (the prompt must
    leave room for one generated token) it is refused without the tokenizer seeing it. The
    character count is a free lower bound on the byte count, checked first."""
    per_token = ctx.max_token_bytes
    if not per_token:
        return
    limit = per_token * (ctx.max_model_len - 1)     # the most bytes a prompt that fits can have
    size = len(text)
    if size <= limit // 4:                          # 4 bytes a character at most: fits for sure
        return
    if size <= limit:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        at_least = -(-size // per_token)
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"{'prompt' if param == 'prompt' else 'rendered messages'} of {size} bytes has at "
                  f"least {at_least} tokens (a token is at most {per_token} bytes).", param)


def _encode(ctx: ServingContext, text: str, add_special_tokens: bool, param: str = "prompt") -> list[int]:
    check_prompt_size(ctx, text, param)
    slots = ctx.tokenize_slots if len(text) >= TokenizeSlots.LONG_TEXT else None
    try:
        if slots is None:
            return list(ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        with slots:
            return list(ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except ApiError:
        raise
    except Exception as e:        # the tokenizer refusing a text is the text's fault
        raise bad(f"cannot tokenize the prompt: {e}", param) from None


def prepare_chat(body: dict, ctx: ServingContext, pixels: list[int] | None = None) -> PreparedRequest:
    """pixels: the decoded pixels of each image the request holds, filled as its images are
    decoded (a batch passes one list for all its conversations: its images share one bound)."""
    model, stream, (include_usage, continuous_usage), kw = _common_fields(body, ctx, CHAT_FIELDS)
    want_logprobs = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and top > 0 and not want_logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if want_logprobs else None
    images: list = []
    messages = parse_messages(body.get("messages"), images, ctx, pixels)
    add_generation_prompt = get_bool(body, "add_generation_prompt", True)
    template = request_template(body, ctx)
    template_kwargs = read_template_kwargs(body)
    tools, tool_choice = declared_tools(body)
    tool_parser = None
    parallel = body.get("parallel_tool_calls") is not False
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if tools and tool_choice != "none":
        tool_parser = ctx.tool_parser_of(template)
        if tool_parser is None and not forced:
            raise bad("'tools' with tool_choice \"auto\" need a tool call parser: start the server with "
                      "--tool-call-parser (this model's chat template shows no known tool call format)", "tools")
        # a forced answer follows the server's own grammar, so needs no parser: without one it is
        # vLLM's JSON list of calls
        tool_parser = tool_parser or "forced_json"
        template_kwargs = {**template_kwargs, "tools": tools}
        if forced:
            if "structured_outputs" in kw:
                raise bad("'tool_choice' \"required\" or a named function cannot be combined with an "
                          "output constraint (response_format, guided_*)", "tool_choice")
            try:
                kw["structured_outputs"] = forced_tool_calls(tool_parser, tools, tool_choice, parallel, ctx.tokenizer)
            except ValueError:      # the grammar holding every tool's schema is over its size cap
                raise bad(f"'tools' are too large for a forced tool call (their grammar would be longer than "
                          f"{MAX_GRAMMAR_BYTES} bytes)", "tools") from None
    if harmony.in_use(ctx.reasoning_parser, tool_parser):   # the parsers read harmony's special tokens
        kw["skip_special_tokens"] = False
    text = render_chat(ctx, messages, add_generation_prompt, template, template_kwargs)
    # The template already places BOS and friends: no second BOS (vLLM's default for chat).
    ids = _encode(ctx, text, add_special_tokens=get_bool(body, "add_special_tokens", False),
                  param="messages")
    if not ids:
        raise bad("the rendered chat prompt is empty (no tokens)", "messages")
    mm = None
    if images:   # each image's placeholder becomes its encoder output's length of tokens
        try:
            ids, mm = ctx.mm_processor.process(list(ids), images, ctx.media)
        except (MediaError, ValueError) as e:
            raise bad(str(e), "messages") from None
    if len(ids) >= ctx.max_model_len:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"messages have {len(ids)} tokens.", "messages")
    requested = get_int(body, "max_completion_tokens", 1, 2 ** 31 - 1)
    if requested is None:
        requested = get_int(body, "max_tokens", 1, 2 ** 31 - 1)
    kw["max_tokens"] = max_tokens_for(requested, len(ids), ctx, default=None)
    if logprobs is not None:
        kw["logprobs"] = logprobs
    params = sampling_params(kw)
    beam = _beam_search(body, kw, 1)
    if beam is not None and mm is not None:     # its beams would be new prompts without the images
        raise bad("images cannot be combined with 'use_beam_search'", "messages")
    return PreparedRequest("chat", new_id("chatcmpl", body), int(time.time()), model,
                           [Prompt(text, list(ids), mm)], params, stream, include_usage, continuous_usage,
                           logprobs=logprobs, reasoning_parser=ctx.reasoning_parser,
                           tool_parser=tool_parser, max_tool_calls=None if parallel else 1,
                           named_tool=isinstance(tool_choice, dict) and tool_parser is not None,
                           forced_tools=forced and tool_parser is not None,
                           prompt_logprobs=get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS),
                           system_fingerprint=ctx.system_fingerprint, beam=beam)


def tokenize(body: dict, ctx: ServingContext) -> dict:
    check_fields(body, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                        "return_token_strs", "chat_template", "chat_template_kwargs", "tools"})
    ctx.check_model(body)
    if ("prompt" in body) == ("messages" in body):
        raise bad("give exactly one of 'prompt' or 'messages'", "prompt")
    if "messages" in body:
        template = request_template(body, ctx)
        tools, _ = declared_tools({"tools": body.get("tools")})
        kwargs = {**read_template_kwargs(body), **({"tools": tools} if tools else {})}
        text = render_chat(ctx, parse_messages(body["messages"]),
                           get_bool(body, "add_generation_prompt", True), template, kwargs)
        param = "messages"
        ids = _encode(ctx, text, add_special_tokens=get_bool(body, "add_special_tokens", False), param=param)
    else:
        if not isinstance(body["prompt"], str):
            raise bad("'prompt' must be a string", "prompt")
        param = "prompt"
        ids = _encode(ctx, body["prompt"],
                                   add_special_tokens=get_bool(body, "add_special_tokens", True))
    # As the generation routes: no more tokens than the context holds (the byte bound of
    # check_prompt_size came first, so the tokenizer never saw a text far beyond it).
    if len(ids) > ctx.max_model_len:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"{param} {'have' if param == 'messages' else 'has'} {len(ids)} tokens.", param)
    strs = ctx.tokenizer.convert_ids_to_tokens(ids) if get_bool(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": list(ids),
            "token_strs": strs}


def detokenize(body: dict, ctx: ServingContext) -> dict:
    check_fields(body, {"model", "tokens"})
    ctx.check_model(body)
    ids = check_token_ids(body.get("tokens"), ctx.vocab_size, "tokens", allow_empty=True)
    return {"prompt": ctx.tokenizer.decode(ids, skip_special_tokens=False)}
