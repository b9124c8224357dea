"""The decode log's step reading (decode_log.py), on made-up windows whose steps are worked by
hand, and on a real server's log: `recorded/run20-0.5.11-ddtree_shadow-decode.log` holds the
decode and prefill lines of run 20's shadow_linear server (SGLang 0.5.11, 8B-shaped target, on
the H200, at 1, 8 and 32 requests in flight)."""

from __future__ import annotations

from pathlib import Path

from gpulab.decode_log import (
    SERVER_LOG,
    full_batch_steps,
    overhead_servers_steps,
    read_windows,
)
from gpulab.tables import decode_log_table

RECORDED = Path(__file__).with_name("recorded")


def _line(running: int, accept: float, throughput: float, queued: int) -> str:
    return (f"[2026-12-05 03:39:19] Decode batch, #running-req: {running}, #token: 2313, token "
            f"usage: 0.14, accept len: {accept:.2f}, accept rate: 0.00, cuda graph: True, gen "
            f"throughput (token/s): {throughput:.2f}, #queue-req: {queued}")  # fmt: skip


LOG = "\n".join([
    "[2026-12-05 03:39:18] Prefill batch, #new-seq: 8, #new-token: 64, #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 24, cuda graph: False",
    _line(8, 1.00, 4.00, 24),  # the window after an idle spell: 2000 ms "a step"
    _line(8, 1.00, 800.00, 24),  # 8 x 1.0 / 800 = 10 ms
    _line(8, 1.25, 800.00, 16),  # 12.5 ms
    _line(8, 1.00, 500.00, 8),  # 16 ms
    _line(7, 1.00, 700.00, 0),  # not the fullest batch
    _line(8, 1.00, 640.00, 0),  # 12.5 ms
    _line(8, 1.00, 0.00, 0),  # no tokens: no step
    "[2026-12-05 03:39:30] INFO:     127.0.0.1:50000 - \"POST /generate HTTP/1.1\" 200 OK",
])  # fmt: skip


def test_a_full_batch_step_is_running_times_accept_over_throughput_without_idle_windows() -> None:
    assert [round(w.step_ms, 1) for w in read_windows(LOG)] == [2000.0, 10.0, 12.5, 16.0, 10.0,
                                                                 12.5]  # fmt: skip
    assert full_batch_steps(LOG) == {
        "running": 8,
        "queued": {"step_ms": 12.5, "windows": 3},  # 10, 12.5, 16: the idle window left out
        "unqueued": {"step_ms": 12.5, "windows": 1},
    }
    assert full_batch_steps("no decode here") is None


def test_every_decode_line_of_a_real_servers_log_is_read() -> None:
    text = (RECORDED / "run20-0.5.11-ddtree_shadow-decode.log").read_text()
    lines = [line for line in text.splitlines() if "Decode batch" in line]
    windows = read_windows(text)
    assert len(windows) == len(lines) == 131
    first = windows[0]
    assert f"#running-req: {first.running}," in lines[0]
    assert (
        f"gen throughput (token/s): {first.throughput:.2f}, #queue-req: {first.queued}" in lines[0]
    )
    summary = full_batch_steps(text)
    assert summary is not None and summary["running"] == 8  # the server runs 8 at most
    assert summary["queued"]["windows"] > 0 and summary["unqueued"]["windows"] > 0


def test_only_this_calls_servers_are_read_and_the_table_sets_each_beside_dflash(
    tmp_path: Path,
) -> None:
    (tmp_path / SERVER_LOG.format("dflash")).write_text(LOG)
    faster = LOG.replace("800.00", "1000.00")  # 10 -> 8 ms and 12.5 -> 10 ms
    (tmp_path / SERVER_LOG.format("ddtree_shadow")).write_text(faster)
    (tmp_path / SERVER_LOG.format("ddtree-15")).write_text(LOG)  # an earlier call's server
    steps = overhead_servers_steps(tmp_path, ["dflash", "ddtree_shadow", "dflash_control"])
    assert list(steps) == ["dflash", "ddtree_shadow", "dflash_control"]
    assert steps["dflash_control"] is None  # no log: nothing read
    assert steps["ddtree_shadow"]["queued"]["step_ms"] == 10.0  # type: ignore[index]
    _, _, dflash, shadow, control = decode_log_table(steps)
    assert dflash == "| dflash | 8 | 12.5 (3) | +0.00 | 12.5 (1) | +0.00 |"
    assert shadow == "| ddtree_shadow | 8 | 10.0 (3) | -2.50 | 12.5 (1) | +0.00 |"
    assert control == "| dflash_control | no decode windows in its log | | | | |"
