"""A derived plan's stored allocation sequence (derive/events.py): evaluated at a shape no probe traced, it is the
sequence the model's own code allocates there, event for event; its largest running sum is the plan's peak."""
import numpy as np
import pytest

from nnmem_sweep.derive import events as E

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False}


def test_decode_by_hand():
    # alloc A (64 B), alloc B (8·(b − 1) B: zero at batch 1), free A, free B
    doc = {"kinds": ["temp"], "rows": [[0, 64, 0, 0, 0, 0, 0], [0, -8, 0, 8, 0, 0, 0]], "seq": [0, 1, -2, -1]}
    ev, kind, kinds = E.decode(doc, 3, 5)
    assert ev.tolist() == [[0, 64], [1, 16], [0, -64], [1, -16]]
    assert kind.tolist() == [0, 0, 0, 0] and kinds == ["temp"]
    # batch 1: B is a zero-byte allocation, which never reaches the allocator: it and its free are dropped
    assert E.decode(doc, 1, 5)[0].tolist() == [[0, 64], [0, -64]]
    with pytest.raises(ValueError, match="negative"):
        E.decode({"kinds": ["temp"], "rows": [[0, -8, 0, 8, 0, 0, 0]], "seq": [0, -1]}, 0, 5)


def test_encode_round_trip():
    # storage 7 resized in place (free, then a new allocation of the same storage): two allocations
    events = np.array([[7, 10], [3, 30], [7, -10], [7, 12], [3, -30], [7, -12]], dtype=np.int64)
    coef = np.zeros((6, 3), dtype=np.int64)
    coef[0] = [10, 30, 12]
    doc = E.encode(events, ["act", "temp", "act"], coef)
    assert doc["seq"] == [0, 1, -2, 2, -2, -1]  # frees name the allocation d allocations back
    assert E.decode(doc, 2, 64)[0].tolist() == [[0, 10], [1, 30], [0, -10], [2, 12], [1, -30], [2, -12]]


def _canonical(events: np.ndarray) -> np.ndarray:
    """A traced sequence with storage ids replaced by allocation ordinals (events_at's ids)."""
    ordinal, allocations, out = {}, 0, []
    for sid, n in events.tolist():
        if n > 0:  # a later allocation of the same storage (resized in place) takes a new ordinal
            ordinal[sid] = allocations
            allocations += 1
        out.append((ordinal[sid], n))
    return np.array(out, dtype=np.int64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from nnmem_sweep.derive import derivation
    from nnmem_sweep.derive.arch import hf_source

    source = hf_source(TINY_LLAMA, "test")
    plan = derivation.derive(source, "train", "bf16-mixed", "flash", "none", "cuda")
    probe = derivation._Probe(source, "train", "bf16-mixed", "flash", "none", "cuda", False)
    return plan, probe


@pytest.mark.parametrize("b,s", [(5, 200), (1, 300)])  # held out: no probe traced them; batch 1 is its own region
def test_events_at_is_the_traced_sequence(tiny, b, s):
    from nnmem_sweep.derive.plans import evaluate, to_json

    plan, probe = tiny
    ev = E.events_at(to_json(plan), b, s)  # from the JSON document, as shipped
    traced = probe(b, s).trace.events
    assert ev.dtype == np.int64 and ev.shape == traced.shape
    assert np.array_equal(ev, _canonical(traced))
    # its largest running sum is the plan's peak at (b, s) (the traced moments; the optimizer is not traced)
    assert int(np.cumsum(ev[:, 1]).max()) == evaluate(plan, b, s)[0]
    # by hand: the first parameter registered is the fp32 embedding (bf16-mixed keeps fp32 weights), 1000 · 64 · 4
    assert ev[0].tolist() == [0, 1000 * 64 * 4]
    # the input ids and labels (int64, b · s each) are the step's first two registrations after the weights
    from nnmem_sweep.derive.kinds import INPUT

    _, kind, kinds = E.region_events(plan, b, s)
    first_input = int(np.flatnonzero(kind == kinds.index(INPUT))[0])
    assert ev[first_input, 1] == b * s * 8


def test_plan_without_sequence_still_evaluates(tiny):
    from nnmem_sweep.derive.plans import evaluate, from_json, to_json

    plan, _ = tiny
    doc = to_json(plan)
    for r in doc["regions"]:
        del r["replay"]
    old = from_json(doc)  # a plan shipped before sequences were stored
    assert evaluate(old, 4, 512) == evaluate(plan, 4, 512)
    with pytest.raises(ValueError, match="no allocation sequence"):
        E.events_at(old, 4, 512)


def test_shipped_qwen3_sequence_is_the_traced_one(tmp_path, monkeypatch):
    """configs/qwen3.yaml's shipped plan (Qwen3 8B, bf16-mixed): at a shape no probe traced, its stored sequence is
    the one the model's code allocates, all 13,492 events."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from nnmem_sweep.config import load_scenario
    from nnmem_sweep.derive import derivation, get_plan, stored_only

    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path))  # the shipped plan, not one a user cache holds
    source = load_scenario("configs/qwen3.yaml").model.derived.source
    with stored_only():
        plan = get_plan(source, "train", "bf16-mixed", "flash", "none")
    probe = derivation._Probe(source, "train", "bf16-mixed", "flash", "none", "cuda", False)
    ev = E.events_at(plan, 5, 200)
    assert len(ev) == 13_492 and np.array_equal(ev, _canonical(probe(5, 200).trace.events))
