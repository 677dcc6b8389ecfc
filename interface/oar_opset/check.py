"""The schema check of ops.yaml: every field known, every value of the right type and vocabulary.

check(document, source) returns the list of problems, each as '<file>:<line>: op 'foo': ...'
(the line where the YAML loader found the key; a document from ops.json has no lines). A
field the schema does not know is a problem, with the nearest known field suggested, so a
typo never passes silently as a missing optional field.
"""
from __future__ import annotations

import ast
import difflib
import re
from typing import Any

from oar_opset.model import ATTR_TYPES, DTYPES, FUSION_CLASSES, KINDS, OUT_DTYPE_RULES, ROLES, SHARDING_RULES

TOP_FIELDS = ("schema_version", "dtype_sets", "sharding", "ops")
SHARDING_FIELDS = ("rules", "by_fusion", "by_kind", "ops")
OP_FIELDS = ("kind", "inputs", "outputs", "attrs", "dtypes", "out_dtype", "broadcast", "semantics", "backward",
             "roles", "method", "nonempty_reduction", "fusion")
REQUIRED_OP_FIELDS = ("kind", "inputs", "outputs", "dtypes", "out_dtype")
ATTR_FIELDS = ("type", "default", "doc")
SCHEMA_VERSIONS = (1,)
_PORT = re.compile(r"^[a-z_][a-z0-9_]*(\?|\.\.\.)?$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def line_of(mapping: Any, key: Any = None) -> int | None:
    """The line of `key` in a mapping the marking loader built (of the mapping itself without a key)."""
    if key is not None:
        return getattr(mapping, "key_lines", {}).get(key)
    return getattr(mapping, "line", None)


def _suggest(word: str, known) -> str:
    close = difflib.get_close_matches(str(word), known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Problems:
    def __init__(self, source: str):
        self.source = source
        self.messages: list[str] = []

    def add(self, line: int | None, where: str, message: str) -> None:
        place = f"{self.source}:{line}" if line else self.source
        self.messages.append(f"{place}: {where}: {message}" if where else f"{place}: {message}")

    def unknown_fields(self, mapping: dict, known, where: str, what: str = "field") -> None:
        for key in mapping:
            if key not in known:
                self.add(line_of(mapping, key), where, f"unknown {what} {key!r}{_suggest(key, known)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _default_problem(kind: str, default: Any) -> str | None:
    """Why `default` is not a value of attr type `kind`, or None."""
    fits = {
        "int": _is_int,
        "float": _is_number,
        "bool": lambda v: isinstance(v, bool),
        "ints": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
        "floats": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
        "string": lambda v: isinstance(v, str),
        "dtype": lambda v: False,
    }[kind]
    if kind == "dtype":
        return "a dtype attr cannot have a default"
    if not fits(default):
        return f"default {default!r} is not of type {kind}"
    return None


def _check_dtypes(problems: _Problems, line, where: str, spec: Any, sets: dict) -> None:
    if isinstance(spec, str):
        if spec not in sets:
            problems.add(line, where, f"unknown dtype set {spec!r}{_suggest(spec, list(sets))} "
                                      f"(dtype_sets: {', '.join(sets)})")
        return
    if not isinstance(spec, list) or not spec:
        problems.add(line, where, f"dtypes {spec!r} is neither a dtype_sets name nor a non-empty list")
        return
    for name in spec:
        if name not in DTYPES:
            problems.add(line, where, f"unknown dtype {name!r}{_suggest(name, DTYPES)}")


def _check_ports(problems: _Problems, op: dict, field: str, where: str) -> list[str]:
    """The port names of inputs/outputs (suffixes stripped), after checking their syntax and order."""
    line = line_of(op, field)
    ports = op.get(field)
    if not isinstance(ports, list):
        problems.add(line, where, f"{field} must be a list of names, not {ports!r}")
        return []
    names, seen_optional, variadic = [], False, False
    for raw in ports:
        if not isinstance(raw, str) or not _PORT.match(raw) or (field == "outputs" and raw.endswith("?")):
            allowed = "name or name..." if field == "outputs" else "name, name? or name..."
            problems.add(line, where, f"{field}: {raw!r} is not a port ({allowed})")
            continue
        name = raw.rstrip("?.")
        if name in names:
            problems.add(line, where, f"{field}: {name!r} is listed twice")
        names.append(name)
        if raw.endswith("..."):
            variadic = True
        elif raw.endswith("?"):
            seen_optional = True
        elif seen_optional:
            problems.add(line, where, f"{field}: required {name!r} follows an optional input")
    if variadic and len(ports) != 1:
        problems.add(line, where, f"{field}: a list ('...') must be the only one")
    return names


def _check_attrs(problems: _Problems, op: dict, where: str) -> dict[str, str]:
    attrs = op.get("attrs") or {}
    if not isinstance(attrs, dict):
        problems.add(line_of(op, "attrs"), where, "attrs must be a mapping name: {type, default?, doc?}")
        return {}
    types = {}
    for name, spec in attrs.items():
        at = f"{where}: attr {name!r}"
        line = line_of(attrs, name)
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add(line, where, f"attr name {name!r} is not an identifier")
        if not isinstance(spec, dict) or "type" not in spec:
            problems.add(line, at, "needs {type: ...}")
            continue
        problems.unknown_fields(spec, ATTR_FIELDS, at)
        kind = spec["type"]
        if kind not in ATTR_TYPES:
            problems.add(line_of(spec, "type") or line, at, f"unknown type {kind!r}{_suggest(kind, ATTR_TYPES)}")
            continue
        types[name] = kind
        if "default" in spec:
            why = _default_problem(kind, spec["default"])
            if why:
                problems.add(line_of(spec, "default") or line, at, why)
        if "doc" in spec and not isinstance(spec["doc"], str):
            problems.add(line_of(spec, "doc") or line, at, "doc must be text")
    return types


def _check_op(problems: _Problems, name: Any, op: Any, sets: dict, op_line) -> None:
    where = f"op {name!r}"
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(op_line, "", f"op name {name!r} is not an identifier")
    if not isinstance(op, dict):
        problems.add(op_line, where, "must be a mapping of fields")
        return
    problems.unknown_fields(op, OP_FIELDS, where)
    for field in REQUIRED_OP_FIELDS:
        if field not in op:
            problems.add(op_line, where, f"missing field {field!r}")
    kind = op.get("kind")
    if "kind" in op and kind not in KINDS:
        problems.add(line_of(op, "kind"), where, f"unknown kind {kind!r}{_suggest(kind, KINDS)}")
    inputs = _check_ports(problems, op, "inputs", where) if "inputs" in op else []
    outputs = _check_ports(problems, op, "outputs", where) if "outputs" in op else []
    attr_types = _check_attrs(problems, op, where)
    if "dtypes" in op:
        _check_dtypes(problems, line_of(op, "dtypes"), where, op["dtypes"], sets)
    if "out_dtype" in op:
        rule = op["out_dtype"]
        if rule not in OUT_DTYPE_RULES and rule not in DTYPES:
            problems.add(line_of(op, "out_dtype"), where,
                         f"unknown out_dtype {rule!r}{_suggest(rule, OUT_DTYPE_RULES + DTYPES)}")
        if rule == "attr" and attr_types.get("dtype") != "dtype":
            problems.add(line_of(op, "out_dtype"), where, "out_dtype attr needs a 'dtype' attr of type dtype")
    for flag in ("broadcast", "method", "nonempty_reduction"):
        if flag in op and not isinstance(op[flag], bool):
            problems.add(line_of(op, flag), where, f"{flag} must be true or false, not {op[flag]!r}")
    if "semantics" in op and not isinstance(op["semantics"], str):
        problems.add(line_of(op, "semantics"), where, "semantics must be one line of text")
    if op.get("nonempty_reduction") is True and kind != "reduction":
        problems.add(line_of(op, "nonempty_reduction"), where, f"nonempty_reduction on a {kind} op (reductions only)")
    if op.get("method") is True and (kind == "creation" or not inputs):
        problems.add(line_of(op, "method"), where, "method: true needs a tensor input to be the method's self")
    if "fusion" in op and op["fusion"] not in FUSION_CLASSES:
        problems.add(line_of(op, "fusion"), where,
                     f"unknown fusion class {op['fusion']!r}{_suggest(op['fusion'], FUSION_CLASSES)} "
                     f"(one of {', '.join(FUSION_CLASSES)})")
    roles = op.get("roles")
    if roles is not None:
        if not isinstance(roles, dict):
            problems.add(line_of(op, "roles"), where, "roles must be a mapping input: role")
        else:
            for input_name, role in roles.items():
                line = line_of(roles, input_name) or line_of(op, "roles")
                if input_name not in inputs:
                    problems.add(line, where, f"roles names {input_name!r}, which is not one of its inputs"
                                              f"{_suggest(input_name, inputs)}")
                if role not in ROLES:
                    problems.add(line, where, f"input {input_name!r}: unknown role {role!r}{_suggest(role, ROLES)}")
    backward = op.get("backward")
    if backward is not None:
        if not isinstance(backward, dict):
            problems.add(line_of(op, "backward"), where, "backward must be a mapping input: formula")
        else:
            for input_name, formula in backward.items():
                line = line_of(backward, input_name) or line_of(op, "backward")
                if input_name not in inputs:
                    problems.add(line, where, f"backward names {input_name!r}, which is not one of its inputs"
                                              f"{_suggest(input_name, inputs)}")
                try:
                    ast.parse(str(formula), mode="eval")
                except SyntaxError as error:
                    problems.add(line, where, f"backward of {input_name!r}: {formula!r} is not an expression "
                                              f"({error.msg})")
    del outputs


def check(document: Any, source: str) -> list[str]:
    """Every problem of an ops.yaml document (empty when it is valid)."""
    problems = _Problems(source)
    if not isinstance(document, dict):
        problems.add(None, "", "not a mapping with schema_version, dtype_sets and ops")
        return problems.messages
    problems.unknown_fields(document, TOP_FIELDS, "", "top-level field")
    version = document.get("schema_version")
    if version not in SCHEMA_VERSIONS:
        problems.add(line_of(document, "schema_version"), "",
                     f"schema_version {version!r} is not one this reader knows ({SCHEMA_VERSIONS})")
    sets = document.get("dtype_sets") or {}
    if not isinstance(sets, dict):
        problems.add(line_of(document, "dtype_sets"), "", "dtype_sets must be a mapping name: [dtypes]")
        sets = {}
    for set_name, members in sets.items():
        if not isinstance(members, list) or not members:
            problems.add(line_of(sets, set_name), f"dtype set {set_name!r}", "must be a non-empty list of dtypes")
            continue
        for member in members:
            if member not in DTYPES:
                problems.add(line_of(sets, set_name), f"dtype set {set_name!r}",
                             f"unknown dtype {member!r}{_suggest(member, DTYPES)}")
    ops = document.get("ops")
    if not isinstance(ops, dict) or not ops:
        problems.add(line_of(document, "ops"), "", "no 'ops' mapping")
        return problems.messages
    for name, op in ops.items():
        _check_op(problems, name, op, sets, line_of(ops, name))
    if "sharding" in document:
        _check_sharding(problems, document["sharding"], line_of(document, "sharding"), ops)
    return problems.messages


def _check_sharding(problems: _Problems, section: Any, line, ops: dict) -> None:
    """The sharding section: every rule one the runtime implements, every key a known fusion class,
    kind or op, every mapped rule one of the section's rules."""
    where = "sharding"
    if not isinstance(section, dict):
        problems.add(line, where, "must be a mapping with rules, by_fusion, by_kind, ops")
        return
    problems.unknown_fields(section, SHARDING_FIELDS, where)
    rules = section.get("rules") or {}
    if not isinstance(rules, dict):
        problems.add(line_of(section, "rules"), where, "rules must be a mapping rule: one-line description")
        rules = {}
    for rule, doc in rules.items():
        if rule not in SHARDING_RULES:
            problems.add(line_of(rules, rule), where, f"unknown rule {rule!r}{_suggest(rule, SHARDING_RULES)} "
                                                      f"(oar.distributed implements {', '.join(SHARDING_RULES)})")
        if not isinstance(doc, str):
            problems.add(line_of(rules, rule), where, f"rule {rule!r}: its description must be text")
    known = {"by_fusion": FUSION_CLASSES, "by_kind": KINDS, "ops": list(ops)}
    for key, keys in known.items():
        table = section.get(key) or {}
        if not isinstance(table, dict):
            problems.add(line_of(section, key), where, f"{key} must be a mapping name: rule")
            continue
        for name, rule in table.items():
            entry_line = line_of(table, name) or line_of(section, key)
            if name not in keys:
                what = {"by_fusion": "fusion class", "by_kind": "kind", "ops": "op"}[key]
                problems.add(entry_line, where, f"{key}: unknown {what} {name!r}{_suggest(name, list(keys))}")
            if rule not in rules:
                problems.add(entry_line, where, f"{key}: {name!r} maps to {rule!r}, which is not one of the "
                                                f"section's rules{_suggest(rule, list(rules))}")
