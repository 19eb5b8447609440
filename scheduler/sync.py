"""The synchronous CEM-RL baselines on the runtime of the asynchronous loop: `cemrl` runs one job at a
time, `pcemrl` a whole generation over all workers with a barrier; both tell once per generation.

They reuse the Dispatcher, the store, the result checks and the job function of scheduler/loop.py;
only when to ask and when to tell differ. `make_sync_scheduler` also hands out the TD3 baseline.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from typing import Any

import numpy as np
import redis

from aesrl_queue import codec, noise
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.distributions import make_distribution
from aesrl_queue.nets import init_actor_params
from aesrl_queue.store import Result, Store
from scheduler.common import Dispatcher, DistCache, finite, pack_dist_state
from scheduler.loop import uses_rl

log = logging.getLogger(__name__)

SYNC_ALGOS = ("cemrl", "pcemrl")
MAX_TRIES = 3  # dispatches of one member (lost or failed jobs) before the generation goes on without it


def needs_workers(cfg: RunConfig) -> bool:
    """TD3 runs in the scheduler process; every other algorithm evaluates on RQ workers."""
    return cfg.algo != "td3"


def needs_critic_daemon(cfg: RunConfig) -> bool:
    """Whether a run needs `aesrl-queue critic start`: never for td3 and es, always for the CEM-RL loops."""
    if cfg.algo == "td3":
        return False
    if cfg.algo in SYNC_ALGOS:
        return True
    return uses_rl(cfg)


def make_sync_scheduler(client: redis.Redis, blocking_client: redis.Redis, cfg: RunConfig,
                        stop_event: threading.Event | None = None):
    """The scheduler object of a cemrl, pcemrl or td3 run (each has run() -> final status)."""
    if cfg.algo == "td3":
        from scheduler.td3_baseline import TD3Baseline

        return TD3Baseline(client, cfg, stop_event=stop_event)
    if cfg.algo in SYNC_ALGOS:
        return SyncScheduler(client, blocking_client, cfg, stop_event=stop_event)
    raise ValueError(f"algo {cfg.algo!r} is not synchronous; use scheduler.loop.AsyncScheduler")


def generation_seed(run_seed: int, g: int) -> int:
    """The seed of generation g's antithetic population: fixed by (run seed, g), so a restart re-derives it."""
    digest = hashlib.sha256(f"{run_seed}:generation:{g}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def build_cem(cfg: RunConfig, mu: np.ndarray):
    # The official aes-rl code decays damp by cemrl_tau = 0.90 per generation; DESIGN.md §5 and the
    # original CEM-RL use 0.95 (docs/algorithms.md).
    return make_distribution("cem", mu, elite=cfg.population // 2, antithetic=True, var_init=cfg.var_init,
                             damp_init=1e-3, damp_limit=1e-5, damp_tau=0.95)


class SyncScheduler:
    """CEM-RL (`cemrl`: serial, one job in flight) and P-CEM-RL (`pcemrl`: a generation at once).

    A generation: ask `population` antithetic members (the + halves first, then their mirrors, as
    the official code orders them); when the random phase is over the first half are RL members.
    The critic is trained before them (see docs/decisions.md); every member is one ordinary job
    of workers/jobs.py; the distribution is told once every member has returned.
    """

    def __init__(self, client: redis.Redis, blocking_client: redis.Redis, cfg: RunConfig,
                 stop_event: threading.Event | None = None) -> None:
        if cfg.algo not in SYNC_ALGOS:
            raise ValueError(f"SyncScheduler runs {', '.join(SYNC_ALGOS)}, not {cfg.algo!r}")
        self.r = client
        self.rb = blocking_client
        self.cfg = cfg
        self.store = Store(client, cfg.run_id)
        self.stop_event = stop_event or threading.Event()
        self.dists = DistCache(self.store)
        self.serial = cfg.algo == "cemrl"
        self.gen: dict[str, Any] | None = None
        self.z: dict[int, np.ndarray] = {}  # member index -> evaluated parameters (this generation)
        self._critic_wait: dict[str, Any] | None = None
        self._no_critic_gen = -1  # generation in which the critic did not come; its RL members run as ES

    # -- set-up and restart ------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, store = self.cfg, self.store
        if not store.write_config(cfg):
            self.cfg = cfg = store.config()
            self.serial = cfg.algo == "cemrl"
        state = store.state()
        if state["version"] == 0 and not self.r.exists(store.key("dist:0")):
            mu0 = init_actor_params(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation,
                                    seed=cfg.seed)
            self.dist = build_cem(cfg, mu0)
            pipe = self.r.pipeline()
            store.publish_dist(0, self.dist.mean, self.dist.var, pipe=pipe)
            store.set_state(pipe=pipe, version=0, generation=0, f_mu=math.nan, f_mu_version=-1, n_rl=1, n_es=1,
                            best_fitness=-math.inf, last_result_id="0-0", started_at=time.time(),
                            status="running", critic_request=0, prev_gen_steps=0, updated_at=time.time())
            pipe.set(store.key("dist_state"), pack_dist_state(self.dist.state()))
            pipe.execute()
            log.info("run %s: created μ₀ (%d parameters), %s with generations of %d", cfg.run_id, cfg.actor_dim,
                     cfg.algo, cfg.population)
        else:
            mu, var = store.read_dist(state["version"])
            self.dist = build_cem(cfg, mu)
            extra = codec.unpack(self.r.get(store.key("dist_state")), what="dist_state")
            extra.update({"mean": mu, "var": var, "version": state["version"]})
            self.dist.load_state(extra)
            blob = self.r.get(store.key("gen"))
            self.gen = codec.unpack(blob, what="generation") if blob else None
            log.info("run %s: resumed at generation %d (version %d), %d steps stored", cfg.run_id,
                     state.get("generation", 0), state["version"], state["steps"])
        self.dispatch = Dispatcher(self.r, store, cfg)
        state = store.state()
        self.version = state["version"]
        self.last_id = state.get("last_result_id", "0-0") or "0-0"
        self.best = state.get("best_fitness", -math.inf)
        self.dists.put(self.version, self.dist.mean.copy(), self.dist.var.copy())
        if self.gen is not None:
            self._reload_rl_members()
            for m in self.gen["members"]:
                if m["job"] and not m["done"] and m["job"] not in self.dispatch.inflight:
                    m["job"] = ""  # its job was forgotten before the restart: dispatch the member again
        store.set_status("running")

    def _reload_rl_members(self) -> None:
        """After a restart: the trained parameters of RL members that already returned."""
        for i, m in enumerate(self.gen["members"]):
            if m["done"] and m["kind"] == "rl":
                try:
                    self.z[i] = self.store.get_individual(m["ind"])
                except CodecError as exc:
                    log.warning("run %s: RL member %d of generation %d is gone (%s); evaluating it again",
                                self.cfg.run_id, i, self.gen["g"], exc)
                    m.update(done=False, job="")

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> str:
        self.setup()
        try:
            return self._loop()
        finally:
            self.dispatch.noise_ahead.close()

    def _loop(self) -> str:
        cfg = self.cfg
        while True:
            if self.stop_event.is_set():
                self.store.set_status("stopped")
                log.info("run %s: stopped on request; the generation resumes on restart", cfg.run_id)
                return "stopped"
            if self.gen is None:
                if self.store.state_field("steps") >= cfg.total_steps:
                    left = list(self.dispatch.inflight)
                    self.dispatch.forget(left)
                    self.store.set_state(status="finished", finished_at=time.time(), updated_at=time.time())
                    log.info("run %s: finished after generation %d", cfg.run_id,
                             self.store.state_field("generation"))
                    return "finished"
                self._start_generation()
            self._dispatch_members()
            block = None if self._critic_wait else 500  # None: do not block (0 would block for ever)
            for entry_id, res, err in self.dispatch.read(self.last_id, block, self.rb):
                self._apply(entry_id, res, err)
            self._replace_lost()
            if self._critic_wait:
                time.sleep(0.05)

    def _start_generation(self) -> None:
        cfg, store = self.cfg, self.store
        state = store.state()
        g = state.get("generation", 0)
        steps = state["steps"]
        prev_steps = store.state_field("prev_gen_steps")
        seeds, _pop = self.dist.ask(cfg.population, generation_seed(cfg.seed, g))
        pair_seeds = seeds[0::2]
        # The official order: the + member of every pair first, then the mirrors; RL takes the first half.
        member_seeds = [*pair_seeds, *[noise.mirrored(s) for s in pair_seeds]]
        rl_phase = steps >= max(cfg.initial_steps, cfg.batch_size) and prev_steps > 0
        n_rl = cfg.population // 2 if rl_phase else 0
        random_phase = steps < cfg.initial_steps
        members = []
        for i, seed in enumerate(member_seeds):
            members.append({"kind": "rl" if i < n_rl else "es", "seed": int(seed), "job": "", "tries": 0,
                            "done": False, "dropped": False, "random": random_phase, "critic": 0})
        if n_rl and cfg.critic_on_request:
            if self.serial:
                # CEM-RL: critic steps before each RL member (the official interleaving).
                per = max(1, prev_steps // n_rl)
                for m in members[:n_rl]:
                    m["critic"] = per
            else:
                members[0]["critic"] = prev_steps  # P-CEM-RL: all critic training before the generation
        self.gen = {"g": g, "version": self.version, "members": members, "started_at": time.time(),
                    "steps_at_start": steps, "rl_steps": min(cfg.rl_steps_max, prev_steps or cfg.max_episode_steps)}
        self.z = {}
        self.r.set(store.key("gen"), codec.pack(self.gen))
        log.info("run %s: generation %d (version %d): %d RL + %d ES members, %d steps stored", cfg.run_id, g,
                 self.version, n_rl, cfg.population - n_rl, steps)

    # -- asking ------------------------------------------------------------------------------------
    def _critic_ready(self, m: dict[str, Any]) -> bool:
        """Whether an RL member may be dispatched now (its critic training done, or a critic exists)."""
        cfg = self.cfg
        if self._no_critic_gen == self.gen["g"]:
            return True
        now = time.monotonic()
        if self._critic_wait is None:
            if cfg.critic_on_request:
                target = self.store.state_field("critic_request") + m["critic"]
                if m["critic"]:
                    self.store.set_state(critic_request=target)
                    m["critic"] = 0  # requested once, even if the scheduler restarts
                    self.r.set(self.store.key("gen"), codec.pack(self.gen))
                self._critic_wait = {"field": "critic_steps", "target": target, "since": now}
            else:
                self._critic_wait = {"field": "critic_version", "target": 1, "since": now}
        w = self._critic_wait
        if self.store.state_field(w["field"]) >= w["target"]:
            self._critic_wait = None
            return True
        if now - w["since"] > cfg.critic_wait:
            log.warning("run %s: no critic trained within %.0fs — is `aesrl-queue critic start --run %s` running? "
                        "generation %d evaluates its RL members without training", cfg.run_id, cfg.critic_wait,
                        cfg.run_id, self.gen["g"])
            self._no_critic_gen = self.gen["g"]
            self._critic_wait = None
            return True
        return False

    def _dispatch_members(self) -> None:
        """cemrl: the next member once nothing is in flight; pcemrl: every member not yet out."""
        if self.gen is None:
            return
        members = self.gen["members"]
        pending = [i for i, m in enumerate(members) if not m["job"] and not m["done"] and not m["dropped"]]
        if not pending:
            return
        if self.serial:
            if self.dispatch.inflight:
                return
            pending = pending[:1]
        elif any(members[i]["kind"] == "rl" for i in pending) and not self._critic_ready(members[0]):
            return
        specs, incr = [], {"dispatched": 0, "n_rl": 0, "n_es": 0}
        n0 = self.store.state_field("dispatched")
        for i in pending:
            m = members[i]
            if self.serial and m["kind"] == "rl" and not self._critic_ready(m):
                return
            kind = "es" if self._no_critic_gen == self.gen["g"] else m["kind"]
            m["kind"] = kind
            n = n0 + len(specs) + 1
            m["job"] = f"{self.cfg.run_id}-j{n}"
            m["tries"] += 1
            specs.append({"kind": kind, "version": self.version, "seed": m["seed"], "n": n,
                          "rl_steps": self.gen["rl_steps"] if kind == "rl" else 0, "random": m["random"],
                          "extra": {"generation": self.gen["g"], "member": i}})
            incr["dispatched"] += 1
            incr[f"n_{kind}"] += 1
        # The generation record and the jobs go out together (a restart never loses a member).
        self.r.set(self.store.key("gen"), codec.pack(self.gen))
        self.dispatch.enqueue(specs, incr={k: v for k, v in incr.items() if v})

    # -- telling -----------------------------------------------------------------------------------
    def _member_of(self, job: str) -> int | None:
        for i, m in enumerate(self.gen["members"] if self.gen else []):
            if m["job"] == job:
                return i
        return None

    def _skip(self, entry_id: str, counter: str | None, job: str | None, why: str, retry: bool = True) -> None:
        """Consume an entry without a result for the generation; the member runs again (or is dropped)."""
        pipe = self.r.pipeline()
        if counter:
            self.store.incr(counter, 1, pipe=pipe)
        if job:
            self._release(job, retry)
            self.dispatch.forget([job], pipe=pipe)
            pipe.set(self.store.key("gen"), codec.pack(self.gen))
        self.store.set_state(pipe=pipe, last_result_id=entry_id, updated_at=time.time())
        pipe.execute()
        self.last_id = entry_id
        if why:
            log.warning("run %s: %s", self.cfg.run_id, why)
        self._maybe_tell_without_dropped()

    def _release(self, job: str, retry: bool) -> None:
        i = self._member_of(job)
        if i is None:
            return
        m = self.gen["members"][i]
        m["job"] = ""
        if not retry or m["tries"] >= MAX_TRIES:
            m["dropped"] = True
            log.warning("run %s: member %d of generation %d dropped after %d tries", self.cfg.run_id, i,
                        self.gen["g"], m["tries"])

    def _maybe_tell_without_dropped(self) -> None:
        """A generation whose remaining members were all dropped is told with the ones that returned."""
        if self.gen is None or not all(m["done"] or m["dropped"] for m in self.gen["members"]):
            return
        if sum(m["done"] for m in self.gen["members"]) < self.cfg.population // 2:
            self.store.set_state(status="failed", updated_at=time.time())
            raise RuntimeError(f"run {self.cfg.run_id}: generation {self.gen['g']} lost more than half its members; "
                               "see the failed results (`aesrl-queue status`)")
        pipe = self.r.pipeline()
        self._tell(pipe)
        pipe.execute()
        self._after_tell()

    def _apply(self, entry_id: str, res: Result | None, err: str) -> None:
        cfg = self.cfg
        if res is None:
            return self._skip(entry_id, "rejected", None, f"malformed result {entry_id} rejected: {err}")
        i = self._member_of(res.job)
        if res.job not in self.dispatch.inflight or i is None:
            return self._skip(entry_id, "stale", None, f"result of {res.job} ({res.kind}) is not in flight; dropped")
        if not res.ok:
            return self._skip(entry_id, "failed", res.job, f"job {res.job} failed on {res.worker}: "
                              f"{res.error.splitlines()[0] if res.error else '?'}")
        if res.spec_hash != cfg.spec_hash:
            return self._skip(entry_id, "rejected", res.job, f"result of {res.job} has spec_hash {res.spec_hash}, "
                              f"the run has {cfg.spec_hash}; rejected", retry=False)
        if not finite(res.fitness) or res.length <= 0:
            return self._skip(entry_id, "rejected", res.job, f"result of {res.job} has fitness {res.fitness} "
                              f"and length {res.length}; rejected", retry=False)
        if res.version != self.version:
            # The barrier makes this impossible unless someone else moved the run's version.
            return self._skip(entry_id, "rejected", res.job, f"result of {res.job} used version {res.version}, "
                              f"generation {self.gen['g']} is version {self.version}; evaluating it again")
        try:
            z = self.dispatch.individual(res, self.dists)
        except CodecError as exc:
            return self._skip(entry_id, "rejected", res.job, f"individual of {res.job} unusable: {exc}")
        self.dispatch.note_duration(res.kind, res.duration)
        m = self.gen["members"][i]
        info = self.dispatch.inflight.get(res.job, {})
        m.update(done=True, fitness=res.fitness, len=res.length, ind=res.ind, worker=res.worker)
        if finite(res.f_mu) and res.f_mu_version == self.version:
            m["f_mu"] = res.f_mu
        self.z[i] = z
        self.best = max(self.best, res.fitness)
        f_mus = [mm["f_mu"] for mm in self.gen["members"] if mm["done"] and "f_mu" in mm]
        f_mu = float(np.mean(f_mus)) if f_mus else math.nan

        pipe = self.r.pipeline()
        self.store.incr("results_applied", 1, pipe=pipe)
        self.store.incr(f"{res.kind}_applied", 1, pipe=pipe)
        self.dispatch.forget([res.job], pipe=pipe)
        fields = dict(f_mu=f_mu, f_mu_version=self.version, best_fitness=self.best, last_result_id=entry_id,
                      updated_at=time.time())
        self.store.set_state(pipe=pipe, **{k: v for k, v in fields.items() if finite(v) or k == "last_result_id"})
        told = all(mm["done"] or mm["dropped"] for mm in self.gen["members"])
        mean_before = self.dist.mean
        if told:
            self._tell(pipe)
        else:
            pipe.set(self.store.key("gen"), codec.pack(self.gen))
        steps_now, inter_now = self.r.hmget(self.store.key("state"), ["steps", "interactions"])
        sigma = np.sqrt(self.dist.var)
        now = time.time()
        entry = {"job": res.job, "kind": res.kind, "steps": int(steps_now or 0), "interactions": int(inter_now or 0),
                 "version": self.version + (1 if told else 0), "p": 0.0, "f_z": res.fitness, "f_mu": f_mu,
                 "len": res.length, "t": now, "worker": res.worker, "sigma_mean": float(sigma.mean()),
                 "sigma_min": float(sigma.min()), "sigma_max": float(sigma.max()),
                 "moved": float(np.linalg.norm(self.dist.mean - mean_before)), "duration": res.duration,
                 "random": bool(info.get("random", False)), "rl_steps": res.rl_steps,
                 "generation": self.gen["g"], "member": i, "told": told,
                 "dispatched_at": float(info.get("enqueued_at", 0.0))}
        pipe.xadd(self.store.key("history"), {"d": codec.pack(entry)}, maxlen=cfg.history_max)
        pipe.execute()
        self.last_id = entry_id
        if told:
            self._after_tell()

    def _tell(self, pipe) -> None:
        """Update the distribution from the whole generation, publish the new version, close the generation."""
        cfg = self.cfg
        done = [i for i, m in enumerate(self.gen["members"]) if m["done"]]
        pop = np.stack([self.z[i] for i in done])
        fits = np.array([self.gen["members"][i]["fitness"] for i in done], dtype=np.float64)
        self.dist.tell(pop, fits)
        new_version = self.version + 1
        gen_steps = sum(int(self.gen["members"][i]["len"]) for i in done)
        self.store.publish_dist(new_version, self.dist.mean, self.dist.var, pipe=pipe)
        pipe.set(self.store.key("dist_state"), pack_dist_state(self.dist.state()))
        self.store.set_state(pipe=pipe, version=new_version, generation=self.gen["g"] + 1, prev_gen_steps=gen_steps,
                             last_told_at=time.time())
        pipe.delete(self.store.key("gen"))
        # The previous version is no longer used by any job (the barrier): keep it briefly for readers.
        pipe.expire(self.store.key(f"dist:{self.version}"), 60)
        log.info("run %s: generation %d told (best f(z) %.1f, mean %.1f) -> version %d", cfg.run_id, self.gen["g"],
                 float(fits.max()), float(fits.mean()), new_version)

    def _after_tell(self) -> None:
        self.version += 1
        self.dists.put(self.version, self.dist.mean.copy(), self.dist.var.copy())
        self.dists.prune(self.version, set())
        self.gen = None
        self.z = {}

    def _replace_lost(self) -> None:
        lost = self.dispatch.find_lost()
        if not lost:
            return
        pipe = self.r.pipeline()
        for job, _why in lost:
            self._release(job, retry=True)
        self.dispatch.forget([job for job, _ in lost], pipe=pipe)
        self.store.incr("replaced", len(lost), pipe=pipe)
        if self.gen is not None:
            pipe.set(self.store.key("gen"), codec.pack(self.gen))
        pipe.execute()
        for job, why in lost:
            log.warning("run %s: job %s lost (%s); its member runs again", self.cfg.run_id, job, why)
        self._maybe_tell_without_dropped()
