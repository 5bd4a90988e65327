"""The web page in a real headless Chromium: ask, see the answer and its highlighted evidence, see the API's
errors, and corpus text shown as text (never run as HTML). Skipped without Chromium and chromedriver, unless
REALM_REQUIRE_BROWSER=1 (CI), where that is a failure."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest
from conftest import TINY_EMBED, serving
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from realm.index.mips import MipsIndex
from realm.index.update import add_documents
from realm.serve.service import MAX_K, create_app

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_SECONDS = 60
MARKUP = '<img src="x" onerror="window.pwned = 1">'
TRAP = {"id": "trap", "title": f"Trap {MARKUP}", "text": f"The trap block holds {MARKUP} and <b>bold</b> text."}


@pytest.fixture
def browser(tmp_path) -> Iterator[webdriver.Chrome]:
    chromium, driver = (
        shutil.which("chromium") or "/usr/bin/chromium",
        shutil.which("chromedriver") or "/usr/bin/chromedriver",
    )
    if not (os.path.exists(chromium) and os.path.exists(driver)):
        message = "needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        if os.environ.get("REALM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REALM_REQUIRE_BROWSER=1: {message}")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def _ask(browser: webdriver.Chrome, question: str, k: int | None = None) -> None:
    field = browser.find_element(By.ID, "question")
    field.clear()
    field.send_keys(question)
    browser.find_element(By.ID, "k").clear()
    if k is not None:
        browser.find_element(By.ID, "k").send_keys(str(k))
    browser.find_element(By.ID, "ask-button").click()


def _shown(browser: webdriver.Chrome, element_id: str) -> None:
    WebDriverWait(browser, WAIT_SECONDS).until(lambda b: b.find_element(By.ID, element_id).is_displayed())


def test_page_shows_answer_evidence_highlights_and_errors(browser, qa_service):
    question = "What is the capital of Japan?"
    expected = qa_service.ask(question)
    with serving(create_app(qa_service)) as url:
        browser.get(url)
        _ask(browser, question)
        _shown(browser, "result")
        assert browser.find_element(By.ID, "answer").text == (expected["answer"] or "(no answer)")
        assert browser.find_element(By.ID, "score").text == f"p = {expected['score']:.3f}"
        items = browser.find_elements(By.CSS_SELECTOR, "#evidence > li")
        assert len(items) == len(expected["evidence"])
        for item, ev in zip(items, expected["evidence"]):
            assert item.find_element(By.TAG_NAME, "h3").text == ev["title"]
            assert f"p(z|x) = {ev['retrieval_prob']:.3f}" in item.text
            assert f"share of the answer = {ev['answer_prob']:.3f}" in item.text
            marks = [m.text for m in item.find_elements(By.TAG_NAME, "mark")]
            assert marks == ([ev["text"][slice(*ev["answer_span"])]] if ev["answer_span"] else [])
        assert any(ev["answer_span"] for ev in expected["evidence"])  # a highlight was checked

        browser.find_element(By.ID, "question").clear()
        browser.find_element(By.ID, "question").send_keys(" ", Keys.ENTER)  # Enter submits too
        _shown(browser, "error")
        assert (
            browser.find_element(By.ID, "error").text == "question: the question is empty (it has no letter or digit)"
        )
        assert not browser.find_element(By.ID, "result").is_displayed()


def test_corpus_markup_is_shown_as_text(browser, qa_service, tmp_path):
    """A document holding HTML, added to the live index: the page prints it and runs nothing."""
    docs = tmp_path / "trap.jsonl"
    docs.write_text(json.dumps(TRAP) + "\n")
    add_documents(MipsIndex(qa_service.index_dir), str(docs), qa_service.answerer.model.retriever, TINY_EMBED, 2)
    with serving(create_app(qa_service)) as url:
        browser.get(url)
        _ask(browser, "What does the trap hold?", k=MAX_K)  # every block of the tiny corpus
        _shown(browser, "result")
        titles = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#evidence h3")]
        assert TRAP["title"] in titles
        assert browser.find_elements(By.CSS_SELECTOR, "#result img, #result b") == []
        assert browser.execute_script("return window.pwned") is None
