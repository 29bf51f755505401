"""Holds the kernels module built for this ISA variant (see ../variants.py)."""
