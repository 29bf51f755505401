"""`lite-llm bench allreduce`: what one tensor-parallel all-reduce costs on this machine.

One process per rank, each pinned to the first CPU of its rank's plan (the bind spec, or NUMA
nodes under auto, as `serve -tp N` plans them), runs the shared-memory all-reduce of
src/tp_shm.h (TPComm.allreduce: copy into its slot, publish, spin until every rank has, sum
the slots) on [tokens, dim] floats, many times in a row. Reported: the median microseconds
per all-reduce over --repeats timed runs; a layer does two (after o and after down). The loop
is driven from Python, so each figure includes one Python call (~1 us) the compiled forward
does not pay.
"""
from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import tempfile
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=2)
    parser.add_argument("--dim", type=int, default=1024, help="model width (floats per token)")
    parser.add_argument("--tokens", default="1,8,128,512", help="step sizes, comma-separated")
    parser.add_argument("--iters", type=int, default=2000, help="all-reduces per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")


def _rank(path: str, nbytes: int, rank: int, size: int, cap: int, offset: int, cpu: int, sizes: list[int],
          iters: int, repeats: int, out) -> None:
    import numpy as np
    from lite_llm._kernels import kernels
    os.sched_setaffinity(0, {cpu})
    with open(path, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), nbytes)
    comm = kernels.TPComm(mm, rank, size, cap, offset, 60.0)
    result = {}
    for n in sizes:
        x = np.zeros(n, np.float32)
        for _ in range(min(iters, 200)):           # warm up: pages, caches, the OpenMP pool
            comm.allreduce(x, 1)
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iters):
                comm.allreduce(x, 1)
            runs.append((time.perf_counter() - start) / iters * 1e6)
        result[n] = sorted(runs)[len(runs) // 2]
    out.put((rank, result))


def run(args: argparse.Namespace) -> int:
    from lite_llm import cpu
    from lite_llm._kernels import kernels
    from lite_llm.llm import plan_ranks
    size = args.tensor_parallel_size
    plan = plan_ranks(size, serving=False)
    tokens = [int(t) for t in args.tokens.split(",")]
    sizes = [t * args.dim for t in tokens]
    cap = max(sizes)
    header, slot_bytes = kernels.tp_segment_bytes(size, cap)
    nbytes = header + slot_bytes
    fd, path = tempfile.mkstemp(prefix="lite_llm_tp_bench_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, nbytes)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(path, nbytes, r, size, cap, header, plan.ranks[r].cpus[0], sizes,
                                                 args.iters, args.repeats, out)) for r in range(size)]
        for p in procs:
            p.start()
        results = dict(out.get() for _ in procs)
        for p in procs:
            p.join()
    finally:
        os.close(fd)
        os.unlink(path)
    # every rank leaves each all-reduce together: the slowest rank's figure is the cost
    cost = {t: max(results[r][n] for r in results) for t, n in zip(tokens, sizes)}
    cpus = [plan.ranks[r].cpus[0] for r in range(size)]
    if args.json:
        print(json.dumps({"ranks": size, "cpus": cpus, "dim": args.dim, "us_per_allreduce": cost}))
        return 0
    print(f"all-reduce over {size} ranks on CPUs {cpu.format_cpulist(cpus)}, dim {args.dim} "
          f"(median of {args.repeats} runs of {args.iters}):")
    for t in tokens:
        print(f"  {t:5d} tokens ({t * args.dim * 4 / 1024:8.1f} KiB): {cost[t]:8.2f} us per all-reduce, "
              f"{2 * cost[t]:8.2f} us per layer")
    return 0
