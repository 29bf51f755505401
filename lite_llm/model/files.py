"""Checkpoint file access shared by the format readers (hf.py, gguf.py): the loader's error, a
positioned read into an array, and a read-only mapping for packing straight from the file."""
from __future__ import annotations

import mmap
import os

import numpy as np


class ModelLoadError(ValueError):
    """A checkpoint cannot be loaded; the message names the file, the tensor and the problem."""


def pread_into(fd: int, offset: int, out: np.ndarray, path: str) -> None:
    """Fill the contiguous array `out` with the bytes of open file `fd` from `offset`: vectors,
    and weights the packer cannot take as stored (MappedFile serves those it can)."""
    view, done = memoryview(out.reshape(-1).view(np.uint8)), 0
    while done < len(view):         # a read may return less than asked
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:                       # Windows: no preadv; the engine thread is the only reader
            os.lseek(fd, offset + done, os.SEEK_SET)
            chunk = os.read(fd, min(len(view) - done, 1 << 26))
            n = len(chunk)
            view[done:done + n] = chunk
        if n <= 0:
            raise ModelLoadError(f"{path}: truncated file: bytes {offset}..{offset + len(view)} cannot be read "
                                 "(did it change since it was opened?)")
        done += n


class MappedFile:
    """A checkpoint file mapped read-only for the loader's one-pass packing: kernels.load_panels
    reads a tensor's bytes where they lie in the page cache. Once a tensor is packed, release()
    drops its pages from the resident set, so mapping costs no more memory than reading did."""

    def __init__(self, path: str):
        self.path = path
        self._mm: mmap.mmap | None = None

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes offset..offset + nbytes as a read-only uint8 array (mapping the file if needed)."""
        if self._mm is None:
            try:
                with open(self.path, "rb") as fh:
                    self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"{self.path}: cannot map the file: {e}") from e
        if offset + nbytes > len(self._mm):
            raise ModelLoadError(f"{self.path}: truncated file: bytes {offset}..{offset + nbytes} are past its end "
                                 f"({len(self._mm)} bytes; did it change since it was opened?)")
        return np.frombuffer(self._mm, np.uint8, count=nbytes, offset=offset)

    def release(self, offset: int, nbytes: int) -> None:
        """Drop the mapped pages of bytes offset..offset + nbytes from the resident set (the page
        cache keeps them), widened to whole 2 MB: the kernel maps the file a folio or a
        fault-around window at a time, so a tensor's pages reach into its neighbours' (those
        not packed yet simply fault in again)."""
        if self._mm is None or not hasattr(self._mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        span = 2 << 20
        start, end = offset // span * span, min(-(-(offset + nbytes) // span) * span, len(self._mm))
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            pass    # a hint only

    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass    # a view still lives somewhere: the mapping goes when it does
