"""Many machines, for real: Redis, two worker hosts and the scheduler's host in separate network
namespaces joined by veth links, all traffic by IP address; then one worker host's link is cut.

Topology (a star around the Redis host, so no bridge and no IP forwarding are involved):

    root ns (scheduler, critic) --veth-- redis ns (redis-server) --veth-- host1 ns (2 rq workers)
                                                                 --veth-- host2 ns (2 rq workers + a
                                                                          local replica they read from)

Needs root and iproute2 with network-namespace support; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from aesrl_queue.connection import connect
from aesrl_queue.redis_server import RedisServer, find_redis_server, free_port
from aesrl_queue.store import Store, live_workers
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

RUN = "multihost-pendulum"
STEPS = 8000  # 20 Pendulum jobs of two 200-step episodes (the individual's and μ's)
# Redis refuses connections from other hosts without a password (protected mode), as it should.
PASSWORD = "multihost-secret"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _why_no_netns() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "creating network namespaces and veth links needs root (run the suite as root, as CI does)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed (apt install iproute2)"
    probe = f"aesrl-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()} (no CAP_SYS_ADMIN / netns support here)"
    try:
        veth = _ip("link", "add", f"aqp{os.getpid() % 100000}", "type", "veth", "peer", "name", "eth0",
                   "netns", probe, check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Net:
    """Namespaces and links of one test; `close()` removes them (and kills what still runs inside)."""

    def __init__(self) -> None:
        n = os.getpid() % 100000
        self.tag = f"aq{n}"
        self.subnet = 10, 200 + n % 50  # 10.x.k.0/30 per link, k = 1 root, 2 host1, 3 host2
        self.ns = {"redis": f"aesrl-{n}-redis", "host1": f"aesrl-{n}-host1", "host2": f"aesrl-{n}-host2"}
        self.made: list[str] = []

    def addr(self, link: int, side: int) -> str:
        return f"{self.subnet[0]}.{self.subnet[1]}.{link}.{side}"

    def up(self) -> None:
        for ns in self.ns.values():
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        red = self.ns["redis"]
        # root <-> redis: the root end stays in the root namespace.
        self._link(1, f"{self.tag}r", None, "eth-root")
        for k, host in ((2, "host1"), (3, "host2")):
            self._link(k, "eth0", self.ns[host], f"eth-{host}")
        assert red in self.made

    def _link(self, k: int, outer: str, outer_ns: str | None, inner: str) -> None:
        red = self.ns["redis"]
        args = ["link", "add", outer, "type", "veth", "peer", "name", inner, "netns", red]
        if outer_ns is None:
            _ip(*args)
            _ip("addr", "add", f"{self.addr(k, 2)}/30", "dev", outer)
            _ip("link", "set", outer, "up")
        else:
            _ip("-n", outer_ns, *args)
            _ip("-n", outer_ns, "addr", "add", f"{self.addr(k, 2)}/30", "dev", outer)
            _ip("-n", outer_ns, "link", "set", outer, "up")
        _ip("-n", red, "addr", "add", f"{self.addr(k, 1)}/30", "dev", inner)
        _ip("-n", red, "link", "set", inner, "up")

    def exec(self, host: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host], *cmd]

    def cut(self, host: str) -> None:
        _ip("-n", self.ns[host], "link", "set", "eth0", "down")

    def close(self) -> None:
        for ns in reversed(self.made):
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # only processes this test started live in its namespaces
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
        # The root end of a veth pair goes with its peer's namespace; make sure.
        _ip("link", "del", f"{self.tag}r", check=False)


class NetnsRedis(RedisServer):
    """A RedisServer started inside a namespace, listening on several addresses."""

    def __init__(self, net: Net, binds: list[str], **kw) -> None:
        super().__init__(bind=binds[0], **kw)
        self.net, self.binds = net, binds

    def args(self) -> list[str]:
        a = super().args()
        i = a.index("--bind")
        return self.net.exec("redis", *a[:i + 1], *self.binds, *a[i + 2:])


@pytest.fixture()
def net():
    why = _why_no_netns()
    if why:
        pytest.skip(why)
    n = Net()
    try:
        n.up()
        yield n
    finally:
        n.close()


def _hosts(workers: set[str]) -> set[str]:
    return {w.split("-w")[0] for w in workers}


def _replica_hits(net: Net, port: int) -> int:
    out = subprocess.run(net.exec("host2", sys.executable, "-c",
                                  f"import redis; print(redis.Redis(port={port}).info('stats')['keyspace_hits'])"),
                         capture_output=True, text=True, timeout=30)
    return int(out.stdout.strip() or -1)


def test_workers_on_two_hosts_then_one_host_cut_off(net, procs, tmp_path):
    server = NetnsRedis(net, [net.addr(1, 1), net.addr(2, 1), net.addr(3, 1)], directory=tmp_path / "redis",
                        password=PASSWORD, extra_args=["--repl-diskless-sync-delay", "0"]).start()
    try:
        _run(net, server, procs, tmp_path)
    finally:
        server.cleanup()


def _run(net: Net, server: NetnsRedis, procs, tmp_path) -> None:
    port = server.port
    root_url = server.url  # redis://:PASSWORD@<redis ns address on the root link>:port
    assert root_url.startswith(f"redis://:{PASSWORD}@{net.addr(1, 1)}:")
    client = connect(root_url)

    # host2 runs a local replica of the primary; its workers read μ/var, config, critic from it.
    rport = free_port()
    procs.start("replica", net.exec("host2", find_redis_server(), "--port", str(rport), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                                    "--replicaof", net.addr(3, 1), str(port), "--masterauth", PASSWORD))
    wait_for(lambda: client.info("replication").get("connected_slaves", 0) >= 1
             and "online" in str(client.info("replication").get("slave0", "")), 30,
             what="host2's replica to sync over its link", on_fail=procs.logs)

    def worker(host: str, i: int, url: str, *env: str) -> None:
        procs.start(f"{host}-w{i}", net.exec(host, "env", *env, sys.executable, "-m", "rq.cli", "worker",
                                             "-w", "workers.AesrlWorker", "-u", url, "-n", f"{host}-w{i}",
                                             "aesrl-rl", "aesrl-es"))

    for i in range(2):
        worker("host1", i, f"redis://:{PASSWORD}@{net.addr(2, 1)}:{port}/0")
        worker("host2", i, f"redis://:{PASSWORD}@{net.addr(3, 1)}:{port}/0",
               f"AESRL_READ_URL=redis://127.0.0.1:{rport}/0")
    wait_for(lambda: len(live_workers(client)) == 4, 90, what="4 workers heartbeating across the links",
             on_fail=procs.logs)
    assert _hosts(set(live_workers(client))) == {"host1", "host2"}

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"env_id": "Pendulum-v1", "mean_eval_episodes": 1, "batch_size": 64,
                               "critic_chunk": 200, "result_ttl": 30, "failure_ttl": 120}))
    procs.cli("scheduler", "scheduler", "start", "--redis-url", root_url, "--config", str(cfg), "--run-id", RUN,
              "--steps", str(STEPS), "--initial-steps", "800", "--hidden", "16,16", "--critic-hidden", "32,32",
              "--seed", "5")
    procs.cli("critic", "critic", "start", "--redis-url", root_url, "--run", RUN)
    store = Store(client, RUN)
    wait_for(store.exists, 60, what="the run's config", on_fail=procs.logs)

    # Both hosts deliver results through the links.
    def both_hosts() -> bool:
        return _hosts({h["worker"] for _i, h in store.history()}) == {"host1", "host2"}

    wait_for(both_hosts, 90, what="results from both worker hosts", on_fail=procs.logs)
    assert store.state()["steps"] < STEPS * 0.75, "the run got too far before the cut; raise STEPS"

    # Cut host1 off in the middle of the run.
    net.cut("host1")
    cut_ms = int(time.time() * 1000)
    wait_for(lambda: _hosts(set(live_workers(client))) == {"host2"}, 30,
             what="host1's workers to drop out (heartbeat keys expire)", on_fail=procs.logs)
    # host2's two workers finish the run; beside other work on 2 cores that took over 150 s
    wait_for(lambda: store.status() == "finished", 300, interval=1.0, what="the run to finish on host2 alone",
             on_fail=procs.logs)
    assert procs.procs["scheduler"].wait(30) == 0, procs.log("scheduler")

    st = store.state()
    assert st["steps"] >= STEPS
    # After the cut (1 s margin for an entry written just before it), only host2 reports.
    after = [f for i, f in client.xrange(store.key("results"), min=str(cut_ms + 1000))]
    assert len(after) >= 3, "the run should have continued for a while after the cut"
    assert _hosts({f[b"worker"].decode() for f in after}) == {"host2"}
    # Exactly once, across the cut.
    history = [h for _i, h in store.history()]
    assert len(history) == st["results_applied"]
    assert len({h["job"] for h in history}) == len(history)
    consumed = st["results_applied"] + st["failed"] + st["rejected"] + st["stale"]
    assert consumed == client.xlen(store.key("results")), st
    assert {h["kind"] for h in history} >= {"es"} and st["critic_version"] >= 1
    # host2's workers read from their local replica (the primary answered their writes).
    assert _replica_hits(net, rport) > 0
