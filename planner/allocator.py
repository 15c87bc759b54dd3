"""Host memory allocator settings shared by the profiler and the runtime.

glibc's malloc gives freed memory back to the kernel: it trims the top of the heap, and
blocks over the mmap threshold (128 KiB, raised dynamically up to 32 MiB) are unmapped on
free. A training step then faults the same pages in again each time: on the 2-core
development VM a minor fault costs 3-4 us, a GPT pipeline step took 5,000-30,000 of them,
and Adam's step over the MLP example (4.7 M parameters, one thread) took 15-35 ms with
2,000-8,000 faults instead of 10-22 ms with none (``python bench/allocator.py``), all in the
temporaries it allocates. Whether a process keeps freed memory thus
changes measured times by up to 2x, so the profiler and every ``run`` worker keep it alike:
:func:`keep_freed_memory` sets, with ``mallopt``, a trim threshold of 1 GiB, an mmap
threshold of 32 MiB (glibc's ceiling) and a top pad of 64 MiB.

Where it does nothing: not glibc (macOS, musl), or ``GLIBC_TUNABLES`` already names a
``glibc.malloc`` setting (the user's choice wins). jemalloc or tcmalloc preloaded with
``LD_PRELOAD`` replace malloc altogether; the calls then reach glibc's unused copy.

Example::

    from planner.allocator import keep_freed_memory
    keep_freed_memory()   # 'glibc malloc: trim_threshold=1073741824 ...' or 'default: ...'
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["SETTINGS", "keep_freed_memory"]

# mallopt's parameter numbers (malloc.h) and the values set.
_PARAMS = {"trim_threshold": -1, "top_pad": -2, "mmap_threshold": -3}
SETTINGS = {"trim_threshold": 1 << 30, "mmap_threshold": 32 << 20, "top_pad": 64 << 20}


@functools.cache
def keep_freed_memory() -> str:
    """Make this process's malloc keep freed memory (once); says what is in force.

    The answer is recorded in profiles (``meta.allocator``) and run reports, so a profile
    and a run can be seen to share the setting.

    Example::

        keep_freed_memory().startswith(("glibc malloc:", "default:"))   # True
    """
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return f"default: GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}"
    if not sys.platform.startswith("linux"):
        return f"default: {sys.platform} allocator"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
    except (OSError, AttributeError):
        return "default: not glibc"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    for name, value in SETTINGS.items():
        if mallopt(_PARAMS[name], value) != 1:
            return f"default: mallopt refused {name}"
    return "glibc malloc: " + " ".join(f"{k}={v}" for k, v in SETTINGS.items())
