"""Golden traces: what every algorithm's defaults compute, recorded once and compared bit for bit.

`optimizer_trace(algo)` tells a fixed sequence of made-up results to the optimizer of `algo` and
records μ, var and p after each; `td3_trace()` trains the TD3 baseline's agent on a fixed batch;
`worker_traces(client)` evaluates fixed job specs (random, ES, antithetic ES, RL) on a real Redis
and records the returns, the f(μ) estimate and the stored transitions (the individual's episode,
and μ's f(μ) episode as `mu_transitions` where the job stores one). Arrays are kept as SHA-256
digests of their bytes, so "the same" means the same to the last bit, except where a matrix product
computes them: torch's (the TD3 agent, the RL job's training) and numpy's (every episode a network
plays: its returns and transitions). Those kernels round differently by processor and by the kernel
the BLAS library picks for it (MKL on Intel and AMD; OpenBLAS by CPU model or `OPENBLAS_CORETYPE`),
so those arrays are kept as a `fingerprint`, and they and the returns are compared to within that
rounding (tests/test_golden.py). A random-action episode computes no product: its transitions stay a
digest, compared exactly.

    python -m tests.golden --write      # record tests/data/golden.json (only when a change is meant)
    python -m tests.golden --write worker/es worker/rl   # re-record only these traces

A re-record of named traces leaves the others as recorded, and in the named ones keeps every recorded
value that the new run reproduces to within rounding (what tests/test_golden.py accepts), so that a
re-record on another processor changes only what the change of behaviour moved.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "golden.json"
QUEUE_ALGOS = ("aesrl", "es", "opo", "acemrl", "cemrl", "pcemrl")
ENV = "Pendulum-v1"
HOPPER = "Hopper-v5"
SMALL = {"hidden": (8, 8), "critic_hidden": (16, 16), "batch_size": 32, "seed": 5}
# aesrl's first defaults (TD3, RL jobs that train a sample, single ES individuals with a μ episode): the
# worker traces recorded with them keep recording the job function's paths for those settings
FIRST = {"learner": "td3", "rl_steps_max": 2000, "es_antithetic": False, "critic_shift": True, "rl_ratio": 0.5,
         "critic_lag": 5000}


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:20]


def fingerprint(arr: np.ndarray) -> list[float]:
    """Sums and end values of an array: they move with any real change of it, and only in the last
    digits with the rounding that differs between processors."""
    a = np.asarray(arr, dtype=np.float64).ravel()
    return [float(a.sum()), float(np.abs(a).sum()), float((a * a).sum()), *map(float, a[:3]), *map(float, a[-3:])]


def num(x: Any) -> Any:
    """A float as JSON keeps it exactly (repr round-trips), NaN as a string."""
    if isinstance(x, float | np.floating):
        return "nan" if math.isnan(x) else float(x)
    return x


def config(algo: str, env: str = ENV, **kw: Any):
    from aesrl_queue.config import RunConfig

    return RunConfig.from_preset(env, algo=algo, **{"run_id": f"golden-{algo}", **SMALL, **kw}).resolve()


def optimizer_trace(algo: str, results: int = 40, env: str = ENV) -> list[dict[str, Any]]:
    """Tell `results` made-up results to a fresh optimizer of `algo` (its defaults on `env`)."""
    from aesrl_queue import noise
    from aesrl_queue.optimizers import Fitness, Individual, Reference, make_optimizer
    from scheduler.critic_gate import make_gate

    cfg = config(algo, env=env, initial_steps=400)
    mu0 = np.linspace(-0.3, 0.3, cfg.actor_dim, dtype=np.float32)
    opt = make_optimizer(cfg, mu0)
    gate = make_gate(cfg, opt)  # the loop's critic gating, as the scheduler asks
    rng = np.random.default_rng(17)
    trace: list[dict[str, Any]] = []
    steps, now, pending = 0, 0.0, []
    dists = {opt.version: (opt.mean.copy(), opt.var.copy())}
    while len(trace) < results:
        if not pending:
            pending = list(gate.ask(4, steps=steps, inflight=0, critic_version=1, critic_steps=steps + 10_000,
                                    now=now))
            if not pending:
                now += 1000.0
                continue
        spec = pending.pop(0)
        mu, var = dists[spec["version"]]
        length = 200
        fitness = float(-1000.0 + 8.0 * len(trace) + 150.0 * rng.standard_normal())
        f_mu = float(-1000.0 + 8.0 * len(trace) + 100.0 * rng.standard_normal())
        kw: dict[str, Any] = {}
        fit = Fitness(fitness, length)
        if spec["kind"] == "rl":
            z = (mu + 0.05 * rng.standard_normal(mu.size)).astype(np.float32)
        else:
            antithetic = cfg.es_antithetic and not spec.get("random")
            ind = noise.rebuild(mu, spec["seed"], var=var, antithetic=antithetic)
            z, kw["drawn_from"] = ind.z, ind.mean
            if antithetic:
                kw["mirror_z"] = ind.mirror
                fit = Fitness(fitness, length, float(f_mu + 50.0 * rng.standard_normal()), length)
                steps += length
        steps += length
        individual = Individual(job=f"golden-{algo}-j{spec['n']}", kind=spec["kind"], version=spec["version"],
                                z=z, steps=steps, interactions=steps, random=bool(spec.get("random", False)), **kw)
        update = opt.tell(individual, fit, Reference(f_mu, spec["version"], float(length)))
        dists.setdefault(opt.version, (opt.mean.copy(), opt.var.copy()))
        hist = update.history or {}
        trace.append({"job": spec["n"], "kind": spec["kind"], "version": opt.version, "p": num(hist.get("p", 0.0)),
                      "mu": digest(opt.mean), "var": digest(opt.var), "mu0": num(float(opt.mean[0])),
                      "var0": num(float(opt.var[0]))})
    return trace


def td3_trace(steps: int = 12) -> list[dict[str, Any]]:
    """The TD3 baseline's agent at the td3 defaults, trained on one fixed batch of made-up transitions."""
    import torch

    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec

    cfg = config("td3")
    spec = NetSpec.from_config(cfg)
    torch.manual_seed(3)
    agent = Agent(spec, "td3", lr=cfg.actor_lr, gamma=cfg.gamma, tau=cfg.tau, policy_noise=cfg.policy_noise,
                     noise_clip=cfg.noise_clip)
    g = torch.Generator().manual_seed(11)
    n = 64
    batch = {"obs": torch.randn(n, cfg.obs_dim, generator=g), "act": torch.rand(n, cfg.act_dim, generator=g) * 4 - 2,
             "rew": torch.randn(n, generator=g), "next_obs": torch.randn(n, cfg.obs_dim, generator=g),
             "done": torch.zeros(n)}
    out = []
    for _ in range(steps):
        stats = agent.train_step(batch)
        out.append({"loss": num(stats["loss"]), "actor": fingerprint(agent.actor_params())})
    return out


def worker_traces(client) -> dict[str, dict[str, Any]]:
    """Fixed job specs evaluated by the worker's job function against a real Redis."""
    import torch

    import workers.jobs
    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec, get_flat
    from aesrl_queue.store import Store
    from workers.jobs import evaluate

    out = {}
    for name, algo, kind, random_actions, settings in (
            ("random", "aesrl", "es", True, FIRST), ("es", "aesrl", "es", False, FIRST),
            ("es-antithetic", "es", "es", False, {}), ("rl", "aesrl", "rl", False, FIRST),
            # aesrl's defaults: the critic daemon's own crossq-sac actor, played as its policy draws
            ("rl-actor", "aesrl", "rl", False, {})):
        cfg = config(algo, run_id=f"golden-w-{name}", **settings)
        store = Store(client, cfg.run_id)
        store.write_config(cfg)
        mu = np.linspace(-0.4, 0.4, cfg.actor_dim, dtype=np.float32)
        var = np.full(cfg.actor_dim, 1e-2, dtype=np.float32)
        store.publish_dist(0, mu, var)
        store.set_state(version=0)
        if kind == "rl" and cfg.rl_steps_max == 0:
            torch.manual_seed(2)
            agent = Agent(NetSpec.from_config(cfg), cfg.learner)
            store.publish_critic(1, agent.policy_weights())  # what the daemon publishes
        elif kind == "rl":
            torch.manual_seed(2)
            critic = NetSpec.from_config(cfg).make_critic("cpu")
            store.publish_critic(1, {"critic": get_flat(critic)})
            rng = np.random.default_rng(4)
            n = 64
            store.append_episode({"obs": rng.standard_normal((n, cfg.obs_dim)).astype(np.float32),
                                  "act": rng.uniform(-2, 2, (n, cfg.act_dim)).astype(np.float32),
                                  "rew": rng.standard_normal(n).astype(np.float32),
                                  "next_obs": rng.standard_normal((n, cfg.obs_dim)).astype(np.float32),
                                  "done": np.zeros(n, dtype=np.float32)}, job="seed-episode")
        before = {i for i, _ in client.xrange(store.key("replay"))}
        job = f"{cfg.run_id}-j1"
        store.add_inflight(job, {"kind": kind, "version": 0, "seed": 1234, "n": 1})
        torch.manual_seed(0)
        # Every job's episode is stored here, also the es run's (which keeps no replay: it has no
        # critic), so that the transitions it computes are compared bit for bit with the recording;
        # test_golden checks apart that such a run stores none.
        with mock.patch("workers.jobs.needs_critic_daemon", return_value=True):
            workers.jobs._CONTEXTS.clear()
            trains = kind == "rl" and cfg.rl_steps_max > 0
            evaluate(cfg.run_id, job, kind, 0, 1234, cfg.spec_hash, rl_steps=25 if trains else 0,
                     random_actions=random_actions, client=client)
        workers.jobs._CONTEXTS.clear()
        (_, res), = client.xrange(store.key("results"))
        res = {k.decode(): v.decode() for k, v in res.items()}
        assert res["status"] == "ok", res
        entries = [(i, f) for i, f in client.xrange(store.key("replay")) if i not in before]
        # the individual's episode (with its mirror's) under the job's name, then μ's f(μ) episode
        own = [(i, f) for i, f in entries if f[b"job"] == job.encode()]
        mean = [(i, f) for i, f in entries if f[b"job"] != job.encode()]
        h = hashlib.sha256()
        for _i, f in own:
            for k in sorted(f):
                h.update(k + b"=" + f[k])
        rec = {k: num(float(res[k])) for k in ("fitness", "f_mu") if k in res}
        rec.update({k: int(res[k]) for k in ("len", "eval_steps", "f_mu_version") if k in res})
        if "mirror_fitness" in res:
            rec.update(mirror_fitness=num(float(res["mirror_fitness"])), mirror_len=int(res["mirror_len"]))
        rec.update(episodes=len(entries), transitions=h.hexdigest()[:20])
        if kind == "rl":  # the actor torch trained (or the daemon's, as published)
            rec["individual"] = fingerprint(store.get_individual(res["ind"]))
        if not random_actions:  # the episode a network played: its actions went through a BLAS kernel
            rec["transitions"] = _played(store, own)
        if mean:  # μ's episode: a network played it
            rec["mu_transitions"] = _played(store, mean)
        out[name] = rec
    return out


def _played(store, entries) -> list[float]:
    """The fingerprint of replay entries a network played (every field of every entry, in order)."""
    return fingerprint(np.concatenate([
        np.concatenate([a.ravel() for _k, a in sorted(store.decode_episode(i, f).items())]) for i, f in entries]))


def record(client) -> dict[str, Any]:
    return {"optimizers": {algo: optimizer_trace(algo) for algo in QUEUE_ALGOS},
            # Hopper pays a survival bonus, so aesrl's fitness_shift ("alive") changes what the rule compares
            "hopper": {"aesrl": optimizer_trace("aesrl", env=HOPPER)}, "td3": td3_trace(),
            "worker": worker_traces(client)}


def _rerecord(old: dict[str, Any], new: dict[str, Any], parts: list[list[str]]) -> dict[str, Any]:
    """`old` with the named traces taken from `new`, keeping each recorded value `new` reproduces."""
    from tests.test_golden import close

    for section, name in parts:
        if name not in new[section]:
            raise SystemExit(f"no trace {section}/{name}; there are {sorted(new[section])}")
        was, now = old[section].get(name, {}), new[section][name]
        if not isinstance(now, dict):  # an optimizer's trace: computed exactly, taken as it is
            old[section][name] = now
            continue
        old[section][name] = {k: was[k] if k in was and close(v, was[k]) else v for k, v in now.items()}
    return old


def main() -> int:
    import torch

    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import RedisServer

    torch.set_num_threads(1)
    if "--write" not in sys.argv:
        print("usage: python -m tests.golden --write [SECTION/NAME ...]   (records tests/data/golden.json)")
        return 2
    import tempfile

    parts = [a.split("/", 1) for a in sys.argv[1:] if a != "--write"]
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(directory=Path(tmp) / "redis").start()
        try:
            data = record(connect(server.url))
        finally:
            server.cleanup()
    if parts:
        data = _rerecord(json.loads(DATA.read_text()), data, parts)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {DATA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
