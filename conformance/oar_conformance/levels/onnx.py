"""Level ``onnx``: the ONNX backend node test cases (from the installed onnx package) through oar.onnx.

One test per case, ``onnx.<op type>.<case>`` (lower case): the case's model loads into
``oar.onnx.InferenceSession`` on the device (op by op), every data set runs, and each output must
match onnx's expected output within the case's tolerance (``|got - want| <= atol + rtol * |want|``,
onnx's defaults rtol 1e-3, atol 1e-7; NaN where NaN is expected). A model oar.onnx cannot express
(an op without a lowering, a dtype Oar lacks) is reported at load time and counts as *not supported*
(a skip whose reason starts "not supported"). The report carries a per-ONNX-op scoreboard
(passed / failed / not supported) and the pass rate over all cases. The level is opt-in
(``--level onnx``; not part of ``all``). ``--quick`` runs one case per ONNX op type (see quick_ids).
"""

from __future__ import annotations

from oar_conformance.levels.onnx_cases import as_array, compare, node_cases, one_case_per_op_type
from oar_conformance.levels.runtime_session import RuntimeContext, open_session  # noqa: F401
from oar_conformance.registry import PASS, Skip, conformance_test

DESCRIPTION = "the ONNX backend node test cases of the installed onnx package through oar.onnx"
SESSION_KIND = "runtime"
NOT_SUPPORTED = "not supported"


def test_id(op_type: str, name: str) -> str:
    case = name[len("test_"):] if name.startswith("test_") else name
    return f"onnx.{op_type.lower()}.{case.lower()}"


def quick_ids(test_ids: list[str]) -> list[str]:
    """The quick tier: one case per ONNX op type (onnx_cases.one_case_per_op_type)."""
    return one_case_per_op_type(test_ids)


def _make_test(case):
    def run(ctx: RuntimeContext) -> None:
        import onnx

        import oar.onnx

        data = case.load()
        model = onnx.load_model_from_string(data["model"])  # named by its graph: the case's name
        try:
            session = oar.onnx.InferenceSession(model, device=ctx.device, compile=False)
        except oar.onnx.OnnxUnsupportedError as error:
            raise Skip(f"{NOT_SUPPORTED}: {error}") from None
        names = [arg.name for arg in session.get_inputs()]
        outputs = [arg.name for arg in session.get_outputs()]
        for index, (inputs, expected) in enumerate(data["data_sets"]):
            inputs, expected = [as_array(v) for v in inputs], [as_array(v) for v in expected]
            try:
                got = session.run(None, dict(zip(names, inputs)))
            except oar.onnx.OnnxUnsupportedError as error:
                raise Skip(f"{NOT_SUPPORTED}: {error}") from None
            for name, value, want in zip(outputs, got, expected):
                compare(f"data set {index} output {name}", value, want, case.rtol, case.atol)

    run.__doc__ = f"ONNX node case {case.name} ({case.op_type}) against onnx's expected outputs."
    return run


def _register_all() -> None:
    seen = set()
    for case in node_cases():
        identifier = test_id(case.op_type, case.name)
        if identifier in seen:
            continue
        seen.add(identifier)
        conformance_test(identifier)(_make_test(case))


_register_all()


def report_extras(results: list[dict]) -> dict:
    """The scoreboard: per ONNX op type, cases passed / failed / not supported, and the pass rate."""
    board: dict[str, dict[str, int]] = {}
    for result in results:
        parts = result["id"].split(".")
        if len(parts) < 3:
            continue
        row = board.setdefault(parts[1], {"passed": 0, "failed": 0, "not_supported": 0})
        message = result.get("message") or ""
        if result["status"] == PASS:
            row["passed"] += 1
        elif message.startswith(NOT_SUPPORTED) or result["status"] == "skip":
            row["not_supported"] += 1
        else:
            row["failed"] += 1
    total = sum(sum(row.values()) for row in board.values())
    passed = sum(row["passed"] for row in board.values())
    rows = [{"op": op, **counts} for op, counts in sorted(board.items())]
    return {"scoreboard": {"rows": rows, "passed": passed, "total": total,
                           "pass_rate": round(passed / total, 4) if total else 0.0}}
