"""The CLI as a researcher lives with it (issue 16): run ids never overwritten, children that die
with `aesrl-queue run` (kill -9, a closed pipe), a resume that applies nothing twice, one-line
errors, a progress line that fits 80 columns, and a plain `rq worker` named as the cause.

Everything runs real processes: `aesrl-queue run` with its embedded Redis, `rq worker`, a
private redis-server per test.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aesrl_queue.config import RunConfig
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from tests.conftest import ROOT, child_env, descendants, wait_for
from tests.faults import check_exactly_once, pid_gone

AQ = [sys.executable, "-m", "cli.main"]
SMALL = ["--env", "Pendulum-v1", "--algo", "es", "--steps", "600", "--workers", "1", "--hidden", "8,8"]


def aq(*args: str, timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*AQ, *args], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=timeout, **kw)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    """The single error line of a failed command (and nothing that looks like a traceback)."""
    text = out.stderr.strip()
    assert "Traceback" not in text and "Traceback" not in out.stdout, text
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def processes_mentioning(text: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and not pid_gone(int(d.name)):
                found.append(cmd)
    return found


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One finished local run, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("runs")
    res = aq("run", *SMALL, "--run-id", "first", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    return out / "first"


# -- run ids ------------------------------------------------------------------------------------------
def test_a_reused_run_id_is_refused_and_the_first_run_is_untouched(first_run):
    before = digest(first_run)
    assert {"config.json", "metrics.jsonl", "policy.npz", "summary.json"} <= set(before)
    out = aq("run", *SMALL, "--steps", "400", "--run-id", "first", "--out", str(first_run.parent))
    assert out.returncode == 2
    line = one_line_error(out)
    assert "already exists" in line and "--resume" in line and "--force" in line, line
    assert digest(first_run) == before


def test_status_reads_a_finished_local_run_from_its_folder_and_leaves_it_as_it_was(first_run):
    before = digest(first_run)
    summary = json.loads((first_run / "summary.json").read_text())
    out = aq("status", "--run", str(first_run))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("run first  (es on Pendulum-v1)  status: finished"), out.stdout
    assert f"steps {summary['steps']:,}/600" in out.stdout, out.stdout
    out = aq("status", "--run", str(first_run), "--json")
    assert out.returncode == 0, out.stderr
    numbers = json.loads(out.stdout)
    assert numbers["results_applied"] == summary["results_applied"] and numbers["status"] == "finished"
    assert digest(first_run) == before


@pytest.mark.slow
def test_the_next_commands_of_the_summary_work_in_the_shell_the_run_was_started_from(tmp_path):
    """The quickstart's shell has no .venv on PATH (`./scripts/aesrl-queue run`): the closing `next`
    line names ./scripts/aesrl-queue there, and the plain name in an activated one; the plot command
    it prints, pasted into the same shell, writes the figure."""
    venv_bin = str(Path(sys.executable).parent)
    bare = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not shutil.which("aesrl-queue", path=d) and d != venv_bin]
    for shell, path, name in (("plain", os.pathsep.join(bare), "./scripts/aesrl-queue"),
                              ("activated", os.pathsep.join([venv_bin, *bare]), "aesrl-queue")):
        env = dict(child_env(), PATH=path)
        folder = tmp_path / shell / "nx"
        res = subprocess.run([*AQ, "run", *SMALL, "--steps", "300", "--run-id", "nx", "--out", str(folder.parent)],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        nexts = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("next ")]
        assert len(nexts) == 1, res.stdout
        commands = [c.strip() for c in nexts[0][len("next"):].split("   |   ")]
        assert all(c.startswith(f"{name} ") for c in commands) and "pip install" not in nexts[0], (shell, commands)
        plot = next(c for c in commands if " plot " in c)
        done = subprocess.run(["bash", "-c", plot], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert done.returncode == 0 and (folder / "curves.png").exists(), (shell, plot, done.stderr[-2000:])


@pytest.mark.slow
def test_a_run_too_short_to_move_mu_says_why_and_blames_no_rl_jobs(tmp_path):
    """A budget no larger than the random-action phase: μ stays at v0. The summary says why, and the
    RL share, judged after that phase (where no result is), draws no warning of failed or held jobs."""
    res = aq("run", "--env", "AesrlNull-v0", "--steps", "1500", "--initial-steps", "1500", "--workers", "2",
             "--hidden", "8,8", "--critic-hidden", "16,16", "--run-id", "short", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())
    assert summary["results_applied"] >= 10 and summary["failed"] == 0, summary
    assert summary["warnings"] == [
        "μ did not move (still v0): the whole run was the random-action phase (1,500 of its 1,500 stored steps; "
        "initial_steps 1,500), whose results do not move μ: give it a budget well above initial_steps"], summary
    assert "warning          μ did not move (still v0)" in res.stdout, res.stdout


def test_a_run_says_each_thing_once_and_the_size_of_its_folder(tmp_path):
    """No timestamped log line beside the launcher's own (it said where the embedded Redis is twice),
    and the summary's run folder line gives its size and how much of it is the Redis data."""
    res = aq("run", *SMALL, "--steps", "300", "--run-id", "once", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    stamped = [ln for ln in res.stderr.splitlines() if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ln)]
    assert stamped == [], stamped
    assert sum("redis-server" in ln for ln in res.stderr.splitlines()) == 1, res.stderr
    folder = tmp_path / "once"
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    data = sum(p.stat().st_size for p in (folder / "redis").rglob("*") if p.is_file())
    line = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("run folder"))
    assert f"({total / 1e6:,.1f} MB, {data / 1e6:,.1f} MB of it redis/, kept for --resume)" in line, (line, total, data)
    # the last progress line names μ's version apart from the results, whose counts add up
    summary = json.loads((folder / "summary.json").read_text())
    last = [ln for ln in res.stderr.splitlines() if ln.startswith("f(μ)~")][-1]
    assert (f"results es {summary['es_applied']} rl {summary['rl_applied']}" in last
            and summary["es_applied"] + summary["rl_applied"] == summary["results_applied"]), (last, summary)
    assert re.search(r"μ v\d+  results", last), last
    # the three numbers that could each pass for "the final f(μ)" say which they are
    for key, note in (("f_mu_first", "mean of the first tenth"), ("f_mu_last", "mean of the last tenth"),
                      ("f_mu_final", "the last estimate (one episode, or an ES pair")):
        line = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith(key))
        assert f"{summary[key]:,.1f}  ({note}" in line, line


def test_scheduler_start_refuses_an_existing_run_id_and_contradicting_options(redis_url, client, tmp_path):
    cfg = RunConfig.from_preset("Pendulum-v1", algo="aesrl", run_id="dist-1", hidden=(8, 8), total_steps=4000).resolve()
    Store(client, "dist-1").write_config(cfg)
    out = aq("scheduler", "start", "--redis-url", redis_url, "--env", "HalfCheetah-v5", "--algo", "es",
             "--run-id", "dist-1")
    assert out.returncode == 2 and "already exists" in one_line_error(out), out.stderr
    for extra, named in ((["--algo", "cemrl"], "--algo cemrl"), (["--env", "HalfCheetah-v5"], "--env HalfCheetah-v5"),
                         (["--hidden", "16,16"], "--hidden 16,16")):
        out = aq("scheduler", "start", "--redis-url", redis_url, "--run", "dist-1", *extra)
        assert out.returncode == 2, out.stderr
        line = one_line_error(out)
        assert named in line and "aesrl on Pendulum-v1" in line, line
    assert Store(client, "dist-1").config().algo == "aesrl"  # nothing changed
    # --force says what it deletes, then starts over (stopped at once: no workers are needed for that).
    proc = subprocess.Popen([*AQ, "scheduler", "start", "--redis-url", redis_url, "--env", "Pendulum-v1",
                             "--algo", "es", "--run-id", "dist-1", "--force", "--steps", "1000"],
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        wait_for(lambda: Store(client, "dist-1").exists() and Store(client, "dist-1").config().algo == "es", 60,
                 what="the forced new run")
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert "--force: deleted run dist-1" in err, err


# -- processes: kill -9, resume, broken pipe ----------------------------------------------------------
SLEEPY = ["--env", "AesrlSleep-v0", "--env-kwargs", '{"episode_len": 50, "mean_s": 0.25}', "--algo", "es",
          "--workers", "2", "--seed", "5"]


@pytest.mark.slow
def test_kill9_of_run_ends_its_children_and_resume_finishes_exactly_once(tmp_path):
    out = tmp_path / "runs"
    err = open(tmp_path / "run.err", "w")  # noqa: SIM115
    launcher = subprocess.Popen([*AQ, "run", *SLEEPY, "--steps", "2500", "--run-id", "k9", "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=err, env=child_env(), cwd=ROOT)
    try:
        def url():
            m = re.search(r"embedded Redis on (redis://\S+)", (tmp_path / "run.err").read_text())
            return m.group(1) if m else None

        wait_for(url, 60, what="the embedded Redis")
        import redis

        r = redis.Redis.from_url(url())
        wait_for(lambda: int(r.hget("aesrl:k9:state", "results_applied") or 0) >= 4, 120,
                 what="a few applied results", on_fail=lambda: (tmp_path / "run.err").read_text())
        kids = descendants(launcher.pid)
        assert len(kids) >= 4, kids  # redis-server, 2 workers and the scheduler (es has no critic)
        launcher.kill()
        launcher.wait(10)
        t0 = time.monotonic()
        wait_for(lambda: all(pid_gone(p) for p in kids), 60, interval=0.05,
                 what=f"the children of the killed launcher to exit ({kids})")
        print(f"children gone {time.monotonic() - t0:.2f}s after kill -9")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        err.close()
    # The run folder resumes: the budget is finished, nothing applied twice.
    res = aq("run", "--resume", str(out / "k9"), "--workers", "2", "--env", "AesrlSleep-v0", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ignored (the run's own settings): --env" in res.stderr, res.stderr[-2000:]
    summary = json.loads((out / "k9" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] >= 2500, summary
    with RedisServer(directory=out / "k9" / "redis", appendonly=True) as server:
        import redis

        client = redis.Redis.from_url(server.url)
        checked = check_exactly_once(client, Store(client, "k9"))
        assert checked["state"]["steps"] == summary["steps"]
    lines = (out / "k9" / "metrics.jsonl").read_text().splitlines()
    jobs = [json.loads(ln)["job"] for ln in lines if '"type": "update"' in ln]
    assert len(jobs) == len(set(jobs)) == summary["results_applied"]


@pytest.mark.slow
def test_a_closed_pipe_does_not_stop_the_run_or_its_clean_up(tmp_path):
    out = tmp_path / "runs"
    cmd = " ".join([*AQ, "run", *SMALL, "--run-id", "piped", "--out", str(out)])
    res = subprocess.run(["bash", "-c", f"{cmd} 2>&1 | head -2; echo \"launcher ${{PIPESTATUS[0]}}\""],
                         capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=180)
    port = re.search(r"embedded Redis on redis://127\.0\.0\.1:(\d+)", res.stdout)
    assert port, res.stdout
    assert "launcher 0" in res.stdout, res.stdout
    for name in ("policy.npz", "summary.json", "config.json", "metrics.jsonl"):
        assert (out / "piped" / name).is_file(), name
    assert json.loads((out / "piped" / "summary.json").read_text())["status"] == "finished"
    assert not processes_mentioning(f"127.0.0.1:{port.group(1)}")


# -- one-line errors ----------------------------------------------------------------------------------
@pytest.fixture()
def http_url():
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    server.shutdown()


def test_errors_are_one_line_and_evaluate_reads_run_folders(first_run, tmp_path, http_url):
    # The run gives up on an unreachable Redis and exits (aq's 180 s limit only catches a hang).
    out = aq("run", *SMALL, "--redis-url", "redis://127.0.0.1:1/0", "--out", str(tmp_path / "runs"))
    assert out.returncode == 2 and "cannot reach Redis" in one_line_error(out)
    assert not (tmp_path / "runs").exists()  # no empty run folder
    for cmd in ("runs", "status"):
        out = aq(cmd, "--redis-url", http_url)
        assert out.returncode == 2, out.stderr
        assert "does not answer as Redis" in one_line_error(out)
    readme = str(ROOT / "README.md")
    out = aq("export", readme, "-o", str(tmp_path / "x.pt"))
    assert out.returncode == 2 and "not a policy.npz" in one_line_error(out)
    out = aq("evaluate", readme)
    assert out.returncode == 2 and "not a policy file" in one_line_error(out)
    for source in (first_run, first_run / "policy.npz"):
        out = aq("evaluate", str(source), "--episodes", "2", "--json")
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        assert res["env_id"] == "Pendulum-v1" and len(res["returns"]) == 2 and np.isfinite(res["mean"])


# -- progress -----------------------------------------------------------------------------------------
def test_progress_line_fits_80_columns_with_f_mu_first():
    from aesrl_queue.progress import Phase, Snapshot
    from cli.launch import PLAIN_WIDTH, progress_line

    cfg = RunConfig.from_preset("Pendulum-v1", run_id="p", total_steps=40_000, initial_steps=2000).resolve()
    st = {"steps": 12_600, "f_mu": -1263.37, "version": 123456, "es_applied": 99999, "rl_applied": 88888,
          "critic_version": 0, "status": "running"}
    phase = Phase(cfg)
    label = phase.label(st, now=100.0)
    assert phase.label(st, now=112.0) == "waiting for critic 12 s"

    def snap(status="running", rate=648.0, phase_text=""):
        return Snapshot(steps=12_600, total_steps=40_000, status=status, f_mu=-1263.37, f_mu_last=-1000.0, rate=rate,
                        eta=27_400 / rate, elapsed=3725.0, phase=phase_text, version=123456, es_applied=99999,
                        rl_applied=88888, critic_version=0, state=st)

    for width in (60, 80, 120):
        line = progress_line(snap(phase_text=phase.label(st, now=112.0)), width=width)
        assert len(line) <= width and line.startswith("f(μ)~ -1263.4"), line
        assert "12,600/40,000" in line, line
        assert width < 80 or "waiting for critic 12 s" in line, line
    assert "ETA 0m42s" in progress_line(snap(), 120)  # 27,400 steps left at 648 steps/s
    # A problem with its command is cut, never dropped, on a narrow terminal; a log line holds it whole.
    problem = "no critic: aesrl-queue critic start --run nc --redis-url redis://127.0.0.1:40123/0"
    line = progress_line(snap(phase_text=problem), width=80)
    assert len(line) <= 80 and "12,600/40,000" in line and "no critic: aesrl-queue critic start" in line, line
    assert progress_line(snap(phase_text=problem), width=PLAIN_WIDTH).endswith(problem)
    assert label.startswith("waiting for critic")
    assert Phase(cfg).label(dict(st, steps=100)) == "random actions"
    # With a critic: nothing to say while it keeps within critic_lag, its lag when the scheduler holds jobs.
    assert Phase(cfg).label(dict(st, critic_version=3, critic_steps=12_000)) == ""
    # (the daemon's own actor trains a step per step stored after Pendulum's 2 000 random ones: 10 600 due)
    assert Phase(cfg).label(dict(st, critic_version=3, critic_steps=1_000)) == "critic 9,600 steps behind"
    # RL jobs in hand and no step stored for a while: the run waits for them.
    busy = dict(st, critic_version=3, critic_steps=12_000)
    assert Phase(cfg).label(busy, rl_jobs=2, idle=5.0) == "training RL individuals (2)"
    assert Phase(cfg).label(busy, rl_jobs=2, idle=0.5) == ""
    hint = Phase(cfg).label(dict(st, problem_hint="plain rq worker: use -w workers.AesrlWorker"))
    assert hint == "plain rq worker: use -w workers.AesrlWorker"
    stopped = progress_line(snap(status="stopped", phase_text="stopped"), width=80)
    assert "steps/s" not in stopped and "ETA" not in stopped


def test_smoothed_rate_keeps_the_eta_steady_through_a_slow_stretch():
    from aesrl_queue.progress import Rate

    rate = Rate(tau=60.0)
    steps = 0
    for t in range(121):  # two minutes at 100 steps/s
        rate.add(float(t), steps)
        steps += 100
    assert rate.value == pytest.approx(100.0, rel=0.01)
    for t in range(121, 141):  # 20 s with nothing stored (RL jobs training)
        rate.add(float(t), steps)
    assert 50.0 < rate.value < 100.0  # down by a third, not to zero
    fresh = Rate(tau=60.0)
    fresh.add(0.0, 0)
    fresh.add(10.0, 5000)
    assert fresh.add(20.0, 5000) == pytest.approx(250.0)  # the mean since the start
    # A fast random phase, then RL and ES jobs whose steps arrive in bursts of 1 000 every 10 s: after
    # the restart the rate settles on the learning phase's 100 steps/s and stays within a quarter of
    # it from one burst to the next, where the random phase's 1 000 steps/s would have stayed in it.
    bursts = Rate(tau=60.0)
    steps, values = 0, []
    for t in range(10):
        bursts.add(float(t), steps)
        steps += 1000
    bursts.restart(10.0, steps)
    for t in range(10, 610):
        if t % 10 == 0:
            steps += 1000
        values.append(bursts.add(float(t), steps))
    assert all(75.0 < v < 125.0 for v in values[120:]), (min(values[120:]), max(values[120:]))
    assert values[0] > 100.0  # it carries on from the random phase's rate instead of starting at 0


@pytest.mark.slow
def test_progress_line_on_an_80_column_terminal(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(AQ[0], [*AQ[1:], "run", *SMALL, "--steps", "1200", "--run-id", "tty", "--out",
                                  str(tmp_path)], env=child_env(), cwd=str(ROOT), dimensions=(24, 80),
                          encoding="utf-8", timeout=180)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before[-3000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before)
    pieces = [p for p in re.split(r"[\r\n]+", text) if p.strip()]
    progress = [p for p in pieces if re.match(r"f\(μ\)~ (-?\d+\.\d|-)", p.strip())]
    assert progress, pieces[-20:]
    assert all(len(p.rstrip()) <= 80 for p in progress), [p for p in progress if len(p.rstrip()) > 80]
    assert any(re.match(r"f\(μ\)~ -?\d+\.\d\s+1,200/1,200 \(100%\)", p.strip()) for p in progress), progress[-5:]


# -- a plain `rq worker` ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_plain_rq_worker_is_named_and_the_scheduler_stops_refilling(redis_url, client, procs):
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--env", "AesrlNull-v0", "--algo", "es",
              "--steps", "600", "--run-id", "plain")
    procs.start("plain-worker", [sys.executable, "-m", "rq.cli", "worker", "-u", redis_url, "aesrl-es", "aesrl-rl"])
    store = Store(client, "plain")
    wait_for(store.exists, 60, what="the run", on_fail=procs.logs)
    t0 = time.monotonic()

    def named():
        out = aq("status", "--redis-url", redis_url, "--run", "plain")
        return "-w workers.AesrlWorker" in out.stdout and out.stdout

    shown = wait_for(named, 120, interval=1.0, what="the cause in status", on_fail=procs.logs)
    print(f"cause shown in status {time.monotonic() - t0:.1f}s after the run appeared")
    assert "plain `rq worker`" in shown
    wait_for(lambda: store.state().get("breaker"), 60, what="the circuit breaker", on_fail=procs.logs)
    before = store.state()["dispatched"]
    time.sleep(12)
    after = store.state()["dispatched"]
    assert after - before <= 1, (before, after)  # at most one probe job
    assert "-w workers.AesrlWorker" in procs.log("scheduler")
    # The jobs a plain worker took were never run: the replay and results streams stay empty.
    assert not client.exists(store.key("results")) and not client.exists(store.key("replay"))


def test_status_of_a_stopped_run_and_watch_until_done_off_a_terminal(redis_url, client):
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="es", run_id="halted", total_steps=1000).resolve()
    store = Store(client, "halted")
    store.write_config(cfg)
    now = time.time()
    store.set_state(status="stopped", steps=500, started_at=now - 5, updated_at=now)
    from aesrl_queue import codec

    for i in range(3):  # recent history: it would give a live steps/s
        client.xadd(store.key("history"), {"d": codec.pack({"job": f"j{i}", "kind": "es", "steps": 100 * i,
                                                            "interactions": 0, "version": i, "p": 0.5, "f_z": -1.0,
                                                            "f_mu": -1.0, "len": 100, "t": now - 1 + i * 0.01})})
    out = aq("status", "--redis-url", redis_url, "--run", "halted")
    assert out.returncode == 0 and "steps/s -" in out.stdout, out.stdout
    out = aq("status", "--redis-url", redis_url, "--run", "halted", "--watch", "--until-done", timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "halted stopped" in lines[0] and "steps/s -" in lines[0], out.stdout


# -- W&B --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_wandb_offline_logs_f_mu_without_a_network(tmp_path):
    pytest.importorskip("wandb")
    env = dict(child_env(), WANDB_MODE="offline", WANDB_SILENT="true")
    out = subprocess.run([*AQ, "run", *SMALL, "--run-id", "wb", "--out", str(tmp_path), "--wandb-project", "aesrl"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    files = list((tmp_path / "wb" / "wandb").glob("offline-run-*/run-wb.wandb"))
    assert len(files) == 1, list((tmp_path / "wb").rglob("*"))
    assert b"charts/f_mu" in files[0].read_bytes()  # the scalars TensorBoard gets, under the same names


@pytest.mark.slow
def test_kill9_of_the_worker_wrapper_ends_its_workers(redis_url):
    """`aesrl-queue worker --processes N` is a launcher too: its workers leave with it."""
    wrapper = subprocess.Popen([*AQ, "worker", "--processes", "2", "--redis-url", redis_url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
    try:
        wait_for(lambda: len(descendants(wrapper.pid)) >= 2, 60, what="two workers")
        kids = descendants(wrapper.pid)
        wrapper.kill()
        wrapper.wait(10)
        # SIGTERM is RQ's warm shutdown: an idle worker leaves within seconds.
        wait_for(lambda: all(pid_gone(p) for p in kids), 20, interval=0.1, what="the workers to exit")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
