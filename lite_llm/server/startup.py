"""Start-up of `lite-llm serve`: parsed flags -> an engine (start_engine) -> a server over it
(build_server / create_server), then serving until SIGINT/SIGTERM and draining (run).

create_server is also the programmatic entry (tests, Ray Serve replicas, embedding): a bound
server over any engine that has add_request / abort / stats / shutdown. What is not here: the
flags (args.py), the route table (routes.py), sockets and limits (transport.py).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from lite_llm import __version__
from lite_llm.config import env
from lite_llm.engine.args import EngineArgs
from lite_llm.engine.data_parallel import build_data_parallel_engine
from lite_llm.engine.assemble import build_async_engine
from lite_llm.engine.memory import MemoryPlan, plan_memory
from lite_llm.engine.pooling import PoolingClient
from lite_llm.engine.transcription import DEFAULT_MAX_NUM_SEQS as TRANSCRIPTION_MAX_NUM_SEQS
from lite_llm.engine.transcription import decoder_sequences, plan_memory as plan_transcription_memory
from lite_llm.model import hub
from lite_llm.model.loader import check_model
from lite_llm.model.pooler import runner_for_model
from lite_llm.multimodal import DEFAULT_PIXELS_PER_REQUEST, MediaConfig, Processor, media_config
from lite_llm.multimodal.transcribe import is_whisper_model
from lite_llm.server import audio_routes, lora_routes, models
from lite_llm.server.args import DEFAULT_MAX_TOKENS
from lite_llm.server.context import ServingContext, TokenizeSlots, max_token_bytes, system_fingerprint
from lite_llm.server.metrics import ServerMetrics
from lite_llm.server.responses import DEFAULT_STORE_MAX, DEFAULT_STORE_TTL, ResponseStore
from lite_llm.server.routes import route_table
from lite_llm.server.routing import ServerState
from lite_llm.server.transport import MAX_CONNECTIONS, LiteServer, default_body_limit
from lite_llm.server.validation import ApiError

logger = logging.getLogger("lite_llm.server")

_GEN_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                    "max_new_tokens": "max_tokens"}


def generation_defaults(generation_config: dict | None) -> dict:
    """SamplingParams defaults from a generation_config.json, as vLLM's --generation-config auto."""
    out = {}
    for src, dst in _GEN_CONFIG_KEYS.items():
        v = (generation_config or {}).get(src)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[dst] = int(v) if dst in ("top_k", "max_tokens") else float(v)
    return out


def create_server(engine: Any, tokenizer: Any, model_name: str | list[str] | tuple[str, ...],
                  max_model_len: int, api_key: str | None = None,
                  generation_config: dict | None = None, kernel_info: dict | None = None, *,
                  host: str = "127.0.0.1", port: int = 0, chat_template: str | None = None,
                  trust_request_chat_template: bool = False, lora_root: str | None = None,
                  vocab_size: int | None = None, max_body_bytes: int | None = None,
                  request_timeout: float = 10.0, model_root: str | None = None,
                  retry_after: int = 1, header_timeout: float = 10.0, body_timeout: float = 30.0,
                  max_connections: int = MAX_CONNECTIONS, max_connections_per_client: int | None = None,
                  metrics_no_auth: bool = False, web_ui: bool = True,
                  log_requests: bool = True, max_tokenizing: int | None = None,
                  reasoning_parser: str | None = None, tool_call_parser: str | None = None,
                  responses_store_max: int = DEFAULT_STORE_MAX,
                  responses_store_ttl: float = DEFAULT_STORE_TTL, media: Any = None,
                  default_max_tokens: int | None = DEFAULT_MAX_TOKENS, pool: Any = None,
                  max_upload_bytes: int | None = None) -> LiteServer:
    """A bound (not yet serving) server for `engine`; `.start()` or `.serve_forever()` it.

    generation_config is the model's generation_config.json dict (empty for
    --generation-config vllm); kernel_info carries kernel_variant, num_threads, weight_bytes.
    max_body_bytes None derives the limit from max_model_len (default_body_limit);
    max_upload_bytes: the audio routes' body limit (None: room for one audio file, audio_routes.body_limit).
    default_max_tokens caps the output of a chat-shaped request that sets no max_tokens (None
    or 0: the room its prompt leaves in the context, as vLLM).
    pool: a models.ModelPool of several models (engine is then the pool, and the other model
    arguments are the default model's); each request's `model` picks its model's engine.
    """
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    if max_body_bytes is None:
        max_body_bytes = default_body_limit(max_model_len)
    info = dict(kernel_info or {})
    ctx = serving_context(engine, tokenizer, names, max_model_len, info, generation_config=generation_config,
                          chat_template=chat_template, trust_request_chat_template=trust_request_chat_template,
                          vocab_size=vocab_size, retry_after=retry_after, max_tokenizing=max_tokenizing,
                          reasoning_parser=reasoning_parser, tool_call_parser=tool_call_parser,
                          model_root=model_root, media=media, default_max_tokens=default_max_tokens)
    routes = route_table(web_ui=web_ui, metrics_no_auth=metrics_no_auth)
    state = ServerState(engine, ctx, ServerMetrics(names[0], info), api_key, info, max_body_bytes,
                        model_root, retry_after, routes=routes if pool is None else models.wrap_routes(routes),
                        responses=ResponseStore(responses_store_max, responses_store_ttl),
                        lora_root=os.path.realpath(lora_root) if lora_root else None,   # None: runtime loading off
                        pool=pool, max_upload_bytes=max_upload_bytes or audio_routes.body_limit())
    if pool is not None:
        pool.attach(state)
    return LiteServer((host, port), state, request_timeout, header_timeout=header_timeout,
                      body_timeout=body_timeout, max_connections=max_connections,
                      max_connections_per_client=max_connections_per_client, log_requests=log_requests)


def serving_context(engine: Any, tokenizer: Any, names: tuple[str, ...], max_model_len: int, info: dict, *,
                    generation_config: dict | None = None, chat_template: str | None = None,
                    trust_request_chat_template: bool = False, vocab_size: int | None = None, retry_after: int = 1,
                    max_tokenizing: int | None = None, reasoning_parser: str | None = None,
                    tool_call_parser: str | None = None, model_root: str | None = None, media: Any = None,
                    default_max_tokens: int | None = DEFAULT_MAX_TOKENS) -> ServingContext:
    """What requests to one model are validated and prepared against (create_server's arguments)."""
    if not names:
        raise ValueError("at least one served model name is needed")
    if vocab_size is None:
        vocab_size = getattr(tokenizer, "vocab_size", None)
        if callable(vocab_size):
            vocab_size = vocab_size()
    if not vocab_size:
        raise ValueError("vocab_size unknown: pass vocab_size=")
    return ServingContext(model_names=tuple(names), max_model_len=int(max_model_len), vocab_size=int(vocab_size),
                          tokenizer=tokenizer, generation_defaults=generation_defaults(generation_config),
                          chat_template=chat_template, trust_request_chat_template=trust_request_chat_template,
                          max_token_bytes=max_token_bytes(tokenizer),
                          tokenize_slots=TokenizeSlots(max_tokenizing or max(1, (os.cpu_count() or 2) // 2),
                                                       retry_after),
                          reasoning_parser=reasoning_parser, tool_parser=tool_call_parser,
                          system_fingerprint=system_fingerprint(info), loras=lora_routes.manager(engine),
                          mm_processor=_mm_processor(model_root, info.get("mmproj")), media=media or _default_media(),
                          default_max_tokens=default_max_tokens or None,
                          eos_token_ids=_eos_token_ids(engine, tokenizer))


def _eos_token_ids(engine: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a sequence: the engine's model's, else the tokenizer's EOS (beam search
    ends its beams on them; the engine ends sampled sequences itself)."""
    ids = getattr(getattr(getattr(engine, "engine", None), "config", None), "eos_token_ids", None)
    if ids is not None:
        return tuple(int(t) for t in ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    return (int(eos),) if isinstance(eos, int) else ()


def _mm_processor(model_root: str | None, mmproj: str | None = None) -> Processor | None:
    return Processor.for_model(model_root, mmproj) if model_root else None


def _default_media() -> MediaConfig:
    return MediaConfig()


def check_address(host: str, port: int) -> None:
    """Bind the address the server will listen on, before the model loads (which can take
    minutes), so that a port in use or a host that is not this machine's fails at once."""
    def failed(what: str) -> OSError:
        err = OSError(f"cannot listen on {host}:{port}: {what}")
        err.lite_llm_user_error = True          # one line for the user (cli.user_error)
        return err

    try:
        with socket.socket(LiteServer.address_family, socket.SOCK_STREAM) as s:
            if LiteServer.allow_reuse_address:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except socket.gaierror as e:
        raise failed(f"unknown host ({e.strerror})") from None
    except OSError as e:
        hint = {errno.EADDRINUSE: " (another server is using it: pick another --port)",
                errno.EACCES: " (ports below 1024 need privileges: pick a --port from 1024 up)",
                errno.EADDRNOTAVAIL: " (not an address of this machine: check --host)"}.get(e.errno or 0, "")
        raise failed(f"{e.strerror or e}{hint}") from None


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a path to a file, or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value and (os.sep in value or value.endswith((".jinja", ".j2", ".txt"))):
        raise SystemExit(f"--chat-template: no such file: {value}")
    return value


def start_engine(args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """The engine `serve` flags ask for: (engine, tokenizer, info); one AsyncEngine, or the
    data-parallel front end over --data-parallel-size replicas."""
    model = args.model or args.model_flag
    lora_kwargs = lora_routes.engine_kwargs(args)
    if args.data_parallel_size < 1:
        raise SystemExit(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    hf_overrides = getattr(args, "hf_overrides", None)
    if getattr(args, "runner", "auto") in ("auto", "transcription") and model and is_whisper_model(model):
        return start_transcription_engine(model, args)
    if runner_for_model(model, getattr(args, "runner", "auto"), hf_overrides) == "pooling":
        try:
            engine_args = EngineArgs.from_cli(args, runner="pooling")
        except ValueError as e:             # tensor parallel, named with what to do instead
            raise SystemExit(str(e)) from None
        name = model or "model"
        if args.data_parallel_size > 1:     # replicas, each a pooling engine
            engine, tokenizer, info = build_data_parallel_engine(engine_args, args.data_parallel_size)
            return PoolingClient(engine, tokenizer, engine.pooling, info.get("model_name") or name), tokenizer, info
        return build_async_engine(engine_args)
    engine_args = EngineArgs.from_cli(args, **lora_kwargs)
    if args.data_parallel_size > 1:
        return build_data_parallel_engine(engine_args, args.data_parallel_size)
    return build_async_engine(engine_args)


def start_models(args: argparse.Namespace) -> tuple[models.ModelPool, models.Loaded]:
    """The models of a server of several (models.model_specs) in a pool, the default (first) one
    loaded: (pool, the default model)."""
    specs = models.model_specs(args)
    if args.data_parallel_size > 1 or args.tensor_parallel_size > 1:
        raise SystemExit("several models behind one server run one engine each on all the cores: "
                         "--data-parallel-size and --tensor-parallel-size must be 1")
    for spec in specs:                      # a local path that holds no model fails before any load
        if hub.parse_name(spec.model) is None or os.path.exists(os.path.expanduser(spec.model)):
            check_model(spec.model)

    def resolved(spec: models.ModelSpec) -> argparse.Namespace:
        ns = models.spec_args(args, spec)
        hub.resolve_serve_args(ns)          # a Hugging Face name: its files, fetched if missing
        ns.model = check_model(ns.model)
        return ns

    def plan(spec: models.ModelSpec) -> MemoryPlan:
        ns = resolved(spec)
        if is_whisper_model(ns.model):
            return plan_transcription_memory(ns.model, dtype=ns.dtype, quantization=ns.quantization,
                                             max_num_seqs=ns.max_num_seqs or TRANSCRIPTION_MAX_NUM_SEQS)
        is_pooling = runner_for_model(ns.model, ns.runner, ns.hf_overrides) == "pooling"
        try:
            return plan_memory(ns.model, dtype=ns.dtype, quantization=ns.quantization, max_model_len=ns.max_model_len,
                               kv_cache_space=ns.kv_cache_space, max_num_seqs=ns.max_num_seqs,
                               max_num_batched_tokens=ns.max_num_batched_tokens, block_size=ns.block_size or 128,
                               kv_cache_dtype=ns.kv_cache_dtype, pooling=is_pooling)
        except ValueError as e:             # its KV cache cannot hold one max_model_len request
            raise ApiError(503, f"the model '{spec.name}' cannot be loaded: {e}", code="model_load_failed") from None

    def build(spec: models.ModelSpec) -> models.Loaded:
        ns = resolved(spec)
        engine, tokenizer, info = start_engine(ns)
        gen_config = (info.get("generation_config") or {}) if ns.generation_config == "auto" else {}
        ctx = serving_context(engine, tokenizer, (spec.name,), info["max_model_len"], info,
                              generation_config=gen_config, chat_template=load_chat_template(ns.chat_template),
                              trust_request_chat_template=ns.trust_request_chat_template,
                              vocab_size=info.get("vocab_size"), reasoning_parser=ns.reasoning_parser,
                              tool_call_parser=ns.tool_call_parser, model_root=info.get("model_path"),
                              media=_media_config(ns), default_max_tokens=ns.default_max_tokens)
        return models.Loaded(engine, ctx, info)

    pool = models.ModelPool(specs, build, plan, keep_alive=args.keep_alive, memory_cap=args.models_memory)
    try:
        first = pool.load(specs[0].name)
    except ApiError as e:
        pool.shutdown()
        raise SystemExit(e.message) from None
    return pool, first


def start_transcription_engine(model: str, args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """A Whisper checkpoint's engine (lite_llm/engine/transcription.py): (engine, tokenizer, info)."""
    from lite_llm import _kernels
    from lite_llm.multimodal.transcribe import WhisperModel
    from lite_llm.engine.transcription import TranscriptionEngine
    if args.data_parallel_size > 1 or args.tensor_parallel_size > 1:
        raise SystemExit("a Whisper model is served by one process: drop --data-parallel-size / "
                         "--tensor-parallel-size")
    t0 = time.perf_counter()
    # requests decoded together: each holds its cross-attention K/V (and a beam search 2 x its beams)
    max_num_seqs = args.max_num_seqs or TRANSCRIPTION_MAX_NUM_SEQS
    whisper = WhisperModel.from_pretrained(model, dtype="bfloat16" if args.dtype == "bfloat16" else "float32",
                                           quantization=getattr(args, "quantization", None),
                                           max_requests=max_num_seqs, max_sequences=decoder_sequences(max_num_seqs))
    name = os.path.basename(os.path.normpath(model))
    engine = TranscriptionEngine(whisper, name, max_num_seqs=max_num_seqs)
    engine.start()
    info = {"model_path": model, "model_name": name, "max_model_len": whisper.decoder.cfg.max_target_positions,
            "dtype": whisper.decoder.dtype, "architecture": "WhisperForConditionalGeneration",
            "kernel_variant": _kernels.VARIANT.name, "num_threads": whisper.decoder.num_threads,
            "runner": "transcription", "vocab_size": whisper.vocab_size,
            "startup_seconds": time.perf_counter() - t0}
    return engine, whisper.tokenizer, info


def build_server(args: argparse.Namespace, engine: Any, tokenizer: Any, info: dict, *,
                 host: str | None = None, port: int | None = None, pool: Any = None) -> LiteServer:
    """The server `serve` flags ask for over a started engine (host/port override the flags);
    with several models, engine is their pool and the rest the default model's."""
    model = args.model or args.model_flag
    gen_config = (info.get("generation_config") or {}) if args.generation_config == "auto" else {}
    names = args.served_model_name or [info.get("model_name") or model or "default"]
    if pool is not None:
        names = list(pool.entries)
    return create_server(
        engine, tokenizer, names, info["max_model_len"], api_key=args.api_key or env("API_KEY"),
        generation_config=gen_config, kernel_info=info, host=args.host if host is None else host,
        port=args.port if port is None else port, chat_template=load_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template, lora_root=lora_routes.lora_root(args),
        vocab_size=info.get("vocab_size"), max_body_bytes=args.max_request_bytes,
        max_upload_bytes=args.max_request_bytes,
        request_timeout=args.timeout_keep_alive, model_root=info.get("model_path"),
        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
        metrics_no_auth=args.metrics_no_auth, web_ui=not getattr(args, "disable_web_ui", False),
        log_requests=not args.disable_log_requests, reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser, responses_store_max=args.responses_store_max,
        responses_store_ttl=args.responses_store_ttl, media=_media_config(args),
        default_max_tokens=getattr(args, "default_max_tokens", DEFAULT_MAX_TOKENS), pool=pool)


def _media_config(args: argparse.Namespace):
    """Image input settings from --limit-mm-per-prompt, --mm-processor-kwargs, --allowed-media-domains,
    --max-image-pixels-per-request."""
    pixels = getattr(args, "max_image_pixels_per_request", None)
    try:
        return media_config(getattr(args, "limit_mm_per_prompt", None), getattr(args, "mm_processor_kwargs", None),
                            getattr(args, "allowed_media_domains", None),
                            DEFAULT_PIXELS_PER_REQUEST if pixels is None else pixels)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = args.model or args.model_flag
    load_chat_template(args.chat_template)          # a missing file fails before the model loads
    lora_routes.lora_root(args)
    check_address(args.host, args.port)             # and so does a port in use
    multi = models.is_multi_model(args)
    if not multi:
        model = hub.resolve_serve_args(args)        # a Hugging Face name: its files, fetched if missing
        check_model(model)                          # or a path that holds no model
    if args.responses_store_max < 0 or not args.responses_store_ttl > 0:
        raise SystemExit("--responses-store-max must be >= 0 and --responses-store-ttl > 0")
    if args.default_max_tokens < 0:
        raise SystemExit(f"--default-max-tokens must be >= 0, got {args.default_max_tokens}")
    api_key = args.api_key or env("API_KEY")
    t0 = time.perf_counter()
    pool = None
    if multi:
        pool, first = start_models(args)
        engine, tokenizer, info = pool, first.ctx.tokenizer, first.info
    else:
        engine, tokenizer, info = start_engine(args)
    server = build_server(args, engine, tokenizer, info, pool=pool)
    gen_config = server.state.ctx.generation_defaults
    names = server.state.ctx.model_names
    logger.info("lite-llm %s serving %s on %s (ready in %.1f s)", __version__, names[0], server.url,
                time.perf_counter() - t0)
    logger.info("model %s, max_model_len %s, dtype %s", info.get("model_path") or model,
                info["max_model_len"], info.get("dtype", args.dtype))
    logger.info("kernel variant %s, %s threads, KV cache capacity %s tokens",
                info.get("kernel_variant"), info.get("num_threads"), info.get("kv_cache_tokens"))
    if pool is not None:
        logger.info("%d models, loaded on first request, %s: %s", len(names),
                    "never unloaded" if args.keep_alive == float("inf") else f"unloaded after {args.keep_alive:g} s idle",
                    ", ".join(names))
    if gen_config:
        logger.info("default sampling from generation_config.json: %s", gen_config)
    if api_key:
        logger.info("API key required on every route but /health, /ping%s%s",
                    " and /metrics" if args.metrics_no_auth else "",
                    "" if args.disable_web_ui else " and the web pages (their calls send the key typed in)")
    if not args.disable_web_ui:
        logger.info("chat playground at %s/, engine dashboard at %s/dashboard", server.url, server.url)

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        logger.info("%s: draining (grace %.0f s)", signal.Signals(signum).name, args.shutdown_grace)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        server.start()
        while not stop.wait(0.5):
            if not server.state.engine_alive():     # answering 503 for ever helps nobody
                failed = True
                logger.error("stopping: the engine is not running (%s)",
                             getattr(engine, "failure", None) or "its thread failed; see the error above")
                break
        finished = server.drain(args.shutdown_grace)
        logger.info("stopped%s", "" if finished else " (some requests were aborted)")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    failure = getattr(getattr(engine, "tp_group", None), "failure", None)
    if failure:     # a tensor-parallel rank died: the stop was not asked for
        logger.critical("exiting: %s", failure)
        return 1
    return 1 if failed else 0
