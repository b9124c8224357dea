"""A small typed client for the SGLang HTTP endpoints the gates read.

Endpoints and shapes are SGLang 0.5.x's (`srt/entrypoints/http_server.py`): `/health` and
`/health_generate` answer 200 or 503 with no body, `/get_server_info` is the resolved
`ServerArgs` as a dict (plus `internal_states` and `version`), `/generate` returns `text`,
`output_ids` and `meta_info` (`completion_tokens`, and with speculative decoding
`spec_verify_ct` and `spec_accept_length` = completion_tokens / spec_verify_ct).

The API key travels only in the `Authorization: Bearer` header; it is never logged, and error
sentences name the URL path, never headers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.errors import BadResponse, ServiceUnreachable
from ddtree_deploy.validate.scoring import TokenScore


@dataclass(frozen=True)
class Completion:
    """One `/generate` answer at temperature 0, with the client's wall-clock time for it."""

    output_ids: tuple[int, ...]
    text: str
    completion_tokens: int
    verify_ct: int | None  # verify passes (None: the server does not speculate)
    accept_length: float | None  # completion tokens per verify pass, bonus token included
    wall_s: float


class SglangClient:
    """Talks to one SGLang server; use as a context manager (it holds a connection pool)."""

    def __init__(self, base_url: str, *, api_key: Secret | None, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {api_key.reveal()}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self._prompt_ids: dict[str, list[int]] = {}  # score(): each prompt's ids, asked once

    def __enter__(self) -> SglangClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> int:
        """HTTP status of `/health` (200 once the server is up)."""
        return self._request("GET", "/health").status_code

    def health_generate(self) -> int:
        """HTTP status of `/health_generate` (200 after the server generated one token)."""
        return self._request("GET", "/health_generate").status_code

    def server_info(self) -> dict[str, Any]:
        return self._json("GET", "/get_server_info")

    def model_info(self) -> dict[str, Any]:
        return self._json("GET", "/get_model_info")

    def models(self) -> list[str]:
        """Ids of the served models (`/v1/models`)."""
        data = self._json("GET", "/v1/models").get("data")
        if not isinstance(data, list):
            raise BadResponse(f"{self.base_url}/v1/models has no `data` list.")
        return [str(card.get("id")) for card in data if isinstance(card, dict)]

    def generate(self, text: str, max_new_tokens: int) -> Completion:
        """Greedy completion of `text`; raises `BadResponse` if `meta_info` is malformed."""
        payload = {
            "text": text,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
            },
        }
        start = time.perf_counter()
        body = self._json("POST", "/generate", json=payload)
        wall_s = time.perf_counter() - start
        return _completion(body, wall_s, self.base_url)

    def score(self, text: str, continuation: Sequence[int]) -> tuple[TokenScore, ...]:
        """The target's prefill scores of `continuation` after the prompt `text`.

        Prompt-scoring requests (`max_new_tokens: 0`, so the target only runs its prefill): the
        prompt alone, once per prompt and client, for the token ids the server gives it (so the
        scored text is exactly what `generate` saw), then those ids plus `continuation` with
        each position's log-prob and top two from the last prompt token on. (SGLang reports
        the vocabulary's last id as 0; a prompt holding that very token would be re-sent
        altered. Real vocabularies pad past their last used id.)
        """
        if not continuation:
            return ()
        prompt_ids = self._prompt_ids.get(text) or self._ids_of(text)
        wanted = [*prompt_ids, *(int(t) for t in continuation)]
        request = {
            "input_ids": wanted,
            "logprob_start_len": len(prompt_ids) - 1,
            "top_logprobs_num": 2,
        }
        meta = self._scoring_meta(request)
        # One entry per token from logprob_start_len on, the first without a log-prob: the
        # continuation is the rest, in order.
        tokens = meta.get("input_token_logprobs") or []
        tops = meta.get("input_top_logprobs") or []
        n = len(continuation)
        if len(tokens) != n + 1 or len(tops) != n + 1:
            raise BadResponse(
                f"{self.base_url}/generate scored {len(tokens) - 1} positions of a "
                f"{n}-token continuation."
            )
        scores = []
        for i, (want, entry, top) in enumerate(
            zip(continuation, tokens[1:], tops[1:], strict=True)
        ):
            # SGLang reports the vocabulary's last id as 0 here (a clip meant for multimodal
            # hash ids), so 0 stands for the token that was sent; any other id is a misalignment.
            if entry[0] is None or not top or int(entry[1]) not in (int(want), 0):
                raise BadResponse(
                    f"{self.base_url}/generate scored token {entry[1]} at continuation "
                    f"position {i}, where it was sent {want}."
                )
            ranked = sorted(((float(t[0]), int(t[1])) for t in top), reverse=True)
            scores.append(
                TokenScore(
                    token=int(want),
                    logprob=float(entry[0]),
                    top_token=ranked[0][1],
                    top_logprob=ranked[0][0],
                    second_logprob=ranked[1][0] if len(ranked) > 1 else None,
                )
            )
        return tuple(scores)

    def _ids_of(self, text: str) -> list[int]:
        """The token ids the server gives the prompt `text` (a scoring request of it alone)."""
        entries = self._scoring_meta({"text": text, "logprob_start_len": 0}).get(
            "input_token_logprobs"
        )
        if not entries:
            raise BadResponse(f"{self.base_url}/generate scored no prompt tokens.")
        self._prompt_ids[text] = [int(entry[1]) for entry in entries]
        return self._prompt_ids[text]

    def _scoring_meta(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`meta_info` of a prompt-scoring request (no new tokens, log-probs returned)."""
        payload = {
            **fields,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 0},
            "return_logprob": True,
        }
        meta = self._json("POST", "/generate", json=payload).get("meta_info")
        if not isinstance(meta, dict):
            raise BadResponse(
                f"{self.base_url}/generate answered a scoring request without `meta_info`."
            )
        return meta

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        if response.status_code != 200:
            raise BadResponse(
                f"{self.base_url}{path} answered HTTP {response.status_code}: "
                f"{response.text.strip()[:200] or 'no body'}."
            )
        try:
            body = response.json()
        except ValueError as err:
            raise BadResponse(f"{self.base_url}{path} did not answer JSON.") from err
        if not isinstance(body, dict):
            raise BadResponse(f"{self.base_url}{path} did not answer a JSON object.")
        return body

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise ServiceUnreachable(
                f"{self.base_url}{path} did not answer ({type(err).__name__})."
            ) from err


def _completion(body: dict[str, Any], wall_s: float, where: str) -> Completion:
    meta = body.get("meta_info")
    ids = body.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(ids, list):
        raise BadResponse(f"{where}/generate answered without `output_ids` and `meta_info`.")
    tokens = int(meta.get("completion_tokens", len(ids)))
    verify_ct = meta.get("spec_verify_ct")
    accept = meta.get("spec_accept_length")
    return Completion(
        output_ids=tuple(int(i) for i in ids),
        text=str(body.get("text", "")),
        completion_tokens=tokens,
        verify_ct=int(verify_ct) if verify_ct else None,
        accept_length=float(accept) if accept is not None else None,
        wall_s=wall_s,
    )
