"""The CLI and configuration composition: defaults, overrides, --print-config, bad input."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml
from omegaconf import OmegaConf

from raylab.cli import main
from raylab.config import ALGOS, compose, iter_keys
from raylab.errors import UserError


def test_help_lists_subcommands(cli):
    r = cli("--help")
    assert r.returncode == 0
    for name in ("train", "eval", "tune", "bench", "metrics"):
        assert name in r.stdout


@pytest.mark.parametrize("sub", ["train", "eval", "tune", "bench", "metrics"])
def test_each_subcommand_has_help_with_defaults(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main([sub, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: raylab " + sub in out
    if sub == "train":
        # every option with its default, and every config key with its default and meaning
        assert "--algo ALGO" in out and "(default: appo)" in out
        assert "(default: microduck_balance)" in out
        cfg = compose()
        for key, _ in iter_keys(cfg):
            if key not in ("task", "sim"):
                assert f"    {key}=" in out, key


def test_print_config_is_the_composed_config(cli):
    r = cli(
        "train",
        "--algo",
        "appo",
        "--task",
        "microduck_balance",
        "training.logger=wandb",
        "training.wandb_project=raylab",
        "algo.lr=3e-4",
        "env.num_envs=64",
        "--print-config",
    )
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["task"] == "microduck_balance" and cfg["sim"] == "mujoco"
    assert cfg["algo"]["name"] == "appo"
    assert cfg["algo"]["lr"] == pytest.approx(3e-4)
    assert cfg["env"]["num_envs"] == 64
    assert cfg["training"]["logger"] == "wandb"
    assert cfg["training"]["wandb_project"] == "raylab"
    assert set(cfg) == {"task", "sim", "algo", "env", "training", "resources"}


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_each_algo_has_its_own_defaults(algo):
    cfg = compose(algo, "microduck_balance")
    assert cfg.algo.name == algo
    assert cfg.algo.algo_log_name
    # one learning rate for PPO / APPO; SAC has one per network and its temperature
    lrs = ["lr"] if algo in ("ppo", "appo") else ["actor_lr", "critic_lr", "alpha_lr"]
    assert [k for k in cfg.algo if k == "lr" or k.endswith("_lr")] == lrs


def test_algo_specific_keys_and_task_defaults():
    assert "clip_param" in compose("ppo").algo and "tau" not in compose("ppo").algo
    assert "tau" in compose("sac").algo and "vtrace" not in compose("sac").algo
    # task-level defaults sit between the algorithm defaults and the user's overrides
    assert compose("appo").env.num_envs == 32
    assert compose("appo", overrides=["env.num_envs=7"]).env.num_envs == 7


def test_a_task_sets_its_own_resources_per_algorithm():
    """TaskSpec.resources_defaults: a layer of resources.* between the defaults and the
    overrides, for the algorithm it names only (a task registered for this test)."""
    import dataclasses

    from raylab.envs.tasks import TASKS, register_task

    spec = dataclasses.replace(
        TASKS["microduck_balance"],
        name="two_runner_duck",
        resources_defaults={"appo": {"num_env_runners": 2, "num_cpus_per_env_runner": 0.5}},
    )
    register_task(spec)
    try:
        cfg = compose("appo", "two_runner_duck")
        assert (cfg.resources.num_env_runners, cfg.resources.num_cpus_per_env_runner) == (2, 0.5)
        assert compose("ppo", "two_runner_duck").resources.num_env_runners == 1
        typed = compose("appo", "two_runner_duck", overrides=["resources.num_env_runners=3"])
        assert typed.resources.num_env_runners == 3
    finally:
        del TASKS["two_runner_duck"]
    assert compose("appo").resources.num_env_runners == 1


def test_gymnasium_id_gets_the_generic_env_group():
    cfg = compose("sac", "Pendulum-v1", overrides=["env.kwargs.g=9.81"])
    assert cfg.env.gym_id == "Pendulum-v1"
    assert "reward_version" not in cfg.env
    # env.kwargs is the one open dict: new keys go to gymnasium.make
    assert cfg.env.kwargs.g == pytest.approx(9.81)


def test_override_types_are_converted():
    cfg = compose(
        "sac",
        overrides=[
            "algo.hidden=[64,64,32]",
            "training.time_budget_s=null",
            "training.seed=7",
            "training.wandb_tags=[a,b]",
            "resources.num_gpus_per_learner=0",
        ],
    )
    assert list(cfg.algo.hidden) == [64, 64, 32]
    assert cfg.training.time_budget_s is None
    assert cfg.training.seed == 7 and isinstance(cfg.training.seed, int)
    assert list(cfg.training.wandb_tags) == ["a", "b"]
    assert cfg.resources.num_gpus_per_learner == 0.0


def test_config_is_read_only():
    cfg = compose()
    from omegaconf.errors import ReadonlyConfigError

    with pytest.raises(ReadonlyConfigError):
        cfg.algo.lr = 1.0
    assert OmegaConf.is_readonly(cfg)


BAD = [
    (["--algo", "foo"], ["'foo'", "appo", "ppo", "sac"]),
    (["--task", "microduk"], ["'microduk'", "did you mean 'microduck_balance'", "Gymnasium id"]),
    (["--sim", "mujoco"], ["unrecognized arguments: --sim"]),  # one backend: not an option
    (["sim=bullet"], ["physics backend is mujoco, the only one"]),
    (["algo.lrr=1"], ["'algo.lrr'", "did you mean 'algo.lr'"]),
    (["nosuchgroup.x=1"], ["'nosuchgroup.x'", "training", "resources"]),
    (["algo.lr=abc"], ["algo.lr=abc", "float"]),
    (["env.num_envs=1.5"], ["env.num_envs=1.5", "int"]),
    (["training.logger=foo"], ["training.logger=foo", "tensorboard", "wandb"]),
    (["env.reward_version=v9"], ["v9", "v1", "v2"]),
    (["justaword"], ["'justaword'", "key=value"]),
    (["task=x"], ["--task"]),
    (["training.reward_window=0"], ["training.reward_window=0", "at least 1"]),
    (["training.eval_every=-1"], ["training.eval_every=-1", "at least 0"]),
    (["training.eval_episodes=0"], ["training.eval_episodes=0", "at least 1"]),
    # Options that cannot work under raylab train / tune: refused when composed, not accepted
    # and then failing in the EnvRunners (or doing nothing).
    (["env.info_mode=full"], ["env.info_mode=full", "RLlib", "env.info_mode=none"]),
    (["env.autoreset_mode=same_step"], ["same_step", "env.autoreset_mode=next_step"]),
    # Trace options other than trace_enabled do nothing without it.
    (["training.trace_output_dir=/tmp/t"], ["trace_output_dir=/tmp/t", "trace_enabled=true"]),
    (["training.trace_thread_time=true"], ["trace_thread_time=true", "trace_enabled=true"]),
    (["training.trace_cuda_events=true"], ["trace_cuda_events=true", "trace_enabled=true"]),
    (["env.kwargs.foo=1"], ["env.kwargs.foo", "microduck_balance has no option 'foo'"]),
    (["env.kwargs.num_pushes=1"], ["env.kwargs.num_pushes", "env.num_pushes"]),
    (["--task", "Pendulum-v1", "env.kwargs.foo=1"], ["Pendulum-v1", "unexpected keyword", "foo"]),
    (["--task", "Pendulum-v1", "env.num_threads=2"], ["env.num_threads=2", "raylab tasks only"]),
    (["resources.wait_s=-1"], ["resources.wait_s=-1", "at least 0"]),
]


@pytest.mark.parametrize("argv,needles", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(argv, needles, capsys):
    # raylab.cli.main in this process: its return value is the command's exit code
    # (test_refusals_need_no_ray runs the console script itself).
    code = main(["train", *argv, "--print-config"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("raylab")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_null_is_none_for_optional_text_fields_and_text_for_plain_ones():
    # run_config.json writes None as null; --resume reads it back through the overrides.
    cfg = compose("appo", overrides=["training.wandb_name=null", "training.trace_output_dir=null"])
    assert cfg.training.wandb_name is None and cfg.training.trace_output_dir is None
    assert compose("appo", overrides=["training.wandb_name=off"]).training.wandb_name == "off"


def test_a_run_config_reads_back_as_the_same_config(tmp_path):
    import json

    from raylab.config import to_dict
    from raylab.train import load_run_config

    cfg = compose(
        "sac", "Pendulum-v1", overrides=["training.wandb_notes=null", "algo.actor_lr=1e-3"]
    )
    (tmp_path / "run_config.json").write_text(json.dumps(to_dict(cfg)))
    assert to_dict(load_run_config(tmp_path)) == to_dict(cfg)
    # A SAC run of an earlier release wrote keys SAC never read: it still loads.
    old = to_dict(cfg)
    old["algo"].update(lr=3e-4, init_log_std=-1.0, init_policy_scale=0.01)
    (tmp_path / "run_config.json").write_text(json.dumps(old))
    assert to_dict(load_run_config(tmp_path)) == to_dict(cfg)


@pytest.mark.parametrize(
    "algo, key, needle",
    [
        ("sac", "algo.lr=1e-3", "sac has algo.actor_lr, algo.critic_lr, algo.alpha_lr"),
        ("sac", "algo.init_log_std=0", "unknown config key 'algo.init_log_std'"),
        ("sac", "algo.init_policy_scale=0.1", "unknown config key 'algo.init_policy_scale'"),
    ],
)
def test_options_an_algorithm_does_not_read_are_refused(algo, key, needle):
    """No option is accepted and ignored: SAC reads its own three learning rates and has no
    Gaussian log std, so the on-policy keys are refused with the keys it does have."""
    with pytest.raises(UserError) as e:
        compose(algo, "Pendulum-v1", overrides=[key])
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "a JSON object is expected"),
        ('{"task": 3, "sim": "mujoco", "algo": {"name": "appo"}}', "field 'task'"),
        ('{"task": "microduck_balance", "sim": "mujoco", "algo": {}}', "field 'algo.name'"),
        (
            '{"task": "microduck_balance", "sim": "mujoco", "algo": {"name": "appo", "lr": "x"}}',
            "algo.lr",
        ),
        (
            '{"task": "microduck_balance", "sim": "mujoco", "algo": {"name": "appo"}, '
            '"resources": {"colour": 1}}',
            "resources.colour",
        ),
    ],
)
def test_a_malformed_run_config_is_one_line_naming_the_file_and_field(tmp_path, content, needle):
    from raylab.train import load_run_config

    (tmp_path / "run_config.json").write_text(content)
    with pytest.raises(UserError) as e:
        load_run_config(tmp_path)
    msg = str(e.value)
    assert "run_config.json" in msg and needle in msg and "\n" not in msg, msg


def test_gymnasium_kwargs_the_env_takes_are_accepted():
    cfg = compose("ppo", "Pendulum-v1", overrides=["env.kwargs.g=9.0"])
    assert cfg.env.kwargs == {"g": 9.0}


def test_a_gymnasium_family_s_tuned_settings_apply_to_its_ids_only():
    """PPO on HalfCheetah (any version) takes the family's tuned settings over the defaults of
    every Gymnasium id; other ids and other algorithms keep those; an override still wins."""
    from raylab.envs.tasks import GYMNASIUM_ALGO_DEFAULTS, GYMNASIUM_FAMILY_ALGO_DEFAULTS

    tuned = GYMNASIUM_FAMILY_ALGO_DEFAULTS["HalfCheetah"]["ppo"]
    for gym_id in ("HalfCheetah-v5", "HalfCheetah-v4"):
        algo = OmegaConf.to_container(compose("ppo", gym_id).algo)
        assert {k: algo[k] for k in tuned} == tuned
        assert algo["normalize_obs"] and algo["scale_rewards"]  # the generic ones stay
    hopper = compose("ppo", "Hopper-v5").algo
    generic = GYMNASIUM_ALGO_DEFAULTS["ppo"]
    assert hopper.train_batch_size == generic["train_batch_size"] != tuned["train_batch_size"]
    assert (
        compose("sac", "HalfCheetah-v5").algo.critic_lr
        == GYMNASIUM_ALGO_DEFAULTS["sac"]["critic_lr"]
    )
    assert compose("ppo", "HalfCheetah-v5", overrides=["algo.num_epochs=3"]).algo.num_epochs == 3
    walker = GYMNASIUM_FAMILY_ALGO_DEFAULTS["Walker2d"]["ppo"]
    algo = OmegaConf.to_container(compose("ppo", "Walker2d-v5").algo)
    assert {k: algo[k] for k in walker} == walker and algo["hidden"] == generic["hidden"]


def test_a_gymnasium_family_s_env_settings_apply_to_its_ids_only():
    """SAC on Walker2d (any version) steps one env; SAC elsewhere and PPO keep the settings of
    every Gymnasium id; an override still wins."""
    from raylab.envs.tasks import GYMNASIUM_ENV_DEFAULTS, GYMNASIUM_FAMILY_ENV_DEFAULTS

    one = GYMNASIUM_FAMILY_ENV_DEFAULTS["Walker2d"]["sac"]["num_envs"]
    assert one != GYMNASIUM_ENV_DEFAULTS["sac"]["num_envs"]
    for gym_id in ("Walker2d-v5", "Walker2d-v4"):
        assert compose("sac", gym_id).env.num_envs == one
    assert (
        compose("sac", "HalfCheetah-v5").env.num_envs == GYMNASIUM_ENV_DEFAULTS["sac"]["num_envs"]
    )
    assert compose("ppo", "Walker2d-v5").env.num_envs == GYMNASIUM_ENV_DEFAULTS["ppo"]["num_envs"]
    assert compose("sac", "Walker2d-v5", overrides=["env.num_envs=8"]).env.num_envs == 8


def test_gpu_only_sac_options_are_refused_on_cpu_learners():
    from raylab.algorithms.build import resolve_num_gpus_per_learner

    for key in ("torch_compile", "bf16_autocast"):
        cfg = compose("sac", overrides=[f"algo.{key}=true"])
        with pytest.raises(UserError, match=f"algo.{key}=true needs a GPU learner"):
            resolve_num_gpus_per_learner(cfg, cluster_gpus=0.0)
    # With a GPU (auto picks it) the option stands; no GPU is needed to resolve the number.
    cfg = compose("sac", overrides=["algo.torch_compile=true"])
    assert resolve_num_gpus_per_learner(cfg, cluster_gpus=1.0) == 1.0


def test_compose_raises_user_error_in_process():
    with pytest.raises(UserError, match="unknown config key 'algo.nope'"):
        compose("appo", overrides=["algo.nope=1"])


def test_unknown_subcommand_is_one_line(cli):
    r = cli("fly")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "fly" in r.stderr and "train" in r.stderr


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# Refusals that the config and this machine decide: one line and exit code 2 before any Ray
# starts (RAY_TMPDIR points Ray's session folders into an empty folder that must stay empty).
NO_RAY_REFUSALS = [
    (
        ["--task", "Pendulum-v1", "resources.num_gpus_per_learner=1"],
        ["num_gpus_per_learner=1", "this machine has 0 GPU"],
    ),
    (
        ["training.trace_enabled=true", "training.trace_cuda_events=true"],
        ["trace_cuda_events=true", "GPU learners", "this machine has 0 GPU"],
    ),
    (["--algo", "sac", "algo.torch_compile=true"], ["algo.torch_compile=true", "GPU learner"]),
    (["--task", "NoSuchEnv-v9"], ["NoSuchEnv-v9"]),
    (["algo.nope=1"], ["unknown config key 'algo.nope'"]),
    (["env.push_vel_min=-1"], ["env: push_vel_min=-1.0 is invalid", ">= 0"]),
    (
        ["training.stop_eval_reward=300", "training.eval_every=0"],
        ["training.stop_eval_reward=300", "training.eval_every=0"],
    ),
    (["algo.final_max_log_std=-2"], ["algo.final_max_log_std=-2.0", "algo.max_log_std"]),
    (["algo.noise_correlation=1"], ["algo.noise_correlation=1.0", "[0, 1)"]),
    (
        ["algo.noise_correlation=0.9", "training.fast_sampler=false"],
        ["algo.noise_correlation=0.9", "training.fast_sampler=false"],
    ),
]


@pytest.mark.skipif(_has_gpu(), reason="the GPU refusals are for a machine without a GPU")
@pytest.mark.parametrize(
    "argv,needles", NO_RAY_REFUSALS, ids=[" ".join(a) for a, _ in NO_RAY_REFUSALS]
)
def test_refusals_need_no_ray(argv, needles, cli, tmp_path):
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="rlnr", dir="/tmp")  # short: Ray's socket path limit
    try:
        r = cli(
            "train",
            *argv,
            f"training.log_dir={tmp_path / 'run'}",
            "resources.dashboard=false",
            env={"RAY_TMPDIR": ray_tmp, "RAY_ADDRESS": ""},
            timeout=120,
        )
        assert r.returncode == 2, r.stderr[-2000:]
        (line,) = r.stderr.strip().splitlines()
        assert "Traceback" not in r.stderr
        for needle in needles:
            assert needle in line, (needle, line)
        assert os.listdir(ray_tmp) == [], "Ray started before the refusal"
        assert not (tmp_path / "run").exists()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
