"""What `aesrl-queue status` shows: a run's numbers gathered from Redis into one dict, and as text."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import redis

from aesrl_queue.codec import CodecError
from aesrl_queue.optimizers import rl_target
from aesrl_queue.progress import STALLED_AFTER
from aesrl_queue.store import FANOUT_FIELD, HOST_KEY, Store, live_hosts, live_workers, worker_ages

SERIES_POINTS = 60  # width of the f(μ) sparkline


def redis_now(client: redis.Redis) -> float:
    """The Redis server's clock: ages are measured against it, so a remote status is right even
    when this machine's clock differs from the scheduler's."""
    try:
        sec, usec = client.time()
        return sec + usec / 1e6
    except redis.RedisError:
        return time.time()


def downsample(values: list[float], n: int) -> list[float]:
    """At most n values: the means of n equal slices (a sparkline of the whole window)."""
    if len(values) <= n:
        return list(values)
    edges = np.linspace(0, len(values), n + 1).astype(int)
    return [float(np.mean(values[a:b])) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def gather(client: redis.Redis, run_id: str, window: int = 300) -> dict[str, Any]:
    """Every number `status` prints, read from the run's keys (`window` = recent updates used for
    the trend, the sparkline and steps/s)."""
    store = Store(client, run_id)
    cfg = store.config()
    st = store.state()
    hist = [h for _, h in store.history(count=window, newest=True)]
    now = redis_now(client)
    out: dict[str, Any] = {
        "run": run_id, "env": cfg.env_id, "algo": cfg.algo, "status": st.get("status", "?"),
        "version": st["version"], "steps": st["steps"], "total_steps": cfg.total_steps,
        "interactions": st["interactions"], "f_mu": st.get("f_mu", math.nan),
        "best_fitness": st.get("best_fitness", math.nan), "results_applied": st["results_applied"],
        "rl_applied": st["rl_applied"], "es_applied": st["es_applied"], "dispatched": st["dispatched"],
        "failed": st["failed"], "rejected": st["rejected"], "replaced": st["replaced"], "stale": st["stale"],
        "rl_target": rl_target(cfg),
        "n_rl": st["n_rl"], "n_es": st["n_es"],
        "critic_version": st["critic_version"], "critic_steps": st["critic_steps"],
        "critic_steps_per_s": st.get("critic_steps_per_s", 0.0), "critic_loss": st.get("critic_loss", math.nan),
        "critic_device": st.get("critic_device", ""), "critic_target": st.get("critic_target", ""),
        "critic_age": now - st["critic_updated_at"] if st.get("critic_updated_at") else None,
        "inflight": store.inflight_count(),
        "started_at": st.get("started_at", 0.0),
        "elapsed": ((st.get("finished_at") or now) - st["started_at"]) if st.get("started_at") else 0.0,
        "last_p_rl": st.get("last_p_rl", math.nan), "last_p_es": st.get("last_p_es", math.nan),
        "now": now,
        "problem": st.get("problem") or "", "problem_hint": st.get("problem_hint") or "",
        "breaker": st.get("breaker") or "",
    }
    applied = st["rl_applied"] + st["es_applied"]
    out["rl_share"] = st["rl_applied"] / applied if applied else 0.0
    if hist:
        last = hist[-1]
        out.update(sigma_mean=last.get("sigma_mean"), sigma_min=last.get("sigma_min"), sigma_max=last.get("sigma_max"))
        f_mus = [h["f_mu"] for h in hist if isinstance(h.get("f_mu"), float) and math.isfinite(h["f_mu"])]
        out["f_mu_trend"] = (f_mus[-1] - f_mus[0]) if len(f_mus) >= 2 else 0.0
        out["trend_updates"] = len(hist)
        out["f_mu_series"] = downsample(f_mus, SERIES_POINTS)
        out["f_mu_range"] = (min(f_mus), max(f_mus)) if f_mus else None
        t0, t1 = hist[0]["t"], hist[-1]["t"]
        lens = sum(h.get("len", 0) for h in hist[1:])
        # steps/s of the recent window while the run goes; none once it stopped or finished
        live = out["status"] in ("running", "draining")
        out["steps_per_s"] = lens / (t1 - t0) if live and t1 > t0 and now - t1 < 30 else 0.0
        out["last_p"] = {k: [round(h["p"], 3) for h in hist if h["kind"] == k][-5:] for k in ("es", "rl")}
        out["rl_share_recent"] = sum(h["kind"] == "rl" for h in hist) / len(hist)
        out["last_update_age"] = now - t1
    else:
        out.update(sigma_mean=None, sigma_min=None, sigma_max=None, f_mu_trend=0.0, f_mu_series=[], f_mu_range=None,
                   steps_per_s=0.0, last_p={"es": [], "rl": []}, trend_updates=0, last_update_age=None,
                   rl_share_recent=0.0)
    # seconds a live run has applied nothing (None while updates come): a rate and an ETA of the
    # last window would be stale, so the views say "stalled Ns" instead
    quiet = out["last_update_age"] if hist else (now - st["started_at"] if st.get("started_at") else None)
    live = out["status"] in ("running", "draining")
    out["stalled_s"] = quiet if live and quiet is not None and quiet >= STALLED_AFTER else None
    out["initial_steps"] = cfg.initial_steps
    workers = live_workers(client)
    names = sorted(workers)
    out["workers"] = []
    for n, seen in zip(names, worker_ages(client, names), strict=True):
        w = workers[n]
        out["workers"].append(
            {"name": n, "host": w.get("host", ""), "pid": w.get("pid", ""), "kind": w.get("kind", ""),
             "job": w.get("job", ""), "run": w.get("run", ""), "jobs_done": int(w.get("jobs_done", 0) or 0),
             "last_seen": round(seen, 1) if seen is not None else None,
             "queues": w.get("queues", "")})
    # Each host's replica (`aesrl-queue worker`): its link and lag, and the reads of that host's
    # workers that went to the primary instead (fallbacks since they started).
    fallbacks: dict[str, int] = {}
    for w in workers.values():
        fallbacks[w.get("host", "")] = fallbacks.get(w.get("host", ""), 0) + int(w.get("fallbacks", 0) or 0)
    out["hosts"] = []
    hosts = live_hosts(client)
    names = sorted(hosts)
    for name, seen in zip(names, worker_ages(client, names, HOST_KEY), strict=True):
        h = hosts[name]
        out["hosts"].append({"name": name, "host": h.get("host", ""), "pid": h.get("pid", ""),
                             "link": h.get("link", ""), "lag_bytes": int(h.get("lag_bytes", -1) or -1),
                             "io_s": int(h.get("io_s", -1) or -1), "restarts": int(h.get("restarts", 0) or 0),
                             "fallbacks": fallbacks.get(h.get("host", ""), 0),
                             "seen_s": round(seen, 1) if seen is not None else None})
    troubled = [h for h in out["hosts"] if h["fallbacks"] > 0 or h["link"] != "up"]
    if troubled and not out["problem"]:
        h = troubled[0]
        source = "the fan-out instance" if st.get(FANOUT_FIELD) else "the primary"  # what a host falls back to
        out["problem"] = (f"host {h['host']} reads from {source}: {h['fallbacks']} fallbacks, replica link "
                          f"{h['link'] or 'unknown'}" + (f" (and {len(troubled) - 1} more hosts)" if len(troubled) > 1 else ""))
        out["problem_hint"] = out["problem_hint"] or f"host {h['host']} falls back to {source}"
    return out


def _f(x: Any, fmt: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARK[int((v - lo) / span * (len(SPARK) - 1))] for v in values)


def render(s: dict[str, Any]) -> str:
    """Plain-text status of one run."""
    pct = 100.0 * s["steps"] / s["total_steps"] if s["total_steps"] else 0.0
    lines = [
        f"run {s['run']}  ({s['algo']} on {s['env']})  status: {s['status']}",
        f"  f(μ) {_f(s['f_mu'])}  trend {_f(s['f_mu_trend'], '+.1f')}  best f(z) {_f(s['best_fitness'])}  "
        f"{sparkline(s['f_mu_series'])}",
        f"  σ mean {_f(s['sigma_mean'], '.4g')}  min {_f(s['sigma_min'], '.4g')}  max {_f(s['sigma_max'], '.4g')}"
        f"  version {s['version']}",
        f"  steps {s['steps']:,}/{s['total_steps']:,} ({pct:.1f}%)  interactions {s['interactions']:,}  "
        f"{_rate_text(s, '.1f')}  "
        f"elapsed {s['elapsed']:.0f}s",
        f"  RL share {s['rl_share']:.2f} (target {s['rl_target']:.2f})  applied es {s['es_applied']} "
        f"rl {s['rl_applied']}  last p es {s['last_p']['es']} rl {s['last_p']['rl']}",
        f"  jobs in flight {s['inflight']}  failed {s['failed']}  rejected {s['rejected']}  "
        f"replaced {s['replaced']}  stale {s['stale']}",
        f"  critic version {s['critic_version']}  trained {s['critic_steps']:,} steps  "
        f"{_f(s['critic_steps_per_s'])} steps/s  loss {_f(s['critic_loss'], '.4g')}",
        f"  live workers {len(s['workers'])}",
    ]
    if s.get("problem"):
        lines.insert(1, f"  problem: {s['problem']}" + (f" (circuit breaker {s['breaker']})" if s.get("breaker") else ""))
    for w in s["workers"]:
        lines.append(f"    {w['host']}:{w['pid']:<8} {w['kind'] or 'idle':5} jobs {w['jobs_done']:<6} "
                     f"seen {_f(w['last_seen'])}s ago  {w['run']}")
    hosts = s.get("hosts", [])
    if hosts:
        lines.append(f"  host replicas {len(hosts)}")
    for h in hosts:
        lag = f"{h['lag_bytes']:,} B" if h["lag_bytes"] >= 0 else "-"
        lines.append(f"    {h['host']}:{h['pid']:<8} link {h['link'] or '-':5} lag {lag:>10}  fallbacks {h['fallbacks']:<5} "
                     f"restarts {h['restarts']}  seen {_f(h['seen_s'])}s ago")
    return "\n".join(lines)


def _rate_text(s: dict[str, Any], fmt: str) -> str:
    """`steps/s N` while updates come, `stalled Ns` when a live run has applied nothing for a while."""
    if s.get("stalled_s") is not None:
        return f"stalled {s['stalled_s']:.0f}s"
    live = s["status"] in ("running", "draining")
    return f"steps/s {_f(s['steps_per_s'], fmt) if live else '-'}"


def render_line(s: dict[str, Any]) -> str:
    """One plain line of a run's status (for `status --watch` off a terminal, e.g. into a log)."""
    total = s["total_steps"] or 1
    line = (f"{time.strftime('%H:%M:%S')} {s['run']} {s['status']}  f(μ) {_f(s['f_mu'])}  "
            f"steps {s['steps']:,}/{s['total_steps']:,} ({100.0 * s['steps'] / total:.1f}%)  "
            f"{_rate_text(s, ',.0f')}  es {s['es_applied']} rl {s['rl_applied']}  "
            f"critic v{s['critic_version']}  workers {len(s['workers'])}")
    if s.get("problem_hint"):
        line += f"  problem: {s['problem_hint']}"
    return line


def safe_gather(client: redis.Redis, run_id: str) -> dict[str, Any] | str:
    try:
        return gather(client, run_id)
    except CodecError as exc:
        return str(exc)
