"""Loading the op set: ops.yaml (checked, with file and line in every error) or the packaged ops.json.

load(path) reads either; default() is the op set of this installation, read once per process:
``OAR_OPS_YAML`` when set, else the ops.json installed beside this package, else the source
tree's interface/ops.yaml. Only ops.yaml needs PyYAML, so `import oar` needs no YAML parser.
"""
from __future__ import annotations

import functools
import json
import os
from types import MappingProxyType
from typing import Any

from oar_opset.check import check
from oar_opset.model import Attr, Input, Op, OpSet, Output, Sharding

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGED_JSON = os.path.join(HERE, "ops.json")
SOURCE_YAML = os.path.join(os.path.dirname(HERE), "ops.yaml")  # interface/ops.yaml, in a source tree


class OpsetError(ValueError):
    """ops.yaml (or ops.json) is not a valid op set; the message lists every problem with file and line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Marked(dict):
    """A YAML mapping that remembers its own line and the line of each key (1-based)."""
    line: int | None = None
    key_lines: dict


def _yaml_loader():
    import yaml

    class MarkingLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node):
        loader.flatten_mapping(node)
        mapping = _Marked()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in mapping:  # PyYAML would silently keep the last one
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                    key_node.start_mark)
            mapping[key] = loader.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    MarkingLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return MarkingLoader


def header_comment(text: str) -> str:
    """The leading comment block of ops.yaml (its own key to the fields), without the '#'s."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines).strip()


def read_document(path: str) -> tuple[Any, str]:
    """(the raw document, its header comment) of an ops.yaml or ops.json file; a syntax error is an OpsetError."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            return json.loads(text), ""
        except json.JSONDecodeError as error:
            raise OpsetError([f"{path}:{error.lineno}: {error.msg}"]) from None
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader()), header_comment(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise OpsetError([f"{path}{line}: {error.problem or error}"]) from None


def _ports(raw: list, roles: dict, cls):
    ports = []
    for text in raw:
        name = text.rstrip("?.")
        extra = {"role": roles.get(name, "data")} if cls is Input else {}
        ports.append(cls(name, optional=text.endswith("?"), variadic=text.endswith("..."), **extra))
    return tuple(ports)


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def build(document: Any, source: str, header: str = "") -> OpSet:
    """The OpSet of a document, after check(); OpsetError lists every problem."""
    problems = check(document, source)
    if problems:
        raise OpsetError(problems)
    sets = {name: tuple(members) for name, members in (document.get("dtype_sets") or {}).items()}
    ops_doc = document["ops"]
    ops = []
    for name, spec in ops_doc.items():
        dtype_spec = spec["dtypes"]
        attrs = tuple(Attr(attr_name, a["type"], "default" not in a, _frozen(a.get("default")), a.get("doc", ""))
                      for attr_name, a in (spec.get("attrs") or {}).items())
        ops.append(Op(
            name=name,
            kind=spec["kind"],
            inputs=_ports(spec["inputs"], spec.get("roles") or {}, Input),
            outputs=_ports(spec["outputs"], {}, Output),
            attrs=attrs,
            dtypes=sets[dtype_spec] if isinstance(dtype_spec, str) else tuple(dtype_spec),
            dtype_set=dtype_spec if isinstance(dtype_spec, str) else None,
            out_dtype=str(spec["out_dtype"]),
            broadcast=spec.get("broadcast", False),
            semantics=spec.get("semantics", ""),
            backward=MappingProxyType({str(k): str(v) for k, v in (spec.get("backward") or {}).items()}),
            method=spec.get("method", False),
            nonempty_reduction=spec.get("nonempty_reduction", False),
            fusion=spec.get("fusion"),
            line=getattr(ops_doc, "key_lines", {}).get(name),
        ))
    section = document.get("sharding") or {}

    def mapping(key: str) -> MappingProxyType:
        return MappingProxyType({str(k): str(v) for k, v in (section.get(key) or {}).items()})

    sharding = Sharding(rules=mapping("rules"), by_fusion=mapping("by_fusion"), by_kind=mapping("by_kind"),
                        ops=mapping("ops"))
    return OpSet(schema_version=document["schema_version"], dtype_sets=MappingProxyType(sets), ops=tuple(ops),
                 source=source, header=header, sharding=sharding)


def load(path: str) -> OpSet:
    """The checked op set of an ops.yaml or ops.json file."""
    document, header = read_document(path)
    return build(document, path, header)


def default_path() -> str:
    """Where default() reads from: OAR_OPS_YAML, the packaged ops.json, or the source tree's ops.yaml."""
    override = os.environ.get("OAR_OPS_YAML")
    if override:
        return override
    for candidate in (PACKAGED_JSON, SOURCE_YAML):
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"the op set is missing: neither {PACKAGED_JSON} nor {SOURCE_YAML} exists "
                            "(reinstall oar, or set OAR_OPS_YAML to interface/ops.yaml)")


@functools.lru_cache(maxsize=1)
def default() -> OpSet:
    """The op set of this installation, loaded once per process."""
    return load(default_path())


def write_json(yaml_path: str, json_path: str) -> None:
    """ops.json for the package: the checked document of ops.yaml, so the runtime loads it without PyYAML."""
    document, _ = read_document(yaml_path)
    build(document, yaml_path)  # raises on any problem: an invalid op set is never packaged
    tmp = json_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f)
    os.replace(tmp, json_path)
