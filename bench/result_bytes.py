"""What one result costs the Redis primary in a real run of the default `aesrl`: bytes in and out and
Redis CPU per result after the random phase, for this checkout's code and a reference checkout's, on
the same workload one after the other (each a real `aesrl-queue run`: scheduler, critic daemon, RQ
workers, on a redis-server of its own that this script reads INFO from).

Per point: results told after the first RL result, the primary's `total_net_input_bytes` and
`total_net_output_bytes` (INFO stats) and its CPU (`used_cpu_sys` + `used_cpu_user`, INFO cpu) over
the same span, each per result. Prints a table, writes a JSON file.

Usage: python bench/result_bytes.py --reference ../proto [--env Hopper-v5] [--steps 8000]
       [--initial-steps 1000] [--seed 1] [--out bench/results/result-bytes.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from aesrl_queue.redis_server import RedisServer  # noqa: E402
from aesrl_queue.store import CHECKPOINTS, Store  # noqa: E402


def snapshot(client: redis.Redis, store: Store) -> dict[str, float]:
    stats, cpu = client.info("stats"), client.info("cpu")
    state = store.state()
    return {"in": stats["total_net_input_bytes"], "out": stats["total_net_output_bytes"],
            "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), "t": time.monotonic(),
            **{f"{part}_bytes": client.strlen(store.key(CHECKPOINTS[part][0])) for part in ("critic", "optimizer")},
            **{k: int(state.get(k, 0) or 0) for k in ("results_applied", "rl_applied", "es_applied", "steps", "version",
                                                       "critic_version")}}


def commit_of(repo: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    return done.stdout.strip() or "?"


def measure(repo: Path, args: argparse.Namespace, name: str) -> dict[str, Any]:
    """One `aesrl-queue run` of `repo`'s code; the primary's costs per result after the first RL result."""
    with tempfile.TemporaryDirectory(prefix="result-bytes-") as tmp, \
            RedisServer(directory=Path(tmp) / "redis") as server:
        client = redis.Redis.from_url(server.url)
        run_id = f"bytes-{name}"
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("AESRL_REDIS_URL", None)
        cmd = [sys.executable, "-m", "cli.main", "run", "--env", args.env, "--steps", str(args.steps),
               "--initial-steps", str(args.initial_steps), "--seed", str(args.seed), "--workers", str(args.workers),
               "--redis-url", server.url, "--out", tmp, "--run-id", run_id, "--snapshot-every", "0"]
        store = Store(client, run_id)
        first = last = None
        t0 = time.monotonic()
        with open(Path(tmp) / "run.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(0.2)
                try:
                    snap = snapshot(client, store)
                except redis.RedisError:
                    continue
                if first is None and snap["rl_applied"] > 0:
                    first = snap
                if first is not None and snap["results_applied"] > first["results_applied"]:
                    last = snap
        if proc.returncode != 0 or first is None or last is None:
            tail = (Path(tmp) / "run.log").read_text()[-2000:]
            raise SystemExit(f"{name}: the run failed (exit {proc.returncode}) or told no RL result:\n{tail}")
        n = last["results_applied"] - first["results_applied"]
        rl = last["rl_applied"] - first["rl_applied"]
        return {"name": name, "repo": str(repo), "commit": commit_of(repo), "results": n, "rl_share": round(rl / n, 3),
                "steps": last["steps"] - first["steps"], "wall_s": round(time.monotonic() - t0, 1),
                "in_kb_per_result": round((last["in"] - first["in"]) / n / 1024, 1),
                "out_kb_per_result": round((last["out"] - first["out"]) / n / 1024, 1),
                "redis_cpu_ms_per_result": round(1000 * (last["cpu_s"] - first["cpu_s"]) / n, 2),
                # what is written per second or per version rather than per result, over the same span
                "span_s": round(last["t"] - first["t"], 1), "mu_versions": last["version"] - first["version"],
                "critic_versions": last["critic_version"] - first["critic_version"],
                "critic_ckpt_kb": round(last["critic_bytes"] / 1024, 1),
                "optimizer_kb": round(last["optimizer_bytes"] / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="the checkout to compare with (a git worktree)")
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--steps", type=int, default=8000, help="stored steps of each run")
    ap.add_argument("--initial-steps", type=int, default=1000, help="the random phase (short: it is not measured)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "result-bytes.json")
    args = ap.parse_args(argv)
    rows = [measure(args.reference.resolve(), args, "reference"), measure(ROOT, args, "this")]
    print(f"{args.env}, default aesrl, {args.workers} workers, {args.steps} steps "
          f"(random phase {args.initial_steps}), seed {args.seed}; per result after the first RL result:")
    print("| code | commit | results | RL share | KB in | KB out | Redis CPU ms | span s | μ versions | critic versions "
          "| critic ckpt KB (every 10 s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['commit']} | {r['results']} | {r['rl_share']:.2f} | {r['in_kb_per_result']:.1f} | "
              f"{r['out_kb_per_result']:.1f} | {r['redis_cpu_ms_per_result']:.2f} | {r['span_s']:.0f} | {r['mu_versions']} | "
              f"{r['critic_versions']} | {r['critic_ckpt_kb']:.0f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": args.env, "steps": args.steps, "initial_steps": args.initial_steps,
                                    "seed": args.seed, "workers": args.workers, "cpu": platform.processor() or
                                    platform.machine(), "loadavg": os.getloadavg(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
