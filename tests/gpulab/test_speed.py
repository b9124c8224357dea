"""The overhead table's timed passes (speed.py) against a stand-in for SGLang's /generate.

TEST DOUBLE: a local HTTP server answering /generate with SGLang's meta_info fields after a short
sleep; the real servers answer it on the GPU machine (run.py --overhead)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from gpulab.speed import pass_requests, timed_pass

ANSWER_S = 0.05


class _Generate(BaseHTTPRequestHandler):
    """Answers `max_new_tokens` tokens in max_new_tokens / 4 verify steps; 401 without the key."""

    in_flight = 0
    most_in_flight = 0
    bodies: ClassVar[list[dict[str, object]]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Bearer k":
            self.send_response(401)
            self.end_headers()
            return
        cls = type(self)
        with cls.lock:
            cls.bodies.append(body)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        time.sleep(ANSWER_S)
        with cls.lock:
            cls.in_flight -= 1
        tokens = body["sampling_params"]["max_new_tokens"]
        answer = json.dumps({"text": "x", "meta_info": {"completion_tokens": tokens,
                                                         "spec_verify_ct": tokens // 4}})  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Generate.in_flight = _Generate.most_in_flight = 0
    _Generate.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Generate)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


PROMPTS = [{"text": "a", "max_new_tokens": 40}, {"text": "b", "max_new_tokens": 80}]


def test_a_pass_answers_its_requests_level_at_a_time_and_counts_the_servers_steps(
    server: str,
) -> None:
    got = timed_pass(server, PROMPTS, level=3, requests=7, headers={"Authorization": "Bearer k"})
    assert _Generate.most_in_flight == 3
    texts = [b["text"] for b in _Generate.bodies]
    assert sorted(texts) == sorted(["a", "b", "a", "b", "a", "b", "a"])  # the prompts in turn
    assert got["requests"] == 7
    assert got["tokens"] == 4 * 40 + 3 * 80
    assert got["accept_length"] == 4.0  # tokens over the server's verify steps
    assert got["tokens_per_s"] == pytest.approx(got["tokens"] / got["wall_s"], rel=0.01)
    assert got["wall_s"] >= 3 * ANSWER_S  # three waves
    assert got["step_ms"] >= 1000 * ANSWER_S / 20  # an answer's time over its steps
    params = _Generate.bodies[0]["sampling_params"]
    assert params["temperature"] == 0
    assert params["ignore_eos"] is True


def test_passes_last_about_the_time_asked_at_dflash_s_speed_in_whole_waves() -> None:
    warm = {"tokens_per_s": 100.0}
    assert pass_requests(1, 6.0, warm, 160) == 4  # 1.6 s an answer
    assert pass_requests(8, 6.0, warm, 160) == 8  # a wave is 12.8 s: never less than one
    assert pass_requests(8, 6.0, {"tokens_per_s": 1000.0}, 160) == 40  # five 1.28 s waves
    assert pass_requests(8, 6.0, {"tokens_per_s": None}, 160) == 8


def test_a_refused_request_fails_the_pass(server: str) -> None:
    with pytest.raises(httpx.HTTPStatusError):
        timed_pass(server, PROMPTS, level=1, requests=1)


def test_a_pass_needs_prompts(server: str) -> None:
    with pytest.raises(ValueError, match="at least one prompt"):
        timed_pass(server, [], level=1, requests=1)
