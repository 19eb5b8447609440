"""The `aesrl-queue` command line: run, scheduler, critic, worker, status, runs."""
