"""gather, scatter, scatter_add, index_select and the element path of index_put (x[i, j] = / += v)
against torch on the CPU plugin: int32 and int64 indices, dim first, middle and last, strided
(transposed, sliced) inputs, and sizes past the threading threshold (32768 index elements).
Values moved are compared exactly; sums use integer-valued floats (exact in any order) or 1e-6
relative. Repeated scatter targets take the last write, sums repeat bitwise; bad indices are named."""

import numpy as np
import pytest
import torch

import oar

RNG = np.random.default_rng(13)
SIZES = {"small": (3, 5, 4), "threaded": (8, 96, 64)}  # the threaded one has >= 32768 index elements


def _x(shape, strided, integral=False):
    """x of shape as (oar, torch); strided: a transposed view of a [C, B, A] tensor."""
    values = RNG.integers(-50, 50, shape[::-1]).astype(np.float32) if integral else \
        RNG.standard_normal(shape[::-1]).astype(np.float32)
    ox, tx = oar.tensor(values), torch.tensor(values)
    if strided:
        return ox.permute(2, 1, 0), tx.permute(2, 1, 0)
    return oar.tensor(np.ascontiguousarray(values.transpose(2, 1, 0))), torch.tensor(values.transpose(2, 1, 0))


def _indices(shape, high, index_dtype, strided):
    """Index values in [0, high) of shape as (oar, torch int64); strided: every other last-dim column."""
    full = list(shape)
    if strided:
        full[-1] *= 2
    values = RNG.integers(0, high, full).astype(index_dtype)
    oi = oar.tensor(values)
    if strided:
        return oi[:, :, ::2], torch.tensor(values[:, :, ::2].astype(np.int64))
    return oi, torch.tensor(values.astype(np.int64))


def _along_shape(x_shape, dim, count):
    shape = list(x_shape)
    shape[dim] = count
    return tuple(shape)


def _case(size, dim):
    x_shape = SIZES[size]
    count = x_shape[dim] + 3 if size == "small" else (x_shape[dim] * 5) // 6 + 1
    return x_shape, _along_shape(x_shape, dim, count)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("strided", [False, True])
def test_gather_matches_torch(size, dim, index_dtype, strided):
    x_shape, index_shape = _case(size, dim)
    ox, tx = _x(x_shape, strided)
    oi, ti = _indices(index_shape, x_shape[dim], index_dtype, strided)
    got = oar.ops.gather(ox, oi, dim=dim).numpy()
    np.testing.assert_array_equal(got, torch.gather(tx, dim, ti).numpy())


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("strided", [False, True])
def test_scatter_and_scatter_add_match_torch(size, dim, index_dtype, strided):
    x_shape = SIZES[size]
    index_shape = _along_shape(x_shape, dim, max(1, x_shape[dim] // 2))
    ox, tx = _x(x_shape, strided, integral=True)
    oi, ti = _indices(index_shape, x_shape[dim], index_dtype, strided)
    osrc, tsrc = _x(index_shape, strided, integral=True)
    got = oar.ops.scatter_add(ox, oi, osrc, dim=dim).numpy()  # integral values: exact in any order
    np.testing.assert_array_equal(got, torch.scatter_add(tx, dim, ti, tsrc).numpy())
    # scatter with repeated targets: the last write along dim wins (a numpy loop in that order)
    want = tx.numpy().copy()
    index, source = ti.numpy(), tsrc.numpy()
    moved_index, moved_source = np.moveaxis(index, dim, 0), np.moveaxis(source, dim, 0)
    moved_want = np.moveaxis(want, dim, 0)  # a view: writes land in want
    rest = np.indices(moved_index.shape[1:])
    for k in range(moved_index.shape[0]):
        moved_want[(moved_index[k], *rest)] = moved_source[k]
    np.testing.assert_array_equal(oar.ops.scatter(ox, oi, osrc, dim=dim).numpy(), want)


def test_scatter_add_float_sums_repeat_bitwise_and_match_torch():
    x = RNG.standard_normal((64, 1024)).astype(np.float32)
    index = RNG.integers(0, 16, (64, 768))  # many repeats per target
    source = RNG.standard_normal((64, 768)).astype(np.float32)
    ox, oi, osrc = oar.tensor(x), oar.tensor(index), oar.tensor(source)
    first = oar.ops.scatter_add(ox, oi, osrc, dim=1).numpy()
    np.testing.assert_array_equal(oar.ops.scatter_add(ox, oi, osrc, dim=1).numpy(), first)
    want = torch.scatter_add(torch.tensor(x), 1, torch.tensor(index), torch.tensor(source)).numpy()
    np.testing.assert_allclose(first, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("strided", [False, True])
def test_index_select_matches_torch(dim, index_dtype, strided):
    x_shape = (16, 40, 64)
    ox, tx = _x(x_shape, strided)
    values = RNG.integers(0, x_shape[dim], 3 * x_shape[dim]).astype(index_dtype)
    got = oar.ops.index_select(ox, oar.tensor(values), dim=dim).numpy()
    np.testing.assert_array_equal(got, torch.index_select(tx, dim, torch.tensor(values.astype(np.int64))).numpy())


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("strided", [False, True])
def test_index_put_elements_match_torch(index_dtype, strided):
    rows, cols, count = 300, 128, 5000
    ox, tx = _x((rows, cols, 1), strided, integral=True)
    ox, tx = ox[:, :, 0], tx[:, :, 0]
    i = RNG.integers(-rows, rows, count).astype(index_dtype)  # negatives count from the end
    j = RNG.integers(-cols, cols, count).astype(index_dtype)
    values = RNG.integers(-9, 9, count).astype(np.float32)
    stacked, ov = oar.tensor(np.stack([i, j])), oar.tensor(values)
    key = (torch.tensor(i.astype(np.int64)), torch.tensor(j.astype(np.int64)))
    got = oar.ops.index_put(ox, stacked, ov, accumulate=True).numpy()  # integral: exact in any order
    np.testing.assert_array_equal(got, tx.index_put(key, torch.tensor(values), accumulate=True).numpy())
    # without accumulate, repeated positions take the last value
    want = tx.numpy().copy()
    for a, b, v in zip(i, j, values):
        want[a, b] = v
    np.testing.assert_array_equal(oar.ops.index_put(ox, stacked, ov, accumulate=False).numpy(), want)


@pytest.mark.parametrize("op", ["gather", "scatter", "scatter_add", "index_select"])
@pytest.mark.parametrize("past_the_end", [True, False])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_out_of_range_index_is_named(op, past_the_end, index_dtype):
    x = oar.tensor(RNG.standard_normal((96, 64)).astype(np.float32))
    dim, size = (0, 96) if op == "index_select" else (1, 64)
    shape = (96 * 64,) if op == "index_select" else (96, 400)  # both past the threading threshold
    values = RNG.integers(0, size, shape).astype(index_dtype)
    bad = size if past_the_end else -1
    element = values.size - 7
    values.reshape(-1)[element] = bad
    index = oar.tensor(values)
    source = oar.tensor(RNG.standard_normal(shape).astype(np.float32))
    call = {"gather": lambda: oar.ops.gather(x, index, dim=dim),
            "scatter": lambda: oar.ops.scatter(x, index, source, dim=dim),
            "scatter_add": lambda: oar.ops.scatter_add(x, index, source, dim=dim),
            "index_select": lambda: oar.ops.index_select(x, index, dim=dim)}[op]
    pattern = (rf"kernel {op}: index {bad} \(element {element} of the indices\) is out of range "
               rf"for dim {dim} of x: allowed \[0, {size}\)")
    with pytest.raises(Exception, match=pattern):
        call().numpy()


@pytest.mark.parametrize("op", ["scatter", "scatter_add"])
def test_threads_keep_each_line_along_dim_in_order(op):
    # dim 0 with every index in [0, 4): all 4096 rows collide on 4 targets, so a split along dim
    # would lose sums or reorder writes
    x = RNG.integers(-50, 50, (4096, 256)).astype(np.float32)
    index = RNG.integers(0, 4, (4096, 256))
    source = RNG.integers(-50, 50, (4096, 256)).astype(np.float32)
    ox, oi, osrc = oar.tensor(x), oar.tensor(index), oar.tensor(source)
    want = x.copy()
    for k in range(4096):
        if op == "scatter":
            want[index[k], np.arange(256)] = source[k]
        else:
            want[index[k], np.arange(256)] += source[k]
    for _ in range(3):
        np.testing.assert_array_equal(getattr(oar.ops, op)(ox, oi, osrc, dim=0).numpy(), want)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("strided", [False, True])
def test_index_elements_match_torch(index_dtype, strided):
    rows, cols, count = 300, 128, 5000
    ox, tx = _x((rows, cols, 1), strided)
    ox, tx = ox[:, :, 0], tx[:, :, 0]
    i = RNG.integers(-rows, rows, count).astype(index_dtype)  # negatives count from the end
    j = RNG.integers(-cols, cols, count).astype(index_dtype)
    got = oar.ops.index(ox, oar.tensor(np.stack([i, j]))).numpy()
    np.testing.assert_array_equal(got, tx[torch.tensor(i.astype(np.int64)), torch.tensor(j.astype(np.int64))].numpy())


@pytest.mark.parametrize("op", ["index", "index_put"])
@pytest.mark.parametrize("bad", [128, -129])
def test_index_element_path_names_a_bad_index(op, bad):
    x = oar.tensor(RNG.standard_normal((300, 128)).astype(np.float32))
    i, j = RNG.integers(0, 300, 5000), RNG.integers(0, 128, 5000)
    j[4321] = bad
    stacked = oar.tensor(np.stack([i, j]))
    call = (lambda: oar.ops.index(x, stacked)) if op == "index" else \
        (lambda: oar.ops.index_put(x, stacked, oar.tensor(np.ones(5000, np.float32)), accumulate=True))
    pattern = (rf"kernel {op}: index {bad} \(element 4321 of index tensor 1\) is out of range for dim 1 "
               rf"of x \(size 128\): allowed \[-128, 128\)")
    with pytest.raises(Exception, match=pattern):
        call().numpy()


@pytest.mark.parametrize("op", ["embedding", "index_add", "one_hot"])
def test_threaded_range_check_names_the_first_bad_index(op):
    values = RNG.integers(0, 40, 40000)  # past the threading threshold
    values[[30001, 35000]] = [40, -2]  # the first bad one is named
    index = oar.tensor(values)
    table = oar.tensor(RNG.standard_normal((40, 8)).astype(np.float32))
    call = {"embedding": lambda: oar.ops.embedding(table, index),
            "index_add": lambda: oar.ops.index_add(table, oar.tensor(np.ones((40000, 8), np.float32)), index, dim=0),
            "one_hot": lambda: oar.ops.one_hot(index, num_classes=40)}[op]
    what = {"embedding": "the rows of weight", "index_add": "dim 0 of x", "one_hot": "num_classes"}[op]
    with pytest.raises(Exception, match=rf"kernel {op}: index 40 \(element 30001 of the indices\) is out of range "
                                        rf"for {what}: allowed \[0, 40\)"):
        call().numpy()
