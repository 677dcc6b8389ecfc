"""The error of oar.jit (a module of its own so `import oar` needs neither onnx nor the compiler)."""


class ExportError(ValueError):
    """The model cannot be exported (or an exported file read) as asked; the message names the op, operand,
    input or file at fault."""
