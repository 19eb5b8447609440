"""The core stays small enough to read: the limits of issue 32, checked on the source itself."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
from pathlib import Path

from aesrl_queue.config import RunConfig, field_docs
from aesrl_queue.optimizers.base import Individual
from aesrl_queue.store import Result

ROOT = Path(__file__).resolve().parent.parent


def _function(path: str, qualname: str) -> ast.FunctionDef:
    tree = ast.parse((ROOT / path).read_text())
    *outer, name = qualname.split(".")
    body = tree.body
    for cls in outer:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)


def _lines(fn: ast.FunctionDef) -> int:
    return fn.end_lineno - fn.lineno + 1


def test_settings_are_at_most_fifty_and_each_has_a_help_line() -> None:
    docs = field_docs()
    assert len(docs) <= 50
    assert {name for name, *_ in docs} < {f.name for f in dataclasses.fields(RunConfig)}
    assert all(isinstance(text, str) and text and "\n" not in text for _, _, text, _ in docs)
    assert any(departure for *_, departure in docs) and not all(departure for *_, departure in docs)


def test_the_job_function_and_tell_read_in_one_screen() -> None:
    assert _lines(_function("workers/jobs.py", "play")) <= 60
    assert _lines(_function("aesrl_queue/optimizers/aesrl.py", "AesrlOptimizer.tell")) <= 60


def test_result_evaluated_and_store_stay_small() -> None:
    assert len(dataclasses.fields(Result)) <= 20
    assert len(dataclasses.fields(Individual)) <= 20
    tree = ast.parse((ROOT / "aesrl_queue/store.py").read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    assert sum(isinstance(n, ast.FunctionDef) for n in store.body) <= 45


def test_no_lab_notebook_in_code_or_docs() -> None:
    word = "sit" + "ting"  # spelled apart so that this file does not find itself
    found = subprocess.run(["git", "grep", "-n", "-i", word, "--", ".", ":!bench/results"],
                           cwd=ROOT, capture_output=True, text=True)
    if found.returncode == 128:  # not a git checkout (an sdist): nothing to scan
        return
    assert found.stdout == ""
