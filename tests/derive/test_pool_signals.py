"""The tracing pools (derive/budget.pool): made with SIGINT and SIGTERM held, so a worker, one the pool starts again
while it is terminated included, cannot take a signal before its own dispositions are set (another library's
at-fork handler running under the parent's handler left such a worker alive after terminate(): the parent then
waited on it for ever, tests/test_interrupts.py's SIGTERM while tracing)."""
from __future__ import annotations

import signal
import threading

from nnmem_sweep.derive import budget


def _worker_state():
    return (signal.getsignal(signal.SIGINT) == signal.SIG_IGN, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_workers_take_their_signals_and_this_thread_gets_its_mask_back():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    threads_before = set(threading.enumerate())
    pool = budget.pool(2)
    try:
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
        ignored_int, default_term, blocked = pool.apply(_worker_state)
        assert ignored_int and default_term and signal.SIGINT not in blocked and signal.SIGTERM not in blocked
        # the pool's own threads (which start workers again) were made with both held; Python offers no way to read
        # another thread's mask, so what is checked is that they exist and the workers they start are as above
        assert set(threading.enumerate()) - threads_before
    finally:
        pool.terminate()
        pool.join()


def test_a_signal_while_the_pool_is_made_acts_once_it_is_made_and_the_pool_is_ended(monkeypatch):
    """A SIGTERM that arrives while the workers are forked is held, then acts when the pool is made: the error it
    raises leaves no pool behind."""
    import multiprocessing.pool as mp_pool

    made = []
    real_init = mp_pool.Pool.__init__

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        # the signal arrives while the pool is being made (after its workers are forked): held until it is made
        monkeypatch.setattr(mp_pool.Pool, "__init__", lambda self, *a, **k: (real_init(self, *a, **k),
                                                                          made.append(self),
                                                                          signal.raise_signal(signal.SIGTERM),
                                                                          made.append("went on, held"))[0])
        try:
            budget.pool(2)
            raise AssertionError("the held SIGTERM did not act")
        except Stop:
            pass
    finally:
        signal.signal(signal.SIGTERM, old)
    assert made[1:] == ["went on, held"]  # not raised where it arrived
    made[0].join()  # ends at once: terminated (join refuses a pool still running)
