"""``report.html``: one self-contained file (inline CSS and SVG, nothing fetched) with the results
table, a success-rate plot per env (bars with 95% interval whiskers), a mean-return plot, and the
paired comparisons."""

from __future__ import annotations

from html import escape
from typing import Any

from agentgym.eval.report import plays_text, results_table

_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; \
padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, td:nth-child(2) { text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 1.5em; }
.plot h3 { margin: 0.2em 0; font-size: 14px; }
.verdict.sig { color: #1a7f37; } .verdict.ns { color: #666; }
code { background: #f3f3f3; padding: 0 3px; }
"""


def _bar_plot(title: str, rows: list[dict[str, Any]], value: str, colors: dict[str, str], *,
              ci: bool, unit_max: float | None) -> str:
    """A horizontal bar chart (one bar per policy) as inline SVG."""
    width, bar, gap, left = 420, 18, 8, 130
    height = 30 + len(rows) * (bar + gap)
    values = [float(r[value]) for r in rows]
    top = unit_max if unit_max is not None else max([abs(v) for v in values] + [1e-9])
    low_end = 0.0 if unit_max is not None or min(values) >= 0 else -top
    span = (top - low_end) or 1.0

    def scale(v: float) -> float:  # the right 50 px stay free for the value label
        return left + (v - low_end) / span * (width - left - 50)

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}">')]
    zero = scale(0.0)
    parts.append(f'<line x1="{zero:.1f}" y1="4" x2="{zero:.1f}" y2="{height - 20}" stroke="#999"/>')
    for i, (row, v) in enumerate(zip(rows, values, strict=True)):
        y = 6 + i * (bar + gap)
        x0, x1 = sorted((scale(0.0), scale(v)))
        label_x = x1 + 4
        color = colors[row["policy"]]
        parts.append(f'<text x="{left - 6}" y="{y + bar - 5}" text-anchor="end" font-size="12">'
                     f'{escape(row["policy"])}</text>')
        parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{bar}" '
                     f'fill="{color}"><title>{escape(row["policy"])}: {v:.3g}</title></rect>')
        if ci:
            lo, hi = (scale(float(c)) for c in row["success_ci95"])
            label_x = max(label_x, hi + 4)
            mid = y + bar / 2
            parts.append(f'<path d="M{lo:.1f},{mid} H{hi:.1f} M{lo:.1f},{mid - 5} V{mid + 5} '
                         f'M{hi:.1f},{mid - 5} V{mid + 5}" stroke="#222" fill="none"/>')
        label = f"{100 * v:.0f}%" if unit_max == 1.0 else f"{v:.2f}"
        parts.append(f'<text x="{label_x:.1f}" y="{y + bar - 5}" font-size="11">{label}</text>')
    for tick in (low_end, (low_end + top) / 2, top):
        text = f"{100 * tick:.0f}%" if unit_max == 1.0 else f"{tick:.2g}"
        parts.append(f'<text x="{scale(tick):.1f}" y="{height - 5}" text-anchor="middle" font-size="10" '
                     f'fill="#666">{text}</text>')
    parts.append("</svg>")
    return "".join(parts)


def html_report(results: dict[str, Any]) -> str:
    """The whole report as one HTML document.

    Example:
        >>> results = {"agentgym_version": "0", "created": "now", "command": None, "seeds": [0],
        ...     "config": {"samples": 1, "temperature": 0.0, "policies": [{"name": "a", "text": "random"}],
        ...                "envs": [{"id": "maze-v0"}]},
        ...     "results": [{"env": "maze-v0", "policy": "a", "tasks": 1, "episodes": 1, "complete": True,
        ...                  "episodes_per_task": [1, 1], "success_rate": 1.0, "success_ci95": [0.0, 1.0],
        ...                  "success_ci95_method": "one-task", "mean_return": 1.0,
        ...                  "mean_turns": 2.0, "tokens_generated": 0, "invalid_rate": 0.0, "wall_s": 0.1}],
        ...     "comparisons": []}
        >>> page = html_report(results)
        >>> page.startswith("<!doctype html>") and "<svg" in page and "http" not in page.split("<svg")[0]
        True
        >>> "<td>1 × 1</td>" in page and "<td>0%–100% (one task)</td>" in page
        True
    """
    rows = results["results"]
    names = [p["name"] for p in results["config"]["policies"]]
    colors = {name: _COLORS[i % len(_COLORS)] for i, name in enumerate(names)}
    table = results_table(results)
    head = "".join(f"<th>{escape(c)}</th>" for c in table[0])
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in table[1:])
    envs = list(dict.fromkeys(r["env"] for r in rows))
    plots = []
    for env in envs:
        mine = [r for r in rows if r["env"] == env]
        plots.append(f'<div class="plot"><h3>{escape(env)}: success (95% CI)</h3>'
                     f'{_bar_plot(env + " success", mine, "success_rate", colors, ci=True, unit_max=1.0)}'
                     f'<h3>{escape(env)}: mean return</h3>'
                     f'{_bar_plot(env + " return", mine, "mean_return", colors, ci=False, unit_max=None)}'
                     '</div>')
    verdicts = "".join(f'<li class="verdict {"sig" if c["significant"] else "ns"}">'
                       f'{escape(c["verdict"])}</li>'
                       for c in results["comparisons"])
    config = results["config"]
    policies = "; ".join(f"<code>{escape(p['name'])}</code> = <code>{escape(p['text'])}</code>"
                         for p in config["policies"])
    command = f"<p>Command: <code>{escape(results['command'])}</code></p>" if results.get("command") else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>agentgym evaluation</title>"
        f"<style>{_STYLE}</style></head><body><h1>Evaluation report</h1>"
        f"<p>agentgym {escape(results['agentgym_version'])}, {escape(results['created'])}. "
        f"Per env, every policy plays the same {escape(plays_text(results))}, temperature "
        f"{config['temperature']:g}; the table counts distinct tasks.</p>{command}"
        f"<p>Policies: {policies}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f"<h2>Plots</h2><div class=\"plots\">{''.join(plots)}</div>"
        + (f"<h2>Paired comparisons</h2><p>Per-task difference in success (points) or mean return, second "
           f"policy minus first; 95% paired bootstrap interval; exact paired test (McNemar, or sign-flip "
           f"permutation). Significant: the interval excludes 0 and p &lt; 0.05.</p><ul>{verdicts}</ul>"
           if verdicts else "")
        + "</body></html>\n"
    )
