"""TrainConfig: validation that names the flag, the generated command line, and to_argv."""

import argparse

import pytest

from ddp.program.config import DEFAULT_RUN_ID, Rendezvous, TrainConfig, flag_of
from ddp.program.flags import add_train_arguments, config_from_args


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"steps": 0}, "--steps"),
        ({"batch_size": 0}, "--batch-size"),
        ({"bucket_cap_mb": -1}, "--bucket-cap-mb"),
        ({"bucket_cap_mb": float("nan")}, "--bucket-cap-mb"),
        ({"bucket_cap_mb": float("inf")}, "--bucket-cap-mb"),
        ({"model": "resnet"}, "--model"),
        ({"sync": "gossip"}, "--sync"),
        ({"collective_timeout_s": 0}, "--collective-timeout"),
        ({"backward_delay_ms": -1}, "--backward-delay-ms"),
        ({"checkpoint_every": 2}, "--checkpoint-dir"),
        ({"comm_hook": "zip"}, "--comm-hook must be one of none, fp16, bf16, powersgd"),
        ({"comm_hook": "fp16", "sync": "barrier"}, "--comm-hook fp16 needs --sync allreduce"),
        ({"steps": True}, "--steps must be an integer"),
        ({"overlap": "yes"}, "--no-overlap must be true or false"),
        ({"lr": "0.1"}, "--lr must be a finite number"),
        ({"run_id": "../up"}, "--run-id must be 1 to 64 letters, digits"),
        ({"run_id": ""}, "--run-id must be 1 to 64 letters, digits"),
        ({"run_id": "x" * 65}, "--run-id must be 1 to 64 letters, digits"),
        ({"run_id": 7}, "--run-id must be a run id, got 7"),
    ],
)
def test_bad_config_names_the_flag(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TrainConfig(**kwargs)


def test_the_run_id_is_the_flag_else_torchruns_job_id_else_the_default():
    torchrun = {"TORCHELASTIC_RUN_ID": "job7"}  # what torchrun's agents give every worker
    assert TrainConfig().resolved_run_id({}) == DEFAULT_RUN_ID == "default"
    assert TrainConfig().resolved_run_id(torchrun) == "job7"
    assert TrainConfig(run_id="mine").resolved_run_id(torchrun) == "mine"
    assert "--run-id" not in TrainConfig().to_argv()  # the default is resolved on the rank
    assert TrainConfig(run_id="mine").to_argv() == ["--run-id", "mine"]
    with pytest.raises(ValueError, match=r"TORCHELASTIC_RUN_ID 'a/b' .* pass --run-id ID"):
        TrainConfig().resolved_run_id({"TORCHELASTIC_RUN_ID": "a/b"})


def test_batch_must_split_evenly():
    with pytest.raises(ValueError, match="not divisible by the world size 4"):
        TrainConfig(batch_size=10).local_batch(4)


def test_rendezvous_from_torchrun_env():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert Rendezvous.from_env(env) == Rendezvous(1, 2, "env://")
    with pytest.raises(ValueError, match="MASTER_PORT"):
        Rendezvous.from_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "x"})
    with pytest.raises(ValueError, match="--rank"):
        Rendezvous(3, 2, "env://")
    assert Rendezvous(1, 2, "file:///x").to_argv() == [
        "--rank",
        "1",
        "--world-size",
        "2",
        "--init-method",
        "file:///x",
    ]


def _parse(argv, **kw):
    p = argparse.ArgumentParser()
    names = add_train_arguments(p, **kw)
    return config_from_args(p.parse_args(argv), names)


def test_defaults_need_no_flags():
    assert TrainConfig().to_argv() == []
    assert _parse([]) == TrainConfig()


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(steps=5, bucket_cap_mb=0.1, overlap=False, model="deep", lr=1 / 3),
        TrainConfig(sync="none", reference=False, log_dir="/x", emit_records=True, seed=7),
        TrainConfig(checkpoint_every=2, checkpoint_dir="/c", resume=True, step_delay_ms=2.5),
        TrainConfig(collective_timeout_s=12.5, tolerance=1e-7, backward_delay_ms=0.001),
    ],
)
def test_to_argv_round_trips_exactly(cfg):
    """What lab hands to a rank must rebuild the very config it meant (floats bit for bit)."""
    argv = cfg.to_argv()
    assert _parse(argv) == cfg
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags))


def test_every_field_has_a_flag_and_help():
    import dataclasses

    p = argparse.ArgumentParser()
    names = add_train_arguments(p)
    assert names == [f.name for f in dataclasses.fields(TrainConfig)]
    helps = {a.dest: a.help for a in p._actions}
    assert all(helps[n] for n in names)
    assert flag_of("overlap") == "--no-overlap" and flag_of("resume") == "--resume"
    assert flag_of("collective_timeout_s") == "--collective-timeout"


def test_groups_and_keep_unset():
    p = argparse.ArgumentParser()
    names = add_train_arguments(p, ("train",), keep_unset=True)
    assert "log_dir" not in names and "steps" in names
    args = p.parse_args(["--steps", "3"])
    assert vars(args) == {"steps": 3}
    base = TrainConfig(model="deep", steps=9)
    assert config_from_args(args, names, base) == TrainConfig(model="deep", steps=3)


def test_from_dict_refuses_unknown_keys():
    assert TrainConfig.from_dict({"steps": 3}) == TrainConfig(steps=3)
    with pytest.raises(ValueError, match=r"unknown key.*stpes"):
        TrainConfig.from_dict({"stpes": 3})
    with pytest.raises(ValueError, match="unknown training setting"):
        TrainConfig().replace(stpes=3)
