"""bench/job_times.py: the job times it reads off a run's metrics and the workers it sizes from them
(the real runs it starts are those of `aesrl-queue run`, tested elsewhere)."""

from __future__ import annotations

import pytest

from bench import job_times


def update(kind: str, interactions: int, length: int, duration: float, random: bool = False) -> dict:
    return {"type": "update", "kind": kind, "interactions": interactions, "len": length, "duration": duration,
            "random": random}


def test_a_job_s_interactions_are_its_step_in_the_count_and_a_line_separates_fixed_from_per_step_costs() -> None:
    """Two-episode ES jobs of 20 to 200 steps each at 5 ms per job and 0.1 ms per interaction: the line
    recovers both and reads 0.205 s at 1 000-step episodes; random jobs and critic records are left out."""
    metrics, total = [{"type": "critic", "critic_steps_per_s": 40.0}], 0
    total += 400
    metrics.append(update("es", total, 200, 9.0, random=True))  # a random job, not counted
    for length in (20, 50, 80, 120, 200, 35, 160):
        total += 2 * length
        metrics.append(update("es", total, length, 0.005 + 1e-4 * 2 * length))
    rows = job_times.job_rows(metrics)
    assert [r["played"] for r in rows][:2] == [400, 40]
    es = job_times.summarise(rows, 1000)["es"]
    assert es["jobs"] == 7 and es["fit"] == "line" and es["episodes_per_job"] == 2
    assert es["s_per_job"] == pytest.approx(0.005, abs=1e-9)
    assert es["s_per_interaction"] == pytest.approx(1e-4, rel=1e-6)
    assert es["full_length_s"] == pytest.approx(0.205, abs=1e-4)
    assert job_times.critic_rate(metrics) == 40.0


def test_full_length_episodes_are_timed_by_their_ratio_and_sized_into_workers() -> None:
    """Jobs that all play full episodes give no line: the median seconds per interaction. Workers per
    run are the limit × the job time; a learner at UTD 1 keeps rate ÷ (steps per job ÷ job s) busy."""
    rl = [update("rl", 1000 * (i + 1), 1000, 0.1) for i in range(9)]
    kinds = job_times.summarise(job_times.job_rows(rl), 1000)
    assert kinds["rl"]["fit"] == "ratio" and kinds["rl"]["full_length_s"] == pytest.approx(0.1)
    cell = {"episode_cap": 1000,
            "es": {"kinds": {"es": {"full_length_s": 0.2, "episodes_per_job": 2}}},
            "aesrl": {"kinds": {"rl": {"full_length_s": 0.1, "episodes_per_job": 1},
                                "es": {"full_length_s": 0.2, "episodes_per_job": 2}},
                      "critic_steps_per_s": None}}
    c = job_times.capacity(cell, [550.0])
    assert c["es_workers"] == round(1550 * 0.2)
    assert c["aesrl_mean_job_s"] == pytest.approx(0.9 * 0.1 + 0.1 * 0.2)
    assert c["aesrl_workers_redis"] == round(500 * 0.11)
    assert c["aesrl_workers_learner_550"] == pytest.approx(550 / (1100 / 0.11), abs=1e-3)
