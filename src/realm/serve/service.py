"""`realm serve`: an HTTP service and a web page that answer questions with the evidence behind them.

The model is loaded once. Concurrent `/ask` requests (FastAPI runs sync endpoints in a thread pool) are
micro-batched: what arrives within `batch_wait_ms` of the first, up to `batch_size`, is searched and read as
one batch by a single worker thread; `/search` (retrieval only) is batched the same way by its own worker, and
one lock keeps the two from running the model at once. Every batch first checks the index folder's CURRENT
version (a tiny file read); when another process published a new one (`realm index add|remove`, a rebuild), the
searcher is rebuilt over it and the model is kept.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from realm.common.text import visible_text
from realm.config import SERVE_BATCH_SIZE, SERVE_BATCH_WAIT_MS, Preset
from realm.eval.answerer import Answerer, load_answerer
from realm.index.mips import MipsIndex, MipsIndexError, current_version
from realm.index.search import Searcher, hits_json, open_searcher
from realm.serve.batching import MicroBatcher
from realm.serve.bounds import BoundedRequests, ServiceLimits, has_key

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 1000  # longer input is not a question; the query tower reads only its first tokens anyway
MAX_K = 20  # blocks read per question: the reader's cost grows linearly with k


def _not_blank(what: str) -> AfterValidator:
    def visible(text: str) -> str:
        if not (kept := visible_text(text)):
            raise PydanticCustomError(f"blank_{what}", f"the {what} is empty (it has no letter or digit)")
        return kept

    return AfterValidator(visible)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/'\"]+/)*([^\s/'\"]+)")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last part (`<anywhere>/runs/x/qa/best` -> `.../best`)."""
    return _ABSOLUTE_PATH.sub(r".../\1", text)


class AskRequest(BaseModel):
    """Strict types: a number is not a question, and "3" or true is not a k."""

    model_config = ConfigDict(extra="forbid", strict=True)
    question: Annotated[str, Field(max_length=MAX_QUESTION_CHARS), _not_blank("question")]
    k: Annotated[int | None, Field(ge=1, le=MAX_K)] = None


class SearchRequest(BaseModel):
    """`/search`: retrieval only, with the bounds of `/ask`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: Annotated[str, Field(max_length=MAX_QUESTION_CHARS), _not_blank("query")]
    k: Annotated[int | None, Field(ge=1, le=MAX_K)] = None


@dataclass(frozen=True)
class Knowledge:
    """A searcher over one index version, replaced as a whole so that /health never sees a half-made swap."""

    version: int
    searcher: Searcher

    @property
    def num_blocks(self) -> int:
        return len(self.searcher.store.live_ids)


class QAService:
    """An Answerer whose searcher follows the index folder's CURRENT version; concurrent questions (and
    searches) are answered in micro-batches, one batch at a time (`batch_size=1`: one question at a time)."""

    def __init__(
        self,
        answerer: Answerer,
        index_dir: str | Path,
        version: int,
        model_spec: str,
        retriever: str,
        corpus: str | Path | None = None,
        batch_size: int = SERVE_BATCH_SIZE,
        batch_wait_ms: int = SERVE_BATCH_WAIT_MS,
    ):
        self.answerer = answerer  # the model and reader; the live searcher is `self.knowledge.searcher`
        self.index_dir = Path(index_dir)
        self.model_spec = model_spec
        self.retriever = retriever
        self.corpus = corpus
        self.knowledge = Knowledge(version, answerer.searcher)
        self._unservable: int | None = None  # a published version that failed to load: not retried
        self._unservable_reason = ""
        self._lock = threading.RLock()
        self.batcher = MicroBatcher(self._answer_batch, batch_size, batch_wait_ms / 1000)
        self.search_batcher = MicroBatcher(self._search_batch, batch_size, batch_wait_ms / 1000)

    @classmethod
    def load(
        cls,
        model_spec: str,
        index_dir: str | Path,
        preset: Preset,
        retriever: str = "dense",
        k: int | None = None,
        corpus: str | Path | None = None,
        batch_size: int = SERVE_BATCH_SIZE,
        batch_wait_ms: int = SERVE_BATCH_WAIT_MS,
    ) -> QAService:
        """The version is read before loading: if a newer one lands meanwhile, the first request swaps to it."""
        version = current_version(Path(index_dir))
        if version is None:
            raise MipsIndexError(f"{index_dir}: no published index (no CURRENT); build one with `realm index build`")
        answerer = load_answerer(model_spec, index_dir, preset, retriever, k, corpus, version)
        return cls(answerer, index_dir, version, model_spec, retriever, corpus, batch_size, batch_wait_ms)

    def refresh(self) -> None:
        """Swap to the published version if it changed. One that cannot be served (unreadable, pruned meanwhile,
        built by another document tower) is logged once and the current one kept: stale answers beat none."""
        with self._lock:
            try:
                version = current_version(self.index_dir)
            except (OSError, ValueError, MipsIndexError) as err:
                log.warning(
                    "index %s: unreadable CURRENT (%s); keeping v%d", self.index_dir, err, self.knowledge.version
                )
                return
            if version in (None, self.knowledge.version, self._unservable):
                return
            try:
                index, model = MipsIndex(self.index_dir, version), self.answerer.model
                searcher = open_searcher(
                    index, self.retriever, model.retriever, model.fusion_weight, index.corpus(self.corpus)
                )
            except (MipsIndexError, OSError, ValueError) as err:
                log.warning(
                    "index %s: cannot serve v%d (%s); keeping v%d", self.index_dir, version, err, self.knowledge.version
                )
                self._unservable, self._unservable_reason = version, str(err)
                return
            self.knowledge = Knowledge(version, searcher)
            log.info("index %s: now serving v%d (%d blocks)", self.index_dir, version, self.knowledge.num_blocks)

    def ask(self, question: str, k: int | None = None) -> dict:
        """The answer with its evidence, from the latest servable index version (named in the reply)."""
        return self.batcher.submit((question, k or self.answerer.k))

    def _answer_batch(self, requests: Sequence[tuple[str, int]]) -> list[dict]:
        """One search for the batch at its largest k (a smaller k takes the first hits: they are sorted), one
        read of every (question, block) pair."""
        with self._lock:
            self.refresh()
            questions = [question for question, _ in requests]
            hits = self.knowledge.searcher.batch_search(questions, max(k for _, k in requests))
            answers = self.answerer.read(questions, [row[:k] for row, (_, k) in zip(hits, requests)])
            version = self.knowledge.version
        warning = {"warning": self.answerer.warning} if self.answerer.warning else {}
        return [{**answer.to_dict(), "index_version": version, **warning} for answer in answers]

    def search(self, query: str, k: int | None = None) -> dict:
        """The top k blocks with p(z | x), as `realm search --json` prints them, from the latest servable version."""
        return self.search_batcher.submit((query, k or self.answerer.k))

    def _search_batch(self, requests: Sequence[tuple[str, int]]) -> list[dict]:
        with self._lock:  # the query tower is not run beside the reader's batch
            self.refresh()
            searcher, version = self.knowledge.searcher, self.knowledge.version
            hits = searcher.batch_search([query for query, _ in requests], max(k for _, k in requests))
        return [
            {"query": query, "index_version": version, "hits": hits_json(row[:k], searcher.scores_are_retrieval_logits)}
            for row, (query, k) in zip(hits, requests)
        ]

    def health(self, paths: bool = False) -> dict:
        """Lock-free and cheap (one tiny file read), so that it answers while questions are being read.
        "degraded", with the reason, when the index pointer is unreadable or missing, or when the published
        version cannot be served (the service answers from the one it has); a newer servable version is loaded
        by the next request ("ok"). Absolute paths are shown only with `paths` (a request with the API key)."""
        knowledge = self.knowledge
        reason = None
        try:
            latest = current_version(self.index_dir)
        except (OSError, ValueError, MipsIndexError) as err:
            latest, reason = None, f"the index pointer is unreadable ({err})"
        if reason is None and latest is None:
            reason = f"{self.index_dir} has no published version (its CURRENT is gone)"
        if latest is not None and latest != knowledge.version and latest == self._unservable:
            reason = f"cannot serve v{latest}: {self._unservable_reason}"
        report = {
            "status": "degraded" if reason else "ok",
            **({"reason": f"{reason}; answering from v{knowledge.version}"} if reason else {}),
            **({"warning": self.answerer.warning} if self.answerer.warning else {}),
            "index_version": knowledge.version,
            "latest_version": latest,
            "num_blocks": knowledge.num_blocks,
            "model": self.model_spec,
            "retriever": self.retriever,
            "k": self.answerer.k,
            "batch_size": self.batcher.max_batch,
        }
        return report if paths else {k: without_paths(v) if isinstance(v, str) else v for k, v in report.items()}


def _message(err: RequestValidationError) -> str:
    """One readable line per problem, e.g. `question: the question is empty`."""
    parts = []
    for error in err.errors():
        if error["type"] == "json_invalid":  # its loc holds a character position, not a field
            parts.append(f"body: not valid JSON ({error['ctx']['error']} at character {error['loc'][-1]})")
        else:
            parts.append(f"{'.'.join(str(p) for p in error['loc'][1:]) or 'body'}: {error['msg']}")
    return "; ".join(parts)


def create_app(service: QAService, api_key: str | None = None, limits: ServiceLimits | None = None) -> FastAPI:
    """The HTTP API over a loaded service, and the page that uses it, behind the request bounds. With `api_key`,
    everything but the page and `/health` wants `Authorization: Bearer <api_key>` (checked by the bounds, before
    anything is held). No /docs or /redoc: they load scripts from a CDN."""
    app = FastAPI(
        title="realm", summary="Open-domain questions answered with retrieved evidence", docs_url=None, redoc_url=None
    )
    app.add_middleware(BoundedRequests, limits=limits or ServiceLimits(), api_key=api_key)
    page = (files("realm.serve") / "web" / "index.html").read_text(encoding="utf-8")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        """A clear message in `detail`, which the page shows as it is."""
        if request.method == "POST" and "json" not in request.headers.get("content-type", ""):
            return JSONResponse({"detail": "body: send JSON (Content-Type: application/json)"}, status_code=415)
        return JSONResponse({"detail": _message(err)}, status_code=422)

    # `/` and `/health` run on the event loop, not in the thread pool the questions wait in: they answer at once.
    @app.get("/", response_class=HTMLResponse)
    async def index_page() -> str:
        return page

    @app.get("/health")
    async def health(request: Request) -> dict:
        return service.health(paths=api_key is not None and has_key(request.headers.raw, api_key))

    @app.post("/ask")
    def ask(request: AskRequest) -> dict:
        return service.ask(request.question, request.k)

    @app.post("/search")
    def search(request: SearchRequest) -> dict:
        return service.search(request.query, request.k)

    return app
