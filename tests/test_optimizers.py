"""The ask/tell optimizers of every queue algorithm, without Redis: job specs, the numbers of each
update worked out by hand, restart from plain data (including the mid-generation restart that once
crashed the synchronous loop), and a property test: state() -> load_state() gives the same future.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aesrl_queue import codec, noise
from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers import (
    AesrlOptimizer,
    CemOptimizer,
    Fitness,
    Individual,
    OptimizerFailed,
    Reference,
    job_seed,
    load_optimizer,
    make_optimizer,
)
from aesrl_queue.optimizers.cem import MAX_TRIES
from scheduler.critic_gate import (
    CRITIC_STALLED,
    GENERATION_GAVE_UP,
    GENERATION_WAITING,
    NO_CRITIC_AFTER,
    NO_CRITIC_WAITING,
    make_gate,
)
from scheduler.problems import critic_line

_CFGS: dict[tuple, RunConfig] = {}


def config(algo: str, **kw) -> RunConfig:
    key = (algo, *sorted(kw.items()))
    if key not in _CFGS:  # resolve() makes the environment once per distinct config
        _CFGS[key] = RunConfig.from_preset("AesrlNull-v0", algo=algo, hidden=(4,), run_id="opt", seed=3,
                                           **kw).resolve()
    return _CFGS[key]


def mu0(cfg: RunConfig) -> np.ndarray:
    return np.linspace(-0.5, 0.5, cfg.actor_dim, dtype=np.float32)


@dataclasses.dataclass
class Evaluated:
    """One evaluated individual as these tests write it, flat; `tell` hands it to an optimizer as
    (individual, fitness, reference)."""

    job: str
    kind: str
    version: int
    z: np.ndarray
    fitness: float
    length: int
    f_mu: float = math.nan
    f_mu_version: int = -1
    f_mu_length: float = 0.0
    steps: int = -1
    random: bool = False
    mirror_z: np.ndarray | None = None
    mirror_fitness: float = math.nan
    mirror_length: int = 0
    drawn_from: np.ndarray | None = None


_GATES: dict[int, tuple] = {}


def gate(opt):
    """The critic gate the loop would ask `opt` through (one per optimizer, as the loop keeps one)."""
    if _GATES.get(id(opt), (None,))[0] is not opt:
        _GATES[id(opt)] = (opt, make_gate(opt.cfg, opt))
    return _GATES[id(opt)][1]


def ask(opt, n: int, steps: int, inflight: int, critic_version: int, now: float, critic_steps: int = 0):
    """Ask `opt` for `n` jobs as the scheduler loop does: through its critic gate."""
    return gate(opt).ask(n, steps, inflight, critic_version, critic_steps, now)


def tell(opt, ev: Evaluated):
    return opt.tell(Individual(job=ev.job, kind=ev.kind, version=ev.version, z=ev.z, random=ev.random,
                               mirror_z=ev.mirror_z, drawn_from=ev.drawn_from, steps=ev.steps),
                    Fitness(ev.fitness, ev.length, ev.mirror_fitness, ev.mirror_length),
                    Reference(ev.f_mu, ev.f_mu_version, ev.f_mu_length))


def evaluated(opt, spec: dict, fitness: float, f_mu: float = math.nan, length: int = 50, steps: int = 0,
              z: np.ndarray | None = None) -> Evaluated:
    if z is None:
        z = noise.sample(opt.mean, opt.var, spec["seed"])
    return Evaluated(job=f"opt-j{spec['n']}", kind=spec["kind"], version=spec["version"], z=z,
                     fitness=fitness, length=length, f_mu=f_mu, f_mu_version=spec["version"], steps=steps,
                     random=spec.get("random", False))


def tell_rl(opt, spec: dict, gap: float, f_mu: float):
    """Tell `opt` an RL individual 0.3 from its μ in every coordinate, `gap` above f_mu."""
    ev = evaluated(opt, spec, fitness=f_mu + gap, f_mu=f_mu, z=(opt.mean + 0.3).astype(np.float32))
    ev.kind = "rl"
    return tell(opt, ev)


def roundtrip(opt):
    """What a restart sees: the state through msgpack, μ/var as dist:{version} holds them."""
    state = codec.unpack(codec.pack(opt.state()), what="state")
    return load_optimizer(opt.cfg, {**state, "mean": opt.mean.copy(), "var": opt.var.copy()})


# -- AES-RL and its asynchronous relatives ---------------------------------------------------------------
def test_aesrl_asks_numbered_es_jobs_in_the_random_phase_and_rl_once_a_critic_exists() -> None:
    cfg = config("aesrl", initial_steps=150, batch_size=32, rl_ratio=0.5, critic_lag=0)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 5, steps=0, inflight=0, critic_version=0, now=0.0)
    # random jobs fill initial_steps at full-length episodes (50 steps here), counting those in flight
    assert [s["n"] for s in specs] == [1, 2, 3]
    assert [s["seed"] for s in specs] == [job_seed(cfg.seed, n) for n in (1, 2, 3)]
    assert all(s["kind"] == "es" and s["random"] and s["version"] == 0 for s in specs)
    assert ask(opt, 5, steps=0, inflight=3, critic_version=0, now=0.0) == []
    assert [s["n"] for s in ask(opt, 5, steps=120, inflight=0, critic_version=0, now=0.0)] == [4]
    # Past the random phase, no critic yet: jobs are held for critic_wait seconds, then ES goes on.
    assert ask(opt, 2, steps=200, inflight=0, critic_version=0, now=10.0) == []
    assert gate(opt).waiting
    late = ask(opt, 1, steps=200, inflight=0, critic_version=0, now=10.0 + cfg.critic_wait)
    assert [s["kind"] for s in late] == ["es"] and not late[0]["random"]
    kinds = [s["kind"] for s in ask(opt, 40, steps=200, inflight=0, critic_version=1, now=11.0 + cfg.critic_wait)]
    assert not gate(opt).waiting
    assert 10 < kinds.count("rl") < 30  # the P controller holds the share near rl_ratio = 0.5
    assert opt.controller.n_rl == 1 + kinds.count("rl") and opt.controller.n_es == 1 + kinds.count("es")


def test_aesrl_holds_jobs_while_the_critic_trails_the_replay_and_not_for_a_stopped_critic() -> None:
    # RL jobs that train (rl_steps_max > 0): the critic's schedule is a step per stored step from the first
    cfg = config("aesrl", initial_steps=100, batch_size=32, critic_lag=500, total_steps=100_000, rl_steps_max=2000)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    # In the random phase the critic's progress never holds a job.
    assert len(ask(opt, 2, steps=0, inflight=0, critic_version=1, critic_steps=0, now=0.0)) == 2
    # 1 000 stored steps, the critic at 400: 600 behind, more than critic_lag = 500.
    assert ask(opt, 2, steps=1000, inflight=0, critic_version=1, critic_steps=400, now=1.0) == []
    assert gate(opt).waiting
    # Still behind but moving: held, even past critic_wait counted from the first hold.
    assert ask(opt, 2, steps=1000, inflight=0, critic_version=2, critic_steps=450, now=1.0 + cfg.critic_wait) == []
    # Within critic_lag again: dispatched, and no longer waiting; one job, or as many as the room left
    # holds (critic at 500 of 1 000 stored: no room, one job; at 700: 200 steps, two jobs that each store
    # a 50-step episode of the individual and one of μ).
    assert len(ask(opt, 2, steps=1000, inflight=0, critic_version=3, critic_steps=500, now=2.0 + cfg.critic_wait)) == 1
    assert not gate(opt).waiting
    assert len(ask(opt, 9, steps=1000, inflight=0, critic_version=3, critic_steps=700, now=2.0 + cfg.critic_wait)) == 2
    # the critic caught up: room for critic_lag = 500 steps, five such jobs
    assert len(ask(opt, 9, steps=1000, inflight=0, critic_version=3, critic_steps=1000, now=2.0 + cfg.critic_wait)) == 5
    # the jobs in flight count against that room: three out leave two; five out fill it, and the gate holds
    assert len(ask(opt, 9, steps=1000, inflight=3, critic_version=3, critic_steps=1000, now=2.0 + cfg.critic_wait)) == 2
    assert ask(opt, 9, steps=1000, inflight=5, critic_version=3, critic_steps=1000, now=2.0 + cfg.critic_wait) == []
    assert gate(opt).waiting
    # A critic that stops training holds the run for critic_wait seconds only.
    t = 10.0 + cfg.critic_wait
    assert ask(opt, 1, steps=3000, inflight=0, critic_version=3, critic_steps=500, now=t) == []
    assert ask(opt, 1, steps=3000, inflight=0, critic_version=3, critic_steps=500, now=t + cfg.critic_wait - 1) == []
    assert len(ask(opt, 1, steps=3000, inflight=0, critic_version=3, critic_steps=500, now=t + cfg.critic_wait)) == 1
    assert not gate(opt).waiting  # dispatching again: the loop goes back to its slow poll
    # critic_lag = 0 (the published code) never holds.
    free = AesrlOptimizer(config("aesrl", initial_steps=100, batch_size=32, critic_lag=0), mu0(cfg))
    assert len(ask(free, 2, steps=5000, inflight=0, critic_version=1, critic_steps=0, now=0.0)) == 2
    # The daemon's own actor (rl_steps_max 0) trains from the end of the random phase, as the learner alone:
    # at 1 000 stored its schedule is 900 steps, so a critic at 400 is 500 behind (held back to one job)
    # and one at 399 is held.
    own = AesrlOptimizer(config("aesrl", initial_steps=100, batch_size=32, critic_lag=500, total_steps=100_000,
                                rl_steps_max=0), mu0(cfg))
    assert len(ask(own, 9, steps=1000, inflight=0, critic_version=1, critic_steps=400, now=0.0)) == 1
    assert ask(own, 9, steps=1000, inflight=0, critic_version=1, critic_steps=399, now=1.0) == []


def test_aesrl_names_a_missing_critic_within_critic_wait_and_clears_it_when_one_publishes() -> None:
    cfg = config("aesrl", initial_steps=100, batch_size=32, critic_lag=500, total_steps=100_000)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    wait = cfg.critic_wait
    ask(opt, 2, steps=50, inflight=0, critic_version=0, now=0.0)
    assert gate(opt).problem is None  # the random phase: nothing to wait for yet
    assert ask(opt, 2, steps=200, inflight=0, critic_version=0, now=10.0) == []
    assert gate(opt).problem is None  # a daemon that runs needs seconds to publish
    assert ask(opt, 2, steps=200, inflight=0, critic_version=0, now=10.0 + NO_CRITIC_AFTER * wait) == []
    assert gate(opt).problem == (NO_CRITIC_WAITING, wait)
    what, short = critic_line(gate(opt).problem)  # what the loop shows
    assert what.startswith("no critic has published") and f"({wait:.0f} s)" in what and short == "no critic"
    assert ask(opt, 2, steps=200, inflight=0, critic_version=0, now=10.0 + wait)  # ES alone from here
    assert "goes on with ES alone" in critic_line(gate(opt).problem)[0]
    ask(opt, 2, steps=400, inflight=0, critic_version=1, critic_steps=300, now=20.0 + wait)
    assert gate(opt).problem is None
    # A critic that stops training: named once the lag rule stops holding jobs for it.
    t = 100.0 + wait
    assert ask(opt, 1, steps=3000, inflight=0, critic_version=3, critic_steps=500, now=t) == []
    assert gate(opt).problem is None
    assert ask(opt, 1, steps=3000, inflight=0, critic_version=3, critic_steps=500, now=t + wait)
    assert gate(opt).problem == (CRITIC_STALLED, wait)
    ask(opt, 1, steps=3000, inflight=0, critic_version=4, critic_steps=2600, now=t + wait + 1)
    assert gate(opt).problem is None
    # es needs no critic: never a problem.
    es = AesrlOptimizer(config("es"), mu0(cfg))
    ask(es, 2, steps=10_000, inflight=0, critic_version=0, now=1e6)
    assert gate(es).problem is None


def test_cem_names_a_critic_that_does_not_train_for_its_rl_members() -> None:
    cfg = config("pcemrl", initial_steps=0, population=4, batch_size=8)
    opt = CemOptimizer(cfg, mu0(cfg))
    wait = cfg.critic_wait
    for s in ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0):
        tell(opt, evaluated(opt, s, fitness=1.0, length=25))
    assert ask(opt, 1, steps=100, inflight=0, critic_version=0, critic_steps=0, now=1.0) == []
    # A critic that trains towards the request is there, however long it takes.
    assert ask(opt, 1, steps=100, inflight=0, critic_version=0, critic_steps=50, now=1.0 + wait / 2) == []
    assert gate(opt).problem is None
    assert ask(opt, 1, steps=100, inflight=0, critic_version=0, critic_steps=50, now=1.0 + wait * 0.8) == []
    assert gate(opt).problem == (GENERATION_WAITING, wait)
    assert "held for critic_wait" in critic_line(gate(opt).problem)[0]
    specs = ask(opt, 1, steps=100, inflight=0, critic_version=0, critic_steps=50, now=2.0 + wait)
    assert [s["kind"] for s in specs] == ["es"] * 4  # the generation goes on without a critic
    assert gate(opt).problem == (GENERATION_GAVE_UP, wait)
    assert "without training" in critic_line(gate(opt).problem)[0]


def test_es_never_asks_rl_and_no_job_that_would_overshoot_the_budget() -> None:
    cfg = config("es", total_steps=1000)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    assert {s["kind"] for s in ask(opt, 20, steps=0, inflight=0, critic_version=5, now=0.0)} == {"es"}
    opt.recent_lens.extend([50] * 5)  # an antithetic es job stores two episodes: 100 steps
    assert ask(opt, 5, steps=800, inflight=2, critic_version=5, now=0.0) == []  # 800 + 2·100 >= 1000
    assert len(ask(opt, 5, steps=700, inflight=2, critic_version=5, now=0.0)) == 1  # 700 + 2·100 + 100
    assert len(ask(opt, 5, steps=0, inflight=2, critic_version=5, now=0.0)) == 5
    # one job at a time counts: the k-th new job starts only if those before it leave room
    one = AesrlOptimizer(config("es", total_steps=1000, es_antithetic=False), mu0(cfg))
    one.recent_lens.extend([50] * 5)
    assert len(ask(one, 5, steps=800, inflight=2, critic_version=5, now=0.0)) == 2  # 800 + 2·50, + 50, + 50
    # before any episode is known, full-length episodes are assumed
    fresh = AesrlOptimizer(config("es", total_steps=3 * 2 * cfg.max_episode_steps), mu0(cfg))
    assert len(ask(fresh, 10, steps=0, inflight=0, critic_version=0, now=0.0)) == 3


def test_aesrl_tell_moves_mu_by_the_baseline_relative_ratio_with_the_adaptive_scale() -> None:
    cfg = config("aesrl", initial_steps=0)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    *first, spec = ask(opt, 5, steps=0, inflight=0, critic_version=0, now=0.0)
    for s, gap in zip(first, (-20.0, 30.0, -40.0, 50.0), strict=True):  # too few gaps to know their spread
        up = tell(opt, evaluated(opt, s, fitness=100.0 + gap, f_mu=100.0))
        assert not up.moved and up.history["told"] and up.history["p"] == 0.0
    mu, ev = opt.mean.copy(), evaluated(opt, spec, fitness=110.0, f_mu=100.0)
    up = tell(opt, ev)
    r = 1.4826 * 30.0  # gaps -20, 30, -40, 50, 10: median 10, deviations 30, 20, 50, 40, 0
    p = (10.0 + r) / (10.0 + 2 * r)
    assert up.moved and up.version == opt.version == 1
    assert up.history["p"] == pytest.approx(p) and up.history["r"] == pytest.approx(r)
    assert up.history["f_ref"] == 100.0 and "t" not in up.history and up.history["told"]  # the loop stamps t
    np.testing.assert_allclose(opt.mean, (1 - p) * mu + p * ev.z, rtol=1e-5, atol=1e-6)
    assert opt.fields()["best_fitness"] == 150.0 and opt.fields()["f_mu"] == 100.0


def test_an_antithetic_pair_compares_both_with_their_mean_and_moves_mu_towards_the_better() -> None:
    """es_antithetic: f(μ) is the pair's mean, the worse is told first (p = 0 under fixed-linear), the
    better then moves μ; both lengths enter the rl_steps window and a better mirror is the one kept."""
    cfg = config("es", initial_steps=0, es_antithetic=True, r=10.0, positive_ratio=1.0)
    assert cfg.mean_rule == "fixed-linear"  # the es default
    opt = AesrlOptimizer(cfg, mu0(cfg))
    [spec] = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    mu, var = opt.mean.copy(), opt.var.copy()
    z, mirror = noise.sample(mu, var, spec["seed"]), noise.sample(mu, var, noise.mirrored(spec["seed"]))
    np.testing.assert_allclose(mirror, 2 * mu - z, atol=1e-6)
    ev = evaluated(opt, spec, fitness=90.0, f_mu=math.nan, length=40, z=z)
    ev.mirror_z, ev.mirror_fitness, ev.mirror_length = mirror, 96.0, 60
    up = tell(opt, ev)
    p = (96.0 - 93.0) / 10.0  # the mirror beats the pair's mean 93 by 3; z trails it by 3 (p = 0)
    assert up.moved and opt.told == 2
    h = up.history
    assert h["f_ref"] == 93.0 and h["f_z"] == 96.0 and h["delta"] == 3.0 and h["p"] == pytest.approx(p)
    assert h["f_pair_worse"] == 90.0 and h["p_pair_worse"] == 0.0 and h["mirror_won"]
    np.testing.assert_allclose(opt.mean, (1 - p) * mu + p * mirror, rtol=1e-5, atol=1e-6)
    assert list(opt.recent_lens) == [40, 60]
    np.testing.assert_array_equal(up.best["params"], mirror)
    assert up.best["fitness"] == 96.0 == opt.fields()["best_fitness"]
    # the same pair the other way round: z is the better one and the one kept
    [spec] = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    z = noise.sample(opt.mean, opt.var, spec["seed"])
    ev = evaluated(opt, spec, fitness=120.0, z=z)
    ev.mirror_z, ev.mirror_fitness, ev.mirror_length = noise.sample(opt.mean, opt.var, noise.mirrored(spec["seed"])), 100.0, 5
    up = tell(opt, ev)
    assert not up.history["mirror_won"] and up.history["f_ref"] == 110.0 and up.history["p"] == 1.0
    np.testing.assert_array_equal(opt.mean, z)  # p = min(10/10, 1): μ becomes z
    np.testing.assert_array_equal(up.best["params"], z)


@pytest.mark.parametrize("shift", [True, False])
def test_a_stale_pair_moves_mu_by_its_offset_with_pair_shift_and_towards_z_without(shift) -> None:
    """Two pairs drawn from one μ; the first moves μ, so the second is told one version late. With
    pair_shift (the es default) μ moves by p·(z − μ_drawn); with the paper's rule, towards z itself."""
    cfg = config("es", initial_steps=0, r=10.0, positive_ratio=1.0, pair_shift=shift)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 2, steps=0, inflight=0, critic_version=0, now=0.0)
    mu0_, var0 = opt.mean.astype(np.float64), opt.var.copy()
    zs = [(noise.sample(opt.mean, var0, s["seed"]), noise.sample(opt.mean, var0, noise.mirrored(s["seed"])))
          for s in specs]
    for lag, (spec, (z, m), f) in enumerate(zip(specs, zs, (104.0, 106.0), strict=True)):
        ev = evaluated(opt, spec, fitness=f, z=z)  # z beats the pair's mean by (f − 100)/2: p = 0.2, 0.3
        ev.mirror_z, ev.mirror_fitness, ev.mirror_length = m, 100.0, 50
        before = opt.mean.astype(np.float64)
        up = tell(opt, ev)
        assert up.moved and up.history["p"] == pytest.approx((f - 100.0) / 20.0)
        assert up.history["lag"] == lag  # updates told since the pair was drawn
    z1, z2 = (z.astype(np.float64) for z, _ in zs)
    mu1 = 0.8 * mu0_ + 0.2 * z1  # the first pair was drawn from the current μ: the same under both rules
    np.testing.assert_allclose(before, mu1, atol=1e-5)
    want = mu1 + 0.3 * (z2 - mu0_) if shift else 0.7 * mu1 + 0.3 * z2
    np.testing.assert_allclose(opt.mean, want, atol=1e-5)
    # the two rules differ by 0.3·(μ1 − μ0) = 0.06·σε here, far above the tolerance
    assert np.abs((mu1 + 0.3 * (z2 - mu0_)) - (0.7 * mu1 + 0.3 * z2)).max() > 5e-4
    assert RunConfig.from_preset("Pendulum-v1", algo="es").pair_shift
    assert not RunConfig.from_preset("Pendulum-v1", algo="aesrl").pair_shift


@pytest.mark.parametrize("shift", [True, False])
def test_a_stale_single_es_individual_is_told_by_its_offset_with_pair_shift(shift) -> None:
    """An RL individual far from μ moves it; an ES individual drawn before that is told one version late.
    With pair_shift, μ moves by p·(z − μ_drawn) and the variance step is that offset (σ·ε), not the
    distance μ moved meanwhile; with the paper's rule, μ moves towards z and the variance takes it all."""
    cfg = config("aesrl", initial_steps=0, r=10.0, pair_shift=shift)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 2, steps=0, inflight=0, critic_version=0, now=0.0)
    mu0_, var0 = opt.mean.astype(np.float64), opt.var.copy()
    rl = evaluated(opt, specs[0], fitness=110.0, f_mu=100.0, z=(opt.mean + 5.0).astype(np.float32))
    rl.kind = "rl"
    assert tell(opt, rl).moved  # p = 20/30: μ moves 3.3 per coordinate
    mu1 = opt.mean.astype(np.float64)
    z = noise.sample(mu0_.astype(np.float32), var0, specs[1]["seed"])
    es = evaluated(opt, specs[1], fitness=100.0, f_mu=100.0, z=z)  # as good as its μ: p = 0.5
    es.drawn_from = mu0_.astype(np.float32)  # the loop always has it; only pair_shift uses it
    up = tell(opt, es)
    assert up.moved and up.history["p"] == pytest.approx(0.5) and up.history["lag"] == 1
    offset = z.astype(np.float64) - mu0_
    want = mu1 + 0.5 * offset if shift else 0.5 * mu1 + 0.5 * z
    np.testing.assert_allclose(opt.mean, want, atol=1e-5)
    # the variance step (p 0.5: n = 1, var' = (z − μ)(z − μ')): from the offset σ·ε it is half its
    # square; towards z it takes half the square of μ's move of 3.3 as well
    step = offset if shift else z - mu1
    want_var = np.maximum(0.5 * step * step, cfg.var_floor)
    np.testing.assert_allclose(opt.var, want_var, rtol=1e-3, atol=1e-7)
    assert bool(opt.var.mean() < 10 * var0.mean()) == shift


def test_es_antithetic_is_the_es_default_and_only_for_aesrl_rules() -> None:
    from aesrl_queue.config import ConfigError

    assert RunConfig.from_preset("Pendulum-v1", algo="es").es_antithetic
    assert RunConfig.from_preset("Pendulum-v1", algo="es").positive_ratio == 0.25  # the paper's default is 1.0
    assert RunConfig.from_preset("Pendulum-v1", algo="aesrl").positive_ratio == 1.0
    assert RunConfig.from_preset("Pendulum-v1", algo="aesrl").es_antithetic  # aesrl's default too
    assert not RunConfig.from_preset("Pendulum-v1", algo="es", es_antithetic=False).es_antithetic
    for algo in ("td3", "opo", "cemrl"):
        with pytest.raises(ConfigError, match="es_antithetic"):
            RunConfig.from_preset("Pendulum-v1", algo=algo, es_antithetic=True).validate()


def test_aesrl_does_not_tell_random_action_results_with_an_adaptive_scale() -> None:
    cfg = config("aesrl", initial_steps=1000)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    [spec] = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    up = tell(opt, evaluated(opt, spec, fitness=500.0, f_mu=0.0))
    assert not up.moved and not up.history["told"] and up.history["p"] == 0.0 and opt.told == 0
    assert up.best is None  # a random-action episode is no individual worth exporting
    assert opt.fields()["best_fitness"] == 500.0


def test_fitness_shift_judges_returns_less_a_bonus_per_step_and_reports_the_return() -> None:
    """fitness_shift 1: a μ that stands 1 000 steps (return 1 000) against an individual that moves
    and falls at 200 steps (return 300): 0 against 100 for the rule, so μ moves towards it, where the
    plain returns (−700) leave μ alone. The run's f(μ) and the history's f_z stay the returns."""
    plain, shifted = (config("aesrl", initial_steps=0, r=100.0, fitness_shift=s) for s in (0.0, 1.0))
    for cfg, moves in ((plain, False), (shifted, True)):
        opt = AesrlOptimizer(cfg, mu0(cfg))
        (a,) = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
        ev = evaluated(opt, a, fitness=300.0, f_mu=1000.0, length=200)
        ev.f_mu_length = 1000.0
        up = tell(opt, ev)
        assert up.moved is moves, cfg.fitness_shift
        assert up.history["f_z"] == 300.0 and opt.fields()["f_mu"] == 1000.0
        assert up.history["delta"] == (100.0 if moves else -700.0)
        assert up.history["p"] == (pytest.approx(2 / 3) if moves else 0.0)  # (Δ + r) / (Δ + 2r) at r 100
    # unpaired, the newest estimate's length is kept with it, through a restart too
    cfg = config("aesrl", initial_steps=0, r=100.0, fitness_shift=1.0, mean_eval_paired=False)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    a, b = ask(opt, 2, steps=0, inflight=0, critic_version=0, now=0.0)
    ev = evaluated(opt, a, fitness=1000.0, f_mu=1000.0, length=1000)
    ev.f_mu_length = 1000.0
    tell(opt, ev)
    up = tell(roundtrip(opt), evaluated(opt, b, fitness=300.0, f_mu=math.nan, length=200))
    assert up.history["f_ref"] == 0.0 and up.history["delta"] == 100.0 and up.moved
    # an antithetic pair's estimate carries the pair's mean length: a later individual judged against
    # it is compared with the pair's mean return less the bonus of those steps, not with the return
    cfg = config("aesrl", initial_steps=0, r=100.0, fitness_shift=1.0, mean_eval_paired=False, es_antithetic=True)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    a, b = ask(opt, 2, steps=0, inflight=0, critic_version=0, now=0.0)
    ev = evaluated(opt, a, fitness=1000.0, f_mu=1000.0, length=1000)
    ev.mirror_z, ev.mirror_fitness, ev.mirror_length = noise.sample(opt.mean, opt.var, noise.mirrored(a["seed"])), 1000.0, 1000
    tell(opt, ev)
    up = tell(roundtrip(opt), evaluated(opt, b, fitness=300.0, f_mu=math.nan, length=200))
    assert up.history["f_ref"] == 0.0 and up.history["delta"] == 100.0 and up.moved


def test_unpaired_aesrl_compares_with_the_newest_f_mu() -> None:
    cfg = config("aesrl", initial_steps=0, mean_eval_paired=False)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    a, b = ask(opt, 2, steps=0, inflight=0, critic_version=0, now=0.0)
    tell(opt, evaluated(opt, a, fitness=3.0, f_mu=7.0))
    up = tell(opt, evaluated(opt, b, fitness=1.0, f_mu=math.nan))
    assert up.history["f_ref"] == 7.0


def test_invalid_tell_changes_nothing() -> None:
    cfg = config("aesrl", initial_steps=0)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    [spec] = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    before = codec.pack(opt.state())
    bad = evaluated(opt, spec, fitness=1.0, f_mu=0.0, z=np.full(cfg.actor_dim, np.nan, dtype=np.float32))
    with pytest.raises(ValueError):
        tell(opt, bad)
    assert codec.pack(opt.state()) == before


def test_opo_takes_a_better_individual_as_the_mean() -> None:
    cfg = config("opo", initial_steps=0)
    opt = make_optimizer(cfg, mu0(cfg))
    [spec] = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    ev = evaluated(opt, spec, fitness=2.0, f_mu=1.0)
    assert tell(opt, ev).moved
    np.testing.assert_array_equal(opt.mean, ev.z)


def test_acemrl_tells_one_result_at_a_time() -> None:
    cfg = config("acemrl", initial_steps=0)
    opt = make_optimizer(cfg, mu0(cfg))
    for spec in ask(opt, 6, steps=0, inflight=0, critic_version=0, now=0.0):
        up = tell(opt, evaluated(opt, spec, fitness=float(spec["n"]), f_mu=0.0))
        assert up.history["version"] == opt.version


# -- CEM-RL and P-CEM-RL ------------------------------------------------------------------------------------
def test_cemrl_asks_one_member_at_a_time_and_pcemrl_a_whole_generation() -> None:
    serial = make_optimizer(config("cemrl", initial_steps=0, population=4), mu0(config("cemrl", initial_steps=0,
                                                                                       population=4)))
    [first] = ask(serial, 8, steps=0, inflight=0, critic_version=0, now=0.0)
    assert ask(serial, 8, steps=0, inflight=1, critic_version=0, now=0.0) == []
    assert first["extra"] == {"generation": 0, "member": 0}
    cfg = config("pcemrl", initial_steps=0, population=4)
    par = make_optimizer(cfg, mu0(cfg))
    specs = ask(par, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    assert [s["extra"]["member"] for s in specs] == [0, 1, 2, 3] and all(s["kind"] == "es" for s in specs)
    # + halves first, then their mirrors: member i + 2 is the antithetic partner of member i.
    assert specs[2]["seed"] == noise.mirrored(specs[0]["seed"])
    assert ask(par, 1, steps=0, inflight=4, critic_version=0, now=0.0) == []


def test_pcemrl_tells_the_weighted_elite_once_the_generation_is_back() -> None:
    cfg = config("pcemrl", initial_steps=0, population=4)
    opt = CemOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    mu, damp = opt.mean.astype(np.float64), opt.dist.damp
    evs = [evaluated(opt, s, fitness=f, length=10) for s, f in zip(specs, [1.0, 4.0, 3.0, 2.0], strict=True)]
    for ev in evs[:3]:
        up = tell(opt, ev)
        assert not up.moved and not up.history["told"] and opt.version == 0
    up = tell(opt, evs[3])
    assert up.moved and up.history["told"] and opt.version == 1 and opt.gen is None
    # Elite of 2: members 1 (f=4) and 2 (f=3), weights ∝ log(3/1), log(3/2).
    w = np.log([3.0, 1.5]) / np.log([3.0, 1.5]).sum()
    elite = np.stack([evs[1].z, evs[2].z]).astype(np.float64)
    np.testing.assert_allclose(opt.mean, w @ elite, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(opt.var, (w @ (elite - mu) ** 2) / 2 + damp, rtol=1e-5)
    assert opt.fields()["generation"] == 1 and opt.prev_gen_steps == 40


def test_pcemrl_requests_critic_training_before_its_rl_members() -> None:
    cfg = config("pcemrl", initial_steps=0, population=4, batch_size=8)
    opt = CemOptimizer(cfg, mu0(cfg))
    for s in ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0):
        tell(opt, evaluated(opt, s, fitness=1.0, length=25))
    assert ask(opt, 1, steps=100, inflight=0, critic_version=0, critic_steps=0, now=1.0) == []
    assert gate(opt).waiting and opt.fields()["critic_request"] == 100  # the last generation's 100 steps
    specs = ask(opt, 1, steps=100, inflight=0, critic_version=1, critic_steps=100, now=2.0)
    assert [s["kind"] for s in specs] == ["rl", "rl", "es", "es"] and specs[0]["rl_steps"] == 100


def test_a_generation_resumes_mid_way_from_plain_state() -> None:
    """The restart that crashed the old synchronous loop (KeyError at its tell): ES members that
    returned before the restart are rebuilt from their seeds, RL members from their stored individuals."""
    cfg = config("pcemrl", initial_steps=0, population=6, batch_size=8)
    opt = CemOptimizer(cfg, mu0(cfg))
    for s in ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0):
        tell(opt, evaluated(opt, s, fitness=float(s["n"]), length=25))
    specs = ask(opt, 1, steps=200, inflight=0, critic_version=1, critic_steps=10**6, now=0.0)
    assert [s["kind"] for s in specs].count("rl") == 3
    trained = {s["n"]: noise.sample(opt.mean, opt.var, s["seed"]) + 0.01 for s in specs if s["kind"] == "rl"}
    evs = [evaluated(opt, s, fitness=float(-s["n"] % 7), z=trained.get(s["n"])) for s in specs]
    for ev in evs[:4]:  # two RL and two ES members back (members 0, 1, 2 are RL)
        tell(opt, ev)
    twin = roundtrip(opt)
    assert twin.needs_individuals() == {evs[0].job: 0, evs[1].job: 1, evs[2].job: 2}
    for _job, member in twin.needs_individuals().items():
        twin.provide(member, trained[specs[member]["n"]] if member < 2 else None)  # member 2's individual expired
    twin.reconcile({evs[4].job, evs[5].job})
    assert [s["extra"]["member"] for s in ask(twin, 1, steps=300, inflight=2, critic_version=1,
                                                   critic_steps=10**6, now=0.0)] == [2]
    for ev in (evs[4], evs[5]):
        tell(opt, ev)
        tell(twin, ev)
    assert opt.version == 2 and twin.version == 1  # the twin still waits for member 2
    again = twin.gen["members"][2]["job"]
    up = tell(twin, Evaluated(job=again, kind="rl", version=1, z=evs[2].z,
                             fitness=evs[2].fitness, length=50))
    assert up.moved
    np.testing.assert_array_equal(twin.mean, opt.mean)
    np.testing.assert_array_equal(twin.var, opt.var)


def test_lost_members_run_again_then_drop_and_half_a_generation_fails_the_run() -> None:
    cfg = config("pcemrl", initial_steps=0, population=4)
    opt = CemOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    job = f"opt-j{specs[0]['n']}"
    assert opt.lost(job) is None
    for _ in range(MAX_TRIES - 1):
        [again] = ask(opt, 1, steps=0, inflight=3, critic_version=0, now=0.0)
        assert again["extra"]["member"] == 0
        opt.lost(f"opt-j{again['n']}")
    assert opt.gen["members"][0]["dropped"]
    for s in specs[1:3]:
        tell(opt, evaluated(opt, s, fitness=1.0))
    up = opt.lost(f"opt-j{specs[3]['n']}", retry=False)  # 2 of 4 back: told without the dropped ones
    assert up is not None and up.moved and not up.applied and opt.version == 1
    specs = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    tell(opt, evaluated(opt, specs[0], fitness=1.0))
    opt.lost(f"opt-j{specs[1]['n']}", retry=False)
    opt.lost(f"opt-j{specs[2]['n']}", retry=False)
    with pytest.raises(OptimizerFailed):
        opt.lost(f"opt-j{specs[3]['n']}", retry=False)


# -- the law every optimizer keeps: its state is its future ----------------------------------------------
ALGOS = [("aesrl", {}), ("aesrl", {"r": 50.0}), ("es", {}), ("opo", {}), ("acemrl", {}), ("cemrl", {}),
         ("pcemrl", {}), ("pcemrl", {"parallel_critic": True})]


def drive(opt, ops: list[tuple[int, float]], steps0: int) -> list:
    """Apply (action, number) ops; log what comes out (asks and tells) as comparable plain data."""
    out, pending, steps = [], [], steps0
    for action, x in ops:
        if action == 0 or not pending:
            specs = ask(opt, int(abs(x)) % 4 + 1, steps=steps, inflight=len(pending), critic_version=1,
                            critic_steps=10**9, now=1000.0)
            pending += specs
            out.append(("ask", [sorted((k, str(v)) for k, v in s.items()) for s in specs]))
        elif action == 1:
            spec = pending.pop(int(abs(x)) % len(pending))
            z = noise.sample(opt.mean, opt.var, spec["seed"])
            steps += 20
            try:
                up = tell(opt, evaluated(opt, spec, fitness=x, f_mu=x / 2, length=20, steps=steps, z=z))
            except ValueError as exc:
                out.append(("rejected", str(exc)))
                continue
            hist = {k: v for k, v in (up.history or {}).items() if not (isinstance(v, float) and math.isnan(v))}
            out.append(("tell", up.version, up.moved, sorted((k, str(v)) for k, v in hist.items()),
                        opt.mean.tobytes(), opt.var.tobytes()))
        else:
            spec = pending.pop(int(abs(x)) % len(pending))
            try:
                up = opt.lost(f"opt-j{spec['n']}", retry=x > 0)
            except OptimizerFailed:
                out.append(("failed",))
                break
            out.append(("lost", None if up is None else (up.version, opt.mean.tobytes())))
    return out


@pytest.mark.parametrize(("algo", "kw"), ALGOS, ids=[f"{a}{'-' + '-'.join(k) if k else ''}" for a, k in ALGOS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(st.tuples(st.integers(0, 2), st.floats(-100, 100)), max_size=25),
       after=st.lists(st.tuples(st.integers(0, 2), st.floats(-100, 100)), max_size=25),
       steps0=st.sampled_from([0, 10_000]))
def test_state_then_load_state_gives_the_same_asks_and_tells(algo, kw, before, after, steps0) -> None:
    cfg = config(algo, initial_steps=500, batch_size=8, population=4, **kw)
    opt = make_optimizer(cfg, mu0(cfg))
    try:
        drive(opt, before, steps0)
    except OptimizerFailed:
        return
    twin = roundtrip(opt)
    for _job, member in twin.needs_individuals().items():  # what the loop fetches from Redis
        twin.provide(member, opt._z[member])
    from_twin = drive(twin, after, steps0 + 10_000)
    assert drive(opt, after, steps0 + 10_000) == from_twin


def test_rl_gaps_never_set_the_fitness_scale() -> None:
    """Only ES gaps set the adaptive r: before 5 ES gaps are known an RL individual does not move μ,
    and once they are, RL individuals that fall far below μ neither widen r nor, judged on it, get a
    share of the move. On a plateau of ES gaps ±1 an RL individual 40 above μ gets p ≈ 1."""
    cfg = config("aesrl", initial_steps=0)
    opt = AesrlOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 12, steps=0, inflight=0, critic_version=0, now=0.0)
    mu = opt.mean.copy()
    for s, gap in zip(specs[:5], (-30.0, 20.0, -10.0, 40.0, 60.0), strict=True):
        assert tell_rl(opt, s, gap, 100.0).history["p"] == 0.0  # no ES gaps yet: μ waits
    np.testing.assert_array_equal(opt.mean, mu)
    for s, gap in zip(specs[5:10], (-1.0, 1.0, 0.0, -1.0, 1.0), strict=True):  # ES gaps: r ≈ 1.5
        tell(opt, evaluated(opt, s, fitness=1000.0 + gap, f_mu=1000.0))
    assert opt.dist.r == pytest.approx(1.4826)
    assert tell_rl(opt, specs[10], -900.0, 1000.0).history["p"] == 0.0
    assert opt.dist.r == pytest.approx(1.4826)  # the falling RL individual did not widen it
    assert tell_rl(opt, specs[11], 40.0, 1000.0).history["p"] > 0.95


def test_optimizers_know_numbers_only_ask_and_tell_have_the_pycma_shape() -> None:
    """ask takes the free slots, the stored steps, the jobs in flight and whether RL jobs may be made;
    tell takes (individual, fitness, reference). No clock and no critic progress reach an optimizer:
    critic gating is the loop's (scheduler/critic_gate.py)."""
    import inspect
    from pathlib import Path

    for cls in (AesrlOptimizer, CemOptimizer):
        assert list(inspect.signature(cls.ask).parameters) == ["self", "n", "steps", "inflight", "rl"]
        assert list(inspect.signature(cls.tell).parameters) == ["self", "ind", "fit", "ref"]
    src = "".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "aesrl_queue/optimizers").glob("*.py"))
    for word in ("critic_wait", "critic_version", "critic_steps", "monotonic", "time.time"):
        assert word not in src, word



def test_cem_reports_its_generations_as_numbers_and_the_loop_words_them() -> None:
    """The optimizer logs nothing itself: a generation's start and its tell are events of numbers,
    which the scheduler loop words (scheduler/loop.py OPTIMIZER_EVENTS)."""
    from scheduler.loop import OPTIMIZER_EVENTS

    cfg = config("pcemrl", initial_steps=0, population=4)
    opt = CemOptimizer(cfg, mu0(cfg))
    specs = ask(opt, 1, steps=0, inflight=0, critic_version=0, now=0.0)
    assert opt.events == [("generation", {"g": 0, "version": 0, "rl": 0, "es": 4, "steps": 0})]
    for s, f in zip(specs, [1.0, 4.0, 3.0, 2.0], strict=True):
        tell(opt, evaluated(opt, s, fitness=f, length=10))
    name, numbers = opt.events[-1]
    assert name == "told" and numbers == {"g": 0, "best": 4.0, "mean": 2.5, "version": 1}
    for name, numbers in opt.events:
        assert OPTIMIZER_EVENTS[name][1] % numbers
    assert "generation 0 told (best f(z) 4.0, mean 2.5) -> version 1" == OPTIMIZER_EVENTS["told"][1] % numbers
