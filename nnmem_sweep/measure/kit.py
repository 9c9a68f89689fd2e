"""The GPU kit (`make gpu-check`): a shipped list of points (validation/gpu.yaml) measured on the GPU at hand with
real tensors (measure/real.py), each chosen to test a claim of the estimate that no GPU had confirmed.

    python -m nnmem_sweep.measure.kit [POINTS.yaml ...] [--out DIR] [--budget SECONDS] [--only ID ...] [--dry-run]

It needs only what a CUDA image holds (torch, transformers, peft, numpy, pandas, pyyaml): no jsonschema, weasyprint
or bitsandbytes, no network, nothing installed (PYTHONPATH=. is enough). It prints its progress and writes as it
goes, so a stopped run keeps every point it finished:
  OUT/env.json         the GPU, driver, CUDA, torch, transformers and peft versions, the commit, the date
  OUT/results.jsonl    one line per point, appended (and synced) when the point ends: the point as written, the
                       figures of real.measure_point, the seconds it took
  OUT/snapshots.zip    per point the allocator snapshot of the measured run and of one run at its least capacity
                       (<id>-capped.pickle) (torch.cuda.memory._dump_snapshot, no stack traces)
OUT defaults to validation/gpu/<gpu>/<date>/ (<date>-<name> for another points file: gpu-fsdp.yaml's <date>-fsdp).
Several points files run one after the other within the one budget (a lent GPU's minutes are few: one command
measures them all), each into its own OUT (with --out DIR, DIR/<name>). A point with an `allocator:` setting
(PYTORCH_CUDA_ALLOC_CONF, read when CUDA starts) runs in a child process of its own, as does a sharded point; the
capped runs of a DeepSpeed or FSDP1 point's bisection each run in one of their own too (fresh_probe: their runs
outlive themselves). A bisection's first probes are at the allocator model's need on the measured run's own
recording and a step below it (real.model_guess): where the model is right, two runs. The points run in the files'
order until --budget seconds have passed; the rest are listed as not run. The comparison with the estimate is made
afterwards, on any machine, by `make accuracy` (gpu_compare.py).

--dry-run runs every point on the CPU at a tiny size (2 layers, width 64; images of 32x32; batch 2, sequence 32)
with the host meter: it checks the kit, not memory (`make test` runs it).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from ..gpu_points import DEFAULT_POINTS, OTHERS_ENV, KitError, case_of, load_points, others_bytes

PROBE_OOM = 3  # fresh_probe's exit code for a capped run that ran out of memory
# the dry run's widths: set always, and where the config has the key
TINY_HF = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "vocab_size": 512}
TINY_IF_PRESENT = {"num_key_value_heads": 2, "head_dim": 16, "max_window_layers": 2}


def tiny(case: dict[str, Any]) -> dict[str, Any]:
    """The dry run's case: the same model family and recipe at a size a CPU runs in a second."""
    from ..workload.build import model_config

    out = dict(case, batch=2)
    if "module" in case:
        return dict(out, input_shape=[case["input_shape"][0], 32, 32])
    cfg, _ = model_config(case)
    out.pop("model", None)
    out["hf_config"] = {**cfg, **TINY_HF, **{k: v for k, v in TINY_IF_PRESENT.items() if k in cfg}}
    out["seq_len"] = 32 if case.get("seq_len") else 0
    out["decode_tokens"] = min(int(case.get("decode_tokens") or 0), 2)
    return out


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env: dict[str, Any] = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "cuda": torch.version.cuda, "device": device,
                           "host": platform.machine(), "cpus": os.cpu_count(),
                           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                           "commit": _git_commit(), "code_sha256": code_digest()}
    try:
        import peft

        env["peft"] = peft.__version__
    except ImportError:
        env["peft"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update({"gpu": p.name, "compute_capability": f"{p.major}.{p.minor}",
                    "total_memory": int(p.total_memory), "mem_get_info_total": int(torch.cuda.mem_get_info()[1]),
                    "multiprocessors": p.multi_processor_count, "nvidia_smi": _nvidia_smi()})
    return env


def code_digest(root: Path | None = None) -> str:
    """sha256 over the package's Python sources (path and bytes, sorted): which code ran, where the checkout's git
    metadata cannot say (a copy of a working tree with uncommitted changes, or with another checkout's .git: the
    device machine's copies carried the session start's). `python -c 'from nnmem_sweep.measure.kit import
    code_digest; print(code_digest())'` at a commit gives the same digest for the same code."""
    from ..paths import sources_digest

    return sources_digest(root or Path(__file__).resolve().parents[1])


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:  # the figures stand without it
        return f"unavailable: {e}"


def gpu_folder(env: dict[str, Any]) -> Path:
    from ..paths import safe_stem

    name = safe_stem(str(env.get("gpu") or env["device"]).lower().replace(" ", "-"))
    return Path("validation/gpu") / name / env["date"][:10]


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _add_to_zip(zpath: Path, name: str, src: Path) -> None:
    """Add `src` as `name` to the zip by writing a new one beside it and renaming: a stop leaves the old one."""
    fd, tmp = tempfile.mkstemp(prefix=".snapshots.", suffix=".zip", dir=zpath.parent)
    os.close(fd)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        if zpath.exists():
            with zipfile.ZipFile(zpath) as old:
                for item in old.infolist():
                    if item.filename != name:
                        out.writestr(item, old.read(item.filename))
        out.write(src, name)
    os.replace(tmp, zpath)


def fresh_probe(point: dict[str, Any], points: Path, dry: bool):  # noqa: ANN201 - real.Probe
    """A capped run of the point in a process of its own (`--probe CAP`): DeepSpeed's engine outlives its run in a
    process (its hooks and module-level lists hold it; workload/zero_engine.py destroy), so the probes of one
    process would each start on top of the runs before them (the H100's first DeepSpeed run, 2026-11-27)."""
    def probe(cap: int, record: Path | None = None) -> bool:
        cmd = _kit_command(points, point, dry, "--probe", str(cap), *(["--record", str(record)] if record else []))
        code = subprocess.run(cmd, check=False).returncode
        if code not in (0, PROBE_OOM):
            raise RuntimeError(f"the run capped at {cap:,} B failed (exit code {code})")
        return code == 0
    return probe


def outlives_its_run(point: dict[str, Any]) -> bool:
    """A point whose run leaves tensors behind in its process: DeepSpeed's engine, and FSDP1 (on the H100,
    2026-11-28, each Llama 3.2 1B run left 1.3-1.8 GB allocated, and the points after it peaked on top of it)."""
    from ..workload import fsdp

    return bool(point.get("deepspeed")) or (bool(point.get("fsdp")) and fsdp.version(point["fsdp"]) == 1)


def own_process(point: dict[str, Any]) -> bool:
    """A point the kit runs in a child process of its own: a sharded one (DeepSpeed keeps its first process group
    for the process; an FSDP1 run outlives itself, and an FSDP2 point after it would start on top of it)."""
    return bool(point.get("deepspeed") or point.get("fsdp"))


def run_point(point: dict[str, Any], device: str, out: Path, deadline: float, dry: bool,
              say, points: Path | None = None) -> dict[str, Any]:  # noqa: ANN001
    """Measure one point here (this process); its record. The capped runs of a point that outlives its run are
    processes of their own (fresh_probe; `points`, the file it is in, names it to them)."""
    from ..workload.build import case_config
    from .real import capped_path, measure_point

    case = case_of(point)
    run_case = tiny(case) if dry else case
    rec: dict[str, Any] = {"id": point["id"], "why": point.get("why", ""), "point": point, "case": run_case,
                           "hf_config": case_config(run_case)[0]}
    t0 = time.monotonic()
    snap = None if (dry or device != "cuda") else Path(tempfile.mkdtemp(prefix="nnmem-snap-")) / f"{point['id']}.pickle"
    try:
        rec.update(measure_point(run_case, device, resume=bool(point.get("resume")),
                                 bisect=bool(point.get("bisect", True)) and case["mode"] == "train",
                                 timing_steps=int(point.get("timing_steps", 1 if dry else 2)),
                                 resolution=0.05 if dry else 0.005, snapshot=snap, deadline=deadline, say=say,
                                 probe=fresh_probe(point, points, dry) if outlives_its_run(point) and points
                                 else None))
    except Exception as e:  # noqa: BLE001 - one point the device cannot run must not lose the others
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    rec["seconds"] = round(time.monotonic() - t0, 1)
    if others_bytes() is not None:  # taken off outside_bytes (meters.CudaMeter.outside_bytes)
        rec["others_bytes"] = others_bytes()
    for path in () if snap is None else (snap, capped_path(snap)):  # the measured run's, the capped run's
        if path.exists():
            _add_to_zip(out / "snapshots.zip", path.name, path)
            path.unlink()
    return rec


def _held_on_gpu() -> int:
    """What the GPU holds now, this process's context included, its cache emptied first: the child's measure of
    the memory outside PyTorch takes it off (mem_get_info counts every process on the device). 0 on the CPU."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def _child(point: dict[str, Any], points: Path, args: argparse.Namespace, out: Path, left: float) -> None:
    """Run one point in a child process with its allocator setting (read once, when CUDA starts)."""
    env = dict(os.environ, **{OTHERS_ENV: str(_held_on_gpu())})
    if point.get("allocator"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = str(point["allocator"])
    subprocess.run(_kit_command(points, point, args.dry_run, "--out", str(out), "--budget", str(max(int(left), 1))),
                   env=env, check=False)


def _kit_command(points: Path, point: dict[str, Any], dry: bool, *extra: str) -> list[str]:
    """This kit as a child process for one point of `points` (_child's run of it, fresh_probe's capped runs)."""
    return [sys.executable, "-m", "nnmem_sweep.measure.kit", str(points), "--only", point["id"], "--child",
            *(["--dry-run"] if dry else []), *extra]


def _probe(args: argparse.Namespace) -> int:
    """One capped run of the one point --only names (fresh_probe): exit 0 where it completed, PROBE_OOM where it ran
    out of memory, 1 where it failed otherwise."""
    from .real import capped_run

    (point,) = [p for path in args.points for p in load_points(path) if p["id"] in args.only]
    case = tiny(case_of(point)) if args.dry_run else case_of(point)
    try:
        return 0 if capped_run(case, "cpu" if args.dry_run else "cuda", args.probe, record=args.record) else PROBE_OOM
    except Exception as e:  # noqa: BLE001 - said, and the bisection that asked stops
        print(f"gpu-check: {point['id']}: the run capped at {args.probe:,} B failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nnmem_sweep.measure.kit", description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="*", type=Path, default=[DEFAULT_POINTS],
                    help="points files, run in this order within one budget (default validation/gpu.yaml)")
    ap.add_argument("--out", type=Path, help="output folder (default validation/gpu/<gpu>/<date>[-<file>]/; with "
                    "several points files, one folder each under it)")
    ap.add_argument("--budget", type=float, default=420, help="seconds for the whole kit (default 420)")
    ap.add_argument("--only", nargs="*", default=[], help="run only these point ids")
    ap.add_argument("--dry-run", action="store_true", help="tiny models on the CPU: checks the kit, not memory")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe", type=int, metavar="CAP", help=argparse.SUPPRESS)  # fresh_probe's capped run
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)  # and where its allocator history goes
    args = ap.parse_args(argv)
    if args.probe is not None:
        return _probe(args)
    start = time.monotonic()
    try:
        files = [(path, load_points(path)) for path in dict.fromkeys(args.points)]
    except KitError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.only) - {p["id"] for _, points in files for p in points})
    if unknown:
        print(f"gpu-check: --only {', '.join(unknown)}: no such point in {', '.join(map(str, args.points))}",
              file=sys.stderr)
        return 2
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device is visible to torch {torch.__version__} (CUDA build: "
              f"{torch.version.cuda or 'none'}); `make gpu-check DRY=1` checks the kit on the CPU", file=sys.stderr)
        return 2
    # a child (one point under its allocator setting) takes the parent's env.json: the same run, no second probe
    shared = args.out / "env.json" if (args.child and args.out is not None) else None
    env = json.loads(shared.read_text()) if shared is not None and shared.exists() else environment(device)
    root = args.out or (Path(tempfile.mkdtemp(prefix="gpu-check-dry-")) if args.dry_run else None)
    deadline = start + args.budget
    if args.child:
        env["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    from .real import frozen_heap

    outs = []
    for path, points in files:
        out = out_folder(path, env, root, several=len(files) > 1)
        out.mkdir(parents=True, exist_ok=True)
        todo = [p for p in points if not args.only or p["id"] in args.only]
        if not args.child:
            (out / "env.json").write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")
            print(f"gpu-check: {env.get('gpu', 'cpu (dry run)')}, torch {env['torch']}, transformers "
                  f"{env['transformers']}, CUDA {env['cuda']}; {path}: {len(todo)} points, "
                  f"{max(deadline - time.monotonic(), 0):.0f} s of the budget left -> {out}", flush=True)
        with frozen_heap():
            _run_points(todo, path, args, device, env, out, deadline)
        outs.append(out)
    if not args.child:
        print(f"gpu-check: done in {time.monotonic() - start:.0f} s; results in {', '.join(map(str, outs))}",
              flush=True)
    return 0


def out_folder(points: Path, env: dict[str, Any], root: Path | None, several: bool) -> Path:
    """Where a points file's results go: under --out (`root`), the folder itself, or with several files one folder
    per file (its name); by default validation/gpu/<gpu>/<date>/ for validation/gpu.yaml, <date>-<name> for another
    file (validation/gpu-fsdp.yaml: <date>-fsdp), so two files run on one day keep apart."""
    name = Path(points).stem
    name = name[len("gpu-"):] if name.startswith("gpu-") else name
    if root is not None:
        return root / name if several else root
    folder = gpu_folder(env)
    return folder if Path(points).stem == DEFAULT_POINTS.stem else folder.with_name(f"{folder.name}-{name}")


def _run_points(todo: list[dict[str, Any]], points: Path, args: argparse.Namespace, device: str,
                env: dict[str, Any], out: Path, deadline: float) -> None:
    for n, point in enumerate(todo, 1):
        left = deadline - time.monotonic()
        tag = f"[{n}/{len(todo)}] {point['id']}"
        if left <= 0:
            print(f"gpu-check: {tag}: not run, the budget is spent", flush=True)
            _append(out / "results.jsonl", {"id": point["id"], "error": "not run: the budget was spent",
                                            "point": point, "env": env})
            continue
        conf = str(point.get("allocator") or "")
        if conf and os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") != conf:
            print(f"gpu-check: {tag}: in a child process with PYTORCH_CUDA_ALLOC_CONF={conf}", flush=True)
            _child(point, points, args, out, left)
            continue
        if own_process(point) and not args.child:
            print(f"gpu-check: {tag}: in a child process ({'DeepSpeed' if point.get('deepspeed') else 'FSDP'})",
                  flush=True)
            _child(point, points, args, out, left)
            continue
        print(f"gpu-check: {tag}: {point.get('why', '')}", flush=True)
        rec = run_point(point, device, out, deadline, args.dry_run,
                        lambda line, tag=tag: print(f"gpu-check: {tag}: {line}", flush=True), points)
        rec["env"] = env
        _append(out / "results.jsonl", rec)
        print(f"gpu-check: {tag}: {_summary(rec)} ({rec['seconds']} s; {deadline - time.monotonic():.0f} s left)",
              flush=True)


def _summary(rec: dict[str, Any]) -> str:
    if "error" in rec:
        return f"FAILED {rec['error']}"
    gib = 2 ** 30
    s = f"peak allocated {rec['max_allocated'] / gib:.2f} GiB, reserved {rec['max_reserved'] / gib:.2f} GiB"
    if rec.get("least_capacity"):
        s += f", least capacity {rec['least_capacity'] / gib:.2f} GiB"
    if rec.get("outside_bytes") is not None:
        s += f", outside PyTorch {rec['outside_bytes'] / 2 ** 20:.0f} MiB"
    return s


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
