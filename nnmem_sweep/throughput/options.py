"""The scenario's `throughput:` block: the utilisations an estimate takes instead of the sourced defaults.

    throughput:
      mfu: 0.4                              # every GPU; or per GPU id: {h100-sxm: 0.45, a100-80gb: 0.55}
      decode_bandwidth_efficiency: 0.7      # infer: share of the datasheet bandwidth a decode step achieves
      prefill_compute_efficiency: 0.5       # infer: share of the dense peak a prefill achieves

A value given here is used as it is (an MFU stated for a recipe with full recomputation is not scaled down: it is
what the user measured or expects); a value left out takes defaults.py's default for the GPU's generation, with its
sources. None of it changes a memory figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_FRACTION = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "description": "Throughput estimate (an estimate: it never changes a memory figure). Values given here replace "
                   "the sourced defaults (nnmem_sweep/throughput/defaults.py: training MFU per GPU generation and "
                   "recipe, decode bandwidth efficiency 0.65 (0.50 for 4-bit weights), prefill compute efficiency "
                   "0.45); each figure in the report is printed with the value it assumed and where it comes from.",
    "properties": {
        "mfu": {
            "description": "Train mode: model-FLOPs utilisation, a fraction of the GPU's dense peak of the recipe's "
                           "compute dtype (0 < mfu <= 1); one number for every GPU, or a mapping of GPU id (as "
                           "listed in gpus:) to a number.",
            "if": {"type": "object"},
            "then": {"type": "object", "minProperties": 1, "additionalProperties": _FRACTION},
            "else": _FRACTION,
        },
        "decode_bandwidth_efficiency": {**_FRACTION, "description": "Infer mode: share of the datasheet memory "
                                        "bandwidth one decode step achieves (weights and KV cache read per token)."},
        "prefill_compute_efficiency": {**_FRACTION, "description": "Infer mode: share of the dense peak FLOP/s a "
                                       "prefill achieves (time to first token)."},
    },
}

TRAIN_KEYS = ("mfu",)
INFER_KEYS = ("decode_bandwidth_efficiency", "prefill_compute_efficiency")


@dataclass(frozen=True)
class ThroughputOptions:
    """The `throughput:` block as given (None: the sourced default)."""

    mfu: float | None = None  # every GPU
    mfu_by_gpu: tuple[tuple[str, float], ...] = ()  # (GPU id, MFU): overrides `mfu` for that GPU
    decode_bandwidth_efficiency: float | None = None
    prefill_compute_efficiency: float | None = None

    def mfu_for(self, gpu_id: str) -> float | None:
        return dict(self.mfu_by_gpu).get(gpu_id, self.mfu)


DEFAULTS = ThroughputOptions()


def parse_throughput(given: dict, mode: str, model: Any, gpu_ids: list[str]
                     ) -> tuple[ThroughputOptions | None, list[tuple[str, str]]]:
    """The `throughput:` block (already schema-valid) -> (options, problems as (key path, message))."""
    bad: list[tuple[str, str]] = []
    if model is not None and model.kind == "layers":
        return None, [("throughput", "the throughput estimate counts FLOPs per token; a layer-list net has no "
                                     "tokens")]
    for key in (INFER_KEYS if mode == "train" else TRAIN_KEYS):
        if key in given:
            other = "train" if key in TRAIN_KEYS else "infer"
            bad.append((f"throughput.{key}", f"{key} applies to {other} mode only (this scenario has mode: {mode})"))
    mfu = given.get("mfu")
    by_gpu: tuple[tuple[str, float], ...] = ()
    if isinstance(mfu, dict):
        for gpu_id in mfu:
            if gpu_id not in gpu_ids:
                bad.append((f"throughput.mfu.{gpu_id}", f"{gpu_id!r} is not one of this scenario's GPUs "
                                                        f"({', '.join(gpu_ids)})"))
        by_gpu = tuple((str(k), float(v)) for k, v in mfu.items())
        mfu = None
    opts = ThroughputOptions(mfu=None if mfu is None else float(mfu), mfu_by_gpu=by_gpu,
                             decode_bandwidth_efficiency=_float(given.get("decode_bandwidth_efficiency")),
                             prefill_compute_efficiency=_float(given.get("prefill_compute_efficiency")))
    return (None if bad else opts), bad


def _float(v: Any) -> float | None:
    return None if v is None else float(v)
