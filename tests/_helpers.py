"""Helpers shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""
from __future__ import annotations

import yaml

from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.scenario import Scenario


def load_edited(base: str, edits, file: str = "fuzz.yaml") -> Scenario | None:
    """Load the YAML text `base` with each (dotted path, value) of `edits` set in it (a parent that is not a
    mapping becomes an empty one): the Scenario, or None after asserting the ScenarioError locates every problem
    in `file`."""
    doc = yaml.safe_load(base)
    for path, value in edits:
        *parents, leaf = path.split(".")
        node = doc
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[leaf] = value
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        return parse_scenario_text(text, file=file)
    except ScenarioError as e:
        assert e.problems and all(str(p).startswith(file) for p in e.problems)
        return None


def sigint_default() -> None:
    """Popen's preexec_fn for a child a test sends SIGINT: Python turns SIGINT into KeyboardInterrupt only where the
    signal is not ignored when it starts, and a shell's background job (`make test &`) starts with it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
