"""What a plugin's kernel_launch receives, as docs/vendor/implement.md states it ("These hold for
every launch Oar's runtime makes"): every attr with its default filled in, dims as the user wrote
them, matmul operands of rank >= 2 with equal batch dims, broadcast inputs expanded with stride 0.
Seen through oar.capture's observer, which sees each launch as the runtime hands it on."""

import numpy as np

import oar
from oar import capture


class Launches(capture.Observer):
    def __init__(self):
        self.launches = []

    def launch(self, op, inputs, outputs, attrs, fresh_outputs):
        self.launches.append((op, inputs, outputs, dict(attrs)))
        return False

    def before_host_read(self, tensor):
        pass


def _launch_of(seen, op):
    found = [entry for entry in seen.launches if entry[0] == op]
    assert found, f"no {op} launch among {[entry[0] for entry in seen.launches]}"
    return found[0]


def test_a_negative_dim_arrives_as_written_with_the_other_attrs_defaulted(dev):
    x = oar.tensor(np.ones((2, 3), dtype=np.float32), device=dev)
    with capture.observe(Launches()) as seen:
        oar.sum(x, dim=[-1])
        oar.softmax(x, dim=-1)
    _, _, _, attrs = _launch_of(seen, "sum")
    assert list(attrs["dim"]) == [-1] and attrs["keepdim"] is False
    _, _, _, attrs = _launch_of(seen, "softmax")
    assert attrs["dim"] == -1


def test_a_vector_operand_of_matmul_arrives_as_a_matrix(dev):
    a = np.arange(3, dtype=np.float32)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    with capture.observe(Launches()) as seen:
        result = oar.matmul(oar.tensor(a, device=dev), oar.tensor(b, device=dev))
    _, inputs, outputs, _ = _launch_of(seen, "matmul")
    assert [tuple(t.shape) for t in inputs] == [(1, 3), (3, 4)] and tuple(outputs[0].shape) == (1, 4)
    assert tuple(result.shape) == (4,)  # the added dim is dropped from the result
    np.testing.assert_allclose(result.numpy(), a @ b, rtol=1e-6)


def test_matmul_batch_dims_arrive_equal_with_a_broadcast_one_at_stride_0(dev):
    a = np.ones((2, 3, 4), dtype=np.float32)
    b = np.ones((4, 5), dtype=np.float32)
    with capture.observe(Launches()) as seen:
        oar.matmul(oar.tensor(a, device=dev), oar.tensor(b, device=dev))
    _, inputs, outputs, _ = _launch_of(seen, "matmul")
    assert [tuple(t.shape) for t in inputs] == [(2, 3, 4), (2, 4, 5)] and tuple(outputs[0].shape) == (2, 3, 5)
    assert inputs[1].stride()[0] == 0


def test_a_broadcast_input_arrives_expanded_with_stride_0(dev):
    x = oar.tensor(np.ones((2, 3), dtype=np.float32), device=dev)
    row = oar.tensor(np.arange(3, dtype=np.float32), device=dev)
    with capture.observe(Launches()) as seen:
        oar.add(x, row)
    _, inputs, _, _ = _launch_of(seen, "add")
    assert tuple(inputs[1].shape) == (2, 3) and inputs[1].stride()[0] == 0
