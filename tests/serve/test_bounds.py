"""The service's bounds: oversize bodies (413 before parsing), slow bodies (408), requests beyond the bound (503),
connections that stall in their headers (closed), no CDN-loaded docs, the optional API key, the exposure warning."""

from __future__ import annotations

import asyncio
import socket
import time

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


def test_a_slow_body_gets_408_and_requests_beyond_the_bound_get_503():
    async def scenario() -> None:
        release = asyncio.Event()

        async def app(scope, receive, send):  # holds every request until released, as a busy reader would
            await receive()
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        bounded = BoundedRequests(app, ServiceLimits(body_seconds=0.2, max_in_flight=2))
        scope = {"type": "http", "method": "POST", "path": "/ask", "headers": []}

        def client():
            statuses: list[int] = []

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            return statuses, send

        async def never():  # a body that never arrives
            await asyncio.sleep(3600)

        async def whole():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        slow, send = client()
        await bounded(scope, never, send)
        assert slow == [408]
        (first, send1), (second, send2), (third, send3) = client(), client(), client()
        held = [asyncio.create_task(bounded(scope, whole, s)) for s in (send1, send2)]
        await asyncio.sleep(0.05)
        await bounded(scope, whole, send3)
        assert third == [503] and bounded.in_flight == 2
        release.set()
        await asyncio.gather(*held)
        assert first == second == [200] and bounded.in_flight == 0

    asyncio.run(scenario())


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
