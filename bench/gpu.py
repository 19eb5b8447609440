"""GPU check: the critic and RL jobs on CUDA against the CPU, and AES-RL against our TD3 for the same wall clock.

`micro` times, on every device torch sees (the CPU with one thread, as our processes use it, and CUDA
where present), the two things a GPU can speed up in AES-RL, with the run's own functions:
  - critic steps/s: `td3.critic_update` (twin critic, batch 256, TD3 target noise) on a replay of
    100,000 random transitions held on that device, as the critic daemon trains;
  - an RL job's actor training: `td3.train_actor` for the default rl_steps_max actor steps against a
    frozen critic, sampling states from a replay on that device, as `workers.jobs` does; beside it one
    episode of the numpy actor (the job's evaluation, always on the CPU).
The reference row is the CPU; the last row is CPU time / CUDA time.

`race` starts two `aesrl-queue run`s at once for --minutes of wall clock on --env at the paper's
settings (actor and critic 400-300, 10,000 random steps, seed 1): `aesrl` (today's defaults) with
--workers rq workers plus its critic daemon, and `td3` (one process; on CUDA when torch sees one). Then
it SIGTERMs both (each launcher writes its run folder) and prints f(μ) against wall clock for both,
with the stored steps, the paper's Table 1 rate beside them (AES-RL, 9 workers: 1M HalfCheetah-v2
steps in 54 min on 24 cores and 6 GPUs; serial CEM-RL 467 min) and what the aesrl run's logs say of
its critic (steps/s) and its RL and ES jobs (mean seconds). Every --snapshot-every seconds (default a
minute) the race writes each run's μ (td3: the actor it evaluated last, at most td3_eval_every steps
old) to <run>/snapshots/at-<s>s.npz from the run's own Redis; when both are stopped it scores those and
the final μ (policy.npz) deterministically on the learning protocol's 10 fixed start states (seeds
10 000-10 009), the score the training-time f(μ) estimates are not. `report DIR [DIR ...]` prints the
tables again from the run folders, and with several folders (`race --algos aesrl`, then `--algos td3`
on the same machine) puts the runs side by side at equal minutes.

Usage:
    python bench/gpu.py micro [--env HalfCheetah-v5] [--seconds 5] [--hidden 400,300] [--rl-steps N]
    python bench/gpu.py race --out DIR [--minutes 8] [--workers 14] [--env HalfCheetah-v5]
                             [--hidden 400,300] [--random-steps 10000] [--algos aesrl,td3]
                             [--snapshot-every 60]
    python bench/gpu.py report DIR [DIR ...]
On a machine without CUDA both run on the CPU (the test suite runs them so, at toy sizes).
Results (numbers, the command and the device) are written to DIR/gpu.json by race, and printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

PAPER_HIDDEN = "400,300"
PAPER_RANDOM_STEPS = 10_000
# Table 1 of the paper: minutes for 1M HalfCheetah-v2 steps (two machines, 24 cores, 6 GTX 1080 Ti)
PAPER_MIN_PER_1M = {"CEM-RL serial": 467, "P-CEM-RL 5 workers": 83, "AES-RL 9 workers": 54}


def render(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# -- micro ---------------------------------------------------------------------------------------------
def micro(env_id: str, seconds: float, hidden: str = PAPER_HIDDEN, rl_steps: int | None = None) -> dict:
    import torch

    from aesrl_queue.config import RunConfig
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.rollout import run_episodes
    from aesrl_queue.td3 import ReplayBuffer, critic_update, hard_update, train_actor

    torch.set_num_threads(1)
    sizes = tuple(int(x) for x in hidden.split(","))
    cfg = RunConfig.from_preset(env_id, hidden=sizes, critic_hidden=sizes).resolve()
    if rl_steps is not None:
        cfg.rl_steps_max = rl_steps
    spec = NetSpec.from_config(cfg)
    rng = np.random.default_rng(0)
    n = 100_000
    data = {"obs": rng.normal(size=(n, cfg.obs_dim)).astype(np.float32),
            "act": rng.uniform(-1, 1, size=(n, cfg.act_dim)).astype(np.float32),
            "rew": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, cfg.obs_dim)).astype(np.float32),
            "done": np.zeros(n, np.float32)}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    z0 = spec.init_actor_params(1)
    actor_np = spec.make_numpy_actor()
    actor_np.set_params(z0)
    run_episodes(cfg.env_id, actor_np, k=1, seed=0, store=True)  # make and cache the env
    t0 = time.perf_counter()
    ep = run_episodes(cfg.env_id, actor_np, k=1, seed=1, store=True)
    episode_s = time.perf_counter() - t0
    rows = []
    for dev in devices:
        replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, n, device=dev)
        replay.add_batch(data["obs"], data["act"], data["rew"], data["next_obs"], data["done"])
        critic, target = spec.make_critic(dev), spec.make_critic(dev)
        hard_update(target, critic)
        opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
        target_actor = spec.make_actor(dev)
        gen = torch.Generator().manual_seed(0)

        def step(critic=critic, target=target, opt=opt, target_actor=target_actor, replay=replay, gen=gen):
            critic_update(critic, target, opt, target_actor, replay.sample(cfg.batch_size, generator=gen),
                          gamma=cfg.gamma, tau=cfg.tau, policy_noise=cfg.policy_noise, noise_clip=cfg.noise_clip,
                          max_action=cfg.max_action)

        critic_sps = timed(step, seconds, dev)
        extra = {}
        if dev == "cuda":
            extra = cuda_variants(spec, cfg, replay, seconds)

        def sample(k, replay=replay, gen=gen):
            return replay.sample(k, generator=gen)["obs"]

        train_actor(z0, spec, critic, sample, steps=10, batch_size=cfg.batch_size, lr=cfg.actor_lr, device=dev)
        t0 = time.perf_counter()
        train_actor(z0, spec, critic, sample, steps=cfg.rl_steps_max, batch_size=cfg.batch_size, lr=cfg.actor_lr,
                    device=dev)
        train_s = time.perf_counter() - t0
        name = torch.cuda.get_device_name(0) if dev == "cuda" else f"CPU, 1 thread ({os.cpu_count()} cores)"
        rows.append({"device": dev, "name": name, "critic_steps_per_s": critic_sps, "train_s": train_s,
                     "actor_step_ms": 1000 * train_s / cfg.rl_steps_max, "episode_s": episode_s,
                     "episode_len": int(ep.lengths[0]), "job_s": train_s + episode_s, **extra})
    out = {"env": env_id, "hidden": hidden.replace(",", "-"), "batch": cfg.batch_size, "rl_steps": cfg.rl_steps_max,
           "torch": torch.__version__, "rows": rows}
    print(micro_table(out))
    return out


def timed(step, seconds: float, dev: str, warm: int = 20) -> float:
    """Calls of `step` per second over `seconds`, after `warm` calls, the device drained at both ends."""
    import torch

    for _ in range(warm):
        step()
    if dev == "cuda":
        torch.cuda.synchronize()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        done += 1
    if dev == "cuda":
        torch.cuda.synchronize()
    return done / (time.perf_counter() - t0)


def cuda_variants(spec, cfg, replay, seconds: float) -> dict:
    """What limits the critic on CUDA: the same update (1) without reading the loss back every step and
    (2) captured once as a CUDA graph and replayed (sampling, target, both critics, Adam with its state
    on the device, soft update), so that Python issues one launch per step instead of ~100."""
    import torch

    from aesrl_queue.td3 import critic_step, hard_update

    out = {}
    dev = replay.device.type  # the daemon's sampler and update, on `replay`'s device (CPU: no graph)
    size = torch.tensor(float(len(replay)), device=dev)  # the daemon's replay grows: a tensor, not a constant
    for name, capturable in (("nosync", False), ("graph", True))[:2 if dev == "cuda" else 1]:
        critic, target = spec.make_critic(dev), spec.make_critic(dev)
        hard_update(target, critic)
        opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr, capturable=capturable)
        target_actor = spec.make_actor(dev)

        def step(critic=critic, target=target, opt=opt, target_actor=target_actor):
            return critic_step(critic, target, opt, target_actor, replay.sample_in_graph(cfg.batch_size, size),
                               cfg.gamma, cfg.tau, cfg.policy_noise, cfg.noise_clip, cfg.max_action, True, None)

        if name == "nosync":
            out["critic_steps_per_s_nosync"] = timed(step, seconds, dev)
            continue
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(5):  # Adam's state exists before the capture
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            stats = step()
        out["critic_steps_per_s_graph"] = timed(graph.replay, seconds, dev)
        loss = float(stats[0])
        if not math.isfinite(loss):
            raise RuntimeError(f"graphed critic step gave loss {loss}")
        out["graph_loss"] = loss
    return out


def micro_table(m: dict) -> str:
    head = ["device", f"critic steps/s (batch {m['batch']})", f"RL training, {m['rl_steps']} actor steps (s)",
            "ms per actor step", f"one episode ({m['rows'][0]['episode_len']} steps, CPU) (s)", "RL job (s)"]
    body = [[f"{r['device']} ({r['name']})", f"{r['critic_steps_per_s']:.0f}", f"{r['train_s']:.2f}",
             f"{r['actor_step_ms']:.2f}", f"{r['episode_s']:.2f}", f"{r['job_s']:.2f}"] for r in m["rows"]]
    if len(m["rows"]) == 2:
        c, g = m["rows"]
        body.append(["CUDA / CPU", f"{g['critic_steps_per_s'] / c['critic_steps_per_s']:.1f}×",
                     f"{c['train_s'] / g['train_s']:.1f}× faster", "", "", f"{c['job_s'] / g['job_s']:.1f}× faster"])
    text = f"{m['env']}, actor and critic {m['hidden']}, torch {m['torch']}\n" + render(head, body)
    g = m["rows"][-1]
    if "critic_steps_per_s_graph" in g:
        text += (f"\nCUDA critic steps/s: {g['critic_steps_per_s']:.0f} as the daemon runs it (loss read back every "
                 f"step), {g['critic_steps_per_s_nosync']:.0f} without that read, {g['critic_steps_per_s_graph']:.0f} "
                 f"replayed as one CUDA graph ({g['critic_steps_per_s_graph'] / g['critic_steps_per_s']:.1f}× the daemon's)")
    return text


RACE_ALGOS = ("aesrl", "td3")


# -- race ----------------------------------------------------------------------------------------------
def race_commands(env_id: str, workers: int, out: Path, hidden: str = PAPER_HIDDEN,
                  random_steps: int = PAPER_RANDOM_STEPS, algos: tuple[str, ...] = RACE_ALGOS) -> dict[str, list[str]]:
    py = [sys.executable, "-m", "cli.main", "run", "--env", env_id, "--hidden", hidden,
          "--critic-hidden", hidden, "--seed", "1", "--steps", "1000000", "--out", str(out)]
    cmds = {}
    for algo in algos:
        cfg_file = out / f"{algo}.config.json"
        cfg_file.write_text(json.dumps({"env_id": env_id, "initial_steps": random_steps,
                                        "td3_start_steps": random_steps, "td3_eval_every": 5000}))
        cmds[algo] = py + ["--algo", algo, "--config", str(cfg_file), "--run-id", f"{algo}-gpu",
                           "--workers", str(workers if algo == "aesrl" else 1)]  # td3 starts no workers
    return cmds


def redis_url_of(log: Path) -> str | None:
    """The embedded Redis a run's launcher announced in its log (`aesrl-queue run` prints it first)."""
    m = re.search(r"embedded Redis on (\S+)", log.read_text(errors="replace")) if log.exists() else None
    return m.group(1) if m else None


def take_snapshots(out: Path, procs: dict, at_s: int) -> None:
    """Each running run's μ now, as `write_policy` writes policy.npz, to snapshots/at-<at_s>s.npz."""
    from aesrl_queue.connection import connect
    from aesrl_queue.local import write_policy
    from aesrl_queue.store import Store

    for algo, proc in procs.items():
        url = redis_url_of(out / f"{algo}.log")
        if proc.poll() is not None or url is None:
            continue
        try:
            client = connect(url, retries=1)
            try:
                write_policy(out / f"{algo}-gpu", Store(client, f"{algo}-gpu"), f"snapshots/at-{at_s}s.npz")
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - a missed snapshot is a gap in the table, not a failed race
            print(f"warning: {algo}: no snapshot at {at_s} s: {type(exc).__name__}: {exc}", flush=True)


def score_snapshots(folder: Path, stopped_s: float) -> list[dict]:
    """The μ of each snapshot and the final one, scored on the protocol's fixed start states, with the
    counters each was taken at: [{"at_s", "mean", "returns", "steps", "needed_interactions"}]."""
    from bench.learning import PROTOCOL, score_snapshot

    snaps = sorted(((int(p.stem[3:-1]), p) for p in (folder / "snapshots").glob("at-*s.npz")), key=lambda x: x[0])
    if (folder / "policy.npz").exists():
        snaps.append((round(stopped_s), folder / "policy.npz"))
    scored = []
    for at_s, path in snaps:
        with np.load(path) as npz:
            counters = {"steps": int(npz["steps"]), "needed_interactions": int(npz["needed_interactions"])}
        scored.append({"at_s": at_s, "final": path.name == "policy.npz", **counters,
                       **score_snapshot(path, PROTOCOL["eval_seeds"])})
    return scored


def race(env_id: str, minutes: float, workers: int, out: Path, hidden: str = PAPER_HIDDEN,
         random_steps: int = PAPER_RANDOM_STEPS, algos: tuple[str, ...] = RACE_ALGOS,
         snapshot_every: float = 60.0) -> dict:
    """Start the algorithms' runs at once, stop them after `minutes`, and table f(μ) and the scored μ
    against wall clock. One algorithm alone (`algos=("td3",)`) shows what sharing the machine costs it."""
    out.mkdir(parents=True, exist_ok=True)
    cmds = race_commands(env_id, workers, out, hidden, random_steps, algos)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("AESRL_REDIS_URL", None)
    procs = {}
    for algo, cmd in cmds.items():
        log = open(out / f"{algo}.log", "w")  # noqa: SIM115 - closed with the process
        log.write(" ".join(cmd) + "\n")
        log.flush()
        procs[algo] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
    t0 = time.monotonic()
    load, next_snap, next_load = [], snapshot_every, 5.0
    # both run for the whole time, or neither: one that ends early has failed (its log says why)
    while (now := time.monotonic() - t0) < minutes * 60 and all(p.poll() is None for p in procs.values()):
        if now >= next_snap:
            take_snapshots(out, procs, round(next_snap))
            next_snap += snapshot_every
        if now >= next_load:
            load.append(os.getloadavg()[0])
            next_load += 5.0
        time.sleep(0.2)
    stopped_s = time.monotonic() - t0
    for p in procs.values():  # SIGTERM: each launcher stops its processes and writes its run folder
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    for algo, p in procs.items():
        if p.returncode not in (0, 130, 143, -signal.SIGTERM):
            print(f"{algo} exited with {p.returncode}; the end of {out / (algo + '.log')}:")
            print("\n".join((out / f"{algo}.log").read_text().splitlines()[-25:]))
    result = {"env": env_id, "minutes": minutes, "workers": workers, "hidden": hidden, "random_steps": random_steps,
              "algos": list(algos), "commands": {k: " ".join(v) for k, v in cmds.items()},
              "exit": {k: p.returncode for k, p in procs.items()}, "loadavg_mean": float(np.mean(load)) if load else None,
              "cores": os.cpu_count()}
    result.update(read_race(out, minutes, algos))
    result["snapshot_every_s"] = snapshot_every
    result["scores"] = {algo: score_snapshots(out / f"{algo}-gpu", stopped_s) for algo in algos}
    result["versions"] = race_versions()
    (out / "gpu.json").write_text(json.dumps(result, indent=1))
    print(race_tables(result))
    return result


def read_race(out: Path, minutes: float, algos: tuple[str, ...] = RACE_ALGOS) -> dict:
    from cli.plot import load_run

    res: dict = {"runs": {}}
    for algo in algos:
        folder = out / f"{algo}-gpu"
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()] \
            if (folder / "metrics.jsonl").exists() else []
        ups = [r for r in lines if r.get("type") == "update"]
        try:
            run = load_run(folder)
            evals = [(e.get("elapsed") or math.nan, e["steps"], e["f_mu"]) for e in run.evals]
        except Exception as exc:  # noqa: BLE001 - a run that failed to start still gets its line
            if not ups:
                res["runs"][algo] = {"error": str(exc)}
                continue
            # It ran, but no result carried an estimate of f(μ) yet (under the default, ES pairs are one
            # job in ten and set it): its steps and rates still count.
            evals = []
        crit = [r["critic_steps_per_s"] for r in lines if r.get("type") == "critic" and r.get("critic_steps_per_s")]
        jobs = {k: [r["duration"] for r in ups if r.get("kind") == k and not r.get("random") and r.get("duration")]
                for k in ("rl", "es")}
        res["runs"][algo] = {
            "evals": evals, "steps": max((r.get("steps", 0) for r in lines), default=0),
            "critic_steps_per_s": float(np.median(crit)) if crit else None,
            "rl_job_s": float(np.mean(jobs["rl"])) if jobs["rl"] else None, "rl_jobs": len(jobs["rl"]),
            "es_job_s": float(np.mean(jobs["es"])) if jobs["es"] else None, "es_jobs": len(jobs["es"]),
        }
    return res


def race_versions() -> dict:
    """What ran: the packages the protocol records, the torch device and the commit (when a git tree)."""
    import torch

    from bench.learning import package_versions

    out = {**package_versions(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0:
        out["commit"] = proc.stdout.strip()
    return out


def at(evals: list, t: float) -> tuple[float, float]:
    """(f(μ), stored steps) of the last evaluation at or before elapsed second t; f(μ) is the mean of the
    evaluations in the minute up to t, when there are any."""
    before = [e for e in evals if e[0] <= t]
    if not before:
        return math.nan, math.nan
    window = [e[2] for e in before if e[0] > t - 60]
    return (float(np.mean(window)) if window else before[-1][2]), before[-1][1]


def scored_at(scores: list[dict], t: float) -> dict | None:
    """The snapshot taken at second t (within a second; the final μ when the run stopped then), or None."""
    return next((x for x in scores if not x.get("final") and abs(x["at_s"] - t) <= 1),
                next((x for x in scores if x.get("final") and abs(x["at_s"] - t) <= 1), None))


def cell(x: float, fmt: str = ",.0f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def race_tables(res: dict) -> str:
    runs, scores = res["runs"], res.get("scores", {})
    algos = tuple(res.get("algos", RACE_ALGOS))
    named = {a: f"aesrl with {res['workers']} worker{'s' * (res['workers'] != 1)}" if a == "aesrl" else a
             for a in algos}
    if res.get("separate"):  # one race per algorithm, one after the other: each its own minutes and load
        who = ", then ".join(f"{named[a]} for {res['minutes_of'][a]:g} min (mean load "
                             f"{res['load_of'][a] or math.nan:.1f})" for a in algos)
        who += f", each alone on {res.get('cores')} cores"
    else:
        who = (" beside ".join(named[a] for a in algos) + (", both started at once" if len(algos) > 1 else ", alone")
               + f", for {res['minutes']:g} min on {res.get('cores')} cores (mean load "
                 f"{res.get('loadavg_mean') or math.nan:.1f})")
    lines = [f"{res['env']}, actor and critic {res.get('hidden', PAPER_HIDDEN).replace(',', '-')}, "
             f"{res.get('random_steps', PAPER_RANDOM_STEPS):,} random steps, seed 1; {who}"]
    if res.get("versions"):
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    if any("error" in r for r in runs.values()):
        lines.append("errors: " + "; ".join(f"{k}: {v['error']}" for k, v in runs.items() if "error" in v))
    if scores:
        from bench.learning import PROTOCOL  # the start states score_snapshots scored on

        seeds = PROTOCOL["eval_seeds"]
        lines.append(f"score: μ's deterministic return, mean of the {len(seeds)} fixed start states (seeds "
                     f"{seeds[0]:,}-{seeds[-1]:,}); f(μ): the run's own single-episode estimates in the minute up to then")
    cols = ("score", "f(μ)", "steps") if scores else ("f(μ)", "steps")
    head = ["elapsed"] + [f"{a} {c}" for a in algos for c in cols]
    body = []
    every = res.get("snapshot_every_s", 60.0)
    marks = [every * k for k in range(1, int(res["minutes"] * 60 / every + 1e-9) + 1)]
    if not marks or abs(marks[-1] - res["minutes"] * 60) > 1:
        marks.append(res["minutes"] * 60)
    for t in marks:
        row = [f"{t / 60:.3g} min"]
        for algo in algos:
            f, s = at(runs.get(algo, {}).get("evals", []), t)
            if scores:
                snap = scored_at(scores.get(algo, []), t)
                row.append(cell(snap["mean"]) if snap else "–")
                s = snap["steps"] if snap else s
            row += [cell(f), cell(s)]
        body.append(row)
    finals = {a: next((x for x in scores.get(a, []) if x.get("final")), None) for a in algos}
    if any(finals.values()):
        row = ["final μ"]
        for algo in algos:
            x = finals[algo]
            row += [cell(x["mean"]) if x else "–", "", f"{x['steps']:,} at {x['at_s'] / 60:.1f} min" if x else "–"]
        body.append(row)
    lines.append(render(head, body))
    a = runs.get("aesrl", {})
    lines.append("")
    paper = ", ".join(f"{k} {1e6 / v:,.0f}" for k, v in PAPER_MIN_PER_1M.items())
    rates = ", ".join(f"{algo} {runs.get(algo, {}).get('steps', 0) / res.get('minutes_of', {}).get(algo, res['minutes']):,.0f}"
                      for algo in algos)
    lines.append(f"stored steps per minute: {rates}; the paper's Table 1 (1M HalfCheetah-v2 steps): {paper}")
    if a.get("critic_steps_per_s") is not None or a.get("rl_job_s") is not None:
        lines.append(f"aesrl critic daemon: median {a.get('critic_steps_per_s') or math.nan:.0f} steps/s; RL jobs: "
                     f"{a.get('rl_jobs')} of mean {a.get('rl_job_s') or math.nan:.2f} s; ES jobs: {a.get('es_jobs')} of mean {a.get('es_job_s') or math.nan:.2f} s")
    return "\n".join(lines)


def load_races(dirs: list[Path]) -> dict:
    """The races in `dirs` as one: each run from its own folder, the algorithms side by side at equal
    minutes (the table runs to the longest race; a shorter one's later cells are blank)."""
    merged: dict = {}
    for d in dirs:
        res = json.loads((d / "gpu.json").read_text())
        res.update(read_race(d, res["minutes"], tuple(res.get("algos", RACE_ALGOS))))
        if not merged:
            merged = {**res, "runs": {}, "scores": {}, "algos": [], "minutes_of": {}, "load_of": {}}
        merged["separate"] = len(dirs) > 1
        merged["minutes"] = max(merged["minutes"], res["minutes"])
        if "aesrl" in res.get("algos", ()):
            merged["workers"] = res["workers"]
        for algo in res.get("algos", RACE_ALGOS):
            if algo in merged["algos"]:
                raise ValueError(f"{d}: a second {algo} race (one folder per algorithm)")
            merged["algos"].append(algo)
            merged["runs"][algo] = res["runs"][algo]
            merged["scores"][algo] = res.get("scores", {}).get(algo, [])
            merged["minutes_of"][algo] = res["minutes"]
            merged["load_of"][algo] = res.get("loadavg_mean")
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("micro", help="critic steps/s and RL job time, CPU against CUDA")
    m.add_argument("--env", default="HalfCheetah-v5")
    m.add_argument("--seconds", type=float, default=5.0)
    m.add_argument("--hidden", default=PAPER_HIDDEN, help="actor and critic hidden sizes (the paper's 400,300)")
    m.add_argument("--rl-steps", type=int, default=None, help="actor steps of the RL job (default rl_steps_max)")
    r = sub.add_parser("race", help="aesrl (N workers) beside td3 for the same wall clock")
    r.add_argument("--env", default="HalfCheetah-v5")
    r.add_argument("--minutes", type=float, default=8.0)
    r.add_argument("--workers", type=int, default=14)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--hidden", default=PAPER_HIDDEN, help="actor and critic hidden sizes (the paper's 400,300)")
    r.add_argument("--random-steps", type=int, default=PAPER_RANDOM_STEPS, help="the random phase (the paper's)")
    r.add_argument("--algos", default=",".join(RACE_ALGOS),
                   help="which runs start at once (default aesrl,td3; td3 alone shows what sharing costs it)")
    r.add_argument("--snapshot-every", type=float, default=60.0,
                   help="seconds between the snapshots of each run's μ that the table scores (default a minute)")
    p = sub.add_parser("report", help="the race tables again from DIR/gpu.json and the run folders; several "
                       "DIRs (one algorithm each, run one after the other) side by side at equal minutes")
    p.add_argument("dir", type=Path, nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "micro":
        micro(a.env, a.seconds, a.hidden, a.rl_steps)
    elif a.cmd == "race":
        if a.minutes <= 0 or a.workers < 1:
            ap.error("--minutes must be > 0 and --workers >= 1")
        algos = tuple(dict.fromkeys(x for x in a.algos.split(",") if x))
        if not algos or set(algos) - set(RACE_ALGOS):
            ap.error(f"--algos: a comma-separated choice out of {','.join(RACE_ALGOS)}, got {a.algos!r}")
        if a.snapshot_every <= 0:
            ap.error("--snapshot-every must be > 0 seconds")
        race(a.env, a.minutes, a.workers, a.out, a.hidden, a.random_steps, algos, a.snapshot_every)
    else:
        try:
            print(race_tables(load_races(a.dir)))
        except ValueError as exc:
            ap.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
