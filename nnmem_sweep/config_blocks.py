"""The scenario blocks that came with parallelism and serving (issues 4-5): their semantic checks, after the schema.

config.py reads the YAML, checks it against the JSON Schema and builds the Scenario; for the blocks below it calls
the functions of this module, which check what the schema cannot (a value against the model, the mode or another
block) and return the block's values, every problem added to the config._Checker at its key path:

    _serving    serving:   the serving plan (serving.py): infer mode, a transformer, TP dividing the heads
    _parallel   parallel:  the parallel axes, in the block or among the grid axes, each combination checked
                           against parallel/layout.py's rules
    _node       node:      GPUs per node and host memory (the parallel and cluster plans)
    _finetune   finetune:  LoRA / QLoRA adapters (components/finetune.py), folded into the model
    _cluster    cluster:   the cluster search (cluster.py)

config.py imports this module inside config._scenario (this one imports config's checker and helpers).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import columns as C
from .config import _as_list, _Checker, _dedupe, _locate
from .errors import ScenarioError
from .units import parse_size


def _serving(data: dict, mode: str, model, ck: _Checker) -> dict[str, Any]:
    given = data.get("serving")
    if not isinstance(given, dict) or not ck.clean("serving"):
        return {}
    if mode != "infer":
        ck.add("serving", "the serving plan applies to infer mode only (this scenario has mode: train)", key=True)
        return {}
    if model is not None and model.kind != "transformer":
        ck.add("serving", "the serving plan needs a transformer with a KV cache (this model is a "
                          f"{'layer list' if model.kind == 'layers' else 'parameter count'})", key=True)
        return {}
    out: dict[str, Any] = dict(given)
    for key in ("kv_dtype", "tensor_parallel"):
        if key in out:
            out[key] = _dedupe(_as_list(out[key]))
    heads, kv = (model.heads, model.kv_heads) if model is not None and model.kind == "transformer" else (0, 0)
    if heads and kv and ck.clean("serving.tensor_parallel"):
        listed = isinstance(given.get("tensor_parallel"), list)
        for i, t in enumerate(_as_list(given.get("tensor_parallel", 1))):
            if heads % t or (kv % t and t % kv):
                ck.add("serving.tensor_parallel" + (f"[{i}]" if listed else ""),
                       f"tensor_parallel {t} must divide the {heads} attention heads and divide or be a multiple "
                       f"of the {kv} KV heads")
    return out


def _parallel(data: dict, mode: str, model, grid: dict[str, tuple[Any, ...]], ck: _Checker) -> dict[str, tuple]:
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
    given = {**block, **in_grid}
    if not given:
        return {}
    prefix = {a: "grid" if a in in_grid else "parallel" for a in given}
    home = "parallel" if block else f"grid.{next(iter(in_grid))}"
    from itertools import product

    from .parallel import layout as L

    out = {a: _dedupe(_as_list(given[a])) if a in given else (C.PARALLEL_DEFAULTS[a],) for a in C.PARALLEL_AXES}
    for a in C.PARALLEL_AXES:  # YAML booleans stay booleans (_dedupe would keep True as True; 1 is not a bool)
        if a in (C.SEQUENCE_PARALLEL, C.FP32_GRAD_ACCUMULATION):
            out[a] = tuple(bool(v) for v in out[a])
    if model is None:
        return out
    raw = {a: _as_list(given[a]) if a in given else [C.PARALLEL_DEFAULTS[a]] for a in C.PARALLEL_AXES}

    def where(axis: str, value) -> str:
        if axis not in given:
            return home
        path = f"{prefix[axis]}.{axis}"
        if isinstance(given[axis], list):
            return f"{path}[{raw[axis].index(value)}]"
        return path

    seen: set[tuple[str, str]] = set()
    seqs = [(i, s) for i, s in enumerate(_as_list((data.get("grid") or {}).get(C.SEQ_LEN, [])))
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


def _node(data: dict, ck: _Checker) -> dict[str, int]:
    from .parallel import layout as L

    given = data.get("node") if isinstance(data.get("node"), dict) else {}
    node = {C.GPUS_PER_NODE: int(given.get("gpus", L.DEFAULT_GPUS_PER_NODE)) if ck.clean("node.gpus")
            else L.DEFAULT_GPUS_PER_NODE, C.HOST_MEMORY: parse_size(L.DEFAULT_HOST_MEMORY)}
    if "host_memory" in given and ck.clean("node.host_memory"):
        try:
            node[C.HOST_MEMORY] = parse_size(given["host_memory"])
        except ValueError as e:
            ck.add("node.host_memory", str(e))
    return node


def _finetune(data: dict, mode: str, model, parallel: dict, ck: _Checker):
    """The `finetune:` block (components/finetune.py) folded into the model, so every estimator path sees it."""
    if "finetune" not in data or not ck.clean("finetune"):
        return model
    from .components import finetune as F
    from .errors import UsageError as _Usage

    try:
        ft = F.parse_finetune(data["finetune"], lambda p: (ck.b.file, *(_locate(p, ck.b) or (None, None))))
    except ScenarioError as e:
        for p in e.problems:
            ck.add(p.key_path, p.message)
        return model
    if not ft.adapters or model is None:
        return model
    if mode != "train":
        ck.add("finetune", "fine-tuning applies to train mode only (this scenario has mode: infer)", key=True)
        return model
    if parallel:
        ck.add("finetune", f"finetune method {ft.method} is modelled on one GPU only; remove the parallel: block "
                           "or use method: full", key=True)
        return model
    try:
        F.adapter_params(model, ft)  # unsupported model families and unknown targets are one line each
    except (_Usage, ValueError) as e:
        ck.add("finetune", str(e), key=True)
        return model
    return dataclasses.replace(model, finetune=ft)


def _cluster(data: dict, mode: str, model, grid: dict[str, tuple[Any, ...]], node: dict[str, int], parallel: dict,
             ck: _Checker):
    """The `cluster:` block (cluster.py) as a ClusterSearch; its problems located at their keys."""
    given = data.get("cluster")
    if not isinstance(given, dict) or not ck.clean("cluster"):
        return None
    from .cluster import parse_cluster

    target = data.get("target") if isinstance(data.get("target"), dict) and ck.clean("target") else {}
    search, problems = parse_cluster(given, grid, target, model, mode, node[C.GPUS_PER_NODE], node[C.HOST_MEMORY],
                                     parallel)
    for path, message in problems:
        ck.add(path, message, key=path == "cluster")
    return search
