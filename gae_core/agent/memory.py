"""The C allocator's settings for a process that trains a population.

A population's update allocates and frees the same large activations every update (the field
defaults' 35 CartPole members: several tensors of 9 MB; the preset's: 360 KB). glibc's
``malloc`` serves allocations from 128 KB up (a threshold it raises as it sees larger blocks
freed, up to 32 MB) with fresh ``mmap`` pages and gives freed memory at the top of its heap
back to the OS, so each update paid page faults to map its activations' memory again.

Written because it measured faster: on this project's 2-core machine with torch 2.13, one
thread, 35 CartPole members: an update at the field defaults (16 envs × 64 steps) took 83 to
96 ms in fresh processes and 66 to 68 ms with :func:`keep_freed_memory`; a whole population
step at the preset (8 × 5) 10.4 to 10.9 ms, and 8.8 to 9.0 ms with it. Single runs (a few dozen
rows a pass) measured no difference (13,800 to 14,000 env steps/s either way), so a single run
does not set it. The cost is memory that stays mapped after its peak: a sweep worker that
trained a population keeps it (and the setting, which is process-wide) for the rest of the
sweep, and gives it back when the sweep ends and the worker exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: Blocks up to this size come from the heap, not from fresh ``mmap`` pages (glibc's maximum).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free memory at the top of the heap is returned to the OS only beyond this much.
TRIM_THRESHOLD = 1024 * 1024 * 1024

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` for this process (once);
    whether it took. Elsewhere (musl, macOS, Windows: no glibc ``mallopt``) nothing changes."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
