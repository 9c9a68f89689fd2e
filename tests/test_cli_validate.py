"""`nnmem-sweep validate` and `nnmem-sweep schema`, run as a user runs them: a subprocess, exit codes, stderr."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nnmem_sweep import config, config_schema
from nnmem_sweep.derive.cache import versions

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*.yaml"))
BAD = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "configs" / "bad").glob("*.yaml"))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def expected_lines(rel: str) -> list[str]:
    """What stderr must hold for a bad config: its .expected lines, each prefixed with the path as typed."""
    lines = (ROOT / rel).with_suffix(".expected").read_text(encoding="utf-8").splitlines()
    installed = versions().get("transformers")  # the placeholder of messages naming the installed release
    lines = [line.replace("transformers <installed> ", f"transformers {installed} ") for line in lines]
    return [f"{rel}:{line}" if line[:1].isdigit() else f"{rel}: {line}" for line in lines]


def test_validate_shipped_configs_exits_0() -> None:
    r = cli("validate", *SHIPPED)
    assert (r.returncode, r.stderr) == (0, "")
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == [f"ok  {p}" for p in SHIPPED]


def test_validate_every_bad_config_exits_2_with_exact_located_lines_and_no_traceback() -> None:
    r = cli("validate", *BAD)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [line for rel in BAD for line in expected_lines(rel)]


def test_validate_mixed_good_and_bad_reports_both_and_exits_2() -> None:
    r = cli("validate", "configs/gpt2.yaml", "tests/configs/bad/typo-key.yaml", "no/such/file.yaml")
    assert r.returncode == 2
    assert r.stdout.startswith("ok  configs/gpt2.yaml: ")
    assert r.stderr.splitlines() == expected_lines("tests/configs/bad/typo-key.yaml") + [
        "no/such/file.yaml: no such file"]


def test_schema_command_prints_the_schema() -> None:
    r = cli("schema")
    assert (r.returncode, r.stderr) == (0, "")
    assert json.loads(r.stdout) == config_schema.SCHEMA
    assert r.stdout == config.schema_text()


def test_validate_has_help() -> None:
    r = cli("validate", "--help")
    assert r.returncode == 0 and "file:line:col" in r.stdout
