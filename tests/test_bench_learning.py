"""bench/learning.py: the protocol it declares, the rows it refuses, the statistics of its report,
and (slow) a --quick run through `aesrl-queue run` and bench/sb3_td3.py on Pendulum-v1 that must
write only to a temporary folder."""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import learning

ROOT = Path(__file__).resolve().parent.parent
PINNED = dict(learning.PINS)  # the installed versions a declaration is made with (the `bench` extra's)


def committed_results() -> dict[str, str]:
    files = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in files if (ROOT / f).exists()}


def test_the_protocol_is_the_issues():
    p = learning.PROTOCOL
    assert p["envs"] == ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"] and p["held_out"] == ["Walker2d-v5"]
    assert p["seeds"]["aesrl"] == p["seeds"]["td3"] == [101, 102, 103, 104, 105]
    assert p["seeds"]["aesrl-paper"] == p["seeds"]["cemrl"] == p["seeds"]["sb3-td3"] == [101, 102, 103]
    assert not set(p["development_seeds"]) & {s for ss in p["seeds"].values() for s in ss}
    assert p["budget_steps"] == 100_000 and p["shared"]["hidden"] == p["shared"]["critic_hidden"] == [256, 256]
    assert p["shared"]["initial_steps"] == p["shared"]["td3_start_steps"] == 10_000
    assert p["eval_seeds"] == list(range(10_000, 10_010))
    # aesrl as the first protocol ran it: its defaults then, which are no longer the defaults
    first = {"algo": "aesrl", "learner": "td3", "rl_steps_max": 2000, "critic_shift": True, "es_antithetic": False,
             "rl_ratio": 0.5, "critic_lag": 5000}
    assert p["algos"]["aesrl"] == first
    assert p["algos"]["aesrl-paper"] == {**first, "r": "paper", "fitness_shift": 0.0, "critic_shift": False,
                                         "rl_steps_max": 10_000}
    # at most three ablations, each one adopted departure of the default returned to the paper
    assert len(learning.ABLATIONS) <= 3 and all(a["algo"] == "aesrl" for a in learning.ABLATIONS.values())
    assert not set(learning.ABLATIONS) & set(p["seeds"])


def test_the_second_protocol_is_the_issues():
    p = learning.PROTOCOL_V2
    x = learning.LEARNER_V2
    assert p["envs"][:3] == learning.PROTOCOL["envs"] and p["envs"][3] == "Ant-v5" and p["held_out"] == ["Ant-v5"]
    assert p["seeds"]["aesrl"] == p["seeds"][x] == [201, 202, 203, 204, 205]
    assert p["seeds"]["td3"] == p["seeds"]["cemrl"] == [201, 202, 203]
    assert len(learning.protocol_cells(p)) == 64
    assert not set(p["development_seeds"]) & {s for ss in p["seeds"].values() for s in ss}
    assert p["algos"]["td3"]["learner"] == "td3" and p["algos"][x] == {"algo": "td3", "learner": x}
    assert p["algos"]["aesrl"]["learner"] == p["algos"]["cemrl"]["learner"] == x
    # the default aesrl: the learner's own actor, antithetic pairs, nine RL individuals in ten
    from aesrl_queue.config import RunConfig

    cfg = RunConfig.from_preset("Hopper-v5", **learning.cell_settings("aesrl", p))
    assert (cfg.rl_steps_max, cfg.es_antithetic, cfg.rl_ratio, cfg.critic_lag, cfg.critic_shift) == (0, True, 0.9, 1000, False)
    assert p["shared"]["critic_hidden"] == [256, 256]  # the size a 2-core CPU trains in a cell's hours
    # pcemrl and acemrl with the learner: development cells, never in the report
    assert learning.cell_settings("pcemrl", p)["learner"] == learning.cell_settings("acemrl", p)["learner"] == x
    assert not set(p["development_algos"]) & set(p["seeds"])
    assert set(p["compared"]) == {x, "td3", "cemrl"}
    assert [m for m in p["milestones"].values() if m[0] == "interactions"] == \
        [["interactions", 25_000], ["interactions", 50_000], ["interactions", 100_000]]
    # the cells run with OpenBLAS's own pick for the CPU, whatever the machine sets
    env = learning.cell_env(p)
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    # development cells never look at the held-out env nor run a report seed
    assert learning.parse_cells("Hopper-v5:aesrl:1,Walker2d-v5:pcemrl:2", p) == [("Hopper-v5", "aesrl", 1),
                                                                                 ("Walker2d-v5", "pcemrl", 2)]
    for bad in ("Ant-v5:aesrl:1", f"Hopper-v5:{x}:201"):
        with pytest.raises(SystemExit):
            learning.parse_cells(bad, p)


def test_a_declaration_keeps_the_whole_pip_freeze(repo, tmp_path):
    path = tmp_path / "learning-protocol-v2.json"
    block = learning.declare(path, "HEAD", repo, protocol=learning.PROTOCOL_V2, versions=PINNED)
    freeze = tmp_path / block["freeze"]["file"]
    assert freeze.name == "learning-protocol-v2-freeze.txt"
    text = freeze.read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == block["freeze"]["sha256"]
    assert any(line.lower().startswith("numpy==") for line in text.splitlines()), text[:500]
    assert block["envs"] == learning.PROTOCOL_V2["envs"]


def test_setup_cfg_pins_the_versions_the_protocol_declares():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    bench = [line.strip() for line in cfg["options.extras_require"]["bench"].splitlines() if line.strip()]
    for name, pin in learning.PINS.items():  # the simulator's module comes from mujoco-core
        assert any(line in (f"{name}=={pin}", f"{name}-core=={pin}") for line in bench), bench


def test_cells_go_seed_by_seed_and_carry_the_snapshot_milestones(tmp_path):
    cells = learning.protocol_cells(learning.PROTOCOL)
    assert len(cells) == 3 * (2 * 5 + 3 * 3) and len(set(cells)) == len(cells)
    assert {c[2] for c in cells[:15]} == {101} and {(c[0], c[1]) for c in cells[:15]} == \
        {(e, a) for e in learning.PROTOCOL["envs"] for a in learning.PROTOCOL["seeds"]}
    assert [c[2] for c in cells] == sorted(c[2] for c in cells)
    assert {c[1] for c in cells if c[2] >= 104} == {"aesrl", "td3"}
    cmd = learning.cell_command("Hopper-v5", "aesrl", 101, learning.PROTOCOL, tmp_path / "aesrl-s101", tmp_path / "c")
    assert cmd[cmd.index("--snapshot-steps") + 1] == "25000,50000,100000"
    assert cmd[cmd.index("--snapshot-interactions") + 1] == "25000,50000,100000"
    assert cmd[cmd.index("--workers") + 1] == "2" and cmd[cmd.index("--steps") + 1] == "100000"
    sb3 = learning.cell_command("Hopper-v5", "sb3-td3", 101, learning.PROTOCOL, tmp_path / "x", tmp_path / "c")
    assert sb3[1].endswith("sb3_td3.py") and sb3[sb3.index("--snapshot-steps") + 1] == "25000,50000,100000"
    assert learning.cell_settings("aesrl-no-lag", learning.PROTOCOL)["critic_lag"] == 0
    assert learning.parse_cells("Hopper-v5:aesrl-rl10k:1") == [("Hopper-v5", "aesrl-rl10k", 1)]
    with pytest.raises(SystemExit):
        learning.parse_cells("Hopper-v5:aesrl-w14:1")  # the development variants are gone


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    """A git repository with one commit on main, a tracked code file and a tracked result file."""
    r = tmp_path / "repo"
    (r / "bench" / "results").mkdir(parents=True)
    git(tmp_path, "init", "-q", "-b", "main", str(r))
    git(r, "config", "user.email", "t@t")
    git(r, "config", "user.name", "t")
    (r / "code.py").write_text("x = 1\n")
    (r / "bench" / "results" / "other.json").write_text("{}\n")
    git(r, "add", ".")
    git(r, "commit", "-qm", "a")
    return r


def good_row(**kw):
    row = {"env": "Hopper-v5", "algo": "aesrl", "seed": 101, "versions": dict(learning.PINS), "wall_s": 1.0,
           "scores": {}}
    return {**row, **kw}


def test_each_refusal(repo, tmp_path):
    path = tmp_path / "learning-protocol.json"
    head = git(repo, "rev-parse", "HEAD")
    assert learning.declare(path, "HEAD", repo, versions=PINNED)["commit"] == head
    learning.record(path, good_row(commit=head), repo)  # clean tree, declared commit on main: recorded
    refusals = {
        "a protocol row only once": (good_row(commit=head), "already has its row"),
        "(d) a development seed": (good_row(commit=head, seed=1), "not a report seed"),
        "(d) a seed only aesrl and td3 run": (good_row(commit=head, algo="cemrl", seed=104), "not a report seed"),
        "(d) an ablation": (good_row(commit=head, algo="aesrl-rl10k"), "not a protocol cell"),
        "(d) another env": (good_row(commit=head, env="Pendulum-v1"), "not a protocol cell"),
        "(e) another mujoco": (good_row(commit=head, versions={**learning.PINS, "mujoco": "3.3.7"}), "mujoco 3.3.7"),
    }
    for what, (row, words) in refusals.items():
        with pytest.raises(learning.Refused, match=re.escape(words)):
            learning.record(path, row, repo)
        assert len(learning.load(path)["rows"]) == 1, what
    # (a) a dirty tree: a tracked code file changed (bench/results/ may change: the bench writes there)
    (repo / "bench" / "results" / "other.json").write_text('{"x": 1}\n')
    assert learning.git_refusals(repo, head) == []
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(learning.Refused, match="dirty: code.py"):
        learning.record(path, good_row(commit=head, seed=102), repo)
    git(repo, "checkout", "-q", "code.py", "bench")
    # (b) another commit than the declared one, even one on main
    git(repo, "commit", "-q", "--allow-empty", "-m", "b")
    with pytest.raises(learning.Refused, match="not the declared commit"):
        learning.record(path, good_row(commit=head, seed=102), repo)
    # (c) a commit main does not contain: refused as a declaration, and as the commit of a row
    git(repo, "checkout", "-q", "-b", "side")
    git(repo, "commit", "-q", "--allow-empty", "-m", "c")
    side = git(repo, "rev-parse", "HEAD")
    with pytest.raises(learning.Refused, match="not an ancestor of main"):
        learning.declare(tmp_path / "fresh.json", side, repo, versions=PINNED)
    assert any("not an ancestor of main" in w for w in learning.git_refusals(repo, side))
    # a declaration is not changed once rows exist
    git(repo, "checkout", "-q", "main")
    with pytest.raises(learning.Refused, match="holds 1 rows"):
        learning.declare(path, "main", repo, versions=PINNED)
    assert learning.declare(path, head, repo, versions=PINNED)["commit"] == head  # the same declaration again is no change
    # a declaration from an interpreter without the pins: its freeze would record another environment
    with pytest.raises(learning.Refused, match=r"mujoco 4\.0\.1 is installed, the protocol pins"):
        learning.declare(tmp_path / "other.json", head, repo, versions={**PINNED, "mujoco": "4.0.1"})
    # no declaration, no row
    with pytest.raises(learning.Refused, match="declares no protocol"):
        learning.record(tmp_path / "none.json", good_row(commit=head), repo)


def test_a_crash_is_recorded_and_the_cell_stays_pending(tmp_path, monkeypatch):
    path = tmp_path / "learning-protocol.json"
    learning.update(path, lambda d: d.update(protocol={**learning.PROTOCOL, "commit": "x", "pins": learning.PINS}))
    monkeypatch.setattr(learning, "run_cell", lambda *a: (tmp_path / "gone", 12.0, "exit 1"))
    code = learning.run_cells([("Hopper-v5", "td3", 101)], learning.PROTOCOL, path, tmp_path, None, 1.0, None, False)
    data = learning.load(path)
    assert code == 1 and data["rows"] == [] and [(c["algo"], c["outcome"]) for c in data["crashes"]] == \
        [("td3", "exit 1")]
    assert ("Hopper-v5", "td3", 101) in learning.protocol_cells(learning.PROTOCOL)  # still pending: no row


def test_runs_beside_each_other_share_the_pending_cells(tmp_path):
    path = tmp_path / "learning-protocol-v2.json"
    learning.update(path, lambda d: d.update(protocol={**learning.PROTOCOL, "commit": "x", "pins": learning.PINS}))
    cells = learning.protocol_cells(learning.PROTOCOL)
    mine = learning.claimed_cells(path, learning.PROTOCOL, cells)
    assert next(mine) == cells[0]
    other = ("import sys, json; from pathlib import Path; from bench import learning; "
             "g = learning.claimed_cells(Path(sys.argv[1]), learning.PROTOCOL, learning.protocol_cells(learning.PROTOCOL)); "
             "print(json.dumps([next(g), next(g)]))")
    got = subprocess.run([sys.executable, "-c", other, str(path)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert [tuple(c) for c in json.loads(got.stdout)] == cells[1:3]  # not the cell this process holds
    # that process is gone: its claims lapse, the first of them is handed out again; a recorded cell never is
    learning.update(path, lambda d: d["rows"].append(dict(zip(("env", "algo", "seed"), cells[1], strict=True))))
    assert next(mine) == cells[2]
    assert list(learning.claimed_cells(path, learning.PROTOCOL, cells[:2])) == [cells[0]]  # this process's own
    # claim on cells[0] was dropped when it asked for the next cell; cells[1] has its row


def test_a_run_past_its_hours_claims_no_further_cell(tmp_path):
    path = tmp_path / "learning-protocol-v2.json"
    learning.update(path, lambda d: d.update(protocol={**learning.PROTOCOL, "commit": "x", "pins": learning.PINS}))
    cells = learning.protocol_cells(learning.PROTOCOL)
    claims = path.with_name(path.stem + ".claims.json")
    code = learning.run_cells(learning.claimed_cells(path, learning.PROTOCOL, cells), learning.PROTOCOL, path,
                              tmp_path, 0.0, 1.0, None, False, total=len(cells))
    assert code == 0 and str(os.getpid()) not in (claims.read_text() if claims.exists() else "")
    assert next(learning.claimed_cells(path, learning.PROTOCOL, cells)) == cells[0]  # still the first to hand out


def test_statistics_on_made_up_scores():
    assert learning.prob_improvement(np.array([1.0, 2, 3]), np.array([2.0, 2, 2])) == 0.5  # 1 win, 1 tie of 3
    assert learning.prob_improvement(np.array([3.0, 4]), np.array([1.0, 2])) == 1.0
    assert learning.iqm(np.array([1.0, 2, 3, 4, 100])) == 3.0  # a quarter of 5 runs trimmed: one each end
    assert learning.verdict([0.9, 0.6, 1.0]) == "ahead" and learning.verdict([0.1, 0.0, 0.4]) == "behind"
    assert learning.verdict([0.7, 0.45, 0.9]) == "level"

    def rows(algo, means):
        return [{"env": "Hopper-v5", "algo": algo, "seed": 101 + i,
                 "scores": {"100": {"mean": m, "returns": [m] * 10}}} for i, m in enumerate(means)]

    made = rows("aesrl", [10, 11, 12, 13, 14]) + rows("td3", [1, 2, 3, 4, 5]) + rows("cemrl", [10, 11, 12]) \
        + rows("sb3-td3", [20, 21, 22]) + rows("aesrl-paper", [12])
    s = learning.summarise(made, learning.PROTOCOL)["Hopper-v5"]["100"]
    a = s["algos"]["aesrl"]
    assert a["n"] == 5 and a["mean"][0] == 12.0 and a["iqm"][0] == 12.0  # IQM of 5: mean of 11, 12, 13
    assert 10 <= a["mean"][1] <= 12 <= a["mean"][2] <= 14
    assert s["vs"]["td3"] == {"p": [1.0, 1.0, 1.0], "verdict": "ahead"}  # every resample: every aesrl run above
    assert s["vs"]["sb3-td3"] == {"p": [0.0, 0.0, 0.0], "verdict": "behind"}
    assert s["vs"]["cemrl"]["verdict"] == "level" and s["vs"]["cemrl"]["p"][1] < 0.5 < s["vs"]["cemrl"]["p"][2]
    assert s["vs"]["aesrl-paper"]["verdict"] == "n < 2"  # one run: no interval, no verdict
    text = learning.report_text({"Hopper-v5": {"100": s}}, learning.PROTOCOL)
    assert "P(aesrl > td3) = 1.00 [1.00, 1.00]: ahead" in text and "P(aesrl > sb3-td3) = 0.00 [0.00, 0.00]: behind" in text
    assert learning.summarise(made, learning.PROTOCOL) == learning.summarise(made, learning.PROTOCOL)  # seeded


@pytest.mark.slow
def test_quick_scores_snapshots_in_a_temporary_folder():
    before = committed_results()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/learning.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    out_dir = Path(re.search(r"results: (\S+)/learning-protocol\.json", proc.stdout).group(1))
    try:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert not out_dir.resolve().is_relative_to(ROOT)
        data = learning.load(out_dir / "learning-protocol.json")
        algos = {"aesrl", "td3"} | ({"sb3-td3"} if importlib.util.find_spec("stable_baselines3") else set())
        assert {r["algo"] for r in data["rows"]} == algos and data["crashes"] == []
        by = {r["algo"]: r for r in data["rows"]}
        for r in data["rows"]:
            assert set(r["scores"]) == {"25", "50", "100", "i25k", "i50k", "i100k"}, r["scores"].keys()
            for key, (kind, n) in learning.QUICK["milestones"].items():
                sc = r["scores"][key]
                assert len(sc["returns"]) == 10 and sc["mean"] == pytest.approx(np.mean(sc["returns"]), abs=1e-3)
                assert sc["at_steps" if kind == "steps" else "at_interactions"] >= n
            assert r["versions"]["gymnasium"] and r["wall_s"] > 0 and len(r["loadavg"]) == 2
            assert 1 <= len(r["curve"]) <= learning.CURVE_POINTS
        # td3's needed interactions leave its evaluation episodes out; aesrl's f(μ) episodes are stored
        # steps (they enter the replay), so every interaction it needed is a stored step
        assert by["td3"]["interactions"] == by["td3"]["steps"] < by["td3"]["env_steps"]
        assert by["aesrl"]["interactions"] == by["aesrl"]["env_steps"] == by["aesrl"]["steps"]
        # the score is deterministic: the same snapshot scores the same returns again
        snap = out_dir / "learning-protocol" / "Pendulum-v1" / "td3-s101" / "snapshots" / "steps-1200.npz"
        assert learning.score_snapshot(snap, learning.QUICK["eval_seeds"])["returns"] == \
            by["td3"]["scores"]["100"]["returns"]
        assert data["summary"]["Pendulum-v1"]["100"]["algos"]["td3"]["n"] == 1
        assert "P(aesrl > td3)" in proc.stdout
        # every row records the processor and the BLAS kernel its processes picked
        assert all(r["machine"]["cpu"] and r["machine"]["blas"] for r in data["rows"])
        # a recorded cell runs again into a folder of its own and gives the same returns (td3 alone is
        # deterministic)
        again = subprocess.run([sys.executable, "bench/learning.py", "--rerun", "Pendulum-v1:td3:101", "--file",
                                str(out_dir / "learning-protocol.json"), "--out-dir", str(out_dir)], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert again.stdout.count("identical") == 6 and (out_dir / "rerun" / "Pendulum-v1" / "td3-s101").is_dir()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert committed_results() == before


def test_the_final_policy_fills_only_milestones_a_run_ended_one_episode_short_of(tmp_path):
    """bench/learning_final.py: td3 on Hopper ends at 99,942 steps; its final actor stands for 100 % and
    100k interactions, marked as such; a run far short of a milestone, or one that did not finish, gets none."""
    sys.path.insert(0, str(ROOT / "bench"))
    import learning_final

    runs = tmp_path / "learning-protocol"
    rows = []
    for seed, (steps, status) in {101: (99_942, "finished"), 102: (60_000, "finished"), 103: (99_990, "failed")}.items():
        folder = runs / "Hopper-v5" / f"td3-s{seed}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"status": status, "steps": steps}))
        (folder / "config.json").write_text(json.dumps({"max_episode_steps": 1000}))
        np.savez(folder / "policy.npz", mu=np.full(3, float(seed), np.float32))
        rows.append({"env": "Hopper-v5", "algo": "td3", "seed": seed, "steps": steps, "interactions": steps,
                     "scores": {"25": {"mean": 1.0}, "50": {"mean": 2.0}}})
    results = tmp_path / "learning-protocol.json"
    results.write_text(json.dumps({"protocol": learning.PROTOCOL, "rows": rows, "crashes": []}))
    scored = []

    def score(path, seeds):  # records what it was asked to score; the scorer itself is the protocol's
        scored.append((Path(path).parent.name, list(seeds)))
        return {"returns": [7.0] * len(seeds), "mean": 7.0}

    done = learning_final.amend(results, runs, score, learning.update)
    assert scored == [("td3-s101", learning.PROTOCOL["eval_seeds"])]  # once, for both milestones
    assert [d.split(" = ")[0] for d in done] == ["Hopper-v5:td3:101 100", "Hopper-v5:td3:101 i100k"]
    after = {r["seed"]: r["scores"] for r in json.loads(results.read_text())["rows"]}
    assert after[101]["100"] == {"returns": [7.0] * 10, "mean": 7.0, "at_steps": 99_942,
                                 "at_interactions": 99_942, "from": "final policy"}
    assert set(after[102]) == set(after[103]) == {"25", "50"}
    assert learning_final.amend(results, runs, score, learning.update) == []  # once only


def test_tables_for_the_docs_call_a_difference_only_with_every_declared_seed(tmp_path):
    """bench/learning_tables.py on made-up rows: the means and their intervals, and P(aesrl > X) with
    a call only where both sides have all their declared seeds (5 td3 runs; 2 of 3 cemrl runs)."""
    def rows(algo, means):
        return [{"env": "Hopper-v5", "algo": algo, "seed": 101 + i, "wall_s": 3600.0,
                 "scores": {"100": {"mean": m, "returns": [m] * 10}}} for i, m in enumerate(means)]

    made = rows("aesrl", [10, 11, 12, 13, 14]) + rows("td3", [1, 2, 3, 4, 5]) + rows("cemrl", [1, 2])
    path = tmp_path / "learning-protocol.json"
    path.write_text(json.dumps({"protocol": {**learning.PROTOCOL, "commit": "0" * 40}, "rows": made,
                                "crashes": [{"cell": "x"}], "summary": {}}))
    before = path.read_text()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learning_tables.py"), str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("12 of 57 cells recorded, 45 pending, 1 crashes, 12.0 h of cells, commit 0000000")
    aesrl = next(line for line in out.splitlines() if line.startswith("| Hopper | aesrl | 5 |"))
    assert re.search(r"\| 12 \[1[01], 1[34]\] \| 12 \[", aesrl), aesrl  # 100 %: mean [CI], then the IQM
    assert "| Hopper | td3 |  |  | 1.00 [1.00, 1.00] ahead |" in out  # 5 against 5: the call
    assert "| Hopper | cemrl |  |  | 1.00 [1.00, 1.00] (5 v 2) |" in out  # no call before cemrl's third seed
    # the calls alone, as the README quotes them: td3 called, cemrl not yet; no row for a milestone no run has
    assert re.search(r"^\| Hopper \| 100 % stored steps \| 12 \[1[01], 1[34]\] \| td3 \|  \|  \| cemrl \|$", out, re.M), out
    assert "100k interactions" not in out
    assert path.read_text() == before  # it writes nothing to the results file
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- protocol tables -->\nold table\n<!-- end protocol tables -->\nafter\n")
    subprocess.run([sys.executable, str(ROOT / "bench" / "learning_tables.py"), str(path), "--doc", str(doc)],
                   cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    text = doc.read_text()
    assert "old table" not in text and text.startswith("intro\n<!-- protocol tables -->\n12 of 57 cells")
    assert "| td3 |  |  | cemrl |\n<!-- end protocol tables -->\nafter\n" in text
    # another protocol's file has lines of its own: the first protocol's tables stay
    from bench.learning_tables import marks

    assert marks(tmp_path / "learning-protocol-v2.json") == ("<!-- protocol v2 tables -->",
                                                            "<!-- end protocol v2 tables -->")
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "learning_tables.py"), str(tmp_path / "none.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such results file" in bad.stderr
