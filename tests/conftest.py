"""The test session's own user cache (derived plans, replays): empty at the start of every `make test`, so the suite
runs what a user's first run runs, whatever cache the machine holds; shared by the pytest-xdist workers, which
inherit the variable (the cache's writes are atomic renames).

And the cores shared out: each pytest-xdist worker (one per core) and every process it starts compute with
cores / workers threads (OMP_NUM_THREADS, which torch's and the BLAS's thread pools read), not torch's default of
one per core each. On 2 cores the two workers' four compute threads took turns on two cores: the suite ran 311 s,
then 200 s with one thread each (summed over the tests, 575 s then 364 s; docs/speed.md)."""
from __future__ import annotations

import os
import shutil
import tempfile


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    workers = getattr(config.option, "numprocesses", None)  # xdist's, an int by now ("auto" resolved), or None
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    if os.environ.get("NNMEM_SWEEP_TEST_KEEP_CACHE"):
        return
    path = tempfile.mkdtemp(prefix="nnmem-test-cache-")
    os.environ["NNMEM_SWEEP_CACHE"] = path
    config._nnmem_cache = path


def pytest_unconfigure(config):
    path = getattr(config, "_nnmem_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
