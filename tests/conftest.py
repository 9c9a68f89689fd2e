"""The test session's own user cache (derived plans, replays): empty at the start of every `make test`, so the suite
runs what a user's first run runs, whatever cache the machine holds; shared by the pytest-xdist workers, which
inherit the variable (the cache's writes are atomic renames)."""
from __future__ import annotations

import os
import shutil
import tempfile


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get("NNMEM_SWEEP_TEST_KEEP_CACHE"):
        return
    path = tempfile.mkdtemp(prefix="nnmem-test-cache-")
    os.environ["NNMEM_SWEEP_CACHE"] = path
    config._nnmem_cache = path


def pytest_unconfigure(config):
    path = getattr(config, "_nnmem_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
