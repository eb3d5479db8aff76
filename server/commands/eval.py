"""`satchel eval locomo|realtalk`: evidence recall of context assembly on public conversations."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from satchel.server.evaluation import datasets, locomo, realtalk
from satchel.server.platform.config import ConfigError, Settings
from satchel.server.platform.logs import configure_logging

T = TypeVar("T")


def _input_file(
    given: Path | None,
    default: Path | None,
    option: str,
    what: str,
    source: str,
    folder: bool = False,
) -> Path:
    """The file (or, with `folder`, the folder) `option` names (relative to the working
    directory), else `default` beside the source checkout; else a ConfigError naming the option
    and where the data comes from."""
    if given is not None:
        if given.is_file() or (folder and given.is_dir()):
            return given
        problem = f"{option} {given}: " + ("not a file" if given.exists() else "no such file")
    elif default is None:
        problem = f"no {what}: pass {option} PATH"
    else:
        path = locomo.beside_checkout(default)
        if path.is_file():
            return path
        problem = f"no {what}: pass {option} PATH (the default, {path}, is not there)"
    raise ConfigError(f"{problem}. {source}")


def _read(path: Path, option: str, read: Callable[[Path], T], what: str, source: str) -> T:
    """`read(path)`, or a ConfigError naming the option when the file is not `what`."""
    try:
        return read(path)
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{option} {path}: not {what} ({type(exc).__name__}: {exc}). {source}"
        ) from exc


_SUITES = {
    "locomo": (locomo.NAME, locomo.SOURCE, "a LoCoMo JSON file"),
    "realtalk": (realtalk.NAME, realtalk.SOURCE, "REALTALK conversations"),
}
"""Each suite's data set, where its data comes from, and what --data must hold."""


def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    """Load LoCoMo or REALTALK, ask every question, print coverage beside the baselines."""
    from satchel.server.evaluation import harness
    from satchel.server.evaluation.report import render_text

    if args.limit_questions is not None and args.limit_questions < 1:
        raise ConfigError("--limit-questions must be at least 1")
    if args.keep and not args.address and not settings.database_url:
        raise ConfigError(
            "--keep keeps the project in a database that outlives the run: use it with"
            " --address or SATCHEL_DATABASE_URL (the scratch database is removed)"
        )
    name, source, what = _SUITES[args.suite]
    realtalk_suite = name == realtalk.NAME
    data = _input_file(
        args.data,
        None if realtalk_suite else locomo.DEFAULT_DATA,
        "--data",
        f"{name} data",
        source,
        folder=realtalk_suite,
    )
    dataset, conversations = _read(data, "--data", datasets.load, what, source)
    if dataset != name:
        raise ConfigError(
            f"--data {data}: {dataset} conversations, not {what}: use satchel eval"
            f" {dataset.lower()}"
        )
    errata = None
    if getattr(args, "errata", False):
        errata = _input_file(
            args.errata_file,
            locomo.DEFAULT_ERRATA,
            "--errata-file",
            "errata for --errata",
            locomo.ERRATA_SOURCE,
        )
    options = harness.EvalOptions(
        data=data,
        dataset=dataset,
        errata=errata,
        conversations=tuple(c for value in args.conversations for c in value.split(",") if c),
        limit_questions=args.limit_questions,
        clock=args.clock,
        baselines=not args.no_baselines,
        details=args.details,
    )
    try:
        conversations = locomo.select(conversations, options.conversations, options.limit_questions)
    except ValueError as exc:
        raise ConfigError(f"--conversations: {exc}") from exc
    if errata is not None:
        records = _read(
            errata, "--errata-file", locomo.load_errata, "an errata file", locomo.ERRATA_SOURCE
        )
        conversations, _ = locomo.apply_errata(conversations, records)
    # The in-process server logs one line per call: keep stderr for warnings and progress.
    configure_logging("warning" if not args.verbose else settings.log_level, settings.log_format)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    async def run() -> dict[str, Any]:
        # SIGTERM cancels the run as Ctrl-C does (asyncio.run turns SIGINT into a cancellation):
        # either way the run deletes its project, or its scratch database, before it ends.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await harness.run(
            options,
            settings,
            address=args.address,
            progress=progress,
            conversations=conversations,
            keep=args.keep,
        )

    try:
        report = asyncio.run(run())
    except KeyboardInterrupt:
        print(f"satchel: eval {args.suite} interrupted", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print(f"satchel: eval {args.suite} terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except grpc.aio.AioRpcError as exc:
        where = args.address or "the in-process server"
        problem = f"{exc.code().name}: {exc.details()}"
        print(f"satchel: eval {args.suite}: {where}: {problem}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both suites take, after --data."""
    from satchel.server.evaluation import harness

    parser.add_argument(
        "--conversations",
        action="append",
        default=[],
        metavar="ID[,ID…]",
        help="only these conversations (sample ids such as conv-26 or Chat_3_Kevin_Paola, or"
        " positions)",
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
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the loaded project (with --address or SATCHEL_DATABASE_URL) and print its"
        " id, for later runs on it (benchmarks/paired_latency.py)",
    )
    parser.add_argument("--no-baselines", action="store_true", help="skip the baselines")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--details", action="store_true", help="with --json: every question's coverage and trace"
    )
    parser.add_argument("--verbose", action="store_true", help="keep the server's call logs")
    parser.set_defaults(func=cmd_eval)


_RUN = (
    "ask every question as a context call with the server's default budget, and report evidence"
    " recall per category beside vector-only and BM25 baselines packed into the same budget."
    " Without --address an in-process server runs on a scratch database (SATCHEL_DATABASE_URL,"
    " else an embedded one under /var/tmp). The run loads one fresh project and deletes it when"
    " it ends (also on an error or Ctrl-C) unless --keep; a scratch database is removed whole."
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `satchel eval locomo` and `satchel eval realtalk`."""
    evaluate = commands.add_parser("eval", help="measure retrieval quality on public data")
    suites = evaluate.add_subparsers(dest="suite", required=True)
    parser = suites.add_parser(
        "locomo",
        help="evidence recall of context calls on the LoCoMo conversations, beside baselines",
        description=(
            "Load the LoCoMo conversations through the gRPC API (turns as events, observations"
            f" as facts), {_RUN} satchel does not ship LoCoMo (CC BY-NC 4.0): pass --data with a"
            " copy of data/locomo10.json from https://github.com/snap-research/LoCoMo (REALTALK:"
            " satchel eval realtalk)."
        ),
    )
    parser.add_argument(
        "--data",
        type=Path,
        metavar="PATH",
        help="LoCoMo JSON file, such as locomo10.json of the public release (not shipped with"
        f" satchel); default, in a source checkout: {locomo.DEFAULT_DATA} from its root",
    )
    parser.add_argument(
        "--errata", action="store_true", help="also report with the audit's corrected evidence"
    )
    parser.add_argument(
        "--errata-file",
        type=Path,
        metavar="PATH",
        help="the audit's errata JSON (errors.json of github.com/dial481/locomo-audit); default,"
        f" in a source checkout: {locomo.DEFAULT_ERRATA} from its root",
    )
    _common_arguments(parser)
    parser = suites.add_parser(
        "realtalk",
        help="evidence recall of context calls on the REALTALK conversations, beside baselines",
        description=(
            "Load the REALTALK conversations (ten real 21-day chats, LoCoMo's question layout,"
            f" no observations) through the gRPC API (turns as events), {_RUN} satchel does not"
            " ship REALTALK: pass --data with the data folder of"
            " https://github.com/danny911kr/REALTALK."
        ),
    )
    parser.add_argument(
        "--data",
        type=Path,
        metavar="PATH",
        required=True,
        help="REALTALK's data folder (its Chat_*.json files) or one of its files",
    )
    _common_arguments(parser)
