"""Every algorithm of the paper end to end on the same runtime: a private Redis, real `rq worker`
processes, `aesrl-queue scheduler start` / `run`, Pendulum-v1 with tiny networks and small budgets.

Each test checks what distinguishes its algorithm: the asynchronous loops keep every worker busy
and update after every result, cemrl never has two jobs in flight, pcemrl tells once per whole
generation and starts the next only after that, es never makes an RL job, td3 makes one update per
env step after its start steps. The Redis server and two workers are shared by the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aesrl_queue import noise
from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers import needs_critic_daemon
from aesrl_queue.store import Store, decode_result
from tests.conftest import ROOT, Procs, child_env, wait_for

WORKERS = 2
TINY = ("--hidden", "16,16", "--critic-hidden", "32,32", "--seed", "5")
CONFIG = """
env_id = "Pendulum-v1"
mean_eval_episodes = 1
rl_steps_max = 200
critic_chunk = 200
critic_wait = 60.0
population = 4
initial_steps = 400
td3_eval_every = 400
"""


# -- fast checks of the pieces (no processes) ---------------------------------------------------------
def test_generation_members_are_plain_version_seed_jobs() -> None:
    """The sync loop's member seeds rebuild exactly the antithetic rows that CEM's ask() makes."""
    from aesrl_queue.optimizers import generation_seed
    from aesrl_queue.optimizers.cem import build_cem

    cfg = RunConfig.from_preset("Pendulum-v1", algo="pcemrl", hidden=(8, 8))
    dist = build_cem(cfg, np.linspace(-1, 1, 50, dtype=np.float32))
    seeds, pop = dist.ask(cfg.population, generation_seed(cfg.seed, 3))
    members = [*seeds[0::2], *[noise.mirrored(s) for s in seeds[0::2]]]
    rows = [*pop[0::2], *pop[1::2]]
    for seed, row in zip(members, rows, strict=True):
        np.testing.assert_array_equal(noise.sample(dist.mean, dist.var, seed), row)
    assert len(set(members)) == cfg.population


def test_which_processes_each_algorithm_needs() -> None:
    from aesrl_queue.optimizers import needs_critic_daemon, needs_workers

    def cfg(algo, **kw):
        return RunConfig.from_preset("Pendulum-v1", algo=algo, **kw)

    assert not needs_critic_daemon(cfg("es")) and needs_workers(cfg("es"))
    assert not needs_critic_daemon(cfg("aesrl", rl_ratio=0.0))
    assert not needs_critic_daemon(cfg("td3")) and not needs_workers(cfg("td3"))
    for algo in ("aesrl", "opo", "acemrl", "cemrl", "pcemrl"):
        assert needs_critic_daemon(cfg(algo)) and needs_workers(cfg(algo)), algo
    assert cfg("cemrl").critic_on_request and cfg("pcemrl").critic_on_request
    assert not cfg("pcemrl", parallel_critic=True).critic_on_request


def test_baseline_settings_win_over_the_env_preset_and_lose_to_options() -> None:
    td3 = RunConfig.from_preset("Pendulum-v1", algo="td3")
    assert td3.hidden == (256, 256) and td3.actor_lr == 3e-4 and td3.expl_noise == 0.1
    assert td3.initial_steps == 10_000  # its official start steps, over the preset's 2000
    assert RunConfig.from_preset("Pendulum-v1", algo="td3", hidden=(16, 16)).hidden == (16, 16)
    assert RunConfig.from_preset("Pendulum-v1", algo="cemrl").batch_size == 100
    assert RunConfig.from_preset("Pendulum-v1", algo="aesrl").hidden == (64, 64)


# -- shared processes -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import RedisServer

    base = tmp_path_factory.mktemp("algos")
    server = RedisServer(directory=base / "redis").start()
    (base / "logs").mkdir()
    procs = Procs(base / "logs")
    for i in range(WORKERS):
        procs.rq_worker(f"worker-{i}", server.url)
    cfg_file = base / "tiny.toml"
    cfg_file.write_text(CONFIG)
    client = connect(server.url)
    try:
        yield {"url": server.url, "client": client, "procs": procs, "config": str(cfg_file), "dir": base}
    finally:
        procs.stop_all()
        client.close()
        server.cleanup()


class Sampler:
    """Polls a run's in-flight count, steps and status every 20 ms while it runs."""

    def __init__(self, client, run: str) -> None:
        self.store = Store(client, run)
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        r = self.store.r
        while not self._stop.is_set():
            pipe = r.pipeline()
            pipe.hlen(self.store.key("inflight"))
            pipe.hmget(self.store.key("state"), ["status", "steps", "rl_applied", "critic_version"])
            n, (status, steps, rl, critic) = pipe.execute()
            self.samples.append({"inflight": n, "status": (status or b"").decode(), "steps": int(steps or 0),
                                 "rl": int(rl or 0), "critic": int(critic or 0)})
            time.sleep(0.02)

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


def run_scheduler(cluster, algo: str, run: str, steps: int, *extra: str, critic: bool = True,
                  config: str | None = None) -> dict:
    """Start `scheduler start` (and `critic start`) for one run, watch it, and collect what it left."""
    procs, client = cluster["procs"], cluster["client"]
    procs.cli(f"{run}-scheduler", "scheduler", "start", "--redis-url", cluster["url"], "--config",
              config or cluster["config"],
              "--algo", algo, "--run-id", run, "--steps", str(steps), *TINY, *extra)
    if critic:
        procs.cli(f"{run}-critic", "critic", "start", "--redis-url", cluster["url"], "--run", run)
    store = Store(client, run)
    wait_for(store.exists, 60, what="the run's config", on_fail=procs.logs)
    sampler = Sampler(client, run)
    try:
        wait_for(lambda: store.status() in ("finished", "failed"), 240, interval=0.5, what=f"{algo} to finish",
                 on_fail=procs.logs)
    finally:
        samples = sampler.stop()
    assert procs.procs[f"{run}-scheduler"].wait(30) == 0, procs.log(f"{run}-scheduler")
    return collect(client, run, samples)


def collect(client, run: str, samples: list[dict] | None = None) -> dict:
    store = Store(client, run)
    results = []
    for entry_id, fields in client.xrange(store.key("results")):
        res = decode_result(entry_id, fields)
        end = int(entry_id.split(b"-")[0]) / 1000.0
        results.append({"res": res, "start": end - res.duration, "end": end})
    return {"store": store, "state": store.state(), "history": [h for _i, h in store.history()],
            "results": results, "samples": samples or []}


def overlapping(results: list[dict]) -> int:
    """The number of pairs of jobs whose executions overlapped in time."""
    spans = sorted((r["start"], r["end"]) for r in results if r["res"].ok)
    return sum(1 for (_s0, e0), (s1, _e1) in zip(spans, spans[1:], strict=False) if s1 < e0 - 0.01)


def check_common(out: dict, steps: int) -> None:
    st, history = out["state"], out["history"]
    assert st["status"] == "finished" and st["steps"] >= steps, st
    # Same metrics for every algorithm: f(μ) against stored steps, interactions and wall clock.
    for h in history:
        assert {"steps", "interactions", "t", "f_mu", "f_z", "kind", "version"} <= set(h), h
    steps_seen = [h["steps"] for h in history]
    assert steps_seen == sorted(steps_seen)
    assert np.isfinite(history[-1]["f_mu"]), history[-1]
    results = [r["res"] for r in out["results"] if r["res"].ok]
    if not results:  # td3: its evaluation episodes are interactions, not stored
        assert st["interactions"] > st["steps"], st
        return
    # Every step a job played is an interaction. A run with a replay stores them all, μ's f(μ)
    # episodes included; a run without one stores none and counts the individuals' episodes as steps.
    played = sum(r.length + r.mirror_len + r.eval_steps for r in results)
    assert st["interactions"] == played, (st, played)
    stored = played if needs_critic_daemon(out["store"].config()) else played - sum(r.eval_steps for r in results)
    assert st["steps"] == stored, (st, stored)
    assert history[-1]["steps"] <= st["steps"] and history[-1]["interactions"] <= st["interactions"], history[-1]


# -- the asynchronous loops -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["aesrl", "acemrl", "opo"])
def test_async_algorithms_keep_every_worker_busy_and_update_per_result(cluster, algo) -> None:
    steps = 6000 if algo == "acemrl" else 3000  # acemrl fills its rank window of 10 first; each job stores two episodes
    # aesrl with a fixed r: this test is about one update per result as results arrive, and the
    # adaptive scale (tests/test_fitness.py) holds μ still for its first gaps and worse individuals.
    fixed_r = ("--r", "200") if algo == "aesrl" else ()
    out = run_scheduler(cluster, algo, f"alg-{algo}", steps, "--initial-steps", "400", *fixed_r)
    check_common(out, steps)
    st, history = out["state"], out["history"]
    assert st["rl_applied"] > 0 and st["es_applied"] > 0, st
    # Every worker given work: once the first critic lets RL jobs flow, the loop has a job in flight
    # for every worker at once, and never more than one running and one queued per worker.
    samples = out["samples"]
    resumed = next(i for i, s in enumerate(samples) if s["critic"] > 0 and s["inflight"] > 0)
    steady = [s for s in samples[resumed:] if s["status"] == "running" and s["steps"] + 4 * 200 < steps]
    assert steady and max(s["inflight"] for s in steady) >= WORKERS, [(s["inflight"], s["steps"]) for s in steady]
    # (in-flight entries also hold a finished job whose result waits for the next paced commit, while its
    # worker already runs the job refilled in its place: one per worker here, where a job outlasts the
    # 100 ms between commits)
    assert max(s["inflight"] for s in samples) <= 3 * WORKERS, [s["inflight"] for s in samples]
    # No worker idles from then on: each one reports results after the first RL result.
    first_rl = next(i for i, r in enumerate(out["results"]) if r["res"].kind == "rl")
    assert len({r["res"].worker for r in out["results"][first_rl + 1:]}) == WORKERS, first_rl
    assert overlapping(out["results"]) > 0
    assert len({r["res"].worker for r in out["results"]}) == WORKERS
    # One update (one history entry, applied at once) per result, not per generation.
    assert len(history) == st["results_applied"]
    changed = [b["version"] > a["version"] for a, b in zip(history, history[1:], strict=False)]
    if algo == "acemrl":
        # The rank window of 10 fills first; from then on every result moves μ and var.
        assert history[8]["version"] == 0 and all(changed[9:]), [h["version"] for h in history]
    elif algo == "opo":
        assert all(changed), [h["version"] for h in history]  # the success rule rescales var every time
    else:
        assert sum(changed) >= 0.5 * len(changed), [h["version"] for h in history]
        # the history keeps how far training moved each RL individual from its μ (the scheduler measures
        # it from the individual and the version the job was drawn from) beside the job's own facts
        rl = [r["res"] for r in out["results"] if r["res"].kind == "rl" and r["res"].ok]
        hist = {h["job"]: h for h in history}
        told = [hist[r.job]["dist_after"] for r in rl if r.job in hist]
        assert rl and told and all(d is not None and d > 0 for d in told), told
    assert all(h["worker"] and h["dispatched_at"] > 0 and h["duration"] > 0 for h in history), history[:3]


@pytest.mark.slow
def test_es_enqueues_no_rl_job_and_run_starts_no_critic(cluster, tmp_path) -> None:
    run, steps = "alg-es", 1200
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--redis-url", cluster["url"], "--config", cluster["config"],
         "--algo", "es", "--run-id", run, "--steps", str(steps), "--workers", "1", "--out", str(tmp_path), *TINY],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted(p.name for p in (tmp_path / run / "logs").iterdir())
    assert "critic.log" not in logs and "worker-0.log" in logs, logs
    out = collect(cluster["client"], run)
    check_common(out, steps)
    st = out["state"]
    assert st["rl_applied"] == 0 and st["n_rl"] == 1 and st["critic_version"] == 0, st  # n_rl starts at 1
    assert {r["res"].kind for r in out["results"]} == {"es"}
    assert st["dispatched"] >= st["results_applied"] > 0
    # Without a critic there is no random phase: the first individuals evaluate their own parameters.
    assert not any(h["random"] for h in out["history"])
    # es_antithetic (the es default): every job stored both episodes of its pair and ran none of μ;
    # its f(μ) is the pair's mean and each history entry describes the better of the two.
    results = {r["res"].job: r["res"] for r in out["results"]}
    for res in results.values():
        assert res.eval_steps == 0 and res.mirror_len > 0 and np.isfinite(res.mirror_fitness), res
        assert res.f_mu == pytest.approx(0.5 * (res.fitness + res.mirror_fitness)), res
    for h in out["history"]:
        res = results[h["job"]]
        assert h["f_z"] == max(res.fitness, res.mirror_fitness) and h["f_pair_worse"] <= h["f_z"], (h, res)
        assert h["mirror_won"] == (res.mirror_fitness > res.fitness), (h, res)
    assert sum(r.length + r.mirror_len for r in results.values()) == st["steps"]
    # The individual the scheduler kept (rebuilt there from version and seed, the mirror as μ − σ·ε)
    # earns again, from its job's start state, the return the worker measured for it.
    from aesrl_queue.numpy_actor import NumpyActor
    from aesrl_queue.rollout import run_episodes

    best = out["store"].read_best()
    res = results[best["job"]]
    assert best["fitness"] == max(res.fitness, res.mirror_fitness)
    cfg = out["store"].config()
    actor = NumpyActor(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation)
    actor.set_params(best["params"])
    again = run_episodes(cfg.env_id, actor, k=1, seed=res.seed % (2**31), store=False).returns[0]
    assert again == pytest.approx(best["fitness"], rel=1e-5, abs=1e-3), (again, best["fitness"], res)


# -- the synchronous loops ------------------------------------------------------------------------------
def generations(history: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for h in history:
        out.setdefault(h["generation"], []).append(h)
    return out


def check_generations(out: dict, population: int) -> dict[int, list[dict]]:
    gens = generations(out["history"])
    st = out["state"]
    assert len(gens) == st["generation"] >= 3, (len(gens), st)
    by_job = {r["res"].job: r for r in out["results"]}
    for g, entries in gens.items():
        # A generation is told exactly once, with its last member, after all members returned.
        assert len(entries) == population and sorted(h["member"] for h in entries) == list(range(population))
        assert [h["told"] for h in entries] == [False] * (population - 1) + [True]
        assert {h["version"] for h in entries[:-1]} == {g} and entries[-1]["version"] == g + 1
        # One member plays μ's episode, the first ES member (the first of all in the random phase);
        # the others play their own episode only. The run's f(μ) after the generation is that episode's.
        first_es = min(h["member"] for h in entries if h["kind"] == "es")
        for h in entries:
            res = by_job[h["job"]]["res"]
            assert res.version == g, (g, h)
            if h["member"] == first_es:
                assert res.f_mu_version == g and res.eval_steps == res.length and np.isfinite(res.f_mu), (g, res)
            else:
                assert res.f_mu_version == -1 and res.eval_steps == 0 and not np.isfinite(res.f_mu), (g, res)
        assert entries[-1]["f_mu"] == by_job[next(h["job"] for h in entries if h["member"] == first_es)]["res"].f_mu
        if g + 1 in gens:
            told_at = entries[-1]["t"]
            last_end = max(by_job[h["job"]]["end"] for h in entries)
            for h in gens[g + 1]:
                # Generation g+1 was neither dispatched nor started before g was told.
                assert h["dispatched_at"] >= told_at - 0.01, (g, h)
                assert by_job[h["job"]]["start"] >= last_end - 0.05, (g, h, by_job[h["job"]])
    # Antithetic pairs through the runtime: members i and i + P/2 share one seed, mirrored.
    for entries in gens.values():
        seeds = {h["member"]: by_job[h["job"]]["res"].seed for h in entries}
        half = population // 2
        assert all(seeds[i + half] == noise.mirrored(seeds[i]) for i in range(half)), seeds
    # After the random phase, the first half of each generation is RL-trained.
    last = sorted(gens[max(gens)], key=lambda h: h["member"])
    assert [h["kind"] for h in last] == ["rl"] * (population // 2) + ["es"] * (population // 2)
    return gens


@pytest.mark.slow
def test_cemrl_never_has_two_jobs_in_flight(cluster) -> None:
    steps, population = 3000, 4  # a generation stores 1 000 steps: 4 members' episodes and one of μ
    out = run_scheduler(cluster, "cemrl", "alg-cemrl", steps, "--initial-steps", "600")
    check_common(out, steps)
    check_generations(out, population)
    assert max(s["inflight"] for s in out["samples"]) == 1
    assert overlapping(out["results"]) == 0, [(r["start"], r["end"]) for r in out["results"]]
    # The critic trained between generations, on request: the previous generation's steps in all
    # (the official prev_actor_steps / n_rl before each RL member).
    st = out["state"]
    assert st["critic_steps"] == int(st["critic_request"]) > 0, st


@pytest.mark.slow
@pytest.mark.parametrize("critic_mode", ["--serial-critic", "--parallel-critic"])
def test_pcemrl_tells_once_per_generation_behind_a_barrier(cluster, critic_mode) -> None:
    steps, population = 3000, 4  # a generation stores 1 000 steps: 4 members' episodes and one of μ
    run = f"alg-pcemrl{critic_mode.replace('--', '-').split('-critic')[0]}"
    out = run_scheduler(cluster, "pcemrl", run, steps, "--initial-steps", "600", critic_mode)
    check_common(out, steps)
    gens = check_generations(out, population)
    # The members of a generation ran on all workers at once.
    assert max(s["inflight"] for s in out["samples"]) == population
    assert overlapping(out["results"]) > 0
    st = out["state"]
    if critic_mode == "--serial-critic":
        assert st["critic_steps"] == int(st["critic_request"]) > 0, st
    else:
        assert int(out["store"].state_field("critic_request")) == 0 and st["critic_version"] >= 1, st
    assert len(gens) >= 3


# -- TD3 ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_td3_runs_alone_and_updates_once_per_env_step(cluster, tmp_path) -> None:
    run, steps, start = "alg-td3", 1000, 400
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--redis-url", cluster["url"], "--config", cluster["config"],
         "--algo", "td3", "--run-id", run, "--steps", str(steps), "--out", str(tmp_path), *TINY],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted(p.name for p in (tmp_path / run / "logs").iterdir())
    assert logs == ["scheduler.log"], logs  # no workers, no critic daemon
    out = collect(cluster["client"], run)
    check_common(out, steps)
    st, history = out["state"], out["history"]
    assert out["results"] == []  # no RQ jobs at all
    assert int(out["store"].state_field("td3_updates")) == st["steps"] - start == steps - start
    # Per episode: updates so far = env steps after the start steps.
    for h in history:
        assert h["updates"] == max(0, h["steps"] - start), h
    assert [h["kind"] for h in history] == ["td3"] * (steps // 200)
    evaluated = [h for h in history if h["evaluated"]]
    assert len(evaluated) >= 2 and all(np.isfinite(h["f_mu"]) for h in evaluated)
    # `status` and the run folder work for it like for any run.
    status = subprocess.run([sys.executable, "-m", "cli.main", "status", "--redis-url", cluster["url"],
                             "--run", run, "--json"], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                            timeout=60)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["algo"] == "td3" and data["status"] == "finished" and data["steps"] == steps
    metrics = Path(tmp_path / run / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == len(history)
    # each episode after the start steps records its learner: the last critic step's loss and mean Q1
    # (td3 has no temperature α); metrics.jsonl carries them
    learned = [h for h in history if h["updates"] > 0]
    assert learned and all(np.isfinite(h["critic_loss"]) and np.isfinite(h["q1_mean"]) and "alpha" not in h
                           for h in learned)
    assert not any("critic_loss" in h for h in history if h["updates"] == 0)
    recs = [json.loads(line) for line in metrics]
    assert [r["critic_loss"] for r in recs if "critic_loss" in r] == [h["critic_loss"] for h in learned]


# -- another learner ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_td3_and_aesrl_run_with_the_crossq_learner(cluster, tmp_path) -> None:
    """`--learner crossq` end to end: td3 alone trains its batch-renormalised critic with a policy step
    every third update; aesrl's critic daemon publishes it and RL jobs climb it."""
    crossq = ("--learner", "crossq", "--hidden", "16,16", "--critic-hidden", "32,32", "--seed", "5")
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--redis-url", cluster["url"], "--config", cluster["config"],
         "--algo", "td3", "--run-id", "alg-td3-crossq", "--steps", "1000", "--out", str(tmp_path), *crossq],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = collect(cluster["client"], "alg-td3-crossq")
    check_common(out, 1000)
    store = out["store"]
    assert store.config().learner == "crossq" and int(store.state_field("td3_updates")) == 600
    ckpt = store.load_checkpoint("td3")
    assert ckpt["total_it"] == 600 and "critic_stats" in ckpt and "actor_target" not in ckpt

    steps = 3000
    out = run_scheduler(cluster, "aesrl", "alg-aesrl-crossq", steps, "--initial-steps", "400", "--r", "200",
                        "--learner", "crossq")
    check_common(out, steps)
    st = out["state"]
    assert st["rl_applied"] > 0 and st["critic_version"] > 0, st
    weights = out["store"].read_critic()[1]
    assert set(weights) == {"critic", "critic_stats"}
    rl = [r["res"] for r in out["results"] if r["res"].kind == "rl" and r["res"].ok]
    assert rl
