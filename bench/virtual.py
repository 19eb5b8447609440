"""How AES-RL learns with many workers (issue 47, item 3): virtual runs (aesrl_queue/virtual.py) over a
grid of environments, algorithms, worker counts and seeds, each cell in its own process.

A skeleton of the measurement: it runs the cells and writes one JSON line per cell with what the
issue asks of it, read off the cell's metrics.jsonl (`aesrl-queue plot` draws the folders):

- f(μ) at --interactions needed interactions: the mean of the last 10 training-time f(μ) estimates up
  to the first update at or past that mark;
- the virtual seconds until that mean first reaches each of --thresholds;
- the staleness: quantiles of `lag` (versions μ moved while an individual ran) over the run;
- `policy_score`: the learning protocol's score of the final policy.npz (μ; the parallel TD3's actor),
  one deterministic episode from each of its 10 fixed start states, written at `policy_steps` stored
  steps (`rescore FILE` adds it to rows written without it).

`--staleness drop:K` or `decay:H` (issue 47, item 4; bench options, adopted by development seeds only)
weighs a result by its age, the versions μ moved between its ask and its tell: drop:K leaves a result
older than K versions where the rule's step would move nothing (recorded, counted in the fitness scale,
μ and var unmoved), decay:H scales the rule's step p by H / (H + age). Every aesrl-rule run (aesrl, es,
opo, acemrl) takes it; a synchronous one tells by generation and has no ages.

An asynchronous learner's rows (aesrl, opo, acemrl) carry `random_cap` and `gate_inflight`: the core's
dispatch rules since they won as bench options (docs/decisions.md): the random jobs in flight count
towards initial_steps, each as a full episode, and the critic gate counts the jobs in flight against the
room under critic_lag. Rows without them ran the rules before (every free slot random until
initial_steps were stored; a gate that let out up to room / job_steps jobs at each ask).

`--algos ptd3` runs the parallel TD3 of bench/parallel_td3.py (N environment workers feeding one learner
at the cost model's learner rate, on --algo td3's settings), which is no queue algorithm. `plot` draws
docs/scaling.md's figure from one or more results files:

    python bench/virtual.py plot RESULTS.jsonl[:ALGO=LABEL] ... [--out docs/img/virtual-workers.png]

    python bench/virtual.py measure --envs HalfCheetah-v5,Walker2d-v5 --algos aesrl,pcemrl --workers 2,16,128,1024 \\
        --seeds 1,2 --steps 100000 --cost-model cost-model.json [--jobs 2] [--runs DIR] [--out FILE]

A cell longer than the time at hand runs in pieces: `--minutes M` stops each cell after M wall minutes (as a
SIGTERM to its process does), its row's status "stopped" and its folder kept; the same command with
`--resume` continues it (`run --resume`'s virtual resume: the records up to the stop are the
uninterrupted run's, those after it are not, and the row lists the virtual seconds of each resume in
`resumed_at`). A finished cell under --resume is read, not run again.

`scores` (item 2, MuJoCo): measure's virtual runs' final-policy scores against the real runs of the
learning protocol's results files (`--real FILE:ALGO`, default its development and report rows of the
default aesrl), each virtual run inside their range or not, and the difference of the means:

    python bench/virtual.py scores bench/results/virtual-validate-mujoco.jsonl

`validate` (issue 47, item 2): the same configs run by real worker processes (`aesrl-queue run --workers
N`) and by the virtual executor (`run --virtual-workers N`), one after the other, and a table of the
staleness (`lag`, versions μ moved between an individual's ask and its tell, non-random results) of
each: quantiles, a histogram, the two-sample Kolmogorov-Smirnov statistic D against the real run, and
the final f(μ)~. Three cost models: `calibrated`, the file `aesrl-queue calibrate` wrote (one core per
worker: what the workers would take on an idle machine with a core each); `fitted`, that model scaled
to the real run (its median ES and RL job durations and its critic's measured rate, i.e. this machine
as loaded by those N workers on its cores); `fitted-gap`, `fitted` with the workers' time between jobs
(worker_gap_s) of the real `es` run at the same N:

    python bench/virtual.py validate --env Pendulum-v1 --algos aesrl,es --workers 2,8 --seeds 1 \\
        --steps 30000 --cost-model bench/results/cost-model-pendulum.json [--reuse]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aesrl_queue.cost_model import (  # noqa: E402  (validate's fits, shared with calibrate)
    critic_rates,
    critic_start,
    duration_spread,
    measured_updates,
    worker_gap,
)

WINDOW = 10  # f(μ) estimates averaged, as the progress line's f(μ)~


def score(metrics: list[dict[str, Any]], interactions: int, thresholds: list[float]) -> dict[str, Any]:
    """What one cell's metrics.jsonl says: f(μ)~ at `interactions`, virtual seconds to each threshold, lags."""
    updates = [r for r in metrics if r.get("type") == "update"]
    recent: list[float] = []
    at_mark = None
    reached: dict[str, float | None] = {str(t): None for t in thresholds}
    for u in updates:
        if isinstance(u.get("f_mu"), int | float):
            recent = (recent + [float(u["f_mu"])])[-WINDOW:]
        if not recent:
            continue
        mean = sum(recent) / len(recent)
        if at_mark is None and (u.get("interactions") or 0) >= interactions:
            at_mark = mean
        for t in thresholds:
            if reached[str(t)] is None and mean >= t:
                reached[str(t)] = u["t"]
    lags = sorted(int(u["lag"]) for u in updates if isinstance(u.get("lag"), int))

    def q(p: float) -> int | None:
        return lags[min(len(lags) - 1, int(p * len(lags)))] if lags else None

    return {"f_mu_at_mark": at_mark, "virtual_s_to": reached, "lag_p50": q(0.5), "lag_p90": q(0.9),
            "lag_max": lags[-1] if lags else None, "updates": len(updates), "random_results": random_results(metrics)}


def random_results(metrics: list[dict[str, Any]]) -> int:
    """How many of a run's results were random-action episodes."""
    return sum(bool(u.get("random")) for u in metrics if u.get("type") == "update")


def parse_staleness(rule: str | None) -> tuple[str, float] | None:
    """("drop", K) or ("decay", H) of --staleness; None for none. ValueError for anything else."""
    if not rule:
        return None
    name, _, value = rule.partition(":")
    try:
        k = float(value)
    except ValueError:
        k = math.nan
    if name not in ("drop", "decay") or not math.isfinite(k) or k < 0 or (name == "decay" and k == 0):
        raise ValueError(f"--staleness {rule!r}: drop:K (K >= 0 versions) or decay:H (H > 0 versions)")
    return name, k


@contextlib.contextmanager
def staleness(rule: str | None):
    """While it is open, every AES-RL tell in this process scales the mean rule's step p by the weight
    --staleness gives the result's age (dist.version at the tell less the version it was drawn from)."""
    parsed = parse_staleness(rule)
    if parsed is None:
        yield
        return
    from aesrl_queue import distributions
    from aesrl_queue.optimizers.aesrl import AesrlOptimizer

    name, k = parsed
    weight = [1.0]
    ratio, tell = distributions.update_ratio, AesrlOptimizer.tell

    def weighted_ratio(rule_name: str, *args: Any, **kwargs: Any) -> float:
        p = ratio(rule_name, *args, **kwargs)
        return p if rule_name == "one-plus-one" else p * weight[0]

    def weighted_tell(self, ind, fit, ref):
        age = max(0, self.dist.version - ind.version)
        weight[0] = (0.0 if age > k else 1.0) if name == "drop" else k / (k + age)
        try:
            return tell(self, ind, fit, ref)
        finally:
            weight[0] = 1.0

    distributions.update_ratio, AesrlOptimizer.tell = weighted_ratio, weighted_tell
    try:
        yield
    finally:
        distributions.update_ratio, AesrlOptimizer.tell = ratio, tell


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One virtual run in this (pool) process; its line of the results. With cell["resume"] a folder that
    holds the cell's run continues it (a finished one is only read); with cell["minutes"] the run stops
    after that many wall minutes (its row's status "stopped"), as it does at a SIGTERM."""
    import signal

    from aesrl_queue.algorithms import algorithm
    from aesrl_queue.config import RunConfig
    from aesrl_queue.cost_model import resolve
    from aesrl_queue.local import Terminated, _raise_terminated
    from aesrl_queue.metrics import read_metrics
    from aesrl_queue.virtual import VIRTUAL_FILE, VirtualRun

    rule = cell.get("staleness")
    # ptd3: the parallel TD3 of bench/parallel_td3.py, on --algo td3's settings (its learner, sizes)
    algo = "td3" if cell["algo"] == "ptd3" else cell["algo"]
    # the rows name the dispatch rules of the asynchronous learners (the random jobs in flight capped at
    # initial_steps, the critic gate counting the jobs in flight), which the core has run since they
    # became its defaults: rows without them ran the rules before (docs/scaling.md, "How many workers pay")
    spec = algorithm(algo)
    rules = spec.tells == "result" and spec.learner
    run_id = (f"v-{cell['env'].split('-')[0].lower()}-{cell['algo']}-n{cell['workers']}-s{cell['seed']}"
              + (f"-{rule.replace(':', '')}" if rule else "") + ("-rcap-gif" if rules else ""))
    cfg = RunConfig.from_preset(cell["env"], algo=algo, seed=cell["seed"], run_id=run_id,
                                total_steps=cell["steps"], **cell.get("settings", {})).resolve()
    t0 = time.monotonic()
    cost = resolve(cell.get("cost_model"))
    folder = Path(cell["runs"]) / run_id
    resume = bool(cell.get("resume")) and cell["algo"] != "ptd3" and (folder / VIRTUAL_FILE).is_file()
    if not resume:
        shutil.rmtree(folder, ignore_errors=True)  # a cell run again starts over
    elif json.loads((folder / VIRTUAL_FILE).read_text())["cost_model"] != cost.to_dict():
        raise SystemExit(f"{folder} ran under another cost model than {cell.get('cost_model')}: "
                         "run the cell without --resume to start it over")
    if cell["algo"] == "ptd3":
        from bench import parallel_td3

        run_dir, summary = parallel_td3.run(cfg, cell["workers"], cost, cell["runs"])
    elif resume and _finished(folder):
        run_dir, summary = folder, json.loads((folder / "summary.json").read_text())
    else:
        run = VirtualRun.resumed(folder) if resume else VirtualRun(cfg, cell["workers"], cost, out_dir=cell["runs"])
        # a deadline (--minutes) or SIGTERM stops the run as the launcher's SIGTERM does: its folder is kept
        before = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGALRM)}
        if cell.get("minutes"):
            signal.setitimer(signal.ITIMER_REAL, 60 * float(cell["minutes"]))
        try:
            with staleness(rule):
                summary, run_dir = run.run(), run.run_dir
        except Terminated:
            summary, run_dir = run.summary or {"status": "stopped"}, run.run_dir
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in before.items():
                signal.signal(s, handler)
    facts = summary.get("virtual", {})
    resumes = [r["virtual_s"] for r in facts.get("resumes", [])]
    return {**{k: cell[k] for k in ("env", "algo", "workers", "seed", "steps", "interactions", "settings", "cost_model")},
            **({"staleness": rule} if rule else {}),
            **({"random_cap": True, "gate_inflight": True} if rules else {}), "run_dir": str(run_dir),
            "status": summary.get("status"), "virtual_s": facts.get("virtual_s"),
            # a resumed cell: the wall seconds of all its incarnations, and where each resume took it up
            "wall_s": facts["wall_s"] if resumes else round(time.monotonic() - t0, 1),
            **({"resumed_at": resumes} if resumes else {}),
            **score(read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").is_file() else [],
                    cell["interactions"], cell["thresholds"]),
            **(final_policy_score(run_dir) if summary.get("status") == "finished" else {})}


def options_label(row: dict[str, Any]) -> str:
    """A results row's bench options, as the table and the plot name its series ("" for none)."""
    return " ".join(x for x in (row.get("staleness") or "", "random_cap" if row.get("random_cap") else "",
                                "gate_inflight" if row.get("gate_inflight") else "") if x)


def final_policy_score(run_dir: str | Path) -> dict[str, Any]:
    """The learning protocol's score of the run's final policy (policy.npz: μ, or parallel TD3's actor),
    its deterministic episodes from the protocol's fixed start states (bench/learning.py), and the
    stored steps it was written at; nothing where the folder has no policy."""
    from bench.learning import PROTOCOL, score_snapshot

    path = Path(run_dir) / "policy.npz"
    if not path.is_file():
        return {}
    steps = json.loads((Path(run_dir) / "summary.json").read_text()).get("steps")
    return {"policy_score": score_snapshot(path, PROTOCOL["eval_seeds"])["mean"], "policy_steps": steps}


def table(args: argparse.Namespace) -> None:
    """The grid as a table: per environment, algorithm and N, each seed's final-policy score (its mean
    over seeds, and its difference to N = 2 of the same algorithm, the reference, averaged over the seeds
    both ran; a bench option's series without an N = 2 row is held against the algorithm's own N = 2),
    f(μ)~ at the mark, the random results, the virtual seconds of the run and to each threshold (the
    seeds' mean, of those that reached it: k/n says how many did). The last line of a cell run again
    counts."""
    cells: dict[tuple, dict[int, dict[str, Any]]] = {}
    for name in args.files:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line)
            if row.get("status") != "finished":
                continue
            key = (row["env"], row["algo"], row["steps"], options_label(row), json.dumps(row.get("settings") or {}),
                   row.get("cost_model"))
            cells.setdefault(key, {}).setdefault(row["workers"], {})[row["seed"]] = row

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    def fmt(v, digits=0):
        return "–" if v is None else f"{v:,.{digits}f}"

    for (env, algo, steps, rule, settings, cost), by_n in sorted(cells.items(), key=lambda kv: str(kv[0])):
        first = next(iter(next(iter(by_n.values())).values()))
        thresholds = list(first["virtual_s_to"])
        extra = " ".join(x for x in (rule, settings if settings != "{}" else "") if x)
        mark = first.get("interactions", args.interactions)
        print(f"\n{env}, {algo}{(' ' + extra) if extra else ''}, {first['steps']:,} steps, f(μ)~ at "
              f"{mark:,} interactions; cost model {first['cost_model']}")
        # the reference: this series' N = 2, or, for a bench option without one, the same algorithm's N = 2
        ref_rows = by_n.get(2) or (cells.get((env, algo, steps, "", settings, cost)) or {}).get(2, {})
        if rule and 2 not in by_n and ref_rows:
            print(f"(vs N = 2: {algo} without {rule}, the same seeds)")
        ref = {seed: r.get("policy_score") for seed, r in ref_rows.items()}
        print("| N | seeds | final policy (each seed) | mean | vs N = 2, same seeds | f(μ)~ at mark | random results | "
              "virtual s | " + " | ".join(f"s to {float(t):,.0f}" for t in thresholds) + " |")
        print("|" + "---|" * (8 + len(thresholds)))
        for n in sorted(by_n):
            rows = [by_n[n][seed] for seed in sorted(by_n[n])]
            pol = mean(r.get("policy_score") for r in rows)
            # against N = 2 on the seeds both ran: the mean of the differences, seed by seed
            diff = mean(r["policy_score"] - ref[r["seed"]] for r in rows
                        if r.get("policy_score") is not None and ref.get(r["seed"]) is not None)
            reach = []
            for t in thresholds:
                hit = [r["virtual_s_to"][t] for r in rows if r["virtual_s_to"].get(t) is not None]
                reach.append(f"{fmt(mean(hit), 1)} ({len(hit)}/{len(rows)})")
            print(f"| {n:,} | {','.join(str(r['seed']) for r in rows)} | "
                  f"{' / '.join(fmt(r.get('policy_score')) for r in rows)} | {fmt(pol)} | "
                  f"{fmt(diff)} | "
                  f"{fmt(mean(r.get('f_mu_at_mark') for r in rows))} | "
                  f"{' / '.join(fmt(r.get('random_results')) for r in rows)} | "
                  f"{fmt(mean(r.get('virtual_s') for r in rows), 1)} | " + " | ".join(reach) + " |")


REAL_SCORES = ("bench/results/learning-protocol-v2-dev.json:aesrl-learner-actor-anti90-lag1k",
               "bench/results/learning-protocol-v2.json:aesrl")


def scores(args: argparse.Namespace) -> None:
    """Item 2's score check: per environment, the final-policy scores of measure's virtual runs against
    those of real runs of the same algorithm, rows of the learning protocol's results files (FILE:ALGO;
    their score at 100 % of the stored steps, the same 10 fixed starts): each real run, their range and
    mean, each virtual run and whether it lies inside the real range, and the difference of the means
    with a 95 % percentile bootstrap interval (each side resampled on its own, 5 000 resamples)."""
    import numpy as np

    real: dict[str, list[tuple[int, float]]] = {}
    for spec in args.real:
        name, _, algo = spec.rpartition(":")
        for row in json.loads(Path(name).read_text())["rows"]:
            score = ((row.get("scores") or {}).get("100") or {}).get("mean")
            if row["algo"] == algo and score is not None:
                real.setdefault(row["env"], []).append((row["seed"], float(score)))
    virtual: dict[str, list[dict[str, Any]]] = {}
    for name in args.files:
        for line in Path(name).read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "finished" and row.get("policy_score") is not None:
                virtual.setdefault(row["env"], []).append(row)
    rng = np.random.default_rng(0)
    print("| env | real runs (seed: score) | real range | real mean | virtual N | virtual runs (seed: score) | "
          "inside the range | virtual − real, means [95 % CI] |")
    print("|---|---|---|---|---|---|---|---|")
    for env in sorted(virtual):
        rs, vs = real.get(env, []), sorted(virtual[env], key=lambda r: (r["workers"], r["seed"]))
        if not rs:
            print(f"| {env} | none | | | | | | |")
            continue
        r_scores = np.array([s for _, s in rs])
        v_scores = np.array([r["policy_score"] for r in vs])
        lo, hi = r_scores.min(), r_scores.max()
        inside = sum(lo <= v <= hi for v in v_scores)
        boots = [rng.choice(v_scores, len(v_scores)).mean() - rng.choice(r_scores, len(r_scores)).mean()
                 for _ in range(5000)]
        c_lo, c_hi = np.percentile(boots, [2.5, 97.5])
        v_list = ", ".join(f"{r['seed']}: {r['policy_score']:,.0f}" for r in vs)
        v_n = ",".join(str(n) for n in sorted({r["workers"] for r in vs}))
        print(f"| {env} | {', '.join(f'{seed}: {s:,.0f}' for seed, s in sorted(rs))} | {lo:,.0f} – {hi:,.0f} | "
              f"{r_scores.mean():,.0f} | {v_n} | {v_list} | "
              f"{inside} of {len(vs)} | {v_scores.mean() - r_scores.mean():+,.0f} [{c_lo:+,.0f}, {c_hi:+,.0f}] |")


def rescore(args: argparse.Namespace) -> None:
    """Add final_policy_score to the rows of results files written before measure scored policies."""
    for name in args.files:
        path = Path(name)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            if "policy_score" not in row and row.get("status") == "finished":
                row.update(final_policy_score(row["run_dir"]))
            if "random_results" not in row and row.get("status") == "finished":
                from aesrl_queue.metrics import read_metrics

                row["random_results"] = random_results(read_metrics(row["run_dir"]))
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{path}: {sum('policy_score' in r for r in rows)} of {len(rows)} rows scored")


def measure(args: argparse.Namespace) -> None:
    try:
        parse_staleness(args.staleness)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.minutes is not None and not args.minutes > 0:
        raise SystemExit(f"--minutes must be above 0, got {args.minutes}")
    cells = [{"env": env, "algo": algo, "workers": int(n), "seed": int(seed), "steps": args.steps,
              "interactions": args.interactions, "thresholds": [float(t) for t in args.thresholds.split(",")],
              "cost_model": args.cost_model, "runs": args.runs, "settings": json.loads(args.set),
              "staleness": args.staleness, "resume": args.resume,
              "minutes": args.minutes}
             for env, algo, n, seed in itertools.product(args.envs.split(","), args.algos.split(","),
                                                          args.workers.split(","), args.seeds.split(","))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool, open(out, "a") as fh:
        for line in pool.map(run_cell, cells):
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            print(json.dumps(line), flush=True)


# -- validate: real worker processes against the virtual executor ----------------------------------------
VARIANTS = ("real", "calibrated", "fitted", "fitted-gap", "fitted-spread")
LAG_BINS = ((0, 0), (1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, 31), (32, None))


def lags_of(metrics: list[dict[str, Any]]) -> list[int]:
    """The staleness of every result told after the random phase, in told order."""
    return [int(u["lag"]) for u in metrics
            if u.get("type") == "update" and not u.get("random") and isinstance(u.get("lag"), int)]


def quantiles(values: list[int], ps=(0.1, 0.25, 0.5, 0.75, 0.9, 0.99)) -> dict[str, int | None]:
    v = sorted(values)
    return {f"p{round(p * 100)}": (v[min(len(v) - 1, int(p * len(v)))] if v else None) for p in ps}


def histogram(values: list[int]) -> dict[str, float]:
    """The share of results in each lag bin."""
    out = {}
    for lo, hi in LAG_BINS:
        name = f"{lo}" if hi == lo else (f"{lo}+" if hi is None else f"{lo}-{hi}")
        out[name] = round(sum(lo <= x and (hi is None or x <= hi) for x in values) / len(values), 3) if values else 0.0
    return out


def ks(a: list[int], b: list[int]) -> tuple[float, float]:
    """The two-sample Kolmogorov-Smirnov statistic D = max |F_a - F_b| and its asymptotic p-value (for
    integer lags, with ties, the p-value is conservative)."""
    if not a or not b:
        return math.nan, math.nan
    sa, sb = sorted(a), sorted(b)
    d, i, j = 0.0, 0, 0
    for x in sorted(set(sa) | set(sb)):
        while i < len(sa) and sa[i] <= x:
            i += 1
        while j < len(sb) and sb[j] <= x:
            j += 1
        d = max(d, abs(i / len(sa) - j / len(sb)))
    en = math.sqrt(len(sa) * len(sb) / (len(sa) + len(sb)))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101)) if lam > 0 else 1.0
    return round(d, 4), round(min(1.0, max(0.0, p)), 4)


def final_f_mu(metrics: list[dict[str, Any]]) -> float | None:
    f = [float(u["f_mu"]) for u in metrics if u.get("type") == "update" and isinstance(u.get("f_mu"), int | float)]
    return round(sum(f[-WINDOW:]) / len(f[-WINDOW:]), 1) if f else None


def median(values: list[float]) -> float | None:
    v = sorted(values)
    return v[len(v) // 2] if v else None


def fitted_cost_model(calibrated, real: list[dict[str, Any]], virtual: list[dict[str, Any]], initial_steps: int = 0):
    """The calibrated model scaled to the real run: each kind of job's durations by the ratio of the real
    run's median duration to the calibrated virtual run's (the same jobs, the same steps), the learner
    at the real critic's median measured rate, and its start-up where the real run shows it (its first
    publication after the random phase ended)."""

    def durations(metrics, kind):
        return [float(u["duration"]) for u in measured_updates(metrics, kind)]

    def ratio(kind):
        r, v = median(durations(real, kind)), median(durations(virtual, kind))
        return r / v if r and v else None

    k_es, k_rl = ratio("es"), ratio("rl")
    k_es = k_es or 1.0
    rates = critic_rates(real)
    changes = {"env_step_s": calibrated.env_step_s * k_es, "job_overhead_s": calibrated.job_overhead_s * k_es}
    if k_rl:
        # an RL job's duration: its episodes at the ES rate, and its actor steps scaled to match
        changes["actor_step_s"] = calibrated.actor_step_s * k_rl
    if rates:
        changes["learner_steps_per_s"] = median(rates)
    start = critic_start(real, initial_steps)
    if start is not None:
        changes["critic_start_s"] = start
    return dataclasses.replace(calibrated, **changes), {"k_es": k_es, "k_rl": k_rl, "critic_rate": median(rates),
                                                        "critic_start_s": start}


def _cli(args: list[str], log_path: Path) -> float:
    """Run `aesrl-queue ARGS` in a new process (its output to log_path); the wall seconds it took."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "w") as fh:
        code = subprocess.call([sys.executable, "-m", "cli.main", *args], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"aesrl-queue {' '.join(args)} exited with {code}; see {log_path}")
    return round(time.monotonic() - t0, 1)


def _run_wall_s(folder: Path) -> float | None:
    try:
        if (folder / "virtual.json").is_file():
            return json.loads((folder / "virtual.json").read_text()).get("wall_s")
        return json.loads((folder / "summary.json").read_text()).get("elapsed_s")
    except (OSError, ValueError):
        return None


def _finished(folder: Path) -> bool:
    try:
        return json.loads((folder / "summary.json").read_text()).get("status") == "finished"
    except (OSError, ValueError):
        return False


def validate(args: argparse.Namespace) -> None:
    from aesrl_queue.cost_model import CostModel
    from aesrl_queue.metrics import read_metrics

    runs, cost_path = Path(args.runs), Path(args.cost_model)
    if not cost_path.is_file():
        print(f"calibrating: aesrl-queue calibrate --env {args.env} --algo aesrl --out {cost_path}", flush=True)
        _cli(["calibrate", "--env", args.env, "--algo", "aesrl", "--out", str(cost_path)], runs / "calibrate.log")
    calibrated = CostModel.load(cost_path)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() and args.reuse else {"cells": []}
    results.setdefault("commands", [])
    results["commands"].append(" ".join(["python", *sys.argv]))
    results.update(cost_model=str(cost_path), calibrated=calibrated.to_dict())

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")

    for algo, n, seed in itertools.product(args.algos.split(","), [int(x) for x in args.workers.split(",")],
                                           [int(x) for x in args.seeds.split(",")]):
        common = ["--env", args.env, "--algo", algo, "--steps", str(args.steps), "--seed", str(seed), "--out",
                  str(runs)]
        name = f"val-{args.env.split('-')[0].lower()}-{algo}-n{n}-s{seed}"
        cells = {}
        for variant in [v for v in VARIANTS if v in args.variants.split(",")]:
            folder = runs / f"{name}-{variant}"
            if variant == "real":
                extra = ["--workers", str(n), "--snapshot-every", "0"]
            else:
                if variant.startswith("fitted"):
                    initial = json.loads((runs / f"{name}-real" / "config.json").read_text())["initial_steps"]
                    model, fit = fitted_cost_model(calibrated, cells["real"], cells["calibrated"], initial)
                    if variant in ("fitted-gap", "fitted-spread"):  # and the workers' time between jobs, of the real es run at N
                        es_real = runs / f"val-{args.env.split('-')[0].lower()}-es-n{n}-s{seed}-real"
                        source = read_metrics(es_real) if _finished(es_real) else cells["real"]
                        fit = {**fit, "worker_gap_s": worker_gap(source, n), "gap_from": str(es_real.name
                                                                                       if _finished(es_real) else name)}
                        model = dataclasses.replace(model, worker_gap_s=fit["worker_gap_s"])
                    if variant == "fitted-spread":  # and the spread of the real run's job durations
                        fit["duration_spread"] = duration_spread(cells["real"])
                        model = dataclasses.replace(model, duration_spread=fit["duration_spread"])
                    path = runs / f"{name}-{variant}-cost.json"
                    model.save(path, notes=fit)
                else:
                    path, fit = cost_path, None
                extra = ["--virtual-workers", str(n), "--cost-model", str(path)]
            wall, command = None, f"aesrl-queue run {' '.join(common + extra)} --run-id {folder.name}"
            if not (args.reuse and _finished(folder)):
                print(f"{variant}: {command}", flush=True)
                wall = _cli(["run", *common, *extra, "--run-id", folder.name, "--force"], runs / f"{folder.name}.log")
            if wall is None:  # reused: the run's own wall seconds (a real run's elapsed_s; virtual.json's wall_s)
                wall = _run_wall_s(folder)
            metrics = read_metrics(folder)
            cells[variant] = metrics
            lags = lags_of(metrics)
            cell = {"algo": algo, "workers": n, "seed": seed, "variant": variant, "run_dir": str(folder),
                    "command": command, "wall_s": wall, "results": len(lags), "lag_mean": round(sum(lags) / len(lags), 2) if lags else None,
                    **quantiles(lags), "hist": histogram(lags), "final_f_mu": final_f_mu(metrics)}
            if variant != "real":
                cell["ks_d"], cell["ks_p"] = ks(lags, lags_of(cells["real"]))
                cell["fit"] = fit
                cell["cost_model"] = CostModel.load(path).to_dict()
            results["cells"] = [c for c in results["cells"] if (c["algo"], c["workers"], c["seed"], c["variant"])
                                != (algo, n, seed, variant)] + [cell]
            save()
            print(json.dumps(cell), flush=True)
    print_table(results)


def print_table(results: dict[str, Any]) -> None:
    cols = ("algo", "workers", "seed", "variant", "results", "lag_mean", "p10", "p50", "p90", "p99", "ks_d", "ks_p",
            "final_f_mu", "wall_s")
    print("| " + " | ".join(cols) + " | histogram (share of results per lag) |")
    print("|" + "---|" * (len(cols) + 1))
    for c in results["cells"]:
        hist = " ".join(f"{k}:{v:.2f}" for k, v in c["hist"].items() if v)
        print("| " + " | ".join("" if c.get(k) is None else str(c.get(k)) for k in cols) + f" | {hist} |")


def plot(args: argparse.Namespace) -> None:
    """docs/scaling.md's figure: each series' f(μ)~ at its mark and its virtual seconds against N, one
    point per cell (seeds side by side), a line through the seeds' means. A series is one results file's
    cells of one (env, algo, steps, settings, staleness), named by its algo; FILE:ALGO=LABEL[;ALGO=LABEL]
    names a file's series of that algo otherwise (the same algo in two files would share a series)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, dict[int, list[dict[str, Any]]]] = {}
    for item in args.files:
        path, _, names = item.partition(":")
        label = dict(pair.split("=", 1) for pair in names.split(";") if "=" in pair)
        for line in Path(path).read_text().splitlines():
            cell = json.loads(line)
            if cell.get("status") != "finished" or cell.get("f_mu_at_mark") is None:
                continue
            extra = {k: v for k, v in (cell.get("settings") or {}).items() if k not in ("hidden", "critic_hidden")}
            name = ", ".join(x for x in [label.get(cell["algo"], cell["algo"]), *(f"{k} {v}" for k, v in extra.items()),
                                         options_label(cell), f"{cell['steps'] // 1000}k steps"] if x)
            per_n = series.setdefault((cell["env"], name), {})
            seeds = per_n.setdefault(cell["workers"], [])
            seeds[:] = [c for c in seeds if c["seed"] != cell["seed"]] + [cell]  # a cell run again: its last line
    envs = sorted({env for env, _ in series})
    # one colour per series name in every environment's row
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {name: cycle[i % len(cycle)] for i, name in enumerate(sorted({name for _, name in series}))}
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 4.2 * len(envs)), squeeze=False)
    for row, env in enumerate(envs):
        score, clock = axes[row]
        for (e, name), per_n in sorted(series.items()):
            if e != env:
                continue
            ns = sorted(per_n)
            for ax, key in ((score, "f_mu_at_mark"), (clock, "virtual_s")):
                means = [sum(c[key] for c in per_n[n]) / len(per_n[n]) for n in ns]
                ax.plot(ns, means, marker="o", label=name, color=colour[name])
                for n in ns:
                    ax.scatter([n] * len(per_n[n]), [c[key] for c in per_n[n]], s=10, color=colour[name])
        score.set(xscale="log", xlabel="virtual workers N", ylabel="f(μ)~ at the mark", title=f"{env}: score")
        clock.set(xscale="log", yscale="log", xlabel="virtual workers N", ylabel="virtual seconds of the run",
                  title=f"{env}: virtual wall clock")
        for ax in (score, clock):
            ax.set_xticks([2, 16, 128, 1024], ["2", "16", "128", "1024"])
            ax.grid(alpha=0.3)
        score.legend(fontsize=7)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({sum(len(v) for v in series.values())} points of N in {len(series)} series)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("measure", help="the grid of virtual runs (item 3)")
    m.add_argument("--envs", default="HalfCheetah-v5,Walker2d-v5")
    m.add_argument("--algos", default="aesrl,pcemrl", help="queue algorithms, and ptd3 (bench/parallel_td3.py)")
    m.add_argument("--workers", default="2,16,128,1024")
    m.add_argument("--seeds", default="1,2", help="development seeds only")
    m.add_argument("--steps", type=int, default=100_000, help="budget of stored steps per cell")
    m.add_argument("--interactions", type=int, default=100_000, help="where f(μ)~ is read")
    m.add_argument("--thresholds", default="1000,2000,3000", help="f(μ)~ levels timed in virtual seconds")
    m.add_argument("--cost-model", default=None, help="a cost-model file (default: nominal durations)")
    m.add_argument("--set", default="{}", help='config fields for every cell, as JSON: \'{"critic_hidden": [64, 64]}\'')
    m.add_argument("--jobs", type=int, default=1, help="cells at once, each in its own process")
    m.add_argument("--staleness", default=None, metavar="RULE",
                   help="drop:K (results older than K versions move nothing) or decay:H (step scaled by H/(H+age))")
    m.add_argument("--runs", default="runs/virtual", help="folder of the cells' run folders")
    m.add_argument("--resume", action="store_true",
                   help="a cell whose run folder is there continues it (a virtual resume: the records up to the stop "
                        "are the uninterrupted run's, those after it not); a finished one is read, not run; "
                        "ptd3 cells start over")
    m.add_argument("--minutes", type=float, default=None,
                   help="stop each cell after this many wall minutes (as at SIGTERM), to continue with --resume")
    m.add_argument("--out", default="bench/results/virtual.jsonl")
    v = sub.add_parser("validate", help="real worker processes against the virtual executor (item 2)")
    v.add_argument("--env", default="Pendulum-v1")
    v.add_argument("--algos", default="aesrl,es")
    v.add_argument("--workers", default="2,8")
    v.add_argument("--seeds", default="1", help="development seeds only")
    v.add_argument("--steps", type=int, default=30_000)
    v.add_argument("--cost-model", default="bench/results/cost-model-pendulum.json",
                   help="the calibrated model (`aesrl-queue calibrate` writes it here first when missing)")
    v.add_argument("--variants", default=",".join(VARIANTS),
                   help="which of real, calibrated, fitted, fitted-gap (the fitted ones need real and calibrated)")
    v.add_argument("--runs", default="runs/validate")
    v.add_argument("--reuse", action="store_true", help="keep finished run folders and the results file's cells")
    v.add_argument("--out", default="bench/results/virtual-validate.json")
    p = sub.add_parser("plot", help="docs/scaling.md's figure from measure's results files (item 3)")
    p.add_argument("files", nargs="+", metavar="FILE[:ALGO=LABEL]",
                   help="results files of measure; ALGO=LABEL names that file's series of ALGO")
    p.add_argument("--out", default="docs/img/virtual-workers.png")
    r = sub.add_parser("rescore", help="add the protocol's score of each finished row's policy.npz")
    r.add_argument("files", nargs="+", metavar="FILE", help="results files of measure")
    t = sub.add_parser("table", help="the grid's table from measure's results files (item 3)")
    t.add_argument("files", nargs="+", metavar="FILE", help="results files of measure")
    t.add_argument("--interactions", type=int, default=100_000,
                   help="the mark rows that do not record theirs were read at (a label)")
    c = sub.add_parser("scores", help="virtual runs' final scores against real runs' (item 2, MuJoCo)")
    c.add_argument("files", nargs="+", metavar="FILE", help="results files of measure")
    c.add_argument("--real", action="append", metavar="FILE:ALGO",
                   help=f"the learning protocol's rows of ALGO in FILE (repeatable; default: {' and '.join(REAL_SCORES)})")
    args = ap.parse_args()
    if args.mode == "scores" and not args.real:
        args.real = list(REAL_SCORES)
    {"measure": measure, "validate": validate, "plot": plot, "rescore": rescore, "table": table,
     "scores": scores}[args.mode](args)


if __name__ == "__main__":
    main()
