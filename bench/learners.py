"""The learners measured: their speed (`micro`) and each one alone at 100 000 steps (`alone`).

`micro` times one critic step of each learner at its own network sizes (aesrl_queue/learners.py), the
way the critic daemon runs it: on the CPU with one thread, and on CUDA where torch sees one, both eagerly
(the loss read back every step, as the daemon's CPU path does) and replayed as one captured CUDA graph
(the daemon's CUDA path). The reference row is td3 at the protocol's 256-256.

`alone` runs the development cells of `--algo td3 --learner X` (the learner alone, no ES): each cell is
one `aesrl-queue run` of the learning protocol's shared settings (bench/learning.py: 10 000 random
steps, snapshots at 25 000 / 50 000 / 100 000 stored steps) with the learner's own critic, all cells at
once, each in its own process group. At --minutes it stops those still running (SIGTERM: each writes
its run folder), scores every snapshot on the protocol's 10 fixed start states and prints the table
beside the issue's targets for X alone at 100 000 steps (mean over seeds 1-3: HalfCheetah-v5 >= 6 500,
Hopper-v5 >= 1 800, Walker2d-v5 >= 2 500). Development seeds only: never a report seed.

    python bench/learners.py micro [--seconds 3] [--devices cpu,cuda] [--out FILE]
    python bench/learners.py alone --learner crossq [--envs ...] [--seeds 1,2,3] [--minutes 60]
                                   [--critic-hidden 256,256] [--set JSON --tag NAME] [--resume] [--runs DIR]
                                   [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TARGETS = {"HalfCheetah-v5": 6500.0, "Hopper-v5": 1800.0, "Walker2d-v5": 2500.0}
# (learner, critic sizes): td3 at the protocol's and the paper's sizes, crossq at its published one;
# a crossq-sac step is the daemon's (its critic step and the log-std and α step around the target actor)
MICRO = [("td3", (256, 256)), ("td3", (400, 300)), ("crossq", (2048, 2048)), ("crossq", (256, 256)),
         ("crossq-sac", (2048, 2048)), ("crossq-sac", (256, 256))]


def _timed(step, seconds: float, sync) -> float:
    for _ in range(3):
        step()
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            step()
        n += 10
        sync()
    return n / (time.perf_counter() - t0)


def micro_row(name: str, hidden: tuple[int, ...], device: str, seconds: float) -> dict[str, Any]:
    import torch

    from aesrl_queue.learners import capture_step, learner_class
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.td3 import ReplayBuffer

    obs_dim, act_dim, batch = 17, 6, 256  # HalfCheetah's sizes
    spec = NetSpec(obs_dim=obs_dim, act_dim=act_dim, max_action=1.0, hidden=(400, 300), critic_hidden=hidden,
                   critic_activation="relu" if name.startswith("crossq") else "leaky_relu")
    rng = np.random.default_rng(0)
    n = 100_000
    replay = ReplayBuffer(obs_dim, act_dim, n, device=device)
    replay.add_batch(rng.standard_normal((n, obs_dim)).astype(np.float32),
                     rng.uniform(-1, 1, (n, act_dim)).astype(np.float32), rng.standard_normal(n).astype(np.float32),
                     rng.standard_normal((n, obs_dim)).astype(np.float32), np.zeros(n, np.float32))
    kw = {"lr": 1e-3, "gamma": 0.99, "tau": 0.005, "policy_noise": 0.2, "noise_clip": 0.5}
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    learner = learner_class(name)(spec, device=device, **kw)
    target = spec.make_actor(device)
    gen = torch.Generator().manual_seed(0)
    row = {"learner": name, "critic": "-".join(map(str, hidden)), "device": device,
           "eager_steps_per_s": _timed(lambda: learner.critic_step(replay.sample(batch, generator=gen), target).tolist(),
                                       seconds, sync)}
    if cuda:
        learner = learner_class(name)(spec, device=device, capturable=True, **kw)
        size = torch.full((), float(n), device=device)

        graph = capture_step(lambda: learner.critic_step(replay.sample_in_graph(batch, size), target),
                             torch.device(device), learner.opt)
        row["graph_steps_per_s"] = _timed(graph.replay, seconds, sync)
    return row


def micro(seconds: float, devices: list[str] | None = None) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    devices = devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for name, hidden in MICRO:
            if device == "cpu" and hidden[0] > 1000:  # ~0.4 s a step on one core: timed once
                rows.append(micro_row(name, hidden, device, 0.1))
                continue
            rows.append(micro_row(name, hidden, device, seconds))
            print(rows[-1], flush=True)
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cpu": platform.processor() or platform.machine(), "tf32": torch.backends.cuda.matmul.allow_tf32}
    return {"rows": rows, "info": info}


def micro_table(data: dict[str, Any]) -> str:
    ref = next(r for r in data["rows"] if r["learner"] == "td3" and r["critic"] == "256-256")
    lines = [f"{'learner':8} {'critic':10} {'device':6} {'steps/s eager':>14} {'steps/s graph':>14} "
             f"{'x td3 256 ' + ref['device']:>16}"]
    for r in data["rows"]:
        best = r.get("graph_steps_per_s", r["eager_steps_per_s"])
        graph = f"{r['graph_steps_per_s']:14.0f}" if "graph_steps_per_s" in r else f"{'-':>14}"
        lines.append(f"{r['learner']:8} {r['critic']:10} {r['device']:6} {r['eager_steps_per_s']:14.0f} {graph} "
                     f"{best / ref['eager_steps_per_s']:16.2f}")
    return "\n".join(lines) + f"\n{data['info']}"


# -- the learner alone -------------------------------------------------------------------------------
def _score(folder: Path, algo: str, protocol: dict[str, Any]) -> dict[str, Any]:
    from bench import learning
    from bench.learning_final import final_policy_scores

    try:
        got = learning.read_run(folder, algo, protocol)
    except Exception as exc:  # noqa: BLE001 - a cell that left no readable folder is reported as such
        return {"error": f"{type(exc).__name__}: {exc}"}
    # the protocol's amendment: td3 stops at the last whole episode under the budget, so a finished
    # run's final policy (policy.npz) stands for a milestone it ended within one episode of
    got["scores"].update(final_policy_scores(folder, protocol, got["scores"], got["steps"], got["interactions"],
                                             learning.score_snapshot))
    return got


def _reaped(cpu: dict, key: Any, reap) -> bool:
    """Call reap() (it waits for the cell's process, or polls it); when the process has ended, add to
    cpu[key] the CPU seconds it and the processes it waited for used (their share of RUSAGE_CHILDREN)."""
    def used() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    before = used()
    if reap() is None:
        return False
    cpu[key] = cpu.get(key, 0.0) + used() - before
    return True


def _finished(folder: Path) -> bool:
    try:
        return json.loads((folder / "summary.json").read_text()).get("status") == "finished"
    except (OSError, ValueError):
        return False


def alone(learner: str, envs: list[str], seeds: list[int], minutes: float, runs: Path,
          steps: int = 100_000, quick: bool = False, critic_hidden: tuple[int, ...] | None = None,
          resume: bool = False, settings: dict[str, Any] | None = None, tag: str = "") -> dict[str, Any]:
    """quick: the learning protocol's --quick settings (Pendulum-sized networks and budget), for tests.
    critic_hidden: another critic than the learner's own (a bench option: crossq at 256-256 on a CPU).
    settings: other config fields over the learner's own (a bench option, `--set`); `tag` names the
    variant in its cells' folder names (required with settings, so variants never share a folder).
    resume: a cell whose folder is there continues (`run --resume`: a run stopped at --minutes, or one
    whose machine went away, goes on from its last checkpoint), and a finished one is only scored."""
    if settings and not tag:
        raise ValueError("settings need a tag that names the variant in its cells' folders")
    from aesrl_queue.config import LEARNER_DEFAULTS
    from bench import learning

    algo = f"td3-{learner}" + (f"-{'-'.join(map(str, critic_hidden))}" if critic_hidden else "") + (f"-{tag}" if tag else "")
    own = {k: list(v) if isinstance(v, tuple) else v for k, v in LEARNER_DEFAULTS[learner].items()
           if not quick or k not in ("critic_hidden", "hidden")}
    if critic_hidden:
        own["critic_hidden"] = list(critic_hidden)
    own.update(settings or {})
    base = learning.QUICK if quick else {**learning.PROTOCOL, "budget_steps": steps}
    protocol = {**base, "algos": {algo: {"algo": "td3", "learner": learner, **own}}}
    runs.mkdir(parents=True, exist_ok=True)
    procs: dict[tuple[str, int], tuple[subprocess.Popen, float]] = {}
    resumed: dict[tuple[str, int], bool] = {}
    cpu: dict[tuple[str, int], float] = {}  # CPU seconds of each cell's processes, all of them
    # protocol v2's environment: one thread, no outside Redis, the BLAS variables it names unset, so a
    # cell picks its CPU kind's kernel whatever this machine sets (a rerun on that kind reproduces it)
    env_vars = learning.cell_env(learning.PROTOCOL_V2)
    walls: dict[tuple[str, int], float] = {}
    for env in envs:
        for seed in seeds:
            folder = runs / env / f"{algo}-s{seed}"
            folder.parent.mkdir(parents=True, exist_ok=True)
            cfg_file = folder.with_name(folder.name + ".config.json")
            if resume and (folder / "redis").is_dir():
                resumed[(env, seed)] = True
                if _finished(folder):
                    walls[(env, seed)] = 0.0
                    continue
                marks = learning.cell_command(env, algo, seed, protocol, folder, cfg_file)
                cmd = [sys.executable, "-m", "cli.main", "run", "--resume", str(folder), "--snapshot-every", "0",
                       "--workers", str(protocol["workers"]), *marks[marks.index("--snapshot-steps"):marks.index("--snapshot-steps") + 4]]
            else:
                cfg_file.write_text(json.dumps({"env_id": env, **learning.cell_settings(algo, protocol)}))
                cmd = learning.cell_command(env, algo, seed, protocol, folder, cfg_file)
            log = open(folder.with_name(folder.name + ".log"), "a" if resume else "w")  # noqa: SIM115 - open while it runs
            procs[(env, seed)] = (subprocess.Popen(cmd, cwd=ROOT, env=env_vars, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True), time.monotonic())
    deadline = time.monotonic() + minutes * 60
    while any(key not in walls for key in procs) and time.monotonic() < deadline:
        for key, (p, t0) in procs.items():
            if key not in walls and _reaped(cpu, key, p.poll):
                walls[key] = time.monotonic() - t0
        time.sleep(2)
    for key, (p, t0) in procs.items():
        if key in walls:
            continue
        if p.poll() is None:
            _reaped(cpu, key, lambda p=p: learning.kill_group(p) or p.poll())
            walls[key] = -(time.monotonic() - t0)  # negative: stopped at the deadline
        else:  # it ended after the loop's last look, at the deadline
            walls[key] = time.monotonic() - t0
    # each cell scored in a process of its own (MuJoCo and the numpy actor, side by side)
    with ProcessPoolExecutor(max_workers=min(len(walls), os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(_score, runs / key[0] / f"{algo}-s{key[1]}", algo, protocol) for key in walls}
    cells = []
    for (env, seed), f in futures.items():
        try:
            got = f.result()
        except Exception as exc:  # noqa: BLE001 - the scoring process died (a crash of MuJoCo, say)
            got = {"error": f"scoring: {type(exc).__name__}: {exc}"}
        cells.append({"env": env, "seed": seed, "wall_s": round(walls[(env, seed)], 1), **got,
                      **({"cpu_s": round(cpu[(env, seed)], 1)} if (env, seed) in cpu else {}),
                      **({"resumed": True} if resumed.get((env, seed)) else {})})
    return {"learner": learner, "critic_hidden": own.get("critic_hidden"), **({"settings": settings, "tag": tag} if settings else {}),
            "steps": steps, "cells": sorted(cells, key=lambda c: (c["env"], c["seed"])),
            "versions": learning.package_versions(), "cores": os.cpu_count(), "machine": learning.cell_machine_facts(learning.PROTOCOL_V2)}


def alone_table(data: dict[str, Any]) -> str:
    lines = [f"{data['learner']} alone (--algo td3 --learner {data['learner']}, critic {data.get('critic_hidden')}),"
             " mean return on the 10 fixed starts",
             f"{'env':16} {'seed':>4} {'25k':>7} {'50k':>7} {'100k':>7} {'steps':>7} {'wall s':>8} {'CPU ms/step':>11}"]
    by_env: dict[str, list[float]] = {}
    for c in data["cells"]:
        sc = c.get("scores", {})
        vals = [sc.get(k, {}).get("mean") for k in ("25", "50", "100")]
        lines.append(f"{c['env']:16} {c['seed']:>4} " + " ".join(f"{v:7.0f}" if v is not None else f"{'-':>7}" for v in vals)
                     + f" {c.get('steps', 0):>7} {c['wall_s']:>8}"
                     + (f" {1e3 * c['cpu_s'] / c['steps']:>11.1f}" if c.get("cpu_s") and c.get("steps") else f" {'-':>11}")
                     + (f"  {c['error']}" if "error" in c else ""))
        if vals[2] is not None:
            by_env.setdefault(c["env"], []).append(vals[2])
    for env, vals in by_env.items():
        target = TARGETS.get(env)
        lines.append(f"{env}: mean at 100k over {len(vals)} seeds {np.mean(vals):.0f}"
                     + (f" (target >= {target:.0f})" if target else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("micro")
    m.add_argument("--seconds", type=float, default=3.0)
    m.add_argument("--devices", default="", help="comma-separated (default: the CPU, and CUDA where present)")
    m.add_argument("--out", type=Path)
    a = sub.add_parser("alone")
    a.add_argument("--learner", default="crossq")
    a.add_argument("--envs", default=",".join(TARGETS))
    a.add_argument("--seeds", default="1,2,3")
    a.add_argument("--steps", type=int, default=100_000)
    a.add_argument("--minutes", type=float, default=240.0)
    a.add_argument("--runs", type=Path, default=ROOT / "runs" / "learners")
    a.add_argument("--resume", action="store_true", help="continue the cells whose folders are there (run "
                   "--resume); score finished ones without running them")
    a.add_argument("--critic-hidden", default="", help="another critic than the learner's own, e.g. 256,256")
    a.add_argument("--set", default="", help='other config fields for every cell, as JSON, e.g. \'{"actor_lr": 3e-4}\' '
                   "(with --tag)")
    a.add_argument("--tag", default="", help="the --set variant's name in its cells' folders")
    a.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.cmd == "micro":
        data = micro(args.seconds, [d for d in args.devices.split(",") if d])
        text = micro_table(data)
    else:
        data = alone(args.learner, args.envs.split(","), [int(s) for s in args.seeds.split(",")], args.minutes,
                     args.runs, args.steps,
                     critic_hidden=tuple(int(n) for n in args.critic_hidden.split(",")) if args.critic_hidden else None,
                     resume=args.resume, settings=json.loads(args.set) if args.set else None, tag=args.tag)
        text = alone_table(data)
    print(text, flush=True)
    if args.out:
        args.out.write_text(json.dumps({**data, "table": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
