"""Cores, NUMA nodes and cgroup limits -> a thread plan -> OpenMP threads pinned to it.

Everything that asks "which CPUs may we use, and how many threads?" asks this module:

    topo = read_topology()                      # sysfs + affinity mask + cgroup, once
    configure_openmp_env()                      # before the first OpenMP region in the process
    plan = plan_threads(topo, serving=True)     # LITE_LLM_CPU_OMP_THREADS_BIND & co.
    for line in plan.describe() + list(plan.notes): log.info(line)
    ...                                         # later, in the engine thread:
    report = apply_plan(plan)                   # pin, verify with sched_getcpu, bind memory

What lives elsewhere: the feature probe and the pinning primitives are in
lite_llm/_kernels/_cpu.pyx (compiled); environment variables are read through
lite_llm.config.env (LITE_LLM_<name>, else the vLLM alias VLLM_<name>). Only the OpenMP
runtime's own variables (OMP_NUM_THREADS, GOMP_SPINCOUNT, ...) are read and set here
directly, because libgomp reads them from the process environment.

Topology sources, all below a `root` ("/" normally, a fake tree in tests):
    sys/devices/system/cpu/online                    online CPUs ("0-5,8-11")
    sys/devices/system/cpu/cpuN/topology/*           core_id, physical_package_id,
                                                     thread_siblings_list (SMT siblings)
    sys/devices/system/node/nodeN/{cpulist,meminfo}  NUMA nodes (absent: one node 0)
    proc/self/cgroup -> sys/fs/cgroup/...            v2: cpuset.cpus.effective, cpu.max;
                                                     v1: cpuset/cpuset.effective_cpus,
                                                     cpu/cpu.cfs_quota_us + cpu.cfs_period_us
    os.sched_getaffinity(0)                          the process affinity mask (injectable)

Thread plan (LITE_LLM_CPU_OMP_THREADS_BIND, alias VLLM_CPU_OMP_THREADS_BIND):
    auto      one thread per physical core (the lowest allowed SMT sibling) of the NUMA
              node(s) in use: all nodes with allowed CPUs, or LITE_LLM_CPU_VISIBLE_MEMORY_NODES
              ("1,0": those nodes in that order). Allowed = online & affinity & cgroup cpuset.
              Capped at ceil(cgroup quota / period) cores. With several tensor-parallel ranks,
              nodes are dealt to ranks (one node each when the counts match).
              Reservation rule: LITE_LLM_CPU_NUM_OF_RESERVED_CPU cores per rank are kept free
              of compute threads when set; when unset, a server reserves ONE core per rank
              only if the rank has >= 16 cores (RESERVE_MIN_CORES), else none: on small
              machines the engine and HTTP threads sleep while kernels run, so reserving a core
              would idle a large share of the machine (vLLM's auto reserves 1 of 2 cores).
              Offline use (serving=False) reserves nothing unless asked.
    0-31,64-95   exactly these CPUs, in this order (thread i -> i-th CPU; siblings allowed).
    0-31|32-63   one list per tensor-parallel rank.
    nobind    no pinning: OpenMP places its threads; threads = OMP_NUM_THREADS if set, else the
              number of CPUs in the affinity mask (what libgomp itself would start).
A spec naming a CPU outside the allowed set, a malformed range or an empty list raises
ValueError listing the allowed CPUs.

Binding: apply_plan() runs in the thread that will call the kernels (the engine thread:
libgomp keeps one thread pool per calling thread). It pins OpenMP thread i of that pool to
cpus[i] with pthread_setaffinity_np from inside a parallel region (thread 0 is the caller),
then checks that each thread's sched_getcpu() is its planned CPU and warns loudly otherwise.
OMP_PLACES / OMP_PROC_BIND / GOMP_CPU_AFFINITY are not used: libgomp applies them to the
process's initial thread too, and every thread created later (HTTP handlers) would inherit a
one-core mask. Memory: before pinning, the calling thread's NUMA policy is set with libnuma
(loaded with ctypes when present, skipped with a debug log otherwise): "preferred" on the
rank's node (preferred, not strict, so a full node spills instead of OOM-killing), or
interleaved over the rank's nodes when it spans several. The OpenMP workers are created by
that first pinned region, after the policy is set, so they inherit it; pages land where they
are first touched, so load/repack weights in the engine thread after apply_plan. A machine
with one NUMA node (like a small VM) has nothing to bind and skips this step.

OpenMP wait policy (configure_openmp_env, before libgomp initialises, i.e. before the first
parallel region anywhere in the process): GOMP_SPINCOUNT=10000 unless the user set
GOMP_SPINCOUNT or OMP_WAIT_POLICY. Between two parallel regions a libgomp worker spins this
many pause-iterations (about 0.1-0.5 ms) before sleeping on a futex. Decode steps are many
back-to-back regions microseconds apart, so a short spin keeps wake-ups off the critical path;
libgomp's default (300000, several ms) and OMP_WAIT_POLICY=active keep spinning through the
engine's Python work between steps and through idle time, stealing the cores that the engine
and HTTP threads (and, on shared hosts, other processes) need. Measured on the 2-core
development VM, 200 tiny regions + 0.5 ms serial gap per step, median step time (machine
shared and noisy): passive/spin 0: 6.3-8.7 ms; spin 1000-30000: 4.3-6.1 ms; spin 100000:
4.4-5.7 ms; default: 5.8-14.8 ms; active: 6.5-8.0 ms, with outliers of 30-180 ms for long
spins when the cores were oversubscribed. No LD_PRELOAD is needed for any of this.
Inside a step the phases meet at the engine's own barrier (src/omp_util.h: spin
LITE_LLM_BARRIER_SPINS iterations, then sched_yield between checks), not libgomp's, so a
thread whose partner was preempted gives its core back instead of spinning or sleeping.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Iterable, MutableMapping

from lite_llm.config import env

log = logging.getLogger(__name__)

RESERVE_MIN_CORES = 16          # auto reserves a core per rank only from this many cores up
DEFAULT_GOMP_SPINCOUNT = "10000"  # see the module docstring for the measurement


# ----------------------------------------------------------------------------- cpu lists

def parse_cpulist(text: str) -> tuple[int, ...]:
    """Kernel cpulist syntax ("0-3,8,10-11", "" = none) -> sorted unique ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Ids -> compact ranges in the given order ("0-3,8"); "" for none."""
    parts: list[str] = []
    run: list[int] = []
    for cpu in cpus:
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [cpu]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def _parse_spec_list(text: str, what: str) -> tuple[int, ...]:
    """A user's list ("0-31,64-95"): order kept, ranges ascending, no duplicates."""
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"{what}: malformed entry {part.strip()!r} in {text!r} "
                             f"(expected ids and ranges such as 0-31,64-95)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"{what}: descending range {part.strip()!r} in {text!r}")
        out.extend(range(lo, hi + 1))
    dups = sorted({c for c in out if out.count(c) > 1})
    if dups:
        raise ValueError(f"{what}: {format_cpulist(dups)} listed more than once in {text!r}")
    return tuple(out)


# ----------------------------------------------------------------------------- topology

@dataclass(frozen=True)
class Core:
    """One physical core: its online SMT siblings (hardware threads)."""
    cpus: tuple[int, ...]        # sorted, online only
    package_id: int
    core_id: int
    node: int


@dataclass(frozen=True)
class NumaNode:
    node_id: int
    cpus: tuple[int, ...]        # online CPUs of the node, sorted
    mem_total: int               # bytes (0 when unknown)
    mem_free: int                # bytes (0 when unknown)


@dataclass(frozen=True)
class Topology:
    """What this process may run on. `allowed` is what plans draw from."""
    online: tuple[int, ...]
    cores: tuple[Core, ...]               # ordered by first CPU
    nodes: tuple[NumaNode, ...]           # ordered by id
    affinity: tuple[int, ...]             # process affinity mask
    cgroup_cpus: tuple[int, ...] | None   # cgroup cpuset, None when not limited/unknown
    cgroup_quota: float | None            # CPU time limit in cores (quota/period), None: none
    cgroup_source: str = ""               # where the limits came from, for `info`
    model_name: str = ""

    @property
    def allowed(self) -> tuple[int, ...]:
        allowed = set(self.online) & set(self.affinity)
        if self.cgroup_cpus is not None:
            allowed &= set(self.cgroup_cpus)
        return tuple(sorted(allowed))

    @property
    def quota_cores(self) -> int | None:
        """Whole cores the cgroup quota pays for: ceil(quota / period)."""
        return None if self.cgroup_quota is None else max(1, math.ceil(self.cgroup_quota - 1e-9))

    def node_of(self, cpu: int) -> int:
        for node in self.nodes:
            if cpu in node.cpus:
                return node.node_id
        return -1

    def core_of(self, cpu: int) -> Core | None:
        for core in self.cores:
            if cpu in core.cpus:
                return core
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text.strip())
    except ValueError:
        return None


def _meminfo(text: str | None) -> tuple[int, int]:
    """(MemTotal, MemFree) in bytes from a node meminfo or /proc/meminfo."""
    total = free = 0
    for line in (text or "").splitlines():
        m = re.search(r"(MemTotal|MemFree):\s+(\d+)\s*kB", line)
        if m:
            value = int(m.group(2)) * 1024
            total, free = (value, free) if m.group(1) == "MemTotal" else (total, value)
    return total, free


def _cpu_model(root: str) -> str:
    text = _read(os.path.join(root, "proc/cpuinfo")) or ""
    for key in ("model name", "Model", "cpu model", "Processor", "machine"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return ""


def _cgroup_dirs(root: str) -> list[tuple[str, str, str]]:
    """(kind, mount dir, leaf dir) candidates: kind "v2", "v1-cpu" or "v1-cpuset"."""
    base = os.path.join(root, "sys/fs/cgroup")
    entries: list[tuple[str, str]] = []   # (controllers, path)
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append((parts[1], parts[2].strip() or "/"))
    if not entries:  # no /proc/self/cgroup: the root cgroup of whatever is mounted
        entries = [("", "/"), ("cpu", "/"), ("cpuset", "/")]

    def leaf(mount: str, path: str) -> str:
        # Inside a cgroup namespace the path may not exist below the mount: use the mount.
        cand = os.path.normpath(os.path.join(mount, path.lstrip("/")))
        return cand if os.path.isdir(cand) else mount

    out = []
    for controllers, path in entries:
        names = controllers.split(",") if controllers else []
        if not controllers:
            for mount in (base, os.path.join(base, "unified")):
                if os.path.exists(os.path.join(mount, "cgroup.controllers")):
                    out.append(("v2", mount, leaf(mount, path)))
        if "cpu" in names:
            for sub in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                mount = os.path.join(base, sub)
                if os.path.isdir(mount):
                    out.append(("v1-cpu", mount, leaf(mount, path)))
                    break
        if "cpuset" in names:
            mount = os.path.join(base, "cpuset")
            if os.path.isdir(mount):
                out.append(("v1-cpuset", mount, leaf(mount, path)))
    return out


def _walk_up(mount: str, leaf: str) -> Iterable[str]:
    """leaf, its parent, ... up to and including the mount (limits nest)."""
    d = leaf
    while True:
        yield d
        if os.path.normpath(d) == os.path.normpath(mount) or len(d) <= len(mount):
            return
        d = os.path.dirname(d)


def _read_cgroup(root: str) -> tuple[tuple[int, ...] | None, float | None, str]:
    """(cpuset, quota in cores, description) of this process's cgroup, v2 or v1."""
    cpuset: set[int] | None = None
    quota: float | None = None
    sources: list[str] = []
    for kind, mount, leaf in _cgroup_dirs(root):
        rel = "/" + os.path.relpath(leaf, root).replace(os.sep, "/")
        for d in _walk_up(mount, leaf):
            if kind in ("v2", "v1-cpuset"):
                name = "cpuset.cpus.effective" if kind == "v2" else "cpuset.effective_cpus"
                text = _read(os.path.join(d, name))
                if text is None and kind == "v1-cpuset":
                    text = _read(os.path.join(d, "cpuset.cpus"))
                if text is not None and text.strip() and cpuset is None:
                    cpuset = set(parse_cpulist(text))
                    sources.append(f"cpuset {format_cpulist(sorted(cpuset))} ({rel})")
            if kind in ("v2", "v1-cpu"):
                limit = None
                if kind == "v2":
                    fields = (_read(os.path.join(d, "cpu.max")) or "").split()
                    if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
                        limit = int(fields[0]) / int(fields[1])
                else:
                    q = _read_int(os.path.join(d, "cpu.cfs_quota_us"))
                    p = _read_int(os.path.join(d, "cpu.cfs_period_us"))
                    if q is not None and p and q > 0:
                        limit = q / p
                if limit is not None and (quota is None or limit < quota):
                    quota = limit
                    sources.append(f"quota {limit:g} cores ({kind} {rel})")
    return (None if cpuset is None else tuple(sorted(cpuset))), quota, "; ".join(sources)


def read_topology(root: str = "/", affinity: Iterable[int] | None = None) -> Topology:
    """Topology below `root`. affinity=None: os.sched_getaffinity(0) when root is "/",
    else every online CPU (a fake tree has no process of its own)."""
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    online_text = _read(os.path.join(cpu_dir, "online"))
    if online_text is not None:
        online = parse_cpulist(online_text)
    else:  # no sysfs (some sandboxes): whatever the OS lets us count
        online = tuple(range(os.cpu_count() or 1))
    online_set = set(online)

    # NUMA nodes; a kernel without NUMA support has no node directory: one node 0.
    nodes: list[NumaNode] = []
    for path in glob.glob(os.path.join(root, "sys/devices/system/node/node[0-9]*")):
        node_id = int(re.search(r"node(\d+)$", path).group(1))
        cpus = tuple(c for c in parse_cpulist(_read(os.path.join(path, "cpulist")) or "")
                     if c in online_set)
        total, free = _meminfo(_read(os.path.join(path, "meminfo")))
        nodes.append(NumaNode(node_id, cpus, total, free))
    nodes.sort(key=lambda n: n.node_id)
    if not nodes:
        total, free = _meminfo(_read(os.path.join(root, "proc/meminfo")))
        nodes = [NumaNode(0, online, total, free)]
    node_of = {c: n.node_id for n in nodes for c in n.cpus}

    # Physical cores: a core is its set of online SMT siblings.
    cores: dict[tuple[int, ...], Core] = {}
    for cpu in online:
        topo = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
        siblings_text = _read(os.path.join(topo, "thread_siblings_list"))
        siblings = tuple(c for c in parse_cpulist(siblings_text) if c in online_set) \
            if siblings_text else (cpu,)
        if cpu not in siblings:
            siblings = (cpu,)
        if siblings not in cores:
            package = _read_int(os.path.join(topo, "physical_package_id"))
            core_id = _read_int(os.path.join(topo, "core_id"))
            cores[siblings] = Core(siblings, package if package is not None else 0,
                                   core_id if core_id is not None else cpu, node_of.get(cpu, 0))

    if affinity is None:
        affinity = os.sched_getaffinity(0) if os.path.abspath(root) == "/" else online
    cgroup_cpus, quota, source = _read_cgroup(root)
    return Topology(online=online, cores=tuple(sorted(cores.values(), key=lambda c: c.cpus[0])),
                    nodes=tuple(nodes), affinity=tuple(sorted(affinity)),
                    cgroup_cpus=cgroup_cpus, cgroup_quota=quota, cgroup_source=source,
                    model_name=_cpu_model(root))


# ----------------------------------------------------------------------------- thread plan

@dataclass(frozen=True)
class RankPlan:
    """The CPUs of one tensor-parallel rank: OpenMP thread i runs on cpus[i]."""
    cpus: tuple[int, ...]            # compute CPUs (nobind: the CPUs OpenMP may use)
    node: int | None                 # memory node; None: spans several nodes, or nobind
    num_threads: int                 # OpenMP team size for every kernel call of this rank
    reserved: tuple[int, ...] = ()   # CPUs kept free of compute for the engine/HTTP threads
    memory_nodes: tuple[int, ...] = ()  # nodes whose memory this rank uses (in order)


@dataclass(frozen=True)
class ThreadPlan:
    mode: str                        # "auto" | "list" | "nobind"
    ranks: tuple[RankPlan, ...]
    notes: tuple[str, ...] = ()      # why the plan looks like this (caps, ignored settings)
    machine_nodes: tuple[int, ...] = ()  # every NUMA node of the machine

    @property
    def num_threads(self) -> int:
        """Team size of rank 0: what the engine passes to every kernel call."""
        return self.ranks[0].num_threads

    def describe(self) -> list[str]:
        """One line per rank: cores, node, threads, reserved."""
        lines = []
        for i, r in enumerate(self.ranks):
            if self.mode == "nobind":
                lines.append(f"rank {i}: {_count(r.num_threads, 'thread')}, not bound (OpenMP "
                             f"places them on {_count(len(r.cpus), 'CPU', False)} "
                             f"{format_cpulist(r.cpus)})")
                continue
            node = f"node {r.node}" if r.node is not None else \
                f"nodes {','.join(map(str, r.memory_nodes))}"
            reserved = format_cpulist(r.reserved) if r.reserved else "none"
            lines.append(f"rank {i}: {_count(r.num_threads, 'thread')} on "
                         f"{_count(len(r.cpus), 'CPU', False)} {format_cpulist(r.cpus)} "
                         f"({node}), reserved: {reserved}")
        return lines


def _count(n: int, noun: str, with_number: bool = True) -> str:
    word = noun if n == 1 else noun + "s"
    return f"{n} {word}" if with_number else word


def _omp_num_threads(value: str | None) -> int | None:
    """First entry of OMP_NUM_THREADS ("8" or nested "8,2"), None when unset or invalid."""
    try:
        n = int((value or "").split(",")[0])
    except ValueError:
        return None
    return n if n > 0 else None


def _invalid(what: str, detail: str, topo: Topology) -> ValueError:
    why = "online"
    if set(topo.affinity) != set(topo.online):
        why += " & affinity mask"
    if topo.cgroup_cpus is not None:
        why += " & cgroup cpuset"
    return ValueError(f"{what}: {detail}; allowed CPUs: {format_cpulist(topo.allowed)} ({why})")


def _split(seq: list, parts: int) -> list[list]:
    """Contiguous, as even as possible, earlier parts larger."""
    size, extra = divmod(len(seq), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(seq[start:end])
        start = end
    return out


def _rank(topo: Topology, cpus: list[int], reserved: list[int]) -> RankPlan:
    nodes = list(dict.fromkeys(topo.node_of(c) for c in cpus + reserved))
    return RankPlan(cpus=tuple(cpus), node=nodes[0] if len(nodes) == 1 else None,
                    num_threads=len(cpus), reserved=tuple(reserved), memory_nodes=tuple(nodes))


def _plan_auto(topo: Topology, reserved: int | None, visible_nodes: str | None,
               serving: bool, world_size: int) -> tuple[list[RankPlan], list[str]]:
    notes: list[str] = []
    allowed = set(topo.allowed)
    by_id = {n.node_id: n for n in topo.nodes}
    if visible_nodes:
        order = list(_parse_spec_list(visible_nodes, "CPU_VISIBLE_MEMORY_NODES"))
        unknown = [n for n in order if n not in by_id]
        if unknown:
            raise ValueError(f"CPU_VISIBLE_MEMORY_NODES={visible_nodes!r}: no node "
                             f"{format_cpulist(unknown)}; nodes: {format_cpulist(sorted(by_id))}")
        empty = [n for n in order if not allowed & set(by_id[n].cpus)]
        if empty:
            raise _invalid(f"CPU_VISIBLE_MEMORY_NODES={visible_nodes!r}",
                           f"node {format_cpulist(empty)} has no CPU this process may use", topo)
    else:
        order = [n.node_id for n in topo.nodes if allowed & set(n.cpus)]
    if not order:
        raise _invalid("CPU_OMP_THREADS_BIND=auto", "no usable CPU", topo)

    # One CPU per physical core: the lowest allowed sibling.
    per_node: list[list[int]] = []
    num_smt = 0
    for node_id in order:
        picked = []
        for core in topo.cores:
            usable = [c for c in core.cpus if c in allowed and topo.node_of(c) == node_id]
            if usable:
                picked.append(usable[0])
                num_smt += len(usable) - 1
        per_node.append(picked)
    if num_smt:
        notes.append(f"{num_smt} SMT sibling(s) left idle: one thread per physical core")

    # Deal nodes (or slices of nodes) to ranks.
    if world_size <= len(per_node) and len(per_node) % world_size == 0:
        step = len(per_node) // world_size
        groups = [sum(per_node[i * step:(i + 1) * step], []) for i in range(world_size)]
    elif world_size % len(per_node) == 0:
        groups = [g for cpus in per_node for g in _split(cpus, world_size // len(per_node))]
    else:
        groups = _split(sum(per_node, []), world_size)
    if any(not g for g in groups):
        raise _invalid("CPU_OMP_THREADS_BIND=auto",
                       f"{world_size} ranks need at least {world_size} physical cores", topo)

    quota = topo.quota_cores
    total = sum(len(g) for g in groups)
    if quota is not None and quota < total:
        shares = [len(s) for s in _split(list(range(max(quota, world_size))), world_size)]
        groups = [g[:share] for g, share in zip(groups, shares)]
        notes.append(f"cgroup CPU quota {topo.cgroup_quota:g} cores: {sum(shares)} of "
                     f"{total} cores used")

    ranks = []
    for i, cores in enumerate(groups):
        if reserved is not None:
            r = reserved
        else:
            r = 1 if serving and len(cores) >= RESERVE_MIN_CORES else 0
        if r >= len(cores):
            raise _invalid(f"CPU_NUM_OF_RESERVED_CPU={r}",
                           f"rank {i} has {len(cores)} core(s): reserving {r} leaves none to "
                           f"compute", topo)
        ranks.append(_rank(topo, cores[:len(cores) - r], cores[len(cores) - r:]))
    for i, r in enumerate(ranks):
        if r.node is None:
            notes.append(f"rank {i} spans NUMA nodes {','.join(map(str, r.memory_nodes))}: memory "
                         f"interleaved; one rank per node (tensor parallel) or "
                         f"CPU_VISIBLE_MEMORY_NODES keeps memory local")
    if reserved is None and serving and not any(r.reserved for r in ranks):
        notes.append(f"no core reserved: fewer than {RESERVE_MIN_CORES} cores per rank, every "
                     f"core computes (set CPU_NUM_OF_RESERVED_CPU to reserve)")
    return ranks, notes


def plan_threads(topology: Topology, bind: str | None = None, reserved: int | None = None,
                 visible_nodes: str | None = None, serving: bool = False,
                 world_size: int | None = None, omp_num_threads: str | None = None) -> ThreadPlan:
    """The thread plan for `topology`. None arguments come from the environment:
    bind <- CPU_OMP_THREADS_BIND ("auto"), reserved <- CPU_NUM_OF_RESERVED_CPU (unset: the
    auto rule), visible_nodes <- CPU_VISIBLE_MEMORY_NODES, omp_num_threads <- OMP_NUM_THREADS.
    world_size (tensor-parallel ranks): None = as many as the bind spec lists (auto: 1)."""
    if bind is None:
        bind = env("CPU_OMP_THREADS_BIND", "auto")
    if reserved is None:
        text = env("CPU_NUM_OF_RESERVED_CPU")
        if text is not None:
            try:
                reserved = int(text)
            except ValueError:
                raise ValueError(f"CPU_NUM_OF_RESERVED_CPU={text!r}: not a whole number") from None
    if reserved is not None and reserved < 0:
        raise ValueError(f"CPU_NUM_OF_RESERVED_CPU={reserved}: must be >= 0")
    if visible_nodes is None:
        visible_nodes = env("CPU_VISIBLE_MEMORY_NODES")
    if omp_num_threads is None:
        omp_num_threads = os.environ.get("OMP_NUM_THREADS")
    if world_size is not None and world_size < 1:
        raise ValueError(f"world_size={world_size}: must be >= 1")
    bind = bind.strip()
    notes: list[str] = []
    nodes = tuple(n.node_id for n in topology.nodes)

    if bind == "nobind":
        n = _omp_num_threads(omp_num_threads)
        size = world_size or 1
        if n is None:  # what libgomp starts: one per CPU of the mask (cpuset included)
            n = max(1, len(topology.allowed) // size)
            notes.append(f"OMP_NUM_THREADS unset: {n} threads (CPUs this process may use)")
        quota = topology.quota_cores
        if quota is not None and n * size > quota:
            notes.append(f"{n * size} threads but the cgroup CPU quota pays for {quota} cores: "
                         f"expect throttling")
        rank = RankPlan(cpus=topology.allowed, node=None, num_threads=n)
        return ThreadPlan("nobind", (rank,) * size, tuple(notes), nodes)

    if bind == "auto":
        ranks, notes = _plan_auto(topology, reserved, visible_nodes, serving, world_size or 1)
        return ThreadPlan("auto", tuple(ranks), tuple(notes), nodes)

    specs = bind.split("|")
    if world_size is not None and world_size != len(specs):
        raise ValueError(f"CPU_OMP_THREADS_BIND={bind!r} lists {len(specs)} rank(s) but "
                         f"tensor parallelism uses {world_size}")
    allowed = set(topology.allowed)
    ranks, seen = [], set()
    for i, spec in enumerate(specs):
        if not spec.strip():
            raise _invalid(f"CPU_OMP_THREADS_BIND={bind!r}", f"rank {i} has an empty CPU list",
                           topology)
        try:
            cpus = _parse_spec_list(spec, f"CPU_OMP_THREADS_BIND={bind!r}")
        except ValueError as e:
            raise ValueError(f"{e}; allowed CPUs: {format_cpulist(topology.allowed)}") from None
        bad = [c for c in cpus if c not in allowed]
        if bad:
            raise _invalid(f"CPU_OMP_THREADS_BIND={bind!r}",
                           f"CPU {format_cpulist(bad)} not available to this process", topology)
        shared = [c for c in cpus if c in seen]
        if shared:
            raise _invalid(f"CPU_OMP_THREADS_BIND={bind!r}",
                           f"CPU {format_cpulist(shared)} in more than one rank", topology)
        seen.update(cpus)
        cores = [topology.core_of(c) for c in cpus]
        doubled = {c.cpus for c in cores if c is not None and cores.count(c) > 1}
        if doubled:
            notes.append(f"rank {i}: SMT siblings {', '.join(format_cpulist(d) for d in sorted(doubled))}"
                         f" share a physical core")
        ranks.append(_rank(topology, list(cpus), []))
    if reserved:
        notes.append(f"CPU_NUM_OF_RESERVED_CPU={reserved} ignored: the explicit list decides")
    quota = topology.quota_cores
    total = sum(r.num_threads for r in ranks)
    if quota is not None and total > quota:
        notes.append(f"{total} threads but the cgroup CPU quota pays for {quota} cores: "
                     f"expect throttling")
    return ThreadPlan("list", tuple(ranks), tuple(notes), nodes)


# ----------------------------------------------------------------------------- OpenMP env

def configure_openmp_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the OpenMP wait policy we chose (module docstring) unless the user chose one.
    Must run before the first parallel region in the process: libgomp reads its
    environment once, when it initialises. Returns what it set."""
    environ = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return {}
    environ["GOMP_SPINCOUNT"] = DEFAULT_GOMP_SPINCOUNT
    return {"GOMP_SPINCOUNT": DEFAULT_GOMP_SPINCOUNT}


_PINNING_VARS = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")


# ----------------------------------------------------------------------------- binding

def cpu_probe() -> ModuleType:
    """lite_llm._kernels._cpu (feature probe, pinning), even when importing the kernels
    package fails because no kernel variant is built or runnable: it is built on its own
    with baseline flags and must stay usable to explain exactly that."""
    name = "lite_llm._kernels._cpu"
    if name in sys.modules:
        return sys.modules[name]
    if "lite_llm._kernels" in sys.modules:
        return importlib.import_module(name)
    # Not through the package: its import picks and loads a kernel variant (and numpy),
    # which binding does not need.
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernels")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_cpu" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            return module
    raise ImportError(f"{name} is not built (expected {here}/_cpu{importlib.machinery.EXTENSION_SUFFIXES[0]})")


@dataclass(frozen=True)
class BindReport:
    mode: str
    planned: tuple[int, ...]         # CPU of OpenMP thread i
    pinned: tuple[int, ...]          # sched_getcpu right after pinning (-1 failed, -2 no thread)
    observed: tuple[int, ...]        # sched_getcpu of thread i in a later region
    memory: str                      # what was done about NUMA memory placement
    ok: bool
    messages: tuple[str, ...] = field(default=())

    def describe(self) -> list[str]:
        if self.mode == "nobind":
            return [f"binding: none (nobind); {self.memory}", *self.messages]
        head = (f"binding: {_count(len(self.planned), 'thread')} pinned and verified, thread i "
                f"on the i-th of CPUs {format_cpulist(self.planned)}" if self.ok else
                f"binding FAILED: planned {list(self.planned)}, observed {list(self.observed)}")
        return [head, f"memory: {self.memory}", *self.messages]


def _bind_memory(nodes: tuple[int, ...], machine_nodes: tuple[int, ...]) -> str:
    """Set the calling thread's NUMA memory policy through libnuma, when it helps and exists."""
    if len(machine_nodes) <= 1:
        return "single NUMA node: nothing to bind"
    if not nodes:
        return "no memory node planned"
    name = ctypes.util.find_library("numa")
    try:
        lib = ctypes.CDLL(name or "libnuma.so.1")
    except OSError:
        log.debug("libnuma not found: memory placement left to first touch")
        return "libnuma not found: first-touch placement"
    if lib.numa_available() < 0:
        log.debug("numa_available() < 0: memory placement left to first touch")
        return "NUMA not available to this process: first-touch placement"
    if len(nodes) == 1:
        lib.numa_set_preferred(ctypes.c_int(nodes[0]))
        return f"preferred node {nodes[0]} (libnuma)"
    lib.numa_parse_nodestring.restype = ctypes.c_void_p
    mask = lib.numa_parse_nodestring(",".join(map(str, nodes)).encode())
    if not mask:
        return f"libnuma rejected nodes {nodes}: first-touch placement"
    lib.numa_set_interleave_mask(ctypes.c_void_p(mask))
    lib.numa_bitmask_free(ctypes.c_void_p(mask))
    return f"interleaved over nodes {','.join(map(str, nodes))} (libnuma)"


def apply_plan(plan: ThreadPlan, rank: int = 0) -> BindReport:
    """Pin the OpenMP pool of the CALLING thread (the engine thread) to plan.ranks[rank] and
    verify it; a failure is logged as a warning and reported, never raised (the engine still
    runs, just slower)."""
    _cpu = cpu_probe()
    r = plan.ranks[rank]
    if plan.mode == "nobind":
        return BindReport("nobind", (), (), (), "left to the OS (nobind)", True,
                          (f"OpenMP starts up to {r.num_threads} threads and places them itself",))
    messages = []
    if threading.current_thread() is threading.main_thread():
        messages.append(f"binding from the main thread pins it to CPU {r.cpus[0]}: threads it "
                        f"creates later inherit that one CPU (bind from the engine thread)")
    user_pinning = [v for v in _PINNING_VARS if v in os.environ]
    if user_pinning:
        messages.append(f"{', '.join(user_pinning)} set: libgomp also pins the initial thread")
    memory = _bind_memory(r.memory_nodes, plan.machine_nodes)
    pinned = tuple(_cpu.bind_threads(list(r.cpus)))
    observed = tuple(_cpu.thread_cpus(r.num_threads))
    wrong = [(i, want, got) for i, (want, got) in enumerate(zip(r.cpus, observed)) if want != got]
    for i, want, got in wrong:
        what = {-1: "pinning was refused", -2: "the thread never ran"}.get(pinned[i], "")
        messages.append(f"thread {i} planned on CPU {want} runs on CPU {got}"
                        + (f" ({what})" if what else ""))
    report = BindReport(plan.mode, r.cpus, pinned, observed, memory, not wrong, tuple(messages))
    if wrong:
        log.warning("THREAD BINDING FAILED: %s", " | ".join(report.describe()))
    else:
        log.info("%s", "; ".join(report.describe()))
    return report


def nodes_memory(topology: Topology) -> list[tuple[int, int, int]]:
    """(node id, total bytes, free bytes) per NUMA node."""
    return [(n.node_id, n.mem_total, n.mem_free) for n in topology.nodes]


def default_plan(serving: bool = False, world_size: int | None = None,
                 root: str = "/") -> tuple[Topology, ThreadPlan]:
    """Topology of this machine and the plan the environment asks for."""
    topo = read_topology(root)
    return topo, plan_threads(topo, serving=serving, world_size=world_size)
