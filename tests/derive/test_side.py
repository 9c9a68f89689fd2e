"""Plans of another transformers release (issue 21, item 1): `runtime: {transformers: ...}` traces the model's
code of that release in a side environment beside the user cache (derive/side.py), prepared offline here from
the machine's own package index.

The release pair checked is transformers 5.17.0 against the installed one: GPT-NeoX under autocast keeps one more
fp32 b·s·h tensor per layer on 5.17 (its rotary embedding hands back fp32 cos/sin; tests/data/truth/FINDINGS.md),
so the two plans of a 2-layer model at b 2 x s 256, hidden 256, differ by exactly 2 · 2 · 256 · 256 · 4 bytes."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")
transformers = pytest.importorskip("transformers", reason="the [measure] extra (transformers) is not installed")

from nnmem_sweep import columns as C  # noqa: E402
from nnmem_sweep.cli import main  # noqa: E402
from nnmem_sweep.derive import DerivationError, side  # noqa: E402

OTHER = "5.17.0"
NEOX = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 256,
        "intermediate_size": 1024, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512,
        "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048, "hidden_act": "gelu",
        "use_parallel_residual": True, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
        "attention_dropout": 0.0, "hidden_dropout": 0.0}

pytestmark = pytest.mark.skipif(transformers.__version__ == OTHER, reason=f"transformers {OTHER} is installed")


def _scenario(tmp: Path, stack: dict[str, str] | None, name: str = "neox") -> Path:
    (tmp / "neox.json").write_text(json.dumps(NEOX))
    runtime = "runtime:\n" + "".join(f"  {k}: \"{v}\"\n" for k, v in stack.items()) if stack else ""
    path = tmp / f"{name}.yaml"
    path.write_text(f"""name: tiny GPT-NeoX
model:
  name: tiny GPT-NeoX
  hf_config: neox.json
mode: train
{runtime}grid:
  batch: [2]
  seq_len: [256]
  precision: [bf16-mixed]
  optimizer: [adamw]
gpus: [t4]
""")
    return path


def test_the_installed_release_needs_no_side_environment():
    assert side.differing({"transformers": transformers.__version__}) == {}
    assert side.differing({"transformers": OTHER}) == {"transformers": OTHER}


def test_unprepared_release_is_one_line_naming_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))
    cfg = _scenario(tmp_path, {"transformers": OTHER})
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"nnmem-sweep stack --transformers {OTHER}" in err
    assert "runtime.transformers" in err and "neox.yaml:7:" in err  # located at the key that names the release
    assert not (tmp_path / "out").exists()


def test_a_malformed_release_is_refused_where_it_is_written(tmp_path, capsys):
    cfg = _scenario(tmp_path, {"transformers": "5.17"})
    assert main(["validate", str(cfg)]) == 2
    assert "runtime.transformers" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A user cache holding the side environment of transformers 5.17.0, installed from the machine's package
    index (no network); skipped where that release is not on the machine."""
    import os

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("NNMEM_SWEEP_CACHE")
    os.environ["NNMEM_SWEEP_CACHE"] = str(cache)
    try:
        side.prepare({"transformers": OTHER}, say=lambda line: None)
    except DerivationError as e:
        pytest.skip(f"transformers {OTHER} cannot be installed offline here: {e}")
    finally:
        if old is None:
            os.environ.pop("NNMEM_SWEEP_CACHE", None)
        else:
            os.environ["NNMEM_SWEEP_CACHE"] = old
    return cache


def test_stack_list_names_what_is_prepared(prepared, monkeypatch, capsys):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(prepared))
    assert main(["stack", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"transformers {OTHER}  ") and out[0].endswith(f"transformers-{OTHER}")


def test_prepared_folder_shadows_only_what_that_release_needs(prepared):
    where = prepared / "stacks" / f"transformers-{OTHER}"
    assert (where / side.READY).is_file()
    names = {p.name.split("-")[0].lower() for p in where.glob("*.dist-info")}
    assert "transformers" in names
    assert not names & {"torch", "numpy", "packaging", "pyyaml", "typing_extensions", "peft"}


def test_the_stated_release_is_the_one_traced(prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(prepared))
    plans = {}
    for label, stack in (("other", {"transformers": OTHER}), ("installed", None)):
        cfg = _scenario(tmp_path, stack, label)
        assert main(["run", str(cfg), "--out", str(tmp_path / label), "-q"]) == 0
        plans[label] = pd.read_csv(tmp_path / label / "results.csv").iloc[0]
    assert f"transformers {OTHER}" in plans["other"][C.PLAN_STACK]
    assert f"transformers {transformers.__version__}" in plans["installed"][C.PLAN_STACK]
    # 5.17: q and k leave the rotary embedding in fp32, one more fp32 b·s·h per layer
    assert plans["other"][C.PEAK_ALLOCATED] - plans["installed"][C.PEAK_ALLOCATED] == 2 * 2 * 256 * 256 * 4


def test_a_hand_modelled_family_hands_over_to_the_stated_code(prepared, tmp_path, monkeypatch):
    from nnmem_sweep.config import load_scenario

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(prepared))
    cfg = tmp_path / "llama.yaml"
    cfg.write_text(f"""name: tiny Llama on {OTHER}
model:
  hf_config: {Path('configs/models/tiny-llama-hf.json').resolve()}
mode: train
runtime:
  transformers: "{OTHER}"
grid:
  batch: [1]
  seq_len: [128]
  precision: [bf16]
  optimizer: [sgd]
gpus: [t4]
""")
    sc = load_scenario(str(cfg))
    assert sc.model.kind == "derived"
    assert sc.model.derived.source.stack == {"transformers": OTHER}


def test_estimate_takes_the_release_and_says_it(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(prepared))
    (tmp_path / "neox.json").write_text(json.dumps(NEOX))
    args = ["estimate", "--model", str(tmp_path / "neox.json"), "--batch", "2", "--seq-len", "256",
            "--precision", "bf16-mixed", "--gpu", "t4"]
    assert main([*args, "--transformers", OTHER]) == 0
    assert f"transformers {OTHER}" in capsys.readouterr().out.split("plan made for: ")[1]
    assert main([*args, "--transformers", "5.17"]) == 2
    assert "--transformers: expected a release such as '5.17.0'" in capsys.readouterr().err


def test_estimate_of_an_unprepared_release_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))
    assert main(["estimate", "--model", "llama-3.2-1b", "--transformers", OTHER]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"prepare it once with: nnmem-sweep stack --transformers {OTHER}" in err


def test_measure_runs_the_stated_release(prepared, tmp_path, monkeypatch):
    """`measure` of a scenario naming another release measures that release's code (the same command in a child
    Python with its side environment first), so the figure and the estimate beside it are of one stack."""
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(prepared))
    got = {}
    for label, stack in (("other", {"transformers": OTHER}), ("installed", None)):
        cfg = _scenario(tmp_path, stack, label)
        assert main(["measure", str(cfg), "--out", str(tmp_path / f"m-{label}")]) == 0
        got[label] = pd.read_csv(tmp_path / f"m-{label}" / "measured.csv").iloc[0]
    diff = got["other"]["measured_peak_bytes"] - got["installed"]["measured_peak_bytes"]
    assert diff == 2 * 2 * 256 * 256 * 4  # MemTracker sees the release's extra fp32 q/k per layer
    for r in got.values():
        assert abs(r["relative_error"]) < 1e-5


def test_a_failed_child_is_quoted_even_while_progress_shows(monkeypatch):
    """With progress the child's stderr is the terminal's, so its one line also comes back on its stdout: the
    error raised here is that line, not a generic 'tracing failed'. A child started from a process that already
    traces one recipe per core is told so (it traces its probes one after another, no pool of its own)."""
    from nnmem_sweep.derive import derivation
    from nnmem_sweep.derive.source import ModelSource

    seen = {}

    class Child:
        returncode = 2

        def __init__(self, cmd, stdin, stdout, stderr, text, env):
            seen["stderr"] = stderr

        def communicate(self, request):
            seen["request"] = json.loads(request)
            return json.dumps({"_error": "gpt_neox: the config names 3 heads for hidden 256"}), None

    monkeypatch.setattr(side, "ready", lambda stack: Path("/nowhere"))
    monkeypatch.setattr(side, "differing", lambda stack: {"transformers": OTHER})
    monkeypatch.setattr(side.subprocess, "Popen", Child)
    monkeypatch.setattr(derivation, "IN_WORKER", [True])
    source = ModelSource.of("hf", NEOX, "neox.json")
    with pytest.raises(DerivationError) as e:
        side.traced(source, ("card",), progress=True)
    assert str(e.value) == "gpt_neox: the config names 3 heads for hidden 256"
    assert seen["stderr"] is None and seen["request"]["in_worker"] is True
    assert side._said("not json") == "" and side._said('{"card": {}}') == ""


def test_a_child_started_for_the_stated_release_plans_as_its_parent(tmp_path, monkeypatch):
    """measure's child imports the stated release, so that release is the installed one there; it was started for
    it (side.SIDE_ENV), and plans a hand-modelled family from that release's code as its parent's `run` does. A
    process not started for it keeps the hand model when the runtime: block names the installed release."""
    from nnmem_sweep.config import load_scenario

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))
    here = transformers.__version__
    cfg = tmp_path / "llama.yaml"
    cfg.write_text(f"""model:
  hf_config: {Path('configs/models/tiny-llama-hf.json').resolve()}
mode: train
runtime:
  transformers: "{here}"
grid: {{batch: [1], seq_len: [128], precision: [bf16], optimizer: [sgd]}}
gpus: [t4]
""")
    from nnmem_sweep import config_model
    from nnmem_sweep.errors import ScenarioError

    traced = []

    def planned_from_code(spec, stack=None):  # stands in for the tracing (seconds): what it is asked is checked
        traced.append(stack)
        raise DerivationError("not traced in this test")

    monkeypatch.setattr(config_model, "architecture_of", planned_from_code)
    monkeypatch.delenv(side.SIDE_ENV, raising=False)
    assert side.stated({"transformers": here}) == {}
    assert load_scenario(str(cfg)).model.kind != "derived" and traced == []
    monkeypatch.setenv(side.SIDE_ENV, json.dumps({"transformers": here}))
    assert side.stated({"transformers": here}) == {"transformers": here}
    assert side.stated({"transformers": OTHER}) == {"transformers": OTHER}  # not installed: stated anyway
    with pytest.raises(ScenarioError, match="not traced in this test"):
        load_scenario(str(cfg))
    assert traced == [{"transformers": here}]
