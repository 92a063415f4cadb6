#!/usr/bin/env python3
"""Draws one drain's trace, as an OpenTelemetry Collector's file exporter wrote it (OTLP JSON
lines), as an SVG waterfall: one row per span, its events as ticks.

Usage: render-trace.py TRACES.jsonl NODE > trace.svg
(the trace is the one whose `drain` span has node=NODE; e2e/tests/traces.rs collects such a
file under /tmp/ebb-otelcol-*/traces.jsonl)
"""
import html
import json
import sys

SKIP = ("code.", "thread.", "busy_ns", "idle_ns", "target", "level", "resumed")


def value(v):
    return next(iter(v.values()), "") if isinstance(v, dict) else v


def attrs(lst):
    return {a["key"]: value(a["value"]) for a in lst or []}


def load(path):
    spans = []
    with open(path) as f:
        for line in f:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for rs in doc.get("resourceSpans", []):
                service = attrs(rs.get("resource", {}).get("attributes")).get("service.name", "")
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        s["service"] = service
                        s["attrs"] = attrs(s.get("attributes"))
                        spans.append(s)
    return spans


def main():
    path, node = sys.argv[1], sys.argv[2]
    spans = load(path)
    drain = next(s for s in spans if s["name"] == "drain" and s["attrs"].get("node") == node)
    trace = [s for s in spans if s["traceId"] == drain["traceId"]]
    ids = {s["spanId"] for s in trace}
    rows = []

    def walk(parent, depth):
        for s in sorted(
            (s for s in trace if s.get("parentSpanId", "") == parent),
            key=lambda s: int(s["startTimeUnixNano"]),
        ):
            rows.append((depth, s))
            walk(s["spanId"], depth + 1)

    for root in [s for s in trace if s.get("parentSpanId", "") not in ids]:
        rows.append((0, root))
        walk(root["spanId"], 1)
    t0 = min(int(s["startTimeUnixNano"]) for s in trace)
    t1 = max(int(s["endTimeUnixNano"]) for s in trace)
    span_ns = max(t1 - t0, 1)
    label_w, bar_w, row_h = 700, 380, 22
    width, height = label_w + bar_w + 20, row_h * (len(rows) + 2) + 10
    x = lambda ns: label_w + (ns - t0) * bar_w / span_ns
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="6" y="16" font-weight="bold">trace {drain["traceId"]} '
        f'({span_ns / 1e9:.2f} s, {len(trace)} spans, service {html.escape(drain["service"])})</text>',
    ]
    colours = {"loop": "#4c78a8", "simulate": "#72b7b2", "drain": "#f58518", "evict": "#e45756"}
    for i, (depth, s) in enumerate(rows):
        y = row_h * (i + 1) + 10
        a = {k: v for k, v in s["attrs"].items() if not k.startswith(SKIP) and k not in SKIP}
        shown = " ".join(f"{k}={v}" for k, v in sorted(a.items()) if k != "policy" or depth <= 1)
        label = html.escape(f'{"  " * depth}{s["name"]} {shown}')[:106]
        out.append(f'<text x="6" y="{y + 14}" xml:space="preserve">{label}</text>')
        start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
        w = max(x(end) - x(start), 1.5)
        out.append(
            f'<rect x="{x(start):.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
            f'fill="{colours.get(s["name"], "#9d9d9d")}"/>'
        )
        for e in s.get("events", []):
            ea = attrs(e.get("attributes"))
            ex = x(int(e["timeUnixNano"]))
            tip = html.escape(f'{e["name"]} {ea.get("pod", "")} {ea.get("pdb", "")}'.strip())
            out.append(
                f'<line x1="{ex:.1f}" y1="{y + 2}" x2="{ex:.1f}" y2="{y + row_h - 2}" '
                f'stroke="black" stroke-width="1.5"><title>{tip}</title></line>'
            )
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
