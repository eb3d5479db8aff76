"""The one server interceptor: readiness gate, error translation, one log line per RPC."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import psycopg
import structlog
from grpc_status import rpc_status
from psycopg_pool import PoolTimeout

from satchel.server.platform.api.decoding import UndecodableRequest, tolerant_deserializer
from satchel.server.platform.errors import InvalidArgument, ServiceError, Unavailable, Unimplemented

log = structlog.get_logger("satchel.rpc")

GATED_PREFIX = "/satchel.v1."


def _translate(exc: BaseException) -> ServiceError | None:
    """Map an exception to the ServiceError the client should see (None: unexpected)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, NotImplementedError):
        return Unimplemented(str(exc) or "not implemented yet", reason="UNIMPLEMENTED")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        error = ServiceError("the database query was cancelled (deadline)", reason="CANCELLED")
        error.code = grpc.StatusCode.DEADLINE_EXCEEDED
        return error
    if isinstance(exc, psycopg.DataError):
        return InvalidArgument([("request", "a value is out of range for storage")])
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return Unavailable(
            "the database is unavailable, retry later", reason="DATABASE_UNAVAILABLE"
        )
    return None


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every satchel.v1 handler: gate on readiness, translate errors, log the call."""

    def __init__(self, is_ready: Callable[[], bool]) -> None:
        self._is_ready = is_ready

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method: str = details.method
        gated = method.startswith(GATED_PREFIX)
        # A request that does not parse (e.g. a string that is not UTF-8) is INVALID_ARGUMENT
        # with field violations, not grpcio's INTERNAL "Exception deserializing request!".
        deserializer = handler.request_deserializer
        if deserializer is not None:
            deserializer = tolerant_deserializer(deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, gated, handler.unary_unary),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, gated, handler.unary_stream),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _check_ready(self, gated: bool, request: Any) -> None:
        if gated and not self._is_ready():
            raise Unavailable("satchel is starting or stopping", reason="NOT_READY")
        if isinstance(request, UndecodableRequest):
            raise request.error()

    def _wrap_unary(
        self, method: str, gated: bool, inner: Callable[..., Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            structlog.contextvars.clear_contextvars()
            try:
                self._check_ready(gated, request)
                return await inner(request, context)
            except BaseException as exc:
                await self._fail(context, exc)
            finally:
                _log_call(method, context, started)

        return behaviour

    def _wrap_stream(
        self, method: str, gated: bool, inner: Callable[..., Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def behaviour(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            started = time.perf_counter()
            structlog.contextvars.clear_contextvars()
            try:
                self._check_ready(gated, request)
                async for message in inner(request, context):
                    yield message
            except BaseException as exc:
                await self._fail(context, exc)
            finally:
                _log_call(method, context, started)

        return behaviour

    @staticmethod
    async def _fail(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
        if isinstance(exc, grpc.aio.AbortError | asyncio.CancelledError | GeneratorExit):
            raise exc
        error = _translate(exc)
        if error is None:
            log.exception("unexpected_error", exc_info=exc)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        else:
            await context.abort_with_status(rpc_status.to_status(error.to_status()))


def _log_call(method: str, context: grpc.aio.ServicerContext[Any, Any], started: float) -> None:
    code: grpc.StatusCode | int | None = context.code()  # grpc-stubs: StatusCode only
    if isinstance(code, int):  # grpc.aio reports the status as a cygrpc integer
        code = grpc.StatusCode(next(s for s in grpc.StatusCode if s.value[0] == code))
    name = code.name if code is not None else ("CANCELLED" if context.cancelled() else "OK")
    log.info(
        "rpc",
        method=method,
        code=name,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
    )
