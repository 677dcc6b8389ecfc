"""Recurrent layers (LSTM, GRU) with torch's parameter names, shapes, gate order and
initialization. The input projections of the whole sequence are one matmul per layer and
direction (with both biases for LSTM); each step is then one matmul with the hidden state, an add
and one fused cell op (lstm_cell / gru_cell: the gates' elementwise part, with its backward)."""

from __future__ import annotations

import math

import oar
from oar.nn import functional as F
from oar.nn import init
from oar.nn.module import Module
from oar.nn.parameter import Parameter

__all__ = ["LSTM", "GRU", "lstm_cell", "gru_cell"]


def lstm_cell(x_proj, h, c, w_hh, b_hh=None):
    """One LSTM step, torch's gate order (input, forget, cell, output); x_proj = x W_ih^T + b_ih.
    Returns (h, c), views of the lstm_cell op's [h | c]."""
    return _lstm_step(x_proj if b_hh is None else oar.add(x_proj, b_hh), h, c, oar.transpose(w_hh, dim0=0, dim1=1))


def gru_cell(x_proj, h, w_hh, b_hh=None):
    """One GRU step, torch's gate order (reset, update, new); x_proj = x W_ih^T + b_ih."""
    return oar.gru_cell(x_proj, F.linear(h, w_hh, b_hh), h)


def _lstm_step(x_proj, h, c, w_hh_t):
    """x_proj holds both biases; w_hh_t = W_hh^T. -> (h, c)."""
    hidden = int(c.shape[-1])
    both = oar.lstm_cell(oar.add(x_proj, oar.matmul(h, w_hh_t)), c)
    return tuple(oar.split(both, sizes=[hidden, hidden], dim=-1))


def _transposed(w):
    """W^T as a contiguous copy: one copy per sequence instead of a strided matmul operand per step."""
    return oar.transpose(w, dim0=0, dim1=1).contiguous()


class _RNNBase(Module):
    _gate_count = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None):
        super().__init__()
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"{type(self).__name__}: num_layers {num_layers} and hidden_size {hidden_size} "
                             "must be positive")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1], not {dropout}")
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.num_directions = 2 if bidirectional else 1
        gates = self._gate_count * hidden_size
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in self._suffixes(layer):
                make = lambda *shape: Parameter(oar.empty(list(shape), dtype=dtype or oar.float32,  # noqa: E731
                                                          device=device))
                setattr(self, f"weight_ih{suffix}", make(gates, width))
                setattr(self, f"weight_hh{suffix}", make(gates, hidden_size))
                if bias:
                    setattr(self, f"bias_ih{suffix}", make(gates))
                    setattr(self, f"bias_hh{suffix}", make(gates))
        self.reset_parameters()

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.num_directions == 2 else [])

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _layer_params(self, suffix: str):
        get = lambda name: getattr(self, f"{name}{suffix}") if self.bias or "weight" in name else None  # noqa: E731
        return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh")

    def _initial(self, hx, batch: int, x):
        shape = [self.num_layers * self.num_directions, batch, self.hidden_size]
        if hx is None:
            return oar.zeros(shape, dtype=x.dtype, device=x.device)
        if [int(s) for s in hx.shape] != shape:
            raise ValueError(f"{type(self).__name__}: initial state of shape {tuple(hx.shape)}, expected {shape}")
        return hx

    def _run(self, x, states):
        """x [T, N, in]; states: per state kind, a [L*D, N, H] tensor. -> (output, final states)."""
        steps = int(x.shape[0])
        finals = [[] for _ in states]
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(self._suffixes(layer)):
                w_ih, w_hh, b_ih, b_hh = self._layer_params(suffix)
                projected, w_hh_t = self._prepare(x, w_ih, w_hh, b_ih, b_hh)  # one matmul for every step
                index = layer * self.num_directions + direction
                state = [oar.reshape(oar.slice(s, dim=0, start=index, stop=index + 1), shape=list(s.shape)[1:])
                         for s in states]
                order = range(steps - 1, -1, -1) if direction else range(steps)
                # one split (its backward: one concat), not a slice per step
                step_inputs = oar.split(projected, sizes=[1] * steps, dim=0) if steps else []
                step_shape = list(projected.shape)[1:]
                hs = [None] * steps
                for t in order:
                    state = self._step(oar.reshape(step_inputs[t], shape=step_shape), state, w_hh_t, b_hh)
                    hs[t] = state[0]
                outputs.append(oar.stack(hs, dim=0) if steps else oar.zeros(
                    [0] + list(state[0].shape), dtype=x.dtype, device=x.device))
                for kind, value in enumerate(state):
                    finals[kind].append(value)
            x = outputs[0] if len(outputs) == 1 else oar.concat(outputs, dim=-1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, [oar.stack(values, dim=0) for values in finals]

    def _forward(self, x, states_in):
        shape = [int(s) for s in x.shape]
        if len(shape) not in (2, 3) or shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}: input of shape {shape}, expected [T, N, {self.input_size}] "
                             f"(batch_first: [N, T, {self.input_size}]) or unbatched [T, {self.input_size}]")
        unbatched = len(shape) == 2
        if unbatched:
            x = oar.reshape(x, shape=[shape[0], 1, shape[1]])
            states_in = [None if s is None else oar.reshape(s, shape=[int(s.shape[0]), 1, int(s.shape[1])])
                         for s in states_in]
        elif self.batch_first:
            x = oar.transpose(x, dim0=0, dim1=1)
        batch = int(x.shape[1])
        states = [self._initial(s, batch, x) for s in states_in]
        out, finals = self._run(x, states)
        if unbatched:
            out = oar.reshape(out, shape=[shape[0], -1])
            finals = [oar.reshape(f, shape=[int(f.shape[0]), -1]) for f in finals]
        elif self.batch_first:
            out = oar.transpose(out, dim0=0, dim1=1)
        return out, finals

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, bidirectional={self.num_directions == 2}")


class LSTM(_RNNBase):
    """torch.nn.LSTM: returns output and (h_n, c_n)."""

    _gate_count = 4

    def _prepare(self, x, w_ih, w_hh, b_ih, b_hh):
        projected = F.linear(x, w_ih, b_ih)
        return (projected if b_hh is None else oar.add(projected, b_hh)), _transposed(w_hh)

    def _step(self, x_proj, state, w_hh_t, b_hh):
        return _lstm_step(x_proj, state[0], state[1], w_hh_t)

    def forward(self, x, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        out, (h, c) = self._forward(x, [h0, c0])
        return out, (h, c)


class GRU(_RNNBase):
    """torch.nn.GRU: returns output and h_n."""

    _gate_count = 3

    def _prepare(self, x, w_ih, w_hh, b_ih, b_hh):
        return F.linear(x, w_ih, b_ih), _transposed(w_hh)

    def _step(self, x_proj, state, w_hh_t, b_hh):
        hidden = oar.matmul(state[0], w_hh_t)
        return [oar.gru_cell(x_proj, hidden if b_hh is None else oar.add(hidden, b_hh), state[0])]

    def forward(self, x, hx=None):
        out, (h,) = self._forward(x, [hx])
        return out, h
