"""Pass instruments (after TVM's ``PassInstrument``): observe a pipeline run without touching it.

Hooks, each optional: ``enter(ctx)``, ``exit(ctx)``, ``before_pass(ctx, pass_, graph, index)``,
``after_pass(ctx, pass_, graph, index, modified, seconds)``, ``skipped_pass(ctx, pass_, index)``,
``on_decision(ctx, decision)``.

* ``PassTiming``: seconds per pass; ``report()`` is a table.
* ``DumpIR(dir)``: the IR text before and after every pass, ``NN_<pass>_before.ir`` /
  ``NN_<pass>_after.ir`` (NN = position in the pipeline), plus ``NN_<pass>_plan.txt`` when
  the pass left a fusion plan.
* ``RuleStatistics``: attempts, matches, applications, refusals and time per rule.
* ``DecisionLog(path)``: every fusion or rewrite taken or refused, with its reason, as JSON.
"""
from __future__ import annotations

import json
import os

from opfuse.passes.context import OptionError


class PassInstrument:
    def enter(self, ctx) -> None:
        pass

    def exit(self, ctx) -> None:
        pass

    def before_pass(self, ctx, pass_, graph, index: int) -> None:
        pass

    def after_pass(self, ctx, pass_, graph, index: int, modified: bool, seconds: float) -> None:
        pass

    def skipped_pass(self, ctx, pass_, index: int) -> None:
        pass

    def on_decision(self, ctx, decision) -> None:
        pass


class PassTiming(PassInstrument):
    def __init__(self):
        self.rows: list[tuple[int, str, float, bool]] = []

    def after_pass(self, ctx, pass_, graph, index, modified, seconds):
        self.rows.append((index, pass_.name, seconds, modified))

    @property
    def total(self) -> float:
        return sum(r[2] for r in self.rows)

    def report(self) -> str:
        lines = [f"{'#':>3}  {'pass':<16}{'ms':>10}  modified"]
        for index, name, seconds, modified in self.rows:
            lines.append(f"{index:>3}  {name:<16}{seconds * 1e3:>10.2f}  {'yes' if modified else 'no'}")
        lines.append(f"{'':>3}  {'total':<16}{self.total * 1e3:>10.2f}")
        return "\n".join(lines)


def format_plan(plan) -> str:
    """A fusion plan as text: one line per multi-node group (singletons counted)."""
    lines = [f"plan: {plan.num_kernels} kernels for {len(plan.graph.nodes)} nodes"]
    singles = 0
    for g in plan.groups:
        if len(g.nodes) == 1:
            singles += 1
            continue
        anchor = f" anchor={g.anchor.name}" if g.anchor is not None else ""
        lines.append(f"  group {g.name} [{g.kind}]{anchor}: " + ", ".join(n.name for n in g.nodes))
    lines.append(f"  {singles} single-op kernels")
    return "\n".join(lines)


class DumpIR(PassInstrument):
    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        self.files: list[str] = []

    def enter(self, ctx):
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise OptionError(f"cannot create IR dump directory '{self.directory}': {e.strerror}") from None

    def _write(self, filename: str, text: str) -> None:
        path = os.path.join(self.directory, filename)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as e:
            raise OptionError(f"cannot write IR dump '{path}': {e.strerror}") from None
        self.files.append(path)

    def before_pass(self, ctx, pass_, graph, index):
        self._plan_before = ctx.plan
        self._write(f"{index:02d}_{pass_.name}_before.ir", str(graph))

    def after_pass(self, ctx, pass_, graph, index, modified, seconds):
        self._write(f"{index:02d}_{pass_.name}_after.ir", str(graph))
        if ctx.plan is not None and ctx.plan is not getattr(self, "_plan_before", None):
            self._write(f"{index:02d}_{pass_.name}_plan.txt", format_plan(ctx.plan))


class RuleStatistics(PassInstrument):
    """Reads the per-rule counters the rule passes accumulate on the context."""

    def __init__(self):
        self.stats: dict = {}

    def exit(self, ctx):
        self.stats = {name: s.to_dict() for name, s in ctx.rule_stats.items()}

    def report(self) -> str:
        lines = [f"{'rule':<20}{'attempts':>9}{'matches':>9}{'applied':>9}{'refused':>9}{'ms':>9}"]
        for name in sorted(self.stats):
            s = self.stats[name]
            lines.append(f"{name:<20}{s['attempts']:>9}{s['matches']:>9}{s['applied']:>9}{s['refused']:>9}"
                         f"{s['seconds'] * 1e3:>9.2f}")
        return "\n".join(lines)


class DecisionLog(PassInstrument):
    """Collects every decision; writes them as JSON to ``path`` when the run ends (if given)."""

    def __init__(self, path: str | None = None):
        self.path = None if path is None else os.fspath(path)
        self.decisions: list = []

    def on_decision(self, ctx, decision):
        self.decisions.append(decision)

    def to_json(self, ctx=None) -> dict:
        summary: dict[str, dict[str, int]] = {}
        for d in self.decisions:
            s = summary.setdefault(d.rule, {})
            label = d.verdict if d.taken else f"refused:{d.kind}"
            s[label] = s.get(label, 0) + 1
        return {"decisions": [d.to_dict() for d in self.decisions],
                "summary": {k: dict(sorted(v.items())) for k, v in sorted(summary.items())}}

    def exit(self, ctx):
        if self.path is None:
            return
        try:
            with open(self.path, "w", encoding="utf-8") as f:
                json.dump(self.to_json(ctx), f, indent=1)
                f.write("\n")
        except OSError as e:
            raise OptionError(f"cannot write decision log '{self.path}': {e.strerror}") from None


__all__ = ["PassInstrument", "PassTiming", "DumpIR", "RuleStatistics", "DecisionLog", "format_plan"]
