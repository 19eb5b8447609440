"""`run`'s launcher holds SIGTERM and Ctrl-C back while it writes metrics records, then acts on them.

Holding them back with the thread's signal mask did not work: the kernel hands a process-directed
signal that the main thread blocks to another thread (here a sleeping one, in the launcher numpy's
BLAS threads), and Python then runs the handler in the main thread in the middle of the pass. A
SIGTERM there once wrote one metrics record twice (tests/test_watch.py saw 827 records for 826
applied updates)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aesrl_queue import local as launch
from tests.conftest import ROOT, child_env, default_sigint, descendants, wait_for


class Pass:
    """A metrics pass that receives a signal half-way and must still finish its work."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.finished = False

    def poll(self) -> int:
        os.kill(os.getpid(), self.signum)
        deadline = time.monotonic() + 0.3  # bytecodes run meanwhile: a pending handler would fire here
        while time.monotonic() < deadline:
            time.sleep(0.01)
        self.finished = True
        return 1


@pytest.fixture
def other_thread():
    """A thread that does not block signals, as BLAS threads do not."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    yield t
    stop.set()
    t.join(5)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminating_signal_during_a_metrics_pass_is_raised_after_it(other_thread, signum) -> None:
    previous = signal.signal(signum, launch._raise_terminated)
    launch._received.clear()
    try:
        work = Pass(signum)
        with pytest.raises(launch.Terminated):
            launch.poll_metrics(work)
        assert work.finished  # the pass ran to its end: no record half-written
        assert launch._received == [signal.Signals(signum).name]
    finally:
        signal.signal(signum, previous)
        launch._received.clear()


def test_ctrl_c_during_a_metrics_pass_is_raised_after_it(other_thread) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        work = Pass(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            launch.poll_metrics(work)
        assert work.finished
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_quiet_pass_holds_ctrl_c_back_raises_nothing_and_puts_the_handler_back() -> None:
    launch._received.clear()
    before = signal.getsignal(signal.SIGINT)
    during = []

    class Quiet:
        def poll(self) -> int:
            during.append((signal.getsignal(signal.SIGINT), launch._deferring))
            return 0

    assert launch.poll_metrics(Quiet()) is None
    assert len(during) == 1 and during[0][0] is not before and during[0][1], during  # held back while it ran
    assert signal.getsignal(signal.SIGINT) is before and not launch._deferring


# -- Ctrl-C of a real `aesrl-queue run` --------------------------------------------------------------
RUN = [sys.executable, "-m", "cli.main", "run", "--env", "Pendulum-v1", "--steps", "40000", "--initial-steps", "400",
       "--workers", "2", "--hidden", "16,16", "--critic-hidden", "32,32"]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _interrupt_a_run_with_rl_jobs_in_hand(tmp_path: Path, presses: int) -> tuple[subprocess.CompletedProcess, Path, list[int]]:
    """Start a local run, wait until a worker trains an RL individual, press Ctrl-C `presses` times
    (0.2 s apart); the finished launcher, its run folder and the children it had."""
    import redis

    from aesrl_queue.store import live_workers

    out, err_path = tmp_path / "runs", tmp_path / "run.err"
    # RL jobs that train an actor (seconds of torch each): the default's RL jobs play the daemon's actor
    # in milliseconds, and the case here is a worker busy in one when Ctrl-C comes
    trains = tmp_path / "trains.json"
    trains.write_text(json.dumps({"rl_steps_max": 2000}))
    err = open(err_path, "w")  # noqa: SIM115
    launcher = subprocess.Popen([*RUN, "--run-id", "cc", "--out", str(out), "--config", str(trains)],
                                stdout=subprocess.PIPE, stderr=err, env=child_env(), cwd=ROOT, text=True,
                                preexec_fn=default_sigint)
    try:
        def url():
            m = re.search(r"embedded Redis on (redis://\S+)", err_path.read_text())
            return m.group(1) if m else None

        wait_for(url, 60, what="the embedded Redis")
        r = redis.Redis.from_url(url())
        wait_for(lambda: any(w.get("kind") == "rl" for w in live_workers(r).values()), 300, interval=0.2,
                 what="an RL job in hand", on_fail=err_path.read_text)
        kids = descendants(launcher.pid)
        assert len(kids) >= 5, kids  # redis-server, 2 workers, critic, scheduler
        t0 = time.monotonic()
        for i in range(presses):
            if i:
                time.sleep(0.2)
            launcher.send_signal(signal.SIGINT)
        stdout, _ = launcher.communicate(timeout=120)
        print(f"{presses} Ctrl-C: the launcher exited {time.monotonic() - t0:.2f} s after the first")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        err.close()
    res = subprocess.CompletedProcess(launcher.args, launcher.returncode, stdout, err_path.read_text())
    return res, out / "cc", kids


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_of_a_run_says_what_it_does_and_leaves_the_policy_and_summary(tmp_path, presses) -> None:
    res, folder, kids = _interrupt_a_run_with_rl_jobs_in_hand(tmp_path, presses)
    assert res.returncode == 130, res.stderr[-3000:]
    said = [ln for ln in res.stderr.splitlines() if "stopping the children" in ln]
    assert said == ["interrupted: stopping the children (workers, critic, scheduler); "
                    "writing policy.npz and summary.json"], res.stderr[-3000:]
    assert "aborted" not in res.stderr
    stopped = re.search(r"\(interrupted, stopped in ([\d.]+) s\)", res.stdout)
    assert stopped, res.stdout
    print(f"{presses} Ctrl-C: stopped in {stopped.group(1)} s (the launcher's own measure)")
    # every child is gone (a SIGKILLed child may need a moment to leave /proc on a loaded machine)
    wait_for(lambda: all(_gone(p) for p in kids), 60, what="the run's children to be gone",
             on_fail=lambda: str([p for p in kids if not _gone(p)]))
    with np.load(folder / "policy.npz") as npz:
        assert npz["steps"] >= 400 and np.isfinite(npz["mu"]).all()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"] >= 400 and summary["status"] == "stopped", summary


@pytest.mark.slow
def test_ctrl_c_before_the_scheduler_wrote_mu_ends_with_a_summary_and_no_failed_clean_up(tmp_path) -> None:
    """Ctrl-C in a run's first seconds (config written, the scheduler still importing): no clean-up step
    fails on the μ that does not exist yet; the summary is printed and written, and says there is no
    policy.npz and why."""
    out, err_path = tmp_path / "runs", tmp_path / "run.err"
    with open(err_path, "w") as err:
        launcher = subprocess.Popen([*RUN, "--run-id", "early", "--out", str(out)], stdout=subprocess.PIPE,
                                    stderr=err, env=child_env(), cwd=ROOT, text=True, preexec_fn=default_sigint)
        try:
            wait_for(lambda: (out / "early" / "config.json").exists(), 60, interval=0.02, what="the run's config",
                     on_fail=err_path.read_text)
            launcher.send_signal(signal.SIGINT)
            stdout, _ = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    said = err_path.read_text()
    assert launcher.returncode == 130, said[-2000:]
    assert "clean-up:" not in said, said[-2000:]
    assert "run early (interrupted" in stdout, stdout
    summary = json.loads((out / "early" / "summary.json").read_text())
    assert summary["warnings"] == [launch.NO_POLICY] and not (out / "early" / "policy.npz").exists(), summary
    assert f"warning          {launch.NO_POLICY}" in stdout, stdout
