"""The HTTP server: stdlib ThreadingHTTPServer, one thread per connection, one batching worker for the model.

Routes: POST /v1/completions (fastscore.serve.openai_api), POST /v1/score (fastscore.serve.score_api), GET /health,
GET /v1/models. Errors are JSON in OpenAI's shape, {"error": {"message", "type", "code"}}, with the status saying
who must act: 400 a bad request, 404/405 a wrong route, 411/413 a missing length or a request over the limits
(body bytes, prompts or candidates per request), 503 a full queue (with Retry-After), 504 a request not answered
within the timeout, 500 anything else.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fastscore.errors import FastscoreError, RequestError, RequestTooLargeError, ServerBusyError
from fastscore.serve import openai_api, score_api
from fastscore.serve.batching import SETS, TOKENS, BatchingQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_items: int = 256  # prompts of a completions request, candidates of a score request
    max_waiting: int = 64  # requests queued for the model beyond the batch in hand
    batch_window_s: float = 0.005  # how long the worker waits for more requests to join a batch
    timeout_s: float = 600.0  # a request not answered by then gets 504


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


class ScoringServer(ThreadingHTTPServer):
    daemon_threads = True  # a client that hangs up mid-request never keeps the process alive
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops connections when many clients start at once)

    def __init__(self, address: tuple[str, int], scorer, model_name: str, limits: Limits = Limits()) -> None:
        self.scorer, self.model_name, self.limits = scorer, model_name, limits
        self.batcher = BatchingQueue(scorer, max_waiting=limits.max_waiting, window_s=limits.batch_window_s)
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, benchmarks); stop with close()."""
        thread = threading.Thread(target=self.serve_forever, name="fastscore-serve", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop accepting, stop the worker and close the socket (the scorer stays the caller's to close)."""
        self.shutdown()
        self.batcher.close()
        self.server_close()

    # --- the routes' work, given parsed JSON ---

    def _wait(self, kind: str, items: list) -> list:
        if not items:
            return []
        future = self.batcher.submit(kind, items)
        try:
            return future.result(timeout=self.limits.timeout_s)
        except FutureTimeout:
            future.cancel()
            raise _HTTPError(HTTPStatus.GATEWAY_TIMEOUT, f"not scored within {self.limits.timeout_s:g} s",
                             "timeout") from None

    def completions(self, body: Any) -> dict:
        tokenizer = self.scorer.tokenizer
        call = openai_api.parse_completions(body, tokenizer, self.scorer.backend.n_vocab, self.limits.max_items)
        scores = self._wait(TOKENS, call.token_requests())
        return openai_api.completions_response(call, scores, self.model_name, tokenizer.decode_piece)

    def score(self, body: Any) -> Any:
        call = score_api.parse_score(body, self.limits.max_items)
        return score_api.score_response(call, self._wait(SETS, call.candidate_sets()))

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "fastscore"}]}

    def health(self) -> dict:
        calls = list(self.batcher.stats.jobs_per_call)
        return {"status": "ok", "model": self.model_name, "backend": self.scorer.backend.name,
                "weights": self.scorer.weights_note,
                "batches": {"calls": len(calls), "requests": sum(calls), "largest": max(calls, default=0),
                            "refused": self.batcher.stats.refused}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the openai client reuses its connections
    server: ScoringServer
    timeout = 60  # seconds a client may take to send its request

    POST_ROUTES: dict[str, Callable[[ScoringServer, Any], Any]] = {
        "/v1/completions": ScoringServer.completions,
        "/v1/score": ScoringServer.score,
    }
    GET_ROUTES: dict[str, Callable[[ScoringServer], Any]] = {
        "/health": ScoringServer.health,
        "/v1/models": ScoringServer.models,
    }

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's signature)
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
        route = self.GET_ROUTES.get(self.path.split("?")[0])
        if route is None:
            self._fail(_HTTPError(HTTPStatus.NOT_FOUND, f"no route GET {self.path}", "not_found"))
            return
        self._send(HTTPStatus.OK, route(self.server))

    def do_POST(self) -> None:  # noqa: N802
        try:
            route = self.POST_ROUTES.get(self.path.split("?")[0])
            if route is None:
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no route POST {self.path}", "not_found")
            self._send(HTTPStatus.OK, route(self.server, self._body()))
        except _HTTPError as exc:
            self._fail(exc)
        except ServerBusyError as exc:
            self._fail(_HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), "overloaded", {"Retry-After": "1"}))
        except RequestTooLargeError as exc:
            self._fail(_HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc), "request_too_large"))
        except RequestError as exc:
            self._fail(_HTTPError(HTTPStatus.BAD_REQUEST, str(exc), "invalid_request_error"))
        except FastscoreError as exc:
            log.error("request failed: %s", exc)
            self._fail(_HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc), "server_error"))
        except Exception as exc:  # noqa: BLE001  (the server answers and goes on; the traceback is logged)
            log.exception("request failed")
            self._fail(_HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {exc}", "server_error"))

    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise _HTTPError(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length header", "length_required")
        limit = self.server.limits.max_body_bytes
        if int(length) > limit:
            self.close_connection = True  # the unread body must not be taken for the next request
            raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                             f"the body is {int(length)} bytes; at most {limit} are accepted", "request_too_large")
        data = self.rfile.read(int(length))
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise RequestError(f"the body is not valid JSON ({exc})") from None

    def _fail(self, error: _HTTPError) -> None:
        body = {"error": {"message": str(error), "type": error.kind, "code": int(error.status)}}
        self._send(error.status, body, error.headers)

    def _send(self, status: HTTPStatus, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
