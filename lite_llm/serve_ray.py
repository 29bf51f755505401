"""Ray Serve: lite_llm replicas as one Ray Serve application, so a cluster of CPU machines is one
OpenAI endpoint (`pip install "lite-llm[ray]"`).

    app = build_app("model.gguf", num_replicas=4, num_cpus_per_replica=16, max_model_len=8192)
    serve.run(app)                                   # or: python -m lite_llm serve-ray MODEL ...

Each Ray replica (an actor holding num_cpus_per_replica CPUs) builds an engine and starts the
very server `serve` runs (server/app.py: routes, validation, SSE, errors, metrics) on 127.0.0.1 at
a free port of its own; the deployment hands every HTTP request Ray routes to it over to that
server and streams the answer back unchanged. A client that goes away closes that inner
connection, which aborts its request as on `serve`. Ray schedules the replicas, restarts one
whose check_health fails (its engine stopped), routes requests and autoscales
(autoscaling_config is Ray Serve's own); this module is the deployment only.

Threads: a replica that may use fewer CPUs than its machine has runs num_cpus_per_replica OpenMP
threads without pinning (Ray reserves CPUs, it does not assign cores); set
LITE_LLM_CPU_OMP_THREADS_BIND through Ray's runtime_env to pin them yourself. With the whole
machine it keeps the `auto` plan.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from typing import Any

from lite_llm.engine.assemble import default_max_num_seqs
from lite_llm.server import app

log = logging.getLogger("lite_llm.serve_ray")

# hop-by-hop headers (RFC 9110 7.6.1) and the ones each side's HTTP stack sets itself
_DROP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                 "upgrade", "host", "content-length"}
_RAY_OPTIONS = ("name", "num_replicas", "num_cpus_per_replica", "autoscaling_config", "max_ongoing_requests",
                "ray_actor_options")


def _import_ray():
    try:        # optional (the ray extra): loaded only when Ray Serve runs
        from ray import serve
    except ImportError:
        raise ImportError('Ray Serve is not installed: pip install "lite-llm[ray]" (or "ray[serve]")') from None
    return serve


def serve_options(**overrides: Any) -> argparse.Namespace:
    """`serve`'s flags as parsed from nothing, with overrides by flag name (max_model_len=1024,
    tool_call_parser="hermes", ...); an unknown name is a TypeError listing the known ones."""
    parser = argparse.ArgumentParser()
    app.add_arguments(parser)
    args = parser.parse_args([])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"unknown serve option(s) {unknown}; known: {sorted(vars(args))}")
    if overrides.get("data_parallel_size", 1) != 1:
        raise ValueError("data_parallel_size: under Ray each replica is one engine; use num_replicas")
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class LiteLLMReplica:
    """One Ray Serve replica: an engine and its HTTP server on 127.0.0.1, requests forwarded to it."""

    def __init__(self, args: argparse.Namespace, num_cpus: float):
        logging.basicConfig(level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        allowed = len(os.sched_getaffinity(0))
        if not any(k in os.environ for k in ("LITE_LLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_OMP_THREADS_BIND")) \
                and num_cpus < allowed:
            # Ray reserves CPUs but does not say which: several replicas may share a machine
            os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"] = "nobind"
            os.environ["OMP_NUM_THREADS"] = str(max(1, int(num_cpus)))
            engine, tokenizer, info = app.start_engine(args)
        self.server = app.build_server(args, engine, tokenizer, info, host="127.0.0.1", port=0)
        self.server.start()
        self._session = None
        log.info("lite-llm replica (pid %d) serving on %s behind Ray Serve", os.getpid(), self.server.url)

    async def __call__(self, request: Any) -> Any:
        import aiohttp      # Ray Serve's own dependencies: present only where it runs
        from starlette.responses import StreamingResponse
        if self._session is None:     # made in Ray's event loop, where it is used
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                                  auto_decompress=False)
        url = self.server.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS}
        body = await request.body()
        resp = await self._session.request(request.method, url, data=body or None, headers=headers,
                                           allow_redirects=False)

        async def relay():
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.close()          # early (client gone): the inner server sees it and aborts

        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_HEADERS}
        return StreamingResponse(relay(), status_code=resp.status, headers=out_headers)

    def check_health(self) -> None:
        """Ray calls this periodically; raising makes it replace the replica."""
        if not self.server.state.engine_alive():
            raise RuntimeError("the lite-llm engine of this replica is not running")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.drain(5.0)


def build_app(model: str | None = None, *, name: str = "lite-llm", num_replicas: int | str | None = 1,
              num_cpus_per_replica: float = 1, autoscaling_config: dict | None = None,
              max_ongoing_requests: int | None = None, ray_actor_options: dict | None = None,
              **options: Any) -> Any:
    """A Ray Serve application of lite_llm replicas serving `model` (None: the default model)
    on the OpenAI routes of `serve`. options: any `serve` flag by its Python name
    (max_model_len=8192, kv_cache_space=4, served_model_name=["m"], api_key=..., ...).
    autoscaling_config (Ray Serve's: min_replicas, max_replicas, target_ongoing_requests, ...)
    replaces num_replicas. Deploy it with ray.serve.run(app) or `serve run module:app`."""
    serve = _import_ray()
    args = serve_options(model=model, **options)
    actor_options = {"num_cpus": num_cpus_per_replica, **(ray_actor_options or {})}
    deployment_options: dict[str, Any] = {"name": name, "ray_actor_options": actor_options}
    if autoscaling_config is not None:
        deployment_options.update(autoscaling_config=autoscaling_config, num_replicas="auto"
                                  if num_replicas in (None, "auto", 1) else num_replicas)
        if deployment_options["num_replicas"] != "auto":
            raise ValueError("pass num_replicas or autoscaling_config, not both")
    else:
        deployment_options["num_replicas"] = num_replicas
    if max_ongoing_requests is not None:
        deployment_options["max_ongoing_requests"] = max_ongoing_requests
    else:      # the engine batches: let Ray send a replica what its batch holds
        seqs = args.max_num_seqs
        if seqs is None:      # the replica's own default for the threads it will run
            seqs = default_max_num_seqs(max(1, int(num_cpus_per_replica)), serving=True)[0]
        deployment_options["max_ongoing_requests"] = max(seqs, 5)
    deployment = serve.deployment(LiteLLMReplica, **deployment_options)
    return deployment.bind(args, float(num_cpus_per_replica))


# ---- `python -m lite_llm serve-ray` -----------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    app.add_arguments(parser)
    for action in parser._actions:      # one engine per Ray replica: num_replicas scales instead
        if action.dest == "data_parallel_size":
            action.help = argparse.SUPPRESS
    a = parser.add_argument
    a("--num-replicas", type=int, default=None, help="Ray Serve replicas, each one engine (default 1)")
    a("--num-cpus-per-replica", type=float, default=1, help="CPUs Ray reserves for each replica (its threads)")
    a("--autoscaling-config", default=None,
      help="Ray Serve autoscaling config as JSON or a path to a JSON file "
           "('{\"min_replicas\": 1, \"max_replicas\": 4, \"target_ongoing_requests\": 8}'); "
           "replaces --num-replicas")
    a("--max-ongoing-requests", type=int, default=None,
      help="requests Ray sends one replica at once (default: --max-num-seqs)")
    a("--ray-address", default=None,
      help="a running Ray cluster ('auto', 'ray://host:10001'); default: start a local Ray")
    a("--ray-num-cpus", type=int, default=None, help="CPUs of the local Ray started without --ray-address")
    a("--app-name", default="lite-llm", help="Ray Serve application and deployment name")


def _autoscaling(value: str | None) -> dict | None:
    if value is None:
        return None
    text = open(value).read() if os.path.isfile(value) else value
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--autoscaling-config: not JSON ({e}): {value[:200]}") from None
    if not isinstance(config, dict):
        raise SystemExit("--autoscaling-config: a JSON object is needed")
    return config


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.data_parallel_size != 1:
        raise SystemExit("serve-ray: each Ray replica is one engine; use --num-replicas, not --data-parallel-size")
    serve = _import_ray()
    import ray      # optional (the ray extra): loaded only when Ray Serve runs
    options = {k: v for k, v in vars(args).items()
               if k not in {"command", "_run", "num_replicas", "num_cpus_per_replica", "autoscaling_config",
                            "max_ongoing_requests", "ray_address", "ray_num_cpus", "app_name"}}
    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        ray.init(num_cpus=args.ray_num_cpus, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    if args.num_replicas is not None and args.autoscaling_config is not None:
        raise SystemExit("serve-ray: --autoscaling-config sets the replica count: drop --num-replicas")
    app = build_app(name=args.app_name, num_replicas=args.num_replicas or 1,
                    num_cpus_per_replica=args.num_cpus_per_replica,
                    autoscaling_config=_autoscaling(args.autoscaling_config),
                    max_ongoing_requests=args.max_ongoing_requests, **options)
    serve.run(app, name=args.app_name, route_prefix="/")
    log.info("lite-llm serving on http://%s:%d through Ray Serve (%s)", args.host, args.port,
             f"autoscaling {args.autoscaling_config}" if args.autoscaling_config
             else f"{args.num_replicas or 1} replica(s) of {args.num_cpus_per_replica:g} CPU(s)")
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        serve.shutdown()
        ray.shutdown()
    return 0
