"""Shape and byte-size products are overflow-checked: a shape past int64 elements or bytes
raises oar.ShapeError instead of allocating a wrapped-around size (issue 20)."""

import pytest

import oar
from oar import _C


@pytest.mark.parametrize("make,message", [
    (lambda: oar.empty(2**62 + 1, 4), r"empty: the shape \(4611686018427387905, 4\) has more than 2\*\*63 - 1 elements"),
    (lambda: oar.empty(2**62), r"empty: the shape \(4611686018427387904,\) of 4-byte elements needs more than 2\*\*63 - 1 bytes"),
    (lambda: oar.empty(2**61, dtype=oar.float64), r"of 8-byte elements needs more than"),
    (lambda: oar.zeros(2**32, 2**32), r"has more than 2\*\*63 - 1 elements"),
    (lambda: oar.full((2**62, 2, 2), 1.0), r"has more than 2\*\*63 - 1 elements"),
    (lambda: oar.ones(2).reshape(2**62, 4, 0), r"reshape: 4611686018427387904 \* 4 overflows int64"),
    (lambda: oar.ones(1).expand(2**62, 4), r"expand: the shape \(4611686018427387904, 4\) has more than"),
    (lambda: _C._as_strided(oar.ones(4), [2**62, 4], [1, 1], 0), r"as_strided: the shape .* has more than"),
    (lambda: _C._as_strided(oar.ones(4), [2, 2], [2**62, 2**62], 0), r"as_strided: .* overflows int64"),
])
def test_sizes_past_int64_raise_shape_error(make, message):
    with pytest.raises(oar.ShapeError, match=message):
        make()


def test_broadcast_output_past_int64_raises_before_allocating():
    a = oar.zeros(1, 1).expand(2**40, 1)  # views: no memory
    b = oar.zeros(1, 1).expand(1, 2**40)
    with pytest.raises(oar.ShapeError, match=r"empty: the shape \(1099511627776, 1099511627776\) has more than"):
        a + b


def test_memory_is_intact_after_the_errors():
    x = oar.arange(6).reshape(2, 3)
    for shape in [(2**62 + 1, 4), (2**62,)]:
        with pytest.raises(oar.ShapeError):
            oar.empty(*shape)
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert oar.empty(0, 2**62, 4).shape == (0, 2**62, 4)  # a zero extent: no elements, no overflow
