"""Several models behind one server: which models (model_specs: `--model` repeated, `--models-dir`,
`--models-config`), and the pool that holds them (ModelPool): a model is loaded on its first
request, unloaded after --keep-alive idle seconds, and the least recently used idle one is
unloaded first when the next load would not fit the memory (engine/memory.py plans each load).

A handler reaches a model through model_state(state, name, keep_alive) (ModelPool.use), which
waits for its load and yields a ModelState: the server's state seen through that model (its
engine, its ServingContext); on a server of one model, the server's own state. The routes whose
body names a model are wrapped by per_model (wrap_routes); other front ends (Ollama's /api
routes) call model_state themselves. One manager thread does every load and unload, in order,
off the HTTP threads: requests to loaded models keep being served while another loads.

Every engine runs its steps on all the cores, one engine at a time (a shared FairLock around each
step), not on a static share of them: decoding is bound by memory bandwidth, which all the cores
share, so halves of the cores would not make two busy models faster than taking turns, while a
model busy alone would lose half its cores; two OpenMP teams on the same cores at once would
oversubscribe them.
What is not here: building one engine (startup.start_engine), the routes (routes.py).
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import dataclasses
import gc
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lite_llm.engine.memory import GiB, MemoryPlan, machine_memory
from lite_llm.engine.stats import EngineStats
from lite_llm.multimodal.whisper_ggml import is_ggml_file
from lite_llm.server.routing import Request, Response, RouteTable, ServerState
from lite_llm.server.validation import ApiError, bad, parse_json, show

logger = logging.getLogger("lite_llm.server")

DEFAULT_KEEP_ALIVE = 300.0      # seconds, Ollama's OLLAMA_KEEP_ALIVE default (5m)
LOAD_TIMEOUT = 1800.0           # seconds a request waits for its model's load (a hub download included)
# the routes whose JSON body names the model it is for
MODEL_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/chat/completions/batch",
                "/invocations", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/embeddings",
                "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")
# Ollama's (ollama.py): the body's "model" (or "name"), its ":latest" tag, and its keep_alive
OLLAMA_MODEL_ROUTES = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show")
# a model's own settings in --models-config (serve's flag names), over the command line's
MODEL_FLAGS = ("dtype", "max-model-len", "kv-cache-space", "kv-cache-dtype", "max-num-seqs", "max-num-batched-tokens",
               "quantization", "mmproj", "lora-modules", "runner", "chat-template", "pooler-config", "hf-overrides",
               "revision", "keep-alive")


# ---- which models ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    name: str                        # what requests' `model` field names it by
    model: str                       # a directory, a .gguf file or a Hugging Face name
    flags: dict = field(default_factory=dict)   # serve flag dest -> value, over the command line's
    keep_alive: float | None = None  # this model's idle seconds before unloading; None: --keep-alive


def parse_keep_alive(value: Any, what: str = "keep_alive") -> float:
    """Seconds from Ollama's keep_alive forms: a number of seconds, or a duration "30s", "5m",
    "1h30m"; negative: never unload (math.inf); 0: unload once idle."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of seconds or a duration such as \"5m\"")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?(\d+(\.\d+)?(ms|s|m|h))+", value.strip()):
        text = value.strip()
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        seconds = sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))
        seconds = -seconds if text.startswith("-") else seconds
    else:
        raise ValueError(f"{what} must be a number of seconds or a duration such as \"5m\"")
    if math.isnan(seconds):
        raise ValueError(f"{what} must be a number of seconds or a duration such as \"5m\"")
    return math.inf if seconds < 0 else seconds


def parse_memory(value: str) -> int:
    """--models-memory: bytes from "24G", "512M", "2.5GiB" or a plain number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", str(value), re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"not an amount of memory: {str(value)[:20]!r} (e.g. 24G, 512M)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _name_of(model: str) -> str:
    """A model's default name: a directory's base name, a .gguf file's stem, a hub name as typed."""
    path = os.path.expanduser(model)
    if os.path.exists(path):
        base = os.path.basename(os.path.normpath(path))
        return base.removesuffix(".gguf")
    return model


def _is_mmproj(name: str) -> bool:
    return os.path.basename(name).lower().startswith("mmproj")


def models_in_dir(directory: str) -> list[ModelSpec]:
    """--models-dir: each subdirectory holding a config.json or one GGUF (an mmproj file beside it
    is its image encoder), each .gguf file and each whisper.cpp model file (a .bin with the ggml
    magic), named by the directory or the file's stem."""
    if not os.path.isdir(directory):
        raise SystemExit(f"--models-dir {directory}: no such directory")
    specs = []
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if os.path.isfile(path) and entry.endswith(".gguf") and not _is_mmproj(entry):
            specs.append(ModelSpec(entry[:-5], path))
        elif os.path.isfile(path) and entry.endswith(".bin") and is_ggml_file(path):
            specs.append(ModelSpec(entry[:-4], path))
        elif os.path.isdir(path):
            if os.path.isfile(os.path.join(path, "config.json")):
                specs.append(ModelSpec(entry, path))
                continue
            ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
            weights = [f for f in ggufs if not _is_mmproj(f)]
            if len(weights) == 1:
                mmproj = [f for f in ggufs if _is_mmproj(f)]
                flags = {"mmproj": os.path.join(path, mmproj[0])} if len(mmproj) == 1 else {}
                specs.append(ModelSpec(entry, os.path.join(path, weights[0]), flags))
    if not specs:
        raise SystemExit(f"--models-dir {directory}: no model in it (a subdirectory with a config.json or a "
                         f"GGUF, a .gguf file or a whisper.cpp .bin file)")
    return specs


def _read_config_file(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise SystemExit(f"--models-config {path}: {e.strerror or e}") from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml
            value = yaml.safe_load(data.decode("utf-8"))
        else:
            import tomllib
            value = tomllib.loads(data.decode("utf-8"))
    except ImportError:
        raise SystemExit(f"--models-config {path}: a YAML file needs PyYAML (pip install pyyaml); "
                         f"TOML needs nothing") from None
    except Exception as e:     # tomllib.TOMLDecodeError, yaml.YAMLError, bad UTF-8
        raise SystemExit(f"--models-config {path}: not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'TOML'}: "
                         f"{str(e).splitlines()[0][:200]}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"--models-config {path}: expected a table with a `models` list")
    return value


def models_in_config(path: str) -> list[ModelSpec]:
    """--models-config FILE (TOML, or YAML by its .yaml/.yml name): a list `models` of tables, each
    with name, model (or path: a directory, .gguf file or Hugging Face name) and any of MODEL_FLAGS."""
    entries = _read_config_file(path).get("models")
    if not isinstance(entries, list) or not entries:
        raise SystemExit(f"--models-config {path}: expected a non-empty `models` list ([[models]] in TOML)")
    specs = []
    for i, entry in enumerate(entries):
        where = f"--models-config {path}: models[{i}]"
        if not isinstance(entry, dict):
            raise SystemExit(f"{where}: expected a table")
        model = entry.get("model", entry.get("path"))
        if not isinstance(model, str) or not model:
            raise SystemExit(f"{where}: needs `model` (a path or a Hugging Face name)")
        unknown = sorted(set(entry) - {"name", "model", "path", *MODEL_FLAGS})
        if unknown:
            raise SystemExit(f"{where}: unknown setting {unknown[0]!r} (settings: name, model, {', '.join(MODEL_FLAGS)})")
        flags = {k.replace("-", "_"): v for k, v in entry.items() if k in MODEL_FLAGS and k != "keep-alive"}
        if flags.get("lora_modules"):
            flags["enable_lora"] = True
        if "mmproj" in flags and not os.path.isabs(flags["mmproj"]):
            flags["mmproj"] = os.path.join(os.path.dirname(os.path.abspath(path)), flags["mmproj"])
        if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), model)) and not os.path.isabs(model):
            model = os.path.join(os.path.dirname(os.path.abspath(path)), model)
        keep = None
        if "keep-alive" in entry:
            try:
                keep = parse_keep_alive(entry["keep-alive"], f"{where}: keep-alive")
            except ValueError as e:
                raise SystemExit(str(e)) from None
        specs.append(ModelSpec(str(entry.get("name") or _name_of(model)), model, flags, keep))
    return specs


def model_specs(args: argparse.Namespace) -> list[ModelSpec]:
    """Every model `serve` was given, the default (first) one first: the positional MODEL, each
    --model, then --models-config's, then --models-dir's. One model and no directory or file:
    the single-model server of old (a list of one)."""
    given = [m for m in (args.model, args.model_flag, *getattr(args, "more_models", ())) if m]
    specs = [ModelSpec(_name_of(m), m) for m in given]
    if getattr(args, "models_config", None):
        specs += models_in_config(args.models_config)
    if getattr(args, "models_dir", None):
        specs += models_in_dir(args.models_dir)
    if specs and args.served_model_name:        # the first model's names, as with one model
        specs[0] = dataclasses.replace(specs[0], name=args.served_model_name[0])
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise SystemExit(f"two models are named {s.name!r}: give each its own name (--models-config)")
        seen.add(s.name)
    return specs


def is_multi_model(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "more_models", ()) or getattr(args, "models_dir", None)
                or getattr(args, "models_config", None) or (args.model and args.model_flag))


# ---- engines take turns on the cores -------------------------------------------------------------

class FairLock:
    """A lock granted in the order it was asked for: an engine that steps in a loop cannot take it
    back before another engine waiting for its turn."""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()

    def __enter__(self) -> FairLock:
        me = object()
        with self._cond:
            self._queue.append(me)
            while self._queue[0] is not me:
                self._cond.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._queue.popleft()
            self._cond.notify_all()

    @property
    def num_asking(self) -> int:
        """The holder and the waiters, in the order they asked."""
        with self._cond:
            return len(self._queue)


def _release_memory() -> None:
    """Give freed memory back to the system: the collector for cycles, then glibc's malloc_trim
    (freed heap pages stay in the process otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):    # not glibc
        pass


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ---- the pool -------------------------------------------------------------------------------------

@dataclass
class Loaded:
    """A started model, as the pool's build function returns it."""
    engine: Any                      # AsyncEngine, DataParallelEngine or PoolingClient
    ctx: Any                         # its ServingContext (named by the model's name)
    info: dict                       # build_engine's info


class ModelEntry:
    """One model of the pool and where it stands; the pool's lock guards every field."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.status = "unloaded"         # unloaded | loading | loaded | unloading
        self.loaded: Loaded | None = None
        self.state: ModelState | None = None
        self.plan: MemoryPlan | None = None
        self.memory = 0                  # bytes held while loaded (the plan, actual figures once known)
        self.num_users = 0               # requests waiting for it or using it: never unloaded while > 0
        self.last_used = 0.0             # time.monotonic() of the last release
        self.keep_alive: float | None = spec.keep_alive
        self.error: ApiError | None = None
        self.load_seconds: float | None = None    # of its latest load


class ModelState(ServerState):
    """The server's state seen through one model: its engine, its ServingContext and its facts;
    everything else (draining, in-flight count, routes, key, stores) the server's own. A request
    in flight on it holds the model loaded."""

    def __init__(self, server: ServerState, pool: ModelPool, entry: ModelEntry):
        self._server, self._pool, self._entry = server, pool, entry
        loaded = entry.loaded
        self.engine, self.ctx = loaded.engine, loaded.ctx
        self.kernel_info = loaded.info
        root = loaded.info.get("model_path")
        self.model_root = os.path.basename(root.rstrip("/\\")) if root else None

    def __getattr__(self, name: str) -> Any:     # the server's, for whatever this view does not hold
        return getattr(self._server, name)

    @contextmanager
    def inflight(self) -> Iterator[None]:
        with self._server.inflight(), self._pool.hold(self._entry):
            yield

    def wait_idle(self, timeout: float) -> bool:
        return self._server.wait_idle(timeout)


class ModelPool:
    """The models of one server. build(spec) -> Loaded starts a model's engine (on the manager
    thread); memory_cap: bytes all loaded models may plan at most (None: what the machine and its
    cgroup have). Also the server state's `engine`: alive while every loaded engine is, stats of
    the default model's, aborts and shutdown to all."""

    def __init__(self, specs: list[ModelSpec], build: Callable[[ModelSpec], Loaded],
                 plan: Callable[[ModelSpec], MemoryPlan], *, keep_alive: float = DEFAULT_KEEP_ALIVE,
                 memory_cap: int | None = None):
        self.entries = {s.name: ModelEntry(s) for s in specs}
        self.default = specs[0].name
        self.build, self.plan = build, plan      # replaceable: a test slows a load
        self.keep_alive, self.memory_cap = keep_alive, memory_cap
        self.step_lock = FairLock()
        self.server: ServerState | None = None     # set by attach
        self._cond = threading.Condition()
        self._loads: deque[ModelEntry] = deque()
        self._stopping = False
        self._baseline = rss_bytes()              # the server's own memory, before any model
        self._thread = threading.Thread(target=self._manage, name="lite-llm-models", daemon=True)
        self._thread.start()

    def attach(self, server: ServerState) -> None:
        """The server whose state each model's ModelState shows (models loaded before it get theirs now)."""
        with self._cond:
            self.server = server
            for e in self.entries.values():
                if e.status == "loaded" and e.state is None:
                    e.state = ModelState(server, self, e)

    # ---- any thread -----------------------------------------------------------------------------

    @contextmanager
    def use(self, name: str | None, keep_alive: Any = None, timeout: float = LOAD_TIMEOUT) -> Iterator[ModelState]:
        """The model `name` (None: the default), loaded first if it is not (the caller waits), held
        loaded for the block. keep_alive (Ollama's forms, parse_keep_alive): this model's idle time
        before unloading from now on. Unknown name: a 404; a load that failed or cannot fit: a 503."""
        seconds = None
        if keep_alive is not None:
            try:
                seconds = parse_keep_alive(keep_alive)
            except ValueError as e:
                raise bad(str(e), "keep_alive") from None
        entry = self._acquire(name, seconds, timeout)
        try:
            yield entry.state
        finally:
            self._release(entry)

    def _acquire(self, name: str | None, keep_alive: float | None, timeout: float) -> ModelEntry:
        deadline = time.monotonic() + timeout
        with self._cond:
            entry = self.entries.get(self.default if name is None else name)
            if entry is None:
                entry = self._adapter_owner(name)
            if entry is None:
                raise ApiError(404, f"The model '{show(name)[1:-1]}' does not exist.", "model", code="model_not_found")
            entry.num_users += 1
            if keep_alive is not None:
                entry.keep_alive = keep_alive
            saw_load = False            # a load this request waited for, which failed if it ends unloaded
            while entry.status != "loaded":
                error = None
                if entry.status == "unloaded":
                    if saw_load and entry.error is not None:
                        error = entry.error
                    else:
                        entry.status, entry.error = "loading", None
                        self._loads.append(entry)
                        self._cond.notify_all()
                saw_load = saw_load or entry.status == "loading"
                left = deadline - time.monotonic()
                if error is None and (left <= 0 or self._stopping):
                    error = ApiError(503, f"the model '{entry.spec.name}' is still loading; retry later",
                                     code="model_loading", headers={"Retry-After": "5"})
                if error is not None:
                    entry.num_users -= 1
                    self._cond.notify_all()
                    raise error
                self._cond.wait(left)     # loading, or unloading before it loads again
            return entry

    def _adapter_owner(self, name: Any) -> ModelEntry | None:
        """The loaded model one of whose LoRA adapters is called `name`."""
        for entry in self.entries.values():
            loras = entry.loaded.ctx.loras if entry.loaded is not None else None
            if loras is not None and isinstance(name, str) and name in loras:
                return entry
        return None

    def _release(self, entry: ModelEntry) -> None:
        with self._cond:
            entry.num_users -= 1
            entry.last_used = time.monotonic()
            self._cond.notify_all()

    @contextmanager
    def hold(self, entry: ModelEntry) -> Iterator[None]:
        with self._cond:
            entry.num_users += 1
        try:
            yield
        finally:
            self._release(entry)

    def load(self, name: str) -> Loaded:
        """Load `name` now (start-up's default model); a failure raises its ApiError."""
        entry = self._acquire(name, None, LOAD_TIMEOUT)
        self._release(entry)
        return entry.loaded

    def cards(self) -> list[dict]:
        """/v1/models' view of each model: loaded or not, and its memory (planned, or held)."""
        out = []
        with self._cond:
            for e in self.entries.values():
                card = {"id": e.spec.name, "status": e.status}
                if e.plan is not None:
                    card["memory"] = {"planned": e.plan.as_dict(), "bytes": e.memory if e.status == "loaded" else 0}
                if e.loaded is not None:
                    card["max_model_len"] = e.loaded.ctx.max_model_len
                    card["root"] = os.path.basename(str(e.loaded.info.get("model_path", "")).rstrip("/\\")) or e.spec.name
                if e.status == "loaded":
                    idle = math.inf if e.num_users else (e.keep_alive if e.keep_alive is not None else self.keep_alive)
                    card["expires_in"] = None if idle == math.inf else max(0.0, e.last_used + idle - time.monotonic())
                    card["load_seconds"] = e.load_seconds
                if e.error is not None and e.status == "unloaded":
                    card["error"] = e.error.message
                out.append(card)
        return out

    def loaded_state(self, name: str) -> ModelState | None:
        """The state of model `name` while it is loaded, else None (it is not loaded for this)."""
        with self._cond:
            entry = self.entries.get(name)
            return entry.state if entry is not None and entry.status == "loaded" else None

    def loaded_names(self) -> list[str]:
        with self._cond:
            return [n for n, e in self.entries.items() if e.status == "loaded"]

    def unload(self, name: str) -> bool:
        """Unload `name` now if it is loaded and idle (Ollama's keep_alive 0 on an empty request)."""
        with self._cond:
            entry = self.entries.get(name)
            if entry is None or entry.status != "loaded" or entry.num_users:
                return False
            entry.status = "unloading"
        self._unload(entry, "asked to")
        return True

    # ---- the server state's engine ----------------------------------------------------------------

    def _engines(self) -> list[Any]:
        with self._cond:
            return [e.loaded.engine for e in self.entries.values() if e.status == "loaded"]

    def is_alive(self) -> bool:
        return not self._stopping and all(_alive(engine) for engine in self._engines())

    @property
    def failure(self) -> str | None:
        with self._cond:
            for e in self.entries.values():
                if e.status == "loaded" and not _alive(e.loaded.engine):
                    return f"the engine of model '{e.spec.name}' stopped"
        return None

    def stats(self) -> EngineStats:
        """The default model's engine's (/metrics and the dashboard: one engine's counters, which
        start again from zero when it is loaded again), empty while it is not loaded."""
        with self._cond:
            entry = self.entries[self.default]
            engine = entry.loaded.engine if entry.status == "loaded" else None
        return engine.stats() if engine is not None else EngineStats()

    def abort(self, request_id: str) -> None:
        for engine in self._engines():
            engine.abort(request_id)

    def shutdown(self, grace_seconds: float = 0.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=grace_seconds + 60)
        with self._cond:
            entries = [e for e in self.entries.values() if e.loaded is not None]
        for e in entries:
            _shutdown(e.loaded.engine, grace_seconds)

    # ---- the manager thread: every load and unload ---------------------------------------------

    def _manage(self) -> None:
        while True:
            with self._cond:
                while not self._loads and not self._stopping:
                    wait = self._next_expiry()
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(None if wait is None else wait)
                if self._stopping:
                    for e in self._loads:
                        e.status, e.error = "unloaded", ApiError(503, "the server is shutting down",
                                                                 code="server_draining")
                    self._loads.clear()
                    self._cond.notify_all()
                    return
                expired = self._take_expired()
                entry = self._loads.popleft() if self._loads else None
            for e in expired:
                self._unload(e, "idle for its keep-alive")
            if entry is not None:
                self._load(entry)

    def _idle_for(self, e: ModelEntry) -> float:
        return e.keep_alive if e.keep_alive is not None else self.keep_alive

    def _next_expiry(self) -> float | None:
        """Seconds until the next idle model's keep-alive ends (None: none will)."""
        now, soonest = time.monotonic(), None
        for e in self.entries.values():
            if e.status != "loaded" or e.num_users or self._idle_for(e) == math.inf:
                continue
            left = e.last_used + self._idle_for(e) - now
            if left <= 0 and not self._idle(e):     # its engine still runs a request (a background
                left = 0.5                          # response): look again soon
            soonest = left if soonest is None else min(soonest, left)
        return soonest

    def _idle(self, e: ModelEntry) -> bool:
        """Loaded, and neither held by a request nor running one (a background response runs
        past its handler)."""
        return e.status == "loaded" and not e.num_users and not _engine_busy(e.loaded.engine)

    def _take_expired(self) -> list[ModelEntry]:
        now = time.monotonic()
        out = []
        for e in self.entries.values():
            if self._idle(e) and now >= e.last_used + self._idle_for(e):
                e.status = "unloading"
                out.append(e)
        return out

    def _held(self, but: ModelEntry) -> int:
        return sum(e.memory for e in self.entries.values() if e.status in ("loaded", "unloading") and e is not but)

    def _cap(self) -> int:
        """Bytes all loaded models may hold: --models-memory, else the machine's (or its cgroup's)
        memory less what the server held before any model."""
        return self.memory_cap if self.memory_cap is not None else machine_memory().total - self._baseline

    def _room(self, entry: ModelEntry) -> int:
        """Bytes free for entry: the cap less what loaded models hold (their KV caches are reserved
        whole, though their pages become resident only as they fill), and never more than the
        machine (and its cgroup) has available now."""
        return min(machine_memory().available, self._cap() - self._held(entry))

    def _make_room(self, entry: ModelEntry, need: int) -> None:
        """Unload idle models, least recently used first, until `need` bytes fit; else an ApiError."""
        while True:
            with self._cond:
                room = self._room(entry)
                if need <= room:
                    return
                idle = sorted((e for e in self.entries.values() if self._idle(e) and e is not entry),
                              key=lambda e: e.last_used)
                busy = [e.spec.name for e in self.entries.values()
                        if e.status == "loaded" and not self._idle(e) and e is not entry]
                if idle:
                    victim = idle[0]
                    victim.status = "unloading"
            if not idle:
                break
            self._unload(victim, f"least recently used, to make room for '{entry.spec.name}'")
        cap = self._cap()
        what = f"model '{entry.spec.name}' needs {entry.plan.describe()}"
        if busy and need <= cap:
            raise ApiError(503, f"{what}, more than is free while {', '.join(repr(b) for b in busy)} "
                                f"{'is' if len(busy) == 1 else 'are'} in use; retry later",
                           code="insufficient_memory", headers={"Retry-After": "5"})
        limit = "--models-memory" if self.memory_cap is not None else "this machine's memory"
        raise ApiError(503, f"{what}; {limit} allows {cap / GiB:.2f} GiB with {room / GiB:.2f} GiB free: "
                            f"it cannot be loaded (lower its max-model-len or kv-cache-space)",
                       code="insufficient_memory")

    def _load(self, entry: ModelEntry) -> None:
        name = entry.spec.name
        t0 = time.perf_counter()
        rss0 = rss_bytes()
        try:
            plan = self.plan(entry.spec)
            with self._cond:
                entry.plan, entry.memory = plan, plan.total
            self._make_room(entry, plan.total)
            logger.info("loading model '%s': planned %s", name, plan.describe())
            loaded = self.build(entry.spec)
            if hasattr(loaded.engine, "step_lock"):
                loaded.engine.step_lock = self.step_lock
        except ApiError as e:
            self._fail(entry, e)
            return
        except BaseException as e:     # SystemExit of a bad flag too: a broken model fails its requests, not the server
            logger.error("model '%s' failed to load: %s", name, e)
            # the cause (a path, a file's content) stays in the server's log, not in a client's answer
            self._fail(entry, ApiError(503, f"the model '{name}' failed to load; the server's log says why",
                                       code="model_load_failed"))
            return
        seconds = time.perf_counter() - t0
        info = loaded.info
        held = int(info.get("weight_bytes") or 0) + int(info.get("kv_cache_bytes") or 0) + plan.activations
        with self._cond:
            entry.loaded, entry.status = loaded, "loaded"
            entry.memory = max(held, 1) if info.get("weight_bytes") else plan.total
            entry.state = ModelState(self.server, self, entry) if self.server is not None else None
            entry.load_seconds = seconds
            entry.last_used = time.monotonic()
            self._cond.notify_all()
        logger.info("model '%s' loaded in %.2f s (holds %.3f GiB; process RSS %.0f -> %.0f MiB)", name, seconds,
                    entry.memory / GiB, rss0 / 2**20, rss_bytes() / 2**20)

    def _fail(self, entry: ModelEntry, error: ApiError) -> None:
        with self._cond:
            entry.status, entry.error, entry.memory = "unloaded", error, 0
            self._cond.notify_all()

    def _unload(self, entry: ModelEntry, why: str) -> None:
        """Stop entry's engine (it has no request: num_users is 0) and give its memory back."""
        rss0 = rss_bytes()
        engine = entry.loaded.engine
        _shutdown(engine, 0.0)
        with self._cond:
            entry.loaded, entry.state, entry.status, entry.memory = None, None, "unloaded", 0
            self._cond.notify_all()
        del engine
        _release_memory()
        logger.info("model '%s' unloaded (%s; process RSS %.0f -> %.0f MiB)", entry.spec.name, why,
                    rss0 / 2**20, rss_bytes() / 2**20)


def _engine_busy(engine: Any) -> bool:
    try:
        stats = engine.stats()
    except Exception:       # a dead engine holds no request
        return False
    return bool(getattr(stats, "num_running", 0) or getattr(stats, "num_waiting", 0))


def _alive(engine: Any) -> bool:
    alive = getattr(engine, "is_alive", True)
    return bool(alive() if callable(alive) else alive)


def _shutdown(engine: Any, grace: float) -> None:
    try:
        engine.shutdown(grace)
    except Exception:
        logger.exception("engine shutdown failed")


# ---- routes ---------------------------------------------------------------------------------------

@contextmanager
def model_state(state: ServerState, name: str | None, keep_alive: Any = None) -> Iterator[ServerState]:
    """The state of model `name` (None: the default), loaded if it is not, held loaded for the
    block, with Ollama's keep_alive (parse_keep_alive's forms) from now on: for any front end.
    A server of one model: its own state (keep_alive has no effect), a 404 for another name."""
    pool: ModelPool | None = state.pool
    if pool is not None:
        with pool.use(name, keep_alive) as model:
            yield model
        return
    if name is not None and name not in state.ctx.model_names and not (state.ctx.loras is not None
                                                                      and name in state.ctx.loras):
        raise ApiError(404, f"The model '{show(name)[1:-1]}' does not exist.", "model", code="model_not_found")
    yield state


def per_model(handler: Callable[[Request, ServerState], Response],
              ollama: bool = False) -> Callable[[Request, ServerState], Response]:
    """handler run on the state of the model its JSON body names (the default without one).
    ollama: Ollama's body (the model as "model" or "name", "tiny:latest" for "tiny", keep_alive)."""
    def handle(req: Request, state: ServerState) -> Response:
        pool: ModelPool = state.pool
        body = req.body()
        fields = parse_json(body)
        fields = fields if isinstance(fields, dict) else {}
        name, keep_alive = fields.get("model"), None
        if ollama:
            name, keep_alive = name if name is not None else fields.get("name"), fields.get("keep_alive")
            if isinstance(name, str) and name not in pool.entries:
                name = name.removesuffix(":latest")
        req = dataclasses.replace(req, read_body=lambda: body)
        with pool.use(name if isinstance(name, str) else None, keep_alive) as model:
            return handler(req, model)
    handle.__doc__ = handler.__doc__
    return handle


def model_cards(state: ServerState, card: Callable[[ServerState, str], dict]) -> list[dict]:
    """/v1/models entries of every model of the pool: card(state, name)'s fields, then whether it
    is loaded ("status": loaded | loading | unloaded), its memory in bytes (planned once it was
    planned, held while loaded) and the seconds until an idle one unloads."""
    out = []
    for c in state.pool.cards():
        base = card(state, c["id"])
        base.update(root=c.get("root", c["id"]), max_model_len=c.get("max_model_len"))
        base.update({k: v for k, v in c.items() if k not in ("id", "root", "max_model_len")})
        out.append(base)
    return out


def memory_view(state: ServerState) -> dict:
    """The dashboard's memory facts: the machine's (and its cgroup's), and each model's status,
    the bytes it holds and, with several models, its plan."""
    mem = machine_memory()
    machine = {"total_bytes": mem.total, "available_bytes": mem.available, "cgroup_limit_bytes": mem.cgroup_limit}
    if state.pool is None:
        info = state.kernel_info
        held = int(info.get("weight_bytes") or 0) + int(info.get("kv_cache_bytes") or 0)
        return {"machine": machine, "models_memory_bytes": None,
                "models": [{"id": state.ctx.model_names[0], "status": "loaded", "bytes": held, "planned": None}]}
    rows = [{"id": c["id"], "status": c["status"], "bytes": (c.get("memory") or {}).get("bytes", 0),
             "planned": (c.get("memory") or {}).get("planned")} for c in state.pool.cards()]
    return {"machine": machine, "models_memory_bytes": state.pool.memory_cap, "models": rows}


def wrap_routes(table: RouteTable) -> RouteTable:
    """The table with each route of MODEL_ROUTES (and Ollama's) answered on the model its body names."""
    return RouteTable([dataclasses.replace(r, handler=per_model(r.handler, r.path in OLLAMA_MODEL_ROUTES))
                       if r.path in MODEL_ROUTES + OLLAMA_MODEL_ROUTES and r.method == "POST" else r
                       for r in table.routes])


def spec_args(args: argparse.Namespace, spec: ModelSpec) -> argparse.Namespace:
    """The serve flags one model is built with: the command line's, then the spec's own."""
    ns = copy.copy(args)
    ns.model, ns.model_flag, ns.more_models, ns.hf_repo = spec.model, None, (), None
    ns.served_model_name = [spec.name]
    for key, value in spec.flags.items():
        setattr(ns, key, value)
    return ns
