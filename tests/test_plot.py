"""`aesrl-queue plot`: grouping of runs by configuration, the binned statistics, and the PNG itself.

Run folders are written here in the format MetricsWriter writes (config.json + metrics.jsonl), so the
numbers behind each curve are known exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cli.plot import (
    LabelError,
    group_curve,
    group_runs,
    interaction_stats,
    kind_means,
    load_run,
    plot_runs,
    seeds_label,
)
from tests.conftest import ROOT, child_env


def write_run(folder, algo="aesrl", seed=0, n=120, slope=1.0, offset=-1000.0, rl_every=2, mean_rule="baseline-relative",
              p_rl=0.8, p_es=0.3, dt=0.5):
    """n updates, 100 stored steps each; f(μ) = offset + slope * steps/100; every rl_every-th update is RL."""
    folder.mkdir(parents=True)
    cfg = {"run_id": folder.name, "env_id": "Pendulum-v1", "algo": algo, "seed": seed, "rl_ratio": 0.5,
           "mean_rule": mean_rule, "total_steps": n * 100, "created_at": 1000.0 + seed}
    (folder / "config.json").write_text(json.dumps(cfg))
    with open(folder / "metrics.jsonl", "w") as fh:
        for i in range(1, n + 1):
            kind = "rl" if rl_every and i % rl_every == 0 else "es"
            f_mu = offset + slope * i
            f_z = f_mu + (10.0 if kind == "rl" else -10.0)  # RL always beats f(μ), ES never
            rec = {"type": "update", "t": 5000.0 + i * dt, "elapsed": i * dt, "steps": i * 100, "interactions": i * 400,
                   "version": i, "kind": kind, "p": p_rl if kind == "rl" else p_es, "f_z": f_z, "f_mu": f_mu,
                   "improved": f_z > f_mu, "sigma_mean": 0.03 if kind == "rl" else 0.01, "sigma_min": 0.01,
                   "sigma_max": 0.05, "r": 5.0 + i / 10, "delta": f_z - f_mu, "told": True,
                   "dist_after": 2.0 if kind == "rl" else None}
            fh.write(json.dumps(rec) + "\n")
            fh.write(json.dumps({"type": "mu_eval", "t": 5000.0 + i * dt, "elapsed": i * dt, "steps": i * 100,
                                 "interactions": i * 400, "mu_version": i - 1, "f_mu": f_mu}) + "\n")
        fh.write('{"type": "update", "steps": 1')  # a line torn by a crash is skipped
    return folder


def test_runs_that_differ_only_by_seed_form_one_group(tmp_path):
    runs = [load_run(write_run(tmp_path / f"a{s}", seed=s)) for s in (1, 2, 3)]
    runs += [load_run(write_run(tmp_path / f"e{s}", algo="es", seed=s, rl_every=0)) for s in (1, 2)]
    runs += [load_run(write_run(tmp_path / "lin", mean_rule="fixed-linear"))]
    groups = {g.label: sorted(r.run_id for r in g.runs) for g in group_runs(runs)}
    # A curve is named by its algorithm; a setting is named only where it tells apart two curves of
    # one algorithm.
    assert groups == {
        "aesrl, mean_rule=baseline-relative": ["a1", "a2", "a3"],
        "es": ["e1", "e2"],
        "aesrl, mean_rule=fixed-linear": ["lin"],
    }
    # --label names fields in every label; --label seed splits the groups by seed.
    labelled = {g.label: sorted(r.run_id for r in g.runs) for g in group_runs(runs, ["rl_ratio"])}
    assert labelled["es, rl_ratio=0.5"] == ["e1", "e2"]
    assert len(group_runs(runs, ["seed"])) == 6
    with pytest.raises(LabelError, match="no run's config has nosuch"):
        group_runs(runs, ["nosuch"])


def preset_run(folder, algo, seed, env_id="Pendulum-v1", **kw):
    """A run folder whose config.json is the resolved preset of algo, as `aesrl-queue run` writes it."""
    from aesrl_queue.codec import json_default as _json_safe
    from aesrl_queue.config import RunConfig

    write_run(folder, algo=algo, seed=seed, rl_every=0 if algo == "es" else 2, **kw)
    cfg = RunConfig.from_preset(env_id, algo=algo, seed=seed, run_id=folder.name).resolve()
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), default=_json_safe))
    return folder


def test_runs_of_different_algorithms_are_named_by_algorithm_alone(tmp_path):
    # aesrl's and es's own defaults differ in about ten fields; none of them is named.
    runs = [load_run(preset_run(tmp_path / f"pend-{a}-s{s}", a, s)) for a in ("es", "aesrl") for s in (1, 2)]
    assert {g.label: len(g.runs) for g in group_runs(runs)} == {"es": 2, "aesrl": 2}
    # Runs on two environments: each environment has its own preset, so the label names it.
    runs.append(load_run(preset_run(tmp_path / "mc", "aesrl", 1, env_id="MountainCarContinuous-v0")))
    assert sorted(g.label for g in group_runs(runs)) == ["aesrl, MountainCarContinuous-v0", "aesrl, Pendulum-v1",
                                                         "es, Pendulum-v1"]


def test_group_curve_is_the_mean_and_std_across_seeds(tmp_path):
    # Two seeds whose f(μ) differ by a constant 100: mean is their midpoint, std is 50 everywhere.
    a = load_run(write_run(tmp_path / "s1", seed=1, offset=-1000.0))
    b = load_run(write_run(tmp_path / "s2", seed=2, offset=-900.0))
    (group,) = group_runs([a, b])
    x, mean, std = group_curve(group, "steps", bins=12)
    assert len(x) == 12 and np.all(np.isfinite(mean))
    # f(μ) is linear in steps, so each bin's mean lies on the midpoint line at the bin's centre
    # (within half the spacing of the updates, 100 steps = 1 unit of f).
    np.testing.assert_allclose(mean, -950.0 + x / 100.0, atol=1.0)
    np.testing.assert_allclose(std, 50.0, atol=1e-9)
    # Against wall clock the same runs give the same values (one update every 0.5 s).
    x_t, mean_t, _ = group_curve(group, "elapsed", bins=12)
    np.testing.assert_allclose(mean_t, -950.0 + x_t / 0.5, atol=1.0)


def test_interaction_stats_count_kinds_p_and_improvements(tmp_path):
    (group,) = group_runs([load_run(write_run(tmp_path / "r", rl_every=4, p_rl=0.9, p_es=0.2))])
    st = interaction_stats(group, bins=6)
    np.testing.assert_allclose(st["rl_share"], 0.25, atol=0.06)  # one in four per bin of 20 updates
    np.testing.assert_allclose(st["p_rl"], 0.9)
    np.testing.assert_allclose(st["p_es"], 0.2)
    np.testing.assert_allclose(st["improved_rl"], 1.0)
    np.testing.assert_allclose(st["improved_es"], 0.0)
    assert st["n_rl"].sum() + st["n_es"].sum() == 120


def test_plot_command_writes_a_readable_png(tmp_path):
    folders = [write_run(tmp_path / f"aesrl-s{s}", seed=s, slope=3.0 + s) for s in (1, 2)]
    folders += [write_run(tmp_path / f"es-s{s}", algo="es", seed=s, rl_every=0, slope=1.0 + s) for s in (1, 2)]
    out = tmp_path / "curves.png"
    res = subprocess.run([sys.executable, "-m", "cli.main", "plot", *map(str, folders), "-o", str(out)],
                         capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "aesrl: 2 runs" in res.stdout and "es: 2 runs" in res.stdout, res.stdout
    img = Image.open(out).convert("RGB")
    w, h = img.size
    assert w >= 1200 and h >= 800, img.size
    px = np.asarray(img).astype(int)
    # Not blank: many non-white pixels, and curves in colour (not only black axes and text).
    assert (px.min(axis=2) < 250).mean() > 0.03
    chroma = px.max(axis=2) - px.min(axis=2)
    assert (chroma > 60).mean() > 0.005
    # Every one of the eight panels has ink: split the figure into its grid and check each cell.
    for (y0, y1), cols in (((0.08, 0.38), 2), ((0.42, 0.68), 3), ((0.72, 0.97), 3)):
        for c in range(cols):
            cell = px[int(y0 * h):int(y1 * h), int(c * w / cols):int((c + 1) * w / cols)]
            assert ((cell.max(axis=2) - cell.min(axis=2)) > 60).mean() > 0.002, (y0, c)


def test_diagnostics_are_binned_by_kind(tmp_path):
    (group,) = group_runs([load_run(write_run(tmp_path / "r", rl_every=4))])
    sig = kind_means(group, "sigma_mean", bins=6)
    np.testing.assert_allclose(sig["rl"], 0.03)
    np.testing.assert_allclose(sig["es"], 0.01)
    d = kind_means(group, "dist_after", bins=6)
    np.testing.assert_allclose(d["rl"], 2.0)
    assert np.all(np.isnan(d["es"]))  # ES updates carry no distance


def test_plot_refuses_folders_without_metrics(tmp_path):
    (tmp_path / "empty").mkdir()
    res = subprocess.run([sys.executable, "-m", "cli.main", "plot", str(tmp_path / "empty"), "-o",
                          str(tmp_path / "x.png")], capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 1
    assert "cannot read config.json" in res.stderr
    assert not (tmp_path / "x.png").exists()


def test_metrics_without_type_field_are_updates(tmp_path):
    # Run folders written before records had a "type" (one history entry per line) still plot.
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"run_id": "old", "algo": "aesrl", "env_id": "Pendulum-v1"}))
    (d / "metrics.jsonl").write_text("\n".join(json.dumps({"kind": "es", "steps": i * 10, "t": float(i), "p": 0.5,
                                                           "f_z": -i, "f_mu": -2.0 * i}) for i in range(1, 30)))
    run = load_run(d)
    assert len(run.updates) == 29 and len(run.evals) == 29 and run.evals[0]["elapsed"] == 0.0


def test_two_runs_of_one_seed_are_not_two_seeds_and_x_can_be_interactions(tmp_path):
    same = [load_run(write_run(tmp_path / f"rep{i}", seed=7)) for i in (1, 2)]
    assert seeds_label(same) == "(mean ± std over 2 runs, 1 seed)"
    two = same + [load_run(write_run(tmp_path / "other", seed=8))]
    assert seeds_label(two) == "(mean ± std over 3 runs, 2 seeds)"
    assert seeds_label(same[:1]) == "(rep1)"
    (group,) = group_runs(same)
    x_steps, _, _ = group_curve(group, "steps")
    x_inter, mean, _ = group_curve(group, "interactions")
    assert x_inter.max() == 4 * x_steps.max() and np.isfinite(mean).all()
    out = subprocess.run([sys.executable, "-m", "cli.main", "plot", *(str(r.folder) for r in same), "--x",
                          "interactions", "-o", str(tmp_path / "c.png")], capture_output=True, text=True,
                         env=child_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Image.open(tmp_path / "c.png").size[0] > 1000


def overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_long_labels_go_below_the_panels_and_leave_them_full_width(tmp_path):
    # Every setting named in every label (the labels of the guide's comparison before curves were
    # named by algorithm): four labels of about 200 characters.
    folders = [preset_run(tmp_path / f"pend-{a}-s{s}", a, s, slope=2.0 + s) for a in ("es", "aesrl") for s in (1, 2)]
    fields = ["critic_shift", "es_antithetic", "fitness_shift", "mean_rule", "pair_shift", "positive_ratio",
              "rl_steps_max", "var_floor", "var_init", "seed"]
    out = tmp_path / "curves.png"
    drawn = plot_runs(folders, out, label_fields=fields)
    assert len(drawn["groups"]) == 4 and all(len(label) > 150 for label in drawn["groups"])
    lay = drawn["layout"]
    axes = lay["axes"]
    # Panels keep their share of the width: two columns on top, three below.
    for name in ("f_mu_steps", "f_mu_time"):
        assert axes[name][2] - axes[name][0] >= 0.35, (name, axes[name])
    for name in ("rl_share", "p", "improved", "sigma", "r", "distance"):
        assert axes[name][2] - axes[name][0] >= 0.22, (name, axes[name])
    # The legend is inside the figure, below every panel, and covers none of them.
    legend = lay["legend"]
    assert 0.0 <= legend[0] and legend[2] <= 1.0 and 0.0 <= legend[1], legend
    assert all(legend[3] <= ax[1] for ax in axes.values()), (legend, axes)
    # Titles stay inside the figure and do not run into one another.
    titles = list(lay["titles"].items())
    for i, (name, box) in enumerate(titles):
        assert 0.0 <= box[0] and box[2] <= 1.0, (name, box)
        for other, box2 in titles[i + 1:]:
            assert not overlaps(box, box2), (name, other)
    # The saved image is the figure measured: its size, and ink in the leftmost panel.
    img = np.asarray(Image.open(out).convert("RGB")).astype(int)
    h, w = img.shape[:2]
    assert w == 16 * 110
    x0, y0, x1, y1 = axes["f_mu_steps"]
    cell = img[int((1 - y1) * h):int((1 - y0) * h), int(x0 * w):int(x1 * w)]
    assert ((cell.max(axis=2) - cell.min(axis=2)) > 60).mean() > 0.002


def test_plot_label_option_names_fields_and_refuses_unknown_ones(tmp_path):
    folders = [preset_run(tmp_path / f"pend-{a}-s1", a, 1) for a in ("es", "aesrl")]
    run = [sys.executable, "-m", "cli.main", "plot", *map(str, folders), "-o", str(tmp_path / "c.png")]
    res = subprocess.run([*run, "--label", "mean_rule"], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "es, mean_rule=fixed-linear: 1 run" in res.stdout, res.stdout
    res = subprocess.run([*run, "--label", "mean_rule,nosuch"], capture_output=True, text=True, env=child_env(),
                         cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "no run's config has nosuch" in res.stderr, res.stderr
    # With no -o, the PNG goes beside the run folders it compares.
    res = subprocess.run(run[:-2], capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 0 and (tmp_path / "curves.png").is_file(), res.stderr


@pytest.mark.slow
def test_runs_of_real_processes_with_other_budgets_are_other_curves_and_every_panel_ends_together(tmp_path):
    """Runs of `aesrl-queue run`: budgets of 3,000 and 6,000 steps are two curves, not one "configuration"
    whose f(μ) panel stops at 3,000 while the panels below go on; a run cut short ends every panel of its
    curve where it ends; the fitness scale's floor (r = 1e-6 before the scale is set) is not drawn."""
    from aesrl_queue.fitness import MIN_SCALE

    def run(run_id, *args):
        res = subprocess.run([sys.executable, "-m", "cli.main", "run", "--env", "Pendulum-v1", "--hidden", "8,8",
                              "--run-id", run_id, "--out", str(tmp_path), *args], capture_output=True, text=True,
                             env=child_env(), cwd=ROOT, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        return tmp_path / run_id

    short = run("es-3k", "--algo", "es", "--steps", "3000", "--workers", "1")
    long = run("es-6k", "--algo", "es", "--steps", "6000", "--workers", "1")
    # single ES individuals with a μ episode each (aesrl's first defaults): the first told gap is μ₀ against
    # its own sample's, flat on Pendulum's start, and sets the scale's floor
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"es_antithetic": False, "rl_steps_max": 2000, "learner": "td3", "rl_ratio": 0.5,
                                 "critic_lag": 5000}))
    aesrl = run("aesrl", "--config", str(first), "--steps", "3200", "--initial-steps", "800", "--critic-hidden", "16,16",
                "--workers", "2")
    out = plot_runs([short, long], tmp_path / "budgets.png")
    assert sorted(out["groups"].values()) == [["es-3k"], ["es-6k"]], out["groups"]
    assert all("total_steps=" in label for label in out["groups"]), out["groups"]
    drawn = out["drawn"]
    assert drawn["sigma"]["x_max"] <= 6000 and drawn["f_mu_steps"]["x_max"] > 3000, drawn

    # the same run cut short (its metrics up to 3,000 steps): one curve, every panel ends at 3,000
    cut = tmp_path / "es-6k-cut"
    cut.mkdir()
    cfg = json.loads((long / "config.json").read_text())
    (cut / "config.json").write_text(json.dumps(dict(cfg, seed=cfg["seed"] + 1, run_id="es-6k-cut")))
    lines = [ln for ln in (long / "metrics.jsonl").read_text().splitlines() if json.loads(ln).get("steps", 0) <= 3000]
    (cut / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    drawn = plot_runs([long, cut], tmp_path / "cut.png")["drawn"]
    assert drawn["f_mu_steps"]["x_max"] <= 3000 and drawn["sigma"]["x_max"] <= 3000, drawn

    rs = [json.loads(ln).get("r") for ln in (aesrl / "metrics.jsonl").read_text().splitlines()]
    assert MIN_SCALE in rs  # the floor is in the metrics (the first told result) ...
    drawn = plot_runs([aesrl], tmp_path / "r.png")["drawn"]
    assert drawn["r"]["y_min"] is not None and drawn["r"]["y_min"] > MIN_SCALE, drawn  # ... and not drawn
