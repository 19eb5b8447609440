"""`run`'s launcher holds SIGTERM and Ctrl-C back while it writes metrics records, then acts on them.

Holding them back with the thread's signal mask did not work: the kernel hands a process-directed
signal that the main thread blocks to another thread (here a sleeping one, in the launcher numpy's
BLAS threads), and Python then runs the handler in the main thread in the middle of the pass. A
SIGTERM there once wrote one metrics record twice (tests/test_watch.py saw 827 records for 826
applied updates)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from aesrl_queue import local as launch


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
