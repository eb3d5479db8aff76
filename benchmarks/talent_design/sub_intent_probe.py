"""How a task's sub-intents are scored: by their words (the server's default), embedded one by
one, or pooled from the task's own token vectors (one model run).

MiniLM's sentence vector is the mean of its token vectors: the mean over the tokens of one part
of the task (their character offsets inside the part) is a vector of that part, read in the
context of the whole task, at no extra model run. Each way scores every part like the whole task
(`Evidence.fused`, or z(BM25F) for words) and lifts each part's best into the cut
(`merged_scores`); recall among the first n (n: what the default selection serves) and R@5.

    .venv/bin/python benchmarks/talent_design/sub_intent_probe.py [SET …]

Runs the derived int8 MiniLM graph with onnxruntime directly (the file the server derives, under
$TMPDIR/satchel-catalogues/cache/models once talent_selection.py has run). Results:
talent_design/results.md, "Sub-intents pooled from the task's tokens".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import onnxruntime  # noqa: E402
from datasets import all_sets  # noqa: E402
from talent_selection import candidates, fused_space  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from vectors import CACHE_DIR, Vectors  # noqa: E402

from satchel.server.embedding.spans import part_spans  # noqa: E402
from satchel.server.platform.config import TalentSettings  # noqa: E402
from satchel.server.talents.domain.fusion import merged_scores, sub_intents  # noqa: E402
from satchel.server.talents.domain.selection import select, stems  # noqa: E402
from satchel.server.talents.domain.terms import task_terms  # noqa: E402
from satchel.server.talents.service import default_params  # noqa: E402

MODEL_DIR = CACHE_DIR / "cache" / "models" / "all-MiniLM-L6-v2-onnx-qint8"
DEFAULT_SETS = ("metatool_multi", "seal_tools_multi", "toolbench")


class TokenPooler:
    """The task's token vectors from one run of the graph, pooled over character spans."""

    def __init__(self, model_dir: Path) -> None:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=256)
        self.tokenizer.no_padding()
        self.inputs = {i.name for i in self.session.get_inputs()}

    def pool(self, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The text's unit vector and one per span (the whole text's when no token falls in)."""
        encoding = self.tokenizer.encode(text)
        ids = np.array([encoding.ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        tokens = self.session.run(None, feeds)[0][0]
        whole = tokens.mean(axis=0)
        parts = []
        for start, end in spans:
            inside = [
                i for i, (a, b) in enumerate(encoding.offsets) if b > a and a >= start and b <= end
            ]
            vector = tokens[inside].mean(axis=0) if inside else whole
            parts.append(vector / np.linalg.norm(vector))
        return whole / np.linalg.norm(whole), parts


def main() -> None:
    wanted = set(sys.argv[1:]) or set(DEFAULT_SETS)
    vectors = Vectors("minilm")
    pooler = TokenPooler(MODEL_DIR)
    params = default_params(TalentSettings(), vectors.embedder.model_id)
    print("| set | tasks split | served | words @n / R@5 | embedded @n / R@5 | pooled @n / R@5 |")
    print("|---|---|---|---|---|---|")
    for dataset in all_sets():
        if dataset.name not in wanted:
            continue
        talents = candidates(dataset)
        space = fused_space(talents, vectors)
        ids = [t.id for t in talents]
        tasks = [t for t in dataset.tasks if t.gold]
        figures: dict[str, list[tuple[float, float]]] = {"words": [], "embedded": [], "pooled": []}
        served, split = [], 0
        for task, query in zip(tasks, vectors.queries([t.text for t in tasks]), strict=True):
            evidence = space.evidence(query, task_terms(task.text))
            parts = sub_intents(task.text)
            split += bool(parts)
            whole, pooled = pooler.pool(task.text, part_spans(task.text, parts) or [])
            assert float(whole @ (query / np.linalg.norm(query))) > 0.999, "same vector"
            scored = {
                "words": [space.word_scores(task_terms(p)) for p in parts],
                "embedded": [
                    space.evidence(v, task_terms(p)).fused
                    for p, v in zip(parts, vectors.queries(parts) if parts else [], strict=True)
                ],
                "pooled": [
                    space.evidence(v, task_terms(p)).fused
                    for p, v in zip(parts, pooled, strict=True)
                ],
            }
            result = select(talents, space, query, stems(task.text), params, task=task.text)
            n = len(result.kept_ids)
            served.append(n)
            for way, part_scores in scored.items():
                fused = merged_scores(evidence.fused, part_scores, params.margin)
                order = [ids[i] for i in np.argsort(-fused, kind="stable")]
                figures[way].append(
                    (
                        len(task.gold & set(order[:n])) / len(task.gold),
                        len(task.gold & set(order[:5])) / len(task.gold),
                    )
                )
        cells = " | ".join(
            f"{np.mean([a for a, _ in rows]):.3f} / {np.mean([b for _, b in rows]):.3f}"
            for rows in figures.values()
        )
        print(f"| {dataset.name} | {split} of {len(tasks)} | {np.mean(served):.2f} | {cells} |")


if __name__ == "__main__":
    main()
