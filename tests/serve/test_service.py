"""`realm serve`: health, answers with evidence, input validation (never a 500), concurrent requests, the index
swapped live when another process publishes a version, and the command line."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import TINY_EMBED, TINY_QA, TINY_QA_PRESET, serving
from fastapi import FastAPI
from fastapi.testclient import TestClient

from realm.cli.main import main
from realm.config import SERVE_BATCH_SIZE, IndexConfig
from realm.data.qa_examples import normalize_answer
from realm.index.build import build_from_retriever
from realm.index.mips import MipsIndex
from realm.index.update import add_documents, remove_documents
from realm.models.retriever import Retriever
from realm.serve.bounds import ServiceLimits, uvicorn_settings
from realm.serve.service import MAX_K, MAX_QUESTION_CHARS, QAService, create_app

QUESTIONS = [
    "What is the capital of Japan?",
    "Where did Bach die?",
    "Who walked on the Moon in 1969?",
    "Into which sea does the Nile flow?",
    "What does the Louvre hold?",
    "When was Bach born?",
    "Where is the Eiffel Tower?",
    "How long is the Nile?",
]
EVEREST = {
    "id": "everest",
    "title": "Mount Everest",
    "text": "Mount Everest is Earth's highest mountain above sea "
    "level, in the Himalayas. Its summit is 8,849 metres high.",
}


@pytest.fixture
def client(qa_service: QAService) -> TestClient:
    return TestClient(create_app(qa_service))


def test_health_names_what_is_served_without_absolute_paths_unless_asked_with_the_key(client, tiny_qa, tiny_corpus):
    assert client.get("/health").json() == {
        "status": "ok",
        "index_version": 1,
        "latest_version": 1,
        "num_blocks": len(tiny_corpus),
        "model": f".../{tiny_qa[0].name}",
        "retriever": "dense",
        "k": TINY_QA.top_k,
        "batch_size": SERVE_BATCH_SIZE,
    }
    keyed = TestClient(create_app(_service(tiny_qa), api_key="s3cret"))
    assert keyed.get("/health").json()["model"] == f".../{tiny_qa[0].name}"
    assert keyed.get("/health", headers={"Authorization": "Bearer s3cret"}).json()["model"] == str(tiny_qa[0])


def _service(tiny_qa) -> QAService:
    return QAService.load(str(tiny_qa[0]), tiny_qa[1], TINY_QA_PRESET)


def test_health_says_degraded_with_the_reason_when_the_index_pointer_is_unreadable(client, tiny_qa):
    """On d1c3134 a damaged CURRENT gave {"status": "ok", "latest_version": null}."""
    pointer = tiny_qa[1] / "CURRENT"
    pointer.write_text("garbage\n")
    health = client.get("/health").json()
    assert (health["status"], health["index_version"], health["latest_version"]) == ("degraded", 1, None)
    assert "the index pointer is unreadable" in health["reason"] and "answering from v1" in health["reason"]
    assert str(tiny_qa[1]) not in health["reason"] and "'garbage'" in health["reason"]
    assert client.post("/ask", json={"question": "Where did Bach die?"}).json()["index_version"] == 1
    pointer.unlink()
    assert "no published version" in client.get("/health").json()["reason"]
    pointer.write_text("v000001\n")
    assert client.get("/health").json()["status"] == "ok"


def test_health_answers_at_once_while_every_request_slot_is_taken(tiny_qa):
    """On d1c3134 `/health` counted against the request limit: 48 askers made it answer 503 ten times of ten."""
    limits = ServiceLimits(max_in_flight=4)
    with serving(create_app(_service(tiny_qa), limits=limits), **uvicorn_settings(limits)) as url:
        stop = threading.Event()
        refused = Counter()

        def ask() -> None:
            with httpx.Client(timeout=30) as http:
                while not stop.is_set():
                    refused[http.post(f"{url}/ask", json={"question": "Where did Bach die?"}).status_code] += 1

        askers = [threading.Thread(target=ask) for _ in range(12)]
        for thread in askers:
            thread.start()
        try:
            time.sleep(1.0)
            with httpx.Client(timeout=30) as http:
                health = [http.get(f"{url}/health").status_code for _ in range(10)]
                page = http.get(f"{url}/").status_code
        finally:
            stop.set()
            for thread in askers:
                thread.join()
    assert refused[503] > 0, "the askers never saturated the service: the test shows nothing"
    assert health == [200] * 10 and page == 200


def test_page_is_self_contained(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="question"' in page.text and "<script src" not in page.text and "<link" not in page.text
    assert ".innerHTML" not in page.text  # model and corpus text only ever goes in as text


def test_answer_comes_with_its_evidence(client):
    reply = client.post("/ask", json={"question": "  What is the capital of Japan?\n"}).json()
    assert reply["question"] == "What is the capital of Japan?" and reply["index_version"] == 1
    assert reply["answer"] and 0 < reply["score"] <= 1 + 1e-6
    assert len(reply["evidence"]) == TINY_QA.top_k
    assert sum(e["retrieval_prob"] for e in reply["evidence"]) == pytest.approx(1.0, rel=1e-5)
    assert sum(e["answer_prob"] for e in reply["evidence"]) == pytest.approx(reply["score"], rel=1e-5)
    for ev in reply["evidence"]:
        assert set(ev) == {"block_id", "doc_id", "title", "text", "retrieval_prob", "answer_prob", "answer_span"}
        if ev["answer_span"] is not None:
            assert normalize_answer(ev["text"][slice(*ev["answer_span"])]) == normalize_answer(reply["answer"])
    assert len(client.post("/ask", json={"question": "Where did Bach die?", "k": 2}).json()["evidence"]) == 2
    assert client.post("/ask", json={"question": "x" * MAX_QUESTION_CHARS}).status_code == 200


def test_search_returns_the_blocks_ask_reads_with_their_p_z_as_realm_search_prints_them(
    client, tiny_qa, monkeypatch, capsys
):
    question = "Where did Bach die?"
    found = client.post("/search", json={"query": f" {question} ", "k": 3}).json()
    assert found["query"] == question and found["index_version"] == 1 and len(found["hits"]) == 3
    evidence = client.post("/ask", json={"question": question, "k": 3}).json()["evidence"]
    assert [h["block_id"] for h in found["hits"]] == [e["block_id"] for e in evidence]
    assert [h["retrieval_prob"] for h in found["hits"]] == pytest.approx([e["retrieval_prob"] for e in evidence])
    assert sum(h["retrieval_prob"] for h in found["hits"]) == pytest.approx(1.0)
    assert len(client.post("/search", json={"query": question}).json()["hits"]) == TINY_QA.top_k

    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: TINY_QA_PRESET)
    capsys.readouterr()
    assert main(["search", question, "--index", str(index_dir), "--model", str(model_dir), "-k", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [set(hit) for hit in printed] == [set(hit) for hit in found["hits"]]
    assert [h["block_id"] for h in printed] == [h["block_id"] for h in found["hits"]]
    assert [h["retrieval_prob"] for h in printed] == pytest.approx([h["retrieval_prob"] for h in found["hits"]])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": " "}, "query: the query is empty (it has no letter or digit)"),
        ({"query": "q", "k": MAX_K + 1}, f"k: Input should be less than or equal to {MAX_K}"),
        ({"question": "q"}, "query: Field required; question: Extra inputs are not permitted"),
    ],
)
def test_bad_search_input_is_a_4xx_with_a_clear_message(client, body, message):
    response = client.post("/search", json=body)
    assert response.status_code == 422 and response.json()["detail"] == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"question": ""}, "question: the question is empty (it has no letter or digit)"),
        ({"question": " \n\t "}, "question: the question is empty (it has no letter or digit)"),
        # invisible: a zero-width space, a NUL, a byte-order mark with punctuation (answered on d1c3134)
        ({"question": "\u200b"}, "question: the question is empty (it has no letter or digit)"),
        ({"question": "\x00"}, "question: the question is empty (it has no letter or digit)"),
        ({"question": "\ufeff?\u2028"}, "question: the question is empty (it has no letter or digit)"),
        (
            {"question": "x" * (MAX_QUESTION_CHARS + 1)},
            f"question: String should have at most {MAX_QUESTION_CHARS} characters",
        ),
        ({"question": "q", "k": 0}, "k: Input should be greater than or equal to 1"),
        ({"question": "q", "k": MAX_K + 1}, f"k: Input should be less than or equal to {MAX_K}"),
        ({"question": "q", "k": "3"}, "k: Input should be a valid integer"),
        ({"question": "q", "k": 2.5}, "k: Input should be a valid integer"),
        ({"question": "q", "k": True}, "k: Input should be a valid integer"),
        ({}, "question: Field required"),
        ({"k": 3}, "question: Field required"),
        ({"question": 42}, "question: Input should be a valid string"),
        ({"question": None}, "question: Input should be a valid string"),
        ({"question": ["q"]}, "question: Input should be a valid string"),
        ({"question": "q", "top_k": 3}, "top_k: Extra inputs are not permitted"),
        (["q"], "body: Input should be a valid dictionary or object to extract fields from"),
        ("q", "body: Input should be a valid dictionary or object to extract fields from"),
    ],
)
def test_bad_input_is_a_4xx_with_a_clear_message(client, body, message):
    response = client.post("/ask", json=body)
    assert response.status_code == 422
    assert response.json()["detail"] == message


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "body: Field required"),
        (b"{not json", "body: not valid JSON (Expecting property name enclosed in double quotes at character 1)"),
        (b"\xff\xfe", "body: not valid JSON (Expecting value at character 0)"),
    ],
)
def test_unreadable_bodies_are_a_4xx_too(client, content, message):
    response = client.post("/ask", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"] == message
    form = client.post("/ask", content=b"question=q", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415 and form.json()["detail"] == "body: send JSON (Content-Type: application/json)"


def same_answer(batched: dict, alone: dict) -> bool:
    """Equal but for the last bits of the scores: a batch pads and buckets its rows differently (bf16)."""
    ids = lambda reply: [(e["block_id"], e["answer_span"]) for e in reply["evidence"]]  # noqa: E731
    return (
        batched["answer"] == alone["answer"]
        and ids(batched) == ids(alone)
        and batched["score"] == pytest.approx(alone["score"], rel=0.02, abs=1e-3)
    )


def test_simultaneous_requests_are_read_in_batches_and_get_the_answers_they_get_alone(qa_service):
    """Requests run in uvicorn's thread pool; one worker reads them in micro-batches, so inference is never
    interleaved, and every reply is its own question's (k differing within a batch too)."""
    active, most = 0, 0
    guard = threading.Lock()
    read = qa_service.answerer.read

    def counted_read(*args, **kwargs):
        nonlocal active, most
        with guard:
            active += 1
            most = max(most, active)
        try:
            return read(*args, **kwargs)
        finally:
            with guard:
                active -= 1

    qa_service.answerer.read = counted_read
    asks = [(q, 1 + n % TINY_QA.top_k) for n, q in enumerate(QUESTIONS * 2)]
    with serving(create_app(qa_service)) as url, httpx.Client(base_url=url, timeout=120) as http:
        alone = {(q, k): http.post("/ask", json={"question": q, "k": k}).json() for q, k in asks}
        assert qa_service.batcher.batch_sizes == {1: len(asks)}
        start = threading.Barrier(len(asks))

        def ask(question_k: tuple[str, int]) -> httpx.Response:
            start.wait()  # all threads send together
            return http.post("/ask", json={"question": question_k[0], "k": question_k[1]})

        with ThreadPoolExecutor(len(asks)) as pool:
            replies = list(pool.map(ask, asks))
    assert [r.status_code for r in replies] == [200] * len(replies)
    for reply, asked in zip(replies, asks):
        assert same_answer(reply.json(), alone[asked]), asked
    assert most == 1
    batched = qa_service.batcher.batch_sizes - Counter({1: len(asks)})
    assert max(batched) > 1 and sum(size * count for size, count in batched.items()) == len(asks)


def test_one_question_at_a_time_when_the_batch_size_is_1(tiny_qa):
    model_dir, index_dir = tiny_qa
    service = QAService.load(str(model_dir), index_dir, TINY_QA_PRESET, batch_size=1)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(service.ask, QUESTIONS))
    assert [r["question"] for r in replies] == QUESTIONS and service.batcher.batch_sizes == {1: len(QUESTIONS)}


@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_a_published_version_is_served_from_the_next_request(tmp_path, tiny_qa, retriever):
    model_dir, index_dir = tiny_qa
    service = QAService.load(str(model_dir), index_dir, TINY_QA_PRESET, retriever)
    client = TestClient(create_app(service))
    before = client.get("/health").json()
    docs = tmp_path / "everest.jsonl"
    docs.write_text(json.dumps(EVEREST) + "\n")
    added = add_documents(MipsIndex(index_dir), str(docs), service.answerer.model.retriever, TINY_EMBED, 2)

    assert client.get("/health").json() == {**before, "latest_version": added.version}  # requests swap
    reply = client.post("/ask", json={"question": "How high is Mount Everest?", "k": MAX_K}).json()
    assert reply["index_version"] == added.version == before["index_version"] + 1
    assert "everest" in {e["doc_id"] for e in reply["evidence"]}
    assert client.get("/health").json() == {
        **before,
        "index_version": added.version,
        "latest_version": added.version,
        "num_blocks": added.live_blocks,
    }

    removed = remove_documents(MipsIndex(index_dir), ["everest"], 2)
    reply = client.post("/ask", json={"question": "How high is Mount Everest?", "k": MAX_K}).json()
    assert reply["index_version"] == removed.version
    assert "everest" not in {e["doc_id"] for e in reply["evidence"]}
    assert client.get("/health").json()["num_blocks"] == before["num_blocks"]


def test_a_version_it_cannot_serve_leaves_the_current_one_answering(tiny_qa, tiny_corpus, caplog):
    """An index rebuilt by another document tower: the service keeps the version it has, and says so once."""
    model_dir, index_dir = tiny_qa
    service = QAService.load(str(model_dir), index_dir, TINY_QA_PRESET)
    client = TestClient(create_app(service))
    other = Retriever.load("random", dataclasses.replace(TINY_QA_PRESET.retriever, pooling="cls"))
    build_from_retriever(other, tiny_corpus, index_dir, TINY_EMBED, IndexConfig(), 0, 0.0, replace_model=True)
    for _ in range(2):
        response = client.post("/ask", json={"question": "Where did Bach die?"})
        assert response.status_code == 200 and response.json()["index_version"] == 1
    assert sum("cannot serve v2" in r.getMessage() for r in caplog.records) == 1
    health = client.get("/health").json()
    assert (health["status"], health["index_version"], health["latest_version"]) == ("degraded", 1, 2)
    assert "cannot serve v2" in health["reason"] and "document tower" in health["reason"]


def test_serve_command_binds_to_this_machine_by_default(tiny_qa, tiny_corpus, monkeypatch):
    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: TINY_QA_PRESET)
    started = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: started.update(app=app, **kwargs))
    assert main(["serve", "--model", str(model_dir), "--index", str(index_dir), "--top-k", "2", "--quiet"]) == 0
    assert isinstance(started["app"], FastAPI) and (started["host"], started["port"]) == ("127.0.0.1", 8000)
    health = TestClient(started["app"]).get("/health").json()
    assert (health["k"], health["retriever"], health["num_blocks"]) == (2, "dense", len(tiny_corpus))
