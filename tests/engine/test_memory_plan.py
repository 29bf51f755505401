"""engine/memory.py: the memory this machine's cgroup allows, read from a fake /proc and /sys tree
(cgroup v2 and v1, limited and not)."""
from __future__ import annotations

from lite_llm.engine.memory import GiB, _cgroup_memory, machine_memory


def _tree(tmp_path, cgroup_line: str, files: dict[str, str]):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup_line + "\n")
    for rel, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return str(tmp_path)


def test_cgroup_v2_limit_and_usage(tmp_path):
    root = _tree(tmp_path, "0::/app.slice", {"app.slice/memory.max": str(3 * GiB),
                                             "app.slice/memory.current": str(GiB)})
    assert _cgroup_memory(root) == (3 * GiB, GiB)
    mem = machine_memory(root)
    assert mem.cgroup_limit == 3 * GiB and mem.total <= 3 * GiB and mem.available <= 2 * GiB


def test_cgroup_v2_without_a_limit(tmp_path):
    root = _tree(tmp_path, "0::/", {"memory.max": "max", "memory.current": "12345"})
    assert _cgroup_memory(root) == (None, 12345)
    assert machine_memory(root).cgroup_limit is None


def test_cgroup_v1_limit_and_its_no_limit(tmp_path):
    root = _tree(tmp_path / "a", "4:memory:/job", {"memory/job/memory.limit_in_bytes": str(GiB),
                                                   "memory/job/memory.usage_in_bytes": str(GiB // 4)})
    assert _cgroup_memory(root) == (GiB, GiB // 4)
    root = _tree(tmp_path / "b", "4:memory:/", {"memory/memory.limit_in_bytes": str(2**63 - 4096),
                                                "memory/memory.usage_in_bytes": "1"})
    assert _cgroup_memory(root) == (None, 1)
