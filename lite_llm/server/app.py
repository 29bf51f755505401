"""`lite-llm serve`: the OpenAI-compatible HTTP server, and the names other code builds it with.

The command (cli.py) takes add_arguments and run from here; create_server builds a server over
any engine (tests, embedding), start_engine and build_server do what `serve` does with parsed
flags (Ray Serve replicas reuse them). Where things live:
  args.py        the serve flags              startup.py   flags -> engine -> server; signals
  routes.py      THE route table              routing.py   Request, Response, Route, ServerState
  transport.py   sockets, framing, limits, keep-alive, disconnects, the SSE writer
  generation.py  a prepared request submitted and answered (JSON or a stream)
  validation.py, chat.py, openai.py, parsers.py, logprobs.py, answers.py: OpenAI bodies in and out
  responses.py, anthropic.py, ollama.py, vllm_routes.py, pooling.py, lora_routes.py: the other APIs' routes
  openapi.py, metrics.py, webui.py: /openapi.json, /metrics, the web pages
The engine (its own thread) is reached only through add_request / abort / stats / shutdown.
"""
from __future__ import annotations

from lite_llm.server.args import DEFAULT_MAX_TOKENS, add_arguments
from lite_llm.server.startup import (build_server, create_server, generation_defaults, load_chat_template, run,
                                     start_engine)
from lite_llm.server.transport import PROBE_CONNECTIONS, LiteServer, default_body_limit

__all__ = ["DEFAULT_MAX_TOKENS", "PROBE_CONNECTIONS", "LiteServer", "add_arguments", "build_server", "create_server",
           "default_body_limit", "generation_defaults", "load_chat_template", "run", "start_engine"]
