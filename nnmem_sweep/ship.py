"""`nnmem-sweep derive`: derive (or find) every plan a scenario or the truth catalog needs, optionally shipping
them with the package (models/derived/), so users without torch can plan those models and the tests need not
trace them again. Which plans: exactly the ones the estimator asks for while running the scenario (grid, max
batch and the plans beside it) or estimating each measured case, by both paths where a hand model exists."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from . import columns as C
from .derive import cache, shipping
from .paths import REPO_ROOT


def derive_scenarios(configs: list[str], ship: bool, progress: bool = True) -> int:
    """A scenario of a derived model: every plan its run needs. A hand-modelled preset: its derived twin's plans
    (the allocation sequences replays.py replays for the hand model's allocator reserve)."""
    import dataclasses

    from .config import load_scenario
    from .derive.arch import derived_twin
    from .derive import zero_rows
    from .parallel.layout import deepspeed_layouts
    from .replays import traced_ranks, tracing_deepspeed
    from .runner import run_scenario

    with shipping(cache.SHIPPED) if ship else _nothing():
        for path in configs:
            t0 = time.perf_counter()
            sc = load_scenario(path)
            if sc.parallel and deepspeed_layouts(sc.parallel):  # its ZeRO-1/2 rows' rank steps traced (replays.py)
                if not zero_rows.ready():
                    print(f"{path}: its DeepSpeed rows are traced with DeepSpeed {zero_rows.DEEPSPEED_VERSION}, "
                          f"not installed here ({zero_rows.INSTALL}); what is shipped or cached stands",
                          file=sys.stderr)
                    continue
                if derived_twin(sc.model, allow_deriving=True) is None:
                    print(f"{path}: {sc.model.name} has no derived twin whose config DeepSpeed's engine can run; "
                          "nothing to trace", file=sys.stderr)
                    continue
                with tracing_deepspeed():
                    run_scenario(sc, progress=progress)
                print(f"{path}: every DeepSpeed row's step traced or found ({time.perf_counter() - t0:.1f} s)")
                continue
            if sc.model.kind != "derived":
                # FSDP's layouts: the twin's rank traced (replays.py); other layouts replay nothing
                twin = None if sc.parallel and not traced_ranks(sc) else derived_twin(sc.model, allow_deriving=True)
                if twin is None:
                    print(f"{path}: {sc.model.name} has a hand model and no derived twin to replay; nothing to "
                          "derive", file=sys.stderr)
                    continue
                # the derived path checkpoints whole layers: Megatron's selective recipe stays hand-modelled
                ck = tuple(c for c in sc.grid[C.CHECKPOINTING] if c != "selective")
                if not ck:
                    print(f"{path}: only selective checkpointing, which the derived twin does not plan; nothing to "
                          "derive", file=sys.stderr)
                    continue
                sc = dataclasses.replace(sc, model=twin, grid={**sc.grid, C.CHECKPOINTING: ck})
            run_scenario(sc, progress=progress)
            print(f"{path}: every plan of {sc.model.name} derived or found ({time.perf_counter() - t0:.1f} s)")
    shipped = [p for p in configs if Path(p).resolve().parent == REPO_ROOT / "configs"]
    if ship and shipped:  # the shipped scenarios' replays; a benchmark's grid stays a first run
        ship_replays(shipped, progress)
    return 0


def ship_replays(configs: list[str], progress: bool = True) -> None:
    """The replays each scenario's own run makes (its reserve and bands), and those of the committed GPU-kit runs'
    points (every report's Validation section), shipped beside the plans (replays.SHIPPED_REPLAYS), one group per
    config: a user's first run of a shipped scenario bisects nothing."""
    from . import replays
    from .config import load_scenario
    from .gpu_compare import run_summaries
    from .runner import run_scenario

    runs = Path("validation/gpu")
    jobs = [(Path(path).resolve().relative_to(REPO_ROOT).as_posix(),  # one group per config, however it was named
             lambda path=path: run_scenario(load_scenario(path), progress=progress)) for path in configs]
    jobs += [(str(runs), lambda: run_summaries(runs))] if runs.is_dir() else []
    groups = {}
    # the plans as just derived and shipped (make derive sets NNMEM_SWEEP_REDERIVE=1, under which the GPU-kit points'
    # comparison, reading stored plans only, would find none and ship no replay for them)
    rederive = os.environ.pop("NNMEM_SWEEP_REDERIVE", None)
    try:
        for name, job in jobs:
            t0 = time.perf_counter()
            with replays.shipping() as made:
                job()  # a scenario with its bands, as a report runs it
            groups[name] = dict(sorted(made.items()))
            print(f"{name}: {len(made)} replay(s) to ship ({time.perf_counter() - t0:.1f} s)")
    finally:
        if rederive is not None:
            os.environ["NNMEM_SWEEP_REDERIVE"] = rederive
    replays.ship_groups(groups)
    print(f"{len(replays.shipped_replays())} replays shipped in {replays.SHIPPED_REPLAYS}")


def derive_truth(truth_dir: str | Path, ship: bool, only: list[str] | None = None) -> int:
    """The plans of every measured case: its model's own (families without a hand model), and for the
    hand-modelled HF cases the derived plan too (tests/test_derived_vs_hand.py compares the two paths)."""
    from .accuracy import estimate_case, hand_modelled_case, load_cases

    with shipping(cache.SHIPPED) if ship else _nothing():
        for case in load_cases(truth_dir) + [c for c in load_cases(truth_dir, sharded=True)
                                             if not hand_modelled_case(c)]:  # sharded: the traced ranks' plans
            i = case["inputs"]
            if (only and case["case_id"] not in only) or "layers" in i or \
                    (i.get("finetune") and hand_modelled_case(case)):  # a hand-modelled LoRA has no derived plan
                continue
            t0 = time.perf_counter()
            try:
                estimate_case(case, derived=hand_modelled_case(case))
            except Exception as e:  # noqa: BLE001 - report the case and go on with the others
                print(f"{case['case_id']}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            print(f"{case['case_id']}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def derive_preset_cards(ship: bool) -> int:
    """The model card (parameter tensors, sizes) of every preset without a hand model, and a causal LM's bf16 KV
    cache layout: `nnmem-sweep presets` and the scenarios that name one (a serving plan too) read them without
    torch; the plans of a recipe are traced on first use."""
    from .derive import DerivationError, ModelSource, get_card, get_kv_layout
    from .models.presets import hand_modelled, preset_ids
    from .models.resolve import resolve_model

    with shipping(cache.SHIPPED) if ship else _nothing():
        for pid in preset_ids():
            if hand_modelled(pid):
                continue
            t0 = time.perf_counter()
            spec = resolve_model({"preset": pid}, Path("."))
            try:
                source = ModelSource.of("hf", spec.spec, spec.origin)
                card = get_card(source)
            except Exception as e:  # noqa: BLE001 - report the preset and go on with the others
                print(f"{pid}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            try:
                kv = f", KV cache {len(get_kv_layout(source, 'bf16')['layers'])} layers"
            except DerivationError as e:  # not a causal LM, or a cache the serving plan does not model
                kv = f", no KV layout ({e})"
            print(f"{pid}: {card.params:,} parameters{kv} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


def derive_gpu_points(points_path: str | Path, ship: bool) -> int:
    """The plans the GPU kit's points are estimated with (gpu_compare.py): each point's own, and for a
    hand-modelled preset its derived twin's (the allocation sequence its replayed reserve comes from)."""
    from .catalog.gpus import get_gpu
    from .gpu_compare import estimate_beside
    from . import replays
    from .gpu_points import case_of, load_points
    from .workload.build import case_config

    gpu = get_gpu("h100-sxm")  # the plans do not depend on the GPU; the reserve's replay is of the sequence
    # a DeepSpeed point's rank step traced with DeepSpeed's engine (replays.py), where it is installed; every point's
    # replay shipped as a group of its own, so a GPU run's comparison finds it before a run of it is committed
    with shipping(cache.SHIPPED) if ship else _nothing(), replays.tracing_deepspeed(), replays.shipping() as made:
        for p in load_points(Path(points_path)):
            t0 = time.perf_counter()
            case = case_of(p)
            rec = {"id": p["id"], "case": case, "hf_config": case_config(case)[0], "resume": p.get("resume", False),
                   "point": p}
            try:
                est = estimate_beside(rec, gpu, (), allow_deriving=True)
            except Exception as e:  # noqa: BLE001 - report the point and go on with the others
                print(f"{p['id']}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            print(f"{p['id']}: reserve {est['reserve_note'][:80]} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if ship:
        replays.ship_groups({Path(points_path).as_posix(): dict(sorted(made.items()))})
    return 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
