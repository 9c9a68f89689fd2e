"""Any model, safely (issue 24): a derivation is bounded (events per trace, seconds, memory) and ends in one line
past its budget; a step that loops over the tokens (a state-space model's scan on the CPU) is refused in one line
before any long probe; and a run stopped by a real signal while a probe is traced in a forked worker, between a
derivation's traces, or during the allocator replays leaves nothing: the previous output set untouched, no lock,
no staging folder, no worker's traceback, exit 130/143 (the output stages themselves: tests/test_output_sets.py).
Each run gets an empty user cache (NNMEM_SWEEP_CACHE), so it derives."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep.testhook import PAUSE_ENV, RESUME_ENV  # noqa: E402
from _helpers import sigint_default  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"


def scenario(folder: Path, model: str, attention: str = "flash") -> Path:
    shutil.copy(MODELS / model, folder / "config.json")
    path = folder / "s.yaml"
    path.write_text("model: {hf_config: config.json}\nmode: train\n"
                    f"grid: {{batch: [1, 2], seq_len: [128, 256], precision: bf16, optimizer: adamw, "
                    f"attention: {attention}}}\ngpus: [h100-sxm]\n")
    return path


def cli(tmp: Path, *args: str, pause: str | None = None, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NNMEM_SWEEP_CACHE": str(tmp / "cache"), **env_extra}
    for k in (PAUSE_ENV, RESUME_ENV):
        env.pop(k, None)
    if pause:
        env[PAUSE_ENV], env[RESUME_ENV] = pause, "/nonexistent"
    return subprocess.Popen([sys.executable, "-m", "nnmem_sweep.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)


def one_line_refusal(proc: subprocess.Popen, out: Path) -> str:
    assert proc.wait(120) == 2
    err = proc.stderr.read()
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and "deriving" not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists() and sorted(os.listdir(out.parent)) == ["cache", "config.json", "s.yaml"]
    return lines[0]


def test_a_step_that_loops_over_the_tokens_is_refused_before_a_long_probe(tmp_path):
    line = one_line_refusal(cli(tmp_path, "run", str(scenario(tmp_path, "tiny-mamba.json", "eager")), "--out",
                                str(tmp_path / "out")), tmp_path / "out")
    assert "MambaForCausalLM" in line and "loop over the tokens" in line and "not planned" in line


@pytest.mark.parametrize("env, words", [
    ({"NNMEM_SWEEP_DERIVE_EVENTS": "50"}, "past its budget of 50 storage events in one traced step"),
    ({"NNMEM_SWEEP_DERIVE_SECONDS": "0"}, "past its budget of 0 s for one recipe"),
    ({"NNMEM_SWEEP_DERIVE_MEMORY": "1 MiB"}, "past its budget of 1.0 MiB of memory"),
])
def test_past_a_budget_is_one_line_naming_it_and_how_to_allow_more(tmp_path, env, words):
    line = one_line_refusal(cli(tmp_path, "run", str(scenario(tmp_path, "tiny-qwen3.json")), "--out",
                                str(tmp_path / "out"), **env), tmp_path / "out")
    assert words in line and f"allow more with {next(iter(env))}" in line and "tracing batch" in line


def _wait_paused(proc: subprocess.Popen, stage: str) -> None:
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if f"paused at {stage}" in line:
            return
    raise AssertionError(f"exited {proc.wait()} before pausing at {stage}: {''.join(seen)}")


@pytest.mark.parametrize("stage, model, sig, code", [
    ("trace", "tiny-qwen3.json", signal.SIGTERM, 143),  # a probe traced in a forked worker
    ("solve", "tiny-qwen3.json", signal.SIGINT, 130),  # between a derivation's traces
    ("replay", "tiny-qwen3.json", signal.SIGTERM, 143),  # the allocator replays of the derived plans
])
def test_a_signal_while_deriving_or_replaying_leaves_nothing(tmp_path, stage, model, sig, code):
    out = tmp_path / "out"
    proc = cli(tmp_path, "report", str(scenario(tmp_path, model)), "--out", str(out), pause=stage)
    _wait_paused(proc, stage)
    proc.send_signal(sig)
    # communicate, not wait: the stderr pipe is drained while it shuts down (a full pipe would block its last lines)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    what = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (SIGINT)"
    assert err.strip().splitlines()[-1] == f"nnmem-sweep: {what}; nothing was written to {out}"
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["cache", "config.json", "s.yaml"]


def test_a_remote_code_config_is_refused_in_one_line_and_never_run(tmp_path):
    """A config.json whose class lives in the model's own repository (auto_map, trust_remote_code): transformers
    does not provide it, and its code is never fetched or run."""
    (tmp_path / "config.json").write_text(
        '{"architectures": ["MyCustomForCausalLM"], "model_type": "mycustom", "hidden_size": 512, '
        '"auto_map": {"AutoModelForCausalLM": "modeling_my.MyCustomForCausalLM"}}')
    (tmp_path / "s.yaml").write_text("model: {hf_config: config.json}\nmode: train\n"
                                     "grid: {batch: 1, seq_len: 512, precision: bf16, optimizer: adamw}\n"
                                     "gpus: [h100-sxm]\n")
    proc = cli(tmp_path, "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"))
    assert proc.wait(120) == 2
    lines = proc.stderr.read().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / 's.yaml'}:1:")
    assert "no model class 'MyCustomForCausalLM'" in lines[0] and "no remote code is run" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_config_the_models_code_cannot_run_is_one_line(tmp_path):
    """Issue 21: a T5 config.json without decoder_start_token_id builds, then fails in the model's own forward; the
    run ends in one line naming the model, the config and what transformers said, exit 2, nothing written."""
    (tmp_path / "config.json").write_text(
        '{"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 64, "d_ff": 128, '
        '"d_kv": 16, "num_heads": 4, "num_layers": 2, "vocab_size": 256}')
    (tmp_path / "s.yaml").write_text("model: {hf_config: config.json}\nmode: train\n"
                                     "grid: {batch: 1, seq_len: 128, precision: bf16, optimizer: adamw}\n"
                                     "gpus: [h100-sxm]\n")
    line = one_line_refusal(cli(tmp_path, "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")),
                            tmp_path / "out")
    assert line.startswith("nnmem-sweep: T5ForConditionalGeneration (config.json): ")
    assert "'T5Config' object has no attribute 'decoder_start_token_id'" in line
