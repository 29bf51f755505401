"""src/kernels/iq_grids.h, the codebooks of ggml's IQ1/IQ2/IQ3 types, is generated from the
gguf package's tables (its quants module holds each grid packed in 2 or 3 bits a value): this
file writes it (python tests/kernels/test_iq_grids.py) and its test holds the header to them."""
from __future__ import annotations

from pathlib import Path

import gguf.quants as q
import numpy as np

HEADER = Path(__file__).resolve().parents[2] / "src" / "kernels" / "iq_grids.h"
# C name, gguf class, C element type: each grid row is one group of 8 (IQ2, IQ1) or 4 (IQ3) values
GRIDS = (("ll_iq2xxs_grid", q.IQ2_XXS, "uint8_t"), ("ll_iq2xs_grid", q.IQ2_XS, "uint8_t"),
         ("ll_iq2s_grid", q.IQ2_S, "uint8_t"), ("ll_iq3xxs_grid", q.IQ3_XXS, "uint8_t"),
         ("ll_iq3s_grid", q.IQ3_S, "uint8_t"), ("ll_iq1s_grid", q.IQ1_S, "int8_t"))


def _rows(values: np.ndarray, per_line: int) -> list[str]:
    items = [f"{{{', '.join(str(int(v)) for v in row)}}}" for row in values]
    return ["    " + ", ".join(items[i:i + per_line]) + "," for i in range(0, len(items), per_line)]


def _table_lines(name: str, values: list[int], doc: str, ctype: str, per_line: int, fmt: str = "{}") -> list[str]:
    return ([f"/* {doc} */", f"static const {ctype} {name}[{len(values)}] __attribute__((aligned(64))) = {{"]
            + ["    " + ", ".join(fmt.format(v) for v in values[i:i + per_line]) + ","
               for i in range(0, len(values), per_line)] + ["};"])


def _code_lines(name: str, codes: list[int], doc: str) -> list[str]:
    return _table_lines(name, codes, doc, "uint16_t", 12, "0x{:04x}")


def _byte_lines(name: str, values: list[int], doc: str, ctype: str = "uint8_t") -> list[str]:
    return _table_lines(name, values, doc, ctype, 16)


def _code_tables() -> list[str]:
    """IQ2_XXS's and IQ3_XXS's grid rows as 16-bit codes of their levels (the vector kernels look
    them up in registers, vec.h's ll_i32_lut256_u16): 2 bits a value for IQ2_XXS; a nibble a value,
    in the order 0, 2, 1, 3, for IQ3_XXS (ll_i8_expand2 / ll_i8_expand4 undo them). The same codes
    as two byte tables (low bytes, then high bytes) and the levels repeated through 64 entries,
    for byte-table lookups (vec.h's ll_i8_lut256, ll_i8_lut64)."""
    grids = {}
    for cls in (q.IQ2_XXS, q.IQ3_XXS):
        cls.init_grid()
        grids[cls] = np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int64)
    l2 = sorted(set(grids[q.IQ2_XXS].ravel().tolist()))
    l3 = sorted(set(grids[q.IQ3_XXS].ravel().tolist()))
    c2 = [sum(l2.index(v) << (2 * i) for i, v in enumerate(row)) for row in grids[q.IQ2_XXS].tolist()]
    c3 = [sum(l3.index(v) << (4 * n) for v, n in zip(row, (0, 2, 1, 3))) for row in grids[q.IQ3_XXS].tolist()]
    lut2 = [0] * 16
    for k, v in enumerate(l2):
        lut2[k] = lut2[4 * k] = v
    return (_code_lines("ll_iq2xxs_code", c2, "IQ2_XXS grid rows as 2-bit codes: bits 2i..2i+1 of entry e = the level "
                        "(ll_iq2_levels) of value i")
            + [f"static const int8_t ll_iq2_levels[16] = {{{', '.join(map(str, lut2))}}};   /* level k at k and 4 k */"]
            + _code_lines("ll_iq3xxs_code", c3, "IQ3_XXS grid rows as nibble codes, values 0, 2, 1, 3 in nibbles 0..3: "
                          "the level (ll_iq3_levels) of each")
            + [f"static const int8_t ll_iq3_levels[16] = {{{', '.join(map(str, l3 + [0] * (16 - len(l3))))}}};"]
            + _byte_lines("ll_iq2xxs_code8", [c & 255 for c in c2] + [c >> 8 for c in c2],
                          "ll_iq2xxs_code's low bytes (values 0..3 of a row), then its high bytes (values 4..7)")
            + _byte_lines("ll_iq3xxs_code8", [c & 255 for c in c3] + [c >> 8 for c in c3],
                          "ll_iq3xxs_code's low bytes (values 0, 2), then its high bytes (values 1, 3)")
            + _byte_lines("ll_iq2_levels64", [(l2 + [0])[e & 3] for e in range(64)],
                          "entry e: the IQ2_XXS level of code e & 3", "int8_t")
            + _byte_lines("ll_iq3_levels64", [l3[e & 7] for e in range(64)],
                          "entry e: the IQ3_XXS level of code e & 7", "int8_t") + [""])


def header_text() -> str:
    lines = ["/* The codebooks of ggml's IQ1_S/IQ1_M, IQ2_XXS/XS/S and IQ3_XXS/S block types (qgemm.h), and",
             " * the sign patterns of IQ2_XXS/XS and IQ3_XXS: public constants, generated from the gguf",
             " * package's tables by tests/kernels/test_iq_grids.py (its test keeps them equal). */",
             "#ifndef LL_IQ_GRIDS_H", "#define LL_IQ_GRIDS_H", "#include <stdint.h>", ""]
    for name, cls, ctype in GRIDS:
        cls.init_grid()
        grid = np.asarray(cls.grid).reshape(cls.grid_shape)
        lines.append(f"static const {ctype} {name}[{grid.shape[0]}][{grid.shape[1]}] = {{")
        lines += _rows(grid.astype(np.int64), 8 if grid.shape[1] == 4 else 4)
        lines += ["};", ""]
    lines += _code_tables()
    signs = np.frombuffer(q.IQ2_XXS.ksigns, np.uint8)
    lines.append("/* 7 stored sign bits -> 8 (the eighth makes the count of minus signs even) */")
    lines.append("static const uint8_t ll_iq_ksigns[128] = {")
    lines += ["    " + ", ".join(str(int(v)) for v in signs[i:i + 16]) + "," for i in range(0, 128, 16)]
    lines += ["};", ""]
    masks = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1
    lines.append("/* a sign byte -> its 8 bits as byte masks (255: minus), for negating 8 values at once */")
    lines.append("static const uint8_t ll_iq_sign_mask[256][8] = {")
    lines += _rows(masks * 255, 4)
    lines += ["};", "", "#endif", ""]
    return "\n".join(lines)


def test_the_header_holds_the_gguf_package_tables():
    assert HEADER.read_text() == header_text()


if __name__ == "__main__":
    HEADER.write_text(header_text())
