"""The actor against its Polyak average, in `td3` runs of a learner that publishes one (crossq-sac).

Such a run evaluates and publishes a Polyak average of its actor (the learner's `publish_average`);
training is the same as without it (the average only reads the actor), so one run holds both policies:
its checkpoint carries the actor ("actor") and the average ("actor_avg").

`probe` reads every running cell's checkpoint under --runs (the cells' embedded Redis servers, found by
their working directories) every --every seconds and scores both policies deterministically on fixed
start states, one JSON line per cell and look. `final` scores the finished runs' last actor and last
average on the learning protocol's 10 fixed start states (its 100 000-step column). `falls` reads
probe lines (a probe file, or a results file that keeps them under "probe") and prints, per cell, the
mean of each policy's probes from --from steps and its falls: probes below half the median of their
four neighbours (two before, two after), a policy that drops and comes back.

    python bench/actor_average.py probe --runs runs/learners [--every 60] [--starts 10000,10001,10002] --out FILE
    python bench/actor_average.py final RUN_FOLDER [RUN_FOLDER ...] [--out FILE]
    python bench/actor_average.py falls PROBE_FILE [--from 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def score(cfg, params, starts: list[int]) -> list[float]:
    """The deterministic policy `params` of `cfg`'s actor, one episode from each start state."""
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.rollout import run_episodes

    actor = NetSpec.from_config(cfg).make_numpy_actor()
    actor.set_params(params)
    return [round(float(run_episodes(cfg.env_id, actor, k=1, seed=s, store=False,
                                     env_kwargs=cfg.env_kwargs).returns[0]), 1) for s in starts]


def both(cfg, ckpt: dict[str, Any], starts: list[int]) -> dict[str, Any]:
    return {"steps": int(ckpt["total"]), "actor": score(cfg, ckpt["actor"], starts),
            "avg": score(cfg, ckpt["actor_avg"], starts)}


def running_cells(runs: Path) -> dict[str, int]:
    """{"ENV/RUN_ID": port} of the redis-server processes whose working directory is a cell's redis/
    under runs (a cell's folder is runs/ENV/RUN_ID, its run id the folder's name)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            # redis-server rewrites its title to "PATH HOST:PORT", in one argument or several
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"redis-server") and cwd.name == "redis" and runs.resolve() in cwd.parents:
            addr = next((c.decode() for c in cmd[1:] if c.startswith(b"127.0.0.1:")), None)
            if addr:
                out[f"{cwd.parent.parent.name}/{cwd.parent.name}"] = int(addr.rsplit(":", 1)[1])
    return out


def probe(runs: Path, every: float, starts: list[int], out: Path) -> None:
    from aesrl_queue.connection import connect
    from aesrl_queue.store import Store

    seen: dict[str, int] = {}
    while cells := running_cells(runs):
        t0 = time.monotonic()
        for cell, port in sorted(cells.items()):
            try:
                store = Store(connect(f"redis://127.0.0.1:{port}/0"), cell.rsplit("/", 1)[1])
                ckpt = store.load_checkpoint("td3")
                cfg = store.config()
            except Exception:  # noqa: BLE001 - the cell ended between the listing and the read
                continue
            if ckpt is None or "actor_avg" not in ckpt or seen.get(cell) == int(ckpt["total"]):
                continue
            seen[cell] = int(ckpt["total"])
            with out.open("a") as f:
                f.write(json.dumps({"cell": cell, "t": round(time.time(), 1), **both(cfg, ckpt, starts)}) + "\n")
        time.sleep(max(0.0, every - (time.monotonic() - t0)))


def final_one(folder: str, starts: list[int]) -> dict[str, Any]:
    """The last checkpoint of a finished run folder (read from a copy of its Redis data), both policies."""
    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import folder_copy
    from aesrl_queue.store import Store

    with folder_copy(Path(folder)) as server:
        store = Store(connect(server.url), Path(folder).name)
        cfg, ckpt = store.config(), store.load_checkpoint("td3")
    got = both(cfg, ckpt, starts)
    return {"cell": Path(folder).name, "env": cfg.env_id, **got,
            "actor_mean": round(sum(got["actor"]) / len(starts), 1), "avg_mean": round(sum(got["avg"]) / len(starts), 1)}


def falls(values: list[float]) -> int:
    """Probes below half the median of their four neighbours (two each side; fewer at the ends)."""
    import statistics

    n = 0
    for i, v in enumerate(values):
        around = values[max(0, i - 2):i] + values[i + 1:i + 3]
        if len(around) >= 2 and v < 0.5 * statistics.median(around):
            n += 1
    return n


def read_probes(path: Path) -> list[dict[str, Any]]:
    """Probe lines: a probe file (one JSON line per probe), or a results file that keeps them under "probe"."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # more than one line: a probe file
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return data["probe"] if "probe" in data else [data]


def falls_table(probes: list[dict[str, Any]], since: int) -> list[dict[str, Any]]:
    """Per cell, in step order: each policy's mean over the probes from `since` steps, and its falls
    over all of the cell's probes from `since` (each probe's value: the mean of its starts)."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for p in probes:
        by_cell.setdefault(p["cell"], []).append(p)
    rows = []
    for cell, ps in sorted(by_cell.items()):
        ps = sorted((p for p in ps if p["steps"] >= since), key=lambda p: p["steps"])
        if not ps:
            continue
        mean = {k: [sum(p[k]) / len(p[k]) for p in ps] for k in ("avg", "actor")}
        rows.append({"cell": cell, "probes": len(ps), "avg_mean": round(sum(mean["avg"]) / len(ps), 1),
                     "actor_mean": round(sum(mean["actor"]) / len(ps), 1),
                     "avg_falls": falls(mean["avg"]), "actor_falls": falls(mean["actor"])})
    return rows


def main(argv: list[str] | None = None) -> int:
    from bench import learning

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--every", type=float, default=60.0)
    p.add_argument("--starts", default="10000,10001,10002")
    p.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("final")
    f.add_argument("folders", nargs="+")
    f.add_argument("--out", type=Path)
    fl = sub.add_parser("falls")
    fl.add_argument("probes", type=Path)
    fl.add_argument("--from", dest="since", type=int, default=50_000, help="first stored step counted")
    args = ap.parse_args(argv)
    if args.cmd == "falls":
        rows = falls_table(read_probes(args.probes), args.since)
        print(f"{'cell':48} {'probes':>6} {'mean avg':>9} {'mean actor':>10} {'falls avg':>9} {'falls actor':>11}")
        for r in rows:
            print(f"{r['cell']:48} {r['probes']:>6} {r['avg_mean']:>9.0f} {r['actor_mean']:>10.0f} "
                  f"{r['avg_falls']:>9} {r['actor_falls']:>11}")
        return 0
    if args.cmd == "probe":
        probe(args.runs, args.every, [int(s) for s in args.starts.split(",")], args.out)
        return 0
    starts = list(learning.PROTOCOL["eval_seeds"])
    with ProcessPoolExecutor(max_workers=min(len(args.folders), os.cpu_count() or 1)) as pool:
        rows = list(pool.map(final_one, args.folders, [starts] * len(args.folders)))
    print(f"{'cell':40} {'steps':>7} {'actor':>8} {'average':>8}   (mean return on the protocol's {len(starts)} fixed starts)")
    for r in rows:
        print(f"{r['cell']:40} {r['steps']:>7} {r['actor_mean']:>8.0f} {r['avg_mean']:>8.0f}")
    if args.out:
        args.out.write_text(json.dumps({"starts": starts, "cells": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
