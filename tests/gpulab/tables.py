"""The GPU lab's tables, from the product's run reports: what run.py prints and saves.

Pure functions of JSON (no server, no network), so they are tested on CPU with reports recorded
on the GPU (test_run_summary.py). Run as a script, it pools the interleaved comparisons of
several calls into one table:

    python3 tests/gpulab/tables.py CALL1/results.json CALL2/results.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

CONFIDENCE = 0.95  # of the interval around a median ratio


def summarize(report: dict[str, Any] | None, exit_code: int) -> dict[str, Any]:
    """The figures of one validate run that the table shows."""
    if report is None:
        return {"exit": exit_code, "gates": {}, "sentence": "no report"}
    phase = report["phases"][-1] if report["phases"] else {}
    gates = {g["gate"]: g["outcome"] for g in phase.get("gates", [])}
    divergence = next((g["divergence"] for g in phase.get("gates", []) if "divergence" in g), None)
    tree = next((g["figures"] for g in phase.get("gates", []) if g["gate"] == "tree"), {})
    measured = phase.get("measurement") or {}
    per = measured.get("per_prompt") or []
    steps = [
        p["accept_length"] / p["tokens_per_s"]
        for p in per
        if p.get("accept_length") and p.get("tokens_per_s")
    ]
    return {
        "exit": exit_code,
        "gates": gates,
        "sentence": report.get("sentence", ""),
        "divergence": divergence,
        "accept_length": measured.get("mean_accept_length"),
        "tokens_per_s": measured.get("tokens_per_s"),
        "tokens": measured.get("tokens"),
        "step_ms": round(1000 * sum(steps) / len(steps), 3) if steps else None,
        # The tree gate's tie rule: worst gap of the tree's tokens, and of DFLASH's, in nats.
        "max_gap": tree.get("max_gap"),
        "baseline_max_gap": tree.get("baseline_max_gap"),
        "divergences": tree.get("divergences"),
    }  # fmt: skip


SMALL = "small-"  # run.py --small-beside: the trained pair's own servers (their names' prefix)


def render_table(results: dict[str, Any]) -> str:
    size = f", {results['size']} models" if results.get("size") else ""
    lines = [f"# GPU lab, SGLang {results['release']}{size} ({results.get('wall_s')} s)", ""]
    lines += ["| step | exit | s |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['exit_code']} | {s['wall_s']} |" for s in results["steps"]]
    if results["cells"]:
        lines += ["", *matrix_table(results["cells"])]
        if results.get("training"):
            lines += ["", *speed_table(results["cells"], results["training"])]
    if results.get("overhead"):
        lines += ["", f"Interleaved comparison on the {overhead_target(results)} target:", "",
                  *overhead_table(results["overhead"])]  # fmt: skip
    if kept := inflation_table(results.get("overhead") or []):
        lines += ["", *kept]
    timed_together = [p for p in results.get("overhead") or [] if not p["algo"].startswith(SMALL)]
    if noise := noise_table(timed_together):
        lines += ["", *noise]
    if results.get("decode_log"):
        lines += ["", *decode_log_table(results["decode_log"])]
    if results.get("timeline"):
        in_flight = results.get("timeline_in_flight", 1)
        lines += ["", f"Step timelines, {in_flight} answer{'s' * (in_flight > 1)} at once:", "",
                  *timeline_table(results["timeline"])]  # fmt: skip
    if results.get("tune"):
        lines += ["", results["tune"]]
    return "\n".join(lines) + "\n"


def matrix_table(cells: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | algo | run | start s | gates | exit | first divergence (gap) | prompts diverged "
             "| worst gap: tree (DFLASH) | accept | tok/s | step ms | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for cell in cells:
        planted = cell.get("planted")
        algo = " ".join([cell["algo"], *[e.split("=")[-1] for e in cell.get("extra", [])],
                         *([f"(planted {planted})"] if planted else [])])  # fmt: skip
        if cell["start_error"]:
            lines.append(
                f"| {cell['target']} | {algo} | - | failed | {cell['start_error'][-120:]!r} | | | | | | | | |"
            )
            continue
        for label, run in cell["runs"].items():
            gates = " ".join(f"{g}:{o[0]}" for g, o in run["gates"].items())
            div = run.get("divergence")
            where = f"{div['prompt']}@{div['position']}" if div else "none"
            if div and div.get("gap") is not None:
                where += f" ({div['gap']:.4f})"
            gaps = (f"{run['max_gap']} ({run.get('baseline_max_gap')})"
                    if run.get("max_gap") is not None else "")  # fmt: skip
            note = planted_verdict(run, cell.get("plant_seen")) if planted else ""
            if cell.get("key_check"):
                note = f"{note} API key: {cell['key_check']}".strip()
            lines.append(
                f"| {cell['target']} | {algo} | {label} | {cell['start_s']} | {gates} | {run['exit']} "
                f"| {where} | {run.get('divergences') if run.get('divergences') is not None else ''} "
                f"| {gaps} | {run.get('accept_length')} | {run.get('tokens_per_s')} | {run.get('step_ms')} "
                f"| {note} |"
            )  # fmt: skip
    return lines


def speed_table(cells: list[dict[str, Any]], training: dict[str, Any]) -> list[str]:
    """The trained pair's speeds: per served cell and level in flight, acceptance and tok/s and
    tok/s over DFLASH's at that level; above it, the acceptance training predicted for DFLASH on
    the same held-out prompts beside the one SGLang reported (train and serve agree, or the
    figures below are a bug's)."""
    dflash = next((c for c in cells if c["algo"] == "dflash" and not c.get("planted")), None)
    served = (dflash or {}).get("runs", {}).get("batch1", {}).get("accept_length")
    predicted = training.get("acceptance", {}).get("mean_accept_len")
    lines = [f"Acceptance of DFLASH on the held-out prompts: predicted by training {predicted}, "
             f"served at batch 1 {served}" + (f" (served / predicted {served / predicted:.3f})"
                                             if served and predicted else ""), ""]  # fmt: skip
    levels = list(dict.fromkeys(label for c in cells for label in c.get("runs", {})))
    lines += ["| algo | " + " | ".join(f"{lv}: accept, tok/s, x DFLASH" for lv in levels) + " |",
              "|---|" + "---|" * len(levels)]  # fmt: skip
    for cell in cells:
        if cell.get("planted") or cell.get("start_error"):
            continue
        row = [" ".join([cell["algo"], *[e.split("=")[-1] for e in cell.get("extra", [])]])]
        for level in levels:
            run = cell["runs"].get(level) or {}
            base = ((dflash or {}).get("runs", {}).get(level) or {}).get("tokens_per_s")
            tps = run.get("tokens_per_s")
            ratio = f"{tps / base:.3f}" if tps and base else "-"
            row.append(f"{run.get('accept_length', '-')}, {tps or '-'}, {ratio}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def planted_verdict(run: dict[str, Any], plant_seen: bool | None) -> str:
    """What a validate run of a server with a planted verify bug says about the gate: it must
    fail there, on the tree gate (exit 10 alone could be a crash, which proves nothing)."""
    if not plant_seen:
        return "planted bug NOT IN PLACE (no plant line in the server log): no verdict"
    if run["exit"] == 10 and run["gates"].get("tree") == "failed":
        return "planted bug: failed, as it must"
    if run["exit"] == 0:
        return "planted bug PASSED: the gate missed it"
    return f"planted bug: no verdict (exit {run['exit']}, tree gate {run['gates'].get('tree', 'not run')})"


def median_interval(
    values: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The distribution-free interval around the median of `values`: the order statistics
    x(j) and x(n+1-j) with j the largest rank that still covers the median with `confidence`
    (binomial at one half). None under six values, where no pair of ranks covers 95%.

    Written here: a few lines of the binomial law, where scipy would be a new dependency of the
    lab's runner."""
    n = len(values)
    tail, rank = 0.0, 0
    while rank < n // 2:
        below = tail + math.comb(n, rank) / 2**n  # P(fewer than rank+1 values below the median)
        if 2 * below > 1 - confidence:
            break
        tail, rank = below, rank + 1
    if rank == 0:
        return None
    ordered = sorted(values)
    return ordered[rank - 1], ordered[n - rank]


def overhead_table(passes: list[dict[str, Any]]) -> list[str]:
    """Per concurrency and server: tok/s and step ms round by round, its gate verdicts, and its
    speed over DFLASH as the median of the rounds' paired tok/s ratios, their range beside it
    and, from six rounds, the median's 95% interval: whether a 1% difference is resolved at all
    (the control's, --control, is the lab's own spread between identical servers), and what its
    verify step costs over DFLASH's (ms, the median of paired rounds: issue 22's measure; with
    more requests in flight than a server runs, a request's step time includes its queueing,
    so there only tok/s compares). Round 0 is shown but
    left out of the ratio when later rounds exist: it is the first request of each batch shape
    on a fresh server (Triton compiles its kernels then), and it sizes the later passes."""
    broken = [p for p in passes if p.get("start_error")]
    if broken:
        return [f"overhead: the {p['algo']} server did not start: {p['start_error'][-300:]!r}"
                for p in broken]  # fmt: skip
    names = list(dict.fromkeys(p["algo"] for p in passes))
    lines = ["| in flight | server | prompt-set passes by round | tok/s (step ms) by round | accept "
             "| gate | x DFLASH: median of paired rounds (range; 95% interval) "
             "| step ms over DFLASH, median |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for level in _levels(passes):
        runs = _level_runs(passes, level, names)
        for name in names:
            rounds = sorted(set(runs["dflash"]) & set(runs[name]))
            if not rounds:
                continue
            warm = _paired_rounds(runs, name)
            steps = [runs[name][r]["step_ms"] - runs["dflash"][r]["step_ms"] for r in warm
                     if runs[name][r].get("step_ms") and runs["dflash"][r].get("step_ms")]  # fmt: skip
            step_cost = f"{statistics.median(steps):+.2f}" if steps else "-"
            shown = ", ".join(f"{runs[name][r]['tokens_per_s']} ({runs[name][r].get('step_ms')})"
                              for r in rounds)  # fmt: skip
            repeats = "/".join(str(runs[name][r].get("repeats", "-")) for r in rounds)
            verdicts = ",".join(sorted({f"{g}:{o}" for r in rounds
                                        for g, o in runs[name][r]["gates"].items()
                                        if g in ("baseline", "shadow_linear", "tree")})) or "-"  # fmt: skip
            gaps = [
                runs[name][r]["max_gap"] for r in rounds if runs[name][r].get("max_gap") is not None
            ]
            if gaps:  # the tie rule's worst gap (nats): a speed-only failure shows it small
                verdicts += f" (worst gap {max(gaps)})"
            accept = runs[name][rounds[-1]].get("accept_length")
            lines.append(f"| {level} | {name} | {repeats} | {shown} | {accept} | {verdicts} "
                         f"| {_ratio_cell(paired_ratios(runs, name))} | {step_cost} |")  # fmt: skip
    checks = [f"- API key, {p['algo']}: {p['key_check']}" for p in passes if p.get("key_check")]
    return lines + (["", *checks] if checks else [])


# The host counters a timed pass records (host_counters.py) that noise_table reads, and the
# heading of each.
NOISE_COVARIATES = {"steal_pct": "steal %", "cpus_busy": "busy CPUs",
                    "hot_cpu_pct": "scheduler CPU %", "hot_preempted_per_s": "preemptions/s"}  # fmt: skip


def inflation_table(passes: list[dict[str, Any]]) -> list[str]:
    """The trained pair's acceptance beside its inflated copy's (run.py --small-beside): per
    level and algorithm, tokens per verify step (token weighted) over the rounds the small
    server was timed in, the same requests for both, and their ratio. The two compute the same
    function, so they differ only where bf16 rounding flips a near-tie and the path moves (GPU
    lab issue 45 asks within 2%)."""
    lines = []
    for level in _levels(passes):
        at_level = [p for p in passes if p.get("concurrency") == level and p.get("accept_length")]
        for small in dict.fromkeys(p["algo"] for p in at_level if p["algo"].startswith(SMALL)):
            rounds = {p.get("round", 0) for p in at_level if p["algo"] == small}
            same_rounds = [p for p in at_level if p.get("round", 0) in rounds]
            inflated = _accept(same_rounds, small.removeprefix(SMALL))
            mine = _accept(same_rounds, small)
            ratio = f"{inflated / mine:.4f}" if inflated and mine else "-"
            lines.append(f"| {level} | {small.removeprefix(SMALL)} | {inflated or '-'} "
                         f"| {mine} | {ratio} |")  # fmt: skip
    if not lines:
        return []
    return ["| in flight | algorithm | accept, inflated pair | accept, trained pair | inflated / "
            "trained |", "|---|---|---|---|---|", *lines]  # fmt: skip


def _accept(passes: list[dict[str, Any]], name: str) -> float | None:
    """`name`'s tokens per verify step over its passes, weighted by their tokens."""
    mine = [p for p in passes if p["algo"] == name and p.get("tokens")]
    steps = sum(p["tokens"] / p["accept_length"] for p in mine)
    return round(sum(p["tokens"] for p in mine) / steps, 4) if steps else None


def noise_table(passes: list[dict[str, Any]]) -> list[str]:
    """How much of the passes' spread the host explains: per level, over the rounds every server
    was timed in (round 0 left out), each pass's log tok/s less its round's and its server's
    means (what pairing cannot cancel), its standard deviation, and for each host counter the
    correlation of the same residual of the counter with it and the spread left once it is
    regressed out (sd x sqrt(1 - r^2)). Empty for passes without host counters (before stop 41)."""
    rows = [row for level in _levels(passes) if (row := _noise_row(passes, level))]
    if not rows:
        return []
    heads = " | ".join(f"r: {h} (sd left)" for h in NOISE_COVARIATES.values())
    return ["| in flight | rounds x servers | pass sd, log tok/s | steal %, median / max "
            f"| {heads} |", "|---|---|---|---|" + "---|" * len(NOISE_COVARIATES), *rows]  # fmt: skip


def _noise_row(passes: list[dict[str, Any]], level: int) -> str | None:
    """noise_table's row for `level`; None under three full rounds of two servers."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for p in passes:
        if (p.get("concurrency") == level and p.get("round", 0) > 0 and p.get("tokens_per_s")
                and p.get("host")):  # fmt: skip
            by_round.setdefault(p["round"], {})[p["algo"]] = p
    names = sorted({name for timed in by_round.values() for name in timed})
    full = [timed for timed in by_round.values() if sorted(timed) == names]
    if len(full) < 3 or len(names) < 2:
        return None
    speed = _two_way_residuals([[math.log(t[n]["tokens_per_s"]) for n in names] for t in full])
    sd = math.sqrt(sum(x * x for x in speed) / ((len(full) - 1) * (len(names) - 1)))
    cells = []
    for key in NOISE_COVARIATES:
        values = [[t[n]["host"].get(key) for n in names] for t in full]
        if any(None in v for v in values):
            cells.append("-")  # not recorded
            continue
        try:
            r = statistics.correlation(speed, _two_way_residuals(values))
        except statistics.StatisticsError:  # no residual left: the same in every pass, or
            cells.append("-")  # varied by server or round alone
            continue
        cells.append(f"{r:+.2f} ({100 * sd * math.sqrt(max(0.0, 1 - r * r)):.2f}%)")
    steal = [t[n]["host"].get("steal_pct") or 0.0 for t in full for n in names]
    return (f"| {level} | {len(full)} x {len(names)} | {100 * sd:.2f}% "
            f"| {statistics.median(steal):.1f} / {max(steal):.1f} | {' | '.join(cells)} |")  # fmt: skip


def _two_way_residuals(rows: list[list[float]]) -> list[float]:
    """Each value less its row's (round's) and its column's (server's) means plus the grand
    mean, row by row: the part of a pass that neither the round nor the server explains."""
    grand = statistics.mean(v for row in rows for v in row)
    col_means = [statistics.mean(col) for col in zip(*rows, strict=True)]
    return [v - statistics.mean(row) - c + grand for row in rows
            for v, c in zip(row, col_means, strict=True)]  # fmt: skip


def decode_log_table(steps: dict[str, dict[str, Any] | None]) -> list[str]:
    """Each server's step from its own decode log (decode_log.py): ms a step at its fullest
    batch, with requests queued and without, beside DFLASH's; the reading that holds at more
    requests in flight than a server runs, where the passes' step time includes the queue."""
    lines = ["| server (decode log) | running | ms a step, queued (windows) | over DFLASH "
             "| ms a step, none queued (windows) | over DFLASH |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    base = steps.get("dflash") or {}
    for name, summary in steps.items():
        if summary is None:
            lines.append(f"| {name} | no decode windows in its log | | | | |")
            continue
        cells = []
        for key in ("queued", "unqueued"):
            ms, ref = summary[key]["step_ms"], (base.get(key) or {}).get("step_ms")
            cells.append(f"{ms} ({summary[key]['windows']})" if ms is not None else "-")
            cells.append(f"{ms - ref:+.2f}" if ms is not None and ref is not None else "-")
        lines.append(f"| {name} | {summary['running']} | {' | '.join(cells)} |")
    return lines


def overhead_target(results: dict[str, Any]) -> str:
    """The lab model an interleaved comparison served (attention before run.py named it)."""
    return results.get("overhead_target", "attention")


def pooled_table(results: list[dict[str, Any]]) -> list[str]:
    """Several calls' interleaved comparisons (their results.json) as one table: per release,
    target, level and server, the paired rounds of every call pooled (each call's round 0 left
    out as in its own table), their median ratio over DFLASH with range and 95% interval: a
    figure that one call's rounds cannot resolve, read from several."""
    pooled: dict[tuple[str, str, int, str], list[float]] = {}
    calls: dict[tuple[str, str, int, str], int] = {}
    for result in results:
        passes = result.get("overhead") or []
        names = [n for n in dict.fromkeys(p["algo"] for p in passes) if n != "dflash"]
        for level in _levels(passes):
            runs = _level_runs(passes, level, ["dflash", *names])
            for name in names:
                if ratios := paired_ratios(runs, name):
                    key = (result["release"], overhead_target(result), level, name)
                    pooled.setdefault(key, []).extend(ratios)
                    calls[key] = calls.get(key, 0) + 1
    lines = ["| release | target | in flight | server | calls | rounds "
             "| x DFLASH: median of paired rounds (range; 95% interval) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, ratios in sorted(pooled.items()):
        release, target, level, name = key
        lines.append(f"| {release} | {target} | {level} | {name} | {calls[key]} "
                     f"| {len(ratios)} | {_ratio_cell(ratios)} |")  # fmt: skip
    return lines


def paired_ratios(runs: dict[str, dict[int, dict[str, Any]]], name: str) -> list[float]:
    """`name`'s tok/s over DFLASH's in each round both were timed (`runs`: per server, its
    passes by round at one level), round 0 left out when later rounds exist."""
    return [runs[name][r]["tokens_per_s"] / runs["dflash"][r]["tokens_per_s"]
            for r in _paired_rounds(runs, name)]  # fmt: skip


def _paired_rounds(runs: dict[str, dict[int, dict[str, Any]]], name: str) -> list[int]:
    """The rounds both `name` and DFLASH were timed in, round 0 left out when later ones exist
    (the first requests of each batch shape on a fresh server)."""
    rounds = sorted(set(runs.get("dflash", {})) & set(runs.get(name, {})))
    return [r for r in rounds if r > 0] or rounds


def _levels(passes: list[dict[str, Any]]) -> list[int]:
    return sorted({p["concurrency"] for p in passes if "concurrency" in p})


def _level_runs(
    passes: list[dict[str, Any]], level: int, names: list[str]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Per server of `names`, its measured passes at `level` by round."""
    return {name: {p["round"]: p for p in passes
                   if p.get("concurrency") == level and p["algo"] == name and p.get("tokens_per_s")}
            for name in names}  # fmt: skip


def _ratio_cell(ratios: list[float]) -> str:
    """A ratio column's cell: the median, then its range (when the ratios vary) and from six
    ratios its 95% interval, as "median (range; interval)"."""
    cell = f"{statistics.median(ratios):.3f}"
    if len(set(ratios)) > 1:
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
        interval = median_interval(ratios)
        if interval is not None:
            spread += f"; {interval[0]:.3f}-{interval[1]:.3f}"
        cell += f" ({spread})"
    return cell


def timeline_table(timelines: dict[str, dict[str, Any] | str]) -> list[str]:
    """Each profiled server's step (timeline.py's medians, ms), then side by side the speculative
    functions' inclusive ms per step (where one server's extra host time goes) and the GPU
    kernels' ms per step (what its extra GPU time is made of)."""
    lines = ["| server | steps | step ms | worker host ms | GPU busy ms | blocked on GPU ms "
             "| blocking calls per step | CUDA graphs launched per step |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    profiled = {name: t for name, t in timelines.items() if isinstance(t, dict)}
    for name, t in timelines.items():
        if isinstance(t, str):
            lines.append(f"| {name} | {t} | | | | | | |")
            continue
        lines.append(f"| {name} | {t['steps']} | {t['step_ms']} | {t['host_ms']} | {t['gpu_ms']} "
                     f"| {t['sync_ms']} | {t['syncs']} | {t.get('graph_launches', '-')} |")  # fmt: skip
    lines += [f"- {name}: recorded while {t['recorded_beside_export_of']} still exported its "
              "trace (a core busy beside it): its host figures are not comparable"
              for name, t in profiled.items() if t.get("recorded_beside_export_of")]  # fmt: skip
    lines += _side_by_side(profiled, "functions", "function (inclusive ms per step)", "`{}`")
    lines += _side_by_side(profiled, "kernels", "GPU kernel (ms per step)", "{}")
    return lines


def _side_by_side(
    profiled: dict[str, dict[str, Any]], key: str, heading: str, shown: str
) -> list[str]:
    """One row per name in any server's `key` list, one column of ms per server."""
    rows = list(dict.fromkeys(r for t in profiled.values() for r, _ in t.get(key, [])))
    if not rows:
        return []
    names = list(profiled)
    per_server = {n: dict(profiled[n].get(key, [])) for n in names}
    lines = ["", f"| {heading} | {' | '.join(names)} |", f"|---|{'---|' * len(names)}"]
    for row in rows:
        cells = [str(per_server[n].get(row, "")) for n in names]
        lines.append(f"| {shown.format(row)} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The pooled table of the results.json files named, or a one-sentence refusal."""
    parser = argparse.ArgumentParser(description="The pooled table of several --overhead calls.")
    parser.add_argument("results", nargs="+", type=Path, help="each call's results.json")
    args = parser.parse_args(argv)
    results = []
    for path in args.results:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"cannot read {path} as a lab results.json ({error}): give the file "
                         "run.py wrote into its --out folder")  # fmt: skip
        if not isinstance(result, dict) or not any(
            "round" in p for p in result.get("overhead") or []
        ):
            parser.error(f"{path} holds no interleaved comparison: only run.py --overhead "
                         "writes one")  # fmt: skip
        results.append(result)
    print("\n".join(pooled_table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
