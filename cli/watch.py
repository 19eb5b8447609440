"""`aesrl-queue status --watch`: the status screen, refreshed about once a second until Ctrl-C."""

from __future__ import annotations

import time

import click
import redis

from cli.report import render, safe_gather


def watch_status(client: redis.Redis, run_id: str, interval: float = 1.0) -> None:
    try:
        while True:
            s = safe_gather(client, run_id)
            text = s if isinstance(s, str) else render(s)
            click.echo("\x1b[2J\x1b[H" + text + f"\n\n(refreshing every {interval:.0f}s; Ctrl-C to quit)")
            time.sleep(interval)
    except KeyboardInterrupt:
        click.echo("")
