"""Text from a plugin (names, versions, log and error messages), made safe to print: control
characters are shown as escapes instead of reaching the terminal, where ESC sequences would
clear the screen, set the window title or forge hyperlinks. The one helper every printer uses
(``oar info``, the conformance console report, the ``oar.plugin`` log, DeviceError messages)."""

from __future__ import annotations

import logging
import re

__all__ = ["printable", "PrintableLogFilter"]

# C0 controls, DEL, C1 controls (ESC and CSI among them), and the bidirectional overrides and
# isolates that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, multiline: bool = False) -> str:
    """``str(text)`` with every control character written as ``\\xNN`` (``\\uNNNN`` for the bidi
    controls); with ``multiline`` newlines and tabs stay as they are."""
    return (_CONTROL_BUT_LINES if multiline else _CONTROL).sub(_escape, str(text))


class PrintableLogFilter(logging.Filter):
    """Escapes a record's message (with its arguments) for the terminal; handlers see the result."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = printable(record.getMessage(), multiline=True)
        record.args = None
        return True


# What plugins log reaches the "oar.plugin" logger (sdk/csrc/host_callbacks.cpp): escaped there,
# whatever handler prints it. Installed once, at import (oar.errors imports this module).
_PLUGIN_LOGGER = logging.getLogger("oar.plugin")
if not any(isinstance(f, PrintableLogFilter) for f in _PLUGIN_LOGGER.filters):
    _PLUGIN_LOGGER.addFilter(PrintableLogFilter())
