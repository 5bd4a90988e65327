"""Bounds on what one client can make the service hold: body size, time, requests in flight, and connections that
never finish their headers. The app stays behind them; memory stays flat whatever arrives.

    GET / and /health                   -> outside every bound: bodiless, cheap, answered even when saturated
    no API key (when the service has one) -> 401 from the headers alone: no slot taken, no body read
    body over max_body_bytes            -> 413, before anything is parsed (Content-Length, or counted as it arrives)
    body slower than body_seconds       -> 408
    over max_receiving partial bodies   -> 503 at once (a budget of their own: slow bodies cannot take the work slots)
    over max_in_flight requests         -> 503 at once (the reader answers one question at a time; the rest wait)
    headers unfinished after header_seconds -> the connection is closed (HeaderDeadlineH11, given to uvicorn)
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol

OPEN_PATHS = frozenset({"/", "/health"})  # for GET and HEAD
KEY_NEEDED = "this service needs an API key: send Authorization: Bearer <key>"


@dataclass(frozen=True)
class ServiceLimits:
    max_body_bytes: int = 64 * 1024  # a question is at most 1,000 characters
    body_seconds: float = 10.0
    header_seconds: float = 10.0
    max_in_flight: int = 32
    max_receiving: int = 16  # requests whose body came in parts and is still arriving


def has_key(headers: list[tuple[bytes, bytes]], api_key: str | None) -> bool:
    """Whether the request carries `Authorization: Bearer <api_key>` (always, for a service without a key)."""
    if api_key is None:
        return True
    sent = dict(headers).get(b"authorization", b"")
    return secrets.compare_digest(sent, f"Bearer {api_key}".encode())


async def _reply(send, status: int, detail: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BoundedRequests:
    """ASGI middleware: lets GET / and /health through untouched; refuses a request without the API key from its
    headers; reads at most `max_body_bytes` of a body within `body_seconds` while at most `max_receiving` bodies
    arrive at once, then hands the app the body it read; refuses requests beyond `max_in_flight`."""

    def __init__(self, app, limits: ServiceLimits, api_key: str | None = None):
        self.app = app
        self.limits = limits
        self.api_key = api_key
        self.receiving = 0
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or (scope["path"] in OPEN_PATHS and scope["method"] in ("GET", "HEAD")):
            await self.app(scope, receive, send)
            return
        if not has_key(scope.get("headers", []), self.api_key):
            await _reply(send, 401, KEY_NEEDED, ((b"www-authenticate", b"Bearer"),))
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        if self.in_flight >= self.limits.max_in_flight:
            await _reply(send, 503, f"busy: {self.in_flight} requests in progress; try again shortly")
            return
        self.in_flight += 1
        try:
            replay = [{"type": "http.request", "body": body, "more_body": False}]

            async def replayed():
                return replay.pop() if replay else await receive()

            await self.app(scope, replayed, send)
        finally:
            self.in_flight -= 1

    async def _read_body(self, scope, receive, send) -> bytes | None:
        """The whole body, or None after replying 413/408/503 (or when the client went away). A body that did not
        come whole with its first chunk holds one of `max_receiving` slots while the rest arrives: what partial
        bodies can hold is bounded, and a small body, which arrives with its headers, never waits for a slot."""
        limit = self.limits.max_body_bytes
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _reply(send, 413, f"request body of {int(declared)} bytes; the limit is {limit}")
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_seconds
        body = bytearray()
        counted = False
        try:
            while True:
                try:
                    message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - loop.time()))
                except TimeoutError:
                    await _reply(send, 408, f"the request body did not arrive within {self.limits.body_seconds:g} s")
                    return None
                if message["type"] == "http.disconnect":
                    return None
                body += message.get("body", b"")
                if len(body) > limit:
                    await _reply(send, 413, f"request body over {limit} bytes")
                    return None
                if not message.get("more_body", False):
                    return bytes(body)
                if not counted:
                    if self.receiving >= self.limits.max_receiving:
                        await _reply(send, 503, f"busy: {self.receiving} request bodies arriving; try again shortly")
                        return None
                    self.receiving, counted = self.receiving + 1, True
        finally:
            self.receiving -= counted


class HeaderDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for a request's headers: a connection that opens and sends
    nothing, or stalls mid-headers, is closed after `header_seconds` instead of being held forever."""

    header_seconds = ServiceLimits.header_seconds

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request's headers are complete: the app has it now
        else:
            self._arm()  # between requests, bytes of the next one's headers: they must finish in time

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_seconds, self._stalled)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _stalled(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


def uvicorn_settings(limits: ServiceLimits) -> dict:
    """What uvicorn needs for the bounds below the app (`uvicorn.run(app, **uvicorn_settings(limits))`)."""
    protocol = type("HeaderDeadlineH11", (HeaderDeadlineH11,), {"header_seconds": limits.header_seconds})
    return {"http": protocol, "timeout_keep_alive": 5}
