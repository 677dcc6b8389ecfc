"""A raw cffi binding of ``oar/device_api.h`` (ABI mode: no compiler needed).

Tests use it to call a plugin's entry points with arguments the runtime would
never pass, and to assemble plugins whose entry points are Python callables
(for loader tests and fault injection). It is not on the runtime's hot path.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Callable, Mapping

import cffi

HEADER_NAME = "device_api.h"

_DEFINE = re.compile(r"^#define\s+(OAR_[A-Z0-9_]+)\s+(.+?)\s*$")
_CAST = re.compile(r"\((?:u?int(?:8|16|32|64)_t|size_t)\)")


def header_path() -> Path:
    """The installed header (``oar/include/oar/device_api.h``), else the source tree's."""
    installed = resources.files("oar") / "include" / "oar" / HEADER_NAME
    if installed.is_file():
        return Path(str(installed))
    source = Path(__file__).resolve().parents[3] / "interface" / "include" / "oar" / HEADER_NAME
    if source.is_file():
        return source
    raise FileNotFoundError(f"{HEADER_NAME} is neither installed with oar nor in a source checkout")


def _integer_define(expression: str) -> int | None:
    expression = _CAST.sub("", expression.split("/*")[0]).strip()
    expression = re.sub(r"(\d+)[uU]\b", r"\1", expression)
    if not re.fullmatch(r"[0-9xXa-fA-F()<|\s]+", expression):
        return None
    return int(eval(expression, {"__builtins__": {}}))  # digits, parentheses, << and | only


def cdef_source(header_text: str) -> str:
    """The header as cffi's parser accepts it: integer macros kept as values,
    every other preprocessor block dropped (extern "C", export attributes)."""
    defines: dict[str, int] = {}
    body: list[str] = []
    skip_depth = 0
    for line in header_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#if"):
            # the only conditional blocks are C++ linkage and platform export macros
            if skip_depth or "OAR_DEVICE_API_H_" not in stripped:
                skip_depth += 1
            continue
        if stripped.startswith("#endif"):
            if skip_depth:
                skip_depth -= 1
            continue
        if skip_depth or stripped.startswith("#"):
            match = _DEFINE.match(stripped)
            if match and not skip_depth:
                value = _integer_define(match.group(2))
                if value is not None:
                    defines[match.group(1)] = value
            continue
        body.append(line)
    text = "\n".join(body)
    for name, value in sorted(defines.items(), key=lambda item: -len(item[0])):
        text = re.sub(rf"\b{name}\b", str(value), text)
    macros = "\n".join(f"#define {name} {value}" for name, value in defines.items())
    return macros + "\n" + text + "\noar_status oar_plugin_init(oar_plugin_params* params);\n"


def _build_ffi() -> cffi.FFI:
    built = cffi.FFI()
    built.cdef(cdef_source(header_path().read_text()))
    return built


ffi = _build_ffi()
# enum values and integer macros of the header, e.g. C.OAR_ERROR_INVALID_HANDLE
C = ffi.dlopen(None)

STATUS_NAMES = {
    getattr(C, name): name
    for name in (
        "OAR_SUCCESS", "OAR_ERROR_INVALID_ARGUMENT", "OAR_ERROR_INVALID_HANDLE",
        "OAR_ERROR_OUT_OF_MEMORY", "OAR_ERROR_NOT_SUPPORTED", "OAR_ERROR_NOT_READY",
        "OAR_ERROR_TIMEOUT", "OAR_ERROR_DEVICE_LOST", "OAR_ERROR_INTERNAL",
    )
}


def table_fields() -> list[str]:
    """Entry names of oar_device_table in ABI order (struct_size excluded)."""
    return [name for name, _ in ffi.typeof("oar_device_table").fields if name != "struct_size"]


def required_entries() -> list[str]:
    """Entries the header marks ``Requirement: REQUIRED``, in ABI order (read by oar.vendor.abi_doc, the
    one parser of the header's doc comments)."""
    from oar.vendor import abi_doc

    return [entry.name for entry in abi_doc.entries(header_path().read_text()) if entry.required]


class RawPlugin:
    """A plugin library opened with cffi: ``oar_plugin_init`` called, ``init`` not."""

    def __init__(self, path: str | Path, host_major: int = C.OAR_ABI_VERSION_MAJOR,
                 host_minor: int = C.OAR_ABI_VERSION_MINOR):
        self.path = str(path)
        self.lib = ffi.dlopen(self.path)
        self.params = ffi.new("oar_plugin_params*")
        self.params.struct_size = ffi.sizeof("oar_plugin_params")
        self.params.host_abi_major = host_major
        self.params.host_abi_minor = host_minor
        self.init_status = self.lib.oar_plugin_init(self.params)
        self.table = self.params.table

    @property
    def device_type(self) -> str:
        return ffi.string(self.params.device_type).decode()

    def provides(self, entry: str) -> bool:
        end = ffi.offsetof("oar_device_table", entry) + ffi.sizeof("void*")
        return end <= self.table.struct_size and getattr(self.table, entry) != ffi.NULL

    def call(self, entry: str, *args) -> int:
        """Call an entry point with raw arguments; returns its status."""
        if not self.provides(entry):
            raise LookupError(f"{self.path} does not provide {entry}")
        return getattr(self.table, entry)(*args)

    def last_error(self) -> str:
        return ffi.string(self.table.get_last_error_message()).decode(errors="replace")


class PythonPlugin:
    """A plugin whose entry points are Python callables, for loader tests and fault injection.

    ``entries`` maps table field names to callables with the C signature; an
    exception inside one returns OAR_ERROR_INTERNAL and is kept in
    ``errors`` (name, exception). ``init_address`` is the
    integer address of its ``oar_plugin_init``, for ``oar._C.load_from_init``.
    """

    def __init__(self, entries: Mapping[str, Callable], *, device_type: str = "pyplug",
                 plugin_version: str = "0.0-test", abi_major: int | None = None,
                 abi_minor: int | None = None, table_size: int | None = None,
                 capabilities: int = 0, init_status: int = 0, provide_table: bool = True):
        self._keep: list[object] = []
        self.errors: list[tuple[str, BaseException]] = []
        self.table = ffi.new("oar_device_table*")
        self.table.struct_size = ffi.sizeof("oar_device_table") if table_size is None else table_size
        for name, function in entries.items():
            field_type = dict(ffi.typeof("oar_device_table").fields)[name].type
            error = C.OAR_ERROR_INTERNAL if field_type.result.cname == "int32_t" else ffi.NULL
            callback = ffi.callback(field_type, function, error=error, onerror=self._recorder(name))
            self._keep.append(callback)
            setattr(self.table, name, callback)
        self._device_type = ffi.new("char[]", device_type.encode())
        self._plugin_version = ffi.new("char[]", plugin_version.encode())
        major = C.OAR_ABI_VERSION_MAJOR if abi_major is None else abi_major
        minor = C.OAR_ABI_VERSION_MINOR if abi_minor is None else abi_minor

        def plugin_init(params):
            if init_status:
                return init_status
            params.plugin_abi_major = major
            params.plugin_abi_minor = minor
            params.table = self.table if provide_table else ffi.NULL
            params.device_type = self._device_type
            params.plugin_version = self._plugin_version
            params.capabilities = capabilities
            return 0

        self._init = ffi.callback("oar_plugin_init_fn", plugin_init,
                                  error=C.OAR_ERROR_INTERNAL)

    def _recorder(self, name: str) -> Callable:
        def record(exception_type, exception, traceback) -> None:
            self.errors.append((name, exception))
        return record

    @property
    def init_address(self) -> int:
        return int(ffi.cast("uintptr_t", self._init))
