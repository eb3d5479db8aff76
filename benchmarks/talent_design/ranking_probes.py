"""Two more rankings tried against the fused default (results.md, "Ranking: two more designs"),
recall@1/3/5/10 of the fused ranking per set, DEV and validation tasks together:

1. **Pseudo-relevance feedback**: the task's vector moved towards the mean full-text vector of
   its k best talents (Rocchio, weight b), or each talent lifted by its similarity to the k best
   (g x z of it), then fused again.
2. **A learnt query adapter**: q + qA (A a 384 x 384 matrix, zero at first), trained with a
   softmax over the catalogue's talents (temperature 0.05, L2 1e-4, 20 epochs) on the labelled
   tasks of the other catalogues and tested on the one left out (MetaTool's, Seal-Tools' and
   ACEBench's sets are left out together), also with a hinge that keeps the shipped unrelated
   requests below the real tasks' gold similarity; the gate (level 0.75, contrast -0.05) read in
   the adapted space. Trained with torch, from the peers' environment:

    .venv/bin/python benchmarks/talent_design/ranking_probes.py      # 1, and writes 2's data
    bash benchmarks/peers/setup.sh                                   # torch, for 2
    benchmarks/peers/.venv/bin/python benchmarks/talent_design/ranking_probes.py \
        --adapter "$TMPDIR/satchel-catalogues/adapter-probe.npz" [--hinge 1]

Uses the vectors cached by talent_selection.py (MiniLM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KS = (1, 3, 5, 10)
FEEDBACK = ("fused", "rocchio b0.3 k3", "rocchio b0.5 k5", "rocchio b1 k3", "lift g0.3 k3",
            "lift g0.5 k3", "lift g1 k3")  # fmt: skip


def z(rows: np.ndarray) -> np.ndarray:
    """z-scores along the last axis (a flat row: zeros), as the server's fusion."""
    spread = rows.std(axis=-1, keepdims=True)
    spread = np.where(spread < 1e-6, np.inf, spread)
    normed: np.ndarray = (rows - rows.mean(axis=-1, keepdims=True)) / spread
    return normed


def recalls(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    order = np.argsort(-scores, axis=1)
    found = [np.take_along_axis(gold, order[:, :k], 1).sum(1) / gold.sum(1) for k in KS]
    return np.array([f.mean() for f in found])


def cell(recall: np.ndarray) -> str:
    return "/".join(f"{r:.3f}" for r in recall)


def feedback(name: str, q: np.ndarray, short: np.ndarray, full: np.ndarray, lexical: np.ndarray):
    """Design 1's scores (tasks x talents)."""
    fused = z(q @ short.T) + z(q @ full.T) + lexical
    if name == "fused":
        return fused
    kind, weight, depth = name.split()
    w, k = float(weight[1:]), int(depth[1:])
    top = np.argsort(-fused, axis=1)[:, :k]
    centre = full[top].mean(axis=1)
    if kind == "rocchio":
        moved = q + w * centre
        moved /= np.linalg.norm(moved, axis=1, keepdims=True)
        return z(moved @ short.T) + z(moved @ full.T) + lexical
    return fused + w * z(centre @ full.T)


def probe_feedback(out: Path) -> None:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    from datasets import all_sets, chat_requests, off_domain
    from talent_selection import candidates, fused_space
    from vectors import Vectors

    from satchel.server.talents.domain.fusion import LEXICAL_WEIGHT
    from satchel.server.talents.domain.terms import is_english, task_terms
    from satchel.server.talents.service import unrelated_tasks

    vectors = Vectors("minilm")

    def unit(rows: np.ndarray) -> np.ndarray:
        normed: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        return normed

    arrays: dict[str, np.ndarray] = {}
    sets, spaces = [], {}
    print(f"| set | {' | '.join(FEEDBACK)} |\n|---|{'---|' * len(FEEDBACK)}")
    means = []
    for dataset in all_sets():
        if dataset.catalogue not in spaces:
            spaces[dataset.catalogue] = space = fused_space(candidates(dataset), vectors)
            arrays[f"{dataset.catalogue}/short"] = space.short
            arrays[f"{dataset.catalogue}/full"] = space.full
        space = spaces[dataset.catalogue]
        index = {talent: i for i, talent in enumerate(dataset.ids)}
        tasks = [t for t in dataset.tasks if any(g in index for g in t.gold)]
        q = unit(vectors.queries([t.text for t in tasks]))
        words = np.stack([space.lexical.scores(task_terms(t.text)) for t in tasks])
        lexical = LEXICAL_WEIGHT * z(words)
        gold = np.zeros((len(tasks), len(index)), dtype=bool)
        for row, task in enumerate(tasks):
            gold[row, [index[g] for g in task.gold if g in index]] = True
        cells = [recalls(feedback(f, q, space.short, space.full, lexical), gold) for f in FEEDBACK]
        means.append(cells)
        print(f"| {dataset.name} | {' | '.join(map(cell, cells))} |")
        arrays[f"{dataset.name}/q"], arrays[f"{dataset.name}/gold"] = q, gold
        arrays[f"{dataset.name}/lexical"] = lexical
        arrays[f"{dataset.name}/english"] = np.array([is_english(t.text) for t in tasks])
        sets.append([dataset.name, dataset.catalogue])
    mean = np.mean(means, axis=0)
    print(f"| mean | {' | '.join(map(cell, mean))} |")
    ours = [t.text for t in off_domain()]
    others = [t.text for t in chat_requests() if t.id.startswith("mt_bench")]
    for key, texts in (("ours", ours), ("MT-Bench", others), ("shipped", unrelated_tasks())):
        arrays[f"unrelated/{key}"] = unit(vectors.queries(texts))
        arrays[f"unrelated/{key}/english"] = np.array([is_english(t) for t in texts])
    arrays["sets"] = np.array(json.dumps(sets))
    np.savez(out, **arrays)
    print(f"\nthe adapter's data: {out}")


def family(name: str) -> str:
    """Sets that share a catalogue family are left out together."""
    for prefix in ("metatool", "seal_tools", "acebench", "own"):
        if name.startswith(prefix):
            return prefix
    return name


def probe_adapter(data: Path, hinge: float) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(2)
    stored = np.load(data)
    sets = json.loads(str(stored["sets"]))
    tensor = {key: torch.tensor(stored[key]) for key in stored.files if key != "sets"}
    shipped = tensor["unrelated/shipped"]

    def adapt(adapter, q):
        return torch.nn.functional.normalize(q + q @ adapter, dim=1)

    def train(left_out: str):
        adapter = torch.zeros(384, 384, requires_grad=True)
        optimiser = torch.optim.Adam([adapter], lr=1e-3)
        train_sets = [(n, c) for n, c in sets if family(n) != left_out and n != "acebench_en+zh"]
        for _ in range(20):
            for name, catalogue in train_sets:
                short, full = tensor[f"{catalogue}/short"], tensor[f"{catalogue}/full"]
                q, gold = tensor[f"{name}/q"], tensor[f"{name}/gold"]
                for batch in torch.randperm(len(q)).split(64):
                    moved = adapt(adapter, q[batch])
                    sims = torch.maximum(moved @ short.T, moved @ full.T)
                    logp = torch.log_softmax(sims / 0.05, 1)
                    loss = -torch.logsumexp(logp.masked_fill(~gold[batch], -1e9), 1).mean()
                    if hinge:
                        some = adapt(adapter, shipped[torch.randint(0, len(shipped), (32,))])
                        unrelated = torch.maximum(some @ short.T, some @ full.T).max(1).values
                        real = sims.masked_fill(~gold[batch], -1).max(1).values
                        loss = loss + hinge * torch.relu(unrelated.mean() - real.mean() + 0.1)
                    loss = loss + 1e-4 * (adapter**2).sum()
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
        return adapter.detach()

    def gate(adapter, catalogue: str, real: str) -> list[float]:
        """Unrelated per 20 (ours, MT-Bench) and real gated %, the default gate in this space."""
        short, full = tensor[f"{catalogue}/short"], tensor[f"{catalogue}/full"]

        def best(key: str):
            x = tensor[key] if adapter is None else adapt(adapter, tensor[key])
            return torch.maximum(x @ short.T, x @ full.T).max(1).values.numpy(), x

        calibration, cohort = best("unrelated/shipped")
        level = max(float(np.quantile(calibration, 0.75)), 0.15)
        cells = []
        for key in ("unrelated/ours", "unrelated/MT-Bench", f"{real}/q"):
            top, x = best(key)
            apart = top - (x @ cohort.T).max(1).values.numpy() > -0.05
            english = stored[key.replace("/q", "") + "/english"]
            passes = (top >= level) & np.where(english, apart, True)
            cells.append(100 * (1 - passes.mean()) if key.endswith("/q") else 20 * passes.mean())
        return cells

    print(f"hinge {hinge}\n\n| set | R@1/3/5/10 fused | adapted | gate fused | gate adapted |")
    print("|---|---|---|---|---|")
    rows = []
    for left_out in sorted({family(n) for n, _ in sets}):
        adapter = train(left_out)
        for name, catalogue in sets:
            if family(name) != left_out:
                continue
            cells = []
            for a in (None, adapter):
                q = tensor[f"{name}/q"] if a is None else adapt(a, tensor[f"{name}/q"])
                short, full = tensor[f"{catalogue}/short"], tensor[f"{catalogue}/full"]
                cosines = z((q @ short.T).numpy()) + z((q @ full.T).numpy())
                scores = cosines + stored[f"{name}/lexical"]
                cells.append(recalls(scores, stored[f"{name}/gold"]))
            gates = [gate(None, catalogue, name), gate(adapter, catalogue, name)]
            rows.append([*cells, *map(np.array, gates)])
            text = [cell(c) for c in cells]
            text += [f"{g[0]:.1f} / {g[1]:.1f} / {g[2]:.1f} %" for g in gates]
            print(f"| {name} | " + " | ".join(text) + " |", flush=True)
    mean = [np.mean([r[i] for r in rows], axis=0) for i in range(4)]
    text = [cell(c) for c in mean[:2]]
    text += [f"{g[0]:.1f} / {g[1]:.1f} / {g[2]:.1f} %" for g in mean[2:]]
    print("| mean | " + " | ".join(text) + " |")


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", type=Path, help="train and test the adapter on this data")
    parser.add_argument("--hinge", type=float, default=0.0)
    args = parser.parse_args()
    if args.adapter:
        probe_adapter(args.adapter, args.hinge)
    else:
        probe_feedback(Path(tempfile.gettempdir()) / "satchel-catalogues" / "adapter-probe.npz")


if __name__ == "__main__":
    main()
