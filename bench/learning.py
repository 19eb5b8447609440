"""The learning protocols: AES-RL against TD3, CEM-RL and the learners alone, measured once on frozen code.

A protocol fixes everything a reported number depends on; `--declare` writes it, with the commit, the
pinned versions and the whole `pip freeze` (a file beside it), into its results file before the first
cell (docs/performance.md). `--protocol v2` (the default: AES-RL with a current learner, Ant-v5 held
out) writes bench/results/learning-protocol-v2.json; `--protocol v1` is the TD3-based record in
learning-protocol.json. A cell (env, algo, seed) is one `aesrl-queue run` (sb3-td3: bench/sb3_td3.py)
that writes its policy at each milestone itself; each snapshot is scored on the same 10 fixed start
states. Every cell counts: one runs again only after a crash, which stays in the file.

    python bench/learning.py --declare COMMIT      fix the commit (refused once rows exist)
    python bench/learning.py --run --max-hours 8   run pending cells, seed by seed; start none after 8 h
                                                   (several beside each other share the cells)
    python bench/learning.py --report              the tables and P(improvement); writes "summary"
    python bench/learning.py --cells Hopper-v5:aesrl:1   a development or ablation cell (the dev file;
                                                   never a report seed, never a held-out env of v2)
    python bench/learning.py --quick               the machinery on Pendulum-v1 in a temporary folder
    python bench/learning.py --rerun Walker2d-v5:td3:101 --repo ../frozen --protocol v1
                                                   one recorded cell again, side by side
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PINS = {"mujoco": "4.0.0", "gymnasium": "1.4.0"}  # the `bench` extra of setup.cfg pins the same
# aesrl as the first protocol ran it (its default then): TD3, RL jobs of at most 2 000 actor steps, the
# critic on shifted rewards, single ES individuals with a paired μ episode each, ρ* 0.5, critic_lag 5 000.
AESRL_V1 = {"algo": "aesrl", "learner": "td3", "rl_steps_max": 2000, "critic_shift": True, "es_antithetic": False,
            "rl_ratio": 0.5, "critic_lag": 5000}
# aesrl-paper: that with the paper's fitness comparison and RL jobs (docs/decisions.md); it keeps
# critic_lag (on 2 cores the critic falls behind without it: aesrl-no-lag) and one paired f(μ) episode.
PAPER_AESRL = {"r": "paper", "fitness_shift": 0.0, "critic_shift": False, "rl_steps_max": 10_000}
PROTOCOL: dict[str, Any] = {
    "envs": ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"],
    "held_out": ["Walker2d-v5"],  # no default is chosen or changed by looking at it
    "seeds": {"aesrl": [101, 102, 103, 104, 105], "td3": [101, 102, 103, 104, 105],
              "aesrl-paper": [101, 102, 103], "cemrl": [101, 102, 103], "sb3-td3": [101, 102, 103]},
    "algos": {"aesrl": AESRL_V1, "td3": {"algo": "td3"}, "aesrl-paper": {**AESRL_V1, **PAPER_AESRL},
              "cemrl": {"algo": "cemrl"}, "sb3-td3": {"algo": "sb3-td3"}},
    "budget_steps": 100_000,
    # the same for every algorithm: 256-256 networks (our TD3's and the official CEM-RL TD3 config's
    # size; a 400-300 critic trains at ~50 steps/s on one core here) and the paper's random phase
    "shared": {"hidden": [256, 256], "critic_hidden": [256, 256], "initial_steps": 10_000,
               "td3_start_steps": 10_000, "td3_eval_every": 5_000},
    "workers": 2,
    "milestones": {"25": ["steps", 25_000], "50": ["steps", 50_000], "100": ["steps", 100_000],
                   "i25k": ["interactions", 25_000], "i50k": ["interactions", 50_000],
                   "i100k": ["interactions", 100_000]},
    "eval_seeds": list(range(10_000, 10_010)),  # episode i of a snapshot's score resets with seed i
    "development_seeds": [1, 2, 3],
    "statistics": "per env and milestone: mean and IQM over seeds of each run's mean return, 95 % percentile "
                  "bootstrap CIs stratified by algorithm (5 000 resamples), and "
                  "P(aesrl > X) with its CI; ahead/behind only where the CI excludes 0.5",
}
# Ablations: each returns one departure of the first protocol's aesrl to the paper; --cells only, never reported.
ABLATIONS = {"aesrl-no-shift": {**AESRL_V1, "fitness_shift": 0.0, "critic_shift": False},
             "aesrl-rl10k": {**AESRL_V1, "rl_steps_max": 10_000},
             "aesrl-no-lag": {**AESRL_V1, "critic_lag": 0}}
COMPARED = ("td3", "cemrl", "aesrl-paper", "sb3-td3")  # P(aesrl > X)
# The second protocol: the default aesrl, whose every interaction is an individual's stored episode and whose
# RL individuals are its learner's own actor (LEARNER_V2, the default learner); `td3` is the paper's learner;
# every critic is 256-256 as in the first protocol; Ant-v5 is held out. The cells' BLAS variables are unset,
# so a cell picks the kernel of its CPU kind whatever the machine's own settings (a rerun on that kind
# reproduces it). Declared only after the development cells chose the default.
LEARNER_V2 = "crossq-sac"  # CrossQ's critic at 256-256 with SAC's policy: in the published range alone on seeds 1-3
PROTOCOL_V2: dict[str, Any] = {
    "envs": ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"],
    "held_out": ["Ant-v5"],
    "seeds": {"aesrl": [201, 202, 203, 204, 205], LEARNER_V2: [201, 202, 203, 204, 205],
              "td3": [201, 202, 203], "cemrl": [201, 202, 203]},
    "algos": {"aesrl": {"algo": "aesrl", "learner": LEARNER_V2}, LEARNER_V2: {"algo": "td3", "learner": LEARNER_V2},
              "td3": {"algo": "td3", "learner": "td3"},
              "cemrl": {"algo": "cemrl", "learner": LEARNER_V2}},
    "compared": [LEARNER_V2, "td3", "cemrl"],
    # development cells only (--cells, seeds 1-3): the other ES + RL algorithms with the learner
    # aesrl-v1 and its variations: the first protocol's aesrl with the learner (its rows before the default changed)
    "development_algos": {"aesrl-v1": {**AESRL_V1, "learner": LEARNER_V2},
                          "pcemrl": {"algo": "pcemrl", "learner": LEARNER_V2},
                          "acemrl": {"algo": "acemrl", "learner": LEARNER_V2},
                          # aesrl's departures on the shifted rewards, with the learner: the critic on the
                          # environment's rewards; neither the rule nor the critic shifted (the paper)
                          "aesrl-no-critic-shift": {**AESRL_V1, "learner": LEARNER_V2, "critic_shift": False},
                          "aesrl-no-shift": {**AESRL_V1, "learner": LEARNER_V2, "fitness_shift": 0.0,
                                             "critic_shift": False},
                          # RL jobs of at most 250 actor steps: offline, an RL job's actor climbed from μ
                          # for ~250 steps and fell after (bench/results/rl-job-steps-aesrl-crossq-sac-s1.json)
                          "aesrl-rl250": {**AESRL_V1, "learner": LEARNER_V2, "rl_steps_max": 250},
                          # CEM-RL with the paper's learner at protocol v2's sizes: whether the learner is
                          # what holds the ES + RL algorithms back with crossq-sac
                          "cemrl-td3": {"algo": "cemrl", "learner": "td3"}},
    "budget_steps": 100_000,
    # every critic 256-256, the first protocol's size: the protocol runs on 2-core CPU machines, where
    # crossq-sac's published 2048-2048 critic trains ~3 steps/s per core (bench/results/learners-micro-cpu.json),
    # 9 hours per cell; at 256-256 it is the learner measured alone (learners-alone-cpu-crossq-sac256.json)
    "shared": {"hidden": [256, 256], "critic_hidden": [256, 256], "initial_steps": 10_000, "td3_eval_every": 5_000},
    "blas": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None, "OPENBLAS_NUM_THREADS": "1"},
    **{k: PROTOCOL[k] for k in ("workers", "milestones", "eval_seeds", "development_seeds", "statistics")},
}
# --protocol NAME: (the protocol, the stem of its results file in bench/results)
PROTOCOLS = {"v1": (PROTOCOL, "learning-protocol"), "v2": (PROTOCOL_V2, "learning-protocol-v2")}
QUICK = {**PROTOCOL, "envs": ["Pendulum-v1"], "held_out": [], "budget_steps": 1_200,
         "seeds": {"aesrl": [101], "td3": [101], "sb3-td3": [101]},
         "shared": {"hidden": [16, 16], "critic_hidden": [32, 32], "initial_steps": 400, "td3_start_steps": 400,
                    "td3_eval_every": 200, "batch_size": 32, "critic_chunk": 50, "rl_steps_max": 100},
         "milestones": {k: [kind, n * 12 // 1000] for k, (kind, n) in PROTOCOL["milestones"].items()}}
TIMEOUT_MIN = {"full": 240.0, "quick": 3.0}  # a cell still running after this is killed: a crash
CURVE_POINTS, RESAMPLES = 100, 5_000


class Refused(Exception):
    """The bench will not record this row (or this declaration)."""


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)


def dirty_paths(repo: Path) -> list[str]:
    """Tracked files changed or staged outside bench/results/ and runs/ (where the bench writes)."""
    lines = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    paths = [line[3:].split(" -> ")[-1] for line in lines]
    return [p for p in paths if not p.startswith(("bench/results/", "runs/"))]


def git_refusals(repo: Path, declared: str) -> list[str]:
    """Why the tree at `repo` may not record a protocol row for the `declared` commit (empty: it may)."""
    out = []
    if dirty := dirty_paths(repo):
        out.append(f"the tree is dirty: {', '.join(dirty[:5])}")
    head = git(repo, "rev-parse", "HEAD").stdout.strip()
    if head != declared:
        out.append(f"HEAD is {head[:12]}, not the declared commit {declared[:12]}")
    if git(repo, "merge-base", "--is-ancestor", declared, "main").returncode != 0:
        out.append(f"the declared commit {declared[:12]} is not an ancestor of main")
    return out


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("gymnasium", "torch", "numpy", "stable-baselines3"):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    with contextlib.suppress(ImportError):  # the simulator's own version, from mujoco or mujoco-core
        out["mujoco"] = importlib.import_module("mujoco").__version__
    return out


# What decides a numpy episode's last digits besides the code and the pins: the processor and the BLAS
# kernel OpenBLAS picks for it (OPENBLAS_CORETYPE overrides the pick; OPENBLAS_L2_SIZE its blocking).
BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "MKL_CBWR", "ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES")


def machine_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The processor, the BLAS libraries as threadpoolctl reports them (the kernel each picked), numpy's
    CPU features, and the variables of BLAS_VARS as a cell's processes see them (`env`)."""
    import platform

    import numpy

    env = os.environ if env is None else env
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        from threadpoolctl import threadpool_info

        blas = [{k: v for k, v in lib.items() if k in ("internal_api", "version", "architecture", "num_threads",
                                                        "threading_layer", "prefix")} for lib in threadpool_info()]
    except ImportError:
        blas = "threadpoolctl is not installed (pip install threadpoolctl)"
    features = numpy.show_config(mode="dicts").get("SIMD Extensions", {}).get("found", [])
    return {"cpu": model, "cores": os.cpu_count(), "blas": blas, "numpy_simd": features,
            "env": {k: env[k] for k in BLAS_VARS if k in env}}


def cell_machine_facts(protocol: dict[str, Any]) -> dict[str, Any]:
    """machine_facts() as a cell's processes see them: read in a process with the cell's environment."""
    code = "import json, sys; sys.path.insert(0, '.'); from bench.learning import machine_facts; print(json.dumps(machine_facts()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=cell_env(protocol), capture_output=True,
                         text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-500:]}


def rerun(path: Path, item: str, repo: Path, out_dir: Path) -> int:
    """Run one recorded cell again, with the protocol and settings its file declares and the code of
    `repo` (a checkout of the declared commit), into a folder of its own; print its returns on the fixed
    starts beside the recorded ones. 0 when every recorded score is reproduced exactly."""
    data = load(path)
    protocol = data["protocol"]
    if protocol is None:
        raise Refused(f"{path.name} declares no protocol")
    env, algo, seed = item.split(":")
    key = (env, algo, int(seed))
    row = next((r for r in data["rows"] if cell_key(r) == key), None)
    if row is None:
        raise Refused(f"{path.name} holds no row for {item}")
    head = git(repo, "rev-parse", "HEAD").stdout.strip()
    notes = [f"code: {repo} at {head[:12]}" + ("" if head == protocol["commit"] else
                                                f", NOT the declared commit {protocol['commit'][:12]}")]
    versions = package_versions()
    notes += [f"{n} {versions.get(n)} installed, the row ran on {v}" for n, v in row["versions"].items()
              if versions.get(n) != v]
    facts = cell_machine_facts(protocol)
    if row.get("machine"):
        notes += [f"{k}: {facts.get(k)!r} here, {v!r} in the row" for k, v in row["machine"].items() if facts.get(k) != v]
    else:
        notes.append(f"the row records no machine facts; here: {facts['cpu']}, BLAS {facts['blas']}, env {facts['env']}")
    print("\n".join(notes), flush=True)
    folder, wall, outcome = run_cell(*key, protocol, out_dir / "rerun", TIMEOUT_MIN["full"], repo=repo)
    if outcome != "ok":
        print(f"the rerun did not finish: {outcome} (log beside {folder})")
        return 2
    from bench.learning_final import final_policy_scores

    res = read_run(folder, algo, protocol)
    got = res["scores"]
    # a learner alone that stopped within an episode of a milestone is scored there on its final policy,
    # as bench/learning_final.py scored the recorded row
    got.update(final_policy_scores(folder, protocol, got, res["steps"], res["interactions"], score_snapshot))
    same = True
    print(f"{item}, rerun in {folder} ({wall / 60:.1f} min)")
    print(f"{'milestone':>9} {'recorded':>10} {'rerun':>10}  returns on the {len(protocol['eval_seeds'])} starts")
    for name, want in row["scores"].items():
        have = got.get(name)
        if have is None:
            print(f"{name:>9} {want['mean']:10.1f} {'-':>10}  not reached")
            same = False
            continue
        exact = have["returns"] == want["returns"]
        same &= exact
        diff = max(abs(a - b) for a, b in zip(have["returns"], want["returns"], strict=True))
        print(f"{name:>9} {want['mean']:10.1f} {have['mean']:10.1f}  "
              + ("identical" if exact else f"differ, by up to {diff:.1f}")
              + (f" (final policy at {have['at_steps']:,} steps)" if have.get("from") else ""))
    return 0 if same else 1


def row_refusals(row: dict[str, Any], protocol: dict[str, Any]) -> list[str]:
    """Why `row` is not a cell of the declared protocol, or ran on other versions than its pins."""
    out = []
    if row["env"] not in protocol["envs"] or row["algo"] not in protocol["seeds"]:
        out.append(f"{row['env']}:{row['algo']} is not a protocol cell (ablations go to the dev file)")
    elif row["seed"] not in protocol["seeds"][row["algo"]]:
        out.append(f"seed {row['seed']} is not a report seed of {row['algo']} (development seeds go to the dev file)")
    out += [f"{n} {row['versions'].get(n)} is installed, the protocol pins {p}"
            for n, p in protocol["pins"].items() if row["versions"].get(n) != p]
    return out


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text()) if path.exists() else {}
    for key, empty in (("protocol", None), ("rows", []), ("crashes", []), ("summary", {})):
        data.setdefault(key, empty)
    return data


def update(path: Path, change) -> dict[str, Any]:
    """Apply `change(data)` to the file under an exclusive lock, written atomically (a temporary file
    renamed), so that an interrupted write or a second bench beside this one loses nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".json.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(path)
        change(data)
        tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=lambda x: x.item()) + "\n")
        os.replace(tmp, path)
    return data


def add_crash(path: Path, crash: dict[str, Any]) -> None:  # a crash of a cell is part of the record
    update(path, lambda d: d["crashes"].append(crash))


def declare(path: Path, commit: str, repo: Path = ROOT, protocol: dict[str, Any] = PROTOCOL,
            versions: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the protocol block with the full commit and the pins; refused once the file holds rows
    under another declaration, for a commit that is not an ancestor of main, and where the installed
    `versions` (default: this interpreter's) are not the pins, since the freeze records them."""
    full = git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}").stdout.strip()
    if not full:
        raise Refused(f"{commit} is not a commit of {repo}")
    if git(repo, "merge-base", "--is-ancestor", full, "main").returncode != 0:
        raise Refused(f"{full[:12]} is not an ancestor of main")
    versions = package_versions() if versions is None else versions
    if wrong := [f"{n} {versions.get(n)} is installed, the protocol pins {v}" for n, v in PINS.items()
                 if versions.get(n) != v]:
        raise Refused("; ".join(wrong) + " (pip install -e '.[bench]')")
    block = {**protocol, "commit": full, "pins": dict(PINS), "freeze": write_freeze(path)}

    def change(data: dict[str, Any]) -> None:
        if data["rows"] and data["protocol"] != block:
            raise Refused(f"{path.name} holds {len(data['rows'])} rows under its declaration; it is not changed")
        data["protocol"] = block

    return update(path, change)["protocol"]


def write_freeze(path: Path) -> dict[str, str]:
    """`pip freeze` of the interpreter that declares, beside the results file: every installed version,
    not only the pinned ones, for a rerun to install; its name and sha256 go into the declaration."""
    import hashlib

    text = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                          check=True).stdout
    out = path.with_name(path.stem + "-freeze.txt")
    out.write_text(text)
    return {"file": out.name, "sha256": hashlib.sha256(text.encode()).hexdigest(), "python": sys.version.split()[0]}


def record(path: Path, row: dict[str, Any], repo: Path | None = ROOT) -> None:
    """Append a protocol row: refused unless it is a declared cell, on the pinned versions, from a clean
    tree at the declared commit, which main contains (repo None: no git checks, for --quick)."""
    def change(data: dict[str, Any]) -> None:
        protocol = data["protocol"]
        if protocol is None:
            raise Refused(f"{path.name} declares no protocol: run --declare COMMIT first")
        why = row_refusals(row, protocol) + (git_refusals(repo, protocol["commit"]) if repo is not None else [])
        if repo is not None and row.get("commit") != protocol["commit"]:
            why.append(f"the row ran at {row.get('commit')}, the protocol declares {protocol['commit']}")
        if why:
            raise Refused("; ".join(why))
        if any(cell_key(r) == cell_key(row) for r in data["rows"]):
            raise Refused(f"{cell_key(row)} already has its row")
        data["rows"].append(row)

    update(path, change)


def cell_key(r: dict[str, Any]) -> tuple[str, str, int]:
    return (r["env"], r["algo"], int(r["seed"]))


def claimed_cells(path: Path, protocol: dict[str, Any], among: list[tuple[str, str, int]]):
    """The pending cells of `among` in protocol order, each once, each claimed for this process when it is handed out, so that
    several `--run` beside each other share the cells instead of running the same one. A claim lives in
    `<results>.claims.json` (under the results file's lock) until its row or crash is written, or its
    process is gone."""
    claims_path, handed = path.with_name(path.stem + ".claims.json"), set()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def claim(data: dict[str, Any], got: list) -> None:
        claims = json.loads(claims_path.read_text()) if claims_path.exists() else {}
        claims = {k: pid for k, pid in claims.items() if pid != os.getpid() and alive(pid)}
        done = {cell_key(r) for r in data["rows"]}
        for cell in protocol_cells(protocol):
            if cell in among and cell not in done | handed and ":".join(map(str, cell)) not in claims:
                claims[":".join(map(str, cell))] = os.getpid()
                got.append(cell)
                handed.add(cell)
                break
        claims_path.write_text(json.dumps(claims, indent=1) + "\n")

    while True:
        got: list = []
        update(path, lambda d, got=got: claim(d, got))
        if not got:
            return
        yield got[0]


def protocol_cells(protocol: dict[str, Any]) -> list[tuple[str, str, int]]:
    """Every cell, seed by seed (seed 101 of every env and algo first): partial results stay balanced."""
    seeds = sorted({s for ss in protocol["seeds"].values() for s in ss})
    return [(env, algo, seed) for seed in seeds for env in protocol["envs"] for algo in protocol["seeds"]
            if seed in protocol["seeds"][algo]]


def cell_settings(algo: str, protocol: dict[str, Any]) -> dict[str, Any]:  # the shared settings, then the algo's
    return {**protocol["shared"], **(protocol["algos"].get(algo) or protocol.get("development_algos", {}).get(algo)
                                     or ABLATIONS[algo])}


def cell_command(env: str, algo: str, seed: int, protocol: dict[str, Any], folder: Path, cfg_file: Path,
                 repo: Path = ROOT) -> list[str]:
    """The command of one cell (the code of `repo` runs it); every setting but the seed and budget is in
    `cfg_file`."""
    marks = {kind: ",".join(str(n) for k, n in protocol["milestones"].values() if k == kind)
             for kind in ("steps", "interactions")}
    snap = ["--snapshot-steps", marks["steps"], "--snapshot-interactions", marks["interactions"]]
    if algo == "sb3-td3":
        return [sys.executable, str(repo / "bench" / "sb3_td3.py"), "--env", env, "--seed", str(seed), "--steps",
                str(protocol["budget_steps"]), "--out", str(folder), "--config", str(cfg_file),
                "--eval-every", str(protocol["shared"]["td3_eval_every"]), *snap]
    return [sys.executable, "-m", "cli.main", "run", "--config", str(cfg_file), "--seed", str(seed),
            "--steps", str(protocol["budget_steps"]), "--workers", str(protocol["workers"]),
            "--out", str(folder.parent), "--run-id", folder.name, "--snapshot-every", "0", *snap]


def cell_env(protocol: dict[str, Any]) -> dict[str, str]:
    """The environment of a cell's processes: one thread each, no outside Redis, and the protocol's
    `blas` variables set (or, where it names them with None, unset), so the same cell gives the same
    episodes on every machine of a CPU kind whatever that machine's own settings."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("AESRL_REDIS_URL", None)  # every cell starts its own embedded Redis
    for name, value in (protocol.get("blas") or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the cell's process group (the run stops its workers, critic and Redis), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass


def run_cell(env: str, algo: str, seed: int, protocol: dict[str, Any], runs_dir: Path,
             timeout_min: float, repo: Path = ROOT) -> tuple[Path, float, str]:
    """Run one cell in its own process group: (run folder, wall s, "ok" or what went wrong)."""
    folder = runs_dir / env / f"{algo}-s{seed}"
    if folder.exists():  # left by a crashed attempt, which the crashes list records
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in cell_settings(algo, protocol).items() if k != "algo" or algo != "sb3-td3"}
    cfg_file = folder.with_name(folder.name + ".config.json")
    cfg_file.write_text(json.dumps({"env_id": env, **settings} if algo != "sb3-td3" else settings))
    cmd = cell_command(env, algo, seed, protocol, folder, cfg_file, repo)
    env_vars = cell_env(protocol)
    t0 = time.monotonic()
    with open(folder.with_name(folder.name + ".log"), "w") as log:
        print(" ".join(cmd), file=log, flush=True)
        proc = subprocess.Popen(cmd, cwd=repo, env=env_vars, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_min * 60)
            outcome = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            outcome = f"timed out after {timeout_min:g} min"
        except BaseException:  # Ctrl-C or SIGTERM of the bench: take the cell down with it
            kill_group(proc)
            raise
    return folder, time.monotonic() - t0, outcome


def score_snapshot(path: Path, eval_seeds: list[int]) -> dict[str, Any]:
    """The deterministic policy of a snapshot, one episode from each fixed start state."""
    from aesrl_queue.rollout import run_episodes
    from cli.export import load_policy, numpy_actor

    actor = numpy_actor(payload := load_policy(path))
    returns = [float(run_episodes(payload["env_id"], actor, k=1, seed=s, store=False,
                                  env_kwargs=payload["env_kwargs"]).returns[0]) for s in eval_seeds]
    return {"returns": [round(r, 3) for r in returns], "mean": round(float(np.mean(returns)), 3)}


def thin(points: np.ndarray, n: int = CURVE_POINTS) -> np.ndarray:  # at most n rows: means of blocks of rows
    return points if len(points) <= n else np.vstack([b.mean(axis=0) for b in np.array_split(points, n)])


def read_run(folder: Path, algo: str, protocol: dict[str, Any]) -> dict[str, Any]:
    """Scores at each milestone the run reached, its counters and its training-time f(μ) curve
    ([stored steps, env steps, elapsed s, f(μ)], thinned): the curve is not the score."""
    from cli.plot import load_run

    scores = {}
    for key, (kind, n) in protocol["milestones"].items():
        snap = folder / "snapshots" / f"{kind}-{n}.npz"
        if snap.exists():
            with np.load(snap) as npz:
                at = {"at_steps": int(npz["steps"]), "at_interactions": int(npz["needed_interactions"])}
            scores[key] = {**score_snapshot(snap, protocol["eval_seeds"]), **at}
    summary = json.loads((folder / "summary.json").read_text())
    needed_all = algo.startswith("aesrl")  # aesrl's f(μ) episodes enter its rule; td3's, CEM-RL's, SB3's do not
    pts = np.array([[e["steps"], e.get("interactions") or np.nan, e.get("elapsed") or np.nan, e["f_mu"]]
                    for e in load_run(folder).evals], dtype=float).reshape(-1, 4)
    return {"steps": int(summary["steps"]), "env_steps": int(summary["interactions"]),
            "interactions": int(summary["interactions"] if needed_all else summary["steps"]),
            "scores": scores, "curve": [[round(float(v), 2) for v in p] for p in thin(pts)]}


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean (rliable's aggregate_iqm): the mean after trimming a quarter from each end."""
    x = np.sort(np.moveaxis(np.asarray(x), axis, -1), axis=-1)
    k = int(0.25 * x.shape[-1])  # as scipy.stats.trim_mean(x, 0.25) cuts
    return x[..., k:x.shape[-1] - k].mean(axis=-1)


def prob_improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) for a run of each drawn at random, ties counting half (rliable's probability_of_improvement)."""
    x, y = np.moveaxis(np.asarray(x), axis, -1), np.moveaxis(np.asarray(y), axis, -1)
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def interval(stat, samples: list[np.ndarray], seed: int = 0) -> list[float]:
    """[point, low, high]: the statistic and its 95 % percentile bootstrap CI, each sample (an
    algorithm's runs) resampled on its own: the stratified bootstrap of rliable within one env."""
    point = float(stat(*samples))
    if min(len(s) for s in samples) < 2:
        return [point, math.nan, math.nan]
    rng = np.random.default_rng(seed)
    draws = [np.asarray(s)[rng.integers(0, len(s), size=(RESAMPLES, len(s)))] for s in samples]
    low, high = np.percentile(stat(*draws, axis=-1), [2.5, 97.5])
    return [point, float(low), float(high)]


def verdict(p: list[float]) -> str:
    return "ahead" if p[1] > 0.5 else "behind" if p[2] < 0.5 else "level"


def summarise(rows: list[dict[str, Any]], protocol: dict[str, Any]) -> dict[str, Any]:
    """{env: {milestone: {"algos": {algo: {n, mean, iqm}}, "vs": {X: {p, verdict}}}}}; each statistic
    [point, CI low, CI high] over the runs' mean returns."""
    out: dict[str, Any] = {}
    for env in protocol["envs"]:
        for key in protocol["milestones"]:
            by = {a: np.array([r["scores"][key]["mean"] for r in rows if r["env"] == env and r["algo"] == a
                               and key in r["scores"]]) for a in protocol["seeds"]}
            by = {a: x for a, x in by.items() if len(x)}
            if not by:
                continue
            cell = {"algos": {a: {"n": len(x), "mean": interval(np.mean, [x]), "iqm": interval(iqm, [x])}
                              for a, x in by.items()}, "vs": {}}
            for other in protocol.get("compared", COMPARED):
                if "aesrl" in by and other in by:
                    p = interval(prob_improvement, [by["aesrl"], by[other]])
                    cell["vs"][other] = {"p": p, "verdict": verdict(p) if math.isfinite(p[1]) else "n < 2"}
            out.setdefault(env, {})[key] = cell
    return out


def fmt(s: list[float]) -> str:
    return f"{s[0]:.0f}" + (f" [{s[1]:.0f}, {s[2]:.0f}]" if math.isfinite(s[1]) else "")


def report_text(summary: dict[str, Any], protocol: dict[str, Any]) -> str:
    lines = []
    for env, marks in summary.items():
        lines.append(f"\n{env}" + (" (held out)" if env in protocol["held_out"] else ""))
        for key, cell in marks.items():
            kind, n = protocol["milestones"][key]
            where = f"{n:,} stored steps" if kind == "steps" else f"{n:,} needed interactions"
            lines.append(f"  {key:>5} ({where}): " + "; ".join(
                f"{a} n={c['n']} mean {fmt(c['mean'])} IQM {fmt(c['iqm'])}" for a, c in cell["algos"].items()))
            for other, v in cell["vs"].items():
                ci = f" [{v['p'][1]:.2f}, {v['p'][2]:.2f}]" if math.isfinite(v["p"][1]) else ""
                lines.append(f"         P(aesrl > {other}) = {v['p'][0]:.2f}{ci}: {v['verdict']}")
    return "\n".join(lines) if lines else "no rows yet"


def report(path: Path) -> str:
    data = load(path)
    if data["protocol"] is None:
        raise Refused(f"{path.name} declares no protocol")
    summary = summarise(data["rows"], data["protocol"])
    update(path, lambda d: d.update(summary=summary))
    hours = sum(r["wall_s"] for r in data["rows"]) / 3600
    return (report_text(summary, data["protocol"])
            + f"\n\n{len(data['rows'])} rows, {len(data['crashes'])} crashes, {hours:.1f} h of cells "
              f"(wall clock is recorded, never compared: cells shared the machine) at {data['protocol']['commit']}")


def run_cells(cells, protocol: dict[str, Any], path: Path, runs_dir: Path, max_hours: float | None,
              timeout_min: float, repo: Path | None, dev: bool, total: int | None = None) -> int:
    """Run the cells in order, recording a row (or a crash) after each; start none after max_hours.
    `cells` may be a generator that claims each cell as it is asked for (`claimed_cells`)."""
    t0, failed = time.monotonic(), 0
    total = len(cells) if total is None else total
    pending = iter(cells)
    for i in itertools.count(1):
        # the clock before the next cell: a claiming generator claims the cell it hands out
        if max_hours is not None and time.monotonic() - t0 >= max_hours * 3600:
            print(f"--max-hours {max_hours:g} reached after {i - 1} cells", flush=True)
            break
        if (cell := next(pending, None)) is None:
            break
        env, algo, seed = cell
        commit = git(repo or ROOT, "rev-parse", "HEAD").stdout.strip()
        print(f"[{i}/{total}] {env}:{algo}:{seed} ...", end=" ", flush=True)
        base = {"env": env, "algo": algo, "seed": seed, "commit": commit, "versions": package_versions(),
                "machine": cell_machine_facts(protocol),
                "loadavg": [[round(x, 2) for x in os.getloadavg()]]}  # at the start; the end is added
        try:
            folder, wall, outcome = run_cell(env, algo, seed, protocol, runs_dir, timeout_min)
            if outcome == "ok":
                try:
                    got = read_run(folder, algo, protocol)
                except Exception as exc:  # noqa: BLE001 - an unreadable run folder is a crash of the cell
                    outcome = f"no result: {type(exc).__name__}: {exc}"
        except BaseException as exc:  # the bench itself was stopped: the cell's run is lost and recorded
            add_crash(path, {**base, "outcome": f"interrupted ({type(exc).__name__})", "t": time.time()})
            raise
        if outcome != "ok":
            failed += 1
            add_crash(path, {**base, "outcome": outcome, "wall_s": round(wall, 1), "t": time.time()})
            print(f"CRASH ({outcome}); recorded, the cell stays pending", flush=True)
            continue
        row = {**base, "settings": cell_settings(algo, protocol), "budget_steps": protocol["budget_steps"], **got,
               "wall_s": round(wall, 1), "cores": os.cpu_count()}
        row["loadavg"] = base["loadavg"] + [[round(x, 2) for x in os.getloadavg()]]
        if dev:
            row["dirty"] = bool(dirty_paths(repo or ROOT))
            update(path, lambda d, r=row: d["rows"].append(r))
        else:
            record(path, row, repo)
        print("ok: " + ", ".join(f"{k} {v['mean']:.0f}" for k, v in got["scores"].items()), flush=True)
    return 1 if failed else 0


def check_start(data: dict[str, Any], path: Path, protocol: dict[str, Any] = PROTOCOL) -> None:
    """Refuse to start cells that could not be recorded: no declaration, other code, a dirty tree, other versions."""
    if data["protocol"] is None:
        raise Refused(f"{path.name} declares no protocol: run --declare COMMIT first")
    declared = {k: v for k, v in data["protocol"].items() if k not in ("commit", "pins", "freeze")}
    if declared != json.loads(json.dumps(protocol)):
        raise Refused("this code's PROTOCOL differs from the declared one")
    versions = package_versions()
    why = git_refusals(ROOT, data["protocol"]["commit"]) + [f"{n} {versions.get(n)} is installed, the protocol pins "
                                                           f"{p}" for n, p in data["protocol"]["pins"].items() if versions.get(n) != p]
    if why:
        raise Refused("; ".join(why))


def parse_cells(text: str, protocol: dict[str, Any] = PROTOCOL) -> list[tuple[str, str, int]]:
    cells = []
    envs = [e for e in protocol["envs"] if e not in protocol["held_out"] or protocol is PROTOCOL]
    for item in filter(None, (t.strip() for t in text.split(","))):
        env, algo, seed = item.split(":")
        known = [*protocol["algos"], *protocol.get("development_algos", {}), *ABLATIONS]
        if env not in envs or algo not in known:
            raise SystemExit(f"--cells: {item!r}: envs {envs}, algos {known}")
        if int(seed) in protocol["seeds"].get(algo, ()):  # a report cell runs once, with --run
            raise SystemExit(f"--cells: {item!r} is a report cell: `--run` runs it, into the report file")
        cells.append((env, algo, int(seed)))
    return cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--declare", metavar="COMMIT", help="declare the protocol at COMMIT (an ancestor of main)")
    ap.add_argument("--run", action="store_true", help="run the pending protocol cells")
    ap.add_argument("--max-hours", type=float, default=None, help="start no new cell after this many hours")
    ap.add_argument("--cells", default="", help="env:algo:seed,... ablation or development cells (dev file)")
    ap.add_argument("--report", action="store_true", help="print the report and write it into the summary")
    ap.add_argument("--quick", action="store_true", help="Pendulum-v1, tiny budget, temporary folder")
    ap.add_argument("--rerun", metavar="ENV:ALGO:SEED", help="run one recorded cell again into OUT/rerun and "
                    "print its returns beside the recorded ones (exit 0 when all are identical)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="--rerun: the checkout whose code runs the cell "
                    "(a worktree of the declared commit; default this one)")
    ap.add_argument("--file", type=Path, default=None, help="--rerun: the results file (default the report file)")
    ap.add_argument("--out-dir", type=Path, default=None, help="results folder (default bench/results)")
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="v2",
                    help="v1: the TD3-based record (learning-protocol.json); v2: the current one (learning-protocol-v2.json)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds through run_cell
    out = args.out_dir or (Path(tempfile.mkdtemp(prefix="aesrl-protocol-")) if args.quick else RESULTS)
    chosen, stem = PROTOCOLS[args.protocol]
    if args.quick:
        stem = "learning-protocol"
    path, runs_dir = out / f"{stem}.json", out / stem
    print(f"results: {path}", flush=True)
    try:
        if args.rerun:
            return rerun(args.file or path, args.rerun, args.repo.resolve(), out)
        if args.declare:
            print(json.dumps(declare(path, args.declare, protocol=chosen), indent=1))
        elif args.cells:
            return run_cells(parse_cells(args.cells, chosen), chosen, out / f"{stem}-dev.json",
                             out / f"{stem}-dev", args.max_hours, TIMEOUT_MIN["full"], ROOT, dev=True)
        elif args.run or args.quick:
            protocol = QUICK if args.quick else chosen
            if args.quick:  # the machinery only: the commit as it is, the installed versions as the pins
                block = {**QUICK, "commit": git(ROOT, "rev-parse", "HEAD").stdout.strip(),
                         "pins": {n: package_versions().get(n) for n in PINS}}
                update(path, lambda d: d.update(protocol=block))
            data = load(path)
            if not args.quick:
                check_start(data, path, protocol)
            done = {cell_key(r) for r in data["rows"]}
            cells = [c for c in protocol_cells(protocol) if c not in done]
            print(f"{len(done)} cells recorded, {len(cells)} pending, {len(data['crashes'])} crashes so far", flush=True)
            if args.quick and importlib.util.find_spec("stable_baselines3") is None:
                print("stable-baselines3 is not installed: sb3-td3 left out", flush=True)
                cells = [c for c in cells if c[1] != "sb3-td3"]
            code = run_cells(claimed_cells(path, protocol, cells), protocol, path, runs_dir, args.max_hours,
                             TIMEOUT_MIN["quick" if args.quick else "full"], None if args.quick else ROOT, dev=False,
                             total=len(cells))
            if args.quick:
                print(report(path))
            return code
        else:
            print(report(path)) if args.report else ap.print_help()
    except Refused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
