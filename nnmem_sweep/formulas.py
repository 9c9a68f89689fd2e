"""Every formula the code implements, for the report's "Formulas and sources" section.

Formulas register themselves where they are implemented (citations.formula / citations.source, beside the code),
so the list is complete only once every such module is imported: this module imports them all (a test checks that
none is missing) and `all_formulas()` returns them, sorted by name. citations.py itself imports nothing of ours.
"""
from __future__ import annotations

import importlib

from . import citations, replays, serving  # noqa: F401  (replays, serving: register)
from .catalog import optimizers, precisions  # noqa: F401  (register)
from .components import (activations, cpu_kernels, derived, derived_inputs, finetune, kv, moe, optimizer,  # noqa: F401
                         overhead, recompute, reserve, weights)
from .derive import events as derive_events  # noqa: F401  (registers)
from .models import count, layers  # noqa: F401  (register)
from .parallel import (activations as parallel_activations, deepspeed as parallel_deepspeed,  # noqa: F401
                       fsdp as parallel_fsdp, recomputed as parallel_recomputed, states as parallel_states,
                       zero_bucket as parallel_zero_bucket)
from .allocator import rules  # noqa: F401  (registers)
from .throughput import defaults, flops, inference, training  # noqa: F401  (register)

# allocator/__init__ exports a function named `replay`, so its module is imported by name
replay = importlib.import_module(".allocator.replay", __package__)

REGISTERING_MODULES = (replays, serving, optimizers, precisions, activations, cpu_kernels, derived, derived_inputs,
                       derive_events, finetune, kv, moe, optimizer, overhead, recompute, reserve, weights, count,
                       layers, parallel_activations, parallel_deepspeed, parallel_fsdp, parallel_recomputed,
                       parallel_states, parallel_zero_bucket, replay, rules, defaults, flops, inference, training)


def all_formulas() -> list[citations.Formula]:
    """Every formula of every module above, sorted by name."""
    return citations.all_formulas()
