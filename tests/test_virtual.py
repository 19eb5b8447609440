"""The virtual executor (aesrl_queue/virtual.py): the real scheduler loop, job function and critic daemon
in virtual time, on a real embedded Redis. Same seed and cost model, same metrics.jsonl; results told in
the order they complete; an ordinary run folder.
"""

from __future__ import annotations

import json

import pytest

from aesrl_queue.config import ConfigError, RunConfig
from aesrl_queue.cost_model import CostModel, CostModelError
from aesrl_queue.metrics import read_metrics
from aesrl_queue.virtual import VIRTUAL_FILE, VirtualRun

EPISODE_LEN = 20


def _config(**kw) -> RunConfig:
    """aesrl on a cheap environment with tiny networks: a random phase, then ES and RL jobs against a
    critic the virtual learner trains. The jobs of aesrl's first defaults (TD3; single ES individuals with
    a paired μ episode; RL jobs that train for actor steps), whose durations the cost model tells apart."""
    settings = dict(algo="aesrl", run_id="virtual-t", seed=4, hidden=(8, 8), critic_hidden=(16, 16),
                    env_kwargs={"episode_len": EPISODE_LEN}, total_steps=700, initial_steps=160, batch_size=32,
                    critic_chunk=40, rl_steps_max=30, mean_eval_episodes=1, learner="td3", es_antithetic=False,
                    rl_ratio=0.5, critic_lag=5000)
    settings.update(kw)
    return RunConfig.from_preset("AesrlNull-v0", **settings).resolve()


def _updates(folder) -> list[dict]:
    return [r for r in read_metrics(folder) if r["type"] == "update"]


def _job_number(rec: dict) -> int:
    return int(rec["job"].rsplit("-j", 1)[1])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("virtual-a")
    run = VirtualRun(_config(), 3, CostModel(), out_dir=out)
    run.run()
    return run


def test_the_same_seed_and_cost_model_give_identical_metrics(first_run, tmp_path):
    import aesrl_queue

    cfg = _config()  # again, through the Python API
    fields = ("run_id", "hidden", "critic_hidden", "env_kwargs", "initial_steps", "batch_size", "critic_chunk",
              "rl_steps_max", "mean_eval_episodes", "learner", "es_antithetic", "rl_ratio", "critic_lag")
    again = aesrl_queue.train("AesrlNull-v0", algo="aesrl", steps=cfg.total_steps, seed=cfg.seed, out=tmp_path,
                              virtual_workers=3, cost_model=CostModel().to_dict(),
                              **{name: getattr(cfg, name) for name in fields})
    a, b = first_run.run_dir / "metrics.jsonl", again.folder / "metrics.jsonl"
    assert a.read_bytes() == b.read_bytes()
    records = read_metrics(a)
    kinds = {(r["type"], r.get("kind")) for r in records}
    # not an empty agreement: the random phase, ES and RL updates, μ evaluations and the critic are there
    assert {("update", "es"), ("update", "rl"), ("mu_eval", None), ("critic", None)} <= kinds
    assert first_run.summary["status"] == "finished" and first_run.summary["steps"] >= 700
    assert {r["worker"] for r in records if r["type"] == "update"} <= {f"virtual-{i}" for i in range(3)}


def test_the_default_aesrl_runs_in_virtual_time(tmp_path):
    """aesrl's defaults: the virtual learner trains the learner's own actor, RL jobs play it, ES jobs are
    antithetic pairs and no job plays μ, so every interaction is stored."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="virtual-default", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": EPISODE_LEN}, total_steps=700,
                                initial_steps=160, batch_size=32, critic_chunk=40).resolve()
    assert (cfg.rl_steps_max, cfg.es_antithetic, cfg.learner) == (0, True, "crossq-sac")
    run = VirtualRun(cfg, 3, CostModel(), out_dir=tmp_path)
    summary = run.run()
    assert summary["status"] == "finished" and summary["interactions"] == summary["steps"] >= 700
    records = read_metrics(run.run_dir)
    rl = [r for r in records if r["type"] == "update" and r["kind"] == "rl"]
    es = [r for r in records if r["type"] == "update" and r["kind"] == "es" and not r["random"]]
    assert rl and es and all(r["len"] == EPISODE_LEN for r in rl)
    assert all(r["eval_steps"] == 0 for r in records if r["type"] == "mu_eval")
    assert any(r["type"] == "critic" and r["critic_steps"] > 0 for r in records)


def test_the_daemons_untrained_actor_is_published_when_the_random_phase_ends_with_nothing_in_flight(tmp_path):
    """One worker and no queued job: the random phase ends with no job in flight and no critic step due (one
    per stored step after initial_steps). The daemon publishes its untrained actor then (workers/critic.py),
    and the virtual one at the same moment, so RL jobs follow at once instead of critic_wait's ES jobs."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="virtual-first-actor", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": EPISODE_LEN}, total_steps=400,
                                initial_steps=160, batch_size=32, critic_chunk=40, queued_per_worker=0).resolve()
    run = VirtualRun(cfg, 1, CostModel(), out_dir=tmp_path)
    summary = run.run()
    records = read_metrics(run.run_dir)
    random = [r for r in records if r["type"] == "update" and r["random"]]
    assert sum(r["len"] for r in random) == cfg.initial_steps  # the phase ends exactly, nothing in flight
    first = next(r for r in records if r["type"] == "critic")
    assert (first["critic_version"], first["critic_steps"], first["steps"]) == (1, 0, cfg.initial_steps)
    learned = [r for r in records if r["type"] == "update" and not r["random"]]
    assert summary["rl_applied"] > 0 and learned[0]["kind"] == "rl"  # not the ES jobs of a gate that gave up


def test_the_critic_does_nothing_before_its_start_up(tmp_path):
    """critic_start_s: the daemon's process start-up. The random phase ends long before it, the run holds
    its jobs for a critic (as the scheduler does for a daemon still starting), and the untrained actor
    goes out at the start-up's end, when the executor wakes the critic, with the whole random phase stored."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="virtual-critic-start", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": EPISODE_LEN}, total_steps=500,
                                initial_steps=160, batch_size=32, critic_chunk=40).resolve()
    run = VirtualRun(cfg, 3, CostModel(critic_start_s=2.5), out_dir=tmp_path)
    summary = run.run()
    records = read_metrics(run.run_dir)
    updates = [r for r in records if r["type"] == "update"]
    assert summary["status"] == "finished" and summary["rl_applied"] > 0
    random_ended = max(r["t"] for r in updates if r["random"])
    first = next(r for r in records if r["type"] == "critic")
    assert random_ended < 1.0 and first["t"] == 2.5 and first["critic_steps"] == 0
    assert first["steps"] == sum(r["len"] for r in updates if r["random"])  # no learned job before it
    assert min(r["t"] for r in updates if not r["random"]) > 2.5


@pytest.mark.parametrize("algo", ["opo", "acemrl"])
def test_the_daemons_own_actor_serves_the_other_asynchronous_algorithms(tmp_path, algo):
    """rl_steps_max 0 is not aesrl's alone: opo's and acemrl's RL individuals can be the learner's actor too
    (their single ES individuals still play μ, and its episodes are stored)."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo=algo, run_id=f"virtual-{algo}", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": EPISODE_LEN}, total_steps=700,
                                initial_steps=160, batch_size=32, critic_chunk=40, rl_steps_max=0,
                                learner="crossq-sac").resolve()
    run = VirtualRun(cfg, 3, CostModel(), out_dir=tmp_path)
    summary = run.run()
    assert summary["status"] == "finished" and summary["failed"] == 0
    assert summary["interactions"] == summary["steps"] >= 700
    assert any(r["type"] == "update" and r["kind"] == "rl" for r in read_metrics(run.run_dir))


def test_results_are_told_in_completion_order(tmp_path):
    # RL jobs take 30 actor steps at 0.1 s each (3 s), ES jobs 2·20 environment steps at 1 ms (0.04 s):
    # an RL job dispatched before ES jobs completes after them
    cost = CostModel(env_step_s=1e-3, actor_step_s=0.1, learner_steps_per_s=2000.0, result_latency_s=0.01,
                     publish_latency_s=0.01, job_overhead_s=0.0)
    run = VirtualRun(_config(run_id="virtual-order", total_steps=1400), 4, cost, out_dir=tmp_path)
    summary = run.run()
    # each job stores its individual's episode and μ's: the budget holds to within the jobs in flight
    assert 1400 <= summary["steps"] <= 1400 + 4 * 2 * EPISODE_LEN, summary
    updates = _updates(run.run_dir)
    numbers = [_job_number(u) for u in updates]
    assert numbers != sorted(numbers), "results were told in dispatch order"
    times = [u["t"] for u in updates]
    assert times == sorted(times)
    es = [u for u in updates if u["kind"] == "es" and not u["random"]]
    rl = [u for u in updates if u["kind"] == "rl"]
    assert es and rl
    assert {round(u["duration"], 9) for u in es} == {round(cost.job_seconds(2 * EPISODE_LEN, 0), 9)}
    assert {round(u["duration"], 9) for u in rl} == {round(cost.job_seconds(2 * EPISODE_LEN, 30), 9)}
    # RL results overtaken by the ES results of jobs dispatched after them
    assert any(_job_number(e) > _job_number(u) and e["t"] < u["t"] for u in rl for e in es)
    assert any(u["lag"] > 0 for u in updates)
    # the staleness is what the told order makes it: the versions told between the μ an individual was
    # drawn from (its paired f(μ)'s version) and the one it is told to
    drawn = {r["job"]: r["mu_version"] for r in read_metrics(run.run_dir) if r["type"] == "mu_eval"}
    before = [0] + [u["version"] for u in updates[:-1]]
    assert all(u["lag"] == v - drawn[u["job"]] for u, v in zip(updates, before, strict=True))


def test_the_run_folder_is_an_ordinary_one(tmp_path):
    """`run --virtual-workers` writes a folder that `plot`, `export` and `evaluate` read, that says it is
    virtual, and that `run --resume --steps` continues in virtual time (the commands run in this process:
    a new interpreter spends ~15 s importing on a busy 2-core machine)."""
    from click.testing import CliRunner

    from cli.main import cli

    config = tmp_path / "config.json"
    cfg = _config(algo="es", run_id="virtual-cli", total_steps=400)
    fields = ("algo", "seed", "hidden", "env_kwargs", "total_steps", "mean_eval_episodes", "run_id")
    config.write_text(json.dumps({name: getattr(cfg, name) for name in fields}))
    cost = tmp_path / "cost.json"
    CostModel(env_step_s=1e-4).save(cost)
    out = tmp_path / "runs"
    runner = CliRunner()

    got = runner.invoke(cli, ["run", "--env", "AesrlNull-v0", "--config", str(config), "--virtual-workers", "2",
                              "--cost-model", str(cost), "--out", str(out)])
    assert got.exit_code == 0, got.output[-3000:]
    folder = out / "virtual-cli"
    assert {"config.json", "metrics.jsonl", "policy.npz", "summary.json", VIRTUAL_FILE} <= {
        p.name for p in folder.iterdir()}
    assert (folder / "redis").is_dir()  # its Redis data, to resume from
    facts = json.loads((folder / VIRTUAL_FILE).read_text())
    assert facts["virtual"] and facts["workers"] == 2 and facts["cost_model"]["env_step_s"] == 1e-4
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["virtual"]["cost_model"] == facts["cost_model"]
    assert summary["elapsed_s"] == round(facts["virtual_s"], 1)

    plot = runner.invoke(cli, ["plot", str(folder), "--out", str(tmp_path / "curve.png")])
    assert plot.exit_code == 0, plot.output[-3000:]
    assert (tmp_path / "curve.png").stat().st_size > 0
    export = runner.invoke(cli, ["export", str(folder), "--out", str(tmp_path / "policy.npz")])
    assert export.exit_code == 0, export.output[-3000:]
    assert (tmp_path / "policy.npz").stat().st_size > 0
    evaluate = runner.invoke(cli, ["evaluate", str(folder), "--episodes", "2"])
    assert evaluate.exit_code == 0, evaluate.output[-3000:]
    refused = runner.invoke(cli, ["run", "--resume", str(folder), "--workers", "3"])
    assert refused.exit_code == 2 and "virtual run" in refused.output
    updates = _updates(folder)
    resume = runner.invoke(cli, ["run", "--resume", str(folder), "--steps", "800"])
    assert resume.exit_code == 0, resume.output[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] >= 800
    assert json.loads((folder / "config.json").read_text())["total_steps"] == 800
    facts = json.loads((folder / VIRTUAL_FILE).read_text())
    assert facts["workers"] == 2 and facts["cost_model"]["env_step_s"] == 1e-4
    assert [r["total_steps"] for r in facts["resumes"]] == [800]
    more = _updates(folder)
    # the file goes on after the first run's records, in virtual time that goes on from the first run's end
    assert more[:len(updates)] == updates and len(more) > len(updates)
    assert more[len(updates)]["t"] >= updates[-1]["t"] and more[-1]["version"] > updates[-1]["version"]
    assert facts["virtual_s"] >= more[-1]["t"] > updates[-1]["t"]


def test_the_scheduler_tells_one_result_at_a_time(tmp_path):
    # 8 workers whose jobs take 10 ms against a scheduler that spends 0.25 s on each result: the results
    # wait their turn, and the run goes at the scheduler's pace (4 a second), not the workers'
    cost = CostModel(env_step_s=1e-4, job_overhead_s=0.0, result_latency_s=0.0, publish_latency_s=0.0, tell_s=0.25)
    run = VirtualRun(_config(algo="es", run_id="virtual-tell", total_steps=400), 8, cost, out_dir=tmp_path)
    run.run()
    times = [u["t"] for u in _updates(run.run_dir)]
    assert len(times) >= 10
    assert all(b - a >= 0.25 - 1e-9 for a, b in zip(times, times[1:], strict=False))


def test_a_worker_takes_its_next_job_worker_gap_s_after_its_last(tmp_path):
    # one worker, jobs of 0.05 s and 0.3 s between them: its results come 0.35 s apart, not 0.05 s
    cost = CostModel(env_step_s=1e-3, job_overhead_s=0.01, result_latency_s=0.0, publish_latency_s=0.0,
                     worker_gap_s=0.3)
    run = VirtualRun(_config(algo="es", run_id="virtual-gap", total_steps=400), 1, cost, out_dir=tmp_path)
    run.run()
    updates = _updates(run.run_dir)
    job_length = cost.job_seconds(2 * EPISODE_LEN, 0)  # virtual time: the same on any machine
    assert len(updates) >= 5 and {round(u["duration"], 9) for u in updates} == {round(job_length, 9)}
    times = sorted({u["t"] for u in updates})
    assert all(b - a >= job_length + 0.3 - 1e-9 for a, b in zip(times, times[1:], strict=False))


def test_cost_model_files_and_bad_fields(tmp_path):
    model = CostModel(env_step_s=1e-4, actor_step_s=1e-3, job_overhead_s=0.5)
    assert model.job_seconds(100, 10) == pytest.approx(0.5 + 1e-2 + 1e-2)
    path = model.save(tmp_path / "cost.json", notes={"host": "here"})
    assert CostModel.load(path) == model
    # duration_spread: a factor per job, the same for the same seed and job, of mean 1 and that spread
    spread = CostModel(duration_spread=0.5)
    factors = [spread.spread(4, f"run-j{i}") for i in range(4000)]
    assert factors[:50] == [spread.spread(4, f"run-j{i}") for i in range(50)] != [spread.spread(5, f"run-j{i}")
                                                                                  for i in range(50)]
    mean = sum(factors) / len(factors)
    sd = (sum((f - mean) ** 2 for f in factors) / len(factors)) ** 0.5
    assert mean == pytest.approx(1.0, abs=0.05) and sd / mean == pytest.approx(0.5, abs=0.05)
    assert CostModel().spread(4, "run-j1") == 1.0
    with pytest.raises(CostModelError, match="learner_steps_per_s"):
        CostModel(learner_steps_per_s=0)
    with pytest.raises(CostModelError, match="env_step_s"):
        CostModel.from_dict({"env_step_s": -1})


def test_td3_has_no_virtual_workers(tmp_path):
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="td3", run_id="virtual-td3").resolve()
    with pytest.raises(ConfigError, match="virtual"):
        VirtualRun(cfg, 2, out_dir=tmp_path)


def test_a_killed_virtual_run_resumes(first_run, tmp_path, procs):
    """`run --virtual-workers 3` in its own process, killed with SIGKILL halfway, then `run --resume`: the
    run goes on from what its Redis holds to its budget. Up to the kill it is the uninterrupted run
    (first_run, the same config and cost model), record for record; what follows differs (the jobs in
    flight run again at the resume's virtual time, the critic restarts from its checkpoint), so only its
    consistency is checked: every job told once, versions and virtual times in order."""
    from click.testing import CliRunner

    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import RedisServer
    from aesrl_queue.store import Store, VirtualJobs
    from cli.main import cli
    from tests.conftest import descendants, wait_for
    from tests.faults import wait_pid_exit

    cfg = _config()
    config = tmp_path / "config.json"
    fields = ("algo", "run_id", "seed", "hidden", "critic_hidden", "env_kwargs", "total_steps", "initial_steps",
              "batch_size", "critic_chunk", "rl_steps_max", "mean_eval_episodes", "learner", "es_antithetic",
              "rl_ratio", "critic_lag")
    config.write_text(json.dumps({name: getattr(cfg, name) for name in fields}))
    cost = tmp_path / "cost.json"
    CostModel().save(cost)
    out = tmp_path / "runs"
    folder = out / cfg.run_id
    p = procs.cli("virtual", "run", "--env", "AesrlNull-v0", "--config", str(config), "--virtual-workers", "3",
                  "--cost-model", str(cost), "--out", str(out))
    whole = (first_run.run_dir / "metrics.jsonl").read_text().splitlines()
    total = sum('"type": "update"' in line for line in whole)

    def told() -> int:  # results told after the random phase and the first critic: jobs are in flight
        try:
            return (folder / "metrics.jsonl").read_text().count('"random": false')
        except OSError:
            return 0

    wait_for(lambda: told() >= 2 or p.poll() is not None, 120, interval=0.02,
             what="results after the random phase", on_fail=procs.logs)
    kids = descendants(p.pid)
    p.kill()
    p.wait(10)
    assert all(wait_pid_exit(pid, 20) for pid in kids), "the killed run's redis-server stayed"
    before = (folder / "metrics.jsonl").read_text()
    before = before[:before.rfind("\n") + 1].splitlines()
    assert 0 < sum('"type": "update"' in line for line in before) < total, "the kill did not land mid-run"
    assert before == whole[:len(before)]  # deterministic up to the kill
    assert json.loads((folder / VIRTUAL_FILE).read_text())["workers"] == 3  # written at the start
    with RedisServer(directory=folder / "redis", appendonly=True) as server:
        store = Store(connect(server.url), cfg.run_id)
        inflight, held = set(store.inflight()), set(VirtualJobs(store).all())
        # a job that reported before the kill and was not told yet has its result after last_result_id
        # (a resume tells it first); every other job in flight keeps its arguments and can run again
        told_up_to = store.state().get("last_result_id") or "0-0"
        reported = {f[b"job"].decode() for _, f in store.read_stream("results", told_up_to, count=10**6)}
    assert inflight and inflight <= held | reported

    got = CliRunner().invoke(cli, ["run", "--resume", str(folder)])
    assert got.exit_code == 0, got.output[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] >= cfg.total_steps
    after = (folder / "metrics.jsonl").read_text().splitlines()
    assert after[:len(before)] == before and len(after) > len(before)
    records = [json.loads(line) for line in after]
    updates = [r for r in records if r["type"] == "update"]
    jobs = [u["job"] for u in updates]
    assert len(jobs) == len(set(jobs)), "a result was told twice"
    assert inflight <= set(jobs), "a job in flight at the kill was never told"
    assert [u["version"] for u in updates] == sorted(u["version"] for u in updates)
    assert [r["t"] for r in records if r["type"] != "mu_eval"] == sorted(r["t"] for r in records
                                                                          if r["type"] != "mu_eval")
    facts = json.loads((folder / VIRTUAL_FILE).read_text())
    assert len(facts["resumes"]) == 1 and 0 < facts["resumes"][0]["virtual_s"] < facts["virtual_s"]
    assert facts["cost_model"] == CostModel().to_dict() and facts["workers"] == 3
    assert {("update", "es"), ("update", "rl"), ("critic", None)} <= {
        (r["type"], r.get("kind")) for r in records[len(before):]}
    again = [line for line in got.output.splitlines() if "run again" in line]
    print(f"\nvirtual resume: killed after {sum('update' in line for line in before)} of {total} updates; "
          f"{again}; {len(updates)} updates in all, {summary['steps']} steps")


def test_load_resume_continues_a_virtual_run(tmp_path):
    import aesrl_queue

    run = aesrl_queue.train("AesrlNull-v0", algo="es", steps=400, seed=3, out=tmp_path, run_id="virtual-api",
                            hidden=(8, 8), env_kwargs={"episode_len": EPISODE_LEN}, mean_eval_episodes=1,
                            virtual_workers=2, progress=False)
    before = _updates(run.folder)
    with pytest.raises(aesrl_queue.ConfigError, match="virtual run"):
        aesrl_queue.load(run.folder).resume(steps=800, redis_url="redis://127.0.0.1:1/0")
    again = aesrl_queue.load(run.folder).resume(steps=800, progress=False)
    assert again.summary["status"] == "finished" and again.summary["steps"] >= 800
    after = _updates(run.folder)
    assert after[:len(before)] == before and len(after) > len(before)
    assert json.loads((run.folder / VIRTUAL_FILE).read_text())["resumes"][0]["total_steps"] == 800


def test_fitted_spread_leaves_out_what_the_episode_lengths_explain():
    """A fit's duration_spread is the spread of a job's duration over the model's for its own steps: jobs
    of lengths 40 to 1 000 that take exactly the model's time have spread 0 (their raw durations spread
    by ~0.8); a ±20 % factor on top of them gives that factor's spread."""
    from aesrl_queue.cost_model import duration_ratios, duration_spread, ratio_spread

    model = CostModel(env_step_s=3e-4, job_overhead_s=2e-3)
    lengths = [40, 1000, 120, 600, 75, 900, 300, 55, 800, 200]

    def records(factors):
        out, total = [], 0
        for n, f in zip(lengths, factors, strict=True):
            total += n
            out.append({"type": "update", "kind": "es", "interactions": total,
                        "duration": model.job_seconds(n, 0) * f})
        return out

    exact = records([1.0] * len(lengths))
    assert duration_spread(exact) > 0.6
    # the first result has no count before it: its ratio is unknown
    assert duration_ratios(exact, model) == pytest.approx([1.0] * (len(lengths) - 1))
    assert ratio_spread(duration_ratios(exact, model)) == pytest.approx(0.0, abs=1e-9)
    noisy = records([1.0, 1.2, 0.8] * 3 + [1.0])
    ratios = duration_ratios(noisy, model)
    assert ratios == pytest.approx([1.2, 0.8, 1.0, 1.2, 0.8, 1.0, 1.2, 0.8, 1.0])
    assert ratio_spread(ratios) == pytest.approx(0.1732, abs=1e-3)


def test_calibrate_with_workers_fits_the_gap_and_spread_of_a_real_run(tmp_path):
    """`aesrl-queue calibrate --workers 2` on an environment whose episodes sleep a lognormal time: the
    one-core measures, then a real es run with 2 worker processes, whose workers' time between jobs and
    spread of durations the model takes (both 0 without --workers), its job durations scaled to it."""
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"env_id": "AesrlSleep-v0", "hidden": [8, 8], "critic_hidden": [16, 16],
                                  "env_kwargs": {"episode_len": 10, "mean_s": 0.02, "sigma": 0.5, "seed": 1}}))
    out = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, "-m", "cli.main", "calibrate", "--config", str(config), "--workers", "2",
                           "--out", str(out)], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    model = CostModel.load(out)
    fit = json.loads(out.read_text())["notes"]["fit"]
    assert fit["workers"] == 2 and fit["es_results"] >= 20
    # a job is two sleeping episodes of lognormal length (log-std 0.5 each: ~0.38 for their sum, more
    # where the episodes share a start or a loaded machine adds its own)
    assert model.duration_spread > 0.15, fit
    assert model.worker_gap_s > 0, fit
    assert model.env_step_s == pytest.approx(fit["env_step_s_one_core"] * fit["duration_ratio"])
    # the steps sleep 2 ms each, whatever the load: no real job is much shorter than its one-core time
    assert fit["duration_ratio"] > 0.5, fit


def test_the_random_jobs_in_flight_count_towards_initial_steps(tmp_path):
    """8 virtual workers (16 slots) on a 160-step random phase of 20-step episodes: the random jobs fill
    initial_steps and no more (a refill that sent every free slot random stored 16 × 20 = 320 random
    steps), and the rest of the budget is learned jobs."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="rc", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": 20}, total_steps=1200,
                                initial_steps=160, batch_size=32, critic_chunk=40).resolve()
    run = VirtualRun(cfg, 8, CostModel(), out_dir=tmp_path)
    run.run()
    ups = [r for r in read_metrics(run.run_dir) if r["type"] == "update"]
    assert sum(r["len"] for r in ups if r["random"]) == 160
    assert sum(not r["random"] for r in ups) > 0


def test_the_random_phase_holds_when_short_episodes_come_back_first(tmp_path):
    """InvertedPendulum-v5's random episodes end after 3 to ~30 steps, the short ones first: with 256
    workers the first results are all 3-step episodes, and a cap that counted the jobs in flight at the
    returned episodes' mean length let ~3 500 random steps out for initial_steps 2 000. Counted as full
    episodes, the random phase stores initial_steps and less than one more episode."""

    cfg = RunConfig.from_preset("InvertedPendulum-v5", algo="aesrl", run_id="rc-short", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), total_steps=2600, initial_steps=2000, batch_size=32,
                                critic_chunk=40).resolve()
    run = VirtualRun(cfg, 256, CostModel(), out_dir=tmp_path)
    run.run()
    ups = [r for r in read_metrics(run.run_dir) if r["type"] == "update"]
    lens = [r["len"] for r in ups if r["random"]]
    assert 2000 <= sum(lens) < 2000 + max(lens), (sum(lens), max(lens))
    assert min(lens[:20]) < sum(lens) / len(lens)  # the short episodes did come back first
    assert any(not r["random"] for r in ups)


def test_the_critic_gate_counts_the_jobs_in_flight_against_the_critic_lag(tmp_path):
    """32 virtual workers of 20-step episodes, a critic of 100 steps a second (the run's bottleneck) and
    critic_lag 200 steps: past the random phase no more than 200 / 20 jobs are out at once (a gate that let
    out up to room / 20 jobs at each ask, whatever was in flight, had ~30 out)."""
    from scheduler.critic_gate import ResultGate

    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="gi", seed=4, hidden=(8, 8),
                                critic_hidden=(16, 16), env_kwargs={"episode_len": 20}, total_steps=1600,
                                initial_steps=400, batch_size=32, critic_chunk=40, critic_lag=200).resolve()
    run = VirtualRun(cfg, 32, CostModel(learner_steps_per_s=100.0), out_dir=tmp_path)
    gated, out = ResultGate.ask, []

    def seen(self, n, steps, inflight, critic_version, critic_steps, now):
        jobs = gated(self, n, steps, inflight, critic_version, critic_steps, now)
        if steps >= cfg.initial_steps and critic_version > 0:
            out.append(inflight + len(jobs))  # jobs out once this ask's go
        return jobs

    ResultGate.ask = seen
    try:
        run.run()
    finally:
        ResultGate.ask = gated
    assert out and max(out) <= 200 // 20, max(out)
