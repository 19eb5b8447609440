"""bench/learning.py: which cells it picks and skips, how it reads a run, and (slow) a --quick run of
every algorithm through `aesrl-queue run` / bench/sb3_td3.py on Pendulum-v1. Shapes only: which rows,
fields and files exist, never the returns. A quick run must write to a temporary folder, never over
the committed results."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench import learning

ROOT = Path(__file__).resolve().parent.parent
ROW_FIELDS = {"env", "algo", "seed", "budget_steps", "interactions", "final", "q25", "q50", "wall_s"}
# Files a full bench running in the background may legitimately rewrite while the suite runs.
FULL_BENCH_OUTPUTS = re.compile(r"bench/results/(learning\.json|learning-repeats\.json|learning/curves-.*\.png)$")


def committed_results() -> dict[str, str]:
    """sha256 of every tracked file under bench/results, but the full learning bench's own outputs."""
    files = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in files
            if not FULL_BENCH_OUTPUTS.match(f) and (ROOT / f).exists()}


def row(env="Pendulum-v1", algo="td3", seed=1, budget=1_200, **kw):
    base = {"env": env, "algo": algo, "seed": seed, "budget_steps": budget, "interactions": 3_000,
            "final": -1.0, "q25": -3.0, "q50": -2.0, "wall_s": 1.0,
            "curve": [[400, 1000, 1.0, -3.0], [800, 2000, 2.0, -2.0], [1200, 3000, 3.0, -1.0]]}
    return {**base, **kw}


def test_window_mean_is_the_last_tenth_and_never_after_the_budget():
    xs = np.array([100.0, 850.0, 950.0, 1000.0, 1100.0])
    ys = np.array([1.0, 2.0, 3.0, 5.0, 100.0])
    assert learning.window_mean(xs, ys, 1000) == 4.0  # 950 and 1000; 1100 came after the budget
    assert learning.window_mean(xs, ys, 500) == 1.0  # nothing in [450, 500]: the last value before
    assert math.isnan(learning.window_mean(xs, ys, 50))


def test_thin_keeps_at_most_the_limit_as_block_means():
    pts = np.arange(800, dtype=float).reshape(400, 2)  # blocks of two rows
    out = learning.thin(pts, 200)
    assert out.shape == (200, 2) and out[:, 0].mean() == pytest.approx(pts[:, 0].mean())
    assert learning.thin(pts[:10]).shape == (10, 2)


def test_cells_run_seed_major_and_parse():
    cells = learning.select_cells(learning.MODES["full"], [], [], [1, 2], "seed")
    assert [c.seed for c in cells] == sorted(c.seed for c in cells)
    first = [str(c) for c in cells if c.seed == 1]
    assert first[:2] == ["HalfCheetah-v5:aesrl:1", "HalfCheetah-v5:aesrl-paper:1"] and "Pendulum-v1:es:1" in first
    assert {c.algo for c in cells if c.env == "Hopper-v5"} == {"aesrl", "aesrl-paper", "td3", "cemrl", "sb3-td3"}
    assert learning.parse_cells("Hopper-v5:td3:2", learning.MODES["full"]) == [learning.Cell("Hopper-v5", "td3", 2)]
    with pytest.raises(SystemExit):
        learning.parse_cells("Hopper-v5:es:1", learning.MODES["full"])  # es runs on Pendulum only


def test_variants_run_only_when_named_and_carry_their_one_change():
    full = learning.MODES["full"]
    assert not {c.algo for c in learning.select_cells(full, [], [], [1], "seed")} & set(learning.VARIANTS)
    named = learning.select_cells(full, ["HalfCheetah-v5"], ["aesrl-rl10k", "td3"], [1], "seed")
    assert [str(c) for c in named] == ["HalfCheetah-v5:td3:1", "HalfCheetah-v5:aesrl-rl10k:1"]
    assert learning.parse_cells("Hopper-v5:opo:1", full) == [learning.Cell("Hopper-v5", "opo", 1)]
    with pytest.raises(SystemExit):
        learning.parse_cells("Pendulum-v1:aesrl-rl10k:1", full)  # variants are MuJoCo cells
    s = full["HalfCheetah-v5"]
    cfg = learning.cell_config(learning.Cell("HalfCheetah-v5", "aesrl-rl10k", 1), s)
    assert cfg["rl_steps_max"] == 10_000 and cfg["initial_steps"] == 10_000
    cmd = learning.cell_command(learning.Cell("HalfCheetah-v5", "aesrl-fixed-linear", 1), s, Path("/x"), None)
    assert cmd[cmd.index("--mean-rule") + 1] == "fixed-linear" and cmd[cmd.index("--algo") + 1] == "aesrl"
    assert "rl_steps_max" not in learning.cell_config(learning.Cell("HalfCheetah-v5", "aesrl", 1), s)
    # variants measured before fitness_shift "alive" became the default rerun as their rows ran: with
    # the survival bonus; the default and the later variants judge without it
    hop = full["Hopper-v5"]
    assert learning.cell_config(learning.Cell("Hopper-v5", "aesrl-pp25", 1), hop)["fitness_shift"] == 0.0
    assert "fitness_shift" not in learning.cell_config(learning.Cell("Hopper-v5", "aesrl-critic-env", 1), hop)
    # and those measured before critic_shift became the default rerun without it
    assert learning.cell_config(learning.Cell("Hopper-v5", "aesrl-linear", 1), hop)["critic_shift"] is False
    assert "fitness_shift" not in learning.cell_config(learning.Cell("Hopper-v5", "aesrl", 1), hop)


def test_every_cell_shares_the_same_settings():
    s = learning.MODES["full"]["HalfCheetah-v5"]
    for algo in s.algos:
        cell = learning.Cell("HalfCheetah-v5", algo, 1)
        cmd = learning.cell_command(cell, s, Path("/x"), Path("/x/c.json"))
        # The same networks for every algorithm (256-256: a 400-300 critic does not fit this machine's budget)
        assert cmd[cmd.index("--hidden") + 1] == "256,256" and cmd[cmd.index("--critic-hidden") + 1] == "256,256"
        assert learning.cell_config(cell, s)["td3_start_steps"] == 10_000
        assert learning.cell_config(cell, s)["initial_steps"] == 10_000
    paper = learning.cell_command(learning.Cell("Hopper-v5", "aesrl-paper", 1), s, Path("/x"), None)
    assert paper[paper.index("--r") + 1] == "paper" and paper[paper.index("--workers") + 1] == "2"
    # the many-worker variants change the number of workers and nothing else
    w14 = learning.cell_command(learning.Cell("HalfCheetah-v5", "aesrl-w14", 1), s, Path("/x"), None)
    assert w14[w14.index("--workers") + 1] == "14"
    assert learning.cell_config(learning.Cell("HalfCheetah-v5", "aesrl-w14", 1), s) == \
        {**learning.cell_config(learning.Cell("HalfCheetah-v5", "aesrl", 1), s), "critic_lag_room": True,
         "random_cap": False}


def test_rows_already_there_are_skipped_and_reported(tmp_path, capsys):
    learning.append_row(tmp_path / "learning.json", row())
    learning.append_row(tmp_path / "learning.json", row(algo="aesrl", interactions=6_000))
    assert learning.main(["--quick", "--out-dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 already in learning.json" in out and "Pendulum-v1:td3:1" not in out.split("to run")[-1]
    assert learning.main(["--quick", "--out-dir", str(tmp_path), "--report"]) == 0
    out = capsys.readouterr().out
    assert "@100%" in out and "At equal environment interactions" in out and "total compute" in out
    assert (tmp_path / "learning" / "curves-Pendulum-v1.png").stat().st_size > 10_000
    # no variant rows, no variants figure; with one, the variants are drawn apart from the main figure
    assert not (tmp_path / "learning" / "curves-Pendulum-v1-variants.png").exists()
    learning.append_row(tmp_path / "learning.json", row(algo="es-pp100", interactions=6_000))
    assert learning.main(["--quick", "--out-dir", str(tmp_path), "--report"]) == 0
    assert "curves-Pendulum-v1-variants.png" in capsys.readouterr().out
    assert (tmp_path / "learning" / "curves-Pendulum-v1-variants.png").stat().st_size > 10_000


def test_repeats_go_to_their_own_file_and_the_every_run_table_uses_each_seeds_median(tmp_path, capsys):
    main, reps = tmp_path / "learning.json", tmp_path / "learning-repeats.json"
    for algo, seed, final in (("aesrl", 1, 100.0), ("aesrl", 2, 300.0), ("td3", 1, 250.0), ("td3", 2, 250.0)):
        learning.append_row(main, row(algo=algo, seed=seed, final=final))
    reps.write_text(json.dumps({"about": "kept", "rows": []}))
    for final, counts in ((200.0, True), (220.0, True), (-999.0, False)):  # seed 1 runs: 100, 200, 220 (+ a variant)
        learning.append_row(reps, row(algo="aesrl", seed=1, final=final, counts=counts))
    assert json.loads(reps.read_text())["about"] == "kept"  # append_row keeps the file's other keys
    # the repeat mode lists a cell that learning.json already has, and says where its row will go
    assert learning.main(["--quick", "--out-dir", str(tmp_path), "--cells", "Pendulum-v1:td3:1", "--repeat",
                          "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 to run as repeats into learning-repeats.json" in out and "Pendulum-v1:td3:1" in out.split("to run")[-1]
    with pytest.raises(SystemExit):
        learning.main(["--quick", "--out-dir", str(tmp_path), "--note", "x", "--dry-run"])
    capsys.readouterr()
    table = learning.table_every_run(learning.load_rows(main), learning.load_rows(reps))
    cols = next(c for c in ([c.strip() for c in x.split("|")] for x in table.splitlines()) if c[1:2] == ["aesrl"])
    # seed 1: median of 100, 200, 220 = 200 (the -999 variant does not count); seed 2: 300 → 250 ± 50
    assert cols[3] == "4" and cols[6] == "250 ± 50" and cols[7] == "200 ± 100"
    assert "aesrl 250 >= td3 250 at 100 %: met" in table
    assert learning.table_every_run(learning.load_rows(main), []) == ""  # nothing to add without repeats


@pytest.mark.slow
def test_learning_quick_rows_in_a_temporary_folder():
    before = committed_results()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/learning.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    out_dir = Path(re.search(r"results: (\S+)learning\.json", proc.stdout).group(1))
    try:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert not out_dir.resolve().is_relative_to(ROOT / "bench" / "results")
        rows = learning.load_rows(out_dir / "learning.json")
        algos = {"aesrl", "td3", "cemrl", "es"} | ({"sb3-td3"} if importlib.util.find_spec("stable_baselines3") else set())
        assert {(r["env"], r["algo"], r["seed"]) for r in rows} == {("Pendulum-v1", a, 1) for a in algos}
        for r in rows:
            assert ROW_FIELDS <= set(r), r.keys()
            assert r["budget_steps"] == 1_200 and r["interactions"] >= r["budget_steps"]
            assert isinstance(r["final"], float) and math.isfinite(r["final"]) and r["wall_s"] > 0
            assert 1 <= len(r["curve"]) <= learning.CURVE_POINTS
            from importlib.metadata import version
            assert r["versions"]["mujoco"] == version("mujoco") and r["versions"]["torch"] == version("torch")
            assert (out_dir / "learning" / "Pendulum-v1" / f"{r['algo']}-s1" / "metrics.jsonl").is_file()
        png = out_dir / "learning" / "curves-Pendulum-v1.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "@100%" in proc.stdout and "Pendulum-v1 --algo es" in proc.stdout
        # A rerun skips the finished cells.
        again = subprocess.run([sys.executable, "bench/learning.py", "--quick", "--out-dir", str(out_dir),
                                "--cells", "Pendulum-v1:td3:1", "--dry-run"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert "1 already in learning.json, 0 to run" in again.stdout, again.stdout
        # bench/rl_probe.py reads a finished run folder back (μ, critic, replay) and trains RL individuals
        probe = subprocess.run([sys.executable, "bench/rl_probe.py", str(out_dir / "learning" / "Pendulum-v1" / "aesrl-s1"),
                                "--settings", "20:1e-3", "--samples", "1"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
        rows = [line.split("|") for line in probe.stdout.splitlines() if line.count("|") == 7]
        assert [r[0].strip() for r in rows] == ["individual", "μ (reference)", "RL 20 steps, lr 0.001"], probe.stdout
        assert float(rows[2][1]) > 0 and all(math.isfinite(float(v)) for v in rows[2][1:7]), rows[2]
        # --action-change: how far fresh-Adam steps move the actions; more steps move them further
        probe = subprocess.run([sys.executable, "bench/rl_probe.py", str(out_dir / "learning" / "Pendulum-v1" / "aesrl-s1"),
                                "--action-change", "--lrs", "1e-3", "--steps", "1,50"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
        [row] = [line.split("|") for line in probe.stdout.splitlines() if line.strip().startswith("0.001 |")]
        (one, _, _), (fifty, _, _) = ([float(v) for v in cell.split("/")] for cell in row[1:])
        assert 0 < one < fifty <= 1.0, probe.stdout
        # --interpolate: t = 0 is μ itself (the reference row's return above), t = 1 the trained individual
        ret_mu = float(rows[1][4])
        probe = subprocess.run([sys.executable, "bench/rl_probe.py", str(out_dir / "learning" / "Pendulum-v1" / "aesrl-s1"),
                                "--interpolate", "--samples", "1", "--ts", "0,1"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, probe.stdout[-2000:] + probe.stderr[-2000:]
        [row] = [line.split("|") for line in probe.stdout.splitlines() if line.strip().startswith("RL 1 |")]
        dist, at0, at1 = (float(v) for v in row[1:])
        assert dist > 0 and round(ret_mu) == at0 and math.isfinite(at1), probe.stdout
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    # Nothing committed changed, and no quick row reached the committed learning.json.
    assert committed_results() == before
    committed = ROOT / "bench" / "results" / "learning.json"
    if committed.exists():
        assert all(r.get("settings", {}).get("mode") != "quick" for r in json.loads(committed.read_text())["rows"])


def test_cheetah_posture_of_a_still_policy_is_upright_and_rows_find_their_folder(tmp_path):
    from aesrl_queue.config import RunConfig
    from aesrl_queue.numpy_actor import NetSpec

    cfg = RunConfig(env_id="HalfCheetah-v5", hidden=(8, 8)).resolve()
    folder = tmp_path / "HalfCheetah-v5" / "aesrl-s1"
    folder.mkdir(parents=True)
    n = NetSpec.from_config(cfg).actor_dim
    np.savez(folder / "policy.npz", config=json.dumps(cfg.to_dict(), default=str), mu=np.zeros(n), var=np.ones(n),
             version=0)
    posture = learning.cheetah_posture(folder, episodes=1)
    # all-zero weights: zero torques, the cheetah stays on its feet and barely moves
    assert posture["turned_over"] == 0.0 and abs(posture["speed"]) < 0.2, posture
    r = row(env="HalfCheetah-v5", algo="aesrl", command=f"python -m cli.main run --out {tmp_path} --run-id aesrl-s1")
    assert learning.row_folder(r, tmp_path) == folder
    path = tmp_path / "learning.json"
    learning.append_row(path, r)
    learning.append_row(path, row(env="HalfCheetah-v5", seed=2, command="x --run-id gone"))  # no folder: left alone
    assert learning.add_postures([path], tmp_path) == 1
    got = learning.load_rows(path)
    assert got[0]["final_posture"]["turned_over"] == 0.0 and "final_posture" not in got[1]
    assert learning.on_its_back(got[0]) is False and learning.on_its_back(got[1]) is None
    assert learning.on_its_back({"final_posture": {"turned_over": 0.98}}) is True


@pytest.mark.slow
def test_posture_watch_follows_a_live_cheetah_run_until_it_ends(tmp_path):
    from tests.conftest import child_env

    log = tmp_path / "run.log"
    with open(log, "w") as fh:
        run = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--env", "HalfCheetah-v5", "--hidden", "8,8",
                                "--critic-hidden", "16,16", "--initial-steps", "1000", "--steps", "4000", "--workers",
                                "1", "--out", str(tmp_path), "--run-id", "pw"], cwd=ROOT, env=child_env(), stdout=fh,
                               stderr=subprocess.STDOUT)
    try:
        url = None
        for _ in range(600):
            if m := re.search(r"redis://127\.0\.0\.1:\d+/0", log.read_text()):
                url = m.group(0)
                break
            time.sleep(0.1)
        assert url, log.read_text()
        out = tmp_path / "watch.jsonl"
        watch = subprocess.run([sys.executable, str(ROOT / "bench" / "posture_watch.py"), "--redis-url", url, "--run",
                                "pw", "--out", str(out), "--every", "0.2"], cwd=ROOT, env=child_env(),
                               capture_output=True, text=True, timeout=240)
        assert watch.returncode == 0, watch.stderr[-2000:]  # it returned because the run ended, not by a timeout
        assert run.wait(60) == 0
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert lines and all(0.0 <= x["turned_over"] <= 1.0 and x["version"] >= 0 for x in lines)
        assert [x["version"] for x in lines] == sorted({x["version"] for x in lines})  # each version once
    finally:
        if run.poll() is None:
            run.kill()
