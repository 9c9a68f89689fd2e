"""Ground truth: what PyTorch really allocates for a configuration (needs the [measure] extra: torch, transformers).

Importing this package needs no torch; the entry points check for it and say which extra to install.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

_EXTRA = ("measuring needs the [measure] extra: pip install -e '.[measure]' "
          "(or `make install-measure`, which pins the CPU wheel of torch first)")


def require_torch() -> None:
    """Raise a one-line UsageError naming the extra when torch or transformers is missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise UsageError(f"{_EXTRA}; missing: {e.name}") from None


def regenerate_truth(out_dir: Path, only: list[str]) -> int:
    """Measure every case of the truth catalog (or `only` these ids); write one JSON per case into out_dir."""
    require_torch()
    from .truth import regenerate

    return regenerate(Path(out_dir), list(only or []))


def require_device(device: str) -> None:
    """A one-line UsageError where `device` is "cuda" and torch sees no CUDA device."""
    require_torch()
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"measure --device cuda: no CUDA device is visible to torch {torch.__version__} "
                         f"(CUDA build: {torch.version.cuda or 'none'}); run it on the GPU, or use --device cpu "
                         "(FakeTensorMode) or cpu-real (real CPU tensors, small models)")


def measure_scenario_cli(config_path: str, out_dir: Path, points: list[str], limit: int, device: str = "cpu",
                         bisect: bool = True) -> int:
    """Measure a scenario's grid points (filtered by AXIS=VALUE) and write out_dir/measured.csv. A scenario whose
    `runtime:` names transformers / peft releases other than the installed ones is measured with those: the same
    command runs again in a child Python with their side environment first on its path (derive/side.py)."""
    require_device(device)
    stack = _stated_stack(config_path)
    if stack:
        return _in_side_environment(stack, config_path, out_dir, points, limit, device, bisect)
    from .scenario_points import measure_scenario

    return measure_scenario(config_path, Path(out_dir), list(points or []), int(limit), device, bisect)


def _stated_stack(config_path: str) -> dict[str, str]:
    """The releases the scenario's runtime: block names that are not the installed ones (a file that cannot be
    read is left to load_scenario's own one-line error)."""
    from ..config import read_document
    from ..derive.side import stated
    from ..errors import ScenarioError

    try:
        doc = read_document(config_path)  # within load_scenario's limits: size, encoding, aliases
    except ScenarioError:
        return {}
    return stated(doc.get("runtime"))


def _in_side_environment(stack: dict[str, str], config_path: str, out_dir: Path, points: list[str], limit: int,
                         device: str, bisect: bool) -> int:
    import json
    import subprocess
    import sys

    from ..derive import DerivationError
    from ..derive.side import child_env, describe, ready

    try:
        where = ready(stack)
    except DerivationError as e:
        raise UsageError(f"{config_path}: runtime: {e}") from None
    print(f"nnmem-sweep: measuring with {describe(stack)} ({where})", file=sys.stderr, flush=True)
    # the same measure_scenario, writing measured.csv into the same (staging) folder (scenario_points.child)
    args = json.dumps([str(config_path), str(out_dir), list(points or []), int(limit), device, bool(bisect)])
    return subprocess.run([sys.executable, "-m", "nnmem_sweep.measure.scenario_points", args],
                          env=child_env(where, stack)).returncode
