"""Asynchronous vs synchronous vs serial: wall time, worker utilisation and reduction against serial.

The shape of the paper's Table 1 (CEM-RL serial, P-CEM-RL synchronous, AES-RL asynchronous), on a
simulated environment whose episodes sleep for a random time (AesrlSleep-v0: lognormal durations,
no CPU), so that 1-32 real `rq worker -w workers.AesrlWorker` processes fit on a 2-core machine.
Each configuration evaluates the same number of individuals; the schedulers run in this process.

Only *when to ask and when to tell* differs between the rows: every job is an ES evaluation (the
random-action phase is set longer than the budget, so no RL job or critic is involved: on this
machine RL training would measure CPU contention, not scheduling).

Usage: python bench/async_vs_sync.py [--quick] [--workers 8,16,32] [--algos aesrl] [--out PATH]

--workers and --algos run a subset of the table (e.g. the asynchronous rows alone, for their
utilisation); a row's "vs serial" and "async/sync" then need cemrl at the first W and pcemrl beside it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import redis  # noqa: E402
from overhead import Children  # noqa: E402

from aesrl_queue.codec import json_default  # noqa: E402
from aesrl_queue.config import RunConfig  # noqa: E402
from aesrl_queue.connection import connect  # noqa: E402
from aesrl_queue.redis_server import RedisServer  # noqa: E402
from aesrl_queue.store import Store, decode_result, live_workers  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "async_vs_sync.json"
TARGETS = {"util_async_8_16_32": 0.97, "async_over_sync_8": 0.85, "reduction_vs_serial_8": 0.85}

# Episode-time models. "varying": lognormal with log-std 0.8 — Hopper/Walker2d episodes end anywhere
# between ~20 and 1000 steps while a policy learns, a spread of more than an order of magnitude;
# a log-std of 0.8 puts the 5th and 95th percentiles 14x apart. "fixed": every episode the same
# length, like HalfCheetah's 1000 steps.
CASES = {"varying": 0.8, "fixed": 0.0}
MODES = {
    "quick": {"workers": (1, 4), "evals": 20, "per_worker": 5, "mean_s": 0.05, "cases": ("varying",)},
    "full": {"workers": (1, 2, 4, 8, 16, 32), "evals": 160, "per_worker": 30, "mean_s": 0.25,
             "cases": ("varying", "fixed")},
}
EPISODE_LEN = 10  # steps per simulated episode
# the step budget is evals x EPISODE_LEN x 2: every algorithm here keeps a replay, so each job stores
# its individual's episode and μ's
STORED_PER_JOB = 2


def make_cfg(algo: str, sigma: float, mean_s: float, evals: int, seed: int) -> RunConfig:
    budget = evals * EPISODE_LEN * STORED_PER_JOB
    return RunConfig.from_preset(
        "AesrlSleep-v0", algo=algo, seed=seed, total_steps=budget, initial_steps=10 * budget,
        hidden=(8, 8), critic_hidden=(16, 16), mean_eval_episodes=1,
        env_kwargs={"episode_len": EPISODE_LEN, "mean_s": mean_s, "sigma": sigma, "seed": seed},
        run_id=f"avs-{algo}-{uuid.uuid4().hex[:6]}",
        # aesrl's jobs as this table has always measured them: an episode of the individual and one of μ
        **({"es_antithetic": False, "rl_steps_max": 2000} if algo == "aesrl" else {}),
    ).resolve()


def run_one(client: redis.Redis, blocking: redis.Redis, cfg: RunConfig, n_workers: int,
            timeout: float) -> dict[str, Any]:
    """Run one scheduler to its budget in a thread; measure from its start to its last result."""
    from scheduler.loop import Scheduler

    stop = threading.Event()
    sched = Scheduler(client, blocking, cfg, stop_event=stop, drain_timeout=timeout)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["status"] = sched.run()
        except BaseException as exc:  # reported below
            box["error"] = exc

    t0 = time.time()
    th = threading.Thread(target=target, name=f"bench-{cfg.algo}", daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        stop.set()
        th.join(10)
        raise RuntimeError(f"{cfg.algo} with {n_workers} workers did not finish within {timeout:.0f}s")
    if "error" in box:
        raise RuntimeError(f"{cfg.algo} failed: {box['error']!r}") from box["error"]
    store = Store(client, cfg.run_id)
    rows = store.read_stream("results", count=1_000_000)
    results = []
    for entry_id, fields in rows:
        res = decode_result(entry_id, fields)
        if res.ok:
            results.append((int(entry_id.split("-")[0]) / 1e3, res))
    state = store.state()
    applied = int(state.get("results_applied", 0))
    if not results:
        raise RuntimeError(f"{cfg.algo}: no results")
    t_last = max(t for t, _ in results)
    wall = t_last - t0
    busy = sum(r.duration for _, r in results)
    used = 1 if cfg.algo == "cemrl" else n_workers
    # Steady state: the middle 80% of the run by result times, so that start-up (imports, first
    # dispatch) and the drain at the budget (fewer jobs than workers) do not count.
    ends = sorted(t for t, _ in results)
    lo, hi = ends[len(ends) // 10], ends[(9 * len(ends)) // 10]
    inside = sum(max(0.0, min(t, hi) - max(t - r.duration, lo)) for t, r in results)
    steady = inside / (used * (hi - lo)) if hi > lo else float("nan")
    workers_seen = len({r.worker for _, r in results})
    # The same jobs (their measured durations, in the order they started) on a dispatcher with no cost
    # at all: each goes to the first free worker from time 0. Its idle time is the budget's drain alone
    # (the last jobs run while the other workers have nothing left): the reference for a dispatcher
    # that cannot know a job's duration before it ends.
    free = [0.0] * used
    for _, r in sorted(results, key=lambda tr: tr[0] - tr[1].duration):
        heapq.heapreplace(free, free[0] + r.duration)
    ideal = busy / (used * max(free))
    first_start = min(t - r.duration for t, r in results)
    out = {
        "algo": cfg.algo, "workers": n_workers, "workers_used": used, "workers_seen": workers_seen,
        "evals": len(results), "applied": applied, "wall_s": wall, "busy_s": busy,
        "utilisation": busy / (used * wall), "utilisation_steady": steady, "utilisation_ideal": ideal,
        "first_start_s": first_start - t0,
        "s_per_eval": wall / len(results), "status": box.get("status"),
        "generations": int(state.get("generation", 0) or 0),
    }
    store.delete()
    return out


def render(rows: list[dict[str, Any]]) -> str:
    head = ("case", "algorithm", "W", "evals", "wall s", "s/eval", "util", "util steady", "util ideal", "vs serial",
            "async/sync")
    lines = [" | ".join(f"{h:>11}" for h in head), "-+-".join("-" * 11 for _ in head)]
    for r in rows:
        cells = (r["case"], r["algo"], r["workers"], r["evals"], f"{r['wall_s']:.2f}", f"{r['s_per_eval']:.3f}",
                 f"{r['utilisation']:.3f}", f"{r['utilisation_steady']:.3f}", f"{r['utilisation_ideal']:.3f}",
                 f"{r['reduction_vs_serial']:.1%}" if r.get("reduction_vs_serial") is not None else "-",
                 f"{r['async_over_sync']:.3f}" if r.get("async_over_sync") is not None else "-")
        lines.append(" | ".join(f"{c!s:>11}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="W in (1, 4), few evaluations; under a minute")
    ap.add_argument("--evals", type=int, default=0, help="evaluations per configuration (default by mode)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help="worker counts, comma-separated (default by mode)")
    ap.add_argument("--algos", type=lambda v: tuple(v.split(",")), default=("cemrl", "pcemrl", "aesrl"),
                    help="algorithms, comma-separated, of cemrl, pcemrl, aesrl (default: all three)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results path (default: bench/results/async_vs_sync.json; --quick: a temporary folder)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="aesrl-bench-")) / DEFAULT_OUT.name if args.quick else DEFAULT_OUT
    mode = dict(MODES["quick" if args.quick else "full"])
    if args.evals:
        mode["evals"] = args.evals
    if args.workers:
        mode["workers"] = args.workers
    evals, mean_s = mode["evals"], mode["mean_s"]
    t_start = time.time()
    from aesrl_queue.procs import worker_command

    server = RedisServer()
    server.start()
    (Path(server.directory) / "logs").mkdir(parents=True, exist_ok=True)
    kids = Children(Path(server.directory) / "logs")
    rows: list[dict[str, Any]] = []
    try:
        client = connect(server.url)
        blocking = connect(server.url, blocking=True)
        procs: list[Any] = []
        print(f"machine: {os.cpu_count()} cores, {platform.platform()}, python {platform.python_version()}; "
              f"{evals} evaluations per configuration, mean episode {mean_s}s (x2 per job: the episode "
              "and the f(mu) evaluation are both simulated)", flush=True)
        serial: dict[str, float] = {}
        for w in mode["workers"]:
            while len(procs) < w:  # workers only ever join: W grows from row to row
                procs.append(kids.start(f"w{len(procs)}", worker_command(server.url)))
            deadline = time.monotonic() + 120
            while len(live_workers(client)) < w:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{w} workers did not heartbeat in 120 s:\n{kids.log_tail('w0')}")
                time.sleep(0.2)
            for case in mode["cases"]:
                sigma = CASES[case]
                algos = [a for a in (("cemrl", "pcemrl", "aesrl") if w == mode["workers"][0] else ("pcemrl", "aesrl"))
                         if a in args.algos]
                got = {}
                n_evals = max(evals, mode["per_worker"] * w)  # enough per worker that the edges stay small
                timeout = 60 + 6 * n_evals * mean_s * (1 + 4 * sigma) / min(w, 10)
                for algo in algos:
                    cfg = make_cfg(algo, sigma, mean_s, n_evals, args.seed)
                    r = run_one(client, blocking, cfg, w if algo != "cemrl" else 1, timeout)
                    r["case"] = case
                    got[algo] = r
                    print(f"  {case:8s} W={w:<3d} {algo:7s} {r['evals']} evals in {r['wall_s']:.2f}s, "
                          f"utilisation {r['utilisation']:.3f} (steady {r['utilisation_steady']:.3f}, "
                          f"ideal {r['utilisation_ideal']:.3f}, first start {r['first_start_s']:.2f}s)", flush=True)
                if "cemrl" in got:
                    serial[case] = got["cemrl"]["s_per_eval"]
                    got["cemrl"]["workers"] = 1
                for algo, r in got.items():
                    r["reduction_vs_serial"] = (1.0 - r["s_per_eval"] / serial[case]) if case in serial else None
                    r["async_over_sync"] = (got["aesrl"]["s_per_eval"] / got["pcemrl"]["s_per_eval"]
                                            if algo == "aesrl" and "pcemrl" in got else None)
                    rows.append(r)
        kids.stop(procs)
    finally:
        kids.kill_all()
        server.stop()
    rows.sort(key=lambda r: (r["case"], {"cemrl": 0, "pcemrl": 1, "aesrl": 2}[r["algo"]], r["workers"]))
    table = render(rows)
    print()
    print(table)
    print("\n- wall: from the scheduler's start to its last result; s/eval = wall / evaluations (the budget "
          "can end a synchronous generation early, so compare per evaluation); util = sum of job durations / "
          "(workers used x wall), cemrl uses one worker; vs serial = 1 - (s/eval) / (s/eval of cemrl); "
          "async/sync = aesrl s/eval / pcemrl s/eval at the same W; util steady = the same over the middle 80% "
          "of result times (no start-up, no drain); util ideal = the same jobs, durations and start order on a "
          "dispatcher that costs nothing (each job to the first free worker from time 0): what the budget's "
          "drain alone leaves idle, the reference for a dispatcher that cannot foresee durations. Evaluations per row: max(evals, per-worker x W).")
    print(f"- pcemrl's generation is {RunConfig.from_preset('AesrlSleep-v0').population} individuals: with "
          "more workers than that, the rest idle by construction.")
    out = {"mode": "quick" if args.quick else "full", "evals": evals, "per_worker": mode["per_worker"],
           "mean_s": mean_s, "cases": CASES,
           "targets": TARGETS, "rows": rows, "seconds": time.time() - t_start,
           "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()}}
    for case in mode["cases"]:
        by = {(r["algo"], r["workers"]): r for r in rows if r["case"] == case}
        for w in (8, 16, 32):
            if ("aesrl", w) in by:
                out.setdefault("checks", {})[f"{case}_util_aesrl_{w}"] = by[("aesrl", w)]["utilisation"]
                out["checks"][f"{case}_util_steady_aesrl_{w}"] = by[("aesrl", w)]["utilisation_steady"]
                out["checks"][f"{case}_util_ideal_aesrl_{w}"] = by[("aesrl", w)]["utilisation_ideal"]
        if ("aesrl", 8) in by and ("pcemrl", 8) in by and case in serial:
            out["checks"][f"{case}_async_over_sync_8"] = by[("aesrl", 8)]["async_over_sync"]
            out["checks"][f"{case}_reduction_vs_serial_8"] = by[("aesrl", 8)]["reduction_vs_serial"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=json_default))
    if out.get("checks"):
        print("- checks against the targets:", json.dumps(out["checks"], default=json_default))
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
