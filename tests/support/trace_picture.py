"""A trace as a picture: the spans a test collected (tests/support/otlp.py), drawn as a
waterfall in SVG, one row per span in tree order (a child under its parent, siblings by
start), a bar from its start to its end on a shared time axis, coloured by the service
that made it. The documentation's trace picture (docs/guides/tracing.md) is drawn by
the end-to-end trace test from a real run (tests/e2e/test_one_trace.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from html import escape

from tests.support.otlp import Span

ROW_PX = 22
LABEL_PX = 330
BAR_PX = 560
AXIS_PX = 34
INDENT_PX = 14
PALETTE = ("#3b6fb6", "#d9822b", "#2e9e6a", "#8e5bb5", "#c2474d", "#6b7a8f")


def tree_order(spans: Sequence[Span]) -> list[tuple[int, Span]]:
    """(depth, span) in tree order: each span under its parent, siblings by start; a
    span whose parent was not collected is a root."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = defaultdict(list)
    roots = []
    for span in spans:
        if span.parent_id and span.parent_id in ids:
            children[span.parent_id].append(span)
        else:
            roots.append(span)
    out: list[tuple[int, Span]] = []

    def walk(span: Span, depth: int) -> None:
        out.append((depth, span))
        for child in sorted(children[span.span_id], key=lambda s: (s.start_ns, s.end_ns)):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda s: s.start_ns):
        walk(root, 0)
    return out


def render(spans: Sequence[Span], title: str) -> str:
    """The SVG text of the waterfall of `spans` (one trace)."""
    rows = tree_order(spans)
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    total = max(end - start, 1)
    services = sorted({str(s.resource.get("service.name", "?")) for s in spans})
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(services)}
    width = LABEL_PX + BAR_PX + 50  # room for the last tick's label
    height = AXIS_PX + ROW_PX * len(rows) + 30 + 18 * len(services)

    def x(ns: int) -> float:
        return LABEL_PX + BAR_PX * (ns - start) / total

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for step in range(6):  # the time axis, in milliseconds since the first span
        at = LABEL_PX + BAR_PX * step / 5
        ms = total * step / 5 / 1e6
        out.append(f'<line x1="{at:.1f}" y1="{AXIS_PX - 8}" x2="{at:.1f}" '
                   f'y2="{AXIS_PX + ROW_PX * len(rows)}" stroke="#dddddd"/>')  # fmt: skip
        out.append(f'<text x="{at:.1f}" y="{AXIS_PX - 12}" text-anchor="middle" '
                   f'fill="#555555">{ms:,.0f} ms</text>')  # fmt: skip
    for row, (depth, span) in enumerate(rows):
        y = AXIS_PX + ROW_PX * row
        service = str(span.resource.get("service.name", "?"))
        label = f"{span.name} ({span.kind.lower()})"
        out.append(f'<text x="{4 + INDENT_PX * depth}" y="{y + 15}" fill="#222222">'
                   f"{escape(label)}</text>")  # fmt: skip
        left, right = x(span.start_ns), x(span.end_ns)
        fill = "#c2474d" if span.error else colour[service]
        if right - left < 3:  # a moment: a mark, not a bar
            out.append(f'<rect x="{left - 2:.1f}" y="{y + 4}" width="4" height="14" '
                       f'fill="{fill}"/>')  # fmt: skip
        else:
            out.append(f'<rect x="{left:.1f}" y="{y + 4}" width="{right - left:.1f}" '
                       f'height="14" rx="2" fill="{fill}"/>')  # fmt: skip
        duration = (span.end_ns - span.start_ns) / 1e6
        out.append(f"<title>{escape(label)}: {duration:,.1f} ms</title>")
    legend = AXIS_PX + ROW_PX * len(rows) + 24
    for i, name in enumerate(services):
        y = legend + 18 * i
        out.append(f'<rect x="4" y="{y - 10}" width="12" height="12" fill="{colour[name]}"/>')
        out.append(f'<text x="22" y="{y}" fill="#222222">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
