"""The HTML of the keyshift page: overview, topic and run, from `keyshift.ui.store` views.

Plain HTML with one inline style sheet and inline SVG charts (`keyshift.ui.plots`): no script, no
asset fetched from anywhere. Every value is escaped. Links are relative, so the pages work under
any mount prefix and inside the Airflow UI's frame (which mirrors the frame's path in its own URL).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from keyshift.ui import data, plots
from keyshift.ui.store import Overview, RunRow, RunView, TopicView

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#1a202c;background:#fff}
h1{font-size:1.4rem;margin:0 0 4px} h2{font-size:1.1rem;margin:24px 0 8px;border-bottom:1px solid #e2e8f0;padding-bottom:4px}
table{border-collapse:collapse;font-size:.85rem;margin:4px 0 8px} th,td{border:1px solid #e2e8f0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f7fafc} td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#276749;font-weight:600} .bad{color:#c53030;font-weight:600} .muted{color:#718096}
.note{background:#fffaf0;border:1px solid #f6ad55;padding:6px 10px;margin:8px 0}
.alert{background:#fff5f5;border:1px solid #fc8181;color:#c53030;padding:6px 10px;margin:8px 0;font-weight:600}
tr.attention td{background:#fff5f5} td.mark{min-width:9em}
.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px;font-size:.9rem}
.facts dt{color:#4a5568} .facts dd{margin:0}
.plot svg{width:100%;max-width:1100px;height:auto} a{color:#2b6cb0}
"""


def esc(value: Any) -> str:
    """`value` as escaped HTML text ("–" for None)."""
    return "–" if value is None else html.escape(str(value))


def when(seconds: float | None) -> str:
    """Epoch seconds as `YYYY-MM-DD HH:MM:SSZ` (UTC), "–" for None."""
    return "–" if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def number(value: Any, digits: int = 0) -> str:
    """A number with thousands separators (`digits` decimals), "–" for None or a non-number."""
    if value is None or isinstance(value, bool):
        return esc(value)
    try:
        return f"{float(value):,.{digits}f}" if digits else f"{int(value):,}"
    except (TypeError, ValueError):
        return esc(value)


def verdict(ok: bool | None, yes: str = "passed", no: str = "failed") -> str:
    """A coloured word for a check: `yes` (green), `no` (red), or "–" when not checked."""
    if ok is None:
        return '<span class="muted">–</span>'
    return f'<span class="ok">{yes}</span>' if ok else f'<span class="bad">{no}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells are HTML already (escape them first); columns in `numeric` align right."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def facts(items: Iterable[tuple[str, str]]) -> str:
    """A definition list of (label, HTML value) pairs."""
    return '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def plot(svg: str, missing: str) -> str:
    """An inline chart, or the `missing` sentence when the chart is empty."""
    return f'<div class="plot">{svg}</div>' if svg else f'<p class="muted">{esc(missing)}</p>'


def document(title: str, body: str, notice: str = "") -> str:
    """A whole HTML page."""
    note = f'<p class="note">{esc(notice)}</p>' if notice else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body>{note}{body}</body></html>")


def link(href: str, text: str) -> str:
    """An anchor; `href` is already URL-quoted and relative."""
    return f'<a href="{html.escape(href, quote=True)}">{esc(text)}</a>'


def _assignment(meta: Any) -> str:
    if meta is None:
        return '<span class="muted">none published (a rule strategy such as hash needs none)</span>'
    return esc(f"{meta.strategy}, P = {meta.partitions}, epoch {meta.epoch}, published {when(meta.published_at)}")


def mark(attention: Sequence[str]) -> str:
    """The mark of a run that needs a look (`data.attention`): "⚠" and what, in red; "ok" (green) otherwise."""
    if not attention:
        return '<span class="ok">ok</span>'
    return f'<span class="bad" title="{esc(", ".join(attention))}">⚠ {esc("; ".join(attention))}</span>'


def dead_letters(figures: data.RunFigures) -> str:
    """Dead letters with their top reasons (`count (reason: n, ...)`)."""
    reasons = ", ".join(f"{reason}: {number(n)}" for reason, n in figures.dead_letter_reasons)
    return number(figures.dead_letters) + (f' <span class="muted">({esc(reasons)})</span>' if reasons else "")


def switches_cell(rows: Sequence[data.SwitchRow]) -> str:
    """A run's switches in a cell: how many, and the pause each achieved (seconds; `–` when not measured)."""
    if not rows:
        return "0"
    pauses = ", ".join(f"{number(r.pause_s, 2)} s" if r.pause_s is not None else f"{esc(r.state)}" for r in rows)
    return f'{len(rows)} <span class="muted">(pause {pauses})</span>'


def run_rows(rows: Sequence[RunRow], prefix: str) -> str:
    """The runs table; each run id links to `prefix + runs/<id>`; a row that needs a look is marked."""
    head = ["run", "topic", "state", "check", "strategy", "epoch", "P", "started (UTC)", "events read", "late events", "dead letters",
            "pending", "windows", "balance degree", "quality", "switches"]
    body = "".join(
        f'<tr class="{"attention" if r.attention else "fine"}">' + "".join(
            f'<td class="{"n" if i in (5, 6, 8, 9, 11, 12, 13) else "mark" if i == 3 else ""}">{cell}</td>' for i, cell in enumerate((
                link(f"{prefix}runs/{quote(r.run_id, safe='')}", r.run_id), esc(r.topic), esc(r.state), mark(r.attention), esc(r.strategy),
                esc(r.epoch), esc(r.partitions), when(r.started_at_s), number(r.figures.events_read), number(r.figures.late_events),
                dead_letters(r.figures), number(r.figures.pending), number(r.figures.windows), number(r.balance_degree, 3),
                verdict(r.quality_ok), switches_cell(r.switches))))
        + "</tr>" for r in rows)
    return f"<table><thead><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr></thead><tbody>{body}</tbody></table>"


def overview_page(overview: Overview) -> str:
    """The overview: every topic with its assignment, and the newest runs."""
    def activity(topic: str) -> tuple[str, str]:
        count, last = overview.activity.get(topic, (0, None))
        return number(count), esc(when(last))

    topics = table(["topic", "assignment in force (Redis)", "runs", "last run started (UTC)"],
                   ([link(f"./topics/{quote(t.topic, safe='')}", t.topic), _assignment(t.assignment), *activity(t.topic)]
                    for t in overview.topics), numeric=(2,))
    body = (
        "<h1>keyshift</h1><p class='muted'>Placement, balance, switches and data quality of keyshift's topics and runs, "
        "read from Redis and the run folders.</p>"
        f"<h2>Topics</h2>{topics if overview.topics else '<p class=muted>no topic recorded yet</p>'}"
        f"<h2>Recent runs</h2>{run_rows(overview.runs, './') if overview.runs else '<p class=muted>no run recorded yet</p>'}"
    )
    return document("keyshift", body, overview.redis_error)


def _decision(records: Sequence[Mapping[str, Any]]) -> str:
    if not records:
        return '<p class="muted">the balance monitor has not evaluated this topic (DAG keyshift_balance_monitor, or '\
               '<code>keyshift balance evaluate --topic TOPIC</code>)</p>'
    last = records[-1]
    decision = last.get("decision") or {}
    lag = last.get("consumer_lag") or {}
    items = [("last evaluation", esc(when(data.as_float(last.get("at_s"))))),
             ("strategy in force", esc(data.strategy_in_force(last))),
             ("decision", esc(("switch to " if decision.get("switch") else "stay with ") + str(decision.get("strategy"))) if decision else "–"),
             ("reason", esc(decision.get("reason"))), ("trigger", esc(decision.get("trigger")))]
    if isinstance(lag, Mapping) and lag.get("per_partition"):
        per = ", ".join(f"{p}: {number(n)}" for p, n in sorted(lag["per_partition"].items(), key=lambda kv: int(kv[0])))
        items.append(("consumer lag (records)", f"{number(lag.get('total'))} ({per})"))
    return facts(items)


def monitor_section(records: Sequence[Mapping[str, Any]]) -> str:
    """The balance monitor's charts (balance degree of every strategy, consumer lag) and its last decision."""
    in_force = data.strategy_in_force(records[-1]) if records else None
    balance = plots.strategy_balance_svg(data.strategy_balance_series(records), in_force, data.switch_decisions(records))
    lag = plots.lag_svg(data.lag_series(records))
    return (_decision(records) + plot(balance, "no balance evaluation recorded")
            + plot(lag, "no consumer lag recorded (the monitor measures it when it knows the job's run)"))


def topic_page(view: TopicView) -> str:
    """One topic: its assignment, the monitor's charts and decision, its runs."""
    body = (
        f"<p>{link('../', 'keyshift')} / topic</p><h1>topic {esc(view.topic)}</h1>"
        + facts([("assignment in force (Redis)", _assignment(view.assignment)),
                 ("monitor records", esc(f"{len(view.monitor)} (from {view.monitor_source or 'nowhere'})"))])
        + f"<h2>Balance monitor</h2>{monitor_section(view.monitor)}"
        + f"<h2>Runs</h2>{run_rows(view.runs, '../') if view.runs else '<p class=muted>no run of this topic recorded</p>'}"
    )
    return document(f"keyshift topic {view.topic}", body)


def _in_force(view: RunView) -> str:
    force = view.in_force
    items = [("run's placement", esc(f"{force.strategy}, P = {force.partitions}, epoch {force.epoch}, segment {force.segment}")
              + f' <span class="muted">({esc(force.source)})</span>')]
    if view.topic is not None:
        items.append(("topic's published assignment", _assignment(view.topic.assignment)))
    return facts(items)


def _figures(view: RunView) -> str:
    summary = view.summary or {}
    record = view.record
    figures = view.figures
    items = [("topic", link(f"../topics/{quote(view.topic.topic, safe='')}", view.topic.topic) if view.topic else "–"),
             ("state", esc(record.get("state") or ("finished" if summary else None))),
             ("started", esc(when(data.as_float(record.get("started_at"))))),
             ("finished", esc(when(data.as_float(record.get("finished_at"))))),
             ("events read", number(figures.events_read) + f' <span class="muted">({esc(figures.source)})</span>'),
             ("late events", number(figures.late_events)), ("dead letters", dead_letters(figures)),
             ("pending (open windows)", number(figures.pending)), ("windows", number(figures.windows)),
             ("quality", verdict(None if view.quality is None else view.quality.success)),
             ("switches", switches_cell(view.switches)), ("check", mark(view.attention))]
    if summary:
        items += [("throughput", f"{number(summary.get('events_per_second'))} events/s over {number(summary.get('wall_seconds'), 1)} s"),
                  ("balance degree (whole run)", number(summary.get("balance_degree"), 3)),
                  ("reconciled", verdict(summary.get("reconciled"), "yes", "no"))]
    elif view.batches:
        items.append(("batches so far", number(len(view.batches))))
    if record.get("error"):
        items.append(("error", f'<span class="bad">{esc(record["error"])}</span>'))
    return facts(items)


def _switch_table(rows: Sequence[data.SwitchRow]) -> str:
    if not rows:
        return '<p class="muted">no switch of this run</p>'

    def moved(row: data.SwitchRow) -> str:
        if row.keys_total is None:
            return "–"
        return (f"{number(row.keys_moved)} of {number(row.keys_total)} keys, "
                f"{number(row.state_bytes_moved)} of {number(row.state_bytes)} bytes")

    def verified(row: data.SwitchRow) -> str:
        if row.verified is None:
            return verdict(None) if not row.error else f'<span class="bad">{esc(row.error)}</span>'
        return (verdict(row.verified, "verified", "NOT verified")
                + f' <span class="muted">(placement {esc(row.placement_ok)}, conservation {esc(row.conservation_ok)})</span>')

    return table(
        ["requested (UTC)", "from → to", "epoch", "reason", "state", "pause s", "state moved", "outputs"],
        ([esc(when(r.requested_at_s)),
          esc(f"{r.strategy_from}/P={r.partitions_from} → {r.strategy_to}/P={r.partitions_to}"),
          esc(f"{r.epoch_from} → {r.epoch_to}"), esc(r.reason), esc(f"{r.state} ({r.step})"), number(r.pause_s, 2), moved(r), verified(r)]
         for r in rows),
        numeric=(5,),
    )


def _quality(view: RunView) -> str:
    quality = view.quality
    if quality is None:
        return '<p class="muted">no data-quality result for this run (<code>keyshift dq run --run RUN_ID</code>, or the pipeline\'s data_quality task)</p>'
    docs = (link(f"./{quote(view.run_id, safe='')}/{quality.data_docs}", "Data Docs") if quality.data_docs
            else '<span class="muted">no Data Docs in the run folder</span>')
    suites = table(["suite", "result", "rows", "expectations", "failed"],
                   ([esc(s.suite), verdict(s.success), number(s.rows), number(s.evaluated), number(s.failed)] for s in quality.suites),
                   numeric=(2, 3, 4))
    failures = "".join(f"<li>{esc(line)}</li>" for line in quality.failures[:20])
    return (facts([("result", verdict(quality.success)), ("Great Expectations", docs), ("from", esc(quality.source))])
            + suites + (f"<ul>{failures}</ul>" if failures else ""))


def run_page(view: RunView) -> str:
    """One run: placement in force, per-slot load and task seconds over time, the monitor, switches, quality."""
    alert = f'<p class="alert">⚠ {esc("; ".join(view.attention))}</p>' if view.attention else ""
    body = (
        f"<p>{link('../', 'keyshift')} / run</p><h1>run {esc(view.run_id)}</h1>{alert}{_figures(view)}"
        f"<h2>Placement in force</h2>{_in_force(view)}"
        f"<h2>Per-slot load over time</h2>{plot(plots.slot_load_svg(view.batches), 'no micro-batch recorded yet')}"
        f"{plot(plots.task_seconds_svg(view.task_seconds), 'no task seconds measured for this run')}"
        f"<h2>Balance monitor</h2>{monitor_section(view.monitor)}"
        f"<h2>Switches</h2>{_switch_table(view.switches)}"
        f"<h2>Data quality</h2>{_quality(view)}"
    )
    return document(f"keyshift run {view.run_id}", body, view.redis_error)
