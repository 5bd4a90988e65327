"""The service's bounds: oversize bodies (413 before parsing), slow bodies (408), requests beyond the bounds (503),
connections that stall in their headers (closed), no CDN-loaded docs, the optional API key checked before anything is
held, `/health` outside every bound, the exposure warning."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import ExitStack

import httpx
import pytest
from conftest import TINY_QA_PRESET, serving
from fastapi.testclient import TestClient

from realm.cli.main import main
from realm.serve.bounds import BoundedRequests, ServiceLimits, uvicorn_settings
from realm.serve.service import QAService, create_app

QUESTION = {"question": "Where did Bach die?"}


@pytest.fixture
def service(tiny_qa) -> QAService:
    return QAService.load(str(tiny_qa[0]), tiny_qa[1], TINY_QA_PRESET)


def test_an_oversize_body_gets_413_and_a_normal_one_an_answer(service):
    client = TestClient(create_app(service))
    big = b'{"question": "' + b"x" * 200_000 + b'"}'
    response = client.post("/ask", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "the limit is 65536" in response.json()["detail"]

    def chunks():  # no Content-Length: the bytes are counted as they arrive
        yield b'{"question": "'
        yield from (b"x" * 1000 for _ in range(100))
        yield b'"}'

    response = client.post("/ask", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert client.post("/ask", json=QUESTION).status_code == 200


def _client():
    """(the statuses a request got, its ASGI send)."""
    statuses: list[int] = []

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    return statuses, send


async def _never():  # a body that never arrives
    await asyncio.sleep(3600)


async def _whole():
    return {"type": "http.request", "body": b"{}", "more_body": False}


def _partial():
    """A body whose first byte arrives and the rest never."""
    chunks = [{"type": "http.request", "body": b"{", "more_body": True}]

    async def receive():
        if chunks:
            return chunks.pop()
        await asyncio.sleep(3600)

    return receive


def _scope(path: str = "/ask", method: str = "POST", key: str | None = None) -> dict:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return {"type": "http", "method": method, "path": path, "headers": headers}


def test_a_slow_body_gets_408_and_requests_beyond_either_bound_get_503():
    async def scenario() -> None:
        release = asyncio.Event()

        async def app(scope, receive, send):  # holds every request until released, as a busy reader would
            await receive()
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        bounded = BoundedRequests(app, ServiceLimits(body_seconds=0.2, max_in_flight=2, max_receiving=2))
        slow, send = _client()
        await bounded(_scope(), _never, send)
        assert slow == [408] and bounded.receiving == 0
        (first, send1), (second, send2), (third, send3) = _client(), _client(), _client()
        held = [asyncio.create_task(bounded(_scope(), _whole, s)) for s in (send1, send2)]
        await asyncio.sleep(0.05)
        await bounded(_scope(), _whole, send3)
        assert third == [503] and bounded.in_flight == 2
        release.set()
        await asyncio.gather(*held)
        assert first == second == [200] and bounded.in_flight == 0

        # bodies that came in part have a budget of their own: they cannot take the slots of requests being answered
        arriving = [_client() for _ in range(3)]
        waiting = [asyncio.create_task(bounded(_scope(), _partial(), s)) for _, s in arriving[:2]]
        await asyncio.sleep(0.05)
        await bounded(_scope(), _partial(), arriving[2][1])
        assert arriving[2][0] == [503] and (bounded.receiving, bounded.in_flight) == (2, 0)
        whole, send = _client()  # a body that arrives whole needs no receiving slot
        release.set()
        await bounded(_scope(), _whole, send)
        assert whole == [200]
        await asyncio.gather(*waiting)
        assert [statuses for statuses, _ in arriving[:2]] == [[408], [408]] and bounded.receiving == 0

    asyncio.run(scenario())


def test_a_keyless_request_is_refused_from_its_headers_and_health_is_outside_every_bound():
    """On d1c3134 a keyless request took a slot and held it for the whole body deadline; /health waited in line."""

    async def scenario() -> None:
        release = asyncio.Event()
        seen: list[str] = []

        async def app(scope, receive, send):
            seen.append(scope["path"])
            if scope["path"] != "/health":
                await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        bounded = BoundedRequests(app, ServiceLimits(max_in_flight=1, max_receiving=1), api_key="s3cret")
        keyless, send = _client()
        await bounded(_scope(), _never, send)  # would wait an hour for its body if it were read
        assert keyless == [401] and (bounded.receiving, bounded.in_flight) == (0, 0) and seen == []
        busy, send = _client()
        held = asyncio.create_task(bounded(_scope(key="s3cret"), _whole, send))
        await asyncio.sleep(0.05)
        assert bounded.in_flight == 1
        for method in ("GET", "HEAD"):
            health, send = _client()
            await asyncio.wait_for(bounded(_scope("/health", method), _never, send), timeout=1)
            assert health == [200]
        refused, send = _client()
        await bounded(_scope(key="s3cret"), _whole, send)
        assert refused == [503]
        release.set()
        await held
        assert busy == [200]

    asyncio.run(scenario())


def _slow_keyless_bodies(url: str, count: int, stop: threading.Event) -> threading.Thread:
    """`count` connections that POST /ask without a key, declaring 100 bytes and sending one a second; each is
    reopened as soon as the server ends it (the attack that took d1c3134 down)."""

    def attack() -> None:
        host, port = url.removeprefix("http://").split(":")
        head = b"POST /ask HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        with ExitStack() as stack:
            sockets: list[socket.socket | None] = [None] * count
            while not stop.is_set():
                for n in range(count):
                    try:
                        if sockets[n] is None:
                            sockets[n] = stack.enter_context(socket.create_connection((host, int(port))))
                            sockets[n].sendall(head)
                        else:
                            sockets[n].sendall(b" ")
                    except OSError:
                        sockets[n] = None
                stop.wait(0.2)

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("attackers", [32, 200])
def test_keyless_slow_bodies_cannot_keep_an_authorised_client_out(service, attackers):
    limits = ServiceLimits(body_seconds=1.0)
    app = create_app(service, api_key="s3cret", limits=limits)
    with serving(app, **uvicorn_settings(limits)) as url:
        stop = threading.Event()
        attack = _slow_keyless_bodies(url, attackers, stop)
        try:
            time.sleep(1.5)  # every attacker connected, some already past a body deadline
            with httpx.Client(timeout=30) as client:
                key = {"Authorization": "Bearer s3cret"}
                statuses = [client.post(f"{url}/ask", json=QUESTION, headers=key).status_code for _ in range(6)]
                health = [client.get(f"{url}/health").status_code for _ in range(3)]
        finally:
            stop.set()
            attack.join(timeout=10)
    assert statuses == [200] * 6 and health == [200] * 3


def test_a_connection_that_stalls_in_its_headers_is_closed(service):
    with serving(create_app(service), **uvicorn_settings(ServiceLimits(header_seconds=0.5))) as url:
        host, port = url.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)))
        stalled.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n")  # and never the blank line that ends headers
        silent = socket.create_connection((host, int(port)))  # sends nothing at all
        started = time.monotonic()
        for connection in (stalled, silent):
            connection.settimeout(10)
            assert connection.recv(1024) == b""  # closed by the server
            connection.close()
        assert time.monotonic() - started < 5
        assert httpx.get(f"{url}/health").status_code == 200  # the others are served as before


def test_no_docs_pages_and_an_optional_api_key(service):
    open_client = TestClient(create_app(service))
    assert open_client.get("/docs").status_code == open_client.get("/redoc").status_code == 404
    client = TestClient(create_app(service, api_key="s3cret"))
    assert client.post("/ask", json=QUESTION).status_code == 401
    assert client.post("/ask", json=QUESTION, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/ask", json=QUESTION, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    query = {"query": QUESTION["question"]}
    assert client.post("/search", json=query).status_code == 401
    assert client.post("/search", json=query, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/").status_code == 200
    assert client.post("/health").status_code == 401  # only GET and HEAD of the open paths are open
    reply = client.post("/ask", json=QUESTION)
    assert reply.json()["detail"].startswith("this service needs an API key") and reply.headers["www-authenticate"]


def test_serving_beyond_this_machine_warns_and_takes_the_key_from_the_environment(tiny_qa, monkeypatch, capsys):
    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: TINY_QA_PRESET)
    started = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: started.update(app=app, **kwargs))
    monkeypatch.setenv("REALM_API_KEY", "from-env")
    argv = ["serve", "--model", str(model_dir), "--index", str(index_dir), "--host", "0.0.0.0", "--quiet"]
    assert main(argv) == 0
    assert "realm: warning: serving on 0.0.0.0" in capsys.readouterr().err
    assert started["http"].header_seconds == ServiceLimits().header_seconds
    client = TestClient(started["app"])
    assert client.post("/ask", json=QUESTION).status_code == 401
    assert client.post("/ask", json=QUESTION, headers={"Authorization": "Bearer from-env"}).status_code == 200
