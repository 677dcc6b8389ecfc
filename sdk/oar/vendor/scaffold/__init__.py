"""``oar new-backend``: a vendor's plugin project, generated so that it builds on day one.

The project (see ``templates/``) is a C plugin over host memory: every REQUIRED entry of
``device_api.h`` works (streams run their work at once, events complete when recorded), every
other entry is a stub returning ``OAR_ERROR_NOT_SUPPORTED`` that stays out of the function table
until its group is switched on, and every op of ``ops.yaml`` has a kernel stub (``add`` and
``full`` implemented for float32 as examples; the others fall back to the host). The function
table and the prototypes come from the header's doc comments (:mod:`oar.vendor.abi_doc`), the kernel
stubs from ``ops.yaml``; nothing lists entries or ops by hand.

The expected-results file the project ships is the conformance suite's own prediction
(:func:`oar_conformance.expected_statuses`) for what the generated plugin provides;
``tests/test_new_backend.py`` runs the suite on a generated project and checks that it gives
exactly that.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

import oar_opset

from oar.vendor import abi_doc

__all__ = ["NAME_PATTERN", "scaffold_plugin", "generate", "expected_results", "ProjectError"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Templates of the asynchronous shape (oar new-backend --async), by the path they replace.
ASYNC_TEMPLATES = "_async"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The kernels the scaffold implements, as examples: op -> {test dtype: kernel_query signature}.
EXAMPLE_KERNELS = {
    "add": {"float32": "float32 float32 float32"},
    "full": {"float32": "float32"},
}
# The example kernels with a launch-time check of their own (templates/_partials/OP.c.j2 defines OP_check).
EXAMPLE_CHECKS = {"add"}
_ATTR_TYPES = {"int": "OAR_ATTR_INT", "float": "OAR_ATTR_FLOAT", "bool": "OAR_ATTR_BOOL", "ints": "OAR_ATTR_INTS",
               "floats": "OAR_ATTR_FLOATS", "string": "OAR_ATTR_STRING", "dtype": "OAR_ATTR_DTYPE"}
_C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
               "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
               "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
               "volatile", "while", "oar", "test", "lib"}


class ProjectError(ValueError):
    """A name that cannot make a project, or a directory that is in the way."""


# ---- the op set ----------------------------------------------------------------------------

def _op_models(opset: oar_opset.OpSet) -> tuple[list[dict], list[str]]:
    """(the non-view ops as template data, the names of the view ops)."""
    ops, views = [], []
    for op in opset:
        if op.kind == "view":
            views.append(op.name)
            continue
        if op.variadic:
            raise ValueError(f"ops.yaml: {op.name}: a list input outside a view op; the scaffold cannot stub it")
        input_text = ", ".join(i.name + ("?" if i.optional else "") for i in op.inputs)
        attrs = [{"name": a.name, "type": a.type, "c_type": _ATTR_TYPES[a.type], "required": a.required,
                  "default": list(a.default) if isinstance(a.default, tuple) else a.default, "doc": a.doc}
                 for a in op.attrs]
        example = EXAMPLE_KERNELS.get(op.name)
        ops.append({
            "name": op.name, "kind": op.kind, "semantics": op.semantics.strip(),
            "inputs": [i.name for i in op.inputs],
            "input_text": input_text or "none",
            "min_inputs": sum(1 for i in op.inputs if not i.optional), "max_inputs": len(op.inputs),
            "outputs": [o.name for o in op.outputs], "attrs": attrs, "dtypes": list(op.dtypes),
            "out_dtype": op.out_dtype,
            "out_dtype_note": _OUT_DTYPE_NOTES.get(op.out_dtype, ""),
            "roles": [_ROLES[i.role] for i in op.inputs],
            "promotes": op.kind in ("binary", "ternary"),
            "out_rule": _OUT_RULES.get(op.out_dtype, "OAR_PS_OUT_FIXED"),
            "out_fixed": _DL_DTYPES.get(op.out_dtype, "{0, 0, 0}"),
            "broadcast": op.broadcast,
            "example": example is not None,
            "has_check": op.name in EXAMPLE_CHECKS,
            "signatures": sorted(example.values()) if example else [],
            "example_signature": _example_signature(op),
        })
    return ops, views


def _example_signature(op: oar_opset.Op) -> str:
    """A plausible kernel_query signature for the comment of a stub: the op's first dtype for its
    data inputs, index inputs as int64, a condition as bool, the output by out_dtype."""
    first, out_dtype = op.dtypes[0], op.out_dtype
    by_role = {"index": "int64", "condition": "bool"}
    listed = [by_role.get(i.role, first) for i in op.inputs if not i.optional]
    if out_dtype in _DTYPE_NAMES:
        output = out_dtype
    elif out_dtype == "float" or (out_dtype == "accumulate" and first in _FLOAT_NAMES):
        output = first if first in _FLOAT_NAMES else "float32"
    elif out_dtype == "accumulate":
        output = "int64"
    else:
        output = first
    return " ".join(listed + [output] * len(op.outputs))


# ops.yaml's dtype rule in the plugin support library's terms (oar/plugin_support.h group 7).
_ROLES = {"data": "OAR_PS_ROLE_DATA", "index": "OAR_PS_ROLE_INDEX", "condition": "OAR_PS_ROLE_CONDITION",
          "quantized": "OAR_PS_ROLE_QUANTIZED"}
_OUT_RULES = {"same": "OAR_PS_OUT_SAME", "promote": "OAR_PS_OUT_PROMOTE", "float": "OAR_PS_OUT_FLOAT",
              "accumulate": "OAR_PS_OUT_ACCUMULATE", "attr": "OAR_PS_OUT_ATTR"}  # a dtype name: fixed
_DL_DTYPES = {"float32": "{OAR_DL_FLOAT, 32, 1}", "float64": "{OAR_DL_FLOAT, 64, 1}", "float16": "{OAR_DL_FLOAT, 16, 1}",
              "bfloat16": "{OAR_DL_BFLOAT, 16, 1}", "int8": "{OAR_DL_INT, 8, 1}", "int16": "{OAR_DL_INT, 16, 1}",
              "int32": "{OAR_DL_INT, 32, 1}", "int64": "{OAR_DL_INT, 64, 1}", "uint8": "{OAR_DL_UINT, 8, 1}",
              "bool": "{OAR_DL_BOOL, 8, 1}"}
_DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool")
_FLOAT_NAMES = ("float32", "float64", "float16", "bfloat16")
# ops.yaml's out_dtype rules whose name says too little for a stub's comment.
_OUT_DTYPE_NOTES = {
    "promote": "the promoted dtype of the inputs",
    "float": "the promoted dtype of the inputs, float32 where that is integral or bool",
    "accumulate": "a float input's dtype; int64 for integer and bool input",
    "attr": "the dtype attr",
}


# ---- what the conformance suite should report ---------------------------------------------

def scaffold_plugin(fault_op: str):
    """The generated plugin as it comes, described for the suite's prediction: the REQUIRED
    entries, one device, no capability, the example kernels."""
    from oar_conformance import PluginDescription

    required = {entry.name for entry in abi_doc.entries() if entry.required}
    kernels = {op: set(by_dtype) for op, by_dtype in EXAMPLE_KERNELS.items()}
    return PluginDescription(entries=required, kernels=kernels, fault_op=fault_op)


def expected_results(plugin, *, quick: bool = False) -> dict[str, str]:
    """{test id: status} of every registered test (or of the quick tier) on ``plugin`` (a
    :class:`oar_conformance.PluginDescription`), as the suite predicts it."""
    from oar_conformance import expected_statuses

    return expected_statuses(plugin, quick=quick)


# ---- rendering -------------------------------------------------------------------------------

def _environment(loader_root: Path):
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(loader_root)), undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    environment.filters["c_comment"] = lambda text: str(text).replace("*/", "* /")
    return environment


def _doc_comment(entry: abi_doc.Entry) -> str:
    """The header's doc comment of an entry, as a C comment above its definition."""
    import textwrap

    lines = []
    for paragraph in (f"{entry.name}: {entry.summary}",
                      f"Requirement: {entry.requirement}" + (f" ({entry.requirement_note})" if entry.requirement_note
                                                             else ""),
                      f"Blocking: {entry.blocking}" if entry.blocking else "",
                      f"Threads: {entry.threads}" if entry.threads else "",
                      f"Status: {entry.status}" if entry.status else ""):
        if paragraph:
            lines.extend(textwrap.wrap(paragraph.replace("*/", "* /"), 96, subsequent_indent="  "))
    return "/* " + "\n * ".join(lines) + "\n */"


def _check_name(kind: str, value: str) -> None:
    if not NAME_PATTERN.match(value):
        raise ProjectError(f"{kind} {value!r} must be a lower-case identifier: [a-z][a-z0-9_]{{0,31}}")


def generate(name: str, device_type: str, directory: str | Path | None = None, *,
             ci: Iterable[str] = ("github",), force: bool = False, async_streams: bool = False) -> list[Path]:
    """Write the project ``name`` for ``device_type`` into ``directory`` (default: ./name);
    returns the files written. ``ci``: the CI systems to render (github, gitlab, jenkins).
    ``async_streams``: the asynchronous shape (a worker thread per stream, launch packets; the
    templates under ``templates/_async/`` replace their namesakes)."""
    from oar import __version__ as oar_version
    from oar.vendor import ci as oar_ci
    from oar_conformance import EXPECTED_SCHEMA_VERSION

    _check_name("the project name", name)
    if name in _C_KEYWORDS:
        raise ProjectError(f"the project name {name!r} is a C keyword or clashes with Oar's names")
    _check_name("the device type", device_type)
    ci = list(dict.fromkeys(ci))
    for system in ci:
        if system not in oar_ci.SYSTEMS:
            raise ProjectError(f"unknown CI system {system!r}; choose from {', '.join(oar_ci.SYSTEMS)}")
    root = Path(directory) if directory is not None else Path(name)
    if root.exists() and any(root.iterdir()) and not force:
        raise ProjectError(f"{root} exists and is not empty (pass --force to write into it)")

    header = abi_doc.header_text()
    entries = abi_doc.entries(header)
    by_name = {entry.name: entry for entry in entries}
    opset = oar_opset.default()
    ops, views = _op_models(opset)
    fault_op = f"_{name}_fault"
    expected = expected_results(scaffold_plugin(fault_op), quick=False)
    context = {
        "name": name, "NAME": name.upper(), "device_type": device_type,
        "distribution": name.replace("_", "-"),
        "oar_version": oar_version, "abi_version": f"{header_define(header, 'MAJOR')}.{header_define(header, 'MINOR')}",
        "entries": entries, "optional_groups": abi_doc.optional_groups(header),
        "ops": ops, "views": views, "examples": sorted(EXAMPLE_KERNELS), "fault_op": fault_op,
        "ops_schema_version": opset.schema_version,
        "expected": expected, "expected_schema_version": EXPECTED_SCHEMA_VERSION,
        "ci": ci, "doc": lambda entry_name: _doc_comment(by_name[entry_name]),
        "async_streams": async_streams,
    }
    environment = _environment(TEMPLATES)

    rendered: dict[str, str] = {}
    stub_template = "src/stubs.c.j2"
    readme_template = "README.md.j2"
    templates = sorted(str(path.relative_to(TEMPLATES)) for path in TEMPLATES.rglob("*.j2")
                       if not path.relative_to(TEMPLATES).parts[0].startswith("_"))
    for template in templates:
        if template not in (stub_template, readme_template):
            rendered[template] = environment.get_template(_variant(template, async_streams)).render(context)
    # Entries the hand-written sources define; every other one gets a NOT_SUPPORTED stub.
    defined = set()
    for template, text in rendered.items():
        if template.endswith(".c.j2"):
            defined.update(re.findall(rf"^(?:oar_status|const char\*) {re.escape(name)}_(\w+)\([^;{{]*\)\s*\{{",
                                      text, re.M))
    context["stubs"] = [entry for entry in entries if entry.name not in defined]
    context["required_stubs"] = [entry.name for entry in context["stubs"] if entry.required]
    context["ci_files"] = {system: oar_ci.PATHS[system] for system in ci}
    rendered[stub_template] = environment.get_template(stub_template).render(context)
    rendered[readme_template] = environment.get_template(readme_template).render(context)

    written = []
    for template, text in sorted(rendered.items()):
        relative = template[:-len(".j2")].replace("__package__", name)
        relative = "/".join("." + part[len("dot_"):] if part.startswith("dot_") else part
                            for part in relative.split("/"))
        written.append(_write(root / relative, text))
    for system in ci:
        text = oar_ci.render(system, device_type=device_type, expected="conformance/expected.yaml",
                             fault_op=fault_op, project=name, c_tests=True)
        written.append(_write(root / oar_ci.PATHS[system], text))
    return written


def _variant(template: str, async_streams: bool) -> str:
    """The template that renders ``template``: its ``_async/`` namesake for the asynchronous shape."""
    if async_streams and (TEMPLATES / ASYNC_TEMPLATES / template).is_file():
        return f"{ASYNC_TEMPLATES}/{template}"
    return template


def header_define(header: str, part: str) -> str:
    match = re.search(rf"#define OAR_ABI_VERSION_{part}\s+(\d+)", header)
    return match.group(1) if match else "?"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
    return path
