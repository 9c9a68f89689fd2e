"""DataFrames -> the report's context: plain dicts of formatted strings, booleans and lists of row dicts.

All arithmetic, unit conversion, selection and sorting of the report happens in Python; templates only lay it out.
build_context gathers the sections, each built in its own module: decision.py (the first page: the question, the
answer, the alternatives and what would flip it; decision_options.py, uncertainty.py), points.py (the reference
point and how points are written), tables.py (max-batch tables and heatmap), figures.py (what the charts show; charts.py draws
them), assumptions.py, appendix.py (formulas, validation), and serving.py, cluster.py, changes.py for the sections
of serving plans, cluster searches and changes since a revision.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import columns as C
from ..components import finetune as F
from ..parallel.layout import fsdp_versions
from ..runner import plan_stack
from ..scenario import Scenario
from . import charts
from .appendix import formulas, validation
from .assumptions import assumptions, throughput_assumptions
from .changes import section as changes_section
from .cluster import section as cluster_section
from .decision import decision
from .figures import breakdown_chart, memory_vs_batch_chart
from .format import COMPONENT_LABELS
from .points import axis_values, reference_point, usable_by_gpu
from .provenance import Provenance
from .serving import section as serving_section
from .tables import HEATMAP_MAX_ROWS, layout_note, max_batch_tables


def _finetune_text(sc: Scenario) -> str:
    """'LoRA rank 16 (alpha 16, dropout 0.0) on q_proj, v_proj, adapters fp32: 1,703,936 trainable parameters; the
    base is frozen' for a LoRA/QLoRA scenario, '' otherwise."""
    ft = getattr(sc.model, "finetune", None)
    if ft is None or not ft.adapters:
        return ""
    targets, params = F.trained(sc.model, ft)
    # FSDP1 runs FSDP-QLoRA: the rest of the model left in its dtype (workload/qlora.py)
    versions = fsdp_versions(axis_values(sc)) if sc.parallel else {2}
    rest = ("fp32" if 1 not in versions else "in the recipe's dtype (FSDP-QLoRA, FSDP1)" if 2 not in versions
            else "fp32 (FSDP2), in the recipe's dtype under FSDP1 (FSDP-QLoRA)")
    base = (f"NF4 (4-bit, double-quantised block scales), the rest {rest}" if ft.method == "qlora"
            else "frozen in the recipe's dtype")
    return (f"{'QLoRA' if ft.method == 'qlora' else 'LoRA'} rank {ft.rank} (alpha {ft.alpha:g}, dropout "
            f"{ft.dropout:g}) on {targets}, adapters {ft.adapter_dtype}: {params:,} trainable "
            f"parameters; base weights {base}")


# ---------------------------------------------------------------------------------------------------- all of it
def build_context(sc: Scenario, results: pd.DataFrame, max_batch: pd.DataFrame, prov: Provenance,
                  all_formulas: list, validation_table: pd.DataFrame | None = None,
                  serving_plan: pd.DataFrame | None = None,
                  serving_context: pd.DataFrame | None = None, changes: Any = None,
                  cluster_options: pd.DataFrame | None = None,
                  published_table: pd.DataFrame | None = None,
                  gpu_evidence: dict[str, Any] | None = None,
                  sharded_table: pd.DataFrame | None = None) -> dict[str, Any]:
    """Everything the templates show. No clock, no elapsed time: the same inputs give the same context.
    `serving_plan`/`serving_context`: max_concurrency / max_context of an infer run (the "Serving capacity"
    section, report/serving.py); None leaves the section out. `changes`: a diff.Changes (the "Changes since REV"
    section, report/changes.py); None leaves it out. `cluster_options`: cluster_options.csv of a scenario with a
    `cluster:` block (the "Cluster options" section, report/cluster.py); None leaves it out. `gpu_evidence`: the
    real-GPU allocator snapshots replayed and the committed kit runs (report.load_gpu_evidence), in Validation.
    `sharded_table`: the sharded steps' cases compared (one rank of FSDP2, of DeepSpeed; a scenario with a parallel
    layout's), which count towards the recipes a measured case exercises (a DeepSpeed bf16-master case measures
    bf16-master) and have a line in Validation."""
    point = reference_point(sc)
    usable = usable_by_gpu(results, sc)
    tables, heat = max_batch_tables(sc, max_batch, point)
    breakdown_svg, breakdown_about, breakdown_note = breakdown_chart(sc, results, point, usable)
    lines_svg, lines_about = memory_vs_batch_chart(sc, results, point, usable)
    heat_svg = charts.heatmap("Largest batch that fits", heat["rows"], heat["cols"], heat["cells"], heat["legend"])
    paper = str(sc.report.get("paper", "A4"))
    n_points = len(results)
    page = decision(sc, max_batch, serving_plan, cluster_options, prov.config_path)
    assumed = assumptions(sc, validation_table, sharded_table)
    if page["assumed"]:
        assumed["groups"].append({"title": "Throughput estimate", "items": throughput_assumptions(sc, page["assumed"])})
    shown = formulas(all_formulas, sc)  # those this scenario's rows can use; the note counts the others
    return {
        "title": str(sc.report.get("title") or sc.name),
        "description": sc.description,
        "paper": "Letter" if paper.lower() == "letter" else "A4",
        "provenance": {
            "config_path": prov.config_path, "sha256": prov.sha256, "commit": prov.commit or "",
            "commit_short": prov.commit[:12], "dirty": prov.dirty, "in_git": prov.in_git, "date": prov.date,
            "date_source": prov.date_source, "tool_version": prov.tool_version,
        },
        "model": {"name": sc.model.name, "params": f"{sc.model.params:,}", "finetune": _finetune_text(sc)},
        "mode": "inference" if sc.mode == "infer" else "training",
        "grid_size": f"{n_points:,}",
        "stack": plan_stack(sc),
        "gpu_count": str(len(sc.gpus)),
        "decision": page,
        "tables": tables,
        "layout_note": layout_note(sc),
        "charts": {
            "breakdown": breakdown_svg, "breakdown_about": breakdown_about, "breakdown_note": breakdown_note,
            "lines": lines_svg, "lines_about": lines_about,
            "heatmap": heat_svg, "heatmap_truncated": heat["truncated"], "heatmap_about": heat["about"],
            "heatmap_max_rows": str(HEATMAP_MAX_ROWS),
        },
        "assumptions": assumed,
        "formulas": shown,
        "formulas_other": len(formulas(all_formulas)) - len(shown),
        "validation": validation(validation_table, published_table, gpu_evidence, sharded_table),
        "serving": serving_section(sc, serving_plan, serving_context, point),
        "changes": changes_section(changes, prov, sc),
        "cluster": cluster_section(sc, cluster_options),
        "yaml": sc.source_text,
        "levels": [{"n": str(i), "fill": f, "text": t} for i, (f, t) in enumerate(zip(charts.LEVEL_FILL, charts.LEVEL_TEXT))],
        "component_colours": [{"name": COMPONENT_LABELS[c], "colour": charts.COMPONENT_COLOURS[i]}
                              for i, c in enumerate(list(C.COMPONENTS) + [C.OVERHEAD])],
    }
