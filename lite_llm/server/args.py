"""The `lite-llm serve` command line: build_parser's flags (vLLM's names where vLLM has them).

One function adds every serve flag; the flags of a part that owns its own (LoRA: lora_routes)
are added by one call to that part's add_arguments. What is not here: turning parsed flags into
an engine and a server (startup.py).
"""
from __future__ import annotations

import argparse

from lite_llm.config import KV_CACHE_DTYPES, speculative_config_arg
from lite_llm.model import hub
from lite_llm.server import lora_routes, models
from lite_llm.server.parsers import REASONING_PARSERS, TOOL_PARSERS
from lite_llm.server.responses import DEFAULT_STORE_MAX, DEFAULT_STORE_TTL
from lite_llm.server.transport import BODY_BYTES_PER_TOKEN, MAX_CONNECTIONS

DEFAULT_MAX_TOKENS = 2048              # output cap of a chat/Responses request naming none (--default-max-tokens)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("model", nargs="?", default=None,
      help="HF directory, .gguf file or Hugging Face name (ORG/NAME[:QUANT], fetched when missing; default: embedded SmolLM2-135M-Instruct)")
    a("--model", dest="model_flag", default=None, action=_ModelFlag, metavar="MODEL",
      help="a model to serve, as the MODEL argument; repeat it to serve several behind one server, each "
           "loaded on its first request (named by its directory, .gguf file stem or Hugging Face name)")
    parser.set_defaults(more_models=())
    a("--models-dir", default=None, metavar="DIR",
      help="serve every model in DIR: each subdirectory with a config.json or a GGUF, and each .gguf file, "
           "named by the subdirectory or the file's stem; loaded on first request")
    a("--models-config", default=None, metavar="FILE",
      help="serve the models a TOML file lists (YAML by a .yaml name): [[models]] tables of name, model (a path "
           "or Hugging Face name) and that model's own dtype, max-model-len, kv-cache-space, kv-cache-dtype, "
           "max-num-seqs, quantization, mmproj, lora-modules, runner, chat-template, keep-alive")
    a("--keep-alive", default=models.DEFAULT_KEEP_ALIVE, type=_keep_alive, metavar="DURATION",
      help="with several models: how long a model stays loaded after its last request (Ollama's forms: "
           "seconds, 30s, 5m, 1h; negative: for ever; default 5m)")
    a("--models-memory", default=None, type=models.parse_memory, metavar="BYTES",
      help="with several models: memory all loaded models may take together (24G, 512M); a model that would "
           "not fit first unloads the least recently used idle ones (default: what the machine and its "
           "cgroup have available)")
    a("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    a("--port", type=port_number, default=8000, help="TCP port to listen on (default 8000; 0: any free port)")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "half", "float"],
      help="weight/activation dtype (auto: from the checkpoint)")
    a("--quantization", "-q", default=None, choices=["none", "q8_0", "q4_0"],
      help="weights as stored (none), or float weights quantized at load to q8_0 / q4_0 (ggml block types)")
    a("--tensor-parallel-size", "-tp", type=int, default=1,
      help="ranks of tensor parallelism, one process each (default 1): one per CPU list of LITE_LLM_CPU_OMP_THREADS_BIND (0-47|48-95), or per NUMA node under auto")
    a("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    a("--block-size", type=int, default=None, help="tokens per KV-cache block (a multiple of 16; default 128)")
    a("--max-num-seqs", type=int, default=None,
      help="most sequences in one step (default: vLLM's 128, at most 32 per computing thread; "
           "a Whisper model: requests decoded together, default 8)")
    a("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
      help="reuse KV blocks of shared prompt prefixes")
    a("--kv-cache-space", type=float, default=None,
      help="GiB of KV cache (default: LITE_LLM_CPU_KVCACHE_SPACE or automatic)")
    a("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
      help="KV cache element type: auto (the model's: fp32, else bf16), bfloat16, int8, fp8 (= fp8_e4m3), "
      "fp8_e5m2 (8-bit: a byte per value and a scale per row, ~2x the tokens per GiB)")
    a("--disable-sliding-window", action="store_true", help="attend over the full context")
    a("--deterministic", action="store_true", default=None,
      help="batch-invariant kernels: a request's logits and greedy tokens are the same bits whatever else "
           "the server batches with it, however its prompt is chunked, and after a preemption (slower; "
           "BENCHMARKS.md gives the cost)")
    a("--speculative-config", default=None, type=speculative_config_arg, help='speculative decoding, as vLLM spells it: \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}\' (drafts looked up in the sequence) or \'{"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}\' (a small model of the same vocabulary)')
    a("--served-model-name", nargs="+", default=None, help="model name(s) the API answers to")
    a("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every "
                                      "route but /health and /ping (env LITE_LLM_API_KEY)")
    a("--chat-template", default=None, help="chat template: a file path or the Jinja text itself")
    a("--trust-request-chat-template", action="store_true",
      help="accept a chat_template sent with a request (chat completions, /tokenize); refused by default")
    a("--generation-config", default="auto", choices=["auto", "vllm"],
      help="auto: default sampling from the model's generation_config.json; vllm: vLLM's defaults")
    a("--seed", type=int, default=0, help="seed of the sampler for requests without one")
    a("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
      help=f"output tokens at most of a chat, Responses, batch or /invocations chat request that sets no "
           f"max_tokens / max_completion_tokens / max_output_tokens (default {DEFAULT_MAX_TOKENS}; the model's "
           f"generation_config max_new_tokens, when smaller, wins; 0: the rest of the context, as vLLM); "
           f"completions keep OpenAI's 16"),
    a("--max-queue", type=int, default=1024, help="waiting requests before answering 429")
    a("--max-request-bytes", type=int, default=None,
      help=f"largest request body, 413 beyond (default: {BODY_BYTES_PER_TOKEN} bytes per token of "
           f"--max-model-len, between 1 MiB and 32 MiB)")
    a("--timeout-keep-alive", type=float, default=10.0,
      help="seconds an idle connection may wait for its next request")
    a("--header-timeout", type=float, default=10.0,
      help="seconds a client has to send a request's line and headers, in total")
    a("--body-timeout", type=float, default=30.0, help="seconds a client has to send a request body, in total")
    a("--max-connections", type=int, default=MAX_CONNECTIONS,
      help="open connections at most; when full, the longest idle or slowest-sending one is closed, "
           "or the newcomer gets 503 if all are busy")
    a("--max-connections-per-client", type=int, default=None,
      help="open connections per client address at most, enforced like --max-connections "
           "(default: half of --max-connections; 0: no cap, e.g. behind a proxy, where every "
           "client has the proxy's address)")
    a("--disable-log-requests", action="store_true",
      help="no access log line (method, route, status, tokens, ms) per request")
    a("--metrics-no-auth", action="store_true", help="serve /metrics without the API key")
    a("--disable-web-ui", action="store_true",
      help="no web pages: the chat playground at / and the live engine dashboard at /dashboard "
           "(both open without the key, every call they make sends the key typed into them)")
    a("--tool-call-parser", default=None, choices=list(TOOL_PARSERS),
      help="how the model writes tool calls (hermes: <tool_call>{json}</tool_call>, as Qwen2.5/Qwen3; "
           "llama3_json: {\"name\", \"parameters\"} as Llama 3.x; mistral: [TOOL_CALLS][{...}]; openai: "
           "gpt-oss's harmony messages to functions.NAME); "
           "default: chosen from the chat template where unambiguous (only tool_choice auto needs one: "
           "a forced call follows the server's own grammar)")
    a("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
      help="split <think>...</think> from the answer into reasoning_content (deepseek_r1: the "
           "output starts inside the thinking; qwen3: only when it opens with <think>; openai_gptoss: "
           "gpt-oss's harmony analysis channel)")
    a("--responses-store-max", type=int, default=DEFAULT_STORE_MAX,
      help="responses of /v1/responses kept in memory for previous_response_id and GET (the oldest go "
           "first; 0: none kept)")
    a("--responses-store-ttl", type=float, default=DEFAULT_STORE_TTL,
      help="seconds a stored response is kept")
    a("--mmproj", default=None, metavar="FILE",
      help="llama.cpp's multimodal projector GGUF beside a GGUF model: a LLaVA-1.5 CLIP encoder + MLP (images "
           "at <image> or, where the vocabulary has none, llama.cpp's <__media__>) or Gemma 3's SigLIP + "
           "projector (images at <start_of_image>)")
    a("--limit-mm-per-prompt", default=None,
      help='images one prompt may carry, as vLLM\'s JSON: \'{"image": 4}\' (the default)')
    a("--mm-processor-kwargs", default=None,
      help='image preprocessing overrides as JSON: \'{"max_pixels": 1003520}\' caps the pixels an image is '
           "resized to (fewer image tokens)")
    a("--max-image-pixels-per-request", type=int, default=None, metavar="N",
      help="decoded pixels (width x height) of all a request's images together at most, read from each image's "
           "header before it is decoded (a small PNG can decode to 150 MB); beyond it a 400 (default 33554432, "
           "e.g. two 12-megapixel photos; 0: no cap)")
    a("--allowed-media-domains", nargs="*", default=None,
      help="hosts whose http(s) image URLs the server may fetch (redirects re-checked; default: none, "
           "only data: URLs)")
    a("--data-parallel-size", "-dp", type=int, default=1,
      help="independent engine replicas, each a process on its own cores (the thread plan split N ways, "
           "or one CPU list per replica in LITE_LLM_CPU_OMP_THREADS_BIND: '0-15|16-31'), behind this one "
           "server, which routes each request to the replica holding its prompt's prefix, else the least "
           "loaded; each replica has its own --kv-cache-space (pooling models: to the replica with the fewest "
           "input tokens in flight)")
    a("--runner", default="auto", choices=["auto", "generate", "pooling"],
      help="generate text, or pool (embeddings /v1/embeddings, scores /score and /rerank); auto: from the "
           "checkpoint (an encoder, a sentence-transformers directory or a classifier head pools)")
    a("--pooler-config", default=None,
      help='pooling models: \'{"pooling_type": "MEAN"|"CLS"|"LAST", "normalize": true}\' over the checkpoint\'s own')
    a("--hf-overrides", default=None,
      help='JSON over config.json, as vLLM: \'{"architectures": ["Qwen3ForSequenceClassification"], '
           '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}\' scores a Qwen3-Reranker')
    a("--shutdown-grace", type=float, default=30.0,
      help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    lora_routes.add_arguments(parser)
    hub.add_hub_args(parser)
    a("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])



def port_number(value: str) -> int:
    """--port: an integer from 0 to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value[:20]!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535)")
    return port


class _ModelFlag(argparse.Action):
    """--model: the first is model_flag (the one model of old), each further one joins more_models."""

    def __call__(self, parser, namespace, value, option_string=None):
        if getattr(namespace, self.dest, None) is None:
            setattr(namespace, self.dest, value)
        else:
            namespace.more_models = (*getattr(namespace, "more_models", ()), value)


def _keep_alive(value: str) -> float:
    try:
        return models.parse_keep_alive(value, "--keep-alive")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
