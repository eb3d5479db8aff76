"""Subcommands of `satchel` beyond serve/migrate/healthcheck, one module per topic.

Each module exposes `register(commands)`; list it in `satchel.server.cli.COMMAND_MODULES`.
Commands that talk to a running server use `--address` (default: SATCHEL_ADDRESS, else
SATCHEL_LISTEN) through the generated stubs.
"""
