"""ResolveTalents and SearchTools latency at 100, 1,000 and 10,000 talents, beside the task's
embedding alone.

    .venv/bin/python benchmarks/talent_latency.py [--calls 200] [--sizes 100,1000,10000]

Starts `satchel serve` (embedded PostgreSQL in a temporary directory, server defaults: fused
scoring, relevance on), upserts the tools of the public catalogues of benchmarks/data/catalogues/
(seal_tools, toolbench, acebench, azure_mcp: 10,051 tools) as talents with their input schemas,
and activates the first N on a project per size. Then, per size, for each of `--calls` new tasks
(the catalogues' own tasks, never repeated, so the server's task-vector cache never answers): the
task's embedding alone in this process, then ResolveTalents with no relevance mode (the
defaults), then SearchTools with another new task. The first 20 calls of each size are warm-up.
Prints medians and tails, and each p50 as a ratio to the embedding's p50 measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalogues import load_catalogue  # noqa: E402
from talent_calibration import _wait_for_port  # noqa: E402

from satchel.server.embedding import load_embedder  # noqa: E402
from satchel.server.platform.config import Settings  # noqa: E402

CATALOGUES = ("seal_tools", "toolbench", "acebench_en", "acebench_zh", "azure_mcp")
WARM_UP = 20


def tools_and_tasks() -> tuple[list, list[str]]:
    from satchel.v1 import talent_pb2

    talents, tasks = [], []
    for name in CATALOGUES:
        catalogue = load_catalogue(name)
        for tool in catalogue.tools:
            talents.append(
                talent_pb2.Talent(
                    id=f"{name}.{tool.id}"[:200],
                    name=tool.name[:200],
                    summary=tool.description[:32000],
                    tags=[tool.group[:200]] if tool.group else [],
                    input_schema=json.dumps(tool.parameters) if tool.parameters else "",
                )
            )
        tasks += [task.query for task in catalogue.tasks]
    return talents, tasks


def percentiles(values: list[float]) -> tuple[float, float, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return float(p50), float(p90), float(p99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--sizes", default="100,1000,10000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    import grpc

    from satchel.v1 import talent_pb2, talent_pb2_grpc

    talents, tasks = tools_and_tasks()
    rng = np.random.default_rng(34)
    rng.shuffle(tasks)
    needed = len(sizes) * 2 * (args.calls + WARM_UP)
    if len(tasks) < needed:
        raise SystemExit(f"{len(tasks)} tasks for {needed} calls: lower --calls")
    # The server's model (SATCHEL_EMBED_MODEL, else the default), nothing else of the caller's.
    model = {k: v for k, v in os.environ.items() if k == "SATCHEL_EMBED_MODEL"}
    embedder = load_embedder(Settings.from_env(model))
    with tempfile.TemporaryDirectory(prefix="satchel-talent-latency-") as tmp:
        log_path = Path(tmp) / "serve.log"
        env = {
            **os.environ,
            "SATCHEL_DATA_DIR": str(Path(tmp) / "data"),
            "SATCHEL_LISTEN": "127.0.0.1:0",
            "SATCHEL_LOG_LEVEL": "info",
        }
        satchel = str(Path(sys.executable).parent / "satchel")
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([satchel, "serve"], env=env, stdout=log_file, stderr=log_file)
        try:
            port = _wait_for_port(log_path, proc)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = talent_pb2_grpc.TalentServiceStub(channel)
                started = time.perf_counter()
                for talent in talents[: max(sizes)]:
                    stub.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
                print(
                    f"{min(max(sizes), len(talents))} talents upserted (2 embeddings each) in"
                    f" {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
                print(
                    "\n| talents | call | calls | p50 ms | p90 ms | p99 ms | embedding p50 ms"
                    " | p50 / embedding | served mean | response kB |"
                )
                print("|---|---|---|---|---|---|---|---|---|---|")
                task_iter = iter(tasks)
                for size in sizes:
                    project = f"latency-{size}"
                    for talent in talents[:size]:
                        stub.SetTalentActivation(
                            talent_pb2.SetTalentActivationRequest(
                                project_id=project, talent_id=talent.id, active=True
                            )
                        )
                    timings: dict[str, list[float]] = {"resolve": [], "search": [], "embed": []}
                    served: dict[str, list[int]] = {"resolve": [], "search": []}
                    sizes_kb: dict[str, list[float]] = {"resolve": [], "search": []}
                    for index in range(args.calls + WARM_UP):
                        resolve_task, search_task = next(task_iter), next(task_iter)
                        t0 = time.perf_counter()
                        embedder.embed([embedder.query_prefix + resolve_task])
                        embed_ms = (time.perf_counter() - t0) * 1000
                        t0 = time.perf_counter()
                        reply = stub.ResolveTalents(
                            talent_pb2.ResolveTalentsRequest(project_id=project, task=resolve_task)
                        )
                        resolve_ms = (time.perf_counter() - t0) * 1000
                        t0 = time.perf_counter()
                        found = stub.SearchTools(
                            talent_pb2.SearchToolsRequest(project_id=project, task=search_task)
                        )
                        search_ms = (time.perf_counter() - t0) * 1000
                        if index < WARM_UP:
                            continue
                        timings["embed"].append(embed_ms)
                        timings["resolve"].append(resolve_ms)
                        timings["search"].append(search_ms)
                        served["resolve"].append(len(reply.selection.selected))
                        served["search"].append(len(found.tools))
                        sizes_kb["resolve"].append(reply.ByteSize() / 1024)
                        sizes_kb["search"].append(found.ByteSize() / 1024)
                    embed_p50 = statistics.median(timings["embed"])
                    for call, name in (("resolve", "ResolveTalents"), ("search", "SearchTools")):
                        p50, p90, p99 = percentiles(timings[call])
                        print(
                            f"| {size:,} | {name} | {args.calls} | {p50:.1f} | {p90:.1f} |"
                            f" {p99:.1f} | {embed_p50:.1f} | {p50 / embed_p50:.2f}x |"
                            f" {statistics.mean(served[call]):.1f} |"
                            f" {statistics.mean(sizes_kb[call]):.1f} |",
                            flush=True,
                        )
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nLoad average after the run: {load} ({os.cpu_count()} CPUs).")


if __name__ == "__main__":
    main()
