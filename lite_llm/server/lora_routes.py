"""LoRA adapters in the server: the `serve` flags (vLLM's names), the adapters' /v1/models
cards (with their `parent`), and vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter.

A request picks an adapter by its `model` name (context.ServingContext.check_model accepts the
loaded adapters' names; generation.py hands the name to the engine as its lora_request). The
routes are handlers of the route table (routes.py), behind the API key like every route, and
answer 404 unless the server runs with --enable-lora. Loading at run time reads files the
client names, so it also needs a root directory (--lora-root; vLLM's switch
VLLM_ALLOW_RUNTIME_LORA_UPDATING enables it too, and then needs the root as well): only paths
that resolve, symlinks followed, to inside it are read, and a refusal says the same whatever the
path is (missing, a directory, a file of another kind), so the route cannot probe the filesystem.
What is not here: reading adapters and their slots (lite_llm/lora.py), the arithmetic
(lite_llm/_kernels/lora.pxi).
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from lite_llm.config import env
from lite_llm.lora import load_adapter as read_adapter
from lite_llm.lora import parse_lora_modules
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad

logger = logging.getLogger("lite_llm.server")
_NOT_LOADABLE = "'lora_path' is not a loadable adapter under the adapter root"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--enable-lora", action="store_true",
      help="serve LoRA adapters: a request picks one by its `model` name; /v1/load_lora_adapter and "
           "/v1/unload_lora_adapter change them at run time")
    a("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
      help="adapters to load at start: name=path (a PEFT directory with adapter_config.json + "
           "adapter_model.safetensors, or a llama.cpp GGUF LoRA file), or vLLM's JSON "
           "'{\"name\": ..., \"path\": ...}'")
    a("--max-loras", type=int, default=1,
      help="adapters loaded at once (slots of stacked weights; one batch mixes all of them)")
    a("--max-lora-rank", type=int, default=16, help="the largest adapter rank accepted")
    a("--lora-root", default=None, metavar="DIR",
      help="allow /v1/load_lora_adapter to load adapters from under DIR (paths resolved, symlinks "
           "included, must stay inside it); without it runtime loading is off "
           "(VLLM_ALLOW_RUNTIME_LORA_UPDATING=true also turns it on, and then needs --lora-root)")


def lora_root(args: argparse.Namespace) -> str | None:
    """The directory runtime adapter loading reads from, or None when it is off."""
    root = getattr(args, "lora_root", None)
    switch = (env("ALLOW_RUNTIME_LORA_UPDATING") or "").strip().lower() in ("1", "true", "yes", "on")
    if root is None:
        if switch and getattr(args, "enable_lora", False):
            raise SystemExit("VLLM_ALLOW_RUNTIME_LORA_UPDATING needs --lora-root DIR: the directory "
                             "adapters may be loaded from at run time")
        return None
    if not getattr(args, "enable_lora", False):
        raise SystemExit("--lora-root needs --enable-lora")
    if not os.path.isdir(root):
        raise SystemExit(f"--lora-root: not a directory: {root}")
    return os.path.realpath(root)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """build_engine's LoRA arguments from the flags (none without --enable-lora)."""
    modules = parse_lora_modules(getattr(args, "lora_modules", None))
    if not getattr(args, "enable_lora", False):
        if modules:
            raise SystemExit("--lora-modules needs --enable-lora")
        return {}
    if getattr(args, "data_parallel_size", 1) > 1:
        raise SystemExit("--enable-lora with --data-parallel-size is not supported yet")
    return dict(enable_lora=True, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                lora_modules=modules)


def manager(engine: Any):
    """The engine's LoRAManager, or None when LoRA is not enabled."""
    return getattr(getattr(engine, "engine", None), "lora", None)


def model_cards(st: ServerState) -> list[dict]:
    """/v1/models entries of the loaded adapters: parent is the base model's served name."""
    m = manager(st.engine)
    if m is None:
        return []
    parent = st.ctx.model_names[0]
    return [{"id": name, "object": "model", "created": st.started, "owned_by": "lite-llm", "root": name,
             "parent": parent, "max_model_len": st.ctx.max_model_len} for name, _ in m.names()]


def _request(req: Request, state: ServerState) -> tuple[Any, str, dict]:
    m = manager(state.engine)
    if m is None:
        raise ApiError(404, "LoRA adapters are not enabled on this server (start it with --enable-lora)",
                       code="not_found")
    body = req.json()
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise bad("'lora_name' must be a non-empty string", "lora_name")
    if name in state.ctx.model_names:
        raise bad(f"'{name}' is the base model's name", "lora_name")
    return m, name, body


def _runtime_root(state: ServerState) -> str | None:
    """The adapter root of a server that changes its adapters at run time; a 404 for the two
    routes on a server with LoRA but no --lora-root (without LoRA, _request's 404 says so)."""
    root = state.lora_root
    if manager(state.engine) is not None and root is None:
        raise ApiError(404, "loading and unloading LoRA adapters at run time is not enabled on this server "
                       "(start it with --lora-root DIR)", code="not_found")
    return root


def load_adapter(req: Request, state: ServerState) -> Response:
    """POST /v1/load_lora_adapter {"lora_name", "lora_path"}: read the adapter into a free slot."""
    root = _runtime_root(state)
    m, name, body = _request(req, state)
    path = body.get("lora_path")
    if not isinstance(path, str) or not path or "\x00" in path:
        raise bad("'lora_path' must be a non-empty string", "lora_path")
    if name in m:
        raise bad(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    real = os.path.realpath(os.path.join(root, path))     # relative to the root; symlinks resolved
    if real == root or os.path.commonpath([real, root]) != root:
        raise bad(_NOT_LOADABLE, "lora_path")
    try:
        adapter = read_adapter(real, m.config, m.max_rank, name)
    except Exception as e:      # missing, unreadable, not an adapter, not for this model: one answer
        logger.warning("load_lora_adapter %r: %s", name, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
        raise bad(_NOT_LOADABLE, "lora_path") from None
    try:
        m.add(adapter)
    except ValueError as e:     # the name taken meanwhile, or every slot in use
        raise bad(str(e), "lora_name") from None
    return Response.json({"object": "lora_adapter", "id": name, "status": "loaded",
                             "message": f"Success: LoRA adapter '{name}' added successfully."})


def unload_adapter(req: Request, state: ServerState) -> Response:
    """POST /v1/unload_lora_adapter {"lora_name"}: new requests can no longer pick it; running
    ones finish with it, then its slot is free. Only where adapters load at run time (as vLLM
    gates both routes): elsewhere the adapters --lora-modules names stay."""
    _runtime_root(state)
    m, name, _ = _request(req, state)
    try:
        m.unload(name)
    except KeyError:
        raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name",
                       code="model_not_found") from None
    return Response.json({"object": "lora_adapter", "id": name, "status": "unloaded",
                             "message": f"Success: LoRA adapter '{name}' removed successfully."})
