"""The typed model of interface/ops.yaml: OpSet, Op, Input, Output, Attr (frozen dataclasses).

Every reader of the op set (the runtime's op functions, autograd, the reference plugins'
table generators, the compiler, the conformance cases, the docs) reads these objects, never
the YAML. The vocabulary below (kinds, attr types, dtypes, rules) is the one the schema
check accepts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

KINDS = ("creation", "unary", "binary", "ternary", "reduction", "matmul", "nn", "index", "view", "misc")
ATTR_TYPES = ("int", "float", "bool", "ints", "floats", "string", "dtype")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")
# out_dtype rules; any name of DTYPES is also a rule (a fixed output dtype).
OUT_DTYPE_RULES = ("same", "promote", "float", "accumulate", "attr")
# Input roles: a data input's dtype is one of the op's dtypes; an index input is int32/int64 positions;
# a condition input is bool (or any dtype read as != 0); a quantized input holds int8/uint8 low-bit codes.
ROLES = ("data", "index", "condition", "quantized")
# How the compiler (oar_codegen.lower) fuses an op; an op without one runs as the plugin's kernel.
FUSION_CLASSES = ("elementwise", "reduction", "last_dim", "row_norm", "row_loss")
# How an op on distributed tensors derives its output placements (oar.distributed implements each rule).
SHARDING_RULES = ("elementwise", "matmul", "reduction", "normalize_trailing", "embedding", "cross_entropy",
                  "reshape", "transpose", "permute")


@dataclass(frozen=True)
class Attr:
    """An attribute: a typed scalar or list passed to kernel_launch by name."""
    name: str
    type: str                 # one of ATTR_TYPES
    required: bool            # no default in ops.yaml
    default: Any = None       # None when required; lists are tuples
    doc: str = ""


@dataclass(frozen=True)
class Input:
    """A tensor input, in launch order."""
    name: str
    role: str = "data"        # one of ROLES
    optional: bool = False    # "name?": trailing, absent ones are not passed
    variadic: bool = False    # "name...": a list of tensors (the op's only input)


@dataclass(frozen=True)
class Output:
    """A tensor output, in launch order (preallocated by the runtime)."""
    name: str
    variadic: bool = False    # "name...": a list of tensors
    optional: bool = False    # outputs are never optional; here so inputs and outputs bind alike


@dataclass(frozen=True)
class Op:
    name: str
    kind: str                                    # one of KINDS
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    attrs: tuple[Attr, ...]
    dtypes: tuple[str, ...]                      # the data inputs' accepted dtypes, expanded
    dtype_set: str | None                        # the dtype_sets name `dtypes` gave, if it gave one
    out_dtype: str                               # one of OUT_DTYPE_RULES or a dtype name
    broadcast: bool = False
    semantics: str = ""
    backward: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    method: bool = False                         # also a Tensor method: t.<name>(...)
    nonempty_reduction: bool = False             # reducing zero elements is an error
    fusion: str | None = None                    # one of FUSION_CLASSES, or None: not fused
    line: int | None = field(default=None, compare=False)  # where ops.yaml defines it (None from ops.json)

    @property
    def variadic(self) -> bool:
        return any(i.variadic for i in self.inputs)

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    @property
    def attr_defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attrs if not a.required}

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(f"op {self.name!r} has no attr {name!r}")

    def input_role(self, name: str) -> str:
        for i in self.inputs:
            if i.name == name:
                return i.role
        raise KeyError(f"op {self.name!r} has no input {name!r}")


@dataclass(frozen=True)
class Sharding:
    """The ``sharding:`` section: which propagation rule each op follows on distributed tensors.

    An op's rule is ``ops[name]`` if listed, else ``by_fusion[op.fusion]``, else ``by_kind[op.kind]``,
    else None (no rule: its distributed inputs are replicated first)."""
    rules: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)  # rule -> doc
    by_fusion: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    by_kind: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    ops: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def rule_of(self, op: "Op") -> str | None:
        if op.name in self.ops:
            return self.ops[op.name]
        if op.fusion is not None and op.fusion in self.by_fusion:
            return self.by_fusion[op.fusion]
        return self.by_kind.get(op.kind)


@dataclass(frozen=True)
class OpSet:
    schema_version: int
    dtype_sets: Mapping[str, tuple[str, ...]] = field(hash=False)
    ops: tuple[Op, ...]
    source: str = ""                             # the file it was loaded from
    header: str = ""                             # ops.yaml's leading comment (its own key to the fields)
    sharding: Sharding = field(default_factory=Sharding, hash=False)  # the sharding section (empty if absent)
    _by_name: Mapping[str, Op] = field(default_factory=dict, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({op.name: op for op in self.ops}))

    def __getitem__(self, name: str) -> Op:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no op {name!r} in {self.source or 'the op set'}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def names(self) -> list[str]:
        return [op.name for op in self.ops]

    def of_kind(self, *kinds: str) -> list[Op]:
        return [op for op in self.ops if op.kind in kinds]

    def sharding_rule(self, name: str) -> str | None:
        """The propagation rule of op ``name`` on distributed tensors (None: no rule)."""
        return self.sharding.rule_of(self[name])

    def fused_as(self, *classes: str) -> frozenset[str]:
        """Names of the ops the compiler fuses as one of these classes."""
        return frozenset(op.name for op in self.ops if op.fusion in classes)
