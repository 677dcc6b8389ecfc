"""The one table of ATen -> Oar op differences; everything else is generated from the op set.

``mapped_ops()`` gives, for each ATen overload the bridge runs natively, the Oar op and a function
that turns the ATen arguments (Oar tensors already unwrapped) into that op's call. Elementwise Oar
ops (kinds unary, binary, ternary of interface/ops.yaml, read through oar_opset) map to the ATen
overloads of the same name whose schema has the same tensor inputs; ``RENAMED`` and ``ADAPTED``
below hold the ops whose names or arguments differ, ``COMPOSED`` the ATen ops (backward, optimizer
and normalization ops) that are a few Oar ops each. An ATen op in neither runs on the CPU
(see oar.torch.cpu_fallback).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

import oar_opset

__all__ = ["Mapping", "STEPS", "mapped_ops", "binary_elementwise_ops"]

Call = Callable[..., tuple[tuple, dict]]  # (aten args, aten kwargs) -> (oar inputs, oar attrs)


@dataclass(frozen=True)
class Mapping:
    aten: str     # the ATen overload, e.g. "add.Tensor"
    oar_op: str   # the Oar op it runs ("a+b" for a composition of several)
    call: Call    # builds the Oar op's inputs and attrs from the ATen arguments
    composed: Callable[..., Any] | None = None  # runs several Oar ops and returns the ATen results


def _positional(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, {}


def _scaled(self: Any, other: Any, alpha: Any = 1) -> tuple[tuple, dict]:
    # add/sub: alpha scales other (torch's add(a, b, alpha) = a + alpha * b)
    if alpha != 1:
        import oar

        other = oar.mul(other, alpha) if oar.is_tensor(other) else other * alpha
    return (self, other), {}


def _dims(dim: Any) -> list[int]:
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _reduce(self: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> tuple[tuple, dict]:
    if dtype is not None:
        raise _Unmapped("dtype= of a reduction")
    return (self,), {"dim": _dims(dim), "keepdim": keepdim}


def _reduce_all(self: Any, *, dtype: Any = None) -> tuple[tuple, dict]:
    return _reduce(self, None, False, dtype=dtype)


def _var(self: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[tuple, dict]:
    return (self,), {"dim": _dims(dim), "correction": 1 if correction is None else correction, "keepdim": keepdim}


def _softmax(self: Any, dim: int, half_to_float: bool) -> tuple[tuple, dict]:
    if half_to_float:
        raise _Unmapped("half_to_float")
    return (self,), {"dim": dim}


def _clamp(self: Any, min: Any = None, max: Any = None) -> tuple[tuple, dict]:  # noqa: A002
    return (self,), {"min": float("-inf") if min is None else min, "max": float("inf") if max is None else max}


def _gelu(self: Any, *, approximate: str = "none") -> tuple[tuple, dict]:
    return (self,), {"approximate": approximate}


def _gelu_backward(grad: Any, self: Any, *, approximate: str = "none") -> tuple[tuple, dict]:
    return (grad, self), {"approximate": approximate}


def _argmax(self: Any, dim: Any = None, keepdim: bool = False) -> tuple[tuple, dict]:
    return (self,), {"dim": dim, "keepdim": keepdim}


def _embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> tuple[tuple, dict]:
    return (weight, indices), {}


def _convolution(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                 output_padding: Any, groups: int) -> tuple[tuple, dict]:
    if transposed or len(stride) != 2:
        raise _Unmapped("transposed or non-2d convolution")
    return (x, weight, bias), {"stride": list(stride), "padding": list(padding), "dilation": list(dilation),
                               "groups": groups}


def _cat(tensors: Any, dim: int = 0) -> tuple[tuple, dict]:
    # torch.cat skips 1-d empty tensors (its legacy "no value yet" placeholder); oar.concat does not
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)[:1]
    return (kept,), {"dim": dim}


def _where(condition: Any, self: Any, other: Any) -> tuple[tuple, dict]:
    return (condition, self, other), {}


def _diagonal_band(self: Any, diagonal: int = 0) -> tuple[tuple, dict]:
    return (self,), {"diagonal": diagonal}


def _gather(self: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> tuple[tuple, dict]:
    return (self, index), {"dim": dim}


def _index_select(self: Any, dim: int, index: Any) -> tuple[tuple, dict]:
    return (self, index), {"dim": dim}


class _Unmapped(Exception):
    """These arguments have no Oar equivalent: the call runs on the CPU fallback instead."""


# ---- compositions: ATen ops (mostly backward and optimizer ops) that are a few Oar ops each ----

def _ops() -> Any:
    import oar

    return oar.ops


def _addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    ops = _ops()
    product = ops.matmul(a, b)
    if alpha != 1:
        product = ops.mul(product, alpha)
    if beta == 0:  # torch ignores self when beta = 0 (even NaN there)
        return product
    return ops.add(product, bias if beta == 1 else ops.mul(bias, beta))


def _convolution_backward(grad: Any, x: Any, weight: Any, stride: Any, padding: Any, dilation: Any,
                          transposed: bool, output_padding: Any, groups: int, output_mask: Any) -> tuple:
    if transposed or len(stride) != 2:
        raise _Unmapped("transposed or non-2d convolution")
    ops = _ops()
    attrs = {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": groups}
    return (ops.conv2d_backward_input(grad, weight, input_shape=list(x.shape), **attrs) if output_mask[0] else None,
            ops.conv2d_backward_weight(grad, x, weight_shape=list(weight.shape), **attrs) if output_mask[1] else None,
            ops.sum(grad, dim=[0, 2, 3]) if output_mask[2] else None)


def _convolution_backward_with_bias_sizes(grad: Any, x: Any, weight: Any, bias_sizes: Any, *args: Any) -> tuple:
    # the overload AOT autograd traces (eager torch calls the _overrideable one): bias_sizes is implied
    return _convolution_backward(grad, x, weight, *args)


def _native_batch_norm_functional(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                  training: bool, momentum: float, eps: float) -> tuple:
    # what AOT autograd traces: the updated running statistics are returned, the inputs left as they are
    new_mean, new_var = running_mean.clone(), running_var.clone()
    out, save_mean, save_invstd = _native_batch_norm(x, weight, bias, new_mean, new_var, training, momentum, eps)
    return out, save_mean, save_invstd, new_mean, new_var


def _native_layer_norm(x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> tuple:
    ops = _ops()
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    out = ops.layer_norm(x, weight, bias, normalized_ndim=len(normalized_shape), eps=eps)
    mean = ops.mean(x, dim=dims, keepdim=True)
    rstd = ops.rsqrt(ops.add(ops.var(x, dim=dims, correction=0, keepdim=True), eps))
    return out, mean, rstd


def _normalized_backward(grad: Any, xhat: Any, scale: Any, dims: list[int]) -> Any:
    """d/dx of y = xhat * w where xhat = (x - mean(x)) * rstd over dims; scale = w * rstd."""
    ops = _ops()
    centered = ops.sub(ops.sub(grad, ops.mean(grad, dim=dims, keepdim=True)),
                       ops.mul(xhat, ops.mean(ops.mul(grad, xhat), dim=dims, keepdim=True)))
    return ops.mul(centered, scale)


def _native_layer_norm_backward(grad: Any, x: Any, normalized_shape: Any, mean: Any, rstd: Any, weight: Any,
                                bias: Any, output_mask: Any) -> tuple:
    ops = _ops()
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    leading = list(range(x.ndim - len(normalized_shape)))
    xhat = ops.mul(ops.sub(x, mean), rstd)
    scaled_grad = grad if weight is None else ops.mul(grad, weight)
    grad_input = _normalized_backward(scaled_grad, xhat, rstd, dims) if output_mask[0] else None
    grad_weight = ops.sum(ops.mul(grad, xhat), dim=leading) if output_mask[1] and weight is not None else None
    grad_bias = ops.sum(grad, dim=leading) if output_mask[2] and bias is not None else None
    return grad_input, grad_weight, grad_bias


def _channel_shape(x: Any) -> list[int]:
    return [1, x.shape[1]] + [1] * (x.ndim - 2)


def _native_batch_norm(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                       momentum: float, eps: float) -> tuple:
    import oar

    ops = _ops()
    dims = [0] + list(range(2, x.ndim))
    shape = _channel_shape(x)
    if training:
        mean = ops.mean(x, dim=dims)
        var = ops.var(x, dim=dims, correction=0)
        invstd = ops.rsqrt(ops.add(var, eps))
        if running_mean is not None and running_var is not None:
            count = x.numel() // x.shape[1]
            with oar.no_grad():  # torch updates the running variance with the unbiased estimate
                running_mean.copy_(ops.add(ops.mul(running_mean, 1 - momentum), ops.mul(mean, momentum)))
                running_var.copy_(ops.add(ops.mul(running_var, 1 - momentum),
                                          ops.mul(var, momentum * count / max(count - 1, 1))))
        used_mean, used_invstd = mean, invstd
        save_mean, save_invstd = mean, invstd
    else:
        if running_mean is None or running_var is None:
            raise _Unmapped("evaluation without running statistics")
        used_mean, used_invstd = running_mean, ops.rsqrt(ops.add(running_var, eps))
        save_mean = save_invstd = oar.empty(0, dtype=x.dtype, device=x.device)
    out = ops.mul(ops.sub(x, ops.reshape(used_mean, shape=shape)), ops.reshape(used_invstd, shape=shape))
    if weight is not None:
        out = ops.mul(out, ops.reshape(weight, shape=shape))
    if bias is not None:
        out = ops.add(out, ops.reshape(bias, shape=shape))
    return out, save_mean, save_invstd


def _native_batch_norm_no_stats(x: Any, weight: Any, bias: Any, training: bool, momentum: float, eps: float) -> tuple:
    return _native_batch_norm(x, weight, bias, None, None, training, momentum, eps)


def _native_batch_norm_backward(grad: Any, x: Any, weight: Any, running_mean: Any, running_var: Any, save_mean: Any,
                                save_invstd: Any, train: bool, eps: float, output_mask: Any) -> tuple:
    ops = _ops()
    dims = [0] + list(range(2, x.ndim))
    shape = _channel_shape(x)
    if train:
        mean, invstd = ops.reshape(save_mean, shape=shape), ops.reshape(save_invstd, shape=shape)
    else:
        mean = ops.reshape(running_mean, shape=shape)
        invstd = ops.reshape(ops.rsqrt(ops.add(running_var, eps)), shape=shape)
    xhat = ops.mul(ops.sub(x, mean), invstd)
    scale = invstd if weight is None else ops.mul(invstd, ops.reshape(weight, shape=shape))
    grad_input = None
    if output_mask[0]:
        grad_input = _normalized_backward(grad, xhat, scale, dims) if train else ops.mul(grad, scale)
    grad_weight = ops.sum(ops.mul(grad, xhat), dim=dims) if output_mask[1] else None
    grad_bias = ops.sum(grad, dim=dims) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def _softmax_backward(grad: Any, output: Any, dim: int, input_dtype: Any) -> Any:
    ops = _ops()
    return ops.mul(output, ops.sub(grad, ops.sum(ops.mul(grad, output), dim=[dim], keepdim=True)))


def _log_softmax_backward(grad: Any, output: Any, dim: int, input_dtype: Any) -> Any:
    ops = _ops()
    return ops.sub(grad, ops.mul(ops.exp(output), ops.sum(grad, dim=[dim], keepdim=True)))


_NLL_MEAN, _NLL_SUM = 1, 2


def _nll_mask(target: Any, ignore_index: int, dtype: Any) -> tuple[Any, Any]:
    """(target with ignored entries at class 0, 1.0 where counted else 0.0)."""
    ops = _ops()
    valid = ops.ne(target, ignore_index)
    return ops.mul(target, ops.cast(valid, dtype=target.dtype)), ops.cast(valid, dtype=dtype)


def _nll_loss_forward(x: Any, target: Any, weight: Any, reduction: int, ignore_index: int) -> tuple:
    if weight is not None or x.ndim != 2 or reduction not in (_NLL_MEAN, _NLL_SUM):
        raise _Unmapped("class weights, a non-2d input or reduction='none'")
    ops = _ops()
    safe, counted = _nll_mask(target, ignore_index, x.dtype)
    picked = ops.reshape(ops.gather(x, ops.reshape(safe, shape=[-1, 1]), dim=1), shape=[-1])
    total = ops.mul(ops.sum(ops.mul(picked, counted)), -1.0)
    total_weight = ops.sum(counted)
    return (ops.div(total, total_weight) if reduction == _NLL_MEAN else total), total_weight


def _nll_loss_backward(grad: Any, x: Any, target: Any, weight: Any, reduction: int, ignore_index: int,
                       total_weight: Any) -> Any:
    if weight is not None or x.ndim != 2 or reduction not in (_NLL_MEAN, _NLL_SUM):
        raise _Unmapped("class weights, a non-2d input or reduction='none'")
    ops = _ops()
    safe, counted = _nll_mask(target, ignore_index, x.dtype)
    scale = ops.mul(grad, -1.0)
    if reduction == _NLL_MEAN:
        scale = ops.div(scale, total_weight)
    picked = ops.mul(ops.cast(ops.one_hot(safe, num_classes=x.shape[1]), dtype=x.dtype),
                     ops.reshape(counted, shape=[-1, 1]))
    return ops.mul(picked, scale)


def _threshold_backward(grad: Any, x: Any, threshold: Any) -> Any:
    ops = _ops()
    return ops.where(ops.gt(x, threshold), grad, 0.0)


def _adaptive_avg_pool2d(x: Any, output_size: Any) -> Any:
    if list(output_size) != [1, 1]:
        raise _Unmapped("adaptive average pooling to other than 1x1")
    return _ops().mean(x, dim=[x.ndim - 2, x.ndim - 1], keepdim=True)


def _adaptive_avg_pool2d_backward(grad: Any, x: Any) -> Any:
    if list(grad.shape[-2:]) != [1, 1]:
        raise _Unmapped("adaptive average pooling to other than 1x1")
    ops = _ops()
    return ops.div(ops.expand(grad, shape=list(x.shape)), float(x.shape[-1] * x.shape[-2]))


def _hardswish_backward(grad: Any, x: Any) -> Any:
    ops = _ops()  # torch's gradient: 0 below -3, x/3 + 1/2 on [-3, 3], 1 above (exact constants only:
    middle = ops.mul(grad, ops.add(ops.div(x, 3.0), 0.5))  # a scalar may be rounded to float32)
    return ops.where(ops.lt(x, -3.0), 0.0, ops.where(ops.le(x, 3.0), middle, grad))


def _hardsigmoid_backward(grad: Any, x: Any) -> Any:
    ops = _ops()  # torch's gradient: 1/6 on the open interval (-3, 3), 0 elsewhere; torch's kernels
    inside = ops.logical_and(ops.gt(x, -3.0), ops.lt(x, 3.0))  # take 1/6 rounded to float32, in float64 too
    return ops.where(inside, ops.mul(grad, _ONE_SIXTH_FLOAT32), 0.0)


_ONE_SIXTH_FLOAT32 = 0.1666666716337204  # float(numpy.float32(1 / 6))


def _tanh_backward(grad: Any, output: Any) -> Any:
    ops = _ops()
    return ops.mul(grad, ops.sub(1.0, ops.mul(output, output)))


def _sigmoid_backward(grad: Any, output: Any) -> Any:
    ops = _ops()
    return ops.mul(grad, ops.mul(output, ops.sub(1.0, output)))


def _embedding_dense_backward(grad: Any, indices: Any, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> Any:
    if scale_grad_by_freq:
        raise _Unmapped("scale_grad_by_freq")
    import oar

    ops = _ops()
    width = grad.shape[-1]
    flat_indices = ops.reshape(indices, shape=[-1])
    rows = ops.reshape(grad, shape=[-1, width])
    if padding_idx >= 0:  # the padding row gets no gradient
        keep = ops.cast(ops.ne(flat_indices, padding_idx), dtype=grad.dtype)
        rows = ops.mul(rows, ops.reshape(keep, shape=[-1, 1]))
    return ops.index_add(oar.zeros(num_weights, width, dtype=grad.dtype, device=grad.device), rows, flat_indices, dim=0)


def _isneginf(x: Any) -> Any:
    return _ops().eq(x, float("-inf"))


def _all_any_dims(self: Any, dim: Any = None, keepdim: bool = False) -> tuple[tuple, dict]:
    return (self,), {"dim": _dims(dim), "keepdim": keepdim}


def _bool_only(*tensors: Any) -> None:
    import oar

    if any(not oar.is_tensor(t) or t.dtype != oar.bool for t in tensors):
        raise _Unmapped("bitwise ops on integers (the Oar logical ops are defined on bool)")


def _bitwise_binary(self: Any, other: Any) -> tuple[tuple, dict]:
    _bool_only(self, other)
    return (self, other), {}


def _bitwise_not(self: Any) -> tuple[tuple, dict]:
    _bool_only(self)
    return (self,), {}


def _scatter_value(x: Any, dim: int, index: Any, value: Any) -> Any:
    import oar

    source = oar.full(list(index.shape), value, dtype=x.dtype, device=x.device)
    return _ops().scatter(x, index, source, dim=dim)


def _copy_of(self: Any, *, memory_format: Any = None) -> Any:
    # clone / lift_fresh_copy: a fresh contiguous copy (torch's default memory format)
    return _ops().copy(self)


def _factory_device(device: Any) -> str:
    from oar.torch import bridge_tensor as bt

    if device is not None and torch.device(device).type != bt.device_type():
        raise _Unmapped(f"a factory for device {device}")
    return bt.oar_device(None if device is None else torch.device(device).index)


def _factory_dtype(dtype: Any, value: Any, where: str) -> Any:
    from oar.torch import bridge_tensor as bt

    if dtype is None and isinstance(value, bool):
        dtype = torch.bool  # torch.full infers the dtype of a bool or int fill value
    elif dtype is None and isinstance(value, int):
        dtype = torch.int64
    return bt.oar_dtype(dtype, where)


def _to_copy(self: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
             non_blocking: bool = False, memory_format: Any = None) -> Any:
    from oar.torch import bridge_tensor as bt

    if device is not None and torch.device(device).type != bt.device_type():
        raise _Unmapped("_to_copy to another device")  # the CPU fallback does the transfer
    if dtype is None or bt.oar_dtype(dtype, "_to_copy") == self.dtype:
        return _ops().copy(self)
    return _ops().cast(self, dtype=bt.oar_dtype(dtype, "_to_copy"))


def _scalar_tensor(value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> Any:
    import oar
    from oar.torch import bridge_tensor as bt

    return oar.full([], value, dtype=bt.oar_dtype(dtype, "scalar_tensor"), device=_factory_device(device))


def _full(size: Any, value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
          pin_memory: Any = None) -> Any:
    import oar

    return oar.full(list(size), value, dtype=_factory_dtype(dtype, value, "full"), device=_factory_device(device))


def _full_like(self: Any, value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None, memory_format: Any = None) -> Any:
    import oar
    from oar.torch import bridge_tensor as bt

    return oar.full(list(self.shape), value, dtype=self.dtype if dtype is None else bt.oar_dtype(dtype, "full_like"),
                    device=self.device if device is None else _factory_device(device))


def _arange(start: Any, end: Any, step: Any = 1, *, dtype: Any = None, layout: Any = None, device: Any = None,
            pin_memory: Any = None) -> Any:
    import oar
    from oar.torch import bridge_tensor as bt

    if not all(isinstance(v, int) for v in (start, end, step)) or (dtype is not None and dtype.is_floating_point):
        raise _Unmapped("a float arange")  # torch computes float ranges in double: the CPU keeps them exact
    return oar.arange(start, end, step, dtype=bt.oar_dtype(torch.int64 if dtype is None else dtype, "arange"),
                      device=_factory_device(device))


def _constant_pad_nd(self: Any, pad: Any, value: Any = 0) -> Any:
    return _ops().pad(self, pad=list(pad), mode="constant", value=float(value))


def _lerp_step(start: Any, end: Any, weight: Any) -> Any:
    return _ops().mul(_ops().sub(end, start), weight)


def _addcmul_step(x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    product = _ops().mul(a, b)
    return product if value == 1 else _ops().mul(product, value)


def _addcdiv_step(x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    quotient = _ops().div(a, b)
    return quotient if value == 1 else _ops().mul(quotient, value)


def _plus_step(step: Callable[..., Any]) -> Callable[..., Any]:
    def composed(x: Any, *args: Any, **kwargs: Any) -> Any:
        return _ops().add(x, step(x, *args, **kwargs))

    return composed


_lerp, _addcmul, _addcdiv = _plus_step(_lerp_step), _plus_step(_addcmul_step), _plus_step(_addcdiv_step)


def _pow_scalar(x: Any, exponent: Any) -> Any:
    # torch's CPU kernel computes these exponents as products and roots, not pow(): the same values,
    # and far cheaper than a pow per element (GPT-2's GELU cubes its input)
    ops = _ops()
    if exponent == 2:
        return ops.mul(x, x)
    if exponent == 3:
        return ops.mul(ops.mul(x, x), x)
    if x.is_floating_point():
        if exponent == 0.5:
            return ops.sqrt(x)
        if exponent == -0.5:
            return ops.rsqrt(x)
        if exponent == -1:
            return ops.reciprocal(x)
        if exponent == -2:
            return ops.reciprocal(ops.mul(x, x))
    return ops.pow(x, exponent)


def _pool_attrs(kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool) -> dict:
    if ceil_mode or any(d != 1 for d in _pair(dilation)):
        raise _Unmapped("max pooling with dilation or ceil_mode")
    return {"kernel_size": _pair(kernel_size), "stride": _pair(stride) if stride else [],
            "padding": _pair(padding)}


def _pair(value: Any) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * 2 if len(values) == 1 else values


def _max_pool2d_with_indices(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                             ceil_mode: bool = False) -> tuple[Any, Any]:
    attrs = _pool_attrs(kernel_size, stride, padding, dilation, ceil_mode)
    ops = _ops()
    return ops.max_pool2d(x, **attrs), ops.max_pool2d_indices(x, **attrs)


def _max_pool2d_with_indices_backward(grad: Any, x: Any, kernel_size: Any, stride: Any, padding: Any,
                                      dilation: Any, ceil_mode: bool, indices: Any) -> Any:
    # max_pool2d_backward routes to each window's first maximum: the position indices holds
    return _ops().max_pool2d_backward(grad, x, **_pool_attrs(kernel_size, stride, padding, dilation, ceil_mode))


def _index_key(x: Any, indices: Any) -> tuple[int, Any, list[int]]:
    """torch's Tensor?[] indices as Oar's (dim, stacked [k, *B] indices, B)."""
    positions = [i for i, t in enumerate(indices) if t is not None]
    if not positions or positions != list(range(positions[0], positions[-1] + 1)):
        raise _Unmapped("index tensors that are not adjacent (torch moves their dims first)")
    import oar

    tensors = [indices[i] for i in positions]
    if any(t.dtype not in (oar.int64, oar.int32) for t in tensors):
        raise _Unmapped("boolean (mask) or non-integer index tensors")
    ops = _ops()
    shape = list(torch.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    stacked = [ops.reshape(ops.expand(ops.cast(t, dtype=oar.int64), shape=shape), shape=[1] + shape)
               for t in tensors]
    return positions[0], (stacked[0] if len(stacked) == 1 else ops.concat(stacked, dim=0)), shape


def _index(x: Any, indices: Any) -> Any:
    dim, key, _ = _index_key(x, indices)
    return _ops().index(x, key, dim=dim)


def _index_put(x: Any, indices: Any, values: Any, accumulate: bool = False, unsafe: bool = False) -> Any:
    dim, key, shape = _index_key(x, indices)
    ops = _ops()
    out_shape = list(x.shape[:dim]) + shape + list(x.shape[dim + key.shape[0]:])
    import oar

    if not oar.is_tensor(values):
        values = oar.full(out_shape, values, dtype=x.dtype, device=x.device)
    elif list(values.shape) != out_shape:  # torch broadcasts values to the indexed shape
        values = ops.expand(values, shape=out_shape)
    return ops.index_put(x, key, values, dim=dim, accumulate=accumulate)


RENAMED: dict[str, str] = {
    # ATen overload: the Oar op of the same arguments
    "mm.default": "matmul",
    "bmm.default": "bmm",
    "silu.default": "silu",
}

ADAPTED: dict[str, tuple[str, Call]] = {
    # ATen overload: (Oar op, argument adapter)
    "add.Tensor": ("add", _scaled),
    "add.Scalar": ("add", _scaled),
    "sub.Tensor": ("sub", _scaled),
    "sub.Scalar": ("sub", _scaled),
    "sum.dim_IntList": ("sum", _reduce),
    "sum.default": ("sum", _reduce_all),
    "mean.dim": ("mean", _reduce),
    "mean.default": ("mean", _reduce_all),
    "amax.default": ("max", _reduce),
    "amin.default": ("min", _reduce),
    "max.default": ("max", _reduce_all),
    "min.default": ("min", _reduce_all),
    "argmax.default": ("argmax", _argmax),
    "bitwise_and.Tensor": ("logical_and", _bitwise_binary),
    "bitwise_or.Tensor": ("logical_or", _bitwise_binary),
    "bitwise_not.default": ("logical_not", _bitwise_not),
    "all.default": ("all", _reduce_all),
    "all.dim": ("all", _all_any_dims),
    "all.dims": ("all", _all_any_dims),
    "any.default": ("any", _reduce_all),
    "any.dim": ("any", _all_any_dims),
    "any.dims": ("any", _all_any_dims),
    "var.correction": ("var", _var),
    "_softmax.default": ("softmax", _softmax),
    "_log_softmax.default": ("log_softmax", _softmax),
    "clamp.default": ("clamp", _clamp),
    "gelu.default": ("gelu", _gelu),
    "gelu_backward.default": ("gelu_backward", _gelu_backward),
    "embedding.default": ("embedding", _embedding),
    "convolution.default": ("conv2d", _convolution),
    "cat.default": ("concat", _cat),
    "where.self": ("where", _where),
    "tril.default": ("tril", _diagonal_band),
    "triu.default": ("triu", _diagonal_band),
    "gather.default": ("gather", _gather),
    "index_select.default": ("index_select", _index_select),
}

COMPOSED: dict[str, tuple[tuple[str, ...], Callable[..., Any]]] = {
    # ATen overload: (the Oar ops it is made of, the composition)
    "addmm.default": (("matmul", "add", "mul"), _addmm),
    "convolution_backward_overrideable.default": (("conv2d_backward_input", "conv2d_backward_weight", "sum"),
                                                  _convolution_backward),
    "convolution_backward.default": (("conv2d_backward_input", "conv2d_backward_weight", "sum"),
                                     _convolution_backward_with_bias_sizes),
    "native_layer_norm.default": (("layer_norm", "mean", "var", "rsqrt"), _native_layer_norm),
    "native_layer_norm_backward.default": (("mul", "sub", "mean", "sum"), _native_layer_norm_backward),
    "native_batch_norm.default": (("mean", "var", "rsqrt", "mul", "sub", "add", "reshape"), _native_batch_norm),
    "_native_batch_norm_legit.default": (("mean", "var", "rsqrt", "mul", "sub", "add", "reshape"), _native_batch_norm),
    "_native_batch_norm_legit.no_stats": (("mean", "var", "rsqrt", "mul", "sub", "add", "reshape"),
                                          _native_batch_norm_no_stats),
    "_native_batch_norm_legit_functional.default": (("mean", "var", "rsqrt", "mul", "sub", "add", "reshape"),
                                                    _native_batch_norm_functional),
    "native_batch_norm_backward.default": (("mean", "rsqrt", "mul", "sub", "sum", "reshape"),
                                           _native_batch_norm_backward),
    "_softmax_backward_data.default": (("mul", "sub", "sum"), _softmax_backward),
    "_log_softmax_backward_data.default": (("exp", "mul", "sub", "sum"), _log_softmax_backward),
    "nll_loss_forward.default": (("gather", "ne", "cast", "sum", "div"), _nll_loss_forward),
    "nll_loss_backward.default": (("one_hot", "ne", "cast", "mul", "div"), _nll_loss_backward),
    "threshold_backward.default": (("where", "gt"), _threshold_backward),
    "_adaptive_avg_pool2d.default": (("mean",), _adaptive_avg_pool2d),
    "_adaptive_avg_pool2d_backward.default": (("expand", "mul"), _adaptive_avg_pool2d_backward),
    "hardswish_backward.default": (("where", "lt", "le", "mul", "add"), _hardswish_backward),
    "hardsigmoid_backward.default": (("where", "gt", "lt", "logical_and", "mul"), _hardsigmoid_backward),
    "tanh_backward.default": (("mul", "sub"), _tanh_backward),
    "sigmoid_backward.default": (("mul", "sub"), _sigmoid_backward),
    "embedding_dense_backward.default": (("index_add", "reshape", "ne", "cast", "mul"), _embedding_dense_backward),
    "isneginf.default": (("eq",), _isneginf),
    "scatter.value": (("scatter", "full"), _scatter_value),
    "clone.default": (("copy",), _copy_of),
    "lift_fresh_copy.default": (("copy",), _copy_of),
    "_to_copy.default": (("copy", "cast"), _to_copy),
    "scalar_tensor.default": (("full",), _scalar_tensor),
    "full.default": (("full",), _full),
    "full_like.default": (("full",), _full_like),
    "constant_pad_nd.default": (("pad",), _constant_pad_nd),
    "arange.start_step": (("arange",), _arange),
    "lerp.Scalar": (("add", "sub", "mul"), _lerp),
    "lerp.Tensor": (("add", "sub", "mul"), _lerp),
    "addcmul.default": (("add", "mul"), _addcmul),
    "pow.Tensor_Scalar": (("pow", "mul", "sqrt", "rsqrt", "reciprocal"), _pow_scalar),
    "addcdiv.default": (("add", "div", "mul"), _addcdiv),
    "max_pool2d_with_indices.default": (("max_pool2d", "max_pool2d_indices"), _max_pool2d_with_indices),
    "max_pool2d_with_indices_backward.default": (("max_pool2d_backward",), _max_pool2d_with_indices_backward),
    "index.Tensor": (("index", "expand", "reshape", "cast", "concat"), _index),
    "index_put.default": (("index_put", "expand", "reshape", "cast", "concat", "full"), _index_put),
    "_index_put_impl.default": (("index_put", "expand", "reshape", "cast", "concat", "full"), _index_put),
}

STEPS: dict[str, Callable[..., Any]] = {
    # composed ATen overloads that are "self + step(self, ...)": their in-place forms add the step
    # into self in one kernel (torch.optim's lerp_/addcmul_/addcdiv_ on every parameter)
    "lerp.Scalar": _lerp_step,
    "lerp.Tensor": _lerp_step,
    "addcmul.default": _addcmul_step,
    "addcdiv.default": _addcdiv_step,
}

_ELEMENTWISE_KINDS = ("unary", "binary", "ternary")
_OVERLOADS = ("default", "Tensor", "Scalar", "Tensor_Tensor", "Tensor_Scalar", "self")
_NOT_GENERATED = {"clamp", "gelu", "gelu_backward", "cast", "copy", "dropout", "where"}  # attrs or semantics differ


def _aten_overload(name: str) -> Any:
    base, overload = name.split(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload, None)


def _generated(opset: oar_opset.OpSet) -> dict[str, Mapping]:
    found: dict[str, Mapping] = {}
    for op in opset:
        if op.kind not in _ELEMENTWISE_KINDS or op.name in _NOT_GENERATED or op.attrs:
            continue
        for overload in _OVERLOADS:
            aten = _aten_overload(f"{op.name}.{overload}")
            if aten is None:
                continue
            arguments = [a for a in aten._schema.arguments if not a.kwarg_only]
            if len(arguments) != len(op.inputs) or aten._schema.returns[0].alias_info is not None \
                    or not any(str(a.type) == "Tensor" for a in arguments):
                continue  # different arity, or an in-place/out overload: those are derived below
            found[f"{op.name}.{overload}"] = Mapping(f"{op.name}.{overload}", op.name, _positional)
    return found


@functools.lru_cache(maxsize=1)
def binary_elementwise_ops() -> frozenset[str]:
    """The Oar ops of kind binary: those oar._C._run_inplace can run writing their first input."""
    return frozenset(op.name for op in oar_opset.default() if op.kind == "binary")


def mapped_ops(opset: oar_opset.OpSet | None = None) -> dict[str, Mapping]:
    """Every ATen overload the bridge runs as an Oar op, for the ops the op set has."""
    opset = oar_opset.default() if opset is None else opset
    names = {op.name for op in opset}
    table = _generated(opset)
    for aten, oar_op in RENAMED.items():
        if oar_op in names and _aten_overload(aten) is not None:
            table[aten] = Mapping(aten, oar_op, _positional)
    for aten, (oar_op, call) in ADAPTED.items():
        if oar_op in names and _aten_overload(aten) is not None:
            table[aten] = Mapping(aten, oar_op, call)
    for aten, (oar_ops, composed) in COMPOSED.items():
        if names.issuperset(oar_ops) and _aten_overload(aten) is not None:
            table[aten] = Mapping(aten, "+".join(oar_ops), _positional, composed)
    return table


Unmapped = _Unmapped
