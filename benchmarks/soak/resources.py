"""What the soak samples of its own process: resident memory, heap in use,
threads and file descriptors, read from /proc and glibc (Linux).

Why these: a collective library that leaks shows it first as resident
memory that grows with the steps (buffers, cached responses, per-name
state), threads that are started and never joined, or descriptors (shared
memory segments, pipes) that are opened and never closed. Resident memory
also moves for reasons that are not leaks (glibc keeps freed pages of its
per-thread arenas; a large buffer may be in flight or cached for reuse when
the sample is taken), so the heap's bytes in use (glibc's mallinfo2: what
is allocated and not freed, whatever its pages) are sampled as well: a leak
of native memory raises both, allocator noise only the first.
"""

import ctypes
import os
import threading

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def resident_mib():
    """Resident set size in MiB (/proc/self/statm, second field)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES / MIB


def resident_parts_mib():
    """Resident memory by kind (/proc/self/status): private (anonymous),
    file-backed (libraries) and shared memory (tfring's segment, whose
    pages count once this rank has touched them)."""
    parts = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                parts[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return {"anon_mib": round(parts.get("RssAnon", 0.0), 2),
            "file_mib": round(parts.get("RssFile", 0.0), 2),
            "shmem_mib": round(parts.get("RssShmem", 0.0), 2)}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(field, ctypes.c_size_t) for field in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
        "fsmblks", "uordblks", "fordblks", "keepcost")]


def _load_mallinfo2():
    """glibc's mallinfo2 (glibc 2.33 and later), or None."""
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_mallinfo2 = _load_mallinfo2()


def heap_in_use_mib():
    """Bytes allocated with malloc and not freed, in every arena and in
    separately mapped large blocks (None without glibc's mallinfo2)."""
    if _mallinfo2 is None:
        return None
    info = _mallinfo2()
    return round((info.uordblks + info.hblkhd) / MIB, 2)


def sample(step):
    """One sample after `step` steps: memory, Python threads, kernel tasks
    (every thread of the process, TensorFlow's and tfring's included) and
    open file descriptors."""
    return {
        "step": step,
        "rss_mib": round(resident_mib(), 2),
        **resident_parts_mib(),
        "heap_in_use_mib": heap_in_use_mib(),
        "python_threads": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")),
        # Listing /proc/self/fd opens one descriptor, counted every time.
        "fds": len(os.listdir("/proc/self/fd")),
    }
