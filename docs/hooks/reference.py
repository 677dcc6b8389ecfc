"""MkDocs hook: the ABI reference and the op reference, generated at every build.

``reference/abi.md`` comes from the doc comments of ``interface/include/oar/device_api.h``
(parsed by ``sdk/oar/vendor/abi_doc.py``, the parser ``oar new-backend`` uses too) and
``reference/ops.md`` from ``interface/ops.yaml``. Neither page is committed: ``on_files`` adds
them to the build in memory, so they can never be stale. ``python docs/hooks/reference.py DIR``
writes them to DIR instead, to read or diff them.

Only the source checkout is needed (PyYAML and MkDocs): ``abi_doc`` is loaded by path, not
through an installed ``oar``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "interface" / "include" / "oar" / "device_api.h"
OPS_YAML = REPO / "interface" / "ops.yaml"
ABI_DOC = REPO / "sdk" / "oar" / "vendor" / "abi_doc.py"

GENERATED_NOTE = ("Generated from `{source}` at docs build time (`docs/hooks/reference.py`); "
                  "edit the source, not this page.")


def _abi_doc():
    name = "_oar_docs_abi_doc"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ABI_DOC)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ---- Markdown helpers ----------------------------------------------------------------------

_TOKEN = re.compile(r"\b(OAR_[A-Z0-9_]+|oar_[a-z0-9_]+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")


def prose(text: str, names: set[str] | None = None) -> str:
    """Header prose as Markdown: emphasis characters escaped, OAR_/oar_ identifiers as code, entry
    names (those with an underscore: "send" stays a word) linked to their sections."""
    text = text.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;")

    def token(match: re.Match) -> str:
        word = match.group(1)
        if names and word in names:
            return f"[`{word}`](#{word})"
        if word.startswith(("OAR_", "oar_")):
            return f"`{word}`"
        return word

    return _TOKEN.sub(token, text)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ---- the ABI reference -----------------------------------------------------------------------

def _top_comment(header: str) -> str:
    """The header's opening comment (conventions, versioning) as Markdown."""
    body = header[header.index("/*") + 2:header.index("*/")]
    lines = [re.sub(r"^ ?\* ?", "", line) for line in body.splitlines()]
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if following and set(following.strip()) == {"-"} and line.strip():
            out += [f"### {line.strip()}", ""]
            index += 2
            continue
        out.append(line)
        index += 1
    # drop the first paragraph (the file's name line), keep the rest
    text = "\n".join(out).strip()
    text = text.split("\n\n", 1)[1] if "\n\n" in text else text
    # bullets: "- " lines with indented continuations
    return re.sub(r"\n  (?=\S)", " ", text)


def _statuses(header: str) -> list[tuple[str, str, str]]:
    """(name, value, meaning) of the oar_status codes, from the enum's comments."""
    block = header[header.index("typedef int32_t oar_status;"):]
    block = block[block.index("enum {"):block.index("};")]
    found = []
    for match in re.finditer(r"/\*(.*?)\*/\s*(OAR_[A-Z_]+)\s*=\s*(\d+)", block, re.S):
        meaning = " ".join(match.group(1).split())
        found.append((match.group(2), match.group(3), meaning))
    return found


def _status_list(text: str, names: set[str]) -> str:
    parts = [part.strip() for part in re.split(r";\s+(?=OAR_)", text) if part.strip()]
    if len(parts) == 1 and not parts[0].startswith("OAR_"):
        return prose(parts[0], names)
    return "\n".join(f"- {prose(part, names)}" for part in parts)


def abi_markdown(header: str | None = None) -> str:
    abi_doc = _abi_doc()
    header = HEADER.read_text(encoding="utf-8") if header is None else header
    entries = abi_doc.entries(header)
    sections = abi_doc.sections(header)
    groups = abi_doc.optional_groups(header)
    names = {entry.name for entry in entries}
    major = re.search(r"#define OAR_ABI_VERSION_MAJOR (\d+)", header).group(1)
    minor = re.search(r"#define OAR_ABI_VERSION_MINOR (\d+)", header).group(1)
    required = [entry for entry in entries if entry.required]
    lines = [
        f"# Device ABI reference (version {major}.{minor})", "",
        GENERATED_NOTE.format(source="interface/include/oar/device_api.h"), "",
        f"A plugin is one shared library exporting `oar_plugin_init`, which fills `oar_plugin_params` with "
        f"a function table, `oar_device_table`, of {len(entries)} entry points: {len(required)} REQUIRED "
        f"(the host refuses a plugin that lacks one) and {len(entries) - len(required)} OPTIONAL (absent: "
        f"the host uses the fallback each names). `oar new-backend` generates a plugin that implements "
        f"the required ones; the [vendor guide](../vendor/implement.md) walks through them.", "",
        "## Conventions", "",
        prose(_top_comment(header), names), "",
        "## Status codes", "",
        "| status | value | meaning |", "|---|---|---|",
    ]
    for name, value, meaning in _statuses(header):
        lines.append(f"| `{name}` | {value} | {cell(prose(meaning, names))} |")
    lines += ["", "## The entry points at a glance", "",
              "| # | entry | group | requirement | blocking |", "|---|---|---|---|---|"]
    for entry in entries:
        requirement = "REQUIRED" if entry.required else "optional"
        blocking = entry.blocking.split(";")[0].split("(")[0].strip() or "not stated"
        lines.append(f"| {entry.index} | [`{entry.name}`](#{entry.name}) | {entry.section} | {requirement} | "
                     f"{cell(blocking)} |")
    lines += ["", "Optional entries that come together (the host ignores a partly provided group):", ""]
    for group, members in groups.items():
        if len(members) > 1:
            lines.append(f"- {group}: " + ", ".join(f"`{member}`" for member in members))
    for section in sections:
        lines += ["", f"## {section.title}", ""]
        if section.text:
            lines += [prose(section.text, names), ""]
        for name in section.entries:
            entry = entries[[e.name for e in entries].index(name)]
            lines += _entry_markdown(entry, names, groups)
    return "\n".join(lines).rstrip() + "\n"


def _entry_markdown(entry, names: set[str], groups: dict[str, list[str]]) -> list[str]:
    names = names - {entry.name}  # no link to the section itself
    requirement = "**REQUIRED**" if entry.required else "OPTIONAL"
    if entry.requirement_note:
        requirement += f" ({prose(entry.requirement_note, names)})"
    if not entry.required and len(groups.get(entry.group, [])) > 1:
        requirement += f"; group {entry.group}"
    threads = prose(entry.threads, names) if entry.threads else "any thread, concurrently (the header's convention)"
    lines = [
        f"### {entry.name}", "",
        "```c",
        f"{entry.result} (*{entry.name})({entry.params});",
        "```", "",
        prose(entry.summary[:1].upper() + entry.summary[1:], names), "",
        "| | |", "|---|---|",
        f"| requirement | {cell(requirement)} |",
        f"| blocking | {cell(prose(entry.blocking, names)) if entry.blocking else 'not stated'} |",
        f"| threads | {cell(threads)} |", "",
    ]
    if entry.status:
        lines += ["Returns:", "", _status_list(entry.status, names), ""]
    return lines


# ---- the op reference ------------------------------------------------------------------------

KIND_TITLES = {
    "creation": "Creation", "unary": "Unary elementwise", "binary": "Binary elementwise",
    "ternary": "Ternary elementwise", "reduction": "Reductions", "matmul": "Matrix products", "nn": "Neural network",
    "index": "Indexing", "view": "Views (never reach a plugin)", "misc": "Miscellaneous",
}


def _opset():
    """oar_opset, imported from the source tree (the docs need no installed oar)."""
    sys.path.insert(0, str(REPO / "interface"))
    try:
        import oar_opset
    finally:
        sys.path.pop(0)
    return oar_opset


def ops_markdown(opset=None) -> str:
    """The op reference page of an oar_opset.OpSet (by default: interface/ops.yaml, checked)."""
    opset = _opset().load(str(OPS_YAML)) if opset is None else opset
    by_kind: dict[str, list] = {}
    for op in opset:
        by_kind.setdefault(op.kind, []).append(op)
    lines = [
        f"# Op reference ({len(opset)} ops)", "",
        GENERATED_NOTE.format(source="interface/ops.yaml"), "",
        "Every op is defined once, in `interface/ops.yaml`, and read through one typed model, the "
        "package `oar_opset` ([the op model](op-model.md)). A plugin implements an op by answering "
        "`kernel_query(op, dtypes)` (the dtypes of the inputs, then of the outputs) and running "
        "`kernel_launch` with the inputs, outputs and attributes listed here; an op it does not answer "
        "runs through the host fallback. The runtime's op functions (`oar.ops.<name>`), autograd, the "
        "conformance op tests and the `oar new-backend` kernel stubs are generated from the same file.", "",
        "## The file's own key", "",
        "```text", opset.header, "```", "",
        "## dtype sets", "",
        "| set | dtypes |", "|---|---|",
    ]
    for name, members in opset.dtype_sets.items():
        lines.append(f"| `{name}` | {', '.join(members)} |")
    lines += ["", "## All ops", "", "| op | kind | inputs | attrs | dtypes | out dtype |", "|---|---|---|---|---|---|"]
    for op in opset:
        attrs = ", ".join(op.attr_names) or "-"
        dtypes = op.dtype_set or ", ".join(op.dtypes)
        inputs = ", ".join(_port_text(i) for i in op.inputs) or "-"
        lines.append(f"| [`{op.name}`](#{op.name}) | {op.kind} | {cell(inputs)} | {cell(attrs)} | {cell(dtypes)} | "
                     f"{op.out_dtype} |")
    for kind, ops in by_kind.items():
        lines += ["", f"## {KIND_TITLES.get(kind, kind)}", ""]
        for op in ops:
            lines += _op_markdown(op, opset.dtype_sets)
    return "\n".join(lines).rstrip() + "\n"


def _port_text(port) -> str:
    return port.name + ("?" if port.optional else "") + ("..." if port.variadic else "")


# What each out_dtype rule of ops.yaml gives (a dtype name gives itself).
OUT_DTYPE_RULES = {
    "same": "the first input's dtype",
    "promote": "the inputs' promoted dtype",
    "float": "the inputs' promoted dtype; float32 where that is integral or bool",
    "accumulate": "a float input's dtype; int64 for integer and bool input",
    "attr": "the `dtype` attr",
}


def _out_dtype_text(rule) -> str:
    meaning = OUT_DTYPE_RULES.get(str(rule))
    return f"{rule}: {meaning}" if meaning else str(rule)


def _op_markdown(op, sets) -> list[str]:
    dtype_text = f"{op.dtype_set} ({', '.join(sets[op.dtype_set])})" if op.dtype_set else ", ".join(op.dtypes)
    inputs = [_port_text(i) + (f" ({i.role})" if i.role != "data" else "") for i in op.inputs]
    outputs = [_port_text(o) for o in op.outputs]
    lines = [f"### {op.name}", "", cell(op.semantics).replace("*", "\\*"), "",
             "| | |", "|---|---|",
             f"| kind | {op.kind} |",
             f"| inputs | {cell(', '.join(f'`{i}`' for i in inputs)) or 'none'} |",
             f"| outputs | {cell(', '.join(f'`{o}`' for o in outputs)) or 'none'} |",
             f"| dtypes | {cell(dtype_text)} |",
             f"| out dtype | {cell(_out_dtype_text(op.out_dtype))} |"]
    if op.broadcast:
        lines.append("| broadcast | inputs broadcast to the output's shape (passed expanded, stride 0) |")
    if op.nonempty_reduction:
        lines.append("| non-empty | reducing zero elements is an error |")
    if op.method:
        lines.append(f"| Tensor method | `t.{op.name}(...)` |")
    if op.fusion:
        lines.append(f"| fused by the compiler as | {op.fusion} |")
    lines.append("")
    if op.attrs:
        lines += ["| attr | type | default | meaning |", "|---|---|---|---|"]
        for attr in op.attrs:
            value = list(attr.default) if isinstance(attr.default, tuple) else attr.default
            default = "required" if attr.required else f"`{value!r}`"
            lines.append(f"| `{attr.name}` | {attr.type} | {cell(default)} | {cell(attr.doc)} |")
        lines.append("")
    if op.backward:
        lines += ["Gradients:", ""]
        for input_name, formula in op.backward.items():
            lines.append(f"- `{input_name}`: `{formula}`")
        lines.append("")
    return lines


# ---- MkDocs -------------------------------------------------------------------------------

def pages() -> dict[str, str]:
    return {"reference/abi.md": abi_markdown(), "reference/ops.md": ops_markdown()}


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri, content in pages().items():
        files.append(File.generated(config, uri, content=content))
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/hooks/reference.py OUTPUT_DIR")
    for uri, content in pages().items():
        target = Path(sys.argv[1]) / uri
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(target)
