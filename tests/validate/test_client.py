"""The SGLang client and the measurement against the stand-in server running on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ddtree_deploy.config import compose_config
from ddtree_deploy.config.schema import PromptConfig
from ddtree_deploy.service.secret import Secret
from ddtree_deploy.validate.client import SglangClient
from ddtree_deploy.validate.errors import BadResponse, ServiceUnreachable
from ddtree_deploy.validate.gates import Outcome, judge_shadow, judge_tree
from ddtree_deploy.validate.measure import measure, score_answers
from ddtree_deploy.validate.probes import Expected
from ddtree_deploy.validate.scoring import TieRule
from validate.conftest import API_KEY, LocalStandin, start_local_standin

PROMPTS = [
    PromptConfig(
        name="chat", kind="chat", text="Hello there, how are you today?", max_new_tokens=48
    ),
    PromptConfig(name="json", kind="json", text='Return {"a": 1} as JSON.', max_new_tokens=48),
]


def client(server: LocalStandin, key: str | None = API_KEY) -> SglangClient:
    return SglangClient(server.url, api_key=Secret(key) if key else None, timeout_s=60)


def test_client_reads_health_info_models_and_generates_with_spec_fields(
    local_standin: LocalStandin,
) -> None:
    with client(local_standin) as sgl:
        assert sgl.health() == 200
        assert sgl.health_generate() == 200
        info = sgl.server_info()
        assert info["speculative_algorithm"] == "DDTREE"
        assert (info["speculative_ddtree_mode"], info["speculative_ddtree_topk"]) == ("tree", 4)
        assert info["version"] == "0.5.11"
        assert sgl.model_info()["is_generation"] is True
        assert sgl.models() == [info["served_model_name"]]
        answer = sgl.generate("Hello there", 40)
    assert answer.completion_tokens == len(answer.output_ids) == 40
    assert answer.verify_ct is not None and answer.accept_length == 40 / answer.verify_ct


def test_client_without_the_api_key_is_refused_in_one_sentence(
    local_standin: LocalStandin,
) -> None:
    with client(local_standin, key=None) as sgl:
        assert sgl.health() == 200  # SGLang leaves /health open
        with pytest.raises(BadResponse, match=r"/get_server_info answered HTTP 401"):
            sgl.server_info()


def test_client_reports_a_closed_port_as_unreachable() -> None:
    with (
        SglangClient("http://127.0.0.1:9", api_key=None, timeout_s=5) as sgl,
        pytest.raises(ServiceUnreachable, match=r"http://127.0.0.1:9/health did not answer"),
    ):
        sgl.health()


def test_expected_server_info_matches_the_tree_stand_in(local_standin: LocalStandin) -> None:
    cfg = compose_config(["algo=ddtree", "algo.topk=4"])
    with client(local_standin) as sgl:
        info = sgl.server_info()
    assert Expected.of(cfg).mismatches(info) == []
    linear = compose_config(["algo=dflash"])
    assert Expected.of(linear).mismatches(info) == [
        "speculative_algorithm='DDTREE' (asked for 'DFLASH')"
    ]


def test_expected_server_info_asks_for_the_wide_verify_width() -> None:
    """A budget past the block must come back as a verify width of budget + 1 (0.5.11)."""
    cfg = compose_config(["algo=ddtree", "algo.budget=63", "algo.topk=8"])
    info = {**Expected.of(cfg).fields, "speculative_num_draft_tokens": 16}
    assert Expected.of(cfg).mismatches(info) == ["speculative_num_draft_tokens=16 (asked for 64)"]
    shadow = Expected.of(compose_config(["algo=ddtree_shadow"])).fields
    assert shadow["speculative_num_draft_tokens"] == 16
    # A set that keeps the block width (no ddtree_max_budget) is not asked for one.
    other = Expected.of(compose_config(["algo=ddtree", "sglang.ddtree_max_budget=null"])).fields
    assert "speculative_num_draft_tokens" not in other
    # 0.5.19 to 0.5.23 widen too; their /server_info is resolved_dict(), where the width is a
    # flat field.
    for release in ("v0_5_19", "v0_5_20", "v0_5_21", "v0_5_22", "v0_5_23"):
        wide = Expected.of(compose_config([f"sglang={release}", "algo=ddtree", "algo.budget=31"]))
        assert wide.fields["speculative_num_draft_tokens"] == 32, release


def test_tree_stand_in_keeps_linear_tokens_and_is_faster(
    standin_root: tuple[Path, Path], local_standin: LocalStandin, tmp_path: Path
) -> None:
    """The stand-in's timing model makes the tree gate's decision deterministic: it passes."""
    linear = start_local_standin(standin_root[0], tmp_path, "--speculative-algorithm", "DFLASH")
    try:
        with client(linear) as sgl:
            baseline = measure(sgl, PROMPTS, label="linear", repeats=1, timeout_s=120)
    finally:
        linear.process.terminate()
        linear.process.wait(timeout=30)
    with client(local_standin) as sgl:
        tree = measure(sgl, PROMPTS, label="tree", repeats=1, timeout_s=120)
        scoring = score_answers(sgl, PROMPTS, tree, baseline)
    verdict = judge_tree(
        baseline,
        tree,
        scoring,
        ties=TieRule(0.5, 2.0, 2.0),
        min_speedup=1.05,
        min_tokens=64,
        hybrid=False,
    )
    assert verdict.outcome is Outcome.passed, verdict.sentence
    assert verdict.figures["tokens_scored"] == tree.total_tokens
    assert verdict.figures["max_gap"] == 0.0  # a lossless tree emits the target's top-1
    assert tree.mean_accept_length and baseline.mean_accept_length
    assert tree.mean_accept_length > baseline.mean_accept_length
    # The tree's tokens are the linear ones; the shadow gate would pass on them too.
    shadow_like = judge_shadow(baseline, baseline, tolerance=0.02, collapse_ratio=0.6)
    assert shadow_like.outcome is Outcome.passed


def test_scoring_reads_the_target_s_own_log_probs_for_any_continuation(
    local_standin: LocalStandin,
) -> None:
    """The prompt-scoring request's answer, parsed: each token's log-prob and the top-1, as the
    stand-in's target scores them (`standin.model.target_logprobs`)."""
    from standin.model import target_logprobs, tokenize

    text = "Hello there"
    with client(local_standin) as sgl:
        greedy = sgl.generate(text, 24).output_ids
        wrong = (*greedy[:5], (greedy[5] + 1) % 64, *greedy[6:])
        right, off = sgl.score(text, greedy), sgl.score(text, wrong)
        # The vocabulary's last id, which SGLang reports as 0 in the scored entries.
        last = sgl.score(text, (*greedy[:3], 63))
    assert [s.token for s in right] == list(greedy)
    assert last[3].token == 63 and last[3].logprob < 0
    assert all(s.gap == 0.0 and s.top_token == s.token for s in right)
    context = [*tokenize(text), *wrong]
    expected = target_logprobs(context[-len(wrong) - 2 + 5], context[-len(wrong) - 1 + 5])
    assert off[5].token == wrong[5] and off[5].top_token == greedy[5]
    assert off[5].logprob == pytest.approx(float(expected[wrong[5]]))
    assert off[5].gap == pytest.approx(float(expected[greedy[5]] - expected[wrong[5]]))
    assert off[5].gap > 1.0


def test_a_log_prob_request_that_generates_is_refused_as_the_sets_refuse_it(
    local_standin: LocalStandin,
) -> None:
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    answer = httpx.post(f"{local_standin.url}/generate", json=body, headers=headers, timeout=60)
    assert answer.status_code == 400
    assert "does not support return_logprob" in answer.text


def test_scoring_asks_each_prompt_s_ids_once() -> None:
    """Answers of one prompt (a tree's passes, the baseline's) share one prompt-ids request.
    TEST DOUBLE: an httpx mock transport answering SGLang's scoring shapes."""
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append("text" if "text" in body else "ids")
        ids = body.get("input_ids") or [7, 8, 9]
        start = body["logprob_start_len"]
        entries = [[None if i == start else -0.1, t, None] for i, t in enumerate(ids)][start:]
        tops = [None] + [[[-0.1, t, None]] for t in ids[start + 1 :]]
        meta = {"input_token_logprobs": entries, "input_top_logprobs": tops}
        return httpx.Response(200, json={"meta_info": meta})

    with SglangClient("http://sglang", api_key=None, timeout_s=5) as sgl:
        sgl._http = httpx.Client(base_url="http://sglang", transport=httpx.MockTransport(answer))
        first, second = sgl.score("Hi", (1, 2)), sgl.score("Hi", (3,))
    assert asked == ["text", "ids", "ids"]
    assert [s.token for s in (*first, *second)] == [1, 2, 3]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_measurement_goes_on_in_rounds_of_passes_until_it_lasted_min_pass_s(
    local_standin: LocalStandin, concurrency: int
) -> None:
    """Run 12 on the H200: passes at 32 in flight lasted 0.65 s, and tune promoted on them."""
    with client(local_standin) as sgl:
        once = measure(
            sgl, PROMPTS[:1], label="t", repeats=1, timeout_s=120, concurrency=concurrency
        )
        one_pass_s = once.elapsed_s
        assert one_pass_s is not None
        got = measure(sgl, PROMPTS[:1], label="t", repeats=1, timeout_s=120,
                      concurrency=concurrency, min_pass_s=2.5 * one_pass_s)  # fmt: skip
    assert got.elapsed_s is not None and got.elapsed_s >= 2.5 * one_pass_s
    assert [r.repeat for r in got.results] == list(range(len(got.results)))
    assert len(got.results) >= 2  # more passes than asked for, numbered on
    assert {r.output_ids for r in got.results} == {once.results[0].output_ids}
