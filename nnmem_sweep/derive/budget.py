"""Every derivation is bounded (issue 24): storage events per trace, seconds per derivation, and the tracing process's
resident memory. Past any of them the derivation stops with one line naming the model's recipe, the probe (batch,
sequence), the budget and how to allow more; nothing is planned or cached. The defaults leave ordinary models far
inside (a 70B decoder's step is some 10^5 events; Mistral 7B derives in about 30 s):

    NNMEM_SWEEP_DERIVE_EVENTS    storage events of one traced step     default 4,000,000
    NNMEM_SWEEP_DERIVE_SECONDS   seconds of one recipe's derivation    default 900
    NNMEM_SWEEP_DERIVE_MEMORY    resident memory of a tracing process  default 3/4 of the machine's, at most 32 GiB

Worker processes (forked to trace probes in parallel) inherit the budget and report a breach as any other error;
they ignore SIGINT and die on SIGTERM without a word, so a stopped run prints one line, from the parent."""
from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Iterator

from ..units import auto_unit, format_bytes, parse_size
from .source import DerivationError

EVENTS_ENV, SECONDS_ENV, MEMORY_ENV = ("NNMEM_SWEEP_DERIVE_EVENTS", "NNMEM_SWEEP_DERIVE_SECONDS",
                                       "NNMEM_SWEEP_DERIVE_MEMORY")
EVENTS, SECONDS = 4_000_000, 900
MEMORY_CAP = 32 * 2**30
CHECK_EVERY = 4096  # ops between the clock and memory checks


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - not Linux
        return MEMORY_CAP


def limits() -> tuple[int, float, int]:
    """(events, seconds, memory bytes) from the environment, else the defaults; a bad value is one line."""
    try:
        events = int(os.environ.get(EVENTS_ENV) or EVENTS)
        seconds = float(os.environ.get(SECONDS_ENV) or SECONDS)
        memory = parse_size(os.environ[MEMORY_ENV]) if os.environ.get(MEMORY_ENV) else \
            min(MEMORY_CAP, _machine_memory() * 3 // 4)
    except ValueError as e:
        raise DerivationError(f"a derive budget in the environment is not valid: {e}") from None
    return events, seconds, memory


def _resident() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _State:
    label = ""
    shape = ""
    deadline = float("inf")
    seconds = float(SECONDS)
    events = EVENTS
    memory = MEMORY_CAP
    ops = 0


_S = _State()


@contextmanager
def derivation(label: str) -> Iterator[None]:
    """One recipe's derivation: its clock starts here."""
    events, seconds, memory = limits()
    saved = (_S.label, _S.deadline, _S.seconds, _S.events, _S.memory)
    _S.label, _S.seconds, _S.events, _S.memory = label, seconds, events, memory
    _S.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _S.label, _S.deadline, _S.seconds, _S.events, _S.memory = saved


@contextmanager
def probe(b: int, s: int) -> Iterator[None]:
    """One traced shape."""
    _S.shape = f"batch {b}, sequence {s}"
    _check_clock_and_memory()
    try:
        yield
    finally:
        _S.shape = ""


def _stop(what: str, how: str) -> DerivationError:
    where = f"{_S.label}" + (f", tracing {_S.shape}" if _S.shape else "")
    return DerivationError(f"{where}: past its budget of {what}; nothing was planned (allow more with {how})")


def check_event(n_events: int) -> None:
    """Called by the recorder for every op (n_events: the trace's events so far)."""
    _S.ops += 1
    if n_events > _S.events:
        raise _stop(f"{_S.events:,} storage events in one traced step (the step's code may loop per token on the "
                    "CPU)", f"{EVENTS_ENV}=N")
    if not _S.ops % CHECK_EVERY:
        _check_clock_and_memory()


def _check_clock_and_memory() -> None:
    if time.monotonic() > _S.deadline:
        raise _stop(f"{_S.seconds:g} s for one recipe", f"{SECONDS_ENV}=N")
    if _resident() > _S.memory:
        size = format_bytes(_S.memory, auto_unit(_S.memory))  # '1.0 MiB', '48.0 GiB': never '0.0 GiB'
        raise _stop(f"{size} of memory for the tracing process", f"{MEMORY_ENV}='48 GiB'")


def result(async_result, poll: float = 0.2):
    """What a pool's AsyncResult holds, waited for in short slices: SIGINT and SIGTERM may be delivered to one of the
    pool's helper threads, and Python runs their handlers in the main thread only when it next runs, which a wait
    without a timeout would put off until the work is done."""
    while not async_result.ready():
        async_result.wait(poll)
    return async_result.get()


_STOPS = {signal.SIGINT, signal.SIGTERM}


def worker_signals() -> None:
    """A forked tracing worker: SIGINT is the parent's to handle, SIGTERM ends the worker at once and quietly; then
    both are let through (a pool's workers start with them held: pool())."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def pool(workers: int):
    """A fork Pool of tracing workers, made with SIGINT and SIGTERM held (pthread_sigmask) in this thread, so in
    the pool's own threads and in every worker they fork, those a pool starts again while it is terminated
    included: a signal can no longer land in a child before worker_signals has run, while another library's
    at-fork handler (filelock's) runs under the parent's handler, which left a worker alive that terminate() had
    already signalled, and the parent waiting on it for ever. A signal sent meanwhile acts when the pool is made."""
    import multiprocessing

    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    made = None
    try:
        made = multiprocessing.get_context("fork").Pool(workers, initializer=worker_signals)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held meanwhile acts here
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if made is not None:
            made.terminate()
        raise
    return made


# in every child forked from Python (the tracing pools' workers, those a pool starts again while it is being
# terminated included), before the child runs anything: not only in the pools' initializers, which run later
os.register_at_fork(after_in_child=worker_signals)
