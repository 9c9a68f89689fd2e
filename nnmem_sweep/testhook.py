"""The test hook that holds a run at a known moment, so that a test can signal it there (tests/test_output_sets.py,
tests/test_interrupts.py): a no-op unless NNMEM_TEST_PAUSE_AT names the stage. Stages: "staged", "tables", "html",
"pdf", "commit" (outputs.py), "trace" (a probe being traced, in a forked worker or here), "solve" (a derivation
between its traces), "replay" (an allocator replay)."""
from __future__ import annotations

import os
import sys
import time

PAUSE_ENV, RESUME_ENV = "NNMEM_TEST_PAUSE_AT", "NNMEM_TEST_RESUME"


def checkpoint(stage: str) -> None:
    """Say on stderr that the run is paused at `stage` and wait (60 s at most) until the file NNMEM_TEST_RESUME names
    exists; nothing unless NNMEM_TEST_PAUSE_AT is `stage`."""
    if os.environ.get(PAUSE_ENV) != stage:
        return
    # one write(2) of the whole line: a derive's worker processes pause too, and print's two writes (text, newline)
    # could let another process's line in between them
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"nnmem-sweep: test hook: paused at {stage}\n".encode())
    resume, deadline = os.environ.get(RESUME_ENV), time.monotonic() + 60
    while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
        time.sleep(0.01)
