"""oar.einsum with '...' (ellipsis) subscripts against torch.einsum: values and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar

CASES = [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),       # batched matmul
    ("...ij,...jk->...ik", [(3, 1, 2, 4), (5, 4, 3)]),    # broadcast batch dims of different ranks
    ("...ij,...jk->ik", [(2, 3, 4), (2, 4, 5)]),          # ellipsis dims summed
    ("...ij,jk", [(2, 3, 4), (4, 5)]),                    # implicit output: ellipsis dims first
    ("i...->...", [(3, 4, 5)]),
    ("...,...", [(3, 1), (4,)]),
    ("b...i,bi->b...", [(2, 3, 4, 5), (2, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),    # no ellipsis: unchanged path
    ("...d,...d->...", [(2, 3, 5), (3, 5)]),
    ("...->...", [(2, 3)]),
    ("ij...,jk...->ik...", [(2, 3, 4), (3, 5, 4)]),     # ellipsis last
    ("...ij->...ji", [(4, 2, 3)]),
]


@pytest.mark.parametrize("equation,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_ellipsis_matches_torch(equation, shapes):
    arrays = [np.random.default_rng(k).uniform(-1, 1, s) for k, s in enumerate(shapes)]
    ours = [oar.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, want = oar.einsum(equation, *ours), torch.einsum(equation, *theirs)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    weight = np.random.default_rng(9).uniform(-1, 1, tuple(want.shape))
    (got * oar.tensor(weight)).sum().backward()
    (want * torch.tensor(weight)).sum().backward()
    for k, (o, t) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"operand {k}")


@pytest.mark.parametrize("equation,shapes,message", [
    ("....ij", [(2, 3)], r"'\.' only as one '\.\.\.'"),
    ("...ij,...j->...i", [(3,), (3,)], "subscripts '...ij' for an operand of 1 dims"),
    ("ij,...", [(2, 3, 4), (2,)], "subscripts 'ij' for an operand of 3 dims"),
    ("...ij", [(2, 3), (2, 3)], "1 subscripts for 2 operands"),
])
def test_einsum_ellipsis_errors_name_the_term(equation, shapes, message):
    with pytest.raises(ValueError, match=message):
        oar.einsum(equation, *[oar.tensor(np.zeros(s)) for s in shapes])
