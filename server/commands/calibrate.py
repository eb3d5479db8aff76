"""`satchel calibrate-floor`: measure the relevance floor for the configured embedder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from satchel.server.evaluation import locomo
from satchel.server.platform.config import ConfigError, Settings


def cmd_calibrate_floor(args: argparse.Namespace, settings: Settings) -> int:
    """Print the distance distributions and the proposed SATCHEL_RECALL_MAX_DISTANCE."""
    from satchel.server.context.calibration import calibrate, jsonl_pairs, locomo_pairs
    from satchel.server.embedding import load_embedder

    if args.pairs is not None:
        if not args.pairs.is_file():
            raise ConfigError(f"--pairs {args.pairs} is not a file")
        pairs = jsonl_pairs(args.pairs)
    else:
        data = args.locomo or locomo.beside_checkout(locomo.DEFAULT_DATA)
        if not data.is_file():
            raise ConfigError(
                f"no labelled pairs: {data} is missing; pass --locomo PATH or --pairs FILE."
                f" {locomo.SOURCE}"
            )
        pairs = locomo_pairs(data, negatives_per_question=args.negatives)
    result = calibrate(load_embedder(settings), pairs, keep=args.keep)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    print(f"embedder {result.model_id}: {result.relevant} relevant, {result.irrelevant} irrelevant")
    print("cosine distance   " + "  ".join(f"{k:>6}" for k in result.relevant_percentiles))
    for label, row in (
        ("relevant        ", result.relevant_percentiles),
        ("irrelevant      ", result.irrelevant_percentiles),
    ):
        print(f"{label}  " + "  ".join(f"{v:6.3f}" for v in row.values()))
    print(
        f"proposed SATCHEL_RECALL_MAX_DISTANCE={result.threshold} keeps {result.keep:.0%} of the"
        f" relevant candidates and drops {result.irrelevant_dropped:.0%} of the irrelevant ones"
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "calibrate-floor", help="measure the relevance floor for the configured embedder"
    )
    parser.add_argument(
        "--locomo",
        type=Path,
        help="LoCoMo JSON file (default, in a source checkout: "
        f"{locomo.DEFAULT_DATA} from its root)",
    )
    parser.add_argument("--pairs", type=Path, help='JSON lines of {"query","text","relevant"}')
    parser.add_argument("--keep", type=float, default=0.95, help="share of relevant to keep")
    parser.add_argument("--negatives", type=int, default=10, help="irrelevant turns per question")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=cmd_calibrate_floor)
