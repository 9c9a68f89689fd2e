"""Command line: argument parsing only; every command calls the library.

Exit codes: 0 ok, 2 bad input (one clean line per problem on stderr, nothing written) or an output folder that is
busy or holds a user's files, 130 interrupted (SIGINT), 143 terminated (SIGTERM); an interrupted command says in
one line what its output folder holds (outputs.py: the previous complete set, untouched).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .errors import NnmemError, ScenarioError


def _default_out(config: str, suffix: str = "") -> Path:
    from .paths import safe_stem

    return Path("reports") / (safe_stem(Path(config).stem) + suffix)


def cmd_validate(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .grid import grid_size

    failed = 0
    for path in args.configs:
        try:
            sc = load_scenario(path)
        except ScenarioError as e:
            failed += 1
            for p in e.problems:
                print(p, file=sys.stderr)
            continue
        print(f"ok  {path}: {sc.name!r}, {grid_size(sc):,} rows")
    return 2 if failed else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .config import schema_text

    sys.stdout.write(schema_text())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_scenario

    sc = load_scenario(args.config)
    out = Path(args.out) if args.out else _default_out(args.config)
    if args.stream:
        from .stream import run_streamed

        streamed = run_streamed(sc, out, chunk_rows=args.chunk_rows, max_rows=args.max_rows,
                                progress=not args.quiet, fmt=args.format)
        written = [streamed.results_path, streamed.max_batch_path, *streamed.plans, streamed.run_json]
    else:
        from .runner import run_to_folder

        written = run_to_folder(sc, out, fmt=args.format, max_rows=args.max_rows, progress=not args.quiet)
    for path in written:
        print(path)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .diff import diff_scenarios, format_diff, scenario_at_revision
    from .errors import UsageError

    if args.against is not None:
        if args.new is not None:
            raise UsageError("give either OLD NEW or CONFIG --against REV, not both")
        old, new = scenario_at_revision(args.old, args.against), load_scenario(args.old)
        labels = (f"{args.old} at {args.against}", f"{args.old} (working tree)")
    else:
        if args.new is None:
            raise UsageError("diff needs two scenario files (OLD NEW) or one with --against REV")
        old, new = load_scenario(args.old), load_scenario(args.new)
        labels = (args.old, args.new)
    print(format_diff(diff_scenarios(old, new, max_rows=args.max_rows), *labels))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from .estimate import estimate_point, format_breakdown, layout_model, resolve_gpu_name, resolve_model_name
    from .replays import point_reserve
    from .scenario import Overheads

    from .derive.side import differing, stack_of
    from .errors import UsageError

    try:
        stack = differing(stack_of({"transformers": args.transformers, "peft": args.peft}))
    except ValueError as e:
        raise UsageError(str(e).replace("runtime.", "--")) from None
    arch = resolve_model_name(args.model, stack)  # a UsageError for an unknown model, as estimate_point would say it
    arch = layout_model(arch, args.mode, _parallel_flag(args.parallel))  # FSDP1's offload: its derived twin

    def point(overheads: Overheads | None = None):
        return estimate_point(
            model=arch, mode=args.mode, batch=args.batch, seq_len=args.seq_len, precision=args.precision,
            optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, checkpointing=args.checkpointing,
            attention=args.attention, gpu=args.gpu, cache_tokens=args.cache_tokens, decode_tokens=args.decode_tokens,
            zero_grad=args.zero_grad, overheads=overheads, parallel=_parallel_flag(args.parallel))

    row = point()  # checks every other argument first
    fraction, note = point_reserve(arch, args.mode, row)
    if fraction is not None:  # the allocator reserve this point's own replay needs, as `run` takes it per recipe
        row = point(Overheads(gpus=(resolve_gpu_name(args.gpu),), replayed_reserve_fraction=fraction))
    print(format_breakdown(row))
    from .runner import model_stack

    print(f"plan made for: {model_stack(arch)}")
    print(f"allocator reserve: {fraction:.1%} of the peak, the least capacity in which this point's own allocation "
          f"sequence completes in the caching-allocator model ({note})" if fraction is not None else
          f"allocator reserve: 5% of the peak assumed ({note})")
    return 0


def _parallel_flag(text: str | None) -> dict[str, str] | None:
    """--parallel 'data_parallel=8,zero_stage=3,fsdp_version=1' as {axis: text} (estimate_point types each value as
    its layout field, parallel/layout.py typed_value)."""
    from .errors import UsageError

    if not text:
        return None
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key or not value:
            raise UsageError(f"--parallel takes axis=value pairs separated by commas, got {part.strip()!r}")
        out[key] = value
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from .report import make_report

    out = Path(args.out) if args.out else _default_out(args.config)
    for written in make_report(args.config, out, max_rows=args.max_rows, progress=not args.quiet,
                               changes_since=args.changes_since):
        print(written)
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from .config import load_scenario
    from .measure import measure_scenario_cli, require_device
    from .outputs import OutputSet

    load_scenario(args.config)  # a bad scenario is refused before any folder is touched
    require_device(args.device)  # and so is a device that is not there
    # its own folder by default: a measurement is a set of its own and must not replace the report's set
    out = Path(args.out) if args.out else _default_out(args.config, "-measured")
    with OutputSet(out, command="measure", config_path=args.config) as s:
        rc = measure_scenario_cli(args.config, s.folder, points=args.point, limit=args.limit, device=args.device,
                                  bisect=not args.no_bisect)
    for path in s.paths:
        print(path)
    return rc


def cmd_truth(args: argparse.Namespace) -> int:
    from .measure import regenerate_truth

    return regenerate_truth(Path(args.write), only=args.only)


def cmd_derive(args: argparse.Namespace) -> int:
    from .ship import derive_gpu_points, derive_preset_cards, derive_scenarios, derive_truth

    if args.presets:
        derive_preset_cards(args.ship)
    if args.gpu_points:
        derive_gpu_points(args.gpu_points, args.ship)
        if not (args.truth or args.configs):
            return 0
    if args.truth:
        return derive_truth(args.truth, args.ship, only=args.only)
    if args.presets and not args.configs:
        return 0
    if not args.configs:
        from .errors import UsageError

        raise UsageError("derive needs scenario files, or --truth DIR")
    return derive_scenarios(args.configs, args.ship, progress=not args.quiet)


def cmd_stack(args: argparse.Namespace) -> int:
    from .derive import DerivationError
    from .derive.side import prepare, stack_of
    from .errors import UsageError

    if args.list:
        from .derive.side import describe, prepared
        from .units import format_bytes

        for stack, where, size in prepared():
            print(f"{describe(stack)}  {format_bytes(size, 'MiB', 1)}  {where}")
        return 0
    try:
        stack = stack_of({k: v for k, v in (("transformers", args.transformers), ("peft", args.peft)) if v})
    except ValueError as e:
        raise UsageError(str(e).replace("runtime.", "--")) from None
    if not stack:
        raise UsageError("stack needs --transformers VERSION and/or --peft VERSION (or --list)")
    try:
        prepare(stack, tuple(args.pip_arg or ()), say=lambda line: print(f"nnmem-sweep: {line}", file=sys.stderr))
    except DerivationError as e:
        raise UsageError(str(e)) from None
    return 0


def cmd_accuracy(args: argparse.Namespace) -> int:
    from .accuracy import accuracy_cli
    from .gpu_compare import summary_lines

    rc = accuracy_cli(Path(args.truth))
    print("\n" + "\n".join(summary_lines()))
    return rc


def cmd_presets(args: argparse.Namespace) -> int:
    from pathlib import Path as _Path

    from .derive import DerivationError, get_card, stored_only
    from .derive.source import ModelSource
    from .models.presets import hand_modelled, load_preset, preset_ids, preset_meta
    from .models.resolve import resolve_model

    for pid in preset_ids():
        meta = preset_meta(pid)
        if hand_modelled(pid):
            arch = load_preset(pid)
            print(f"{pid:<20} {arch.params:>18,}  {arch.name}  [{meta['hf_id']}]")
            continue
        # planned from its own code: the built model's count where its card is stored (shipped or cached)
        spec = resolve_model({"preset": pid}, _Path("."))
        try:
            with stored_only():
                count, how = f"{get_card(ModelSource.of('hf', spec.spec, spec.origin)).params:,}", "derived"
        except DerivationError:
            count = ("~" if meta.get("published_rounding") else "") + f"{meta['published_params']:,}"
            how = "derived (traced on first use: needs the measure extra)"
        print(f"{pid:<20} {count:>18}  {meta['name']}  [{meta['hf_id']}]  {how}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from .catalog.gpus import list_gpus
    from .units import format_bytes

    from .catalog.gpus import catalog_entry

    print(f"{'id':<16} {'PyTorch can use':>15}  {'device total':>12}  name")
    for g in list_gpus():
        e = catalog_entry(g.id)
        device = format_bytes(g.device_total_bytes, "GiB", 2) if g.device_total_bytes else "unknown"
        mark = "" if g.capacity_basis == "torch_total" else " (estimated)"
        print(f"{g.id:<16} {format_bytes(g.memory_bytes, 'GiB', 2):>15}  {device:>12}  {g.name}{mark}")
        print(f"    capacity: {g.source}")
        print(f"    device total: {e.device_total_quote or 'unknown'}"
              + (f" ({e.device_total_url})" if e.device_total_url else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nnmem-sweep",
        description="GPU-memory capacity planner: sweep model x batch x sequence x precision x optimizer x GPU, "
        "in exact bytes, and report which configurations fit.",
    )
    p.add_argument("--version", action="version", version=f"nnmem-sweep {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("validate", help="check scenario files against the schema; report every problem",
                       description="Validate scenario YAML files. Prints one line per problem as file:line:col.")
    s.add_argument("configs", nargs="+", metavar="CONFIG", help="scenario YAML files")
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("schema", help="print the scenario JSON Schema",
                       description="Print the JSON Schema (draft 2020-12) that scenario files are validated against.")
    s.set_defaults(fn=cmd_schema)

    def common_run(s: argparse.ArgumentParser) -> None:
        s.add_argument("config", metavar="CONFIG", help="scenario YAML file")
        s.add_argument("--out", metavar="DIR", help="output folder (default reports/<config stem>/)")
        s.add_argument("--max-rows", type=int, default=20_000_000, metavar="N",
                       help="refuse grids larger than N rows (default 20,000,000)")
        s.add_argument("-q", "--quiet", action="store_true", help="no progress output")

    s = sub.add_parser("run", help="expand the grid and write results.csv and max_batch.csv",
                       description="Compute every combination of the scenario's grid; write results.csv "
                       "(one row per grid point and GPU) and max_batch.csv.")
    common_run(s)
    s.add_argument("--format", choices=["csv", "parquet"], default="csv",
                   help="results and max_batch as CSV (default) or parquet (keeps dtypes; pandas.read_parquet)")
    s.add_argument("--stream", action="store_true",
                   help="estimate and append chunk by chunk (grids too large for memory; same files)")
    s.add_argument("--chunk-rows", type=int, default=500_000, metavar="N",
                   help="with --stream: grid rows per chunk (default 500,000)")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("report", help="run the scenario and render report.html and report.pdf",
                       description="Run the scenario and render the capacity-planning report (HTML and PDF).")
    common_run(s)
    s.add_argument("--changes-since", metavar="REV",
                   help="add a section listing the max-batch cells that changed since CONFIG was as committed at "
                   "git revision REV")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("diff", help="list the max-batch cells that changed between two scenarios",
                       description="Run two scenarios (OLD NEW, or CONFIG as it was at git revision REV against "
                       "the working tree) and list the max-batch cells that changed: fits -> does not fit first, "
                       "then decreases, increases, added and removed cells.")
    s.add_argument("old", metavar="OLD", help="scenario YAML (the old side, or CONFIG with --against)")
    s.add_argument("new", metavar="NEW", nargs="?", help="scenario YAML (the new side)")
    s.add_argument("--against", metavar="REV", help="compare CONFIG at git revision REV with the working tree")
    s.add_argument("--max-rows", type=int, default=20_000_000, metavar="N",
                   help="refuse grids larger than N rows (default 20,000,000)")
    s.set_defaults(fn=cmd_diff)

    s = sub.add_parser("estimate", help="estimate one configuration from flags and print its breakdown",
                       description="Estimate one point, e.g. --model llama-3.1-8b --batch 4 --seq-len 4096 "
                       "--precision bf16-mixed --optimizer adamw --gpu h100-sxm")
    s.add_argument("--model", required=True, help="preset id (see `nnmem-sweep presets`) or path to a config.json")
    s.add_argument("--mode", choices=["train", "infer"], default="train")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--seq-len", type=int, default=2048)
    s.add_argument("--precision", default="bf16-mixed")
    s.add_argument("--optimizer", default="adamw")
    s.add_argument("--optimizer-impl", default="foreach", choices=["foreach", "fused", "forloop"])
    s.add_argument("--checkpointing", default="none", choices=["none", "selective", "full"])
    s.add_argument("--attention", default="flash", choices=["flash", "eager"])
    s.add_argument("--cache-tokens", type=int, default=None, help="inference: prompt tokens in the KV cache")
    s.add_argument("--decode-tokens", type=int, default=None, help="inference: tokens generated")
    s.add_argument("--gpu", default="h100-sxm", help="GPU id from `nnmem-sweep gpus`")
    s.add_argument("--transformers", metavar="VERSION", default=None,
                   help="plan from this transformers release's code (prepared once by `nnmem-sweep stack`)")
    s.add_argument("--peft", metavar="VERSION", default=None, help="the same for peft")
    s.add_argument("--zero-grad", default=None, choices=["set_to_none", "zeros"],
                   help="training: what zero_grad leaves between steps (zeros keeps the gradients; default "
                        "set_to_none)")
    s.add_argument("--parallel", default=None, metavar="AXIS=VALUE,...",
                   help="a parallel layout, its axes as a scenario's parallel: block names them, e.g. "
                        "data_parallel=8,zero_stage=3,fsdp_version=1 (the figures are one rank's)")
    s.set_defaults(fn=cmd_estimate)

    s = sub.add_parser("measure", help="measure real PyTorch allocations for a scenario's points (needs [measure])",
                       description="Build the model with torch/transformers (random init, no download) and measure "
                       "two training steps or one inference request: --device cpu tracks them with MemTracker under "
                       "FakeTensorMode (no memory used, any size); --device cuda runs them on the GPU and records "
                       "max_memory_allocated/reserved, the memory outside PyTorch, the least capacity in which the "
                       "step completes (bisecting the allocator's cap), tokens/s and one allocator snapshot per "
                       "point, each beside the estimate for that GPU; --device cpu-real runs the same real steps "
                       "on the CPU (small models).")
    s.add_argument("config", metavar="CONFIG")
    s.add_argument("--out", metavar="DIR",
                   help="output folder (default reports/<config stem>-measured/, its own set, beside the report's)")
    s.add_argument("--point", action="append", default=[], metavar="AXIS=VALUE",
                   help="keep only grid points with AXIS=VALUE (repeatable)")
    s.add_argument("--limit", type=int, default=50, help="measure at most N points (default 50)")
    s.add_argument("--device", choices=("cpu", "cpu-real", "cuda"), default="cpu",
                   help="cpu: FakeTensorMode (default); cuda: real steps on the GPU; cpu-real: real CPU tensors")
    s.add_argument("--no-bisect", action="store_true",
                   help="--device cuda: skip the least-capacity bisection (a fresh run per probe)")
    s.set_defaults(fn=cmd_measure)

    s = sub.add_parser("truth", help="regenerate the committed measured cases (needs [measure])",
                       description="Re-measure every case in the truth catalog and write one JSON per case.")
    s.add_argument("--write", default="tests/data/truth", metavar="DIR")
    s.add_argument("--only", action="extend", nargs="+", default=[], metavar="CASE", help="only these case ids")
    s.set_defaults(fn=cmd_truth)

    s = sub.add_parser("derive", help="derive the plans of models without a hand model (needs [measure])",
                       description="Trace each model's own code at probe shapes and solve its plan, for every recipe "
                                   "the scenarios (or the measured cases) use; plans are cached, --ship also writes "
                                   "them into the package (nnmem_sweep/models/derived/) for users without torch.")
    s.add_argument("configs", nargs="*", help="scenario files")
    s.add_argument("--truth", metavar="DIR", help="the plans of every measured case in DIR instead")
    s.add_argument("--presets", action="store_true", help="the model card of every preset without a hand model")
    s.add_argument("--gpu-points", metavar="FILE",
                   help="the plans the GPU kit's points (validation/gpu.yaml) are estimated with")
    s.add_argument("--only", nargs="*", metavar="CASE", help="with --truth: only these case ids")
    s.add_argument("--ship", action="store_true", help="also write the plans into nnmem_sweep/models/derived/")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(fn=cmd_derive)

    s = sub.add_parser("stack", help="prepare the code of another transformers / peft release to plan with "
                                     "(runtime.transformers, runtime.peft)",
                       description="pip install --target --no-deps the stated releases into a side environment "
                                   "beside the user cache (<cache>/stacks/), once: a scenario whose runtime: block "
                                   "names them is then planned from their code, traced by a child Python with that "
                                   "folder first on its path. Everything else, torch included, is the installed "
                                   "environment's. Needs the network or a local package index; runs offline after.")
    s.add_argument("--transformers", metavar="VERSION", help="e.g. 5.17.0")
    s.add_argument("--peft", metavar="VERSION", help="e.g. 0.21.0")
    s.add_argument("--list", action="store_true", help="list the prepared releases, their size and folder")
    s.add_argument("--pip-arg", action="append", metavar="ARG",
                   help="one more argument for pip (repeatable), e.g. --pip-arg=--index-url=URL")
    s.set_defaults(fn=cmd_stack)

    s = sub.add_parser("accuracy", help="compare the estimator with the committed measured cases",
                       description="Print case, measured, estimated and error for every committed case.")
    s.add_argument("--truth", default="tests/data/truth", metavar="DIR")
    s.set_defaults(fn=cmd_accuracy)

    s = sub.add_parser("presets", help="list the shipped model presets", description="List the model presets.")
    s.set_defaults(fn=cmd_presets)
    s = sub.add_parser("gpus", help="list the GPU catalog", description="List the GPU catalog with sources.")
    s.set_defaults(fn=cmd_gpus)
    return p


class Terminated(BaseException):
    """SIGTERM, raised where the program is (like KeyboardInterrupt for SIGINT) so that every `with` block, the
    output set's among them, cleans up before the process exits."""


def _terminate(signum, frame) -> None:  # noqa: ANN001 - a signal handler's signature
    raise Terminated


def _line(message: str, exc: BaseException) -> None:
    """One line on stderr: the message, then what the output folder holds (the output set's note), if any."""
    notes = "; ".join(getattr(exc, "__notes__", ()))
    print(f"nnmem-sweep: {message}" + (f"; {notes}" if notes else ""), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    args = build_parser().parse_args(argv)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        if getattr(args, "quiet", False):  # no progress at all, a derivation's (minutes) included
            from .derive import silent

            with silent():
                return args.fn(args)
        return args.fn(args)
    except ScenarioError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        return 2
    except NnmemError as e:
        _line(str(e), e)
        return 2
    except BrokenPipeError:
        # `nnmem-sweep presets | head`: the reader went away; not an error worth a traceback.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        # Disk full, --out not writable, a file where a folder should be: one line, nothing half-written.
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        _line(f"cannot write{where}: {e.strerror or e}", e)
        return 2
    except KeyboardInterrupt as e:
        _line("interrupted (SIGINT)" + ("" if getattr(e, "__notes__", None) else "; nothing was written"), e)
        return 130
    except Terminated as e:
        _line("terminated (SIGTERM)" + ("" if getattr(e, "__notes__", None) else "; nothing was written"), e)
        return 143
    except Exception as e:
        if getattr(e, "__notes__", None):  # the traceback shows the note too; this line says it plainly
            print(f"nnmem-sweep: failed; {'; '.join(e.__notes__)}", file=sys.stderr)
        raise
    finally:
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def entry() -> None:  # pragma: no cover - exercised by the subprocess tests and the benchmarks
    """The `nnmem-sweep` command: main(), then end the process without Python's teardown. Freeing pandas',
    pyarrow's and weasyprint's modules and objects one by one takes 0.2-0.8 s that the user waits for (measured
    after `report`: 0.6-0.8 s) and hands back nothing the kernel does not take back at exit. By then every output
    file is closed and committed (outputs.OutputSet) and any child process joined; stdout and stderr are flushed
    here. An exception main() does not handle still ends the ordinary way, with its traceback."""
    import os

    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
