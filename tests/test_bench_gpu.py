"""bench/gpu.py at toy sizes on the CPU: the micro table and a short race of two real runs (a machine
with CUDA adds the CUDA rows; the numbers themselves are docs/performance.md §5's business)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, child_env


def bench(*args: str, timeout: float) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_micro_prints_a_row_per_device_with_measured_rates():
    out = bench("micro", "--env", "Pendulum-v1", "--hidden", "16,16", "--rl-steps", "20", "--seconds", "0.3",
                timeout=120)
    row = next(line for line in out.splitlines() if line.startswith("| cpu"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and float(cells[2]) > 0  # critic steps/s, seconds of 20 actor steps


@pytest.mark.slow
def test_race_runs_aesrl_beside_td3_and_tables_f_mu_against_wall_clock(tmp_path):
    out = bench("race", "--env", "Pendulum-v1", "--hidden", "16,16", "--random-steps", "400", "--minutes", "0.5",
                "--workers", "1", "--snapshot-every", "5", "--out", str(tmp_path), timeout=240)
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["exit"] == {"aesrl": 143, "td3": 143}  # both ran the whole time, then took SIGTERM
    for algo in ("aesrl", "td3"):
        run = res["runs"][algo]
        assert "error" not in run, run  # its run folder could not be read (a run that did not start)
        assert run["steps"] > 400, run  # past the random phase
        # td3 estimates f(μ) every few steps; aesrl's estimates come from ES pairs (one job in ten under the
        # default), which a 30 s race on a loaded machine, one worker and a slow start may not reach.
        assert run["evals"] or algo == "aesrl", run
        assert (tmp_path / f"{algo}-gpu" / "summary.json").is_file()
        # μ every 5 s once the run has announced its Redis (a loaded machine can take 20 s to start
        # one) and at the end, each scored on the 10 fixed start states, the counters rising
        scores = res["scores"][algo]
        marks = [x["at_s"] for x in scores if not x["final"]]
        assert marks and marks == sorted(set(marks)) and set(marks) <= {5, 10, 15, 20, 25}, scores
        assert scores[-1]["final"] and scores[-1]["at_s"] >= 30, scores  # taken when the race stopped
        assert all(len(x["returns"]) == 10 and x["mean"] < 0 for x in scores)  # Pendulum's returns are < 0
        steps = [x["steps"] for x in scores]
        assert steps == sorted(steps) and steps[-1] >= run["steps"], scores
    assert "| 0.5 min |" in out and "stored steps per minute: aesrl" in out
    assert "| final μ |" in out and "aesrl score" in out


@pytest.mark.slow
def test_race_of_one_algorithm_alone(tmp_path):
    out = bench("race", "--env", "Pendulum-v1", "--hidden", "16,16", "--random-steps", "400", "--minutes", "0.3",
                "--algos", "td3", "--out", str(tmp_path), timeout=180)
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["exit"] == {"td3": 143} and res["runs"]["td3"]["steps"] > 400
    assert not (tmp_path / "aesrl-gpu").exists()  # no AES-RL run was started
    assert "td3, alone, for 0.3 min" in out and "aesrl f(μ)" not in out and "stored steps per minute: td3" in out
    table = out[out.index("Pendulum-v1, actor"):]
    assert bench("report", str(tmp_path), timeout=120).strip() == table.strip()  # the same table from the folder
    twice = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "report", str(tmp_path), str(tmp_path)],
                           cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "a second td3 race" in twice.stderr  # not two columns of one run
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "race", "--algos", "sac", "--out",
                           str(tmp_path / "x")], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--algos" in proc.stderr
