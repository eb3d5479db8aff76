"""`satchel eval locomo`: evidence recall of context assembly on the LoCoMo conversations."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from satchel.server.platform.config import ConfigError, Settings
from satchel.server.platform.logs import configure_logging


def _existing(path: Path, option: str) -> Path:
    """`path` as given when it exists, else resolved against the repository's parent folder
    (where `../shared/data` lives for a clone), else a ConfigError naming the option."""
    if path.is_file():
        return path
    if not path.is_absolute():
        repo = Path(__file__).resolve().parents[2]
        candidate = (repo / path).resolve()
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{option} {path} is not a file")


def cmd_eval_locomo(args: argparse.Namespace, settings: Settings) -> int:
    """Load LoCoMo, ask every question, print coverage beside the baselines."""
    from satchel.server.evaluation import harness, locomo
    from satchel.server.evaluation.report import render_text

    if args.limit_questions is not None and args.limit_questions < 1:
        raise ConfigError("--limit-questions must be at least 1")
    options = harness.EvalOptions(
        data=_existing(args.data, "--data"),
        errata=_existing(args.errata_file, "--errata-file") if args.errata else None,
        conversations=tuple(c for value in args.conversations for c in value.split(",") if c),
        limit_questions=args.limit_questions,
        clock=args.clock,
        baselines=not args.no_baselines,
        details=args.details,
    )
    try:
        locomo.select(locomo.load_conversations(options.data), options.conversations)
    except ValueError as exc:
        raise ConfigError(f"--conversations: {exc}") from exc
    # The in-process server logs one line per call: keep stderr for warnings and progress.
    configure_logging("warning" if not args.verbose else settings.log_level, settings.log_format)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = asyncio.run(harness.run(options, settings, address=args.address, progress=progress))
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `satchel eval locomo`."""
    from satchel.server.evaluation import harness, locomo

    evaluate = commands.add_parser("eval", help="measure retrieval quality on public data")
    suites = evaluate.add_subparsers(dest="suite", required=True)
    parser = suites.add_parser(
        "locomo",
        help="evidence recall of context calls on the LoCoMo conversations, beside baselines",
        description=(
            "Load the LoCoMo conversations through the gRPC API (turns as events, observations"
            " as facts), ask every question as a context call with the server's default budget,"
            " and report evidence recall per category beside vector-only and BM25 baselines"
            " packed into the same budget. Without --address an in-process server runs on a"
            " scratch database (SATCHEL_DATABASE_URL, else an embedded one under /var/tmp)."
        ),
    )
    parser.add_argument("--data", type=Path, default=locomo.DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument(
        "--errata", action="store_true", help="also report with the audit's corrected evidence"
    )
    parser.add_argument(
        "--errata-file", type=Path, default=locomo.DEFAULT_ERRATA, help="audit errata JSON file"
    )
    parser.add_argument(
        "--conversations",
        action="append",
        default=[],
        metavar="ID[,ID…]",
        help="only these conversations (sample ids such as conv-26, or positions)",
    )
    parser.add_argument(
        "--limit-questions", type=int, metavar="N", help="at most N questions per conversation"
    )
    parser.add_argument(
        "--clock",
        choices=harness.CLOCKS,
        default="end",
        help="end: each conversation ends when it is loaded (recency from its end); real: real"
        " dates (recency ~0 for all)",
    )
    parser.add_argument(
        "--address", help="evaluate a running server (host:port) instead of an in-process one"
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip the baselines")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--details", action="store_true", help="with --json: every question's coverage and trace"
    )
    parser.add_argument("--verbose", action="store_true", help="keep the server's call logs")
    parser.set_defaults(func=cmd_eval_locomo)
