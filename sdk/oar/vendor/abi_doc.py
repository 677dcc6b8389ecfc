"""The entry points of ``oar/device_api.h`` as data, read from the header's doc comments.

Each entry of ``oar_device_table`` carries a comment of a fixed shape::

    /* name: summary, in sentences.
     * Requirement: REQUIRED | OPTIONAL (why, or the fallback)
     * Blocking: synchronous | asynchronous (stream-ordered) | non-blocking ...
     * Threads: which threads may call it (absent: any thread)
     * Status: each status it returns and when
     */
    oar_status (*name)(parameters);

:func:`entries` turns them into :class:`Entry` records (with the C declaration,
so a generator can write a definition), :func:`sections` gives the table's
groups (``---- Memory ----``) with the prose some of them carry. The ABI
reference in ``docs/`` and the ``oar new-backend`` scaffold are generated from
these, never from a hand-written list.

This module imports nothing from ``oar`` at load time, so the docs build can
load it by path from a source checkout that was never compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Entry", "Section", "entries", "sections", "optional_groups", "header_text"]

FIELDS = ("Requirement", "Blocking", "Threads", "Status")
_COMMENT_OR_DECLARATION = re.compile(r"/\*(?P<comment>.*?)\*/|(?P<declaration>[^;/]+;)", re.S)
_FUNCTION_POINTER = re.compile(r"^(?P<result>.+?)\(\s*\*\s*(?P<name>\w+)\s*\)\s*\((?P<params>.*)\)\s*;$", re.S)
_SECTION = re.compile(r"^-{2,}\s*(?P<title>.+?)\s*-*\s*$")
_NAMES = re.compile(r"^(?P<names>\w+(?:\s*/\s*\w+)*):\s")


@dataclass
class Entry:
    """One entry point of the function table, as its doc comment and declaration state it."""

    name: str
    section: str
    index: int                   # position in the table (struct_size excluded)
    summary: str                 # the text before the first field, without the leading "name:"
    requirement: str             # "REQUIRED" or "OPTIONAL"
    requirement_note: str        # what follows the keyword, e.g. "fallback: ordinary host memory"
    blocking: str                # "" when the comment does not say
    threads: str                 # "" when the comment does not say (the header's convention: any thread)
    status: str                  # "" when the comment does not say
    result: str                  # C return type: "oar_status" or "const char*"
    params: str                  # C parameter list, whitespace-normalized: "int32_t device, void** ptr"
    param_names: list[str] = field(default_factory=list)
    shared_comment: bool = False  # the comment documents several entries ("group_start / group_end")
    # the optional group: entries that must be provided together share one (the group's first
    # entry, or "collectives"); a required entry is a group of its own
    group: str = ""

    @property
    def required(self) -> bool:
        return self.requirement == "REQUIRED"

    @property
    def asynchronous(self) -> bool:
        return self.blocking.startswith("asynchronous")


@dataclass
class Section:
    """A group of the table (``---- Memory ----``) and the prose its heading comment carries."""

    title: str
    text: str
    entries: list[str] = field(default_factory=list)


def header_text(path: str | Path | None = None) -> str:
    """The header's text: from path, else the installed header, else the source checkout's."""
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    here = Path(__file__).resolve().parents[1]  # the oar package
    for candidate in (here / "include" / "oar" / "device_api.h",
                      here.parents[1] / "interface" / "include" / "oar" / "device_api.h"):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    raise FileNotFoundError("device_api.h is neither installed with oar nor in a source checkout")


def _table(text: str) -> str:
    start = text.index("typedef struct oar_device_table {")
    end = text.index("} oar_device_table;")
    return text[text.index("{", start) + 1:end]


def _comment_lines(comment: str) -> list[str]:
    lines = []
    for line in comment.splitlines():
        line = line.rstrip()
        stripped = line.lstrip()
        if stripped.startswith("*"):
            stripped = stripped[1:]
            # keep the continuation indent ("*   OAR_ERROR_..." continues a field)
            lines.append(stripped[1:] if stripped.startswith(" ") else stripped)
        else:
            lines.append(stripped)
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _join(lines: list[str]) -> str:
    """Wrapped comment lines as one paragraph per blank-line-separated block."""
    paragraphs, current = [], []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def _parse_comment(comment: str) -> dict:
    """{"names", "summary", field: text} of an entry comment."""
    lines = _comment_lines(comment)
    parts: dict[str, list[str]] = {"summary": []}
    current = "summary"
    for line in lines:
        match = re.match(r"^(%s):\s*(.*)$" % "|".join(FIELDS), line)
        if match:
            current = match.group(1)
            parts[current] = [match.group(2)]
        else:
            parts[current].append(line)
    parsed = {key: _join(value) for key, value in parts.items()}
    summary = parsed["summary"]
    names = _NAMES.match(summary)
    parsed["names"] = [n.strip() for n in names.group("names").split("/")] if names else []
    parsed["summary"] = summary[names.end():].strip() if names else summary
    return parsed


def _param_names(params: str) -> list[str]:
    if params.strip() in ("", "void"):
        return []
    names = []
    for param in params.split(","):
        match = re.search(r"(\w+)\s*(?:\[\s*\w*\s*\])?\s*$", param.strip())
        if not match:
            raise ValueError(f"device_api.h: cannot name the parameter {param.strip()!r}")
        names.append(match.group(1))
    return names


def _walk(text: str) -> tuple[list[Entry], list[Section]]:
    found: list[Entry] = []
    found_sections: list[Section] = []
    section = Section("", "")
    pending: dict | None = None   # the last entry comment, until its declaration
    shared: dict | None = None    # a comment naming several entries, for the ones after the first
    for match in _COMMENT_OR_DECLARATION.finditer(_table(text)):
        if match.group("comment") is not None:
            lines = _comment_lines(match.group("comment"))
            heading = _SECTION.match(lines[0].strip()) if lines else None
            if heading:
                section = Section(heading.group("title"), _join(lines[1:]))
                found_sections.append(section)
                pending = shared = None
                continue
            parsed = _parse_comment(match.group("comment"))
            pending = parsed if "Requirement" in parsed or parsed["names"] else None
            continue
        declaration = " ".join(match.group("declaration").split())
        pointer = _FUNCTION_POINTER.match(declaration)
        if not pointer:  # struct_size
            pending = None
            continue
        name = pointer.group("name")
        doc, is_shared = pending, False
        if doc is None and shared is not None and name in shared["names"]:
            doc, is_shared = shared, True
        if doc is None or "Requirement" not in doc:
            raise ValueError(f"device_api.h: the entry {name} has no doc comment with a Requirement: line")
        if doc["names"] and name not in doc["names"]:
            raise ValueError(f"device_api.h: the comment before {name} documents {', '.join(doc['names'])}")
        requirement = doc["Requirement"]
        keyword = requirement.split()[0] if requirement else ""
        if keyword not in ("REQUIRED", "OPTIONAL"):
            raise ValueError(f"device_api.h: {name}: Requirement: {requirement!r} is neither REQUIRED nor OPTIONAL")
        note = requirement[len(keyword):].strip()
        if note.startswith("(") and note.endswith(")"):
            note = note[1:-1]
        params = pointer.group("params").strip()
        found.append(Entry(
            name=name, section=section.title, index=len(found), summary=doc["summary"],
            requirement=keyword, requirement_note=note, blocking=doc.get("Blocking", ""),
            threads=doc.get("Threads", ""), status=doc.get("Status", ""),
            result=" ".join(pointer.group("result").split()), params=params,
            param_names=_param_names(params), shared_comment=is_shared or len(doc["names"]) > 1))
        section.entries.append(name)
        shared = doc if len(doc["names"]) > 1 else None
        pending = None
    _assign_groups(found)
    return found, found_sections


def _assign_groups(found: list[Entry]) -> None:
    """Optional entries that come together: "(required with X)" joins X's group, "(the collectives
    group)" the collectives; any other entry is a group of its own."""
    by_name = {entry.name: entry for entry in found}
    for entry in found:
        entry.group = entry.name
    for entry in found:
        if entry.required:
            continue
        note = entry.requirement_note
        if "collectives group" in note:
            entry.group = "collectives"
            continue
        match = re.search(r"required with (\w+)", note)
        root = entry
        seen = set()
        while match and match.group(1) in by_name and root.name not in seen:
            seen.add(root.name)
            root = by_name[match.group(1)]
            match = re.search(r"required with (\w+)", root.requirement_note)
        entry.group = root.name


def entries(text: str | None = None) -> list[Entry]:
    """Every entry point of the table in ABI order (``text``: the header; default: :func:`header_text`)."""
    return _walk(header_text() if text is None else text)[0]


def sections(text: str | None = None) -> list[Section]:
    """The table's groups in order, each with its entries' names and its heading's prose."""
    return _walk(header_text() if text is None else text)[1]


def optional_groups(text: str | None = None) -> dict[str, list[str]]:
    """{group: [entry, ...]} of the optional entries, in ABI order; a plugin provides a whole
    group or none of it (the host ignores a partial group)."""
    groups: dict[str, list[str]] = {}
    for entry in entries(text):
        if not entry.required:
            groups.setdefault(entry.group, []).append(entry.name)
    return groups
