"""The HTML report: one self-contained file (inline CSS, SVG and a little script; nothing is
fetched) that shows what fusion did to a model.

* the headline figures: kernels, main-memory bytes and eta, arena, predicted (and measured) time;
* the graph with every fusion group a coloured cluster (``graph_svg``);
* a sortable table of the groups: kernels, bytes, FLOPs, intensity, roofline bound, and time
  before (the group's original ops, one kernel each) and after (the group as one kernel),
  predicted by the cost model and, when measured (``opfuse compile --measure``), measured;
* the roofline of the target with every kernel on it (``charts.roofline_svg``);
* the arena over the kernel order (``charts.memory_timeline_svg``);
* the decision log: every fusion, rewrite and refusal with its reason, and every pair of
  adjacent groups left apart with why (``opfuse explain``).

    html = render_html(HtmlInputs(comp.report, comp.original, comp.plan, comp.memory,
                                  comp.decisions, cost_model))

Every name from the model is HTML-escaped. The script only sorts and filters tables; when it
has run it sets ``data-opfuse-ready="ok"`` on ``<html>`` (a browser test reads it).
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

from opfuse.cost.model import CostModel
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.memory.plan import MemoryPlan
from opfuse.report.charts import HIGH_WATER, LIVE, RooflinePoint, memory_timeline_svg, roofline_svg
from opfuse.report.graph_svg import SINGLE, graph_svg, rule_colours
from opfuse.report.summary import human_bytes, human_count
from opfuse.rules.decisions import Decision, RefusalKind


@dataclass
class HtmlInputs:
    report: dict  # Compilation.report (the fusion report, planner figures, arena; measured times if any)
    original: Graph
    plan: FusionPlan
    memory: MemoryPlan
    decisions: Sequence[Decision]
    cost_model: CostModel  # the target's profile and the corrections the plan used
    layout: str = "auto"  # graph layout: auto, dot, svg (graph_svg)


def group_rows(inp: HtmlInputs) -> list[dict]:
    """The report's groups with predicted time before (their original ops, one kernel each) and
    after (one kernel), from the cost model unless the planner already predicted it."""
    cm = inp.cost_model
    by_name = {g.name: g for g in inp.plan.groups}
    orig = {n.name: n for n in inp.original.nodes}
    single = {name: cm.group_cost(inp.original, [n]).latency_s for name, n in orig.items()}
    rows = []
    for i, g in enumerate(inp.report.get("groups", []), 1):
        group = by_name.get(g["name"])
        after = g.get("predicted_latency_s")
        if after is None and group is not None:
            after = cm.group_cost(inp.plan.graph, group).latency_s
        before = sum(single[o] for o in g.get("origin", []) if o in single)
        rows.append({**g, "index": i, "predicted_after_s": after, "predicted_before_s": before or None})
    return rows


def _us(s: float | None) -> str:
    return "" if s is None else f"{s * 1e6:,.1f}"


def _cell(text: str, sort_value: float | str | None = None, cls: str = "") -> str:
    key = "" if sort_value is None else f' data-v="{escape(str(sort_value))}"'
    return f'<td{key}{f" class={cls!r}" if cls else ""}>{text}</td>'


def _table(table_id: str, headers: Sequence[tuple[str, str]], rows: list[str]) -> str:
    """``headers``: (label, "num" or "text"); every column sorts on a click."""
    head = "".join(f'<th data-type="{kind}" title="sort">{escape(label)}</th>' for label, kind in headers)
    return (f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _groups_table(rows: list[dict], colours: dict[str, str]) -> str:
    measured = any(r.get("measured_latency_s") is not None for r in rows)
    headers = [("#", "num"), ("group", "text"), ("rule", "text"), ("ops", "text"), ("kernels", "num"),
               ("bytes before", "num"), ("bytes after", "num"), ("eta", "num"),
               ("FLOPs", "num"), ("FLOP/B", "num"), ("bound", "text"), ("predicted before µs", "num"),
               ("predicted after µs", "num")]
    if measured:
        headers += [("measured before µs", "num"), ("measured after µs", "num")]
    out = []
    for r in rows:
        rule = r.get("rule") or ""
        colour = colours.get(rule, SINGLE) if len(r["nodes"]) > 1 else SINGLE
        swatch = f'<span class="sw" style="background:{colour}"></span>'
        cells = [_cell(str(r["index"]), r["index"]), _cell(escape(r["name"]), r["name"]),
                 _cell(swatch + escape(rule or "-"), rule),
                 _cell("+<wbr>".join(escape(op) for op in r["ops"]), "+".join(r["ops"]), "ops"),
                 _cell(f"{r['kernels_before']} → {r['kernels_after']}", r["kernels_before"]),
                 _cell(human_bytes(r["bytes_before"]), r["bytes_before"]),
                 _cell(human_bytes(r["bytes_after"]), r["bytes_after"]), _cell(f"{r['eta']:.3f}", r["eta"]),
                 _cell(human_count(r["flops"]), r["flops"]),
                 _cell(f"{r['arithmetic_intensity']:.2f}", r["arithmetic_intensity"]),
                 _cell(escape(r.get("bound") or ""), r.get("bound") or ""),
                 _cell(_us(r["predicted_before_s"]), r["predicted_before_s"]),
                 _cell(_us(r["predicted_after_s"]), r["predicted_after_s"])]
        if measured:
            cells += [_cell(_us(r.get("measured_before_s")), r.get("measured_before_s")),
                      _cell(_us(r.get("measured_latency_s")), r.get("measured_latency_s"))]
        out.append(f"<tr>{''.join(cells)}</tr>")
    return _table("groups", headers, out)


def _roofline(rows: list[dict], colours: dict[str, str], cm: CostModel, target: str) -> tuple[str, int]:
    points = []
    skipped = 0
    for r in rows:
        t = r.get("measured_latency_s") or r.get("predicted_after_s")
        if not r["flops"] or not r["bytes_after"] or not t or r.get("zero_copy"):
            skipped += 1
            continue
        colour = colours.get(r.get("rule") or "", SINGLE) if len(r["nodes"]) > 1 else SINGLE
        points.append(RooflinePoint(r["name"], r["flops"] / r["bytes_after"], r["flops"] / t / 1e9, colour,
                                    r.get("measured_latency_s") is not None, "+".join(r["ops"])))
    p = cm.profile
    return roofline_svg(points, p.peak_for("float32") / 1e9, p.mem_bandwidth / 1e9, target), skipped


def _decisions_table(decisions: Sequence[Decision], explain: list[dict]) -> str:
    headers = [("pass", "text"), ("rule", "text"), ("verdict", "text"), ("why not", "text"), ("ops", "text"),
               ("reason", "text")]
    out = []
    for d in decisions:
        verdict = d.verdict
        cls = "refused" if not d.taken else "taken"
        out.append(f'<tr class="{cls}">' + "".join(_cell(escape(x), x) for x in (
            d.pass_name, d.rule, verdict, d.label, ", ".join(d.nodes), d.reason)) + "</tr>")
    for e in explain:
        out.append('<tr class="refused">' + "".join(_cell(escape(x), x) for x in (
            "explain", "-", "not merged", e["reason_kind"], f"{e['producer']} / {e['consumer']}",
            f"via {', '.join(e['values'])}: {e['reason']}")) + "</tr>")
    return _table("decisions", headers, out)


def _card(label: str, value: str, detail: str = "") -> str:
    return (f'<div class="card"><div class="label">{escape(label)}</div><div class="value">{escape(value)}</div>'
            f'<div class="detail">{escape(detail)}</div></div>')


def _cards(r: dict) -> str:
    cards = [_card("kernels", f"{r['kernels_before']} → {r['kernels_after']}", f"{r.get('groups_after', '')} groups"),
             _card("main-memory traffic", f"{human_bytes(r['bytes_before'])} → {human_bytes(r['bytes_after'])}",
                   f"eta {r['eta']:.3f} (1 − M_boundary/M_total)"),
             _card("arena (peak memory)", human_bytes(r["arena_bytes"]),
                   f"lower bound {human_bytes(r['arena_lower_bound_bytes'])}"),
             _card("FLOPs", human_count(r["flops_after"]),
                   f"FLOP/B {r['arithmetic_intensity_before']:.2f} → {r['arithmetic_intensity_after']:.2f}")]
    if r.get("predicted_latency_s") is not None:
        cards.append(_card("predicted latency", f"{r['predicted_latency_s'] * 1e3:.3f} ms",
                           f"{r.get('planner', {}).get('method', '')} planner, critical path "
                           f"{r['critical_path_s'] * 1e3:.3f} ms"))
    if r.get("measured_latency_s") is not None:
        before = r.get("measured_before_latency_s")
        detail = f"unfused {before * 1e3:.3f} ms" if before else f"median of {r.get('measured_repeat')} runs"
        cards.append(_card("measured latency", f"{r['measured_latency_s'] * 1e3:.3f} ms", detail))
    return f'<div class="cards">{"".join(cards)}</div>'


def _legend(colours: dict[str, str]) -> str:
    items = [f'<span class="item"><span class="sw" style="background:{c}"></span>{escape(rule)}</span>'
             for rule, c in colours.items()]
    items.append(f'<span class="item"><span class="sw" style="background:{SINGLE}"></span>single op</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def _timeline(inp: HtmlInputs) -> str:
    blocks = [(off, size, start, end) for off, size, start, end in inp.memory.blocks.values()]
    return memory_timeline_svg([g.name for g in inp.plan.groups], blocks, inp.memory.arena_bytes,
                               inp.memory.lower_bound_bytes)


def render_html(inp: HtmlInputs) -> str:
    """The report as one HTML document (module docstring)."""
    r = inp.report
    colours = rule_colours(inp.plan)
    rows = group_rows(inp)
    svg, how = graph_svg(inp.plan, inp.layout)
    roof, skipped = _roofline(rows, colours, inp.cost_model, str(r.get("target", "")))
    refused, pairs = sum(1 for d in inp.decisions if not d.taken), len(r.get("explain", []))
    kinds = ", ".join(f"{escape(RefusalKind(k).label)} {v}" for k, v in
                      sorted(_count(d.kind for d in inp.decisions if not d.taken).items()))
    title = f"opfuse report: {r.get('model', '')} on {r.get('target', '')}"
    measured_note = ("measured: median per kernel with kernel timers on (before: the unfused build)"
                     if any(g.get("measured_latency_s") is not None for g in rows)
                     else "predicted by the cost model; run with --measure to add measured times")
    body = f"""
<header><h1>{escape(title)}</h1>
<p class="sub">{escape(str(r.get('planner', {}).get('method', 'fusion rules')))} plan, generated by opfuse ·
{len(rows)} groups · self-contained file</p></header>
{_cards(r)}
<section><h2>Graph</h2>
<p class="note">Each coloured box is one fused kernel, coloured by the rule that formed it; grey ops run alone.
Hover for names and shapes. Layout: {escape(how)}.</p>
{_legend(colours)}
<div class="graphbox">{svg}</div></section>
<section><h2>Groups</h2><p class="note">Click a column to sort. Times: {escape(measured_note)}.</p>
<div class="tablebox">{_groups_table(rows, colours)}</div></section>
<section class="two"><div><h2>Roofline</h2>
<p class="note">Each kernel at its operational intensity and attained rate (hollow: predicted, filled:
measured){f'; {skipped} kernel(s) without FLOPs or bytes are left out' if skipped else ''}.</p>{roof}</div>
<div><h2>Arena over time</h2><p class="note">{escape(inp.memory.summary())}.</p>
<div class="legend">
<span class="item"><span class="sw" style="background:{LIVE}"></span>bytes live at each kernel</span>
<span class="item"><span class="sw" style="background:{HIGH_WATER}"></span>high-water mark of the placed blocks</span>
</div>{_timeline(inp)}</div></section>
<section><h2>Decision log</h2>
<p class="note">{len(inp.decisions)} decisions, {refused} refused ({kinds or 'none'}); {pairs} pair(s) of groups
left apart (opfuse explain).
<label><input type="checkbox" id="only-refused"> refusals only</label>
<input type="search" id="filter" placeholder="filter (rule, op, reason)"></p>
<div class="tablebox">{_decisions_table(inp.decisions, r.get('explain', []))}</div></section>
"""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body>{body}<script>{SCRIPT}</script></body></html>
"""


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1600px;
padding:16px 28px;color:#222;background:#fafafa}
h1{font-size:22px;margin:6px 0 2px}h2{font-size:17px;margin:18px 0 6px}
.sub,.note{color:#666;font-size:13px;margin:2px 0 8px}
section{background:white;border:1px solid #e3e3e3;border-radius:8px;padding:8px 16px 14px;margin:14px 0}
section.two{display:flex;gap:24px;flex-wrap:wrap}section.two>div{flex:1 1 560px;min-width:0}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px;margin:12px 0}
.card{background:white;border:1px solid #e3e3e3;border-radius:8px;padding:10px 14px}
.card .label{font-size:12px;color:#777;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:16px;white-space:nowrap;font-weight:600;margin:2px 0}.card .detail{font-size:12px;color:#666}
.graphbox{max-height:560px;overflow:auto;border:1px solid #eee;border-radius:6px;padding:6px;text-align:center}
.tablebox{max-height:520px;overflow:auto}
table{border-collapse:collapse;font-size:12px;width:100%}
th{position:sticky;top:0;background:#f0f2f5;cursor:pointer;text-align:left;padding:5px 6px;vertical-align:bottom;
border-bottom:1px solid #ccc;user-select:none}
#groups th:nth-child(n+5){text-align:right}
th.asc:after{content:" ▲"}th.desc:after{content:" ▼"}
td{padding:3px 6px;border-bottom:1px solid #eee;vertical-align:top}
#groups td{white-space:nowrap}#groups td.ops{white-space:normal;min-width:110px;max-width:260px}
#groups td:nth-child(n+5){text-align:right;font-variant-numeric:tabular-nums}
tr.refused td:nth-child(3){color:#b3261e}tr.taken td:nth-child(3){color:#2a7d3b}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12.5px;margin:4px 0 8px}
svg.chart{max-width:100%;height:auto}
#filter{margin-left:12px;padding:3px 6px;font-size:12.5px;width:260px}
"""

SCRIPT = """
(function(){
  function key(td, type){
    var v = td.getAttribute('data-v'); if (v === null) v = td.textContent;
    if (type === 'num'){ var f = parseFloat(v); return isNaN(f) ? -Infinity : f; }
    return v.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th, col){
      th.addEventListener('click', function(){
        var asc = !th.classList.contains('asc');
        table.querySelectorAll('th').forEach(function(h){ h.classList.remove('asc', 'desc'); });
        th.classList.add(asc ? 'asc' : 'desc');
        var type = th.getAttribute('data-type'), body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function(a, b){
          var x = key(a.cells[col], type), y = key(b.cells[col], type);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function(r){ body.appendChild(r); });
      });
    });
  });
  var only = document.getElementById('only-refused'), filter = document.getElementById('filter');
  function apply(){
    var q = filter.value.toLowerCase();
    document.querySelectorAll('#decisions tbody tr').forEach(function(tr){
      var show = (!only.checked || tr.classList.contains('refused')) &&
                 (!q || tr.textContent.toLowerCase().indexOf(q) >= 0);
      tr.style.display = show ? '' : 'none';
    });
  }
  only.addEventListener('change', apply); filter.addEventListener('input', apply);
  document.documentElement.setAttribute('data-opfuse-ready', 'ok');
})();
"""
