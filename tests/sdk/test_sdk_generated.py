"""The SDK is written once: client/_aio.py (asyncio) is the source, and the blocking client,
client/_sync.py, is generated from it by scripts/generate-sync-client. The committed file must
be the generator's output, and the two clients must keep the same methods and parameters."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

from satchel.client import AsyncSatchelClient, AsyncStream, SatchelClient, Stream

GENERATOR = ROOT / "scripts" / "generate-sync-client"

PROTOCOL = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}
"""The asyncio protocol methods and their blocking counterparts."""
SPECIAL = {"__init__", *PROTOCOL, *PROTOCOL.values()}
DIFFERENT_ANNOTATIONS = {("Stream", "__init__", "call")}
"""Where the annotations differ by design: a stream wraps a grpc.aio call in one client and a
blocking call (an iterator) in the other; neither is built by SDK users."""


def test_the_committed_blocking_client_is_the_generated_one(tmp_path: Path) -> None:
    output = tmp_path / "_sync.py"
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (ROOT / "client" / "_sync.py").read_bytes() == output.read_bytes(), (
        "client/_sync.py is not what scripts/generate-sync-client makes of client/_aio.py and "
        "client/_sync_parts.py: never edit client/_sync.py by hand; change client/_aio.py (or "
        "client/_sync_parts.py), then run scripts/generate-sync-client"
    )


def _blocking(annotation: Any) -> Any:
    """An annotation of the asyncio client as the blocking client spells it."""
    if not isinstance(annotation, str):  # inspect.Parameter.empty
        return annotation
    return re.sub(r"\bAsync(?=[A-Z])", "", annotation.replace("grpc.aio.", "grpc."))


def _methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods, `__init__` and the protocol methods, by their blocking names."""
    return {
        PROTOCOL.get(name, name): member
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name in SPECIAL)
    }


def _parameters(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(
    ("asyncio_class", "blocking_class"),
    [(AsyncSatchelClient, SatchelClient), (AsyncStream, Stream)],
    ids=["client", "stream"],
)
def test_both_clients_have_the_same_methods_and_parameters(
    asyncio_class: type, blocking_class: type
) -> None:
    asyncio_methods, blocking_methods = _methods(asyncio_class), _methods(blocking_class)
    assert sorted(asyncio_methods) == sorted(blocking_methods)
    assert {"__init__", "__enter__", "__exit__"} <= set(blocking_methods)
    for name, asyncio_method in asyncio_methods.items():
        blocking_method = blocking_methods[name]
        where = f"{blocking_class.__name__}.{name}"
        # awaitables become plain calls, async generators generators, and nothing stays async
        assert inspect.isgeneratorfunction(blocking_method) == inspect.isasyncgenfunction(
            asyncio_method
        ), where
        assert not inspect.iscoroutinefunction(blocking_method), where
        assert not inspect.isasyncgenfunction(blocking_method), where

        asyncio_signature = inspect.signature(asyncio_method)
        blocking_signature = inspect.signature(blocking_method)
        assert _parameters(asyncio_signature) == _parameters(blocking_signature), where
        for parameter in asyncio_signature.parameters.values():
            if (blocking_class.__name__, name, parameter.name) in DIFFERENT_ANNOTATIONS:
                continue
            blocking = blocking_signature.parameters[parameter.name].annotation
            assert _blocking(parameter.annotation) == blocking, f"{where}({parameter.name})"
        assert _blocking(asyncio_signature.return_annotation) == (
            blocking_signature.return_annotation
        ), f"{where} returns"
