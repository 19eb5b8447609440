"""Follow a live HalfCheetah run's μ: on every new version, one deterministic episode of it.

    python bench/posture_watch.py --redis-url redis://127.0.0.1:PORT/0 --run RUN_ID --out watch.jsonl

Each line: {"t", "steps", "version", "f_mu" (the run's own estimate), "return", "turned_over" (share of
the episode's steps on its back), "speed"}. It stops when the run's Redis goes away (the run ended).
`bench/learning.py` records the final policy's posture of every HalfCheetah cell (`final_posture`);
this shows when, during a run, μ turns over and back (docs/performance.md §3, the sixteenth sitting).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aesrl_queue.codec import CodecError  # noqa: E402
from aesrl_queue.nets import NetSpec  # noqa: E402
from aesrl_queue.store import Store  # noqa: E402
from bench.learning import posture_of  # noqa: E402


def watch(url: str, run_id: str, out: Path, every: float = 3.0, seed: int = 123) -> int:
    client = redis.Redis.from_url(url, socket_timeout=30)
    store = Store(client, run_id)
    lines, last = 0, -1
    try:
        while not store.exists():
            time.sleep(1)
        cfg = store.config()
        actor = NetSpec.from_config(cfg).make_numpy_actor()
        with open(out, "a") as fh:
            while True:
                version = store.current_version()
                if version != last:
                    try:
                        mu, _var = store.read_dist(version)
                    except CodecError:  # not written yet, or already replaced by a newer one: look again
                        time.sleep(0.2)
                        continue
                    state = store.state()
                    actor.set_params(mu)
                    p = posture_of(actor, cfg.env_id, dict(cfg.env_kwargs or {}), episodes=1, seed=seed)
                    fh.write(json.dumps({"t": time.time(), "steps": state.get("steps"), "version": version,
                                         "f_mu": state.get("f_mu"), **p}) + "\n")
                    fh.flush()
                    lines, last = lines + 1, version
                time.sleep(every)
    except (redis.ConnectionError, redis.TimeoutError):  # the run ended and took its Redis along
        pass
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--run", required=True, help="the run id")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines are appended here")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between looks at the run's version")
    a = ap.parse_args(argv)
    print(f"{watch(a.redis_url, a.run, a.out, a.every)} versions of μ watched; {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
