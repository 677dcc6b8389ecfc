"""oar.jit.save / oar.jit.load: models exported as ONNX and run without their Python code, on the device
through oar.onnx (compiled) and in onnxruntime, matching eager within 1e-5 relative at each size of
each dynamic dim; every refusal (op, data-dependent graph, path, file, input) is a clear error."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import oar
import oar.jit
import oar.nn as nn
from oar.jit import ExportError
from oar.onnx import OnnxInputError, OnnxModelError

ort = pytest.importorskip("onnxruntime")
oar_opset = pytest.importorskip("oar_opset")

RTOL = 1e-5  # max |exported - eager| / max |eager|


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def resized(array: np.ndarray, shape) -> oar.Tensor:
    return oar.tensor(np.resize(array, shape).astype(array.dtype))


def export_and_compare(model, example: oar.Tensor, path, dynamic_dims, shapes, max_sizes=None, compile=True):
    """Export, then at every shape compare oar.jit.load's output and onnxruntime's with eager (compile=False:
    oar.onnx runs the graph op by op, which spares a kernel compile per shape where compiling is tested)."""
    oar.jit.save(model, path, (example,), dynamic_dims=dynamic_dims, max_sizes=max_sizes)
    module = oar.jit.load(path, device=str(example.device), compile=compile)
    session = ort.InferenceSession(str(path))
    for shape in shapes:
        x = resized(example.numpy(), shape)
        with oar.no_grad():
            want = model(x).numpy()
        got = module(x)
        assert isinstance(got, oar.Tensor) and str(got.device) == str(example.device)
        assert relative_error(got.numpy(), want) < RTOL, shape
        ort_out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        assert relative_error(ort_out, want) < RTOL, shape
    return module


def test_op_table_covers_ops_yaml():
    ops = {op.name for op in oar_opset.default().ops}
    for name in ops:
        assert oar.jit.mapping_problem(name) is None or name in oar.jit.REFUSED, name
    assert set(oar.jit.MAPPED) <= ops and set(oar.jit.REFUSED) <= ops
    assert oar.jit.mapping_problem("no_such_op").startswith("not in oar.jit's ONNX table")


def test_mlp_dynamic_batch(private_kernel_cache, tmp_path):
    from oar.models import MLP
    model = MLP().eval()
    example = oar.tensor(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    export_and_compare(model, example, tmp_path / "mlp.onnx", {0: {0: "batch"}}, [(4, 64), (1, 64), (11, 64)])
    graph_input = onnx.load(tmp_path / "mlp.onnx").graph.input[0]
    assert [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim] == ["batch", 64]
    names = {t.name for t in onnx.load(tmp_path / "mlp.onnx").graph.initializer}
    assert {name for name, _ in model.named_parameters() if name.endswith("bias")} <= names


def test_cnn_dynamic_batch(private_kernel_cache, tmp_path):
    from oar.models import CNN
    # a batch-1 example: a size-1 dim's strides are arbitrary, so the exporter traces from 2 up
    example = oar.tensor(np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32))
    export_and_compare(CNN().eval(), example, tmp_path / "cnn.onnx", {"x": {0: "batch"}},
                       [(1, 1, 8, 8), (5, 1, 8, 8)])


class NormPadResize(nn.Module):
    """The nn layers that run as their own ops: batch norm (eval), group norm, pad, resize, adaptive pools."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        F = oar.nn.functional
        y = self.gn(F.relu(self.bn(self.conv(x))))
        y = F.pad(y, (1, 2, 0, 1), mode="reflect") + F.pad(y, (1, 2, 0, 1), mode="replicate")
        y = F.pad(y, (1, 1, 1, 1), value=0.5)
        y = F.interpolate(y, scale_factor=2, mode="nearest") + F.interpolate(y, scale_factor=2, mode="bilinear")
        y = y + F.interpolate(y, size=(y.shape[2], y.shape[3]), mode="bilinear", align_corners=True)
        return F.adaptive_avg_pool2d(y, 1) + F.adaptive_max_pool2d(y, 1)


def test_norm_pad_resize_and_adaptive_pool_ops(private_kernel_cache, tmp_path):
    model = NormPadResize()
    rng = np.random.default_rng(5)
    for _ in range(2):  # running statistics that differ from the defaults
        model(oar.tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32)))
    model.eval()
    example = oar.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    export_and_compare(model, example, tmp_path / "npr.onnx", {"x": {0: "batch"}}, [(2, 3, 6, 6), (3, 3, 6, 6)],
                       compile=False)


def test_training_batch_norm_is_refused(private_kernel_cache, tmp_path):
    model = NormPadResize()
    with pytest.raises(ExportError, match="eval"):
        oar.jit.save(model, tmp_path / "train.onnx", (oar.zeros(2, 3, 6, 6),))
    assert not (tmp_path / "train.onnx").exists()


def test_llama_logits_dynamic_batch_and_seq(private_kernel_cache, tmp_path):
    from oar.models import Llama, LlamaConfig
    model = Llama(LlamaConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=16)).eval()
    prompt = oar.tensor(np.random.default_rng(2).integers(0, 256, (2, 5)), dtype="int64")
    module = export_and_compare(model, prompt, tmp_path / "llama.onnx", {"tokens": {0: "batch", 1: "seq"}},
                                [(2, 5), (3, 9)], max_sizes={"seq": 16})
    export_and_compare(model, prompt, tmp_path / "llama.onnx", {"tokens": {0: "batch", 1: "seq"}},
                       [(1, 16), (1, 1)], max_sizes={"seq": 16}, compile=False)
    # the causal mask was stored at 16 tokens: longer prompts are refused, naming the limit
    with pytest.raises(OnnxInputError, match=r"'tokens' dim 1 \('seq'\) is 17, above 16"):
        module(resized(prompt.numpy(), (1, 17)))
    with pytest.raises(OnnxInputError, match="dtype float32.*tensor\\(int64\\)"):
        module(oar.tensor(np.zeros((1, 4), np.float32)))
    with pytest.raises(OnnxInputError, match="rank 1"):
        module(oar.tensor(np.zeros(4, np.int64)))
    with pytest.raises(OnnxInputError, match="takes 1 input"):
        module(prompt, prompt)


@pytest.mark.parametrize("bits, rotate", [(8, None), (4, "hadamard")])
def test_quantized_llama(private_kernel_cache, tmp_path, bits, rotate):
    from oar import quantization
    from oar.models import Llama, LlamaConfig
    model = Llama(LlamaConfig(d_model=64, n_layers=1, n_heads=2, max_seq_len=16)).eval()
    quantization.quantize_weights(model, bits=bits, group_size=32, rotate=rotate)
    prompt = oar.tensor(np.random.default_rng(3).integers(0, 256, (1, 6)), dtype="int64")
    export_and_compare(model, prompt, tmp_path / "q.onnx", {0: {0: "batch", 1: "seq"}}, [(1, 6), (2, 11)],
                       max_sizes={"seq": 16}, compile=False)
    int8 = [t for t in onnx.load(tmp_path / "q.onnx").graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert int8, "the low-bit codes are stored as int8, not dequantized to float"


class Views(nn.Module):
    """Operands as every kind of view: a strided step (Gather), a transpose (Transpose), a block (Slice),
    a concat into a new storage (Concat) and a write into part of a computed tensor (ScatterElements)."""

    def forward(self, x):
        every_other = oar.slice(x, dim=1, start=0, stop=int(x.shape[1]), step=2)
        block = oar.slice(x, dim=1, start=1, stop=3)
        joined = oar.concat([oar.neg(every_other), oar.exp(block)], dim=1)
        joined[:, 1] = 5.0
        return oar.matmul(oar.transpose(joined, 0, 1), x)


def test_views_dynamic_batch(private_kernel_cache, tmp_path):
    example = oar.tensor(np.random.default_rng(5).standard_normal((3, 6)).astype(np.float32))
    export_and_compare(Views(), example, tmp_path / "views.onnx", {0: {0: "batch"}}, [(3, 6), (8, 6)],
                       compile=False)
    ops = {node.op_type for node in onnx.load(tmp_path / "views.onnx").graph.node}
    assert {"Gather", "Transpose", "Slice", "Concat", "ScatterElements"} <= ops, ops


class TwoInTwoOut(nn.Module):
    def forward(self, x, mask):
        scores = oar.matmul(x, oar.transpose(x, 0, 1))
        return oar.where(mask, scores, 0.0), oar.sum(x, dim=[1])


def test_two_inputs_sharing_a_dim_and_two_outputs(private_kernel_cache, tmp_path):
    rng = np.random.default_rng(6)
    path = tmp_path / "two.onnx"
    x = oar.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    mask = oar.tensor(rng.random((3, 3)) > 0.5)
    oar.jit.save(TwoInTwoOut(), path, (x, mask), dynamic_dims={"x": {0: "n"}, "mask": {0: "n", 1: "n"}})
    module = oar.jit.load(path, device=str(x.device), compile=False)
    assert module.input_names == ["x", "mask"]
    for n in (3, 6):
        xn, mn = resized(x.numpy(), (n, 4)), oar.tensor(rng.random((n, n)) > 0.5)
        want = [t.numpy() for t in TwoInTwoOut()(xn, mn)]
        got = module(xn, mn)
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want):
            assert relative_error(g.numpy(), w) < RTOL
    with pytest.raises(OnnxInputError, match="'n'"):
        module(resized(x.numpy(), (4, 4)), oar.tensor(np.ones((5, 5), bool)))


class Sorting(nn.Module):
    def forward(self, x):
        return oar.argsort(x, dim=-1)


class HostRead(nn.Module):
    def forward(self, x):
        return x * float(oar.sum(x).item())


class SizeBranch(nn.Module):
    def forward(self, x):
        return oar.relu(x) if int(x.shape[0]) > 3 else oar.sigmoid(x)


class SizeConstant(nn.Module):
    def forward(self, x):  # a constant whose values (not only its size) change with the batch
        return x + oar.tensor(np.full((int(x.shape[0]), 1), float(x.shape[0]), np.float32), device=x.device)


@pytest.mark.parametrize("model, match", [
    (Sorting(), "op 'argsort', which oar.jit cannot export"),
    (HostRead(), "reads a tensor's value on the host"),
    (SizeBranch(), "differs between sizes"),
    (SizeConstant(), "values change with the dynamic dims"),
])
def test_refusals_leave_existing_file(private_kernel_cache, tmp_path, model, match):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous")
    x = oar.tensor(np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32))
    with pytest.raises(ExportError, match=match):
        oar.jit.save(model, path, (x,), dynamic_dims={0: {0: "batch"}})
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["m.onnx"]


def test_bad_arguments_and_paths(private_kernel_cache, tmp_path):
    from oar.models import MLP
    model, x = MLP().eval(), oar.tensor(np.zeros((2, 64), np.float32))
    (tmp_path / "file").write_text("")
    with pytest.raises(ExportError, match="cannot write .*does not exist"):
        oar.jit.save(model, tmp_path / "file" / "m.onnx", (x,))
    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(ExportError, match="cannot write .*dir.onnx"):
        oar.jit.save(model, tmp_path / "dir.onnx", (x,))
    with pytest.raises(ExportError, match="axis 2 -> 'b' is not an axis of input 'x'"):
        oar.jit.save(model, tmp_path / "m.onnx", (x,), dynamic_dims={0: {2: "b"}})
    with pytest.raises(ExportError, match="dynamic_dims names input 'y'"):
        oar.jit.save(model, tmp_path / "m.onnx", (x,), dynamic_dims={"y": {0: "b"}})
    with pytest.raises(ExportError, match="the maximum must be at least 4"):
        oar.jit.save(model, tmp_path / "m.onnx", (x,), dynamic_dims={0: {0: "b"}}, max_sizes={"b": 2})
    with pytest.raises(ExportError, match="example_inputs must be an oar.Tensor"):
        oar.jit.save(model, tmp_path / "m.onnx", (np.zeros((2, 64)),))
    assert sorted(os.listdir(tmp_path)) == ["dir.onnx", "file"]


def test_interrupted_write_keeps_the_old_file(private_kernel_cache, tmp_path, monkeypatch):
    from oar.models import MLP
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(onnx, "save_model", fail)
    with pytest.raises(ExportError, match="cannot write .*No space left"):
        oar.jit.save(MLP().eval(), path, (oar.tensor(np.zeros((2, 64), np.float32)),))
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["m.onnx"]


def test_corrupt_or_missing_file(private_kernel_cache, tmp_path):
    from oar.models import MLP
    path = tmp_path / "m.onnx"
    oar.jit.save(MLP().eval(), path, (oar.tensor(np.zeros((2, 64), np.float32)),))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxModelError, match="m.onnx"):
        oar.jit.load(path, device=str(oar.get_device()))
    with pytest.raises(OnnxModelError, match="no such model file"):
        oar.jit.load(tmp_path / "absent.onnx", device=str(oar.get_device()))


def test_large_weights_go_to_one_external_data_file(private_kernel_cache, tmp_path, monkeypatch):
    import oar.jit.export
    from oar.models import MLP
    monkeypatch.setattr(oar.jit.export, "INLINE_LIMIT", 10_000)  # as if the model were above 1 GiB
    model = MLP().eval()
    example = oar.tensor(np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32))
    export_and_compare(model, example, tmp_path / "big.onnx", {0: {0: "batch"}}, [(2, 64), (5, 64)], compile=False)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]
    assert os.path.getsize(tmp_path / "big.onnx.data") > os.path.getsize(tmp_path / "big.onnx")
