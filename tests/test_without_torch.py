"""The base install has no torch (it is the [measure] extra): `make report` on a fresh machine installs only the
base. Every shipped scenario validates and runs from its stored plans with torch and transformers unimportable, and
a plain run or validate never imports torch (1.3 s of every command's start: config_model imported it through the
preference step's module)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml"))

BLOCKED = """
import sys
sys.modules["torch"] = None  # an import of either now fails, as on a machine without them
sys.modules["transformers"] = None
from nnmem_sweep.cli import main
code = main(sys.argv[1:])
print("torch imported" if sys.modules.get("torch") else "no torch")
sys.exit(code)
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_every_shipped_scenario_validates_without_torch():
    done = _cli("validate", *CONFIGS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("ok  ") == len(CONFIGS) and done.stdout.rstrip().endswith("no torch")


def test_a_derived_and_a_preference_scenario_run_without_torch(tmp_path):
    for config in ("configs/qwen3.yaml", "configs/qwen3-dpo.yaml"):
        done = _cli("run", config, "--out", str(tmp_path / Path(config).stem), "-q")
        assert done.returncode == 0, (config, done.stderr[-2000:])
        assert (tmp_path / Path(config).stem / "results.csv").is_file()


def test_validate_imports_no_torch_where_torch_is_installed():
    probe = ("import sys; from nnmem_sweep.cli import main; main(['validate', 'configs/llama.yaml']); "
             "print('torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "False False", done.stderr[-1000:]
