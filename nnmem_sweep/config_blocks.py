"""The semantic checks of every block of a scenario file: what the JSON Schema cannot say (a value against the
model, the mode, the catalog or another block). Each `check_<block>` reads its block from the validated data,
reports every problem to the Checker (config_check.py) at its key path, and returns the block's values for the
Scenario (config.py assembles them; the blocks that change the model itself are config_model.py's):

    check_grid       grid:       the axes, defaults per mode (AXIS_DEFAULTS), values that fit the mode, a static
                                 cache that holds the prompt and the generated tokens; the optional axes
                                 (columns.OPTIONAL_AXES) only where named
    check_zero_grad  grid:       zero_grad 'zeros' on one GPU only (no parallel layouts, no cluster search)
    check_gpus       gpus:       catalog ids or inline GPUs, each once
    check_overheads  overheads:  the runtime overheads (defaults in scenario.py)
    check_report     report:     reference points that are grid values, table rows, the template folder
    check_serving    serving:    the serving plan (serving.py): infer mode, a causal LM, TP dividing the heads
    check_parallel   parallel:   the parallel axes, in the block or among the grid axes, each combination checked
                                 against parallel/layout.py's rules
    check_node       node:       GPUs per node and host memory (the parallel and cluster plans)
    check_cluster    cluster:    the cluster search (cluster.py); rank_by cost_per_token needs every GPU's hourly
                                 price and peak FLOP/s
    check_throughput throughput: the utilisations the throughput estimate takes (throughput/options.py)
"""
from __future__ import annotations

import dataclasses
from itertools import product
from typing import Any

from . import columns as C
from .catalog import names
from .catalog.gpus import get_gpu, unknown_gpu_message
from .allocator import AllocatorOptions
from .cluster import parse_cluster
from .components.runtime import parse_runtime
from .config_check import Checker, as_list, dedupe
from .parallel import accelerate as ACC
from .parallel import deepspeed as DS
from .parallel import layout as L
from .paths import NamedFileError, safe_stem
from .serving import has_kv_cache
from .scenario import GPUSpec, Overheads
from .throughput.defaults import compute_dtype
from .throughput.options import parse_throughput
from .units import parse_size

# Axis defaults per mode. None: the axis must be given.
AXIS_DEFAULTS: dict[str, dict[str, Any]] = {
    "train": {
        C.BATCH: None, C.SEQ_LEN: None, C.PRECISION: None, C.OPTIMIZER: None,
        C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none", C.ATTENTION: "flash",
        C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 0,
    },
    "infer": {
        C.BATCH: None, C.SEQ_LEN: None, C.PRECISION: None, C.OPTIMIZER: names.OPTIMIZER_NONE,
        C.OPTIMIZER_IMPL: names.OPTIMIZER_NONE, C.CHECKPOINTING: "none", C.ATTENTION: "flash",
        C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 1,
    },
}


def check_grid(data: dict, mode: str, ck: Checker) -> dict[str, tuple[Any, ...]]:
    grid = data.get("grid") if isinstance(data.get("grid"), dict) else {}
    out: dict[str, tuple[Any, ...]] = {}
    for axis in C.GRID_AXES:
        path = f"grid.{axis}"
        if axis in grid:
            values = as_list(grid[axis])
            item = (lambda i: f"{path}[{i}]") if isinstance(grid[axis], list) else (lambda i: path)
        else:
            default = AXIS_DEFAULTS[mode][axis]
            if default is None:
                if axis == C.OPTIMIZER and "grid" in data and ck.clean("grid"):
                    ck.add("grid", "missing required key 'optimizer' (train mode needs one)", key=True)
                out[axis] = ()
                continue
            values, item = [default], (lambda i: path)
        if not ck.clean(path):
            out[axis] = dedupe(values)
            continue
        for i, v in enumerate(values):
            where = item(i)
            if axis == C.PRECISION and mode == "train" and v in names.INFER_ONLY_PRECISIONS:
                ck.add(where, f"precision {v!r} stores quantised weights, which this tool models for infer mode "
                              "only; set mode: infer or use one of "
                              f"{', '.join(p for p in names.PRECISIONS if p not in names.INFER_ONLY_PRECISIONS)}")
            elif axis in (C.OPTIMIZER, C.OPTIMIZER_IMPL) and mode == "train" and v == names.OPTIMIZER_NONE:
                ck.add(where, f"{axis} 'none' is for infer mode only")
            elif axis in (C.OPTIMIZER, C.OPTIMIZER_IMPL) and mode == "infer" and v != names.OPTIMIZER_NONE:
                ck.add(where, f"{axis} {v!r} applies to train mode only (this scenario has mode: infer)")
            elif axis == C.CHECKPOINTING and mode == "infer" and v != "none":
                ck.add(where, f"checkpointing {v!r} applies to train mode only (this scenario has mode: infer)")
            elif axis in (C.CACHE_TOKENS, C.DECODE_TOKENS) and mode == "train" and v != 0:
                ck.add(where, f"{axis} applies to infer mode only (this scenario has mode: train)")
        out[axis] = dedupe(values)
    for axis in C.OPTIONAL_AXES:  # only when named: a scenario that does not name one has no column for it
        if axis not in grid:
            continue
        out[axis] = dedupe(as_list(grid[axis]))
        if mode == "infer" and ck.clean(f"grid.{axis}"):
            ck.add(f"grid.{axis}", f"{axis} applies to train mode only (this scenario has mode: infer)")
    if mode == "infer" and all(ck.clean(f"grid.{a}") for a in (C.SEQ_LEN, C.DECODE_TOKENS, C.CACHE_TOKENS)):
        need = max(out[C.SEQ_LEN], default=0) + max(out[C.DECODE_TOKENS], default=0)
        for i, tokens in enumerate(as_list(grid.get(C.CACHE_TOKENS, 0))):  # as written, so [i] is the user's
            if 0 < tokens < need:
                where = f"grid.{C.CACHE_TOKENS}" + (f"[{i}]" if isinstance(grid.get(C.CACHE_TOKENS), list) else "")
                ck.add(where, f"a static cache of {tokens:,} tokens cannot hold seq_len + decode_tokens = "
                              f"{need:,} tokens; use 0 (a dynamic cache) or at least {need:,}")
    return out


def check_gpus(data: dict, ck: Checker) -> tuple[GPUSpec, ...]:
    out: list[GPUSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(data.get("gpus") or [] if isinstance(data.get("gpus"), list) else []):
        path = f"gpus[{i}]"
        if not ck.clean(path):
            continue
        spec: GPUSpec | None = None
        gpu_id = entry if isinstance(entry, str) else entry.get("id")
        if gpu_id is not None:
            try:
                spec = get_gpu(gpu_id)
            except ValueError:
                ck.add(path if isinstance(entry, str) else f"{path}.id", unknown_gpu_message(gpu_id))
                continue
        elif "name" not in entry:
            continue  # reported by the schema as a missing key
        elif "memory" not in entry:  # {name: h100-sxm, price_usd: ...}: a catalog GPU named by its id
            try:
                spec = get_gpu(entry["name"])
            except ValueError:
                ck.add(f"{path}.name", unknown_gpu_message(entry["name"]) + "; or give memory: for a GPU not in "
                                                                             "the catalog")
                continue
        else:
            try:
                memory = parse_size(entry["memory"])
            except ValueError as e:
                ck.add(f"{path}.memory", str(e))
                continue
            if memory == 0:
                ck.add(f"{path}.memory", "must be more than 0 bytes")
                continue
            spec = GPUSpec(id=safe_stem(entry["name"]).lower(), name=entry["name"], memory_bytes=memory,
                           source="given in the scenario")
        if isinstance(entry, dict):
            spec = dataclasses.replace(spec, price_usd=entry.get("price_usd"),
                                       price_usd_per_hour=entry.get("price_usd_per_hour"))
        if spec.id in seen:
            ck.add(path, f"GPU {spec.id!r} is listed twice (also gpus[{seen[spec.id]}])")
            continue
        seen[spec.id] = i
        out.append(spec)
    return tuple(out)


def check_overheads(data: dict, ck: Checker, gpus: tuple[GPUSpec, ...] = ()) -> Overheads:
    """The `overheads:` overrides (absent = modelled) and the `runtime:` block the modelled figures follow."""
    given = data.get("overheads") if isinstance(data.get("overheads"), dict) else {}
    sizes: dict[str, int | None] = {}
    for key in ("cuda_context", "cublas_workspace"):
        path = f"overheads.{key}"
        sizes[key] = None
        if key in given and ck.clean(path):
            try:
                sizes[key] = parse_size(given[key])
            except ValueError as e:
                ck.add(path, str(e))
    reserve = given.get("allocator_reserve")
    runtime = data.get("runtime") if isinstance(data.get("runtime"), dict) else {}
    if runtime and ck.clean("runtime"):
        try:
            parse_runtime(runtime)
        except ValueError as e:  # the message starts with the key path: runtime.cuda: ...
            path, _, message = str(e).partition(": ")
            ck.add(path if path.startswith("runtime") else "runtime", message or str(e))
    return Overheads(cuda_context_bytes=sizes["cuda_context"], cublas_workspace_bytes=sizes["cublas_workspace"],
                     allocator_reserve_fraction=float(reserve) if reserve is not None and
                     ck.clean("overheads.allocator_reserve") else None,
                     runtime=tuple(sorted(runtime.items())), gpus=tuple(gpus), allocator_conf=check_allocator(data, ck))


def check_allocator(data: dict, ck: Checker) -> str:
    """The `allocator:` block (PYTORCH_CUDA_ALLOC_CONF text, or its options as keys) as conf text, checked by the
    allocator model's own parser; "" when absent."""
    given = data.get("allocator")
    if given is None or not ck.clean("allocator"):
        return ""
    if isinstance(given, dict):
        text = ",".join(f"{k}:{('True' if v else 'False') if isinstance(v, bool) else v}" for k, v in given.items())
    else:
        text = str(given)
    try:
        AllocatorOptions.from_alloc_conf(text)
    except ValueError as e:
        ck.add("allocator", str(e))
        return ""
    return text


def check_report(data: dict, grid: dict[str, tuple[Any, ...]], ck: Checker) -> dict[str, Any]:
    report = dict(data.get("report") or {}) if isinstance(data.get("report"), dict) else {}
    # The report draws these points from the results: every axis but batch must be a value the grid has.
    wanted = [("report.reference_seq_len", C.SEQ_LEN, report.get("reference_seq_len"))]
    for i, point in enumerate(report.get("reference_points") or []):
        if isinstance(point, dict):
            wanted += [(f"report.reference_points[{i}].{a}", a, v) for a, v in point.items() if a != C.BATCH]
    for path, axis, value in wanted:
        if value is not None and grid.get(axis) and ck.clean(path) and value not in grid[axis]:
            shown = ", ".join(map(str, grid[axis]))
            ck.add(path, f"{value!r} is not in grid.{axis} ({shown})")
    # parallel axes are rows of the tables only where the scenario has a parallel: block (else they do not exist)
    rows = report.get("table_rows")
    if isinstance(rows, list) and ck.clean("report.table_rows") and not isinstance(data.get("parallel"), dict):
        for i, axis in enumerate(rows):
            if axis in C.PARALLEL_AXES:
                ck.add(f"report.table_rows[{i}]", f"{axis} is a parallel axis, but this scenario has no parallel: "
                                                  f"block; add one (parallel: {{{axis}: [...]}}) or use a grid axis")
    if isinstance(rows, list) and ck.clean("report.table_rows"):
        for i, axis in enumerate(rows):
            if axis in C.OPTIONAL_AXES and axis not in grid:
                ck.add(f"report.table_rows[{i}]", f"{axis} is an optional axis this scenario's grid does not name; "
                                                  f"add grid.{axis} or leave it out of the rows")
    if "templates" in report and ck.clean("report.templates"):
        if "\0" in report["templates"]:  # no path holds one (os.path refuses it with a ValueError)
            ck.add("report.templates", f"{report['templates']!r} is not a folder: a path has no NUL character")
            return report
        folder = (ck.base_dir / report["templates"]).resolve()
        if not folder.is_dir():
            ck.add("report.templates", f"{report['templates']!r} is not a folder (looked for {folder})")
        report["templates"] = str(folder)
    return report


def check_serving(data: dict, mode: str, model, ck: Checker) -> dict[str, Any]:
    given = data.get("serving")
    if not isinstance(given, dict) or not ck.clean("serving"):
        return {}
    if mode != "infer":
        ck.add("serving", "the serving plan applies to infer mode only (this scenario has mode: train)", key=True)
        return {}
    if model is not None and not has_kv_cache(model):
        what = {"layers": "layer list", "params": "parameter count"}.get(model.kind)
        if model.kind == "derived":
            what = f"{model.derived.card.class_name}, not a causal LM"
        ck.add("serving", "the serving plan needs a transformer with a KV cache (this model is a "
                          f"{what or 'model without one'})", key=True)
        return {}
    out: dict[str, Any] = dict(given)
    for key in ("kv_dtype", "tensor_parallel"):
        if key in out:
            out[key] = dedupe(as_list(out[key]))
    heads, kv = (model.heads, model.kv_heads) if model is not None else (0, 0)
    if heads and kv and ck.clean("serving.tensor_parallel"):
        listed = isinstance(given.get("tensor_parallel"), list)
        for i, t in enumerate(as_list(given.get("tensor_parallel", 1))):
            if heads % t or (kv % t and t % kv):
                ck.add("serving.tensor_parallel" + (f"[{i}]" if listed else ""),
                       f"tensor_parallel {t} must divide the {heads} attention heads and divide or be a multiple "
                       f"of the {kv} KV heads")
    return out


def _config_run(ck: Checker, key: str, given: str, run: dict[str, tuple[Any, str]], block: dict,
                in_grid: dict) -> bool:
    """A config file's run ({axis: (value, its name there)}) into the block: each axis the scenario does not give
    takes the config's value; one it gives must list it, else one line at `key` (False)."""
    for axis, (value, name) in run.items():
        swept = block.get(axis, in_grid.get(axis))
        if swept is None:
            block[axis] = value
        elif value not in as_list(swept):
            ck.add(key, f"{given} sets {name} {value}, which {axis} ({', '.join(str(z) for z in as_list(swept))}) "
                        f"does not list: add it, or leave {axis} out to plan at the config's", key=True)
            return False
    return True


def check_parallel(data: dict, mode: str, model, grid: dict[str, tuple[Any, ...]], ck: Checker) -> dict[str, tuple]:
    """The parallel axes (every one, defaults filled in), swept in the `parallel:` block or among the `grid:` axes
    (issue 4 names them grid axes; not both for one axis), and their rules, each combination checked at load time
    (parallel/layout.py): the problem is reported at the value that breaks it."""
    block = data.get("parallel")
    if "parallel" in data and (not isinstance(block, dict) or not ck.clean("parallel")):
        return {}
    block = block or {}
    in_grid = {a: v for a, v in (data.get("grid") or {}).items()
               if a in C.PARALLEL_AXES} if isinstance(data.get("grid"), dict) else {}
    for a in in_grid:
        if a in block:
            ck.add(f"grid.{a}", f"{a} is swept both here and in parallel:; keep one", key=True)
    if "deepspeed" in block:  # DeepSpeed's settings as the axes its buffers are estimated from (parallel/deepspeed.py)
        block = dict(block)
        ds_given = block.pop("deepspeed")
        clash = [a for a in (C.REDUCE_BUCKET, C.OVERLAP_COMM, C.PREFETCH_BUCKET) if a in block or a in in_grid]
        if clash:
            ck.add("parallel.deepspeed", f"deepspeed sets {', '.join(clash)}; give one or the other", key=True)
            return {}
        try:
            ds_axes, run = DS.resolve(ds_given, ck.base_dir, getattr(model, "hidden", None) or None)
        except (DS.DeepSpeedConfigError, NamedFileError) as e:
            ck.add("parallel.deepspeed", str(e))
            return {}
        if C.OFFLOAD in ds_axes and (C.OFFLOAD in block or C.OFFLOAD in in_grid):  # the config's offload devices
            ck.add("parallel.deepspeed", f"deepspeed's config sets offload ({ds_axes[C.OFFLOAD]}, from "
                                         "offload_optimizer / offload_param); give it there or as offload:, not both",
                   key=True)
            return {}
        if not _config_run(ck, "parallel.deepspeed", ds_given, run, block, in_grid):
            return {}
        block.update(ds_axes)
        if not block and not in_grid:
            return {}
    if "accelerate" in block:  # the run an accelerate config file describes (parallel/accelerate.py)
        block = dict(block)
        acc_given = block.pop("accelerate")
        if "deepspeed" in (data.get("parallel") or {}):
            ck.add("parallel.accelerate", "an accelerate config and a DeepSpeed one: give one of them", key=True)
            return {}
        try:
            run, checkpoints = ACC.read(ck.base_dir / acc_given)
        except (ACC.AccelerateConfigError, NamedFileError) as e:
            ck.add("parallel.accelerate", str(e))
            return {}
        grid_given = data.get("grid") if isinstance(data.get("grid"), dict) else {}
        if checkpoints and "full" not in as_list(grid_given.get(C.CHECKPOINTING, "none")):
            ck.add("parallel.accelerate", f"{acc_given} checkpoints every block (fsdp_activation_checkpointing): "
                                          "give grid.checkpointing: full", key=True)
            return {}
        if not _config_run(ck, "parallel.accelerate", acc_given, run, block, in_grid):
            return {}
    given = {**block, **in_grid}
    if not given:
        return {}
    prefix = {a: "grid" if a in in_grid else "parallel" for a in given}
    home = "parallel" if block else f"grid.{next(iter(in_grid))}"
    out = {a: dedupe(as_list(given[a])) if a in given else (C.PARALLEL_DEFAULTS[a],) for a in C.PARALLEL_AXES}
    for a in C.PARALLEL_AXES:  # YAML booleans stay booleans (_dedupe would keep True as True; 1 is not a bool)
        if a in C.PARALLEL_BOOL_AXES:
            out[a] = tuple(bool(v) for v in out[a])
    if model is None:
        return out
    raw = {a: as_list(given[a]) if a in given else [C.PARALLEL_DEFAULTS[a]] for a in C.PARALLEL_AXES}

    def where(axis: str, value) -> str:
        if axis not in given:
            return home
        path = f"{prefix[axis]}.{axis}"
        if isinstance(given[axis], list):
            return f"{path}[{raw[axis].index(value)}]"
        return path

    seen: set[tuple[str, str]] = set()
    seqs = [(i, s) for i, s in enumerate(as_list((data.get("grid") or {}).get(C.SEQ_LEN, [])))
            if isinstance(s, int)] if ck.clean(f"grid.{C.SEQ_LEN}") else []
    seq_listed = isinstance((data.get("grid") or {}).get(C.SEQ_LEN), list)
    if not all(ck.clean(f"{prefix[a]}.{a}") for a in given):
        return out
    for combo in product(*(out[a] for a in C.PARALLEL_AXES)):
        values = dict(zip(C.PARALLEL_AXES, combo))
        lay = L.Layout(**{L._FIELDS[a]: v for a, v in values.items()})
        problems = [(where(col, values[col]), msg) for col, msg in L.problems(model, lay, mode)]
        for i, s in seqs:
            msg = L.seq_problem(lay, s)
            if msg:
                problems.append((f"grid.{C.SEQ_LEN}" + (f"[{i}]" if seq_listed else ""), msg))
        for key in problems:
            if key not in seen:
                seen.add(key)
                ck.add(*key)
        if len(seen) >= 20:  # a broken sweep repeats itself: the first twenty say what to change
            break
    return out


def accumulation_only(parallel: dict) -> bool:
    """A `parallel:` block (or grid axes) that only accumulates gradients on one GPU: every other axis at its
    default. A plan of one GPU with the gradients kept through the micro-batches answers it (peak.py)."""
    return bool(parallel) and all(v == C.PARALLEL_DEFAULTS[a] for a, vs in parallel.items()
                                  if a not in (C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC) for v in vs)


def sharding_axes(parallel: dict) -> list[str]:
    """The axes of a layout that take it off one GPU (named in refusals)."""
    return [a for a, vs in parallel.items() if a not in (C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC)
            and any(v != C.PARALLEL_DEFAULTS[a] for v in vs)]


def check_zero_grad(data: dict, grid: dict[str, tuple[Any, ...]], parallel: dict, ck: Checker) -> None:
    """Gradients kept between steps (zero_grad 'zeros') are planned on one GPU: not with parallel layouts or the
    cluster search (which plans them)."""
    if "zeros" not in grid.get(C.ZERO_GRAD, ()) or not ck.clean(f"grid.{C.ZERO_GRAD}"):
        return
    if (parallel and not accumulation_only(parallel)) or isinstance(data.get("cluster"), dict):
        ck.add(f"grid.{C.ZERO_GRAD}", "zero_grad 'zeros' is modelled on one GPU, not yet with parallel layouts or the "
                                      "cluster search; use set_to_none (or leave zero_grad out)")


def check_node(data: dict, ck: Checker) -> dict[str, int]:
    given = data.get("node") if isinstance(data.get("node"), dict) else {}
    node = {C.GPUS_PER_NODE: int(given.get("gpus", L.DEFAULT_GPUS_PER_NODE)) if ck.clean("node.gpus")
            else L.DEFAULT_GPUS_PER_NODE, C.HOST_MEMORY: parse_size(L.DEFAULT_HOST_MEMORY)}
    if "host_memory" in given and ck.clean("node.host_memory"):
        try:
            node[C.HOST_MEMORY] = parse_size(given["host_memory"])
        except ValueError as e:
            ck.add("node.host_memory", str(e))
    return node


def check_cluster(data: dict, mode: str, model, grid: dict[str, tuple[Any, ...]], node: dict[str, int], parallel: dict,
             ck: Checker, gpus: tuple[GPUSpec, ...] = ()):
    """The `cluster:` block (cluster.py) as a ClusterSearch; its problems located at their keys."""
    given = data.get("cluster")
    if not isinstance(given, dict) or not ck.clean("cluster"):
        return None
    ft = getattr(model, "finetune", None)
    if ft is not None and ft.adapters:
        ck.add("cluster", f"the cluster search plans full fine-tunes over tensor, pipeline and data parallelism; "
                          f"finetune {ft.method} is planned over data_parallel ranks as FSDP or DeepSpeed ZeRO "
                          "shard it: give those in parallel:", key=True)
        return None
    target = data.get("target") if isinstance(data.get("target"), dict) and ck.clean("target") else {}
    search, problems = parse_cluster(given, grid, target, model, mode, node[C.GPUS_PER_NODE], node[C.HOST_MEMORY],
                                     parallel)
    for path, message in problems:
        ck.add(path, message, key=path == "cluster")
    if search is not None and search.rank_by == "cost_per_token" and ck.clean("gpus"):
        for g in gpus:
            missing = [] if g.price_usd_per_hour is not None else ["price_usd_per_hour"]
            precision = search.fixed.get(C.PRECISION)
            if precision and g.peak_flops(compute_dtype(str(precision))) is None:
                missing.append(f"a catalogued {compute_dtype(str(precision))} peak FLOP/s")
            if missing:
                ck.add("cluster.rank_by", f"ranking by cost per token trained needs {' and '.join(missing)} for "
                                          f"GPU {g.id!r}")
                return None
    return search


def check_throughput(data: dict, mode: str, model, gpus: tuple[GPUSpec, ...], ck: Checker):
    """The `throughput:` block (throughput/options.py); its problems located at their keys."""
    given = data.get("throughput")
    if not isinstance(given, dict) or not ck.clean("throughput"):
        return None
    opts, problems = parse_throughput(given, mode, model, [g.id for g in gpus])
    for path, message in problems:
        ck.add(path, message, key=True)
    return opts
