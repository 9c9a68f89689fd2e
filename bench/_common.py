"""Shared by the bench_*.py scripts (run as scripts, so this folder is on sys.path)."""
from __future__ import annotations

import resource

from nnmem_sweep.units import KiB


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB
