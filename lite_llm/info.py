"""`python -m lite_llm info [--model M] [--json]`: what lite_llm sees and will do on this machine.

CPU model and the ISA flags the kernels care about, the kernel variant the dispatcher chose
and why, the thread plan `serve` would use (and whether binding verifies here), memory per
NUMA node, a quick measured memory bandwidth, and with --model the decode roofline:
bandwidth / bytes of weights read per generated token (batch 1).

What lives elsewhere: topology, plans and binding are lite_llm.cpu; the choice of variant is
lite_llm._kernels (this module only reports it); checkpoint parsing is lite_llm.model.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import threading
from typing import Any

from lite_llm import cpu
from lite_llm.engine.live import read_bandwidth as measure_bandwidth
from lite_llm.engine.memory import machine_memory, plan_memory

# Features each architecture's kernels may use (names as lite_llm._kernels._cpu.has knows them).
ISA_FLAGS = {
    "x86_64": ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
               "avx512dq", "avx512vnni", "avx512vbmi", "avx512bitalg", "avx512bf16", "amx_tile", "amx_bf16",
               "amx_int8"),
    "aarch64": ("neon", "asimdhp", "dotprod", "sve", "bf16", "i8mm"),
    "s390x": ("vx", "vxe", "vxe2"),
}
BANDWIDTH_SECONDS = 0.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", nargs="?", const="", default=None,
                        help="model (directory, .gguf file or hub id; alone: the embedded "
                             "default model): print its decode roofline")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="plan (and check the binding of) this many tensor-parallel ranks; with --model, "
                             "what each rank would hold")
    parser.add_argument("--no-bandwidth", action="store_true",
                        help="skip the memory bandwidth test (and so the roofline)")


# ----------------------------------------------------------------------------- probes

def isa_flags() -> dict[str, bool] | str:
    """Feature -> usable (CPU has it and the OS saves its registers), or why unknown."""
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    try:
        probe = cpu.cpu_probe()
    except ImportError as e:
        return f"feature probe not built: {e}"
    return {f: bool(probe.has(f)) for f in ISA_FLAGS.get(machine, ())}


def kernel_variant() -> dict[str, Any]:
    """{"name": chosen variant or None, "why": [lines], "built": bool}."""
    try:
        import lite_llm._kernels as kernels
    except ImportError as e:
        return {"name": None, "built": False, "why": [f"kernels not importable: {e}",
                                                      *_variant_table()]}
    return {"name": kernels.VARIANT.name, "built": True, "why": list(kernels.explain())}


def _variant_table() -> list[str]:
    """The variant table read straight from variants.py (the package import failed)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernels")
    spec = importlib.util.spec_from_file_location("_lite_llm_variants", os.path.join(here, "variants.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    flags = isa_flags()
    lines = []
    for v in table.variants_for(platform.machine()):
        built = any(f.startswith("kernels.") for f in os.listdir(os.path.join(here, v.name))) \
            if os.path.isdir(os.path.join(here, v.name)) else False
        missing = [f for f in v.needs if isinstance(flags, dict) and not flags.get(f, False)]
        state = "built" if built else "not built"
        cpu_ok = f"CPU lacks {', '.join(missing)}" if missing else "CPU can run it"
        lines.append(f"{v.name}: {state}, {cpu_ok}")
    return lines


def gemm_paths() -> dict[str, Any]:
    """Each GEMM operation's chosen inner-product path and the measured peaks (GMAC/s per core)
    of the chosen kernel variant (lite_llm._kernels.gemm_path: measured once, cached), and AMX."""
    try:
        from lite_llm._kernels import gemm_path, kernels
    except ImportError as e:
        return {"error": f"kernels not importable: {e}"}
    amx = gemm_path.amx()
    amx_line = ("AMX: " + (", ".join(f for f, ok in amx.items() if ok) + " usable; not used (no AMX kernels yet)"
                           if any(amx.values()) else "absent (or not enabled by the OS)"))
    try:
        paths = gemm_path.choose(kernels)
    except ValueError as e:       # a bad LITE_LLM_GEMM_PATH
        return {"error": str(e), "amx": amx, "lines": [amx_line]}
    return {**paths.as_dict(), "amx": amx, "lines": paths.describe() + [amx_line]}


def model_weight_bytes(model: str | None) -> dict[str, Any]:
    """Parameters and bytes read per decoded token of `model` (bf16: params * 2; the embedding
    table counts only when it doubles as the LM head, else one row per token is gathered)."""
    try:
        from lite_llm.model import loader
        path = loader.resolve_model(model or None)
    except ImportError:
        loader, path = None, model
    file_bytes = _path_bytes(path)
    shapes = _tensor_shapes(path) if loader is not None else None
    if shapes is None:
        # no parser: a file's size approximates its weights; bf16 if it is not quantized
        return {"path": path, "params": None, "file_bytes": file_bytes,
                "bytes_per_token_bf16": file_bytes,
                "note": "parameter count unavailable: estimated from the file size"}
    params = sum(math.prod(s) for s in shapes.values())
    share = _active_expert_share(path)
    # a mixture of experts reads, of its experts, the top-k of X a token is routed to
    active = sum(math.prod(s) * (share if _is_expert(n) else 1.0) for n, s in shapes.items())
    embed = next((n for n in shapes if n in ("token_embd.weight", "model.embed_tokens.weight",
                                             "model.decoder.embed_tokens.weight")), None)
    has_head = any(n in shapes for n in ("output.weight", "lm_head.weight"))
    gathered = math.prod(shapes[embed]) if embed and has_head else 0
    out = {"path": path, "params": params, "file_bytes": file_bytes,
           "bytes_per_token_bf16": int(active - gathered) * 2,
           "note": "weights read per token: every matrix once, in bf16"
                   + ("; the embedding table is gathered, not read" if gathered else "")
                   + (f"; of the experts, the {share:.3g} share a token is routed to" if share < 1 else "")}
    if share < 1:
        out["active_params"] = int(active)
    config = _config(path)
    if config is not None and not config.post_ln:
        # the paged cache's bytes per context token with the bf16 cache: K and V rows of every
        # KV head, or latent attention's one row of latent + RoPE key (runner.kv_bytes_per_block)
        rows = config.cache_kv_heads * (1 if config.is_mla else 2)
        out["kv_bytes_per_token_bf16"] = config.num_attention_layers * rows * config.cache_head_dim * 2
        out["kv_note"] = (f"latent {config.kv_lora_rank} + RoPE key {config.head_dim} values x {config.num_layers} "
                          "layers" if config.is_mla else
                          f"K and V of {config.num_kv_heads} KV heads of {config.head_dim} x "
                          f"{config.num_attention_layers} {'attention ' if config.is_hybrid else ''}layers")
        if config.is_hybrid:   # the conv layers' state per sequence (runner.conv_states), float32
            out["state_bytes_per_seq"] = config.state_bytes_per_seq
            out["state_note"] = (f"{config.conv_L_cache - 1} gated inputs of {config.dim} channels x "
                                 f"{config.num_conv_layers} conv layers, float32, constant in context length"
                                 if config.num_conv_layers else
                                 f"conv {config.linear_conv_kernel_dim - 1} x {config.deltanet_conv_dim} and delta-rule "
                                 f"{config.linear_num_value_heads} x {config.linear_key_head_dim} x "
                                 f"{config.linear_value_head_dim} values x {config.num_deltanet_layers} Gated DeltaNet "
                                 "layers, float32, constant in context length"
                                 if config.num_deltanet_layers else
                                 f"conv {config.mamba_d_conv - 1} x {config.mamba_conv_dim} and scan "
                                 f"{config.mamba_n_heads} x {config.mamba_d_head} x {config.mamba_d_state} values x "
                                 f"{config.num_mamba_layers} Mamba2 layers, float32, constant in context length")
    if path.endswith(".gguf"):
        try:
            out.update(_gguf_formats(path, skip=embed if gathered else None, share=share))
        except ImportError:     # no kernel build: the formats are the kernels' to say
            pass
    elif os.path.isdir(path) and shapes is not None:
        out.update(_fp8_formats(path, skip=embed if gathered else None, share=share))
    return out


def _is_expert(name: str) -> bool:
    """A routed expert's weight: HF mlp.experts.{j}.* / experts.gate_up_proj, GGUF ffn_*_exps."""
    return ".experts." in name or "_exps." in name


def _config(path: str):
    """The ModelConfig of an HF directory or GGUF file, or None where it cannot be read."""
    from lite_llm.model import arch, gguf
    from lite_llm.model.loader import ModelLoadError
    try:
        if os.path.isdir(path):
            return arch.read_config(path)[0]
        f = gguf.GGUFFile(path)
        name = f.metadata.get("general.architecture")
        return arch.for_gguf(name, path, f.metadata).gguf_config(f, name)
    except (ModelLoadError, OSError):
        return None


def _active_expert_share(path: str) -> float:
    """num_experts_per_tok / num_experts of a mixture-of-experts model, else 1."""
    config = _config(path)
    return config.num_experts_per_tok / config.num_experts if config is not None and config.is_moe else 1.0


def _gguf_formats(path: str, skip: str | None, share: float = 1.0) -> dict[str, Any]:
    """How a GGUF file's matrices run: block types the kernels take stay as stored (repacked
    into panels the kernels size: the same bytes, K-quant scales widened a little), other 2-D
    tensors in bf16; and so the bytes a decoded token reads as run (`skip`: the gathered
    embedding; 3-D expert tensors [X, F, E] count as X matrices, `share` of them read)."""
    from lite_llm._kernels import kernels
    from lite_llm.model.gguf import NATIVE_TYPES, GGUFFile
    formats: dict[str, int] = {}
    per_token = 0
    for name, t in GGUFFile(path).tensors.items():
        if len(t.shape) not in (2, 3):
            continue
        kept = t.type_name in NATIVE_TYPES
        key = f"{t.type_name} (as stored)" if kept else f"{t.type_name} -> bf16"
        count = t.shape[0] if len(t.shape) == 3 else 1
        formats[key] = formats.get(key, 0) + count
        if name != skip:
            rows, cols = t.shape[-2:]
            one = -(-rows // 16) * kernels.qpanel_bytes(t.type_name, cols) if kept else rows * cols * 2
            per_token += int(one * count * (share if _is_expert(name) else 1.0))
    return {"formats": formats, "bytes_per_token_as_run": per_token}


def _fp8_formats(path: str, skip: str | None, share: float = 1.0) -> dict[str, Any]:
    """As _gguf_formats, for a Hugging Face directory with FP8 weights (float8_e4m3fn beside
    their scales): those stay as stored, one byte a weight plus 16 float32 scales per 16 rows and
    128 columns (layout.fp8_panel_bytes); other matrices run in bf16. {} for other directories."""
    from lite_llm.model.hf import SafetensorsCheckpoint
    entries = SafetensorsCheckpoint(path).entries
    if not any(e.stype == "F8_E4M3" for e in entries.values()):
        return {}
    formats: dict[str, int] = {}
    per_token = 0
    for name, e in entries.items():
        if len(e.shape) not in (2, 3) or name.endswith(("_scale", "_scale_inv")):
            continue
        kept = e.stype == "F8_E4M3"
        key = f"{e.stype} (as stored)" if kept else f"{e.stype} -> bf16"
        count = e.shape[0] if len(e.shape) == 3 else 1
        formats[key] = formats.get(key, 0) + count
        if name != skip:
            rows, cols = e.shape[-2:]
            one = -(-rows // 16) * (-(-cols // 128) * 64 + cols * 16) if kept else rows * cols * 2
            per_token += int(one * count * (share if _is_expert(name) else 1.0))
    return {"formats": formats, "bytes_per_token_as_run": per_token}


def _path_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                   if f.endswith((".safetensors", ".gguf", ".bin")))
    return os.path.getsize(path)


def _tensor_shapes(path: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape from the checkpoint headers (nothing is loaded)."""
    try:
        if path.endswith(".gguf"):
            from lite_llm.model.gguf import GGUFFile
            return {name: t.shape for name, t in GGUFFile(path).tensors.items()}
        from lite_llm.model.hf import SafetensorsCheckpoint
        return {name: e.shape for name, e in SafetensorsCheckpoint(path).entries.items()}
    except (ImportError, AttributeError):
        return None


# ----------------------------------------------------------------------------- report

def collect(model: str | None = None, bandwidth: bool = True, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """Everything `info` prints, as plain data."""
    set_env = cpu.configure_openmp_env()
    topo = cpu.read_topology()
    info: dict[str, Any] = {
        "cpu_model": topo.model_name or platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "online_cpus": cpu.format_cpulist(topo.online),
        "allowed_cpus": cpu.format_cpulist(topo.allowed),
        "physical_cores": len(topo.cores),
        "cgroup": topo.cgroup_source or "no cpuset or quota limit",
        "isa_flags": isa_flags(),
        "kernel_variant": kernel_variant(),
        "openmp_env": {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY",
                                                      "OMP_NUM_THREADS")},
        "openmp_env_set_by_lite_llm": sorted(set_env),
        "memory_nodes": [{"node": n.node_id, "cpus": cpu.format_cpulist(n.cpus),
                          "total_gib": round(n.mem_total / 2**30, 2),
                          "free_gib": round(n.mem_free / 2**30, 2)} for n in topo.nodes],
    }
    info["gemm_paths"] = gemm_paths()
    try:
        from lite_llm.llm import plan_ranks
        plan = plan_ranks(tensor_parallel_size, serving=True, topology=topo)
        info["plan"] = {"mode": plan.mode, "ranks": plan.describe(), "notes": list(plan.notes)}
        info["binding"] = _check_binding(plan)
        threads = plan.num_threads
    except ValueError as e:
        info["plan"] = {"mode": "invalid", "ranks": [], "notes": [str(e)]}
        threads = len(topo.allowed)
    if bandwidth:
        gbs = measure_bandwidth(threads)
        info["bandwidth_gbs"] = round(gbs, 1)
        info["bandwidth_threads"] = max(1, min(threads, 64))
    mem = machine_memory()
    info["memory"] = {"total_bytes": mem.total, "available_bytes": mem.available, "cgroup_limit_bytes": mem.cgroup_limit}
    if model is not None:
        try:
            weights = model_weight_bytes(model)
        except (ValueError, OSError) as e:      # ModelLoadError is a ValueError
            weights = {"error": str(e)}
        info["model"] = weights
        if "error" not in weights:
            weights["memory_plan"] = _memory_plan(weights["path"])
        if tensor_parallel_size > 1 and "error" not in weights:
            info["tensor_parallel"] = _rank_shards(model, tensor_parallel_size)
        if bandwidth and "error" not in weights:
            per_tok = weights["bytes_per_token_bf16"]
            weights["roofline_tok_s_bf16"] = round(info["bandwidth_gbs"] * 1e9 / per_tok, 1)
            weights["roofline_tok_s_as_stored"] = round(info["bandwidth_gbs"] * 1e9 /
                                                        weights["file_bytes"], 1)
            if "bytes_per_token_as_run" in weights:
                weights["roofline_tok_s_as_run"] = round(info["bandwidth_gbs"] * 1e9 /
                                                         weights["bytes_per_token_as_run"], 1)
    return info


def _memory_plan(path: str) -> dict[str, Any]:
    """What `serve` of path at its defaults would hold (engine/memory.py), or why it cannot say."""
    try:
        from lite_llm.model.pooler import runner_for_model
        from lite_llm.multimodal.transcribe import is_whisper_model
        if is_whisper_model(path):       # the transcription engine's plan (engine/transcription.py)
            from lite_llm.engine.transcription import plan_memory as plan_transcription_memory
            plan = plan_transcription_memory(path)
        else:
            plan = plan_memory(path, pooling=runner_for_model(path) == "pooling")
    except (ValueError, OSError, ImportError) as e:
        return {"error": str(e)}
    return {**plan.as_dict(), "note": plan.note}


def _check_binding(plan: cpu.ThreadPlan) -> list[str]:
    """Apply each rank's plan in a short-lived thread (its OpenMP pool dies with it) and report
    (a worker process binds the same way)."""
    lines = []
    for rank in range(len(plan.ranks)):
        out: list[cpu.BindReport] = []
        t = threading.Thread(target=lambda: out.append(cpu.apply_plan(plan, rank)), name="lite_llm-info-bind")
        t.start()
        t.join()
        found = out[0].describe() if out else ["binding check did not run"]
        lines += found if len(plan.ranks) == 1 else [f"rank {rank} {line}" for line in found]
    return lines


def _rank_shards(model: str | None, size: int) -> list[str]:
    """What each tensor-parallel rank holds of `model`, or why it cannot be split."""
    from lite_llm.engine import tp
    from lite_llm.model.loader import load_model
    loaded = load_model(model or None, skip_tokenizer_init=True, progress=False)
    loaded.release()
    try:
        tp.check_tensor_parallel(loaded.config, size)
    except ValueError as e:
        return [str(e)]
    return [f"rank {r}: {tp.describe_rank(loaded.config, r, size)}" for r in range(size)]


def format_text(info: dict[str, Any]) -> list[str]:
    lines = [f"CPU:            {info['cpu_model']} ({info['machine']}), "
             f"{info['physical_cores']} physical cores, online CPUs {info['online_cpus']}, "
             f"usable {info['allowed_cpus']}",
             f"cgroup:         {info['cgroup']}"]
    flags = info["isa_flags"]
    lines.append("ISA:            " + (flags if isinstance(flags, str) else
                                       " ".join(f if ok else f"-{f}" for f, ok in flags.items())))
    kv = info["kernel_variant"]
    lines.append(f"kernel variant: {kv['name'] or 'none (not built)'}")
    lines += [f"                {why}" for why in kv["why"]]
    gp = info.get("gemm_paths") or {}
    if "error" in gp:
        lines.append(f"GEMM paths:     {gp['error']}")
    lines += [("GEMM paths:     " if i == 0 and "error" not in gp else "                ") + line
              for i, line in enumerate(gp.get("lines", []))]
    omp = ", ".join(f"{k}={v}" for k, v in info["openmp_env"].items() if v is not None) or "defaults"
    by_us = info["openmp_env_set_by_lite_llm"]
    lines.append(f"OpenMP env:     {omp}" + (f" ({', '.join(by_us)} set by lite_llm)" if by_us else ""))
    lines.append(f"thread plan:    {info['plan']['mode']}")
    lines += [f"  {r}" for r in info["plan"]["ranks"]]
    lines += [f"  note: {n}" for n in info["plan"]["notes"]]
    lines += [f"  {b}" for b in info.get("binding", [])]
    for n in info["memory_nodes"]:
        lines.append(f"memory node {n['node']}:  {n['total_gib']:.1f} GiB total, "
                     f"{n['free_gib']:.1f} GiB free, CPUs {n['cpus']}")
    if "bandwidth_gbs" in info:
        lines.append(f"bandwidth:      {info['bandwidth_gbs']:.1f} GB/s (read of 256 MB, "
                     f"{info['bandwidth_threads']} threads)")
    mem = info["memory"]
    limit = mem["cgroup_limit_bytes"]
    lines.append(f"memory:         {mem['total_bytes'] / 2**30:.1f} GiB total, {mem['available_bytes'] / 2**30:.1f} GiB "
                 f"available" + (f" (cgroup limit {limit / 2**30:.1f} GiB)" if limit else ""))
    if info.get("tensor_parallel"):
        lines.append("tensor parallel:")
        lines += [f"  {line}" for line in info["tensor_parallel"]]
    m = info.get("model")
    if m and "error" in m:
        lines.append(f"model:          {m['error']}")
    elif m:
        params = f"{m['params'] / 1e6:.1f}M params, " if m["params"] else ""
        lines.append(f"model:          {m['path']}: {params}{m['file_bytes'] / 2**20:.1f} MiB on disk")
        lines.append(f"                {m['note']}")
        if "formats" in m:
            lines.append("weight formats: " + ", ".join(f"{k} x {n}" for k, n in sorted(m["formats"].items()))
                         + f"; {m['bytes_per_token_as_run'] / 2**20:.0f} MiB read per token as run")
        if "kv_bytes_per_token_bf16" in m:
            lines.append(f"KV cache:       {m['kv_bytes_per_token_bf16']} bytes per context token in bf16 "
                         f"({m['kv_note']})")
        if "state_bytes_per_seq" in m:
            lines.append(f"state cache:    {m['state_bytes_per_seq']} bytes per sequence ({m['state_note']})")
        if "roofline_tok_s_bf16" in m:
            lines.append(f"decode roofline: {m['roofline_tok_s_bf16']:.0f} tok/s in bf16 "
                         f"({m['bytes_per_token_bf16'] / 2**20:.0f} MiB/token), "
                         f"{m['roofline_tok_s_as_stored']:.0f} tok/s at the file's own size "
                         f"(batch 1, bandwidth / bytes read per token)")
        if "roofline_tok_s_as_run" in m:
            lines.append(f"                {m['roofline_tok_s_as_run']:.0f} tok/s as lite_llm runs it "
                         f"({m['bytes_per_token_as_run'] / 2**20:.0f} MiB/token)")
        plan = m.get("memory_plan") or {}
        if "error" in plan:
            lines.append(f"memory plan:    {plan['error']}")
        elif plan:
            lines.append(f"memory plan:    {plan['total'] / 2**30:.2f} GiB to serve it: weights "
                         f"{plan['weights'] / 2**30:.2f}, KV cache {plan['kv_cache'] / 2**30:.2f}, activations "
                         f"{plan['activations'] / 2**30:.2f} ({plan['note']}; serve's defaults)")
    return lines


def run(args: argparse.Namespace) -> int:
    info = collect(model=args.model, bandwidth=not args.no_bandwidth,
                   tensor_parallel_size=args.tensor_parallel_size)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print("\n".join(format_text(info)))
    return 0
