"""`aesrl-queue plot`: learning curves and the ES/RL interaction chart of run folders, as one PNG.

Reads only the run folders (config.json + metrics.jsonl), so runs from any machine can be compared.
Runs whose configs differ only by seed form one curve: the mean across seeds with a ±1 std band, over
the stored steps every one of them reached (each panel of a curve ends there). Runs of different
budgets (total_steps) are different configurations.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aesrl_queue.algorithms import uses_critic
from aesrl_queue.fitness import MIN_SCALE
from aesrl_queue.metrics import read_metrics

# Config fields that never make two runs different algorithms.
IGNORED_FIELDS = {"seed", "run_id", "created_at", "spec_hash", "job_timeout", "result_ttl",
                  "failure_ttl", "critic_wait", "queued_per_worker", "job_deadline", "history_max"}
CURVE_BINS = 60
INTERACTION_BINS = 25
MIN_PER_BIN = 3  # fewer updates than this in a bin: no point drawn


class PlotError(ValueError):
    """A run folder cannot be plotted (missing, empty, or unreadable)."""


@dataclass
class RunData:
    folder: Path
    config: dict[str, Any]
    updates: list[dict[str, Any]]
    evals: list[dict[str, Any]]  # (steps, elapsed, f_mu) of μ evaluations
    label: str = ""

    @property
    def run_id(self) -> str:
        return str(self.config.get("run_id") or self.folder.name)


@dataclass
class Group:
    label: str
    runs: list[RunData] = field(default_factory=list)


def load_run(folder: str | Path) -> RunData:
    folder = Path(folder)
    if not folder.is_dir():
        raise PlotError(f"{folder}: not a run folder (expected a folder with config.json and metrics.jsonl)")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlotError(f"{folder}: cannot read config.json ({exc})") from None
    try:
        recs = read_metrics(folder / "metrics.jsonl")
    except OSError as exc:
        raise PlotError(f"{folder}: cannot read metrics.jsonl ({exc})") from None
    # Records written before "type" existed are updates.
    updates = [r for r in recs if r.get("type", "update") == "update" and "steps" in r]
    evals = [r for r in recs if r.get("type") == "mu_eval"]
    if not evals:  # no μ evaluation records: the scheduler's f(μ) at each update
        evals = [r for r in updates if _finite(r.get("f_mu"))]
    evals = [r for r in evals if _finite(r.get("f_mu")) and _finite(r.get("steps"))]
    t0 = _start_time(updates + evals)
    for r in updates + evals:
        if not _finite(r.get("elapsed")) and _finite(r.get("t")) and t0 is not None:
            r["elapsed"] = r["t"] - t0
    if not evals:
        raise PlotError(f"{folder}: metrics.jsonl has no f(μ) values yet")
    updates.sort(key=lambda r: r["steps"])
    evals.sort(key=lambda r: r["steps"])
    return RunData(folder=folder, config=config, updates=updates, evals=evals)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _start_time(recs: list[dict[str, Any]]) -> float | None:
    ts = [r["t"] for r in recs if _finite(r.get("t"))]
    return min(ts) if ts else None


# Fields derived from the environment and the networks: another field (env_id, hidden) names the cause.
DERIVED_FIELDS = {"obs_dim", "act_dim", "max_action", "max_episode_steps", "actor_dim"}
LABEL_WRAP = 90  # characters per legend line: a long label wraps instead of widening the legend


class LabelError(PlotError):
    """--label names a field no run's config has."""


def _value(run: RunData, key: str) -> str:
    return json.dumps(run.config.get(key), sort_keys=True)


def group_runs(runs: list[RunData], label_fields: list[str] | tuple[str, ...] = ()) -> list[Group]:
    """Runs whose configs differ only by seed (and bookkeeping) share a group, unless label_fields
    names one of those fields.

    A group is labelled by its algorithm (and environment, when the runs span several), then
    `field=value` for each of label_fields. Algorithms and environments have their own defaults
    (aesrl and es differ in about ten fields), so those differences are not named; where two groups
    would still share a label (runs of one algorithm that differ in a setting), the settings that
    differ between just those groups are added to tell them apart.
    """
    known = {k for r in runs for k in r.config}
    missing = [k for k in label_fields if k not in known]
    if missing:
        raise LabelError(f"label: no run's config has {', '.join(missing)} (fields: "
                         f"{', '.join(sorted(known - IGNORED_FIELDS - DERIVED_FIELDS))})")
    keys = sorted((known - IGNORED_FIELDS) | set(label_fields))  # --label seed: a curve per seed
    by_config: dict[str, list[RunData]] = {}
    for r in runs:
        by_config.setdefault(json.dumps([_value(r, k) for k in keys]), []).append(r)
    # Each environment has its own preset too: runs on several environments are named by both.
    named = ["env_id"] if len({_value(r, "env_id") for r in runs}) > 1 else []
    named += [k for k in label_fields if k not in ("algo", *named)]
    labels: dict[str, str] = {}
    for ck, members in by_config.items():
        r = members[0]
        labels[ck] = ", ".join([str(r.config.get("algo", "?"))] + [
            str(r.config.get(k)) if k == "env_id" else f"{k}={r.config.get(k)}" for k in named])
    for label in set(labels.values()):
        clash = [ck for ck, lab in labels.items() if lab == label]
        if len(clash) < 2:
            continue
        firsts = [by_config[ck][0] for ck in clash]
        differ = [k for k in keys if k not in DERIVED_FIELDS and k not in named
                  and len({_value(r, k) for r in firsts}) > 1]
        for i, (ck, r) in enumerate(zip(clash, firsts, strict=True)):
            labels[ck] = ", ".join([label] + ([f"{k}={r.config.get(k)}" for k in differ] or [f"config {i + 1}"]))
    return [Group(labels[ck], members) for ck, members in by_config.items()]


def legend_label(group: Group) -> str:
    """The group's label with its seed count, wrapped at LABEL_WRAP characters."""
    import textwrap

    return "\n".join(textwrap.wrap(f"{group.label}  {seeds_label(group.runs)}", LABEL_WRAP,
                                    break_on_hyphens=False, subsequent_indent="    "))


def binned_curve(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Mean of ys in each bin of grid edges, interpolated over empty bins (NaN outside the data)."""
    centers = (grid[:-1] + grid[1:]) / 2
    idx = np.clip(np.searchsorted(grid, xs, side="right") - 1, 0, len(centers) - 1)
    sums = np.bincount(idx, weights=ys, minlength=len(centers))
    counts = np.bincount(idx, minlength=len(centers))
    out = np.full(len(centers), np.nan)
    has = counts > 0
    out[has] = sums[has] / counts[has]
    if has.sum() >= 2:
        inside = (centers >= centers[has][0]) & (centers <= centers[has][-1])
        out[inside] = np.interp(centers[inside], centers[has], out[has])
    return out


def group_curve(group: Group, x_key: str, bins: int = CURVE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, std) of f(μ) against x_key ("steps" or "elapsed") over the range all runs cover."""
    series = []
    for r in group.runs:
        pts = [(e[x_key], e["f_mu"]) for e in r.evals if _finite(e.get(x_key))]
        if pts:
            series.append(np.array(pts, dtype=float))
    if not series:
        return np.array([]), np.array([]), np.array([])
    hi = min(s[:, 0].max() for s in series)
    lo = max(0.0, min(s[:, 0].min() for s in series))
    if hi <= lo:
        hi = lo + 1.0
    grid = np.linspace(lo, hi, bins + 1)
    ys = np.vstack([binned_curve(s[:, 0], s[:, 1], grid) for s in series])
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(ys, axis=0)
            std = np.nanstd(ys, axis=0) if len(series) > 1 else np.zeros(ys.shape[1])
    return (grid[:-1] + grid[1:]) / 2, mean, std


def interaction_stats(group: Group, bins: int = INTERACTION_BINS) -> dict[str, np.ndarray]:
    """Per bin of stored steps, pooled over the group's runs: RL share of updates, mean p per kind,
    and the fraction of each kind's updates whose f(z) beat f(μ)."""
    ups = [u for r in group.runs for u in r.updates if u.get("kind") in ("es", "rl") and _finite(u.get("steps"))]
    if not ups:
        return {}
    steps = np.array([u["steps"] for u in ups], dtype=float)
    hi = group_end(group)
    # Short runs get fewer, fuller bins: a point needs MIN_PER_BIN updates of a kind.
    bins = int(max(2, min(bins, len(ups) // 20)))
    grid = np.linspace(0, max(hi, 1.0), bins + 1)
    idx = np.clip(np.searchsorted(grid, steps, side="right") - 1, 0, bins - 1)
    keep = steps <= grid[-1]
    kinds = np.array([u["kind"] for u in ups])
    p = np.array([u["p"] if _finite(u.get("p")) else np.nan for u in ups], dtype=float)
    improved = np.array([_improved(u) for u in ups], dtype=float)
    out: dict[str, np.ndarray] = {"x": (grid[:-1] + grid[1:]) / 2}
    n_all = np.bincount(idx[keep], minlength=bins).astype(float)
    n_rl = np.bincount(idx[keep & (kinds == "rl")], minlength=bins).astype(float)
    with np.errstate(all="ignore"):
        out["rl_share"] = np.where(n_all >= MIN_PER_BIN, n_rl / n_all, np.nan)
        for kind in ("es", "rl"):
            m = keep & (kinds == kind)
            n = np.bincount(idx[m], minlength=bins).astype(float)
            pm = m & np.isfinite(p)
            out[f"p_{kind}"] = np.where(n >= MIN_PER_BIN, np.bincount(idx[pm], weights=p[pm], minlength=bins) /
                                        np.bincount(idx[pm], minlength=bins), np.nan)
            im = m & np.isfinite(improved)
            out[f"improved_{kind}"] = np.where(n >= MIN_PER_BIN, np.bincount(idx[im], weights=improved[im],
                                                                             minlength=bins) /
                                               np.bincount(idx[im], minlength=bins), np.nan)
            out[f"n_{kind}"] = n
    return out


def group_end(group: Group) -> float:
    """The stored steps every run of the group reached: where each of its panels ends, so that no
    panel goes on with fewer runs than the f(μ) curve averages."""
    ends = [max(u["steps"] for u in r.updates if _finite(u.get("steps"))) for r in group.runs
            if any(_finite(u.get("steps")) for u in r.updates)]
    return float(min(ends)) if ends else 0.0


def kind_means(group: Group, key: str, bins: int = INTERACTION_BINS) -> dict[str, np.ndarray]:
    """Per bin of stored steps, pooled over the group's runs: the mean of update field `key` after ES
    updates and after RL updates ({"x", "es", "rl"}; NaN where a bin has fewer than MIN_PER_BIN)."""
    ups = [u for r in group.runs for u in r.updates
           if u.get("kind") in ("es", "rl") and _finite(u.get("steps")) and _finite(u.get(key))]
    if not ups:
        return {}
    steps = np.array([u["steps"] for u in ups], dtype=float)
    vals = np.array([u[key] for u in ups], dtype=float)
    kinds = np.array([u["kind"] for u in ups])
    bins = int(max(2, min(bins, len(ups) // 20)))
    end = group_end(group)
    grid = np.linspace(0, max(end, 1.0), bins + 1)
    idx = np.clip(np.searchsorted(grid, steps, side="right") - 1, 0, bins - 1)
    keep = steps <= grid[-1]
    out: dict[str, np.ndarray] = {"x": (grid[:-1] + grid[1:]) / 2}
    with np.errstate(all="ignore"):
        for kind in ("es", "rl"):
            m = keep & (kinds == kind)
            n = np.bincount(idx[m], minlength=bins).astype(float)
            out[kind] = np.where(n >= MIN_PER_BIN, np.bincount(idx[m], weights=vals[m], minlength=bins) / n, np.nan)
    return out


def _improved(u: dict[str, Any]) -> float:
    if isinstance(u.get("improved"), bool):
        return float(u["improved"])
    if _finite(u.get("f_z")) and _finite(u.get("f_mu")):
        return float(u["f_z"] > u["f_mu"])
    return math.nan


def _diagnostics(g: Group, c: str, ax_sigma, ax_r, ax_dist, empty_axes: set) -> None:
    """The bottom row: σ after each kind of update, the fitness scale, RL distances from μ."""
    sig = kind_means(g, "sigma_mean")
    for kind, ls in (("rl", "-"), ("es", "--")):
        if sig and np.isfinite(sig[kind]).any():
            empty_axes.discard(ax_sigma)
            ax_sigma.plot(sig["x"], sig[kind], color=c, ls=ls, lw=2, marker="o", ms=3)
    end = group_end(g)
    for r in g.runs:  # r and |Δ| are per update: a thin line per run, both kinds pooled
        # r at its floor (MIN_SCALE) is a scale not yet in use: until the adaptive scale has its first
        # gaps, results do not move μ, and a 1e-6 among values near 100 would stretch a log axis.
        pts = [(u["steps"], u["r"], abs(u["delta"]) if _finite(u.get("delta")) else np.nan)
               for u in r.updates if _finite(u.get("r")) and u["r"] > MIN_SCALE and u.get("told", True)
               and u["steps"] <= end]
        if pts:
            arr = np.array(pts, dtype=float)
            empty_axes.discard(ax_r)
            ax_r.plot(arr[:, 0], arr[:, 1], color=c, lw=1.5)
            grid = np.linspace(arr[0, 0], max(arr[-1, 0], arr[0, 0] + 1), INTERACTION_BINS + 1)
            ok = np.isfinite(arr[:, 2])
            if ok.sum() >= 2:
                ax_r.plot((grid[:-1] + grid[1:]) / 2, binned_curve(arr[ok, 0], arr[ok, 2], grid), color=c,
                          ls="--", lw=1)
            if np.nanmax(arr[:, 1]) / max(np.nanmin(arr[:, 1]), 1e-12) > 50:
                ax_r.set_yscale("log")
    d = kind_means(g, "dist_after")
    if d and np.isfinite(d["rl"]).any():
        empty_axes.discard(ax_dist)
        ax_dist.plot(d["x"], d["rl"], color=c, lw=2, marker="o", ms=3)


def _fmt_steps(x: float, _pos=None) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:g}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:g}k"
    return f"{x:g}"


def seeds_label(runs: list[RunData]) -> str:
    """How many runs and distinct seeds a curve averages: two runs of one seed are not two seeds."""
    n = len(runs)
    seeds = len({json.dumps(r.config.get("seed")) for r in runs})
    if n == 1:
        return f"({runs[0].run_id})"
    if seeds == n:
        return f"(mean ± std, {n} seeds)"
    return f"(mean ± std over {n} runs, {seeds} seed{'s' if seeds != 1 else ''})"


X_AXES = {"steps": ("stored environment steps", "stored steps"),
          "interactions": ("environment interactions (μ evaluations included)", "environment interactions")}


def plot_runs(folders: list[str | Path], out: str | Path, title: str | None = None, dpi: int = 110,
              x_axis: str = "steps", label_fields: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the PNG; returns what was drawn (groups, runs per group, skipped folders with reasons)
    and where it was drawn ("layout": each panel's, title's and the legend's box in figure
    coordinates, x0, y0, x1, y1 from the bottom left)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    runs, skipped = [], []
    for f in folders:
        try:
            runs.append(load_run(f))
        except PlotError as exc:
            skipped.append(str(exc))
    if not runs:
        raise PlotError("nothing to plot: " + "; ".join(skipped))
    groups = group_runs(runs, label_fields)
    envs = sorted({str(r.config.get("env_id", "?")) for r in runs})
    labels = [legend_label(g) for g in groups]
    # The legend of the curves sits below the panels, across the figure: a long label adds a row
    # (the figure grows by it), never squeezes the panels sideways.
    widest = max(len(line) for lab in labels for line in lab.splitlines())
    ncols = max(1, min(len(groups), 4, 170 // (widest + 10)))
    legend_lines = sum(max(lab.count("\n") + 1 for lab in labels[i:i + ncols]) for i in range(0, len(labels), ncols))

    fig = plt.figure(figsize=(16, 13 + 0.22 * legend_lines), dpi=dpi, layout="constrained")
    gs = fig.add_gridspec(3, 6, height_ratios=[1.25, 1, 1])
    ax_steps = fig.add_subplot(gs[0, :3])
    ax_time = fig.add_subplot(gs[0, 3:])
    ax_share = fig.add_subplot(gs[1, :2])
    ax_p = fig.add_subplot(gs[1, 2:4])
    ax_imp = fig.add_subplot(gs[1, 4:])
    ax_sigma = fig.add_subplot(gs[2, :2])
    ax_r = fig.add_subplot(gs[2, 2:4])
    ax_dist = fig.add_subplot(gs[2, 4:])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    steps_fmt = FuncFormatter(_fmt_steps)
    longest = max((e.get("elapsed") or 0.0) for r in runs for e in r.evals)
    t_div, t_unit = (1.0, "seconds") if longest < 180 else (60.0, "minutes") if longest < 3 * 3600 else (3600.0, "hours")
    empty_axes = {ax_share, ax_p, ax_imp, ax_sigma, ax_r, ax_dist}

    for gi, g in enumerate(groups):
        c = colors[gi % len(colors)]
        n = len(g.runs)
        label = labels[gi]
        for ax, key, scale in ((ax_steps, x_axis, 1.0), (ax_time, "elapsed", 1 / t_div)):
            x, mean, std = group_curve(g, key)
            if not len(x):
                continue
            ax.plot(x * scale, mean, color=c, lw=2, label=label)
            if n > 1:
                ax.fill_between(x * scale, mean - std, mean + std, color=c, alpha=0.2, lw=0)
        _diagnostics(g, c, ax_sigma, ax_r, ax_dist, empty_axes)
        st = interaction_stats(g)
        if not st:
            continue
        target = g.runs[0].config.get("rl_ratio")
        if uses_critic(g.runs[0].config.get("algo", "")) and (np.nan_to_num(st["rl_share"]) > 0).any():
            empty_axes.discard(ax_share)
            ax_share.plot(st["x"], st["rl_share"], color=c, lw=2, marker="o", ms=3)
            if _finite(target):
                ax_share.axhline(target, color=c, ls=":", lw=1.5)
        for kind, ls in (("rl", "-"), ("es", "--")):
            if np.isfinite(st[f"p_{kind}"]).any():
                empty_axes.difference_update({ax_p, ax_imp})
                ax_p.plot(st["x"], st[f"p_{kind}"], color=c, ls=ls, lw=2, marker="o", ms=3)
                ax_imp.plot(st["x"], st[f"improved_{kind}"], color=c, ls=ls, lw=2, marker="o", ms=3)

    if x_axis not in X_AXES:
        raise PlotError(f"x: one of {', '.join(X_AXES)}, got {x_axis!r}")
    ax_steps.set(title=f"f(μ) against {X_AXES[x_axis][0]}", xlabel=X_AXES[x_axis][1], ylabel="f(μ) (return of the mean)")
    ax_time.set(title="f(μ) against wall-clock time", xlabel=f"{t_unit} since the run started", ylabel="f(μ)")
    ax_share.set(title="RL share of applied updates (dotted: target)", xlabel="stored steps",
                 ylabel="fraction of updates that were RL", ylim=(-0.03, 1.03))
    ax_p.set(title="mean update ratio p by kind", xlabel="stored steps", ylabel="p (weight of z in the new μ)",
             ylim=(-0.03, 1.03))
    ax_imp.set(title="how often each kind beat f(μ)", xlabel="stored steps", ylabel="fraction with f(z) > f(μ)",
               ylim=(-0.03, 1.03))
    ax_sigma.set(title="mean σ after ES and after RL updates", xlabel="stored steps", ylabel="mean σ of the distribution")
    ax_sigma.set_yscale("log")
    ax_r.set(title="fitness scale r in use, and mean |f(z) − f(μ)|", xlabel="stored steps",
             ylabel="r (solid), mean |Δ| (dashed)")
    ax_dist.set(title="RL individual's distance from its μ", xlabel="stored steps",
                ylabel="‖z − μ‖ after training")
    for ax in (ax_steps, ax_time, ax_share, ax_p, ax_imp, ax_sigma, ax_r, ax_dist):
        ax.grid(True, alpha=0.3)
    for ax in (ax_steps, ax_share, ax_p, ax_imp, ax_sigma, ax_r, ax_dist):
        ax.xaxis.set_major_formatter(steps_fmt)
    ax_sigma.legend(handles=[Line2D([], [], color="0.3", ls="-", lw=2, label="after RL updates"),
                             Line2D([], [], color="0.3", ls="--", lw=2, label="after ES updates")],
                    loc="best", fontsize=9)
    handles, texts = ax_steps.get_legend_handles_labels()
    legend = fig.legend(handles, texts, loc="outside lower center", ncols=ncols, fontsize=10, frameon=False)
    for ax in empty_axes:
        why = ("no RL individuals" if ax in (ax_share, ax_dist) else "no fitness scale recorded" if ax is ax_r
               else f"fewer than {MIN_PER_BIN} updates per bin")
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="0.4")
    # Runs of very different durations (ES alone vs with a critic) share the time axis on a log scale.
    durations = [max((e.get("elapsed") or 0.0) for e in r.evals) for r in runs]
    firsts = [min((e.get("elapsed") or 0.0) for e in r.evals) for r in runs]
    if min(durations) > 0 and max(durations) / min(durations) > 10 and min(firsts) > 0:
        ax_time.set_xscale("log")
        ax_time.set_xlabel(f"{t_unit} since the run started (log scale: run durations differ "
                           f"{max(durations) / min(durations):.0f}x)")
    kind_legend = [Line2D([], [], color="0.3", ls="-", lw=2, label="RL individuals"),
                   Line2D([], [], color="0.3", ls="--", lw=2, label="ES individuals")]
    ax_p.legend(handles=kind_legend, loc="best", fontsize=9)
    ax_imp.legend(handles=kind_legend, loc="best", fontsize=9)
    fig.suptitle(title or f"{', '.join(envs)}: {len(runs)} run{'s' if len(runs) != 1 else ''}, "
                 f"{len(groups)} configuration{'s' if len(groups) != 1 else ''}", fontsize=14, fontweight="bold")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    panels = {"f_mu_steps": ax_steps, "f_mu_time": ax_time, "rl_share": ax_share, "p": ax_p,
              "improved": ax_imp, "sigma": ax_sigma, "r": ax_r, "distance": ax_dist}
    layout = _layout(fig, legend, panels)
    drawn = {k: _extent(ax) for k, ax in panels.items()}
    plt.close(fig)
    return {"groups": {g.label: [r.run_id for r in g.runs] for g in groups}, "skipped": skipped, "out": str(out),
            "layout": layout, "drawn": drawn}


def _extent(ax) -> dict[str, Any]:
    """What a panel shows: the largest x and the smallest y of its data lines, and its y scale."""
    xs, ys = [], []
    for line in ax.get_lines():
        if line.get_transform() != ax.transData:
            continue  # a target line across the panel (axhline)
        x, y = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
        ok = np.isfinite(x) & np.isfinite(y)
        xs += list(x[ok])
        ys += list(y[ok])
    return {"x_max": max(xs) if xs else None, "y_min": min(ys) if ys else None, "yscale": ax.get_yscale()}


def _layout(fig, legend, axes: dict[str, Any]) -> dict[str, Any]:
    """Boxes (x0, y0, x1, y1, figure coordinates) of what savefig drew: panels, titles, legend."""
    renderer = fig.canvas.get_renderer()
    to_fig = fig.transFigure.inverted()

    def box(artist) -> tuple[float, ...]:
        return tuple(float(v) for v in to_fig.transform(artist.get_window_extent(renderer)).ravel())

    return {"axes": {k: tuple(float(v) for v in ax.get_position().extents) for k, ax in axes.items()},
            "titles": {k: box(ax.title) for k, ax in axes.items()},
            "legend": box(legend) if legend is not None else None}
