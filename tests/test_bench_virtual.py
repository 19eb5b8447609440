"""bench/virtual.py's validate statistics: the two-sample KS statistic, lag quantiles and histogram, and
the worker gap read off a real run (the runs themselves: bench/virtual.py validate, docs/performance.md §9);
the parallel TD3 of its measurement (bench/parallel_td3.py)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from bench.virtual import histogram, ks, quantiles, worker_gap


def test_ks_statistic():
    assert ks([0, 1, 2, 3], [0, 1, 2, 3]) == (0.0, 1.0)
    d, p = ks([0] * 50 + [1] * 50, [1] * 50 + [2] * 50)
    assert d == 0.5 and p < 1e-3
    d, p = ks([0, 1, 1, 2], [1, 2, 2, 3])  # F_a(1) = 3/4 against F_b(1) = 1/4
    assert d == 0.5 and 0.05 < p <= 1.0
    assert all(math.isnan(x) for x in ks([], [1]))


def test_lag_quantiles_and_histogram():
    lags = list(range(10)) + [40]
    q = quantiles(lags)
    assert q["p10"] == 1 and q["p50"] == 5 and q["p99"] == 40
    h = histogram(lags)
    assert h["0"] == h["1"] == round(1 / 11, 3) and h["4-7"] == round(4 / 11, 3) and h["32+"] == round(1 / 11, 3)
    assert sum(h.values()) == pytest.approx(1.0, abs=0.01)


def test_worker_gap_is_the_cycle_less_the_duration():
    # 2 workers, a result every 0.05 s, jobs of 0.06 s: each worker's cycle is 0.1 s, 0.04 s outside its jobs
    metrics = [{"type": "update", "random": i < 2, "t": 0.05 * i, "duration": 0.06} for i in range(12)]
    assert worker_gap(metrics, 2) == pytest.approx(0.04)
    assert worker_gap(metrics, 1) == 0.0  # never below 0


def test_worker_gap_per_worker_cancels_each_workers_durations():
    """Results that name their worker: each worker's span less its own jobs' durations, so jobs of widely
    spread durations give the gap on every draw, where the pooled cycle less the mean duration errs by
    their spread (the estimate calibrate --workers once clamped to 0 on a loaded machine)."""
    import random

    per_worker, pooled = [], []
    for seed in range(10):
        rng, metrics = random.Random(seed), []
        for w, start in (("a", 0.0), ("b", 0.013)):
            t = start
            for _ in range(12):
                d = rng.lognormvariate(math.log(0.04), 0.6)
                t += d
                metrics.append({"type": "update", "random": False, "t": t, "duration": d, "worker": w})
                t += 0.005  # the worker's time between this job's end and the next one's start
        metrics.sort(key=lambda u: u["t"])
        per_worker.append(worker_gap(metrics, 2))
        pooled.append(worker_gap([{k: v for k, v in u.items() if k != "worker"} for u in metrics], 2))
    assert per_worker == pytest.approx([0.005] * 10)
    assert max(pooled) - min(pooled) > 0.005, pooled


def test_critic_start_is_the_first_publication_after_the_random_phase():
    """A real run's critic start-up: its first publication where the random phase (initial_steps stored)
    ended before it; none where the phase ended after it (the start-up is hidden in the phase)."""
    from aesrl_queue.cost_model import critic_start

    updates = [{"type": "update", "elapsed": 0.1 * i, "steps": 1000 * i} for i in range(1, 40)]
    late = [*updates[:12], {"type": "critic", "elapsed": 1.7, "critic_version": 1}, *updates[12:]]
    assert critic_start(late, initial_steps=10_000) == 1.7
    assert critic_start(late, initial_steps=30_000) is None  # 30 000 stored at 3.0 s, after the publication
    assert critic_start(updates, initial_steps=10_000) is None  # no critic
    # published 6 ms after the phase ended (10 000 stored at 1.0 s): the daemon was up, waiting for it
    waiting = [*updates[:10], {"type": "critic", "elapsed": 1.006, "critic_version": 1}, *updates[10:]]
    assert critic_start(waiting, initial_steps=10_000) is None

def _ptd3(tmp_path, workers: int, rate: float, run_id: str, spread: float = 0.0, critic_lag: int = 0):
    from aesrl_queue.config import RunConfig
    from aesrl_queue.cost_model import CostModel
    from bench import parallel_td3

    cfg = RunConfig.from_preset("Pendulum-v1", algo="td3", seed=3, run_id=run_id, total_steps=1600, initial_steps=400,
                                hidden=(8, 8), critic_hidden=(16, 16), batch_size=32, td3_eval_every=400,
                                critic_lag=critic_lag).resolve()
    cost = CostModel(env_step_s=1e-3, learner_steps_per_s=rate, duration_spread=spread)
    return parallel_td3.run(cfg, workers, cost, tmp_path)


def test_parallel_td3_is_repeatable_learns_at_its_rate_and_stores_in_completion_order(tmp_path):
    """bench/parallel_td3.py: the same config and cost model give the same metrics; the learner takes
    learner_steps_per_s steps per virtual second of learning (three times the rate, three times the
    steps on the same schedule); episodes of spread durations enter the replay in the order they end,
    not the order they were handed out; the final actor is a policy file the protocol scores."""
    from aesrl_queue.metrics import read_metrics
    from bench.learning import score_snapshot

    a, sa = _ptd3(tmp_path / "a", 4, 100.0, "ptd3", spread=0.5)
    b, _ = _ptd3(tmp_path / "b", 4, 100.0, "ptd3", spread=0.5)
    assert (a / "metrics.jsonl").read_text() == (b / "metrics.jsonl").read_text()
    assert sa["steps"] >= 1600 and sa["status"] == "finished" and sa["updates"] > 0
    ups = [u for u in read_metrics(a) if u["type"] == "update"]
    assert [u["t"] for u in ups] == sorted(u["t"] for u in ups)
    dispatched = [u["t"] - u["duration"] for u in ups]
    assert dispatched != sorted(dispatched)  # they entered the replay in another order than handed out
    assert max(u["lag"] for u in ups) >= 1
    _, fast = _ptd3(tmp_path / "c", 4, 300.0, "ptd3", spread=0.5)
    assert fast["updates"] == pytest.approx(3 * sa["updates"], abs=3)
    got = score_snapshot(a / "policy.npz", [10_000, 10_001])
    assert len(got["returns"]) == 2 and math.isfinite(got["mean"])
    # measure's rows score the final policy from the protocol's 10 start states; rescore adds that to rows
    # written without it, finished ones only
    from bench.learning import PROTOCOL
    from bench.virtual import rescore

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"status": "finished", "run_dir": str(a)}) + "\n"
                    + json.dumps({"status": "stopped", "run_dir": str(b)}) + "\n")
    rescore(argparse.Namespace(files=[str(rows)]))
    done, stopped = [json.loads(line) for line in rows.read_text().splitlines()]
    assert done["policy_score"] == score_snapshot(a / "policy.npz", PROTOCOL["eval_seeds"])["mean"]
    assert done["policy_steps"] == sa["steps"] and "policy_score" not in stopped
    # held for the learner (critic_lag): the workers wait, so it trails the stored steps by at most that
    # much and an episode (the 3 x rate run above, unheld, trained 3 x the steps and no more)
    _, held = _ptd3(tmp_path / "d", 4, 100.0, "ptd3", critic_lag=300)
    assert held["updates"] >= held["steps"] - 400 - 300 - 200 > sa["updates"], (held, sa)
    assert held["virtual"]["virtual_s"] > sa["virtual"]["virtual_s"]


def _es_run(tmp_path, rule, run_id):
    """A virtual es run of 8 workers on the null environment, told under --staleness `rule`: its updates."""
    from aesrl_queue.config import RunConfig
    from aesrl_queue.cost_model import CostModel
    from aesrl_queue.metrics import read_metrics
    from aesrl_queue.virtual import VirtualRun
    from bench.virtual import staleness

    cfg = RunConfig.from_preset("AesrlNull-v0", algo="es", run_id=run_id, seed=3, hidden=(8, 8), total_steps=1600,
                                env_kwargs={"episode_len": 20}).resolve()
    run = VirtualRun(cfg, 8, CostModel(), out_dir=tmp_path)
    with staleness(rule):
        run.run()
    return [r for r in read_metrics(run.run_dir) if r["type"] == "update" and not r["random"]]


def test_staleness_rules_weigh_a_result_by_its_age(tmp_path):
    from aesrl_queue import distributions
    from aesrl_queue.optimizers.aesrl import AesrlOptimizer
    from bench.virtual import parse_staleness

    plain = _es_run(tmp_path, None, "st-none")
    assert any(u["lag"] > 0 and u["p"] > 0 for u in plain)  # without a rule, stale results move μ
    dropped = _es_run(tmp_path, "drop:0", "st-drop")
    stale = [u for u in dropped if u["lag"] > 0]
    assert stale and all(u["p"] == 0 for u in stale)  # drop:0: no result older than its ask moves μ
    assert any(u["p"] > 0 for u in dropped if u["lag"] == 0)
    decayed = _es_run(tmp_path, "decay:2", "st-decay")
    assert any(u["lag"] > 0 and u["p"] > 0 for u in decayed)
    assert all(u["p"] <= 2 / (2 + u["lag"]) + 1e-9 for u in decayed)  # p ≤ 1 scaled by H / (H + age)
    # the rule holds only inside its block
    assert distributions.update_ratio.__name__ == "update_ratio" and AesrlOptimizer.tell.__name__ == "tell"
    assert parse_staleness("decay:8") == ("decay", 8.0) and parse_staleness(None) is None
    for bad in ("drop", "decay:0", "age:3", "drop:-1", "drop:x"):
        with pytest.raises(ValueError, match="--staleness"):
            parse_staleness(bad)


def test_plot_draws_one_series_per_file_and_algo_and_keeps_a_cell_s_last_line(tmp_path, capsys) -> None:
    """bench/virtual.py plot: the cells of a results file grouped by (env, algo, steps, settings); a cell
    run again counts once (its last line); ALGO=LABEL renames one file's series, so the same algo in two
    files stays two series; unfinished cells are left out."""
    import argparse

    from bench import virtual

    def cell(algo, n, seed, f, status="finished", **kw):
        return json.dumps({"env": "Pendulum-v1", "algo": algo, "workers": n, "seed": seed, "steps": 10_000,
                           "settings": kw, "status": status, "virtual_s": 1.0 + n, "f_mu_at_mark": f})

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join([cell("aesrl", 2, 1, -900.0), cell("aesrl", 2, 1, -800.0), cell("aesrl", 16, 1, -700.0),
                                cell("es", 2, 1, -1000.0, status="crashed")]) + "\n")
    second.write_text("\n".join([cell("aesrl", 2, 1, -600.0), cell("aesrl", 2, 2, -500.0, critic_lag=0)]) + "\n")
    out = tmp_path / "fig.png"
    virtual.plot(argparse.Namespace(files=[f"{first}:aesrl=aesrl, first", str(second)], out=str(out)))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(4 points of N in 3 series)" in capsys.readouterr().out


def test_grid_table_means_seeds_and_sets_each_n_against_n2(tmp_path, capsys):
    """bench/virtual.py table: per N the seeds' final-policy scores, their mean and difference to N = 2 on
    the seeds both ran, and the threshold times of the seeds that reached them; a cell run again counts
    once, by its last line."""
    from bench.virtual import table

    def row(n, seed, pol, to_2000, status="finished"):
        return {"env": "HalfCheetah-v5", "algo": "aesrl", "workers": n, "seed": seed, "steps": 100_000,
                "interactions": 100_000, "settings": {}, "cost_model": "m.json", "status": status,
                "policy_score": pol, "f_mu_at_mark": pol - 5, "random_results": 10, "virtual_s": 150.0,
                "virtual_s_to": {"2000.0": to_2000}}

    rows = [row(2, 1, 5000.0, 40.0), row(2, 2, 6000.0, 60.0), row(16, 1, 100.0, None),
            row(16, 1, 4000.0, 30.0), row(16, 2, 4400.0, None), row(16, 3, 1000.0, None),
            row(1024, 1, 9.0, 1.0, status="stopped")]
    path = tmp_path / "grid.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table(argparse.Namespace(files=[str(path)], interactions=100_000))
    out = capsys.readouterr().out
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in out.splitlines() if line.startswith("| ") and not line.startswith("| N ")}
    assert set(lines) == {"2", "16"}  # the stopped cell is left out
    assert lines["2"][:4] == ["1,2", "5,000 / 6,000", "5,500", "0"]
    # seed 3 has no N = 2 run: it counts in the mean, not in the difference to N = 2
    assert lines["16"][:4] == ["1,2,3", "4,000 / 4,400 / 1,000", "3,133", "-1,300"]
    assert lines["2"][-1] == "50.0 (2/2)" and lines["16"][-1] == "30.0 (1/3)"

    # a bench option's series without an N = 2 row is held against the algorithm's own N = 2, and says so
    capped = {**row(128, 1, 5600.0, 20.0), "random_cap": True}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [capped]))
    table(argparse.Namespace(files=[str(path)], interactions=100_000))
    out = capsys.readouterr().out
    assert "(vs N = 2: aesrl without random_cap, the same seeds)" in out
    assert [line for line in out.splitlines() if line.startswith("| 128 ")][0].split("|")[5].strip() == "600"


def test_scores_hold_each_virtual_run_against_the_real_runs_range(tmp_path, capsys):
    """`scores`: the real rows of the named algorithm only (their 100 % score), each virtual run inside or
    outside their range, and the difference of the means."""
    from bench.virtual import scores

    def real_row(algo, seed, score):
        return {"env": "Walker2d-v5", "algo": algo, "seed": seed, "commit": "abcdef0123",
                "scores": {"100": {"mean": score}}}

    proto = tmp_path / "proto.json"
    proto.write_text(json.dumps({"rows": [real_row("aesrl", 1, 1000.0), real_row("aesrl", 2, 3000.0),
                                          real_row("td3", 1, 9000.0)]}))
    virt = tmp_path / "virtual.jsonl"
    virt.write_text("".join(json.dumps(r) + "\n" for r in (
        {"env": "Walker2d-v5", "workers": 2, "seed": 1, "status": "finished", "policy_score": 2500.0},
        {"env": "Walker2d-v5", "workers": 2, "seed": 2, "status": "finished", "policy_score": 3500.0},
        {"env": "Walker2d-v5", "workers": 2, "seed": 3, "status": "stopped", "policy_score": 1.0})))
    scores(argparse.Namespace(files=[str(virt)], real=[f"{proto}:aesrl"]))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "1: 1,000, 2: 3,000" and cells[2] == "1,000 – 3,000" and cells[3] == "2,000"
    assert cells[5] == "1: 2,500, 2: 3,500" and cells[6] == "1 of 2"
    assert cells[7].startswith("+1,000 [")


def test_a_cell_stopped_by_sigterm_resumes_and_a_finished_one_is_read_not_run(tmp_path):
    """A SIGTERM (or measure --minutes' alarm, the same handler) stops a cell with its folder kept;
    --resume continues it to its budget and records where; a finished cell under --resume is read
    without running; a folder of another cost model is refused rather than continued under the wrong one."""
    import os
    import signal
    import threading
    import time

    from bench.virtual import run_cell

    cell = {"env": "AesrlNull-v0", "algo": "aesrl", "workers": 4, "seed": 3, "steps": 3000, "interactions": 2000,
            "thresholds": [0.0], "cost_model": None, "runs": str(tmp_path),
            "settings": {"hidden": [8, 8], "critic_hidden": [16, 16], "env_kwargs": {"episode_len": 20},
                         "initial_steps": 160, "batch_size": 32, "critic_chunk": 40}}
    metrics = tmp_path / "v-aesrlnull-aesrl-n4-s3-rcap-gif" / "metrics.jsonl"

    def stop_after_30_updates():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.is_file() and metrics.read_text().count('"update"') >= 30:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    handler = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_after_30_updates, daemon=True).start()
    first = run_cell(cell)
    assert first["status"] == "stopped" and 30 <= first["updates"] < 150, first
    assert signal.getsignal(signal.SIGTERM) == handler and "policy_score" not in first
    done = run_cell({**cell, "resume": True})
    assert done["status"] == "finished" and done["policy_steps"] >= 3000, done
    assert len(done["resumed_at"]) == 1 and 0 < done["resumed_at"][0] < done["virtual_s"], done
    assert done["updates"] > first["updates"] and done["wall_s"] >= first["wall_s"]
    again = run_cell({**cell, "resume": True})
    assert again == done  # read: the same row, the same wall seconds
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"env_step_s": 0.5}))
    with pytest.raises(SystemExit, match="another cost model"):
        run_cell({**cell, "resume": True, "cost_model": str(other)})
