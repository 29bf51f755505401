"""The grouped LoRA shrink / expand phases (lite_llm/_kernels/lora.pxi) against NumPy
(ref_ops.lora): rows of several adapters, rows without one, ranks below the slot size, in
every kernel variant this machine runs."""
import numpy as np
import pytest

import ref_ops
from lite_llm import _kernels
from lite_llm.config import KernelConfig  # noqa: F401  (the config type LoraWeights reads)


class _Cfg:
    """The fields of a KernelConfig LoraWeights reads."""
    def __init__(self, dim=48, ffn_dim=80, num_heads=4, num_kv_heads=2, head_dim=12, num_layers=2):
        self.dim, self.ffn_dim, self.num_heads, self.num_kv_heads = dim, ffn_dim, num_heads, num_kv_heads
        self.head_dim, self.num_layers, self.num_experts, self.gated_mlp = head_dim, num_layers, 0, True


GROUP_TARGETS = {0: ("q", "k", "v"), 1: ("o",), 2: ("gate", "up"), 3: ("down",)}


# few rows per adapter (decode: rank rows split across threads) and many (prefill: rows split,
# two at a time, an odd count left over)
SLOTS = {"few": [2, -1, 0, 0, 1, -1, 2, 0, 1, 1, -1],
         "many": np.random.default_rng(7).integers(-1, 3, 61).tolist()}


@pytest.mark.parametrize("variant", _kernels.available())
@pytest.mark.parametrize("group", [0, 1, 2, 3])
@pytest.mark.parametrize("rows", sorted(SLOTS))
@pytest.mark.parametrize("threads", [2, 3])
def test_grouped_lora_matches_numpy(variant, group, rows, threads, rng):
    k = _kernels.load(variant)
    cfg = _Cfg()
    E, F, HD, KD = cfg.dim, cfg.ffn_dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {"q": (HD, E), "k": (KD, E), "v": (KD, E), "o": (E, HD), "gate": (F, E), "up": (F, E), "down": (E, F)}
    lw = k.LoraWeights(cfg, 3, 8)
    ranks = {0: 8, 1: 3, 2: 5}        # slot -> rank: below the slot size too (odd, not a multiple of 4)
    adapters = {}
    for slot, r in ranks.items():
        for target in GROUP_TARGETS[group]:
            if slot == 2 and target in ("k", "up"):   # a slot that leaves some targets alone
                continue
            n, kk = shapes[target]
            a = rng.standard_normal((r, kk)).astype(np.float32)
            b = rng.standard_normal((n, r)).astype(np.float32)
            scale = 0.5 + slot
            adapters[slot, target] = (a, b, scale)
            lw.set_target(slot, 1, target, a, np.ascontiguousarray((b * scale).T))
    kk = shapes[GROUP_TARGETS[group][0]][1]
    widths = [shapes[t][0] for t in GROUP_TARGETS[group]]
    slots = np.array(SLOTS[rows], np.int32)
    x = rng.standard_normal((len(slots), kk)).astype(np.float32)
    out0 = rng.standard_normal((len(slots), sum(widths))).astype(np.float32)
    out = out0.copy()
    k.lora_apply(lw, 1, group, x, slots, out, threads)
    want = out0.astype(np.float64)
    for t, slot in enumerate(slots):
        col = 0
        for target, w in zip(GROUP_TARGETS[group], widths):
            if (slot, target) in adapters:
                a, b, scale = adapters[slot, target]
                want[t, col:col + w] += ref_ops.lora(x[t:t + 1], a, b, scale)[0]
            col += w
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    assert not np.array_equal(out, out0)
    # layer 0 holds no adapter: nothing changes
    out2 = out0.copy()
    k.lora_apply(lw, 0, group, x, slots, out2, threads)
    np.testing.assert_array_equal(out2, out0)


def test_lora_weights_refuse_bad_shapes():
    lw = _kernels.kernels.LoraWeights(_Cfg(), 2, 4)
    with pytest.raises(ValueError, match="r <= 4"):
        lw.set_target(0, 0, "q", np.zeros((5, 48), np.float32), np.zeros((5, 48), np.float32))
    with pytest.raises(ValueError, match="LoRA target 'lm_head'"):
        lw.set_target(0, 0, "lm_head", np.zeros((2, 48), np.float32), np.zeros((2, 48), np.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        _kernels.kernels.LoraWeights(_Cfg(ffn_dim=72), 2, 4)
