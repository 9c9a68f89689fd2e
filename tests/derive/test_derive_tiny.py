"""The derived path end to end on tiny models: plans derived from probe traces give, at shapes far from the
probes, exactly the peak PyTorch's MemTracker measures for the whole workload (measure/), train and infer."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nnmem_sweep.catalog.precisions import get_precision  # noqa: E402
from nnmem_sweep.components import derived as D  # noqa: E402
from nnmem_sweep.measure.build import measure_case  # noqa: E402
from nnmem_sweep.derive.arch import architecture_from_source, hf_source  # noqa: E402

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False}
TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4,
             "n_layer": 2, "vocab_size": 1000, "n_positions": 2048}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))


def _truth(cfg, **case):
    case = {"hf_config": cfg, "optimizer_impl": "foreach", "checkpointing": "none", "attention": "flash",
            "decode_tokens": 0, **case}
    return measure_case(case, fake=True)


def _estimate(cfg, i, device):
    arch = architecture_from_source(hf_source(cfg, "test"))
    b, s = np.array([i["batch"]]), np.array([i["seq_len"]])
    prec = (get_precision(i["precision"]),)
    if i["mode"] == "train":
        rec, st = D.train_inputs(arch, prec, (i["optimizer"],), (i.get("optimizer_impl", "foreach"),),
                                 (i.get("attention", "flash"),), (i.get("checkpointing", "none"),), device,
                                 z_names=(i["zero_grad"],) if "zero_grad" in i else ())
        out = D.train_rows(b, s, rec, st, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    else:
        rec, W = D.infer_inputs(arch, prec, (i.get("attention", "flash"),), device)
        out = D.infer_rows(b, s, np.array([i["decode_tokens"]]), rec, W, np.zeros(1, dtype=np.int64))
    comps = sum(int(out[c][0]) for c in ("weights_bytes", "master_weights_bytes", "gradients_bytes",
                                          "optimizer_bytes", "activations_bytes", "kv_cache_bytes",
                                          "temporary_bytes"))
    assert comps == int(out["peak_allocated_bytes"][0])  # the components add up to the peak
    return int(out["peak_allocated_bytes"][0])


# CPU step counters: torch.optim keeps a 4-byte `step` tensor per parameter on the host (not on the GPU); the CPU
# measurement counts them, the estimate (a GPU model) does not
def _host_steps(cfg) -> int:
    from transformers import AutoConfig
    import transformers

    c = dict(cfg)
    conf = AutoConfig.for_model(c.pop("model_type"), **{k: v for k, v in c.items() if k != "architectures"})
    with torch.device("meta"):
        m = getattr(transformers, cfg["architectures"][0])._from_config(conf)
    return 4 * len({id(p) for p in m.parameters()})


@pytest.mark.parametrize("cfg,case", [
    (TINY_LLAMA, dict(mode="train", batch=5, seq_len=700, precision="bf16", optimizer="adamw")),
    (TINY_LLAMA, dict(mode="train", batch=1, seq_len=1500, precision="bf16-mixed", optimizer="sgd-momentum",
                      checkpointing="full")),
    (TINY_GPT2, dict(mode="train", batch=3, seq_len=1000, precision="fp32", optimizer="adamw", attention="eager")),
    # gradients kept between steps (zero_grad(set_to_none=False)): the "+zeros" trace, untied and tied heads
    (TINY_LLAMA, dict(mode="train", batch=1, seq_len=100, precision="bf16", optimizer="sgd", zero_grad="zeros")),
    (TINY_GPT2, dict(mode="train", batch=3, seq_len=1000, precision="fp32", optimizer="adamw", attention="eager",
                     zero_grad="zeros")),
    (TINY_LLAMA, dict(mode="infer", batch=6, seq_len=900, precision="bf16", optimizer="none", decode_tokens=5)),
    (TINY_GPT2, dict(mode="infer", batch=1, seq_len=1200, precision="fp32", optimizer="none", decode_tokens=3)),
])
def test_derived_equals_measured_far_from_the_probes(cfg, case):
    measured = _truth(cfg, **case)["peak_bytes"]
    host = _host_steps(cfg) if case["mode"] == "train" and case["optimizer"] in ("adamw",) else 0
    assert _estimate(cfg, case, "cpu") == measured - host
