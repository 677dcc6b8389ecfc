"""Tensor features built as Python compositions of the ops of interface/ops.yaml.

Each function here runs only device ops (no host fallback), so autograd records
it through those ops. Which ones are compositions, and of what:

- indexing with integer tensors / lists and boolean masks (``x[idx]``, ``x[mask]``,
  ``x[idx] = v``, ``index_put_`` with ``accumulate``): the basic part of the key
  as a view, then the ``index`` (reading) or ``index_put`` (writing) op over the
  tensor-indexed dims (moved to the front when not adjacent, as torch). A boolean mask's
  positions are read on the host (its result's size depends on its values, as in
  torch, which synchronizes too); ``x[mask] = scalar`` with a full-shape mask is a
  ``where`` with no host round trip;
- ``masked_fill`` (``where``), ``repeat`` (``expand`` + ``reshape``),
  ``repeat_interleave`` (``index_select``), ``narrow`` (``slice``);
- ``floor_divide`` / ``remainder`` are kernels; ``div(rounding_mode="trunc")`` is
  ``floor_divide`` corrected where the signs differ; ``add`` / ``sub`` with ``alpha``;
  ``clamp`` with tensor bounds (``maximum`` / ``minimum``);
- ``std`` (``sqrt`` of ``var``), ``var`` with a float ``correction`` (``var`` with
  correction 0, rescaled), ``argmax`` / ``argmin`` without ``dim`` (of the flattened
  tensor), ``sort`` and ``topk`` (``argsort`` + ``gather``);
- ``addmm``, ``baddbmm`` (``matmul`` / ``bmm``, scaled and added), ``einsum``
  (``permute``, ``reshape`` and ``bmm``), ``relu6`` (``hardtanh(x, 0, 6)``);
- ``new_zeros`` / ``new_ones`` / ``new_full``.
"""

from __future__ import annotations

import math
import string
from collections import namedtuple
from typing import Any, Sequence

import numpy as np

from oar import ops as _ops
from oar.tensor import Tensor, dtype_of, full, to_tensor

__all__ = [
    "index", "index_put", "masked_fill", "repeat", "repeat_interleave", "narrow", "floor_divide", "remainder",
    "div", "add", "sub", "clamp", "std", "var", "argmax", "argmin", "sort", "topk", "addmm", "baddbmm", "einsum",
    "relu6", "amax", "amin", "multinomial", "SortResult", "TopkResult",
]

# ops whose oar.<name> is the torch-signature function here rather than the op function itself
TORCH_SIGNATURES = ("div", "clamp", "var", "argmax", "argmin")

SortResult = namedtuple("SortResult", ["values", "indices"])
TopkResult = namedtuple("TopkResult", ["values", "indices"])

_INDEX_DTYPES = ("int32", "int64")


# ---- indexing with tensors ---------------------------------------------------------------------

def has_tensor_index(key: Any) -> bool:
    """Whether key holds an integer/bool tensor, a list or an ndarray (advanced indexing)."""
    items = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (Tensor, list, np.ndarray)) for k in items)


def _as_index_tensor(item: Any, device) -> Tensor:
    if isinstance(item, Tensor):
        return item
    array = np.asarray(item)
    if array.dtype == object:
        raise IndexError(f"index lists must hold ints or bools, got {item!r}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype != np.bool_ and not np.issubdtype(array.dtype, np.integer):
        raise IndexError(f"tensors used as indices must be integer or bool, got {array.dtype}")
    return to_tensor(array, device=device)


def _plan(x: Tensor, key: Any):
    """(basic key, [(dim in the basic view, index tensor)], ndim of the basic view)."""
    items = list(key) if isinstance(key, tuple) else [key]
    consumed = 0
    for item in items:
        if item is None or item is Ellipsis:
            continue
        if isinstance(item, (Tensor, list, np.ndarray)):
            t = _as_index_tensor(item, x.device)
            consumed += t.ndim if t.dtype.name == "bool" else 1
        else:
            consumed += 1
    ellipses = [k for k, item in enumerate(items) if item is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > x.ndim:
        raise IndexError(f"too many indices for a tensor of dimension {x.ndim}")
    if ellipses:
        items[ellipses[0]:ellipses[0] + 1] = [slice(None)] * (x.ndim - consumed)
    basic, advanced = [], []
    in_dim = out_dim = 0
    for item in items:
        if isinstance(item, (Tensor, list, np.ndarray)):
            t = _as_index_tensor(item, x.device)
            if t.dtype.name == "bool":
                mask_shape = tuple(x.shape[in_dim:in_dim + t.ndim])
                if tuple(t.shape) != mask_shape:
                    raise IndexError(f"the shape of the mask {tuple(t.shape)} does not match the shape of the "
                                     f"indexed tensor's dims {in_dim}..{in_dim + t.ndim - 1}: {mask_shape}")
                positions = np.nonzero(t.numpy())  # the result's size depends on the values
                for p in positions:
                    advanced.append((out_dim, to_tensor(p.astype(np.int64), device=x.device)))
                    basic.append(slice(None))
                    in_dim += 1
                    out_dim += 1
                if t.ndim == 0:  # x[True] / x[False]: a new dim of size 1 / 0
                    keep = bool(t.item())
                    basic.append(None)
                    advanced.append((out_dim, to_tensor(np.zeros(1 if keep else 0, np.int64), device=x.device)))
                    out_dim += 1
                continue
            if t.dtype.name not in _INDEX_DTYPES and t.dtype.name != "int8":
                raise IndexError(f"tensors used as indices must be integer or bool, got {t.dtype.name}")
            advanced.append((out_dim, t))
            basic.append(slice(None))
            in_dim += 1
            out_dim += 1
        elif item is None:
            basic.append(None)
            out_dim += 1
        elif isinstance(item, slice):
            basic.append(item)
            in_dim += 1
            out_dim += 1
        else:  # an int
            basic.append(item)
            in_dim += 1
    return tuple(basic), advanced, out_dim


def _broadcast_shape(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


def _stacked_indices(advanced) -> tuple[Tensor, tuple[int, ...]]:
    """The index tensors broadcast to one shape B and stacked as [k, *B] int64 (the ops' indices input)."""
    shape = _broadcast_shape([t.shape for _, t in advanced])
    rows = []
    for _, t in advanced:
        t = t if t.dtype.name == "int64" else t.to("int64")
        if tuple(t.shape) != shape:
            t = t.expand(shape)
        rows.append(t.reshape([1] + list(shape)))
    return (rows[0] if len(rows) == 1 else _ops.concat(rows, dim=0)), shape


def _placement(dims: list[int]) -> bool:
    """numpy's rule: adjacent advanced dims keep their place, else the result's go first."""
    return all(b == a + 1 for a, b in zip(dims, dims[1:]))


def _advanced_target(view: Tensor, advanced) -> tuple[Tensor, int, Tensor, tuple[int, ...]]:
    """(view with the indexed dims adjacent, the first of them, stacked indices, B): the index ops' operands.
    Non-adjacent index tensors move their dims to the front, so B comes first as in torch."""
    dims = [d for d, _ in advanced]
    stacked, shape = _stacked_indices(advanced)
    if _placement(dims):
        return view, dims[0], stacked, shape
    rest = [d for d in range(view.ndim) if d not in dims]
    return view.permute(dims + rest), 0, stacked, shape


def index(x: Tensor, key: Any) -> Tensor:
    """x[key] where key holds integer tensors/lists or bool masks (numpy/torch advanced indexing):
    the basic part of key as a view, then the ``index`` op over the tensor-indexed dims."""
    basic, advanced, _ = _plan(x, key)
    from oar import _C

    view = _C.TensorBase.__getitem__(x, basic)
    if not advanced:
        return view
    target, dim, stacked, _ = _advanced_target(view, advanced)
    return _ops.index(target, stacked, dim=dim)


def index_put(x: Tensor, key: Any, value: Any, accumulate: bool = False) -> Tensor:
    """x[key] = value (accumulate: +=, duplicates all added) in place; key as for :func:`index`;
    the ``index_put`` op writes the tensor-indexed dims."""
    from oar import _C

    items = key if isinstance(key, tuple) else (key,)
    if (not accumulate and len(items) == 1 and isinstance(items[0], Tensor) and items[0].dtype.name == "bool"
            and tuple(items[0].shape) == tuple(x.shape[:items[0].ndim])
            and (not isinstance(value, Tensor) or value.ndim == 0)):
        mask = items[0].reshape(list(items[0].shape) + [1] * (x.ndim - items[0].ndim))
        x.copy_(_ops.where(mask, value if isinstance(value, Tensor) else _scalar_like(x, value), x))
        return x
    basic, advanced, _ = _plan(x, key)
    view = _C._index_view(x, basic)  # shares x's storage: writes into it land in x
    if not isinstance(value, Tensor):
        value = to_tensor(value, dtype=x.dtype, device=x.device)
    elif value.dtype != x.dtype:
        value = value.to(x.dtype)
    if not advanced:
        if accumulate:
            view.copy_(view + value)
        else:
            view.copy_(value)
        return x
    target, updated = _put(view, advanced, value, accumulate)
    target.copy_(updated)
    return x


def _put(view: Tensor, advanced, value: Tensor, accumulate: bool) -> tuple[Tensor, Tensor]:
    """(the view index_put wrote, the op's result for it): value broadcast to the indexed shape."""
    target, dim, stacked, shape = _advanced_target(view, advanced)
    placed = list(target.shape[:dim]) + list(shape) + list(target.shape[dim + len(advanced):])
    if tuple(value.shape) != tuple(placed):
        if value.ndim > len(placed) or any(v not in (1, p) for v, p in zip(reversed(value.shape), reversed(placed))):
            raise ValueError(f"shape mismatch: value of shape {tuple(value.shape)} cannot be broadcast to the "
                             f"indexing result of shape {tuple(placed)}")
        value = value.expand(placed)
    return target, _ops.index_put(target, stacked, value, dim=dim, accumulate=accumulate)


def index_put_out_of_place(x: Tensor, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Tensor:
    """torch's Tensor.index_put: x with x[indices] = values (or +=), a new tensor recorded by autograd."""
    basic, advanced, _ = _plan(x, tuple(indices))
    if any(item is not None and item != slice(None) for item in basic) or not advanced:
        raise IndexError("index_put: indices must be a tuple of integer or bool tensors")
    if None in basic:  # a 0-d bool mask adds a dim
        return index_put(x.clone(), tuple(indices), values, accumulate=accumulate)
    if not isinstance(values, Tensor):
        values = to_tensor(values, dtype=x.dtype, device=x.device)
    elif values.dtype != x.dtype:
        values = values.to(x.dtype)
    target, updated = _put(x, advanced, values, accumulate)
    if target is x:
        return updated
    dims = [d for d, _ in advanced]
    order = dims + [d for d in range(x.ndim) if d not in dims]
    return updated.permute([order.index(d) for d in range(x.ndim)])


def _scalar_like(x: Tensor, value: Any) -> Tensor:
    return to_tensor(value, dtype=x.dtype, device=x.device)


def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    """x with value where mask (bool, broadcast to x) is true."""
    if mask.dtype.name != "bool":
        raise TypeError(f"masked_fill: mask must be a bool tensor, got {mask.dtype.name}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape {tuple(value.shape)}")
        fill = value.to(x.dtype)
    else:
        fill = _scalar_like(x, value)
    out = _ops.where(mask, fill, x)
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"masked_fill: mask of shape {tuple(mask.shape)} does not broadcast to x's {tuple(x.shape)}")
    return out


# ---- shapes ------------------------------------------------------------------------------------

def repeat(x: Tensor, *sizes: Any) -> Tensor:
    """torch's Tensor.repeat: x tiled sizes[i] times along each dim (leading new dims allowed)."""
    reps = [int(s) for s in (sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int) else sizes)]
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: {len(reps)} repeat counts for a {x.ndim}-d tensor (need at least {x.ndim})")
    if any(r < 0 for r in reps):
        raise ValueError(f"repeat: repeat counts must be >= 0, got {reps}")
    shape = [1] * (len(reps) - x.ndim) + list(x.shape)
    # [.., 1, s, ..] expanded to [.., r, s, ..], then merged: each dim's copies are outermost
    interleaved = []
    for r, s in zip(reps, shape):
        interleaved += [1, s]
    expanded = []
    for r, s in zip(reps, shape):
        expanded += [r, s]
    return x.reshape(interleaved).expand(expanded).reshape([r * s for r, s in zip(reps, shape)])


def repeat_interleave(x: Tensor, repeats: Any, dim: int | None = None) -> Tensor:
    """Each element (or slice along dim) repeated repeats times (an int or a 1-D tensor of counts)."""
    if dim is None:
        x, dim = x.reshape([-1]), 0
    dim = dim % max(x.ndim, 1)
    size = x.shape[dim]
    counts = repeats.numpy().astype(np.int64) if isinstance(repeats, Tensor) else np.asarray(repeats, np.int64)
    if counts.ndim == 0:
        counts = np.full(size, int(counts), np.int64)
    if counts.shape != (size,):
        raise ValueError(f"repeat_interleave: repeats must be an int or have {size} entries, got shape {counts.shape}")
    if np.any(counts < 0):
        raise ValueError("repeat_interleave: repeats must be >= 0")
    positions = to_tensor(np.repeat(np.arange(size, dtype=np.int64), counts), device=x.device)
    return _ops.index_select(x, positions, dim=dim)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The view x[..., start:start + length, ...] along dim (start may be negative)."""
    size = x.shape[dim]
    if start < 0:
        start += size
    if not 0 <= start <= size or length < 0 or start + length > size:
        raise IndexError(f"narrow: start {start} and length {length} do not fit dim {dim} of size {size}")
    return _ops.slice(x, dim=dim, start=start, stop=start + length)


# ---- arithmetic -------------------------------------------------------------------------------

def floor_divide(a: Any, b: Any) -> Tensor:
    return _ops.floor_divide(a, b)


def remainder(a: Any, b: Any) -> Tensor:
    return _ops.remainder(a, b)


def div(a: Any, b: Any, *, rounding_mode: str | None = None) -> Tensor:
    """a / b (true division), or rounded: "floor" (floor_divide), "trunc" (toward zero)."""
    if rounding_mode is None:
        return _ops.div(a, b)
    if rounding_mode == "floor":
        return _ops.floor_divide(a, b)
    if rounding_mode == "trunc":
        floored = _ops.floor_divide(a, b)
        # floor and trunc differ by one where the quotient is negative and inexact
        inexact = _ops.logical_and(_ops.ne(_ops.remainder(a, b), 0),
                                   _ops.ne(_ops.lt(a, 0), _ops.lt(b, 0)))
        return _ops.where(inexact, floored + 1, floored)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', not {rounding_mode!r}")


def add(a: Any, b: Any, *, alpha: Any = 1) -> Tensor:
    """a + alpha * b."""
    return _ops.add(a, b if alpha == 1 else b * alpha)


def sub(a: Any, b: Any, *, alpha: Any = 1) -> Tensor:
    """a - alpha * b."""
    return _ops.sub(a, b if alpha == 1 else b * alpha)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """min(max(x, min), max) with numbers (the clamp op) or tensors (maximum / minimum) as bounds."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if not isinstance(min, Tensor) and not isinstance(max, Tensor):
        return _ops.clamp(x, min=-math.inf if min is None else min, max=math.inf if max is None else max)
    out = x
    if min is not None:
        out = _ops.maximum(out, min)
    if max is not None:
        out = _ops.minimum(out, max)
    return out


# ---- reductions, sorting ----------------------------------------------------------------------

def var(x: Tensor, dim: Any = None, *, correction: Any = 1, keepdim: bool = False, unbiased: Any = None) -> Tensor:
    """The variance over dim with a correction (int or float; unbiased=False is correction 0)."""
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = [] if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    if float(correction) == int(correction):
        return _ops.var(x, dim=dims, correction=int(correction), keepdim=keepdim)
    count = math.prod(x.shape[d] for d in dims) if dims else x.numel()
    biased = _ops.var(x, dim=dims, correction=0, keepdim=keepdim)
    return biased * (count / max(0.0, count - float(correction)) if count - float(correction) > 0 else math.inf)


def std(x: Tensor, dim: Any = None, *, correction: Any = 1, keepdim: bool = False, unbiased: Any = None) -> Tensor:
    """sqrt(var(x, dim, correction))."""
    return _ops.sqrt(var(x, dim, correction=correction, keepdim=keepdim, unbiased=unbiased))


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index of the first largest value along dim, or in the flattened tensor."""
    if dim is None:
        out = _ops.argmax(x.reshape([-1]), dim=0)
        return out.reshape([1] * x.ndim) if keepdim else out
    return _ops.argmax(x, dim=dim, keepdim=keepdim)


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """The index of the first smallest value along dim, or in the flattened tensor."""
    if dim is None:
        out = _ops.argmin(x.reshape([-1]), dim=0)
        return out.reshape([1] * x.ndim) if keepdim else out
    return _ops.argmin(x, dim=dim, keepdim=keepdim)


def amax(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return _ops.max(x, dim=[dim] if isinstance(dim, int) else list(dim), keepdim=keepdim)


def amin(x: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    return _ops.min(x, dim=[dim] if isinstance(dim, int) else list(dim), keepdim=keepdim)


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> SortResult:
    """(values, indices) sorted along dim; stable always (ties keep their order)."""
    indices = _ops.argsort(x, dim=dim, descending=descending)
    if x.ndim == 0:
        return SortResult(x.clone(), indices)
    return SortResult(_ops.gather(x, indices, dim=dim), indices)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopkResult:  # noqa: A002
    """The k largest (or smallest) values along dim and their positions, in order."""
    size = x.shape[dim] if x.ndim else 1
    if not 0 <= k <= size:
        raise ValueError(f"topk: k ({k}) is out of range for dim {dim} of size {size}")
    indices = _ops.argsort(x, dim=dim, descending=largest)
    if x.ndim == 0:
        return TopkResult(x.clone(), indices)
    indices = _ops.slice(indices, dim=dim, start=0, stop=k).contiguous()
    return TopkResult(_ops.gather(x, indices, dim=dim), indices)


# ---- linear algebra ---------------------------------------------------------------------------

def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:  # noqa: A002
    """beta * input + alpha * (mat1 @ mat2); beta == 0 ignores input (NaN included), as torch."""
    product = _ops.matmul(mat1, mat2)
    return _scaled_sum(input, product, beta, alpha)


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:  # noqa: A002
    """beta * input + alpha * (batch1 @ batch2) per batch."""
    product = _ops.bmm(batch1, batch2)
    return _scaled_sum(input, product, beta, alpha)


def _scaled_sum(input: Tensor, product: Tensor, beta: Any, alpha: Any) -> Tensor:  # noqa: A002
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # input is not read (its NaNs do not propagate), only its shape broadcasts
        shape = _broadcast_shape([product.shape, input.shape])
        return product if tuple(product.shape) == shape else product.expand(list(shape)).contiguous()
    return product + (input if beta == 1 else input * beta)


def einsum(equation: str, *operands: Any) -> Tensor:
    """torch.einsum over explicit or implicit output subscripts, '...' included (broadcast as
    torch), lowered to permute, reshape, sum and bmm: operands are contracted left to right, two
    at a time."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    equation = equation.replace(" ", "")
    if "." in equation:
        equation = _einsum_expand_ellipsis(equation, operands)
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} subscripts for {len(operands)} operands in {equation!r}")
    sizes: dict[str, int] = {}
    for term, t in zip(terms, operands):
        if len(term) != t.ndim:
            raise ValueError(f"einsum: subscripts {term!r} for an operand of {t.ndim} dims")
        for letter, size in zip(term, t.shape):
            if not letter.isalpha():
                raise ValueError(f"einsum: invalid subscript {letter!r} in {equation!r}")
            if sizes.setdefault(letter, size) != size and size != 1 and sizes[letter] != 1:
                raise ValueError(f"einsum: subscript {letter!r} has sizes {sizes[letter]} and {size}")
            sizes[letter] = builtin_max(sizes[letter], size)
    if not arrow:
        counts = {c: inputs.count(c) for c in set(inputs) if c.isalpha()}
        output = "".join(sorted(c for c, n in counts.items() if n == 1))
    for c in output:
        if c not in sizes:
            raise ValueError(f"einsum: output subscript {c!r} appears in no input")
    current, current_term = _einsum_diagonal_free(operands[0], terms[0])
    for k in range(1, len(operands)):
        later = "".join(terms[k + 1:]) + output
        nxt, nxt_term = _einsum_diagonal_free(operands[k], terms[k])
        current, current_term = _contract_pair(current, current_term, nxt, nxt_term, later, sizes)
    # sum what the output does not keep, then order as the output
    drop = [i for i, c in enumerate(current_term) if c not in output]
    if drop:
        current = _ops.sum(current, dim=drop)
        current_term = "".join(c for c in current_term if c in output)
    if current_term != output:
        current = current.permute([current_term.index(c) for c in output])
    return current


def _einsum_expand_ellipsis(equation: str, operands) -> str:
    """The equation with each '...' spelled out in letters it does not use: an operand's '...'
    covers its dims without a subscript, right-aligned across operands (they broadcast); the
    implicit output puts them first, as torch; an explicit output without '...' sums them."""
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} subscripts for {len(operands)} operands in {equation!r}")
    for term in terms + ([output] if arrow else []):
        if term.count("...") > 1 or term.replace("...", "").count("."):
            raise ValueError(f"einsum: {term!r} in {equation!r}: '.' only as one '...' per operand")
    ranks = []
    for term, t in zip(terms, operands):
        named = len(term.replace("...", ""))
        rank = t.ndim - named if "..." in term else 0
        if rank < 0 or ("..." not in term and named != t.ndim):
            raise ValueError(f"einsum: subscripts {term!r} for an operand of {t.ndim} dims")
        ranks.append(rank)
    width = max(ranks, default=0)
    spare = [c for c in string.ascii_letters if c not in equation]
    if width > len(spare):
        raise ValueError(f"einsum: {equation!r} needs {width} letters for '...' and has {len(spare)} spare")
    letters = "".join(spare[:width])
    terms = [term.replace("...", letters[width - rank:]) for term, rank in zip(terms, ranks)]
    if arrow:
        output = output.replace("...", letters)
    else:
        joined = "".join(terms)
        output = letters + "".join(sorted(c for c in set(joined) if c not in letters and joined.count(c) == 1))
    return ",".join(terms) + "->" + output


def builtin_max(a: int, b: int) -> int:
    return a if a >= b else b


def _einsum_diagonal_free(t: Tensor, term: str) -> tuple[Tensor, str]:
    if len(set(term)) != len(term):
        raise NotImplementedError(f"einsum: repeated subscripts within one operand ({term!r}, a diagonal) "
                                  "are not supported yet")
    return t, term


def _contract_pair(a: Tensor, at: str, b: Tensor, bt: str, later: str, sizes: dict) -> tuple[Tensor, str]:
    """a and b contracted over the letters they share that no later term needs: a bmm of
    [batch, m, k] @ [batch, k, n] with batch = shared and kept, k = shared and summed."""
    # letters only in one operand and not needed later are summed away first
    a_only_sum = [c for c in at if c not in bt and c not in later]
    if a_only_sum:
        a = _ops.sum(a, dim=[at.index(c) for c in a_only_sum])
        at = "".join(c for c in at if c not in a_only_sum)
    b_only_sum = [c for c in bt if c not in at and c not in later]
    if b_only_sum:
        b = _ops.sum(b, dim=[bt.index(c) for c in b_only_sum])
        bt = "".join(c for c in bt if c not in b_only_sum)
    batch = [c for c in at if c in bt and c in later]
    contract = [c for c in at if c in bt and c not in later]
    m_letters = [c for c in at if c not in bt]
    n_letters = [c for c in bt if c not in at]

    def arranged(t, term, order):
        perm = [term.index(c) for c in order]
        if perm != list(range(len(perm))):
            t = t.permute(perm)
        target = [sizes[c] for c in order]
        if list(t.shape) != target:
            t = t.expand(target)
        return t

    a3 = arranged(a, at, batch + m_letters + contract)
    b3 = arranged(b, bt, batch + contract + n_letters)
    nb = math.prod(sizes[c] for c in batch)
    nm = math.prod(sizes[c] for c in m_letters)
    nk = math.prod(sizes[c] for c in contract)
    nn_ = math.prod(sizes[c] for c in n_letters)
    out = _ops.bmm(a3.reshape([nb, nm, nk]), b3.reshape([nb, nk, nn_]))
    term = "".join(batch + m_letters + n_letters)
    return out.reshape([sizes[c] for c in term]), term


# ---- sampling ------------------------------------------------------------------------------------

def multinomial(probs: Tensor, num_samples: int, replacement: bool = False) -> Tensor:
    """Indices drawn from each row of probs (non-negative weights, not necessarily normalized),
    int64 of shape [..., num_samples]. The uniforms come from ``oar.rand`` (Philox-4x32-10 at the
    global seed and offset), so every device draws the same indices. With replacement: the
    count of cumulative probabilities below each uniform; without: the num_samples largest
    Gumbel-perturbed log-weights (``argsort``), which samples without replacement exactly."""
    from oar.tensor import rand

    if probs.ndim not in (1, 2):
        raise ValueError(f"multinomial: probs must be 1-d or 2-d, got shape {tuple(probs.shape)}")
    if probs.dtype.name not in ("float32", "float64"):
        raise TypeError(f"multinomial: probs must be float32 or float64, got {probs.dtype.name}")
    rows = probs if probs.ndim == 2 else probs.reshape([1, -1])
    n, categories = rows.shape
    if categories == 0:
        raise ValueError("multinomial: probs has no categories")
    if not replacement and num_samples > categories:
        raise ValueError(f"multinomial: cannot draw {num_samples} samples without replacement "
                         f"from {categories} categories")
    bad = _ops.any(_ops.logical_or(_ops.lt(rows, 0), _ops.logical_not(_ops.lt(rows, math.inf))))
    if bad.item():
        raise ValueError("multinomial: probs must be finite and non-negative")
    totals = _ops.sum(rows, dim=[1], keepdim=True)
    if _ops.any(_ops.le(totals, 0)).item():
        raise ValueError("multinomial: every row of probs must have a positive sum")
    if replacement:
        cdf = _ops.cumsum(rows / totals, dim=1)  # [n, c]
        u = rand(n, num_samples, dtype=rows.dtype, device=rows.device)  # [n, s]
        below = _ops.lt(cdf.reshape([n, 1, categories]), u.reshape([n, num_samples, 1]))
        drawn = _ops.minimum(_ops.sum(below, dim=[2]), categories - 1)  # rounding: never past the last
    else:
        u = rand(n, categories, dtype=rows.dtype, device=rows.device)
        gumbel = _ops.neg(_ops.log(_ops.neg(_ops.log(_ops.clamp(u, min=1e-30, max=1.0)))))
        keys = _ops.where(_ops.gt(rows, 0), _ops.log(rows) + gumbel, -math.inf)
        drawn = _ops.slice(_ops.argsort(keys, dim=1, descending=True), dim=1, start=0, stop=num_samples)
        drawn = drawn.contiguous()
    return drawn if probs.ndim == 2 else drawn.reshape([num_samples])


# ---- activations and factories ----------------------------------------------------------------

def relu6(x: Tensor) -> Tensor:
    return _ops.hardtanh(x, min_val=0.0, max_val=6.0)


def new_full(x: Tensor, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    return full(size, fill_value, dtype=dtype_of(dtype) if dtype is not None else x.dtype,
                device=device if device is not None else x.device, requires_grad=requires_grad)


# ---- Tensor methods and operators ---------------------------------------------------------------

def _install_methods() -> None:
    from oar import _C

    base_getitem, base_setitem = _C.TensorBase.__getitem__, _C.TensorBase.__setitem__

    def __getitem__(self, key):
        if has_tensor_index(key):
            return index(self, key)
        return base_getitem(self, key)

    def __setitem__(self, key, value):
        if has_tensor_index(key):
            from oar.autograd import is_grad_enabled

            if is_grad_enabled() and (self.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
                _C._check_inplace(self, value, "setitem")
            index_put(self, key, value)
            return
        base_setitem(self, key, value)

    def index_put_(self, indices, values, accumulate: bool = False):
        _C._check_inplace(self, values, "index_put_")
        return index_put(self, tuple(indices), values, accumulate=accumulate)

    def masked_fill_(self, mask, value):
        _C._check_inplace(self, value, "masked_fill_")
        self.copy_(masked_fill(self, mask, value))
        return self

    def floordiv_(self, other):
        return self._store_inplace(_ops.floor_divide(self, other), "floor_divide_")

    def remainder_(self, other):
        return self._store_inplace(_ops.remainder(self, other), "remainder_")

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return new_full(self, _size_args(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return new_full(self, _size_args(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return to_tensor(data, dtype=dtype if dtype is not None else self.dtype,
                         device=device if device is not None else self.device, requires_grad=requires_grad)

    methods = {
        "__getitem__": __getitem__, "__setitem__": __setitem__,
        "__floordiv__": lambda self, other: _ops.floor_divide(self, other),
        "__rfloordiv__": lambda self, other: _ops.floor_divide(other, self),
        "__mod__": lambda self, other: _ops.remainder(self, other),
        "__rmod__": lambda self, other: _ops.remainder(other, self),
        "__ifloordiv__": floordiv_, "__imod__": remainder_,
        "floor_divide_": floordiv_, "remainder_": remainder_,
        "index_put_": index_put_, "index_put": index_put_out_of_place,
        "masked_fill": masked_fill, "masked_fill_": masked_fill_,
        "repeat": repeat, "repeat_interleave": repeat_interleave, "narrow": narrow,
        "add": add, "sub": sub, "div": div, "clamp": clamp, "clip": clamp,
        "var": var, "std": std, "argmax": argmax, "argmin": argmin, "amax": amax, "amin": amin,
        "sort": sort, "topk": topk, "relu6": relu6, "multinomial": multinomial,
        "new_zeros": new_zeros, "new_ones": new_ones, "new_full": new_full, "new_tensor": new_tensor,
    }
    for name, method in methods.items():
        setattr(Tensor, name, method)


def _size_args(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and not isinstance(size[0], (int, np.integer)):
        return tuple(int(s) for s in size[0])
    return tuple(int(s) for s in size)


_install_methods()
