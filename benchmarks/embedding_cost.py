"""What one ONNX run of the bundled model costs, by tokens and by batch size (issue 15's
micro-batching lever): if a batch of B queries costs B times one query, batching them saves
nothing but the per-run overhead.

    .venv/bin/python benchmarks/embedding_cost.py [--runs 60]

The model as the server runs it (one intra-op thread); inputs of ones, so only their shape
matters. Prints the median ms of a run per (batch, tokens), and per query.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    embedder = FastEmbedEmbedder(cache_dir=Path(tempfile.gettempdir()) / "satchel-embed-cost")
    session = embedder._model.model.model  # fastembed's onnxruntime session
    names = [i.name for i in session.get_inputs()]
    print(f"{embedder.model_id}, {session.get_session_options().intra_op_num_threads} thread")
    print("batch  tokens   ms a run   ms a query")
    for batch in (1, 4, 8):
        for tokens in (8, 16, 32):
            ids = np.ones((batch, tokens), dtype=np.int64)
            feed = {n: np.zeros_like(ids) if n == "token_type_ids" else ids for n in names}
            for _ in range(5):
                session.run(None, feed)
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                session.run(None, feed)
                times.append((time.perf_counter() - started) * 1000)
            median = statistics.median(times)
            print(f"{batch:5d}  {tokens:6d}  {median:9.2f}  {median / batch:11.2f}")


if __name__ == "__main__":
    main()
