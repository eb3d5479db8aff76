"""Two more gates tried against the default (benchmarks/talent_design/results.md, "Gate: two
more designs"), measured on two sets of requests that need no tool: ours (off_domain.json, 60)
and MT-Bench's first turns (data/no_tool_requests/fastchat.json, 60, other authors).

    .venv/bin/python benchmarks/talent_design/gate_probes.py [--model minilm|e5]

1. **More calibration requests**: the level and the contrast computed over the 180 shipped
   unrelated requests plus Vicuna-bench's 73 (longer, by other authors), at several levels.
2. **A tool-intent probe**: a logistic regression on the task's vector, requests that need a
   tool (the labelled tasks of the other catalogues, 200 a set) against the shipped unrelated
   requests and Vicuna-bench's; applied to English tasks on top of the default gate (to every
   task with a multilingual model), trained leaving the evaluated catalogue out.
3. **Talents near generic requests count less** (hubness, as CSLS corrects it): each talent's
   similarity minus λ x the mean of its k nearest shipped unrelated requests (leaving the
   request out when it calibrates), the level calibrated on that statistic, the contrast kept.
4. **The contrast against longer requests too**: the level from the shipped requests, the
   contrast against the shipped and Vicuna-bench's.
5. **A lexical level beside the default** (English tasks): the best BM25F over the most the
   task's words could score, at least its quantile among the shipped requests.
6. **A shared word required of English tasks too** (as of tasks in other languages), unless
   the best similarity reaches a high quantile of the shipped requests'.
7. **Scores normalised by a cohort**, as speaker verification normalises them: each talent's
   similarity as a z-score over the shipped requests' similarities with that talent (Z-norm,
   leaving the request out when it calibrates), over the task's own similarities with the
   shipped requests (T-norm), or their mean (S-norm); the level at a quantile of the shipped
   requests' best normalised score, with and without the contrast.

Per row: of each unrelated set, how many of 20 get a talent (mean / worst catalogue); real
tasks gated (mean / worst labelled set). Uses the vectors cached by talent_selection.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from datasets import all_sets, chat_requests, off_domain  # noqa: E402
from talent_selection import candidates, fused_space  # noqa: E402
from vectors import Vectors  # noqa: E402

from satchel.server.talents.domain.terms import is_english, task_terms  # noqa: E402
from satchel.server.talents.service import unrelated_tasks  # noqa: E402


class Batch(NamedTuple):
    """Requests to judge: their unit vectors, which are English, and their texts."""

    x: np.ndarray
    english: np.ndarray
    texts: list[str]


Rule = Callable[[Batch], np.ndarray]


def unit(rows: np.ndarray) -> np.ndarray:
    normed: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return normed


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 1500) -> np.ndarray:
    """Class-balanced L2 logistic regression by gradient descent: weights, bias last."""
    w, b = np.zeros(x.shape[1]), 0.0
    balance = np.where(y == 1, 0.5 / y.mean(), 0.5 / (1 - y.mean()))
    for _ in range(steps):
        g = (1 / (1 + np.exp(-(x @ w + b))) - y) * balance
        w -= 2 * x.T @ g / len(y) + l2 * w / len(y)
        b -= 2 * g.mean()
    return np.r_[w, b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=("minilm", "e5"))
    args = parser.parse_args()
    vectors = Vectors(args.model)
    chat = json.loads((HERE.parent / "data/no_tool_requests/fastchat.json").read_text("utf-8"))
    vicuna = [t["text"] for t in chat["tasks"] if t["set"] == "vicuna_bench"]
    unrelated = {
        "ours": [t.text for t in off_domain()],
        "MT-Bench": [t.text for t in chat_requests() if t.id.startswith("mt_bench")],
    }
    tests = {
        k: Batch(unit(vectors.queries(v)), np.array([is_english(t) for t in v]), v)
        for k, v in unrelated.items()
    }
    shipped = unit(vectors.queries(unrelated_tasks()))
    extra = unit(vectors.queries(vicuna))
    spaces, sets = {}, {}
    for dataset in all_sets():
        if dataset.catalogue not in spaces:
            spaces[dataset.catalogue] = fused_space(candidates(dataset), vectors)
        texts = [t.text for t in dataset.tasks if t.gold]
        english = np.array([is_english(t) for t in texts])
        real = Batch(unit(vectors.queries(texts)), english, texts)
        sets[dataset.name] = (dataset.catalogue, real)

    def default_gate(
        catalogue: str,
        calibration: np.ndarray,
        q: float,
        c: float,
        contrasted: np.ndarray | None = None,
    ) -> Rule:
        """The level at quantile `q` of the `calibration` requests' best similarities, and for
        English tasks the contrast `c` against the `contrasted` requests (by default, those)."""
        space = spaces[catalogue]
        against = calibration if contrasted is None else contrasted
        best = np.maximum(calibration @ space.short.T, calibration @ space.full.T).max(axis=1)
        level = max(float(np.quantile(best, q)), 0.15)

        def passes(batch: Batch) -> np.ndarray:
            x = batch.x
            top = np.maximum(x @ space.short.T, x @ space.full.T).max(axis=1)
            contrast = top - (x @ against.T).max(axis=1) > c
            result: np.ndarray = (top >= level) & np.where(batch.english, contrast, True)
            return result

        return passes

    def report(label: str, gate_of: Callable[[str], Rule]) -> None:
        served: dict[str, list[float]] = {k: [] for k in tests}
        gated = []
        for catalogue, real in sets.values():
            gate = gate_of(catalogue)
            for k, batch in tests.items():
                served[k].append(gate(batch).sum() * 20 / len(batch.x))
            gated.append(1 - gate(real).mean())
        cells = " | ".join(f"{np.mean(v):.1f} / {max(v):.1f}" for v in served.values())
        print(f"| {label} | {cells} | {100 * np.mean(gated):.1f} % / {100 * max(gated):.1f} % |")

    print(f"model {args.model}\n\n| gate | {' | '.join(tests)} | real gated |\n|---|---|---|---|")
    for name, calibration in (
        ("shipped", shipped),
        ("shipped + Vicuna", np.vstack([shipped, extra])),
    ):
        for q, c in ((0.75, -0.05), (0.8, -0.02), (0.85, 0.0)):
            label = f"{name}, level {q}, contrast {c}"
            report(label, lambda cat, cal=calibration, q=q, c=c: default_gate(cat, cal, q, c))

    group = {
        name: ("acebench" if cat.startswith("acebench") else cat) for name, (cat, _) in sets.items()
    }
    negatives = np.vstack([shipped, extra])
    rng = np.random.default_rng(0)
    probes = {}
    for held in set(group.values()):
        train = [n for n in sets if group[n] != held and n != "acebench_en+zh"]
        positives = np.vstack(
            [sets[n][1].x[rng.permutation(len(sets[n][1].x))[:200]] for n in train]
        )
        x = np.vstack([positives, negatives])
        probes[held] = fit(x, np.r_[np.ones(len(positives)), np.zeros(len(negatives))])
    for threshold in (0.2, 0.3, 0.5):

        def probed(catalogue: str, t: float = threshold) -> Rule:
            base = default_gate(catalogue, shipped, 0.75, -0.05)
            held = "acebench" if catalogue.startswith("acebench") else catalogue
            weights = probes[held]

            def passes(batch: Batch) -> np.ndarray:
                p = 1 / (1 + np.exp(-(batch.x @ weights[:-1] + weights[-1])))
                every = np.ones(len(batch.x), dtype=bool)
                applies = every if args.model == "e5" else batch.english
                result: np.ndarray = base(batch) & (~applies | (p >= t))
                return result

            return passes

        report(f"default + tool-intent probe ≥ {threshold}", probed)

    def hubness_gate(catalogue: str, lam: float, k: int, q: float) -> Rule:
        space = spaces[catalogue]
        near = np.maximum(shipped @ space.short.T, shipped @ space.full.T)  # (requests, talents)
        ranked = -np.sort(-near, axis=0)
        top = ranked[:k].sum(axis=0)
        hub = top / k
        inside = near >= ranked[k - 1]  # a request among a talent's k nearest: left out
        hub_without = (top - np.where(inside, near, 0) + np.where(inside, ranked[k], 0)) / k
        level = float(np.quantile((near - lam * hub_without).max(axis=1), q))

        def passes(batch: Batch) -> np.ndarray:
            x = batch.x
            sims = np.maximum(x @ space.short.T, x @ space.full.T)
            contrast = sims.max(axis=1) - (x @ shipped.T).max(axis=1) > -0.05
            result: np.ndarray = ((sims - lam * hub).max(axis=1) >= level) & np.where(
                batch.english, contrast, True
            )
            return result

        return passes

    for lam, q in ((0.5, 0.8), (0.5, 0.85), (1.0, 0.85)):
        label = f"talents' hubness, λ {lam}, k 5, level {q}, contrast -0.05"
        report(label, lambda cat, lam=lam, q=q: hubness_gate(cat, lam, 5, q))

    longer = np.vstack([shipped, extra])
    for q, c in ((0.75, -0.05), (0.8, -0.05), (0.85, -0.02)):
        label = f"contrast against shipped + Vicuna, level {q}, contrast {c}"
        report(label, lambda cat, q=q, c=c: default_gate(cat, shipped, q, c, longer))

    def word_match(catalogue: str, texts: list[str]) -> np.ndarray:
        """Each text's best BM25F over the most its words could score, on the catalogue."""
        space = spaces[catalogue]
        best = []
        for text in texts:
            terms = task_terms(text)
            scores, most = space.lexical.scores(terms), space.lexical.most(terms)
            best.append(float(scores.max()) / most if most > 0 and len(scores) else 0.0)
        return np.array(best)

    def lexical_level(catalogue: str, q: float) -> Rule:
        base = default_gate(catalogue, shipped, 0.75, -0.05)
        level = float(np.quantile(word_match(catalogue, unrelated_tasks()), q))

        def passes(batch: Batch) -> np.ndarray:
            matched = word_match(catalogue, batch.texts) >= level
            result: np.ndarray = base(batch) & np.where(batch.english, matched, True)
            return result

        return passes

    for q in (0.4, 0.5):
        label = f"default + lexical level at the shipped requests' {q}"
        report(label, lambda cat, q=q: lexical_level(cat, q))

    def shared_word(catalogue: str, rescue: float | None) -> Rule:
        """The default, and an English task must also share a word with some talent unless
        its best similarity reaches the shipped requests' `rescue` quantile."""
        base = default_gate(catalogue, shipped, 0.75, -0.05)
        space = spaces[catalogue]
        best = np.maximum(shipped @ space.short.T, shipped @ space.full.T).max(axis=1)
        high = np.inf if rescue is None else float(np.quantile(best, rescue))

        def passes(batch: Batch) -> np.ndarray:
            top = np.maximum(batch.x @ space.short.T, batch.x @ space.full.T).max(axis=1)
            worded = (word_match(catalogue, batch.texts) > 0) | (top >= high)
            result: np.ndarray = base(batch) & np.where(batch.english, worded, True)
            return result

        return passes

    for rescue in (None, 0.95, 1.0):
        label = f"default + a shared word for English tasks, unless level {rescue}"
        report(label, lambda cat, r=rescue: shared_word(cat, r))

    def normalised(catalogue: str, norm: str, q: float, contrast: float | None) -> Rule:
        """Design 7: the best cohort-normalised similarity at least its quantile `q` among the
        shipped requests'; `norm` is "z" (per talent), "t" (per task) or "s" (their mean)."""
        space = spaces[catalogue]
        near = np.maximum(shipped @ space.short.T, shipped @ space.full.T)  # (requests, talents)
        n = len(shipped)
        mean, spread = near.mean(axis=0), near.std(axis=0) + 1e-3
        mean_out = (near.sum(axis=0) - near) / (n - 1)  # each request left out of its talent's
        square_out = ((near**2).sum(axis=0) - near**2) / (n - 1)
        spread_out = np.sqrt(np.maximum(square_out - mean_out**2, 0)) + 1e-3
        cohort = shipped @ shipped.T
        np.fill_diagonal(cohort, np.nan)
        task_mean = np.nanmean(cohort, axis=1, keepdims=True)
        task_spread = np.nanstd(cohort, axis=1, keepdims=True) + 1e-3

        def statistic(sims, talent_mean, talent_spread, cohort_mean, cohort_spread):
            z = (sims - talent_mean) / talent_spread
            t = (sims - cohort_mean) / cohort_spread
            best: np.ndarray = {"z": z, "t": t, "s": (z + t) / 2}[norm].max(axis=1)
            return best

        level = float(np.quantile(statistic(near, mean_out, spread_out, task_mean, task_spread), q))

        def passes(batch: Batch) -> np.ndarray:
            x = batch.x
            sims = np.maximum(x @ space.short.T, x @ space.full.T)
            to_cohort = x @ shipped.T
            cohort_mean = to_cohort.mean(axis=1, keepdims=True)
            cohort_spread = to_cohort.std(axis=1, keepdims=True) + 1e-3
            result: np.ndarray = statistic(sims, mean, spread, cohort_mean, cohort_spread) >= level
            if contrast is not None:
                apart = sims.max(axis=1) - to_cohort.max(axis=1) > contrast
                result &= np.where(batch.english, apart, True)
            return result

        return passes

    for norm in ("z", "t", "s"):
        for contrast in (None, -0.05):
            for q in (0.75, 0.85, 0.95):
                label = f"{norm.upper()}-norm, level {q}, contrast {contrast or 'none'}"
                report(label, lambda cat, n=norm, q=q, c=contrast: normalised(cat, n, q, c))

    def both_texts(catalogue: str, q: float, c: float, same_talent: bool) -> Rule:
        """Each text's own level (quantile `q` of the shipped requests' best cosine with the
        short texts, and with the full ones), both reached: by the task's best of each
        (`same_talent` False) or by one talent's two texts; the contrast kept."""
        space = spaces[catalogue]
        level_short = max(float(np.quantile((shipped @ space.short.T).max(axis=1), q)), 0.15)
        level_full = max(float(np.quantile((shipped @ space.full.T).max(axis=1), q)), 0.15)

        def passes(batch: Batch) -> np.ndarray:
            x = batch.x
            short, full = x @ space.short.T, x @ space.full.T
            if same_talent:
                reached = (np.minimum(short - level_short, full - level_full) >= 0).any(axis=1)
            else:
                reached = (short.max(axis=1) >= level_short) & (full.max(axis=1) >= level_full)
            top = np.maximum(short, full).max(axis=1)
            contrast = top - (x @ shipped.T).max(axis=1) > c
            result: np.ndarray = reached & np.where(batch.english, contrast, True)
            return result

        return passes

    for same in (False, True):
        for q in (0.6, 0.7, 0.75):
            label = f"both texts {'of one talent' if same else 'each'}, level {q}, contrast -0.05"
            report(label, lambda cat, q=q, s=same: both_texts(cat, q, -0.05, s))


if __name__ == "__main__":
    main()
