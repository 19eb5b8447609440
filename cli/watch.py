"""`aesrl-queue status --watch`: a live terminal view of one run, refreshed about once a second.

Everything shown is read from Redis (the run's state, its recent history, the worker heartbeat
keys), so it works the same on the scheduler's machine and on a laptop pointed at a remote Redis.
"""

from __future__ import annotations

import math
import time
from typing import Any

import redis
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from aesrl_queue.algorithms import uses_critic
from cli.report import render_line, safe_gather, sparkline

STATUS_STYLE = {"running": "bold green", "draining": "bold yellow", "finished": "bold blue",
                "stopped": "bold yellow", "failed": "bold red", "created": "dim"}


def _num(x: Any, fmt: str = ".1f", none: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, fmt)


def _dur(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _bar(frac: float, width: int = 24) -> str:
    full = int(max(0.0, min(1.0, frac)) * width)
    return "━" * full + "╌" * (width - full)


def _ps(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values) if values else "-"


def render_screen(s: dict[str, Any], interval: float = 1.0, error: str = "") -> Group:
    """The whole watch screen of one gather() result."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True, min_width=8)
    grid.add_column()  # wraps on a narrow terminal rather than cropping numbers

    trend = s.get("f_mu_trend") or 0.0
    t_style = "green" if trend > 0 else "red" if trend < 0 else "dim"
    arrow = "▲" if trend > 0 else "▼" if trend < 0 else "="
    f_mu_line = Text.assemble((f"{_num(s['f_mu']):>9}", "bold cyan"), "   ",
                              (f"{arrow} {_num(trend, '+.1f')}", t_style),
                              (f" over the last {s.get('trend_updates', 0)} updates", "dim"),
                              "    best f(z) ", (_num(s["best_fitness"]), "bold"))
    grid.add_row("f(μ)", f_mu_line)
    rng = s.get("f_mu_range")
    spark = sparkline(s["f_mu_series"])
    grid.add_row("", Text.assemble((spark or "(waiting for μ evaluations)", "cyan"),
                                   (f"  {_num(rng[0])} … {_num(rng[1])}" if rng and spark else "", "dim")))
    grid.add_row("σ", f"mean {_num(s['sigma_mean'], '.4f')}   min {_num(s['sigma_min'], '.4f')}   "
                      f"max {_num(s['sigma_max'], '.4f')}   version {s['version']:,}")
    total = s["total_steps"] or 1
    frac = s["steps"] / total
    rate = s["steps_per_s"] or 0.0
    left = max(0, s["total_steps"] - s["steps"])
    live_run = s["status"] in ("running", "draining")
    eta = _dur(left / rate) if rate > 0 and s["status"] == "running" else "-"
    if s.get("stalled_s") is not None:  # nothing applied for a while: the last window's rate is stale
        speed = Text(f"stalled {s['stalled_s']:.0f}s (no update applied)", style="yellow")
    else:
        speed = Text(f"{_num(s['steps_per_s'], ',.0f') if live_run else '-'} steps/s   ETA {eta}")
    grid.add_row("steps", Text.assemble(f"{s['steps']:,} / {s['total_steps']:,} ", (_bar(frac), "cyan"),
                                        f" {100 * frac:5.1f}%   ", speed,
                                        f"   elapsed {_dur(s['elapsed'])}"))
    grid.add_row("", f"interactions {s['interactions']:,} (all env steps, μ evaluations included)")
    recent = s.get("rl_share_recent", 0.0)
    share_style = "green" if abs(recent - s["rl_target"]) <= 0.15 else "yellow"
    warmup = (f"   ES only before {s['initial_steps']:,} steps" if s["rl_target"] > 0 and s.get("initial_steps")
              else "")
    grid.add_row("RL share", Text.assemble((f"{recent:.2f}", share_style),
                                           f" (last {s.get('trend_updates', 0)} updates)   {s['rl_share']:.2f} overall"
                                           f"   target {s['rl_target']:.2f}", (warmup, "dim")))
    grid.add_row("last p", f"es [{_ps(s['last_p']['es'])}]   rl [{_ps(s['last_p']['rl'])}]")
    bad = s["failed"] + s["rejected"]
    grid.add_row("jobs", Text.assemble(f"applied es {s['es_applied']:,} rl {s['rl_applied']:,}   in flight {s['inflight']}   ",
                                       (f"failed {s['failed']}   rejected {s['rejected']}", "red" if bad else ""),
                                       f"   replaced {s['replaced']}   stale {s['stale']}"
                                       f"   live workers {len(s['workers'])}"))
    if s["critic_version"]:
        age = s.get("critic_age")
        grid.add_row("critic", f"v{s['critic_version']:,}   {_num(s['critic_steps_per_s'], ',.0f')} steps/s   "
                               f"trained {s['critic_steps']:,} steps   loss {_num(s['critic_loss'], '.4g')}   "
                               f"{s.get('critic_device') or ''}   updated {_dur(age)} ago"
                               + (f"   Q of {s['critic_target']}" if s.get("critic_target") else ""))
    else:
        grid.add_row("critic", Text("no critic published yet" if uses_critic(s["algo"]) else f"none ({s['algo']})", style="dim"))

    if s.get("problem"):
        grid.add_row(Text("problem", style="bold red"),
                     Text(s["problem"] + (f"  (circuit breaker {s['breaker']})" if s.get("breaker") else ""),
                          style="red"))

    title = Text.assemble(("aesrl-queue ", "bold"), (s["run"], "bold magenta"),
                          f"  {s['algo']} on {s['env']}  ", (s["status"], STATUS_STYLE.get(s["status"], "")))
    panel = Panel(grid, title=title, title_align="left", box=box.ROUNDED, padding=(0, 1))

    workers = Table(box=box.SIMPLE_HEAD, title=f"workers ({len(s['workers'])} live)", title_justify="left",
                    title_style="bold", expand=False, pad_edge=False)
    for name, justify in (("host", "left"), ("pid", "right"), ("job", "left"), ("kind", "left"),
                          ("jobs done", "right"), ("last seen", "right"), ("run", "left")):
        workers.add_column(name, justify=justify, no_wrap=True)
    for w in s["workers"]:
        kind = w["kind"] or "idle"
        other_run = w["run"] and w["run"] != s["run"]
        workers.add_row(w["host"], str(w["pid"]), (w["job"] or "-")[-24:],
                        Text(kind, style={"rl": "magenta", "es": "cyan"}.get(kind, "dim")),
                        f"{w['jobs_done']:,}", f"{_num(w['last_seen'])}s ago",
                        Text(w["run"] or "-", style="yellow" if other_run else "dim"))
    if not s["workers"]:
        workers.add_row("-", "", "", Text("no live workers: start `rq worker -w workers.AesrlWorker ...`", style="yellow"),
                        "", "", "")
    footer = Text.assemble((f"refreshing every {interval:g}s · Ctrl-C to quit", "dim"),
                           (f"   {error}", "bold red") if error else "")
    return Group(panel, workers, footer)


DONE = ("finished", "stopped", "failed")


def watch_status(client: redis.Redis, run_id: str, interval: float = 1.0, console: Console | None = None,
                 until_done: bool = False, plain: bool | None = None) -> str:
    """Refresh the screen every `interval` seconds until Ctrl-C (or, with `until_done`, until the
    run is finished, stopped or failed); a Redis hiccup is shown, not fatal. Off a terminal (or
    with `plain`) a plain line is printed every `interval` seconds instead. Returns the last status."""
    console = console or Console()
    if plain is None:
        plain = not console.is_terminal
    last: dict[str, Any] | None = None
    error = ""

    def read() -> dict[str, Any] | None:
        nonlocal last, error
        try:
            s = safe_gather(client, run_id)
            if isinstance(s, str):
                error, s = s, last
            else:
                error, last = "", s
        except redis.RedisError as exc:
            error, s = f"cannot read from Redis: {exc}", last
        return s

    try:
        if plain:
            while True:
                s = read()
                print(render_line(s) if s is not None else f"waiting for run {run_id}: {error}",
                      f"  ({error})" if error and s is not None else "", sep="", flush=True)
                if until_done and s is not None and s["status"] in DONE:
                    return s["status"]
                time.sleep(interval)
        with Live(console=console, auto_refresh=False, screen=False, transient=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                s = read()
                if s is None:
                    live.update(Text(f"waiting for run {run_id}: {error}", style="yellow"), refresh=True)
                else:
                    live.update(render_screen(s, interval, error), refresh=True)
                    if until_done and s["status"] in DONE:
                        return s["status"]
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return last["status"] if last else "unknown"
