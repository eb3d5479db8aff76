"""Measure designs for talent selection: ranking, out-of-domain gate, how many to serve.

    .venv/bin/python benchmarks/talent_design/probe.py [--model minilm|e5]

Prints markdown tables (results.md keeps them, with the conclusions):

1. Ranking: recall@1/3/5/10 of the baseline BM25, cos_full, cos_short, the z-scored fusion
   `z(cos_short) + z(cos_full) + w z(bm25f)` and the fixed-scale fusion
   `cos_short + cos_full + w bm25f_norm` (bm25f divided by the summed IDF of the task's terms
   present in the catalogue); on the multi-tool sets, sub-intent splitting merged by
   round-robin.
2. Gate: each task's best statistic against a threshold calibrated per catalogue on the 180
   shipped calibration tasks (quantile q + delta): off-domain tasks served, real tasks gated.
3. Count: keep the candidates within Δ of the top (capped), or cut at the largest gap;
   served mean and recall among served against BM25 at the same per-task count.

Recall@k = mean over tasks of |gold ∩ top k| / |gold|. Every set is split DEV / validation
(datasets.is_dev); constants are chosen on DEV, validation is reported beside it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from datasets import Dataset, all_sets, calibration, off_domain
from features import Catalogue, Signals, baseline_bm25, signals
from vectors import Vectors

KS = (1, 3, 5, 10)
WEIGHTS = (0.5, 1.0, 1.5)
MULTI_SETS = ("metatool_multi", "seal_tools_multi")
STD_FLOOR = 1e-6

# --- scores --------------------------------------------------------------------------------


def zscore(m: np.ndarray) -> np.ndarray:
    """Per row (task): (x - mean) / std over the catalogue's talents."""
    std = np.maximum(m.std(axis=1, keepdims=True), STD_FLOOR)
    return (m - m.mean(axis=1, keepdims=True)) / std


def lex_norm(cat: Catalogue, sig: Signals) -> np.ndarray:
    """BM25F divided by the summed IDF of the task's terms that occur in the catalogue."""
    idf = cat.lexical.idf
    scale = np.array([sum(idf[t] for t in terms if t in idf) for terms in sig.terms])
    return sig.lex / np.maximum(scale, STD_FLOOR)[:, None]


def fused_z(sig: Signals, w: float) -> np.ndarray:
    return zscore(sig.cs) + zscore(sig.cf) + w * zscore(sig.lex)


def fused_fixed(sig: Signals, lexn: np.ndarray, w: float) -> np.ndarray:
    return sig.cs + sig.cf + w * lexn


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k best scores, best first (ties by catalogue order)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall(ranked: list[list[int]] | np.ndarray, gold: list[set[int]]) -> np.ndarray:
    """Per task: |gold ∩ ranked| / |gold| (ranked = the served or top-k talents)."""
    return np.array([len(g.intersection(r)) / len(g) for r, g in zip(ranked, gold, strict=True)])


# --- one data set, evaluated -----------------------------------------------------------------


@dataclass(eq=False)
class Evaluated:
    """A data set's tasks with every signal over its catalogue."""

    ds: Dataset
    cat: Catalogue
    sig: Signals
    lexn: np.ndarray
    bm25: np.ndarray
    gold: list[set[int]]
    dev: np.ndarray  # bool per task

    @property
    def splits(self) -> list[tuple[str, np.ndarray]]:
        """(label, task mask) for DEV (if any) and validation (if any)."""
        parts = [("dev", self.dev), ("val", ~self.dev)]
        return [(label, mask) for label, mask in parts if mask.any()]


def evaluate(ds: Dataset, cat: Catalogue) -> Evaluated:
    texts = [t.text for t in ds.tasks]
    sig = signals(cat, texts)
    gold = [{cat.index_of[g] for g in t.gold} for t in ds.tasks]
    dev = np.array([t.dev for t in ds.tasks])
    return Evaluated(ds, cat, sig, lex_norm(cat, sig), baseline_bm25(cat, texts), gold, dev)


# --- printing ------------------------------------------------------------------------------


def table(head: list[str], rows: list[list[object]]) -> None:
    def cell(x: object) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    print("| " + " | ".join(head) + " |")
    print("|---" + "|---:" * (len(head) - 1) + "|")
    for row in rows:
        print("| " + " | ".join(cell(x) for x in row) + " |")
    print()


def split_rows(
    evals: list[Evaluated], values: Callable[[Evaluated, np.ndarray], list[float]]
) -> list[list[object]]:
    """One row per set and split, then the mean over the validation rows."""
    rows: list[list[object]] = []
    val: list[list[float]] = []
    for ev in evals:
        for label, mask in ev.splits:
            v = values(ev, mask)
            rows.append([f"{ev.ds.name} ({label}, {int(mask.sum())})", *v])
            if label == "val":
                val.append(v)
    rows.append(["**mean of val rows**", *np.mean(val, axis=0).tolist()])
    return rows


# --- 1. ranking ----------------------------------------------------------------------------


def methods(w_best: float | None = None) -> dict[str, Callable[[Evaluated], np.ndarray]]:
    result: dict[str, Callable[[Evaluated], np.ndarray]] = {
        "bm25": lambda ev: ev.bm25,
        "cos_full": lambda ev: ev.sig.cf,
        "cos_short": lambda ev: ev.sig.cs,
    }
    for w in WEIGHTS:
        result[f"z w={w}"] = lambda ev, w=w: fused_z(ev.sig, w)
    for w in WEIGHTS:
        result[f"fixed w={w}"] = lambda ev, w=w: fused_fixed(ev.sig, ev.lexn, w)
    return result


def ranking(evals: list[Evaluated]) -> dict[str, float]:
    """Recall tables; returns each method's DEV mean of R@1..R@10 (to choose w)."""
    ms = methods()
    # per set, per method: per-task recall at each k
    per: dict[tuple[str, str], np.ndarray] = {}
    for ev in evals:
        for name, fn in ms.items():
            ranked = top(fn(ev), max(KS))
            per[ev.ds.name, name] = np.stack([recall(ranked[:, :k], ev.gold) for k in KS])
    for ki, k in enumerate(KS):
        print(f"### Recall@{k}\n")
        rows = split_rows(
            evals, lambda ev, mask, ki=ki: [float(per[ev.ds.name, m][ki][mask].mean()) for m in ms]
        )
        table(["set (split, tasks)", *ms], rows)
    dev_mean = {}
    for m in ms:
        dev_mean[m] = float(
            np.mean([per[ev.ds.name, m][:, ev.dev].mean() for ev in evals if ev.dev.any()])
        )
    print(
        "DEV mean of R@1/3/5/10 (all four k): "
        + ", ".join(f"{m} {v:.3f}" for m, v in dev_mean.items())
        + "\n"
    )
    return dev_mean


_SENTENCE = re.compile(
    r"[.!?;]+(?=\s|$)|[\u3002\uff01\uff1f\uff1b]+|\s+(?:and then|and|then)\s+", re.IGNORECASE
)


def sub_intents(task: str) -> list[str]:
    """The task's parts (split on sentence punctuation, ' and ', ' then') of >= 3 words."""
    parts = [p.strip(" ,") for p in _SENTENCE.split(task)]
    return [p for p in parts if len(p.split()) >= 3]


def round_robin(lists: list[np.ndarray], k: int) -> list[int]:
    """Take each list's first, then each list's second... skipping repeats, until k."""
    merged: list[int] = []
    for rank in range(max(len(x) for x in lists)):
        for ranked in lists:
            if rank < len(ranked) and ranked[rank] not in merged:
                merged.append(int(ranked[rank]))
                if len(merged) == k:
                    return merged
    return merged


def splitting(evals: list[Evaluated], w: float) -> None:
    print(f"### Sub-intent splitting (z fusion, w={w}), multi-tool sets\n")
    rows = []
    for ev in evals:
        if ev.ds.name not in MULTI_SETS:
            continue
        whole = top(fused_z(ev.sig, w), 10)
        parts = [sub_intents(t.text) for t in ev.ds.tasks]
        flat = [p for ps in parts for p in ps]
        part_top = top(fused_z(signals(ev.cat, flat), w), 10) if flat else np.zeros((0, 10), int)
        merged, start = [], 0
        for i, ps in enumerate(parts):
            lists = [whole[i], *part_top[start : start + len(ps)]] if len(ps) > 1 else [whole[i]]
            start += len(ps)
            merged.append(round_robin(lists, 10))
        n_split = sum(len(ps) > 1 for ps in parts)
        for label, mask in ev.splits:
            gold = [g for g, m in zip(ev.gold, mask, strict=True) if m]
            row: list[object] = [f"{ev.ds.name} ({label}, {int(mask.sum())})"]
            for k in (5, 10):
                row.append(float(recall(whole[mask, :k], gold).mean()))
                row.append(
                    float(
                        recall([m[:k] for m, s in zip(merged, mask, strict=True) if s], gold).mean()
                    )
                )
            row.append(f"{n_split}/{len(parts)}")
            rows.append(row)
    table(["set", "z R@5", "split R@5", "z R@10", "split R@10", "tasks split (whole set)"], rows)


# --- 2. gate -------------------------------------------------------------------------------

QUANTILES = (0.9, 0.95, 1.0)
DELTAS = (0.0, 0.02, 0.04)


@dataclass(eq=False)
class GateData:
    """Per catalogue: each statistic's value for its real, off-domain and calibration tasks."""

    name: str
    real: dict[str, np.ndarray]
    off: dict[str, np.ndarray]
    cal: dict[str, np.ndarray]


def statistics(cat: Catalogue, sig: Signals, w: float, w_z: float) -> dict[str, np.ndarray]:
    lexn = lex_norm(cat, sig)
    return {
        "cos_full": sig.cf.max(axis=1),
        "cos_short": sig.cs.max(axis=1),
        f"fixed w={w}": fused_fixed(sig, lexn, w).max(axis=1),
        "bm25f_norm": lexn.max(axis=1),
        # extra: how far the best talent stands out of this catalogue (flat = off-domain)
        "max z(cos_full)": zscore(sig.cf).max(axis=1),
        f"max z fused w={w_z}": fused_z(sig, w_z).max(axis=1),
    }


def gate_data(evals: list[Evaluated], w: float, w_z: float) -> list[GateData]:
    off_texts = [t.text for t in off_domain()]
    cal_texts = [t.text for t in calibration()]
    result = []
    for key in dict.fromkeys(ev.ds.catalogue for ev in evals):
        group = [ev for ev in evals if ev.ds.catalogue == key]
        cat = group[0].cat
        real = [statistics(cat, ev.sig, w, w_z) for ev in group]
        result.append(
            GateData(
                key,
                {s: np.concatenate([r[s] for r in real]) for s in real[0]},
                statistics(cat, signals(cat, off_texts), w, w_z),
                statistics(cat, signals(cat, cal_texts), w, w_z),
            )
        )
    return result


def admits(g: GateData, rule: tuple[str, ...], q: float, delta: float, tasks: str) -> np.ndarray:
    """Which tasks ('real' or 'off') pass: any statistic of `rule` at or above its threshold
    (quantile q of the calibration tasks' values, plus delta)."""
    values = g.real if tasks == "real" else g.off
    passed = np.zeros(len(next(iter(values.values()))), dtype=bool)
    for stat in rule:
        passed |= values[stat] >= np.quantile(g.cal[stat], q) + delta
    return passed


def gate(gates: list[GateData], w: float, w_z: float) -> None:
    n_off = len(next(iter(gates[0].off.values())))
    single = [
        "cos_full",
        "cos_short",
        f"fixed w={w}",
        "bm25f_norm",
        "max z(cos_full)",
        f"max z fused w={w_z}",
    ]
    rules = [(x,) for x in single] + [("cos_full", "bm25f_norm"), ("cos_short", "bm25f_norm")]
    print(
        f"### Gate rules (all catalogues; off-domain served of {n_off}, target <= "
        f"{n_off // 10}, i.e. <= 2 of 20; real tasks gated, target <= 3 %)\n"
    )
    rows = []
    summary = []
    for rule in rules:
        for q in QUANTILES:
            for delta in DELTAS:
                off = [int(admits(g, rule, q, delta, "off").sum()) for g in gates]
                gated = [100 * float((~admits(g, rule, q, delta, "real")).mean()) for g in gates]
                ok = sum(o <= n_off // 10 and x <= 3 for o, x in zip(off, gated, strict=True))
                summary.append((ok, -max(gated), rule, q, delta, off, gated))
                rows.append(
                    [
                        " OR ".join(rule),
                        q,
                        delta,
                        f"{ok}/{len(gates)}",
                        f"{np.mean(off):.1f}",
                        max(off),
                        f"{np.mean(gated):.1f}",
                        f"{max(gated):.1f}",
                    ]
                )
    table(
        [
            "statistic",
            "q",
            "delta",
            "catalogues on target",
            "off served mean",
            "max",
            "real gated % mean",
            "max",
        ],
        rows,
    )

    print("### Gate per catalogue, best rules (off-domain served of 60 / real gated %)\n")
    best = sorted(summary, key=lambda s: (s[0], s[1]), reverse=True)[:4]
    head = ["catalogue"] + [f"{' OR '.join(r)} q={q} +{d}" for _, _, r, q, d, _, _ in best]
    rows = []
    for i, g in enumerate(gates):
        rows.append([g.name] + [f"{s[5][i]} / {s[6][i]:.1f}" for s in best])
    table(head, rows)

    for stat_rule in (best[0][2],):
        print(f"### Trade-off, {' OR '.join(stat_rule)}: threshold = quantile q + delta\n")
        rows = []
        for q in (0.8, 0.9, 0.95, 0.98, 1.0):
            for delta in (-0.04, -0.02, 0.0, 0.02, 0.04, 0.06, 0.08):
                off = [int(admits(g, stat_rule, q, delta, "off").sum()) for g in gates]
                gated = [
                    100 * float((~admits(g, stat_rule, q, delta, "real")).mean()) for g in gates
                ]
                rows.append(
                    [
                        q,
                        delta,
                        f"{np.mean(off) / 3:.2f}",
                        f"{max(off) / 3:.2f}",
                        f"{np.mean(gated):.1f}",
                        f"{max(gated):.1f}",
                    ]
                )
        table(["q", "delta", "off served per 20 (mean)", "max", "real gated % (mean)", "max"], rows)


# --- 3. count ------------------------------------------------------------------------------


def within(scores: np.ndarray, delta: float, cap: int) -> list[np.ndarray]:
    """Per task: the talents scoring at least top - delta, best first, at most cap."""
    ranked = top(scores, cap)
    best = np.take_along_axis(scores, ranked, axis=1)
    return [r[b >= b[0] - delta] for r, b in zip(ranked, best, strict=True)]


def largest_gap(scores: np.ndarray, n: int = 10) -> list[np.ndarray]:
    """Per task: the top talents before the biggest drop among the top n scores."""
    ranked = top(scores, n)
    best = np.take_along_axis(scores, ranked, axis=1)
    cut = np.argmax(best[:, :-1] - best[:, 1:], axis=1) + 1
    return [r[:c] for r, c in zip(ranked, cut, strict=True)]


def count(evals: list[Evaluated], w_z: float, w_fixed: float) -> None:
    cuts: dict[str, Callable[[Evaluated], list[np.ndarray]]] = {}
    for d in (1.0, 2.0, 4.0, 6.0, 8.0):
        for cap in (8, 10):
            cuts[f"z w={w_z} Δ={d} cap {cap}"] = lambda ev, d=d, cap=cap: within(
                fused_z(ev.sig, w_z), d, cap
            )
    cuts[f"z w={w_z} largest gap"] = lambda ev: largest_gap(fused_z(ev.sig, w_z))
    for d in (0.1, 0.2, 0.3, 0.4):
        for cap in (8, 10):
            cuts[f"fixed w={w_fixed} Δ={d} cap {cap}"] = lambda ev, d=d, cap=cap: within(
                fused_fixed(ev.sig, ev.lexn, w_fixed), d, cap
            )
    cuts[f"fixed w={w_fixed} largest gap"] = lambda ev: largest_gap(
        fused_fixed(ev.sig, ev.lexn, w_fixed)
    )

    # per cut, per set: (served count, recall among served, BM25 recall at the same count)
    results: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for ev in evals:
        bm25_ranked = top(ev.bm25, 10)
        for name, fn in cuts.items():
            served = fn(ev)
            n = np.array([len(s) for s in served])
            ours = recall(served, ev.gold)
            theirs = recall([b[:k] for b, k in zip(bm25_ranked, n, strict=True)], ev.gold)
            results[name, ev.ds.name] = (n, ours, theirs)

    print(
        "### Count rules: sets (split rows) meeting served mean <= 8 and recall >= BM25 "
        "same count + 0.10\n"
    )
    rows = []
    for name in cuts:
        ok = total = 0
        gains, means = [], []
        for ev in evals:
            n, ours, theirs = results[name, ev.ds.name]
            for _, mask in ev.splits:
                gain = ours[mask].mean() - theirs[mask].mean()
                ok += n[mask].mean() <= 8 and gain >= 0.10
                total += 1
                gains.append(gain)
                means.append(n[mask].mean())
        rows.append(
            [
                name,
                f"{ok}/{total}",
                float(np.mean(means)),
                float(np.mean(gains)),
                float(np.min(gains)),
            ]
        )
    table(["cut", "rows on target", "served mean", "gain mean", "gain min"], rows)

    for name in (f"z w={w_z} Δ=4.0 cap 8", f"fixed w={w_fixed} Δ=0.2 cap 8"):
        print(f"### Count per set: {name}\n")

        def values(ev: Evaluated, mask: np.ndarray, name: str = name) -> list[float]:
            n, ours, theirs = results[name, ev.ds.name]
            return [
                float(n[mask].mean()),
                float(ours[mask].mean()),
                float(theirs[mask].mean()),
                float(ours[mask].mean() - theirs[mask].mean()),
            ]

        table(
            ["set", "served mean", "recall served", "BM25 same count", "gain"],
            split_rows(evals, values),
        )


# --- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("minilm", "e5"), default="minilm")
    args = parser.parse_args()
    vectors = Vectors(args.model)
    sets = all_sets()
    catalogues = {s.catalogue: Catalogue(s.catalogue, s.talents, vectors) for s in sets}
    evals = [evaluate(s, catalogues[s.catalogue]) for s in sets]

    print(f"# Talent design probe, model {args.model}\n")
    print("## 1. Ranking\n")
    dev = ranking(evals)
    w_z = max(WEIGHTS, key=lambda w: dev[f"z w={w}"])
    w_fixed = max(WEIGHTS, key=lambda w: dev[f"fixed w={w}"])
    print(f"Best on DEV: z fusion w={w_z}, fixed-scale fusion w={w_fixed}\n")
    splitting(evals, w_z)
    print("## 2. Gate\n")
    gate(gate_data(evals, w_fixed, w_z), w_fixed, w_z)
    print("## 3. Count\n")
    count(evals, w_z, w_fixed)


if __name__ == "__main__":
    main()
