"""The Recorder's cuBLAS workspaces (derive/trace.py, `workspace_bytes`): a CUDA run's allocator holds one per thread
from its first matrix product on, which a sequence replayed for the reserve must hold too (the H100's DeepSpeed
ZeRO-2 point: +4.4 % of the peak without them, the GPU's +10.2 % with them)."""
import pytest

torch = pytest.importorskip("torch", reason="the [measure] extra (torch) is not installed")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from nnmem_sweep.derive.trace import Recorder  # noqa: E402

W = 33_554_432


def _record(workspace_bytes):
    with FakeTensorMode():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x = torch.randn(2, 8)
        rec = Recorder(workspace_bytes)
        rec.external(model.parameters(), "param")
        with rec:
            rec.mark("forward")
            loss = model(x).sum()
            rec.mark("backward")
            loss.backward()
            rec.mark("optimizer")
            with torch.no_grad():
                model[0].weight.grad @ model[0].weight.grad.T  # a product on the main thread again: none made
    return rec.trace()


def test_one_workspace_per_thread_after_its_first_product_never_freed():
    tr = _record(W)
    made = [i for i, op in enumerate(tr.ops) if op == "cublas_workspace"]
    assert len(made) == 2 and all(tr.events[i, 1] == W for i in made)
    fwd, bwd = made
    # each right after the output of its thread's first product: the forward's first addmm, the backward's first mm
    assert tr.ops[fwd - 1] == "addmm" and "addmm" not in tr.ops[tr.marks["forward"]:fwd - 1]
    assert tr.marks["backward"] < bwd and tr.ops[bwd - 1] == "mm"
    assert not {"mm", "addmm"} & set(tr.ops[tr.marks["backward"]:bwd - 1])
    ids = {int(tr.events[i, 0]) for i in made}
    assert not any(int(sid) in ids and n < 0 for sid, n in tr.events.tolist())  # never freed


def test_without_workspace_bytes_the_trace_is_the_tensors_alone():
    plain, with_ws = _record(0), _record(W)
    assert "cublas_workspace" not in plain.ops
    keep = [i for i, op in enumerate(with_ws.ops) if op != "cublas_workspace"]
    assert with_ws.events[keep, 1].tolist() == plain.events[:, 1].tolist()
