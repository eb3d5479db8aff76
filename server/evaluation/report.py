"""Plain-text rendering of a LoCoMo harness report (the JSON of `harness.build_report`)."""

from __future__ import annotations

from typing import Any

from satchel.server.evaluation.locomo import CATEGORIES

_COLUMNS = ("overall", "overall_without_adversarial", *CATEGORIES.values())
_HEADERS = ("overall", "w/o adv.", *CATEGORIES.values())


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:.0f}{unit}"


def _table(title: str, report: dict[str, Any], view: str, metric: str) -> list[str]:
    label_width = max(len(label) for label in report["systems"].values())
    widths = [max(9, len(h)) for h in _HEADERS]
    lines = [title]
    lines.append(
        " " * label_width
        + "  "
        + "  ".join(h.rjust(w) for h, w in zip(_HEADERS, widths, strict=True))
    )
    for system, label in report["systems"].items():
        summaries = report["evidence"][view][system]
        cells = [_pct(summaries[c][metric]) for c in _COLUMNS]
        lines.append(
            label.ljust(label_width)
            + "  "
            + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
        )
    return lines


def render_text(report: dict[str, Any]) -> str:
    """The report as the tables a person reads."""
    run = report["run"]
    original = report["evidence"]["original"]
    first = next(iter(original.values()))["overall"]
    lines = [
        f"{run.get('dataset', 'LoCoMo')}: {len(run['conversations'])} conversation(s)"
        f" ({', '.join(run['conversations'])}),"
        f" {run['questions']} questions, {first['evidence_turns']} gold evidence turns"
        f" ({first['questions_without_evidence']} question(s) without evidence),"
        f" budget {run['budget_tokens']} tokens, clock {run['clock']}",
    ]
    for view in report["evidence"]:
        note = (
            f"errata: {run['errata_corrected_questions']} question(s) with corrected evidence"
            if view == "errata"
            else "evidence as published"
        )
        lines.append("")
        lines += _table(f"Evidence recall ({note})", report, view, "evidence_recall")
        lines.append("")
        lines += _table(
            f"Questions with all evidence covered ({note})", report, view, "all_evidence_covered"
        )
    lines.append("")
    lines.append("Tokens and latency (all questions)")
    for system, label in report["systems"].items():
        overall = original[system]["overall"]
        latency = ""
        if overall["latency_p50_ms"] is not None:
            latency = (
                f", latency p50 {_num(overall['latency_p50_ms'], ' ms')}"
                f" p95 {_num(overall['latency_p95_ms'], ' ms')}"
            )
        lines.append(f"  {label}: mean {_num(overall['mean_tokens'])} tokens{latency}")
    if report["recall_at_k"].get("original"):
        lines.append("")
        lines.append("Baselines, recall@k over ranked turns (evidence as published)")
        for system, values in report["recall_at_k"]["original"].items():
            cells = "  ".join(f"@{k} {_pct(v)}" for k, v in values.items())
            lines.append(f"  {report['systems'][system]}: {cells}")
    if published := report.get("published"):
        dragon = published["dragon_recall_at_k"]
        lines += [
            "",
            f"Published ({published['source']}):",
            "  DRAGON over turns, recall@k: "
            + "  ".join(f"@{k} {_pct(v)}" for k, v in dragon.items()),
            f"  BM25 over turns: recall@5 {_pct(published['bm25_recall_at_5'])}; packed into 900"
            f" tokens {_pct(published['bm25_packed_900_tokens'])}"
            f" ({_pct(published['bm25_packed_900_tokens_without_adversarial'])} without"
            " adversarial)",
        ]
    timings = run["timings_s"]
    lines.append("")
    lines.append(
        "Run: "
        + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items())
        + f"; project {run['project_id']}"
        + (f" ({fate})" if (fate := report.get("settings", {}).get("project")) else "")
    )
    return "\n".join(lines)
