"""One self-contained HTML file (jinja2, autoescape on, StrictUndefined).

Summary, comparison, per-level tables, the ops level's op x dtype matrix, the
models level's loss curves against golden curves as inline SVG, and the
environment. Nothing is fetched from elsewhere; every string is escaped by
the template engine (plugin names and messages included).
"""

from __future__ import annotations

import os
from typing import Any

import jinja2

__all__ = ["render_html", "write_html", "curve_points", "failures_first"]

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
SVG_WIDTH, SVG_HEIGHT, SVG_PAD = 480, 220, 30
SEVERITY = ("error", "fail", "fallback", "skip", "pass")  # the order rows appear in: worst first
LABEL_ORDER = ("REGRESSION", "NEW-FAIL", "FIXED", "NEW")


def _rank(status: str | None) -> int:
    return SEVERITY.index(status) if status in SEVERITY else len(SEVERITY)


def failures_first(rows: list[dict], key: str = "status") -> list[dict]:
    """rows in a stable order, worst status first (error, fail, fallback, skip, pass)."""
    return sorted(rows, key=lambda row: _rank(row.get(key)))


def curve_points(steps: list, values: list, x_range: tuple, y_range: tuple) -> str:
    """SVG polyline points of (step, value) pairs mapped into the plot box (finite values only)."""
    (x0, x1), (y0, y1) = x_range, y_range
    width, height = SVG_WIDTH - 2 * SVG_PAD, SVG_HEIGHT - 2 * SVG_PAD
    points = []
    for step, value in zip(steps, values):
        if value is None or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
            continue
        x = SVG_PAD + (step - x0) / ((x1 - x0) or 1) * width
        y = SVG_PAD + height - (value - y0) / ((y1 - y0) or 1) * height
        y = min(max(y, SVG_PAD), SVG_PAD + height)  # a curve far off the golden one runs along the edge
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)


def _plots(curves: list[dict]) -> list[dict]:
    plots = []
    for curve in curves:
        steps = [s for s in curve.get("steps", [])]
        series = {"loss": curve.get("loss", []), "golden": curve.get("golden", [])}
        def finite(values):
            return [v for v in values if isinstance(v, (int, float)) and v == v and abs(v) != float("inf")]

        golden, loss = finite(series["golden"]), finite(series["loss"])
        if not steps or not (golden or loss):
            plots.append({**curve, "svg": None})
            continue
        x_range = (min(steps), max(steps))
        # the scale follows the golden curve; device losses within one golden span of it widen it
        base = golden or loss
        span = (max(base) - min(base)) or abs(max(base)) or 1.0
        near = [v for v in loss if min(base) - span <= v <= max(base) + span]
        low, high = min(base + near), max(base + near)
        margin = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
        y_range = (low - margin, high + margin)
        plots.append({**curve, "svg": {
            "width": SVG_WIDTH, "height": SVG_HEIGHT, "pad": SVG_PAD,
            "loss": curve_points(steps, series["loss"], x_range, y_range),
            "golden": curve_points(steps, series["golden"], x_range, y_range),
            "x_range": x_range, "y_range": (round(y_range[0], 4), round(y_range[1], 4)),
        }})
    return plots


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render_html(document: dict) -> str:
    extras: dict[str, Any] = document.get("extras") or {}
    models = extras.get("models") or {}
    matrix = (extras.get("ops") or {}).get("matrix")
    if matrix:
        worst = {id(row): min((_rank(cell) for cell in row["cells"].values()), default=len(SEVERITY))
                 for row in matrix["rows"]}
        matrix = {**matrix, "rows": sorted(matrix["rows"], key=lambda row: worst[id(row)])}
    changed = [test for test in document["tests"] if test.get("label")]
    changed.sort(key=lambda test: (LABEL_ORDER.index(test["label"]) if test["label"] in LABEL_ORDER
                                   else len(LABEL_ORDER), _rank(test.get("status"))))
    context = {
        "doc": document,
        "ops_matrix": matrix,
        "onnx_scoreboard": (extras.get("onnx") or {}).get("scoreboard"),
        "plots": failures_first(_plots(models.get("curves", []))),
        "model_ops": models.get("ops") or [],
        "torch_models": (extras.get("torch") or {}).get("models") or [],
        "torch_ops": failures_first((extras.get("torch") or {}).get("ops") or []),
        "torch_op_counts": (extras.get("torch") or {}).get("op_counts") or {},
        "changed": changed,
        "tests_by_level": {level["name"]: failures_first([t for t in document["tests"] if t["level"] == level["name"]])
                           for level in document["levels"]},
        "levels_by_name": {level["name"]: level for level in document["levels"]},
    }
    return _environment().get_template("report.html.j2").render(**context)


def write_html(document: dict, path: str) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(render_html(document))
    os.replace(temporary, path)
