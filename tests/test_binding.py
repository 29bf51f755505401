"""Real binding on this machine: OpenMP workers run where the plan says, seen from outside
(/proc/self/task/<tid>/stat, field 39 = the CPU a thread last ran on) while they spin.

Each case runs in its own interpreter: binding and libgomp's environment are per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lite_llm import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the child: an engine thread applies the plan and spins its pool; the main thread
# samples where every thread of the process runs meanwhile.
CHILD = r"""
import json, os, sys, threading, time
from lite_llm import cpu

def stat(tid):
    text = open(f"/proc/self/task/{tid}/stat").read()
    fields = text[text.rindex(")") + 2:].split()   # fields 3.. (comm may hold spaces)
    return fields[0], int(fields[39 - 3])          # state, processor

def allowed(tid):
    for line in open(f"/proc/self/task/{tid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]

cpu.configure_openmp_env()
plan = cpu.plan_threads(cpu.read_topology(), bind=sys.argv[1])
probe = cpu.cpu_probe()
out, bound = {}, threading.Event()

def engine():
    out["engine_tid"] = threading.get_native_id()
    report = cpu.apply_plan(plan)
    out["report"] = {"ok": report.ok, "planned": report.planned, "observed": report.observed,
                     "lines": report.describe()}
    team = plan.num_threads if plan.mode != "nobind" else 0
    out["team_tids"] = probe.thread_ids(team) if team else []
    bound.set()
    out["spin"] = probe.spin(team, 1.0)        # team 0: OpenMP's default team

t = threading.Thread(target=engine)
t.start()
bound.wait()
samples = []
time.sleep(0.1)
for _ in range(8):
    samples.append({tid: stat(tid) for tid in map(int, os.listdir("/proc/self/task"))})
    time.sleep(0.05)
out["samples"] = samples
out["main_allowed"] = allowed(threading.get_native_id())
out["engine_allowed"] = allowed(out["engine_tid"])
out["main_tid"] = threading.get_native_id()
out["num_threads"] = plan.num_threads
t.join()
print(json.dumps(out))
"""


def _run(bind: str, **env: str) -> dict:
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")}
    child_env.update(env, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", CHILD, bind], env=child_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _where_team_ran(out: dict) -> list[set[int]]:
    """For OpenMP thread i: the set of CPUs it was seen on over all samples."""
    return [{s[str(tid)][1] for s in out["samples"]} for tid in out["team_tids"]]


ALL = cpu.format_cpulist(cpu.read_topology().allowed)


@pytest.mark.parametrize("bind,cpus", [("0", [0]), ("1", [1]), ("0-1", [0, 1]), ("1,0", [1, 0])])
def test_every_planned_thread_runs_on_its_own_cpu(bind, cpus):
    out = _run(bind)
    assert out["report"]["ok"], out["report"]["lines"]
    assert out["report"]["observed"] == cpus
    assert len(out["team_tids"]) == len(cpus) == len(set(out["team_tids"]))
    assert out["team_tids"][0] == out["engine_tid"]      # thread 0 is the engine thread itself
    assert _where_team_ran(out) == [{c} for c in cpus]   # every sample, every worker
    assert [c for _, c in out["spin"]] == cpus
    assert out["engine_allowed"] == str(cpus[0])
    # the main (HTTP) thread keeps the whole machine; libgomp made no threads beyond the team
    assert out["main_allowed"] == ALL
    assert set(map(int, out["samples"][-1])) == {out["main_tid"], *out["team_tids"]}


def test_nobind_with_omp_num_threads_1_starts_one_worker():
    out = _run("nobind", OMP_NUM_THREADS="1")
    assert out["num_threads"] == 1 and out["team_tids"] == []
    assert len(out["spin"]) == 1 and out["spin"][0][0] == out["engine_tid"]
    # no OpenMP worker thread exists: only the main and the engine thread
    assert set(map(int, out["samples"][-1])) == {out["main_tid"], out["engine_tid"]}
    assert out["engine_allowed"] == ALL == out["main_allowed"]


def test_failed_pinning_is_reported_not_hidden(tmp_path):
    # A plan made for another machine: CPU 4000 does not exist here, so pinning is refused.
    code = ("import json, threading; from lite_llm import cpu\n"
            "plan = cpu.ThreadPlan('list', (cpu.RankPlan((0, 4000), 0, 2),))\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append(cpu.apply_plan(plan))); t.start(); t.join()\n"
            "r = out[0]; print(json.dumps({'ok': r.ok, 'pinned': r.pinned, 'lines': r.describe()}))\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT},
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["ok"] and out["pinned"][1] == -1
    assert out["lines"][0].startswith("binding FAILED")
    assert "thread 1 planned on CPU 4000" in " ".join(out["lines"])
    assert "THREAD BINDING FAILED" in proc.stderr        # the loud warning
