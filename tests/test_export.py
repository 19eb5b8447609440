"""`aesrl-queue export` then `aesrl-queue evaluate` on a real Pendulum-v1 run: the exported μ gives μ's
return, the exported best individual gives exactly the return it had in the run."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from aesrl_queue.nets import NetSpec
from aesrl_queue.rollout import run_episodes
from aesrl_queue.store import Store
from tests.conftest import ROOT, child_env

pytestmark = pytest.mark.slow

RUN = "export-pendulum"


def aq(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)


@pytest.fixture()
def finished_run(redis_url, client, tmp_path):
    out = aq("run", "--redis-url", redis_url, "--env", "Pendulum-v1", "--algo", "es", "--steps", "4000",
             "--workers", "2", "--hidden", "16,16", "--seed", "5", "--run-id", RUN, "--out", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "runs" / RUN


def test_export_then_evaluate_reproduces_the_returns(finished_run, redis_url, client, tmp_path):
    store = Store(client, RUN)
    cfg = store.config()
    version = store.current_version()
    mu, _ = store.read_dist(version)

    # Export μ from the run folder and from Redis: the same parameters, plus what rebuilds them.
    pt_folder, pt_redis = tmp_path / "mu.pt", tmp_path / "mu-redis.pt"
    out = aq("export", str(finished_run), "-o", str(pt_folder))
    assert out.returncode == 0, out.stderr
    assert f"version {version}" in out.stdout
    out = aq("export", RUN, "--redis-url", redis_url, "-o", str(pt_redis))
    assert out.returncode == 0, out.stderr
    a = torch.load(pt_folder, weights_only=True)
    b = torch.load(pt_redis, weights_only=True)
    np.testing.assert_array_equal(a["params"].numpy(), mu)
    np.testing.assert_array_equal(b["params"].numpy(), mu)
    assert a["env_id"] == "Pendulum-v1" and a["net"]["hidden"] == [16, 16] and a["config"]["run_id"] == RUN
    # The state_dict loads into the project's torch Actor and acts like the flat vector.
    actor = NetSpec.from_config(a["net"]).make_actor()
    actor.load_state_dict(a["state_dict"])
    np_actor = NetSpec.from_config(a["net"]).make_numpy_actor()
    np_actor.set_params(mu)
    obs = np.array([0.3, -0.9, 1.2], dtype=np.float32)
    np.testing.assert_allclose(actor(torch.from_numpy(obs)[None]).detach().numpy()[0], np_actor.act(obs), atol=1e-5)

    # evaluate: 10 episodes, seeds 0..9.
    out = aq("evaluate", str(pt_folder), "--episodes", "10", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["episodes"] == 10 and len(res["returns"]) == 10
    # Exactly the returns the library's rollout gives μ with the same seeds...
    direct = [run_episodes("Pendulum-v1", np_actor, k=1, seed=s, store=False).returns[0] for s in range(10)]
    np.testing.assert_allclose(res["returns"], direct, rtol=1e-6)
    # ...and, within noise, μ's return measured on other start states (as the run's workers measure it).
    ref = [run_episodes("Pendulum-v1", np_actor, k=1, seed=1000 + s, store=False).returns[0] for s in range(10)]
    noise = 4 * math.sqrt(np.var(res["returns"]) / 10 + np.var(ref) / 10) + 1.0
    assert abs(res["mean"] - np.mean(ref)) < noise, (res["mean"], np.mean(ref), noise)
    # The run's own last f(μ) estimate (k=3 episodes of a μ a few updates older) is in the same range.
    assert -1900 < store.state()["f_mu"] < 0 and -1900 < res["mean"] < 0

    # The printed form.
    out = aq("evaluate", str(pt_folder), "-n", "3")
    assert out.returncode == 0 and re.match(r"Pendulum-v1 \(mu\): return -?\d+\.\d ± \d+\.\d over 3 episodes",
                                            out.stdout), out.stdout

    # The best individual: its one evaluation episode in the run started from reset(seed = job seed),
    # so evaluating it once with that seed gives exactly the f(z) the run recorded.
    pt_best = tmp_path / "best.pt"
    out = aq("export", str(finished_run), "--which", "best", "-o", str(pt_best))
    assert out.returncode == 0, out.stderr
    best = torch.load(pt_best, weights_only=True)
    assert best["which"] == "best" and best["source"]["fitness"] == pytest.approx(store.state()["best_fitness"])
    seeds = {f[b"job"].decode(): int(f[b"seed"]) for _i, f in client.xrange(store.key("results"))}
    job_seed = seeds[best["source"]["job"]] % (2**31)
    out = aq("evaluate", str(pt_best), "--episodes", "1", "--seed", str(job_seed), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["returns"][0] == pytest.approx(best["source"]["fitness"], rel=1e-6)
    assert cfg.env_id == best["env_id"]


def test_evaluate_films_an_episode_or_says_what_to_install(finished_run, tmp_path):
    pt = tmp_path / "mu.pt"
    assert aq("export", str(finished_run), "-o", str(pt)).returncode == 0
    out = aq("evaluate", str(pt), "--episodes", "2", "--video", str(tmp_path / "video"), "--json")
    res = json.loads(out.stdout)
    try:
        import imageio  # noqa: F401
        import pygame  # noqa: F401
    except ImportError:
        assert out.returncode == 1 and "pip install 'aesrl-queue[video]'" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    video = res["video"]
    assert video["frames"] == 201 and video["return"] == pytest.approx(res["returns"][0], rel=1e-6)
    import imageio.v3 as iio

    frames = iio.imread(video["path"], index=None)
    assert len(frames) >= 190 and frames[0].shape[-1] == 3
    assert frames[100].std() > 5  # a picture, not a blank frame


def test_export_and_evaluate_refuse_what_they_cannot_read(tmp_path, redis_url):
    out = aq("export", str(tmp_path), "-o", str(tmp_path / "x.pt"))
    assert out.returncode == 2 and "no policy.npz" in out.stderr
    out = aq("export", "no-such-run", "--redis-url", redis_url, "-o", str(tmp_path / "x.pt"))
    assert out.returncode == 2 and "neither a run folder nor a run on this Redis" in out.stderr
    bogus = tmp_path / "bogus.pt"
    torch.save({"format": "something-else"}, bogus)
    out = aq("evaluate", str(bogus))
    assert out.returncode == 2 and "not a policy file written by `aesrl-queue export`" in out.stderr
