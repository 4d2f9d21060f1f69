"""Hand the C heap's free pages back to the operating system between passes.

On a CPU, tensors live in the C library's heap. glibc raises its mmap threshold to the size of the
largest block freed (up to 32 MiB), so after the first large tensor is freed, the tensors of a
pass, from a few kilobytes to tens of megabytes, all come from the heap; when the next pass asks
for other sizes (ragged batches: another length, another number of rows) it cannot reuse every
hole, and the holes stay resident. Measured on W5 (docs/performance.md): 0.36 GB of free heap
during the update, most of the gap between the live tensors and the process's resident memory.

`release(device)` calls glibc's malloc_trim(0), which returns every whole free page inside the
heap (not only its top) to the system, after each forward/backward pass and after the sampler's
cache is reshaped. A page given back costs a page fault when reused; measured on W5, 52 calls
took 0.8 s of a 400 s run. It does nothing on CUDA (the caching allocator holds GPU memory; the
host heap is small there) or where the C library has no malloc_trim (macOS, musl).
"""

from __future__ import annotations

import ctypes
import sys

import torch


def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release(device: torch.device | str = "cpu") -> bool:
    """Return free heap pages to the system if `device` is the CPU; True if it was done."""
    if _TRIM is None or torch.device(device).type != "cpu":
        return False
    _TRIM(0)
    return True
