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


def measure_scenario_cli(config_path: str, out_dir: Path, points: list[str], limit: int) -> int:
    """Measure a scenario's grid points (filtered by AXIS=VALUE) and write out_dir/measured.csv."""
    require_torch()
    from .scenario_points import measure_scenario

    return measure_scenario(config_path, Path(out_dir), list(points or []), int(limit))
