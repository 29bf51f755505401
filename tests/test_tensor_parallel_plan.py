"""Tensor-parallel rank plans on fake machines (2 and 4 NUMA nodes), and bind specs whose rank
count differs from tensor_parallel_size: refused at start-up with the fix in the message."""
from __future__ import annotations

import pytest

from lite_llm import cpu
from lite_llm.llm import plan_ranks
from tests.fixtures.sysfs import epyc_2s, quad_node_32c


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("CPU_OMP_THREADS_BIND", "CPU_NUM_OF_RESERVED_CPU", "CPU_VISIBLE_MEMORY_NODES"):
        monkeypatch.delenv(f"LITE_LLM_{name}", raising=False)
        monkeypatch.delenv(f"VLLM_{name}", raising=False)


@pytest.fixture(scope="module")
def epyc(tmp_path_factory):
    return cpu.read_topology(str(epyc_2s(tmp_path_factory.mktemp("epyc"))))


@pytest.fixture(scope="module")
def quad(tmp_path_factory):
    return cpu.read_topology(str(quad_node_32c(tmp_path_factory.mktemp("quad"))), affinity=range(32))


def test_two_nodes_auto_gives_one_rank_per_node(epyc):
    plan = plan_ranks(2, serving=False, topology=epyc)
    assert [r.node for r in plan.ranks] == [0, 1]
    assert [r.cpus for r in plan.ranks] == [tuple(range(96)), tuple(range(96, 192))]
    assert plan.describe()[1] == "rank 1: 96 threads on CPUs 96-191 (node 1), reserved: none"


def test_four_nodes_auto(quad):
    assert [n.node_id for n in quad.nodes] == [0, 1, 2, 3]
    plan = plan_ranks(4, serving=False, topology=quad)
    assert [r.cpus for r in plan.ranks] == [tuple(range(8 * n, 8 * n + 8)) for n in range(4)]
    assert [r.memory_nodes for r in plan.ranks] == [(0,), (1,), (2,), (3,)]
    plan = plan_ranks(2, serving=False, topology=quad)         # two nodes per rank
    assert [r.cpus for r in plan.ranks] == [tuple(range(16)), tuple(range(16, 32))]
    assert [r.memory_nodes for r in plan.ranks] == [(0, 1), (2, 3)]
    plan = plan_ranks(8, serving=False, topology=quad)         # two ranks per node
    assert [r.cpus for r in plan.ranks][:2] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [r.node for r in plan.ranks] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_four_nodes_from_lists(quad, monkeypatch):
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "0-7|8-15|16-23|24-31")
    plan = plan_ranks(4, serving=False, topology=quad)
    assert [r.node for r in plan.ranks] == [0, 1, 2, 3]


@pytest.mark.parametrize("bind,size,fix", [
    ("0-7|8-15", 1, "pass --tensor-parallel-size 2"),       # the silent half-machine of issue 12
    ("0-7|8-15|16-23|24-31", 2, "pass --tensor-parallel-size 4"),
    ("0-15", 2, "list 2 CPU lists separated by '|'"),
    ("0-7|8-15", 4, "list 4 CPU lists"),
])
def test_rank_count_mismatch_is_refused_with_the_fix(quad, monkeypatch, bind, size, fix):
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", bind)
    with pytest.raises(ValueError, match="plans .* rank.* but tensor_parallel_size is") as e:
        plan_ranks(size, serving=False, topology=quad)
    assert fix in str(e.value)


def test_vllm_alias_is_checked_too(quad, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-7|8-15")
    with pytest.raises(ValueError, match="tensor-parallel-size 2"):
        plan_ranks(1, serving=False, topology=quad)


def test_bad_size(quad):
    with pytest.raises(ValueError, match="tensor_parallel_size=0"):
        plan_ranks(0, serving=False, topology=quad)


def test_allreduce_timeout_setting(monkeypatch):
    from lite_llm.engine import tp
    monkeypatch.delenv("LITE_LLM_TP_TIMEOUT", raising=False)
    assert tp.allreduce_timeout() == 60.0
    monkeypatch.setenv("LITE_LLM_TP_TIMEOUT", "2.5")
    assert tp.allreduce_timeout() == 2.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv("LITE_LLM_TP_TIMEOUT", bad)
        with pytest.raises(ValueError, match="LITE_LLM_TP_TIMEOUT"):
            tp.allreduce_timeout()
