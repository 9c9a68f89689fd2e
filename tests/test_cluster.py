"""How many GPUs (issue 4, nnmem_sweep/cluster.py): the search, its choice rule, the prices, the scenario block."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import cluster as K
from nnmem_sweep import columns as C
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.estimate import estimate_frame
from nnmem_sweep.runner import run_scenario

PSI = 7_500_000_000  # ZeRO (Rajbhandari et al. 2019) Table 1's model: 7.5B parameters, K = 12 (mixed-precision Adam)


def scenario(gpus: str, cluster: str = "{global_batch: 32, micro_batch: [1]}", model: str | None = None,
             grid: str = "{batch: 1, precision: bf16-master, optimizer: adam}") -> object:
    model = model or f"{{params: {PSI}, activation_elements_per_sample: 0}}"
    return parse_scenario_text(textwrap.dedent(f"""\
        name: cluster test
        model: {model}
        mode: train
        grid: {grid}
        gpus: {gpus}
        overheads: {{cuda_context: 0 B, cublas_workspace: 0 B, allocator_reserve: 0}}
        headroom: 0
        cluster: {cluster}
        """))


TWO_TYPES = ("[{name: small, memory: 40 GB, price_usd_per_hour: 1.0}, "
             "{name: big, memory: 80 GB, price_usd_per_hour: 3.0}]")


def test_zero_table_1_model_states_pick_the_fewest_gpus_and_the_lowest_stage_that_fits():
    """Per-GPU model states of ZeRO Table 1's 7.5B model (bf16-master + Adam, 16 B/param), no activations:
    stage 1: 4Ψ + 12Ψ/N, stage 2: 2Ψ + 14Ψ/N, stage 3: 16Ψ/N + the gathered parameters (a params model does not
    say its largest layer, so the whole model counts as one unit: 2 copies × 2 B × Ψ = 30 GB).
    On 40 GB:  N=4: stage 3 30 + 30 = 60 GB, stage 2 15 + 26.25 = 41.25 GB: nothing fits.
               N=8: stage 1 30 + 11.25 = 41.25 GB no; stage 2 15 + 13.125 = 28.125 GB fits.
               N=16: stage 1 30 + 5.625 = 35.625 GB; N=32: stage 1 30 + 2.8125 = 32.8125 GB.
    On 80 GB:  N=1: 120 GB (stage 0..2) or 120 + 30 (stage 3) no; N=2: stage 1 30 + 45 = 75 GB fits."""
    sc = scenario(TWO_TYPES)
    out = run_scenario(sc).cluster
    got = [(r[C.GPU], r[K.GPUS], r[C.ZERO_STAGE], r[C.TOTAL]) for r in out.to_dict("records")]
    assert got[:4] == [("small", 8, 2, 28_125_000_000), ("small", 16, 1, 35_625_000_000),
                       ("small", 32, 1, 32_812_500_000), ("big", 2, 1, 75_000_000_000)]
    assert [g[1] for g in got if g[0] == "big"] == [2, 4, 8, 16, 32]  # dp divides global_batch / micro-batch
    # accumulation steps: 32 sequences / (micro-batch 1 x dp)
    assert out[K.ACCUMULATION].tolist() == [32 // n for n in out[K.GPUS]]


def test_cheapest_option_is_recommended_when_every_gpu_has_a_price():
    # small: 8 x $1.00 = $8.00/h; big: 2 x $3.00 = $6.00/h
    out = run_scenario(scenario(TWO_TYPES)).cluster
    rec = out[out[K.RECOMMENDED]]
    assert len(rec) == 1 and rec.iloc[0][C.GPU] == "big" and rec.iloc[0][K.COST_PER_HOUR] == 6.0
    line = K.recommendation(out, {"big": "Big GPU"}, lambda b: f"{b / 1e9:.2f} GB")
    assert line.startswith("Cheapest: 2 × Big GPU ($6.00 per hour) with TP 1, PP 1, DP 2, ZeRO 1")
    # cheaper small GPUs flip it: 8 x $0.70 = $5.60/h
    out = run_scenario(scenario(TWO_TYPES.replace("1.0}", "0.7}"))).cluster
    assert out[out[K.RECOMMENDED]][C.GPU].tolist() == ["small"]


def test_without_prices_each_type_gets_its_fewest_gpus_and_no_type_is_preferred():
    out = run_scenario(scenario("[{name: small, memory: 40 GB}, {name: big, memory: 80 GB, price_usd: 30000}]")).cluster
    assert out[out[K.RECOMMENDED]][[C.GPU, K.GPUS]].values.tolist() == [["small", 8], ["big", 2]]
    assert out[K.COST].isna().tolist() == [True] * 3 + [False] * 5
    assert out[out[C.GPU] == "big"][K.COST].tolist() == [30000.0 * n for n in (2, 4, 8, 16, 32)]
    line = K.recommendation(out, {}, str)
    assert line.startswith("Fewest GPUs of each type: 8 × small") and "no type is preferred" in line


def test_nothing_fits_is_an_empty_table_and_a_sentence():
    out = run_scenario(scenario("[{name: tiny, memory: 1 GB}]")).cluster
    assert len(out) == 0 and list(out.columns) == list(K.OUTPUT_COLUMNS)
    assert K.recommendation(out, {}, str).startswith("No configuration searched fits")


LLAMA = "{preset: llama-3.2-1b}"


def test_llama_choice_is_the_estimators_own_figure_and_fewer_gpus_do_not_fit():
    """The kept configuration is re-estimated from scratch and matches; the same layout on half the data-parallel
    ranks (twice the accumulation) does not fit, nor does any candidate with fewer GPUs."""
    sc = scenario("[{name: g24, memory: 24 GiB}]", "{global_batch: 64, seq_len: 4096, micro_batch: [1, 2], "
                  "max_gpus: 64}", model=LLAMA, grid="{batch: 1, seq_len: 4096, precision: bf16-master, "
                  "optimizer: adamw, attention: flash, checkpointing: [none, selective, full]}")
    out = run_scenario(sc).cluster
    best = out.iloc[0]
    frame = K.candidates(sc.cluster, sc, sc.gpus[0])
    est = estimate_frame(sc.model, "train", frame, sc.overheads, sc.headroom)
    n = (est[C.DATA_PARALLEL] * est[C.TENSOR_PARALLEL] * est[C.PIPELINE_PARALLEL]).to_numpy()
    assert not est[C.FITS].to_numpy()[n < best[K.GPUS]].any()
    same = ((n == best[K.GPUS]) & (est[C.ZERO_STAGE] == best[C.ZERO_STAGE]).to_numpy()
            & (est[C.TENSOR_PARALLEL] == best[C.TENSOR_PARALLEL]).to_numpy()
            & (est[C.PIPELINE_PARALLEL] == best[C.PIPELINE_PARALLEL]).to_numpy()
            & (est[C.BATCH] == best[C.BATCH]).to_numpy()
            & (est[C.CHECKPOINTING].astype(str) == best[C.CHECKPOINTING]).to_numpy())
    assert est[same][C.TOTAL].tolist() == [best[C.TOTAL]]
    # the rule: among the fits at that count none has less recomputation, or as little and a smaller TP x PP
    fits = est[C.FITS].to_numpy() & (n == best[K.GPUS])
    order = {"none": 0, "selective": 1, "full": 2}
    ck = est[C.CHECKPOINTING].astype(str).map(order).to_numpy()
    assert ck[fits].min() == order[best[C.CHECKPOINTING]]


@pytest.mark.parametrize("cluster,mode,where,message", [
    ("{tokens_per_step: 1000, seq_len: 300}", "train", "cluster.tokens_per_step",
     "1,000 tokens per step is not a whole number of sequences of 300 tokens"),
    ("{global_batch: 7, micro_batch: [2, 4]}", "train", "cluster.micro_batch",
     "no micro-batch size divides the global batch of 7 sequences"),
    ("{global_batch: 8}", "infer", "cluster", "the cluster search applies to train mode only"),
    ("{global_batch: 8, tensor_parallel: [0]}", "train", "cluster.tensor_parallel[0]", "must be at least 1, got 0"),
])
def test_bad_cluster_blocks_are_one_located_error(cluster, mode, where, message):
    text = textwrap.dedent(f"""\
        model: {{preset: llama-3.2-1b}}
        mode: {mode}
        grid: {{batch: 1, seq_len: 300, precision: bf16, optimizer: adamw}}
        gpus: [h100-sxm]
        cluster: {cluster}
        """)
    if mode == "infer":
        text = text.replace(", optimizer: adamw", "")
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(text, "s.yaml")
    (p,) = e.value.problems
    assert (p.file, p.line, p.key_path) == ("s.yaml", 5, where) and message in p.message


def test_run_writes_cluster_options_csv_and_the_report_shows_the_section(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        name: cluster csv
        model: {{params: {PSI}, activation_elements_per_sample: 0}}
        mode: train
        grid: {{batch: 1, precision: bf16-master, optimizer: adam}}
        gpus: {TWO_TYPES}
        overheads: {{cuda_context: 0 B, cublas_workspace: 0 B, allocator_reserve: 0}}
        headroom: 0
        cluster: {{global_batch: 32, micro_batch: [1]}}
        """))
    r = subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "report", str(cfg), "--out", str(tmp_path / "o"),
                        "--no-pdf"], capture_output=True, text=True)
    if "--no-pdf" in r.stderr:  # the CLI has no such flag: render the PDF too
        r = subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "report", str(cfg), "--out",
                            str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    csv = pd.read_csv(tmp_path / "o" / "cluster_options.csv")
    assert list(csv.columns) == list(K.OUTPUT_COLUMNS) and len(csv) == 8
    html = (tmp_path / "o" / "report.html").read_text()
    assert "<h2>Cluster options</h2>" in html
    assert "Cheapest: 2 × big ($6.00 per hour) with TP 1, PP 1, DP 2, ZeRO 1" in html
    assert html.count('class="recommended"') == 1


def test_the_search_keeps_the_scenarios_fp32_main_grads():
    """configs/llama-70b-cluster.yaml trains with Megatron-style fp32 main grads (parallel.fp32_grad_accumulation):
    the cluster search must estimate its candidates the same way (18 B/param with bf16-master + AdamW, not 16)."""
    from nnmem_sweep.config import load_scenario

    sc = load_scenario("configs/llama-70b-cluster.yaml")
    assert sc.cluster.fixed[C.FP32_GRAD_ACCUMULATION] is True
    frame = K.candidates(sc.cluster, sc, sc.gpus[0])
    assert frame[C.FP32_GRAD_ACCUMULATION].all()
    # ZeRO-3 over 16 GPUs: 18 B x 70,553,706,496 / 16 = 79.4 GB of model states alone, over the A100's 76.0 GiB
    # usable once the runtime overheads are added; 16 B/param (no main grads) fits at 16 GPUs
    out = run_scenario(sc).cluster
    assert out[out[C.GPU] == "a100-80gb"][K.GPUS].min() == 32


def test_a_catalog_gpu_named_with_a_price_as_the_issue_writes_it():
    """Issue 4 writes `gpus: [{name: h100-sxm, price_usd: ...}]`: a name that is a catalog id, no memory, is the
    catalog GPU with its price; an unknown name without memory is one located error."""
    sc = scenario("[{name: h100-sxm, price_usd: 30000}, a100-80gb]")
    assert [(g.id, g.memory_bytes, g.price_usd) for g in sc.gpus] == [("h100-sxm", 84_918_646_663, 30000),
                                                                       ("a100-80gb", 84_981_296_661, None)]
    with pytest.raises(ScenarioError) as e:
        scenario("[{name: h100sxm, price_usd: 30000}]")
    (p,) = e.value.problems
    assert p.key_path == "gpus[0].name" and "did you mean 'h100-sxm'" in p.message


def test_a_search_too_large_is_refused_before_it_is_built(monkeypatch):
    """Counted from the axis lengths: DP in the 6 divisors of 32, TP 1/2/4/8, PP 1/2/4/8/16 (Llama 3.2 1B has 16
    layers), ZeRO 0-3, no recomputation: 6 x 4 x 5 x 4 x 1 = 480 candidates, refused at a limit of 479."""
    from nnmem_sweep.errors import UsageError

    sc = scenario("[{name: g, memory: 80 GB}]", "{global_batch: 32, micro_batch: [1]}", model=LLAMA,
                  grid="{batch: 1, seq_len: 512, precision: bf16, optimizer: adamw}")
    monkeypatch.setattr(K, "MAX_CANDIDATES", 479)
    monkeypatch.setattr(K, "product_frame", lambda *a, **k: pytest.fail("built before the size was checked"))
    with pytest.raises(UsageError, match="480 candidate layouts, over 479"):
        K.candidates(sc.cluster, sc, sc.gpus[0])
    monkeypatch.setattr(K, "MAX_CANDIDATES", 480)
    monkeypatch.undo()
    assert len(K.candidates(sc.cluster, sc, sc.gpus[0])) == 480


def test_the_report_has_a_cost_column_only_when_some_gpu_has_a_price(tmp_path):
    from nnmem_sweep.report import render_report

    for gpus, priced in ((TWO_TYPES, True), ("[{name: small, memory: 40 GB}, {name: big, memory: 80 GB}]", False)):
        result = run_scenario(scenario(gpus))
        (tmp_path / "c.yaml").write_text(result.scenario.source_text)
        render_report(result, tmp_path, tmp_path / "c.yaml", pdf=False, validation=None)
        html = (tmp_path / "report.html").read_text()
        section = html[html.index('<section id="cluster">'):]
        assert ('<th class="num">cost</th>' in section) is priced


def test_gradient_sync_last_keeps_the_accumulated_gradients_whole_in_every_sharded_option():
    """`parallel: {gradient_sync: last}` (accelerate's no_sync) reaches the search: an option that accumulates over
    micro-batches with ZeRO-2/3 keeps the whole bf16 gradients of Llama 3.1 8B (8,030,261,248 parameters) instead
    of the rank's 1/dp shard; an option without accumulation, or at ZeRO-0/1, is the same step either way."""
    def options(sync: str) -> pd.DataFrame:
        sc = parse_scenario_text(textwrap.dedent(f"""\
            name: sync
            model: {{preset: llama-3.1-8b}}
            mode: train
            grid: {{batch: 1, seq_len: 2048, precision: bf16, optimizer: adamw, checkpointing: full}}
            gpus: [h100-sxm]
            parallel: {{gradient_sync: {sync}}}
            cluster: {{global_batch: 64, micro_batch: [1, 2], tensor_parallel: [1], pipeline_parallel: [1],
                       max_gpus: 32}}
            """))
        return K.candidates(sc.cluster, sc, sc.gpus[0]).pipe(
            lambda f: estimate_frame(sc.model, "train", f, sc.overheads, sc.headroom))

    each, last = options("each"), options("last")
    whole = 8_030_261_248 * 2
    dp = each[C.DATA_PARALLEL].to_numpy(dtype=np.int64)
    unsynced = (each[C.GRADIENT_ACCUMULATION].to_numpy() > 1) & (each[C.ZERO_STAGE].to_numpy() >= 2) & (dp > 1)
    assert unsynced.any() and (~unsynced).any()
    shard = -(-whole // dp)
    # the rank's gradients at its peak: whole where the micro-batches keep them unsynced, the shard where ZeRO-2/3
    # syncs each (the peak then falls in the forward or the backward's first moments, which hold them)
    assert (last[C.GRADIENTS].to_numpy()[unsynced] == whole).all()
    assert (each[C.GRADIENTS].to_numpy()[unsynced] == shard[unsynced]).all()
    extra = (last[C.PEAK_ALLOCATED] - each[C.PEAK_ALLOCATED]).to_numpy()
    # the peak grows by at most what the kept gradients grow (a peak elsewhere, the optimizer step's, can be passed)
    assert ((extra[unsynced] > 0) & (extra[unsynced] <= (whole - shard)[unsynced])).all()
    assert (extra[~unsynced] == 0).all()
