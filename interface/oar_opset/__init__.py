"""The one typed model of interface/ops.yaml, read by every generator and reader of the op set.

    import oar_opset
    ops = oar_opset.default()          # this installation's op set (packaged ops.json)
    ops = oar_opset.load("interface/ops.yaml")   # checked, errors name file and line
    ops["add"].inputs, ops["sum"].attr("dim").default, ops["where"].input_role("condition")

A package of its own beside oar (as torchgen beside torch) because the reference plugins'
table generators read it at build time, before oar's C extension exists.
"""
from oar_opset.check import check
from oar_opset.load import OpsetError, build, default, default_path, header_comment, load, write_json
from oar_opset.model import (ATTR_TYPES, DTYPES, FUSION_CLASSES, KINDS, OUT_DTYPE_RULES, ROLES, SHARDING_RULES,
                             Attr, Input, Op, OpSet, Output, Sharding)

__all__ = ["OpSet", "Op", "Input", "Output", "Attr", "OpsetError", "load", "default", "default_path", "build",
           "check", "write_json", "header_comment", "KINDS", "ATTR_TYPES", "DTYPES", "OUT_DTYPE_RULES", "ROLES",
           "FUSION_CLASSES", "SHARDING_RULES", "Sharding"]
