"""Typed configs: merge order, validation in one place, clear errors."""

import pytest

from ftis_flwr.config import (ConfigError, ExperimentConfig, flat_to_nested, from_dict, load_experiment,
                              resolve_preset, to_dict)


def test_defaults_are_the_papers():
    cfg = load_experiment()
    assert cfg.loss.method == "f-tis" and cfg.loss.trunc_c == 2.0 and cfg.loss.clip_eps == 0.2
    assert cfg.loss.kl_threshold == 50.0 and cfg.loss.filter_rule == "and"
    assert cfg.loss.filter_scope == "foreign" and cfg.loss.reduction == "sequence"
    assert cfg.advantage.mode == "vertical" and cfg.rollout.group_size == 12
    assert cfg.train.grad_clip == 1.0 and cfg.train.updates_per_round == 1


def test_flat_overrides_with_dashes_and_node_patch():
    cfg = load_experiment(overrides={"loss.method": "tis", "rollout.group-size": 8, "nodes.1.lr": 1e-3,
                                     "rounds.num_rounds": 3})
    assert cfg.loss.method == "tis" and cfg.rollout.group_size == 8 and cfg.rounds.num_rounds == 3
    assert cfg.nodes[1].lr == 1e-3 and cfg.nodes[0].lr is None


def test_yaml_then_overrides_take_priority():
    text = "loss:\n  method: vis\n  trunc_c: 3.0\nrounds:\n  num_rounds: 7\n"
    cfg = load_experiment(yaml_text=text, overrides={"loss.method": "nois"})
    assert cfg.loss.method == "nois" and cfg.loss.trunc_c == 3.0 and cfg.rounds.num_rounds == 7


def test_every_error_is_reported_at_once_with_its_key():
    with pytest.raises(ConfigError) as err:
        load_experiment(overrides={"loss.method": "ppo", "rollout.top_p": 2.0, "loss.trunc_c": -1})
    msg = str(err.value)
    assert "loss.method='ppo'" in msg and "f-tis" in msg
    assert "rollout.top_p" in msg and "loss.trunc_c" in msg


def test_unknown_key_and_bad_type_are_config_errors():
    with pytest.raises(ConfigError, match="loss.methd"):
        load_experiment(overrides={"loss.methd": "tis"})
    with pytest.raises(ConfigError, match="group_size"):
        load_experiment(overrides={"rollout.group_size": "many"})
    with pytest.raises(ConfigError, match="nodes.5"):
        load_experiment(overrides={"nodes.5.lr": 0.1})


def test_incompatible_settings_rejected():
    with pytest.raises(ConfigError, match="divisible"):
        load_experiment(overrides={"advantage.mode": "horizontal", "rollout.group_size": 5})
    with pytest.raises(ConfigError, match="max_completions_per_group"):
        load_experiment(overrides={"rollout.group_size": 80})
    with pytest.raises(ConfigError, match="needs real models"):
        load_experiment(overrides={"task.name": "gsm8k"})
    with pytest.raises(ConfigError, match="vllm needs a cuda"):
        load_experiment(overrides={"nodes.0.engine": "vllm"})
    with pytest.raises(ConfigError, match="unique"):
        load_experiment(yaml_text="nodes:\n  - {name: a}\n  - {name: a}\n")


def test_round_trip_through_plain_dict():
    cfg = load_experiment(overrides={"loss.method": "f-vis", "nodes.0.lora": True})
    again = from_dict(to_dict(cfg))
    assert again == cfg and isinstance(again, ExperimentConfig)


def test_unknown_preset_lists_available():
    with pytest.raises(ConfigError, match="cpu-pair"):
        resolve_preset("no-such-preset")


def test_flat_to_nested_skips_app_keys():
    assert flat_to_nested({"preset": "x", "loss.method": "tis"}) == {"loss": {"method": "tis"}}
