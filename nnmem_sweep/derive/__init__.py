"""Plans derived from the model's own code (issue 12): for any model transformers can build from a config, or
any importable torch.nn.Module factory, the estimator's moments come from traces of the real code at small probe
shapes (derivation.py), not from a hand-written model of the family.

    get_card(source)  -> card.ModelCard: parameter tensors, sizes (for the optimizer catalog, quantised recipes)
    get_plan(source, mode, precision, attention, checkpointing, device) -> plans.DerivedPlan: the moments
                      per region
    get_kv_layout(source, precision) -> dict: what a causal LM's KV cache holds per layer (kvcache.py; the
                      serving plan's bytes per sequence)
    events.events_at(plan, batch, seq_len) -> (n, 2) int64: the step's own (id, ±bytes) allocation sequence at a
                      shape, for the caching-allocator replay (components/reserve.py); plans store it per region

Both are cached on disk (cache.py); the first derivation needs torch and transformers (the `measure` extra).
"""
from __future__ import annotations

import contextlib

from .card import ModelCard
from .plans import DerivedPlan
from .source import KEPT_SUFFIXES, TRACE_RECIPE, DerivationError, ModelSource

__all__ = ["ModelCard", "DerivedPlan", "ModelSource", "DerivationError", "get_card", "get_plan", "get_kv_layout",
           "shipping", "stored_only", "MISSING_EXTRA"]

MISSING_EXTRA = ("deriving a model from its own code needs torch and transformers: "
                 "pip install -e '.[measure]' (or `make install-measure`)")


_SHIP_TO: list = []  # where `shipping()` also writes every card and plan looked up


@contextlib.contextmanager
def shipping(root):
    """Within it, every card and plan looked up (found or derived) is also written under `root` as a shipped plan
    (`nnmem-sweep derive --ship`: the plans a scenario or the truth catalog needs, for users without torch)."""
    _SHIP_TO.append(root)
    try:
        yield
    finally:
        _SHIP_TO.pop()


def _ship_to():
    return _SHIP_TO[-1] if _SHIP_TO else None


_STORED_ONLY: list = []


@contextlib.contextmanager
def stored_only():
    """Within it, cards and plans come from the caches and the shipped plans only; one that would have to be traced
    raises DerivationError instead (the report's Validation and `nnmem-sweep accuracy` never trace for minutes)."""
    _STORED_ONLY.append(True)
    try:
        yield
    finally:
        _STORED_ONLY.pop()


_SILENT: list = []


@contextlib.contextmanager
def silent():
    """Within it, deriving prints no progress on stderr, whatever a caller asked (the CLI's --quiet)."""
    _SILENT.append(True)
    try:
        yield
    finally:
        _SILENT.pop()


def progress_shown() -> bool:
    """Whether a long derivation shows its progress (see silent())."""
    return not _SILENT


def _need_torch() -> None:
    if _STORED_ONLY:
        raise DerivationError("no stored plan for it (derive it with `nnmem-sweep derive CONFIG`, or `make derive`)")
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise DerivationError(MISSING_EXTRA)


def get_card(source: ModelSource) -> ModelCard:
    from . import cache

    return ModelCard.from_json(cache.lookup(source.digest(), ("card",), _maker(source, ("card",)), _ship_to()))


def document(source: ModelSource, what: tuple, progress: bool = False) -> dict:
    """The document of `what` for `source`, traced in this process with the installed releases: the card
    ("card",), a KV layout ("kv", recipe) or a plan (mode, recipe, attention, checkpointing, device)."""
    _need_torch()
    if what[0] == "card":
        from .card import model_card

        return model_card(source).to_json()
    if what[0] == "kv":
        from .kvcache import measure

        return measure(source, what[1], progress)
    from .derivation import derive  # torch: only when a plan must be traced
    from .plans import to_json

    mode, recipe, attention, checkpointing, device = what
    return to_json(derive(source, mode, recipe, attention, checkpointing, device, progress))


def _maker(source: ModelSource, what: tuple, progress: bool = False):
    """How cache.lookup makes a document it does not hold: document() here, or, where the source names releases
    that are not the installed ones (runtime.transformers / peft), the same traced with them in their side
    environment (side.py)."""
    from . import side

    if not (source.stack_json and side.differing(source.stack)):
        return lambda: document(source, what, progress)

    def traced() -> dict:
        if _STORED_ONLY:
            raise DerivationError("no stored plan for it (derive it with `nnmem-sweep derive CONFIG`, or `make derive`)")
        return side.traced(source, what, progress and progress_shown())

    return traced


def _what(source: ModelSource, mode: str, precision: str, attention: str, checkpointing: str, device: str,
          zero_grad: str = "set_to_none") -> tuple:
    """The cache key of a plan: the trace recipe (bf16-master and the quantised recipes trace the bf16 model; a
    training step with the gradients kept, zero_grad "zeros", its own: "bf16+zeros")."""
    if mode != "train":
        checkpointing = "none"
    if source.kind == "module":  # no attention kernel choice
        attention = "none"
    kept = KEPT_SUFFIXES.get(zero_grad, "") if mode == "train" else ""
    return (mode, TRACE_RECIPE[precision] + kept, attention, checkpointing, device)


def prefetch(source: ModelSource, requests: list[tuple], progress: bool = False) -> None:
    """Derive, in parallel processes (one per CPU core), the plans of `requests` ((mode, precision, attention,
    checkpointing, device[, zero_grad]) each) that no cache or shipped plan holds yet; get_plan then finds them stored. Tracing
    is single-threaded Python: two recipes on two cores take the time of one."""
    import os

    from . import budget, cache

    if _STORED_ONLY or _backward_ran():
        return
    missing = list(dict.fromkeys(w for r in requests for w in [_what(source, *r)] if not cache.stored(
        source.digest(), w)))
    workers = min(len(missing), os.cpu_count() or 1)
    if workers < 2:
        return
    _need_torch()
    # a Pool, not a ProcessPoolExecutor: stopped (SIGINT, SIGTERM, an error), it is terminated at once instead of
    # waiting minutes for the recipes being traced; its workers die quietly (budget.worker_signals)
    pool = budget.pool(workers)
    try:
        for r in [pool.apply_async(_derive_one, (source, w, progress, _ship_to())) for w in missing]:
            budget.result(r)
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def _backward_ran() -> bool:
    """Whether this process ran a backward pass (a trace, or a measurement: workload/steps.py): autograd's engine
    then refuses to run in a forked child ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"), so the plans are derived here one after another (`make derive`: the second scenario of a
    run)."""
    import sys

    steps = sys.modules.get("nnmem_sweep.workload.steps")
    return bool(steps is not None and steps.BACKWARD_RAN)


def _derive_one(source: ModelSource, what: tuple, progress: bool, ship_to) -> None:
    from . import cache
    from .derivation import IN_WORKER

    IN_WORKER.append(True)  # one recipe per core already: its probes are traced here one after another
    cache.lookup(source.digest(), what, _maker(source, what, progress), ship_to)


def get_plan(source: ModelSource, mode: str, precision: str, attention: str, checkpointing: str = "none",
             device: str = "cuda", progress: bool = False, zero_grad: str = "set_to_none") -> DerivedPlan:
    from . import cache
    from .plans import from_json

    what = _what(source, mode, precision, attention, checkpointing, device, zero_grad)
    return from_json(cache.lookup(source.digest(), what, _maker(source, what, progress), _ship_to()))


def get_kv_layout(source: ModelSource, precision: str, progress: bool = False) -> dict:
    """The KV layout of a causal LM under a precision's trace recipe (kvcache.measure's document: one row per cache
    layer, and the probes it was checked at), from the caches and the shipped plans, or read from the model's
    cache now (seconds: a few requests at batch 1 under FakeTensorMode)."""
    from . import cache

    what = ("kv", TRACE_RECIPE[precision])
    return cache.lookup(source.digest(), what, _maker(source, what, progress), _ship_to())
