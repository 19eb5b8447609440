"""RunConfig: the per-environment presets, validation that names the field, files, resolve() and spec_hash."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from aesrl_queue import nets
from aesrl_queue.codec import CodecError, pack, unpack
from aesrl_queue.config import PAPER_R, ConfigError, RunConfig, load_config_blob, paper_r, preset_for

DEFAULTS = RunConfig()

# The paper: r per environment (selected with r="paper"); Humanoid also hidden 256-256 and lr 3e-4;
# Swimmer rl_ratio 0.1.
PAPER_RS = {"HalfCheetah": 2000.0, "Hopper": 600.0, "Walker2d": 800.0, "Ant": 960.0, "Humanoid": 960.0,
            "Swimmer": 48.0}
PAPER_PRESETS = {
    "HalfCheetah": {},
    "Hopper": {},
    "Walker2d": {},
    "Ant": {},
    "Humanoid": {"hidden": (256, 256), "actor_lr": 3e-4},
    "Swimmer": {"rl_ratio": 0.1},
}


# -- presets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["v4", "v5"])
@pytest.mark.parametrize("stem", list(PAPER_PRESETS))
def test_paper_presets(stem: str, version: str) -> None:
    env_id = f"{stem}-{version}"
    expected = PAPER_PRESETS[stem]
    preset = preset_for(env_id)
    for name, value in expected.items():
        assert preset[name] == value, (env_id, name)
    cfg = RunConfig.from_preset(env_id)
    assert cfg.env_id == env_id
    for name, value in expected.items():
        assert getattr(cfg, name) == value, (env_id, name)
    # What the preset does not name keeps aesrl's defaults: its learner's networks, ρ* 0.9.
    if stem != "Humanoid":
        assert cfg.hidden == (256, 256) and cfg.actor_lr == 1e-3 and cfg.learner == "crossq-sac"
    if stem != "Swimmer":
        assert cfg.rl_ratio == 0.9
    assert cfg.mean_rule == "baseline-relative" and cfg.var_rule == "adaptive" and cfg.var_init == 1e-3
    # The fitness scale adapts by default; the paper's number is one option away.
    assert cfg.r == "adaptive" and cfg.fitness_scale == "adaptive"
    assert paper_r(env_id) == PAPER_RS[stem] == PAPER_R[stem]
    paper = RunConfig.from_preset(env_id, r="paper")
    assert paper.fitness_scale == PAPER_RS[stem]
    cfg.validate()


def test_humanoid_uses_small_networks_and_lr_for_both_actor_and_critic() -> None:
    cfg = RunConfig.from_preset("Humanoid-v5")
    assert cfg.hidden == (256, 256) and cfg.critic_hidden == (256, 256)
    assert cfg.actor_lr == 3e-4 and cfg.critic_lr == 3e-4


def test_unknown_env_gets_the_adaptive_scale_and_no_paper_r() -> None:
    assert preset_for("CartPoleContinuous-v9") == {}
    assert paper_r("HumanoidStandup-v5") is None  # not Humanoid's
    cfg = RunConfig.from_preset("MyEnv-v0")
    assert cfg.r == "adaptive" and cfg.fitness_scale == "adaptive"
    cfg.validate()
    with pytest.raises(ConfigError, match="no fitness scale for AesrlNull-v0") as err:
        RunConfig.from_preset("AesrlNull-v0", r="paper").resolve()
    assert err.value.field == "r"


def test_aesrl_rl_jobs_play_the_daemons_actor_and_the_paper_value_is_a_field_away(tmp_path) -> None:
    assert RunConfig.from_preset("HalfCheetah-v5", algo="aesrl").rl_steps_max == 0
    assert RunConfig.from_preset("HalfCheetah-v5").rl_steps_max == 0  # aesrl is the default algo
    # The baselines keep the published 10 000 (CEM-RL's actor steps per generation).
    for algo in ("cemrl", "pcemrl", "opo", "acemrl"):
        assert RunConfig.from_preset("HalfCheetah-v5", algo=algo).rl_steps_max == 10_000, algo
    f = tmp_path / "paper.toml"
    f.write_text('env_id = "HalfCheetah-v5"\nalgo = "aesrl"\nrl_steps_max = 10000\n')
    assert RunConfig.from_file(f).rl_steps_max == 10_000


def test_paper_r_resolves_to_the_number_that_is_stored() -> None:
    cfg = RunConfig.from_preset("Pendulum-v1", r="paper").resolve()
    assert cfg.r == 200.0 and load_config_blob(pack(cfg.to_dict())).r == 200.0


def test_overrides_win_over_the_preset_and_none_is_ignored() -> None:
    cfg = RunConfig.from_preset("Swimmer-v5", rl_ratio=0.3, r=None, hidden="64x64")
    assert cfg.rl_ratio == 0.3 and cfg.r == "adaptive" and cfg.hidden == (64, 64)
    assert RunConfig.from_preset("Swimmer-v5", r=12.5).r == 12.5


def test_fitness_shift_alive_reads_the_survival_bonus_and_applies_to_the_es_rules_only() -> None:
    """"alive" becomes the environment's own reward per step alive (Hopper's 1, 0 for HalfCheetah, the
    healthy_reward a run's env kwargs give); the setting stays "alive" in the stored config, so a
    resume that restates it agrees; CEM-RL and TD3 refuse it."""
    hopper = RunConfig.from_preset("Hopper-v5", fitness_shift="alive").resolve()
    assert hopper.shift_per_step == 1.0 and hopper.fitness_shift == "alive"
    assert load_config_blob(pack(hopper.to_dict())).shift_per_step == 1.0
    assert RunConfig.from_preset("HalfCheetah-v5", fitness_shift="alive").resolve().shift_per_step == 0.0
    two = RunConfig.from_preset("Hopper-v5", fitness_shift="alive", env_kwargs={"healthy_reward": 2.0}).resolve()
    assert two.shift_per_step == 2.0
    assert RunConfig.from_preset("Hopper-v5", fitness_shift=0.5).resolve().shift_per_step == 0.5
    # aesrl's default; the paper's comparison is one field away, and the baselines have none
    assert RunConfig.from_preset("Hopper-v5").fitness_shift == "alive"
    assert RunConfig.from_preset("Hopper-v5", fitness_shift=0).resolve().shift_per_step == 0.0
    assert RunConfig.from_preset("Hopper-v5", algo="es").fitness_shift == 0.0
    # a run stored before the field existed resumes with the paper's comparison
    stored = {k: v for k, v in hopper.to_dict().items() if k not in ("fitness_shift", "shift_per_step")}
    assert RunConfig.from_dict(stored).fitness_shift == 0.0
    for algo in ("cemrl", "td3"):
        assert RunConfig.from_preset("Hopper-v5", algo=algo).validate().fitness_shift == 0.0
        with pytest.raises(ConfigError, match="^fitness_shift: applies to --algo aesrl and es"):
            RunConfig.from_preset("Hopper-v5", algo=algo, fitness_shift="alive").validate()
    assert RunConfig.from_preset("Hopper-v5", algo="es", fitness_shift=1.0).validate()


# -- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("algo", "ppo"),
        ("mean_rule", "one-plus-two"),
        ("var_rule", "cma"),
        ("r", 0.0),
        ("r", -5.0),
        ("r", math.nan),
        ("r", math.inf),
        ("r", "big"),
        ("r", "auto"),  # removed: the message says so
        ("total_steps", -1),
        ("total_steps", 0),
        ("batch_size", 2.5),
        ("initial_steps", -10),
        ("rl_ratio", 1.5),
        ("rl_ratio", math.nan),
        ("positive_ratio", 0.0),
        ("positive_ratio", 1.2),
        ("critic_lag", -1),
        ("critic_lag", 0.5),
        ("gamma", -0.1),
        ("var_init", 0.0),
        ("actor_lr", math.inf),
        ("hidden", (400, 0)),
        ("hidden", ()),
        ("critic_hidden", (-1,)),
        ("population", 7),
        ("population", 0),
        ("activation", "gelu"),
        ("policy_noise", -0.2),
        ("run_id", "has space"),
        ("run_id", "a:b"),
        ("run_id", "x" * 65),
        ("run_id", "worker"),  # its keys would be aesrl:worker:*, the workers' heartbeat keys
        ("env_kwargs", [1, 2]),
        ("env_id", ""),
        # a TOML `true` is not a number: every numeric range check refuses booleans
        ("rl_ratio", True),
        ("var_init", True),
        ("rl_gain", True),
        ("positive_ratio", True),
        ("gamma", False),
        ("hidden", (True, 64)),
        ("fitness_shift", -1.0),
        ("fitness_shift", math.nan),
        ("fitness_shift", "healthy"),
        ("fitness_shift", True),
    ],
)
def test_validation_names_the_bad_field(field: str, value) -> None:
    cfg = dataclasses.replace(RunConfig.from_preset("Hopper-v5"), **{field: value})
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}:")
    assert isinstance(err.value, ValueError)


def test_var_floor_above_var_init_is_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_preset("Hopper-v5", var_init=1e-6, var_floor=1e-5).validate()
    assert err.value.field == "var_floor"


def test_valid_edge_values_pass() -> None:
    cfg = RunConfig.from_preset("Hopper-v5", rl_ratio=0.0, r=1e-9, run_id="run_1-A", population=2,
                                initial_steps=0, hidden=(1,))
    assert cfg.validate() is cfg  # it raises ConfigError on a bad field and returns the config when all pass
    assert (cfg.rl_ratio, cfg.r, cfg.run_id, cfg.population, cfg.initial_steps, cfg.hidden) == \
        (0.0, 1e-9, "run_1-A", 2, 0, (1,))
    assert RunConfig.from_preset("Hopper-v5", rl_ratio=1.0).validate().rl_ratio == 1.0


def test_from_dict_rejects_unknown_fields_and_bad_layer_strings() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"env_id": "Hopper-v5", "learning_rate": 0.1})
    assert err.value.field == "learning_rate"
    assert "known fields" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown field \(did you mean 'total_steps'\?\)"):
        RunConfig.from_dict({"env_id": "Hopper-v5", "total_step": 1000})
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"hidden": "400,three"})
    assert err.value.field == "hidden"


def test_from_dict_parses_layer_lists_and_strings() -> None:
    cfg = RunConfig.from_dict({"hidden": [32, 16], "critic_hidden": "64x64"})
    assert cfg.hidden == (32, 16) and cfg.critic_hidden == (64, 64)
    cfg = RunConfig.from_dict({"hidden": "400, 300"})
    assert cfg.hidden == (400, 300)


# -- files -------------------------------------------------------------------------------------------
def test_from_file_loads_toml(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('env_id = "Swimmer-v5"\nhidden = [64, 64]\ntotal_steps = 5000\n'
                    'env_kwargs = { ctrl_cost_weight = 0.001 }\n')
    cfg = RunConfig.from_file(path)
    assert cfg.env_id == "Swimmer-v5"
    assert cfg.hidden == (64, 64) and cfg.total_steps == 5000
    assert cfg.r == "adaptive" and cfg.rl_ratio == 0.1  # the preset still applies under the file
    assert cfg.env_kwargs == {"ctrl_cost_weight": 0.001}
    cfg.validate()


def test_from_file_loads_json_and_overrides_win(tmp_path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"env_id": "Hopper-v5", "rl_ratio": 0.25, "seed": 3, "r": "paper"}))
    cfg = RunConfig.from_file(path, seed=9, env_id=None)
    assert cfg.env_id == "Hopper-v5" and cfg.fitness_scale == 600.0 and cfg.rl_ratio == 0.25 and cfg.seed == 9
    cfg = RunConfig.from_file(path, env_id="Walker2d-v5")
    assert cfg.env_id == "Walker2d-v5" and cfg.resolve().r == 800.0


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.toml", 'env_id = "Hopper-v5"\nhidden = [64, \n'),
        ("bad.json", '{"env_id": "Hopper-v5", }'),
        ("list.json", "[1, 2, 3]"),
        ("scalar.json", "42"),
    ],
)
def test_malformed_file_raises_config_error_naming_the_file(tmp_path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_file(path)
    assert err.value.field == "file"
    assert str(path) in str(err.value)


def test_missing_file_and_missing_env_id(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_file(tmp_path / "nope.toml")
    assert err.value.field == "file" and "nope.toml" in str(err.value)
    path = tmp_path / "noenv.toml"
    path.write_text("seed = 1\n")
    with pytest.raises(ConfigError) as err:
        RunConfig.from_file(path)
    assert err.value.field == "env_id" and str(path) in str(err.value)


def test_file_with_unknown_field_names_it(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('env_id = "Hopper-v5"\nsigma = 0.1\n')
    with pytest.raises(ConfigError) as err:
        RunConfig.from_file(path)
    assert err.value.field == "sigma"


# -- resolve -----------------------------------------------------------------------------------------
def test_resolve_reads_dimensions_off_the_environment() -> None:
    cfg = RunConfig.from_preset("Pendulum-v1").resolve()
    assert (cfg.obs_dim, cfg.act_dim, cfg.max_action, cfg.max_episode_steps) == (3, 1, 2.0, 200)
    assert isinstance(cfg.max_action, float)
    assert cfg.actor_dim == nets.actor_param_count(3, 1, cfg.hidden)
    assert cfg.actor_dim == (3 * 64 + 64) + (64 * 64 + 64) + (64 * 1 + 1)
    assert cfg.run_id.startswith("Pendulum-aesrl-") and cfg.created_at > 0
    cfg.validate()  # the generated run id is itself valid


def test_resolve_keeps_a_given_run_id() -> None:
    cfg = RunConfig.from_preset("AesrlNull-v0", run_id="mine", env_kwargs={"episode_len": 7}).resolve()
    assert cfg.run_id == "mine" and cfg.max_episode_steps == 7 and cfg.obs_dim == 3


def test_resolve_of_unknown_env_names_env_id() -> None:
    for env_id in ("NoSuchEnv-v0", "no_such_module_xyz:Env-v0"):
        with pytest.raises(ConfigError) as err:
            RunConfig.from_preset(env_id).resolve()
        assert err.value.field == "env_id", env_id


def test_resolve_with_bad_env_kwargs_names_env_kwargs() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_preset("AesrlNull-v0", env_kwargs={"no_such_kwarg": 1}).resolve()
    assert err.value.field == "env_kwargs"


def test_resolve_validates_first() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_preset("Pendulum-v1", algo="nope").resolve()
    assert err.value.field == "algo"


# -- spec_hash and the stored blob ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def null_cfg() -> RunConfig:
    return RunConfig.from_preset("AesrlNull-v0", run_id="hash-test").resolve()


def test_spec_hash_survives_the_blob_round_trip(null_cfg: RunConfig) -> None:
    d = null_cfg.to_dict()
    assert d["spec_hash"] == null_cfg.spec_hash and len(d["spec_hash"]) == 16
    back = load_config_blob(pack(d))
    assert back.spec_hash == null_cfg.spec_hash
    assert back == null_cfg  # every field, hidden back to a tuple included
    assert back.hidden == (8, 8) and isinstance(back.hidden, tuple)
    assert load_config_blob(pack(back.to_dict())).spec_hash == null_cfg.spec_hash


def test_spec_hash_round_trip_with_env_kwargs_and_a_named_r() -> None:
    cfg = RunConfig.from_preset("AesrlNull-v0", r="adaptive", env_kwargs={"episode_len": 20}).resolve()
    back = load_config_blob(pack(cfg.to_dict()))
    assert back.spec_hash == cfg.spec_hash and back.r == "adaptive" and back.env_kwargs == {"episode_len": 20}


def test_spec_hash_follows_what_a_worker_must_agree_on(null_cfg: RunConfig) -> None:
    h = null_cfg.spec_hash
    assert dataclasses.replace(null_cfg).spec_hash == h
    for changes in ({"hidden": (8, 9)}, {"env_id": "AesrlSleep-v0"}, {"critic_hidden": (16, 8)},
                    {"activation": "leaky_relu" if null_cfg.activation != "leaky_relu" else "relu"}, {"obs_dim": 4}, {"env_kwargs": {"episode_len": 3}}):
        assert dataclasses.replace(null_cfg, **changes).spec_hash != h, changes
    for changes in ({"total_steps": 123}, {"seed": 5}, {"rl_ratio": 0.1}, {"run_id": "other"},
                    {"r": 7.0}, {"created_at": 1.0}):
        assert dataclasses.replace(null_cfg, **changes).spec_hash == h, changes


def test_load_config_blob_rejects_a_tampered_spec_hash(null_cfg: RunConfig) -> None:
    d = null_cfg.to_dict()
    d["spec_hash"] = "0" * 16
    with pytest.raises(CodecError, match="spec_hash"):
        load_config_blob(pack(d))
    # Changing the content under an unchanged hash is caught the same way.
    d = null_cfg.to_dict()
    d["hidden"] = [8, 16]
    with pytest.raises(CodecError, match="does not match"):
        load_config_blob(pack(d))
    d = null_cfg.to_dict()
    del d["spec_hash"]
    with pytest.raises(CodecError, match="spec_hash"):
        load_config_blob(pack(d))


def test_load_config_blob_rejects_unknown_fields_and_non_maps(null_cfg: RunConfig) -> None:
    d = null_cfg.to_dict()
    d["evil"] = 1
    with pytest.raises(CodecError, match="evil"):
        load_config_blob(pack(d))
    with pytest.raises(CodecError, match="map"):
        load_config_blob(pack([1, 2]))
    assert unpack(pack(null_cfg.to_dict()))["env_id"] == "AesrlNull-v0"


def test_layer_sizes_are_parsed_in_one_place() -> None:
    from aesrl_queue.config import parse_sizes

    assert parse_sizes("hidden", "400,300") == (400, 300) == parse_sizes("hidden", "400x300")
    for bad in ("", "a,b", "4,y"):
        with pytest.raises(ConfigError, match="hidden"):
            parse_sizes("hidden", bad)
    assert RunConfig.from_dict({"hidden": "8,8"}).hidden == (8, 8)


def test_spec_hash_is_cached_until_a_field_it_covers_changes() -> None:
    cfg = RunConfig.from_preset("AesrlNull-v0")
    first = cfg.spec_hash
    assert cfg.spec_hash == first == cfg._hash_spec()
    cfg.seed = 99  # not part of the spec
    assert cfg.spec_hash == first
    cfg.hidden = (5, 5)
    assert cfg.spec_hash != first and cfg.spec_hash == cfg._hash_spec()
    cfg.env_kwargs["episode_len"] = 7  # mutated in place: still seen
    assert cfg.spec_hash == cfg._hash_spec()


def test_rule_names_have_one_source() -> None:
    from aesrl_queue import config, distributions, rules

    assert config.MEAN_RULES == rules.FITNESS_MEAN_RULES and set(rules.FITNESS_MEAN_RULES) < set(rules.MEAN_RULES)
    assert config.VAR_RULES == rules.AESRL_VAR_RULES == distributions.AESRL_VAR_RULES
    assert distributions.AESRL_MEAN_RULES == rules.MEAN_RULES


def test_a_removed_field_fails_with_a_line_that_names_it(tmp_path) -> None:
    from aesrl_queue.config import REMOVED_FIELDS

    for name in ("rl_line", "r_kinds", "rl_actor"):
        with pytest.raises(ConfigError) as err:
            RunConfig.from_dict({"env_id": "Hopper-v5", name: 1})
        assert err.value.field == name and "was removed" in str(err.value) and "\n" not in str(err.value)
        assert "known fields" not in str(err.value)
    path = tmp_path / "old.toml"
    path.write_text('env_id = "Hopper-v5"\nrandom_cap = true\n')
    with pytest.raises(ConfigError, match="random_cap: this field was removed"):
        RunConfig.from_file(path)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    assert not set(REMOVED_FIELDS) & known


def test_every_setting_has_a_help_line_and_the_departures_are_marked() -> None:
    from aesrl_queue.config import field_docs

    docs = field_docs()
    names = [d[0] for d in docs]
    assert len(docs) <= 50 and "obs_dim" not in names and "created_at" not in names
    assert all(isinstance(h, str) and h and "\n" not in h for _, _, h, _ in docs)
    departures = {name for name, _, _, departure in docs if departure}
    assert {"r", "fitness_shift", "critic_lag", "es_antithetic", "rl_ratio", "learner", "rl_steps_max"} <= departures
    assert not departures & {"mean_rule", "var_rule", "initial_steps", "job_timeout"}
    assert dict((d[0], d[1]) for d in docs)["hidden"] == RunConfig().hidden
