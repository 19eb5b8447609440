"""bench/learners.py: the micro table from real learner steps, and `alone` end to end on the learning
protocol's --quick settings (real `aesrl-queue run` processes, snapshots scored on fixed starts)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from bench import actor_average, actor_swing, daemon_alpha, learners, learning, replay_sources, rl_job_steps


def test_micro_times_each_learner_and_tables_them_against_td3() -> None:
    rows = [learners.micro_row(name, (32, 32), "cpu", 0.2) for name in ("td3", "crossq")]
    assert all(r["eager_steps_per_s"] > 0 for r in rows)
    table = learners.micro_table({"rows": [{**rows[0], "critic": "256-256"}, rows[1]], "info": {}})
    assert table.splitlines()[1].split()[-1] == "1.00" and "crossq" in table


def test_alone_runs_the_cells_and_scores_their_snapshots(tmp_path) -> None:
    # a --set variant (actor_lr), named by its tag in the cell's folder and config
    data = learners.alone("crossq-sac", ["Pendulum-v1"], [1], minutes=5, runs=tmp_path, quick=True,
                          settings={"actor_lr": 5e-4}, tag="lr5")
    (cell,) = data["cells"]
    cfg = json.loads((tmp_path / "Pendulum-v1" / "td3-crossq-sac-lr5-s1.config.json").read_text())
    assert cfg["actor_lr"] == 5e-4 and data["settings"] == {"actor_lr": 5e-4}
    with pytest.raises(ValueError, match="tag"):
        learners.alone("crossq", ["Pendulum-v1"], [1], minutes=5, runs=tmp_path, quick=True, settings={"actor_lr": 1e-4})
    assert "error" not in cell, cell
    assert cell["steps"] == 1200 and cell["wall_s"] > 0
    # the CPU of the cell's processes (the run, its scheduler and Redis), more than the scheduler's start-up
    assert 1.0 < cell["cpu_s"] < 10 * cell["wall_s"]
    assert set(cell["scores"]) >= {"25", "50", "100"}
    assert all(len(v["returns"]) == 10 for v in cell["scores"].values())
    assert "Pendulum-v1" in learners.alone_table(data)
    # what decides a cell's last digits besides the code: the processor and the BLAS kernel, as its processes saw them
    assert data["machine"]["cpu"] and data["machine"]["env"].get("OMP_NUM_THREADS") == "1"
    # bench/actor_swing.py on that finished run: its last checkpoint and its whole replay, more steps on it
    folder = tmp_path / "Pendulum-v1" / "td3-crossq-sac-lr5-s1"
    run_cfg, rows, ckpt = actor_swing.replay_rows(str(folder), folder.name)
    assert len(rows["obs"]) == 1200 and ckpt["total"] == 1200 and "log_alpha" in ckpt
    got = actor_swing.one((run_cfg, rows, ckpt, 3e-4, 4, 2, [10_000], 1))
    assert [s["updates"] for s in got["scores"]] == [0, 2, 4] and got["actor_lr"] == 3e-4
    # the run published its final Polyak average of the actor (policy.npz's μ); bench/actor_average.py
    # scores that and the actor itself from the last checkpoint
    mu = np.load(folder / "policy.npz")["mu"]
    assert np.array_equal(mu, ckpt["actor_avg"]) and not np.array_equal(mu, ckpt["actor"])
    both = actor_average.final_one(str(folder), [10_000, 10_001])
    assert both["steps"] == 1200 and len(both["actor"]) == len(both["avg"]) == 2
    assert both["avg"] == actor_average.score(run_cfg, mu, [10_000, 10_001])


def test_alone_resumes_a_stopped_cell_and_scores_a_finished_one_without_running_it(tmp_path) -> None:
    # stopped at its deadline (SIGTERM) after ~9 s, or finished by then on a fast machine: either way
    # --resume takes the folder up, and the cell ends at its budget with every milestone scored
    learners.alone("crossq", ["Pendulum-v1"], [1], minutes=0.15, runs=tmp_path, quick=True)
    (cell,) = learners.alone("crossq", ["Pendulum-v1"], [1], minutes=5, runs=tmp_path, quick=True, resume=True)["cells"]
    assert "error" not in cell, cell
    assert cell["resumed"] and cell["steps"] == 1200
    assert set(cell["scores"]) >= {"25", "50", "100"}
    again = learners.alone("crossq", ["Pendulum-v1"], [1], minutes=5, runs=tmp_path, quick=True, resume=True)["cells"]
    assert again[0]["wall_s"] == 0.0 and again[0]["scores"] == cell["scores"]  # finished: scored, not run


def test_the_average_probe_finds_each_running_cells_redis_by_its_folder(tmp_path) -> None:
    from aesrl_queue.redis_server import RedisServer

    folder = tmp_path / "Hopper-v5" / "td3-crossq-sac-s2" / "redis"
    folder.mkdir(parents=True)
    server = RedisServer(directory=folder).start()
    try:
        found = actor_average.running_cells(tmp_path)
        assert found == {"Hopper-v5/td3-crossq-sac-s2": int(server.url.rsplit(":", 1)[1].split("/")[0])}
        assert actor_average.running_cells(tmp_path / "Hopper-v5" / "elsewhere") == {}
    finally:
        server.stop()
    assert actor_average.running_cells(tmp_path) == {}


def test_falls_counts_the_probes_below_half_their_neighbours_median_from_a_step(tmp_path) -> None:
    # a policy that drops and comes back falls; a slow decline, or a low start it rises from, does not
    assert actor_average.falls([100, 100, 40, 100, 100]) == 1
    assert actor_average.falls([100, 90, 80, 70, 60, 50, 40]) == 0
    assert actor_average.falls([100, 100, 100, 10, 12, 100, 100]) == 2
    probes = [{"cell": "Hopper-v5/c-s1", "steps": s, "avg": [a] * 3, "actor": [b] * 3}
              for s, a, b in [(40_000, 1, 1), (50_000, 300, 300), (51_000, 300, 30), (52_000, 300, 300),
                              (53_000, 600, 300)]]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in reversed(probes)))
    [row] = actor_average.falls_table(actor_average.read_probes(tmp_path / "p.jsonl"), 50_000)
    assert row == {"cell": "Hopper-v5/c-s1", "probes": 4, "avg_mean": 375.0, "actor_mean": 232.5,
                   "avg_falls": 0, "actor_falls": 1}


def test_daemon_alpha_and_rl_job_steps_read_a_finished_aesrl_crossq_sac_run(tmp_path) -> None:
    # a quick aesrl run with crossq-sac (Pendulum-v1, small nets), as a development cell runs it, past its
    # random phase (a job stores two 200-step episodes, the individual's and μ's)
    protocol = {**learning.QUICK, "budget_steps": 4_000, "algos": {"aesrl": {"algo": "aesrl", "learner": "crossq-sac"}}}
    folder, cfg_file = tmp_path / "aesrl-s1", tmp_path / "aesrl-s1.config.json"
    cfg_file.write_text(json.dumps({"env_id": "Pendulum-v1", **learning.cell_settings("aesrl", protocol)}))
    done = subprocess.run(learning.cell_command("Pendulum-v1", "aesrl", 1, protocol, folder, cfg_file),
                          cwd=learning.ROOT, env=learning.cell_env(protocol), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # bench/daemon_alpha.py: the daemon's learner on the run's replay around its last μ, α tuned three ways
    runs = {r: daemon_alpha.trace(str(folder), r, "last", 40, 20) for r in daemon_alpha.RULES}
    assert [p["steps"] for p in runs["gaussian"]["points"]] == [20, 40]
    assert runs["gaussian"]["replay"] >= 1200
    assert all(p["log_alpha"] <= 0.0 for p in runs["capped"]["points"])
    assert all(np.isfinite(p["loss"]) and np.isfinite(p["q1"]) for r in runs.values() for p in r["points"])
    again = daemon_alpha.trace(str(folder), "gaussian", "last", 40, 20)  # torch seeded: the same trace
    assert [p["loss"] for p in again["points"]] == [p["loss"] for p in runs["gaussian"]["points"]]
    # bench/rl_job_steps.py: the job's actor steps from that μ against the run's last critic
    got = rl_job_steps.trace(folder, 4, 2, 0.5, [1, 2], [10_000])
    assert got["learner"] == "crossq-sac" and got["critic_version"] >= 1
    assert [[p["steps"] for p in s["points"]] for s in got["seeds"]] == [[2, 4], [2, 4]]
    assert got["seeds"][0]["points"] != got["seeds"][1]["points"]  # each seed draws its own batches
    # bench/replay_sources.py: the replay read back by source, and a fresh agent trained on parts of it
    cfg, episodes = replay_sources.read_episodes(folder, 3_000)
    sizes = {src: sum(len(ep["rew"]) for s, ep in episodes if s == src) for src in replay_sources.SOURCES}
    assert sum(sizes.values()) >= 3_000 and sizes["random"] >= cfg.initial_steps // 2
    assert sizes["random_mu"] > 0 and sizes["mu"] > 0 and sizes["es"] + sizes["rl"] > 0
    sources = replay_sources.subset_sources("all-mu-random_mu")
    assert sources == {"random", "es", "rl"}
    part = replay_sources.train(cfg, episodes, sources, 0, 40, 20)
    assert part["size"] == sizes["random"] + sizes["es"] + sizes["rl"] and [p["steps"] for p in part["points"]] == [20, 40]
    assert replay_sources.train(cfg, episodes, sources, 0, 40, 20)["points"] == part["points"]  # seeded
    assert replay_sources.train(cfg, episodes, sources, 1, 40, 20)["points"] != part["points"]
    with pytest.raises(SystemExit, match="subsets"):
        replay_sources.subset_sources("all-critic")
