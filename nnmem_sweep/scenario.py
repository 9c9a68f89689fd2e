"""The validated scenario: frozen dataclasses produced by config.load_scenario, consumed by everything else, and the
defaults a scenario takes where its file says nothing."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .models.arch import Architecture

# Defaults, documented in the schema's descriptions (and FORMULAS.md, "Runtime overheads").
DEFAULT_MODE = "train"
DEFAULT_HEADROOM = 0.05
DEFAULT_PREFILL_LOGITS = "last"  # an infer sweep's prefill: generate() passes logits_to_keep=1
# Reserved minus allocated, as a fraction of the peak allocated, where no replay of the step's allocations through the
# allocator model is available (allocator/, components/reserve.py): the first replays of ALLOCATOR.md measured
# 0.8-3 % with AdamW and 9 % with Adafactor; 5 % is between them and labelled "not replayed" wherever it is used.
DEFAULT_ALLOCATOR_RESERVE = 0.05


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as the estimate sees it. `memory_bytes` is the capacity a PyTorch process can use:
    torch.cuda.mem_get_info()'s total, which the out-of-memory message prints as "total capacity" (a user-given
    `memory:` means the same). The catalog fields after the prices are information: None where no source was read."""

    id: str  # catalog id, e.g. "h100-sxm" (or the inline name, slugified)
    name: str  # display name, e.g. "H100 SXM5 80GB"
    memory_bytes: int  # PyTorch-visible capacity (mem_get_info total), not nvidia-smi's total nor the marketing figure
    source: str  # where memory_bytes comes from
    price_usd: float | None = None
    price_usd_per_hour: float | None = None
    capacity_basis: str = "given"  # "torch_total" (sourced), "estimated" (device total minus a sourced gap), "given"
    torch_total_bytes: int | None = None  # the lowest PyTorch-visible capacity observed, None = unknown
    device_total_bytes: int | None = None  # nvidia-smi memory.total / rocm-smi VRAM total, None = unknown
    architecture: str | None = None  # volta, turing, ampere, ada, hopper, blackwell, cdna2, cdna3, cdna4
    compute_capability: str | None = None  # "9.0" (NVIDIA) or the gfx target (AMD)
    memory_bandwidth_bytes_per_s: int | None = None  # decimal, as published
    peak_dense_flops: tuple[tuple[str, int], ...] = ()  # (dtype, FLOP/s) dense tensor peaks: bf16, fp16, fp8, tf32, fp32
    spec_source: str = ""  # where the bandwidth and FLOP/s figures come from

    def peak_flops(self, dtype: str) -> int | None:
        """Dense peak FLOP/s for `dtype` ("bf16", "fp16", "fp8", "tf32", "fp32"); None when unknown."""
        return dict(self.peak_dense_flops).get(dtype)


@dataclass(frozen=True)
class Overheads:
    """What a real GPU process needs besides the tensors of the step (components/overhead.py, issue 13).

    Each figure is modelled from sourced data (components/runtime.py over catalog/runtime.json, per GPU generation,
    mode and parallel layout) unless the scenario's `overheads:` block gives it; a given figure is an override and
    replaces its whole part: `cuda_context_bytes` all memory outside the allocator (context and NCCL),
    `cublas_workspace_bytes` the library workspaces inside it, `allocator_reserve_fraction` the allocator's reserve.
    """

    cuda_context_bytes: int | None = None  # memory outside the allocator, as given; None = modelled
    cublas_workspace_bytes: int | None = None  # library workspaces inside the allocator, as given; None = modelled
    allocator_reserve_fraction: float | None = None  # reserved-minus-allocated / peak allocated; None = modelled
    runtime: tuple[tuple[str, Any], ...] = ()  # the scenario's `runtime:` block (cuda, torch, lazy_loading ...)
    gpus: tuple["GPUSpec", ...] = ()  # the scenario's GPUs: their generation decides the modelled figures
    allocator_conf: str = ""  # the `allocator:` block as PYTORCH_CUDA_ALLOC_CONF text ("" = PyTorch's defaults)
    replayed_reserve_fraction: float | None = None  # the largest of the runner's replays (replays.py); None = none
    # per recipe (the values of replayed_axes, as text): (its reserve, the low and high of the band its replays span)
    replayed_axes: tuple[str, ...] = ()
    replayed_recipes: tuple[tuple[tuple[str, ...], float, float, float], ...] = ()
    reserve_note: str = ""  # how the reserve in force was obtained (set by the runner after its replays)

    @property
    def replayed_by_recipe(self) -> tuple[tuple[tuple[str, ...], float], ...]:
        """(recipe, reserve fraction) of every replayed recipe."""
        return tuple((key, f) for key, f, _, _ in self.replayed_recipes)

    def recipe_of(self, row) -> tuple[str, ...] | None:  # noqa: ANN001 - a mapping of a row's values
        """The row's recipe as replayed_recipes keys it (the values of replayed_axes, as text); None where the row
        lacks one of those axes."""
        if not all(a in row for a in self.replayed_axes):
            return None
        return tuple(str(row[a]) for a in self.replayed_axes)

    @property
    def replayed_band_by_recipe(self) -> tuple[tuple[tuple[str, ...], tuple[float, float]], ...]:
        """(recipe, (low, high)): the fractions a replayed recipe's fresh and resumed runs span."""
        return tuple((key, (lo, hi)) for key, _, lo, hi in self.replayed_recipes)

    @property
    def reserve_fraction(self) -> float:
        """The fraction in force: as given, else the replays' (replays.py), else the default."""
        if self.allocator_reserve_fraction is not None:
            return float(self.allocator_reserve_fraction)
        if self.replayed_reserve_fraction is not None:
            return float(self.replayed_reserve_fraction)
        return DEFAULT_ALLOCATOR_RESERVE


@dataclass(frozen=True)
class Scenario:
    path: str  # the YAML file as given ("" when built from CLI flags)
    name: str
    description: str
    model: Architecture
    mode: str  # train | infer
    grid: dict[str, tuple[Any, ...]]  # axis name (columns.GRID_AXES) -> values, every axis present
    gpus: tuple[GPUSpec, ...]
    overheads: Overheads
    headroom: float  # fraction of GPU memory kept free, 0 <= headroom < 1
    report: dict[str, Any] = field(default_factory=dict)  # report options (axes for tables, paper size, templates)
    target: dict[str, Any] = field(default_factory=dict)  # e.g. {"batch": 8, "seq_len": 4096}
    source_text: str = ""  # the YAML verbatim (appendix, sha256)
    sha256: str = ""
    # infer only (serving.py): kv_dtype (tuple, from grid.kv_dtype), kv_block_size, gpu_memory_utilization,
    # tensor_parallel (tuple), max_num_batched_tokens; absent keys take serving.py's defaults
    serving: dict[str, Any] = field(default_factory=dict)
    # train only (parallel/): the `parallel:` axes (columns.PARALLEL_AXES -> values), every axis present when the
    # scenario names any, empty when it names none (then the grid is estimated for one GPU, as before)
    parallel: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # the node (`node:`), used with `parallel`: {"gpus_per_node": int, "host_memory_bytes": int}
    node: dict[str, int] = field(default_factory=dict)
    # train only (cluster.py): the `cluster:` block as a cluster.ClusterSearch, None when absent
    cluster: Any = None
    # the `throughput:` block as a throughput.options.ThroughputOptions, None when absent (the sourced defaults)
    throughput: Any = None

    @property
    def prefill_logits(self) -> str:
        """The prefill logits of the sweep (results.csv, max_batch.csv, --stream): the `serving:` choice in infer
        mode ("last" or "all"), "last" otherwise."""
        return str((self.serving or {}).get("prefill_logits", DEFAULT_PREFILL_LOGITS)) if self.mode == "infer" \
            else "last"
