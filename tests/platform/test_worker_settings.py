"""A worker process's settings, derived from the primary's."""

from __future__ import annotations

from dataclasses import replace

from satchel.server.platform.config import Settings
from satchel.server.platform.processes import worker_settings


def test_a_worker_serves_the_primarys_bound_port_on_its_database() -> None:
    primary = Settings.from_env({"SATCHEL_LISTEN": "[::]:0", "SATCHEL_PROCESSES": "3"})
    worker = worker_settings(primary, "postgresql://primary/db", 50123, 2)
    assert worker.listen == "[::]:50123"
    assert worker.database_url == "postgresql://primary/db"
    assert worker.processes == 3  # it shares the port too (SO_REUSEPORT)
    assert worker == replace(primary, listen="[::]:50123", database_url="postgresql://primary/db")


def test_a_workers_metrics_listen_next_to_the_primarys() -> None:
    primary = Settings.from_env({"SATCHEL_METRICS_LISTEN": "127.0.0.1:9464"})
    assert worker_settings(primary, "dsn", 1, 1).metrics_listen == "127.0.0.1:9465"
    assert worker_settings(primary, "dsn", 1, 3).metrics_listen == "127.0.0.1:9467"
    ephemeral = replace(primary, metrics_listen="127.0.0.1:0")
    assert worker_settings(ephemeral, "dsn", 1, 2).metrics_listen == "127.0.0.1:0"
    off = replace(primary, metrics_listen="")
    assert worker_settings(off, "dsn", 1, 2).metrics_listen == ""
