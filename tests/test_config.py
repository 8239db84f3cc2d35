"""Typed configs: merge order, validation in one place, clear errors."""

import pytest

from ftis_flwr.config.merge import flat_to_nested, resolve_preset
from ftis_flwr.config.schema import ConfigError, ExperimentConfig, to_dict
from ftis_flwr.experiment import from_dict, load_experiment


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


# --- flwr run-config keys, typed values, registries as the source of truth (issue #11) -----------

from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _through_flower(run_config: str) -> dict:
    """What the ServerApp's context.run_config holds for `flwr run . --run-config <run_config>`:
    Flower's own parsing and its check against the declared keys of the real pyproject.toml."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    return get_fused_config_from_dir(REPO, parse_config_args([run_config]))


def test_run_config_reaches_every_section_through_flower_and_the_real_merge():
    from server_app.server_app import experiment_from_run_config

    run_config = _through_flower(
        "loss.trunc-c=3 loss.filter-action='drop' advantage.scale-rewards='none' "
        "wire.logprob-dtype='bf16' rollout.group-size=8.0 rollout.top-p='0.9' train.lr='1e-4' "
        "train.micro-batch-size=32 rounds.num-rounds=3 rounds.round-timeout=60 task.seed=7 "
        "worker-idle-timeout=300 overrides='nodes.0.lr=1e-3 nodes.large.lora=true nodes.1.g.kind=linear'")
    cfg = experiment_from_run_config(run_config)
    assert cfg.preset == "cpu-pair" and cfg.loss.method == "f-tis"  # "" = the preset decides
    assert cfg.loss.trunc_c == 3.0 and isinstance(cfg.loss.trunc_c, float)
    assert cfg.loss.filter_action == "drop" and cfg.advantage.scale_rewards == "none"
    assert cfg.wire.logprob_dtype == "bf16"
    assert cfg.rollout.group_size == 8 and isinstance(cfg.rollout.group_size, int)
    assert cfg.rollout.top_p == 0.9 and cfg.train.lr == 1e-4 and cfg.train.micro_batch_size == 32
    assert cfg.rounds.num_rounds == 3 and cfg.rounds.round_timeout == 60.0
    assert cfg.task.seed == 7 and cfg.worker_idle_timeout == 300.0
    assert cfg.nodes[0].lr == 1e-3 and cfg.nodes[1].lora is True and cfg.nodes[1].g.kind == "linear"
    assert cfg.nodes[0].lora is False and cfg.nodes[1].lr is None


def test_flower_accepts_every_generated_key_and_rejects_undeclared_ones():
    from ftis_flwr.config.keys import run_config_keys

    keys = run_config_keys()
    assert {"loss.method", "train.micro-batch-size", "wire.max-groups", "run-dir"} <= set(keys)
    fused = _through_flower(" ".join(f"{k}='x'" for k in keys))
    assert all(fused[k] == "x" for k in keys)
    with pytest.raises(ValueError, match="nodes.0.lr"):  # why per-node fields go via `overrides`
        _through_flower("nodes.0.lr=0.1")


@pytest.mark.parametrize("value, expected", [
    ({"rollout.group-size": 8.0}, 8), ({"rollout.group-size": "8"}, 8), ({"rollout.group-size": "8.0"}, 8),
    ({"train.lr": "1e-4"}, 1e-4), ({"train.lr": 1}, 1.0), ({"nodes.0.lora": "true"}, True),
    ({"nodes.0.lora": 0}, False), ({"nodes.0.lr": "none"}, None),
])
def test_typed_values_are_converted_to_the_field_type(value, expected):
    cfg = load_experiment(overrides=value)
    key = next(iter(value)).replace("-", "_")
    got = cfg.nodes[0] if key.startswith("nodes.0.") else cfg
    for part in key.removeprefix("nodes.0.").split("."):
        got = getattr(got, part)
    assert got == expected and type(got) is type(expected)


def test_every_error_is_listed_at_once_without_a_traceback_chain():
    with pytest.raises(ConfigError) as err:
        load_experiment(overrides={"rollout.group-size": 8.5, "train.lr": "fast", "nodes.0.lora": "maybe",
                                   "loss.methd": "tis", "nodes.9.lr": 0.1, "loss.method": "ppo",
                                   "rollout.top_p": 2.0, "nodes.0.engine": "nope"})
    msg = str(err.value)
    for fragment in ("rollout.group_size=8.5 is not an integer", "train.lr='fast' is not a number",
                     "nodes.0.lora='maybe' is not a boolean", "unknown configuration keys: loss.methd.", "nodes.9",
                     "loss.method='ppo'", "rollout.top_p=2.0", "nodes[a].engine='nope'"):
        assert fragment in msg, (fragment, msg)
    assert msg.startswith("invalid configuration (8 errors)")
    assert err.value.__cause__ is None and err.value.__context__ is None


def test_bad_choices_name_the_configured_values():
    from ftis_flwr.config import choices

    with pytest.raises(ConfigError) as err:
        load_experiment(overrides={"loss.filter_rule": "xor", "task.name": "nope", "nodes.0.engine": "x",
                                   "wire.logprob_dtype": "fp8", "loss.method": "nope"})
    msg = str(err.value)
    assert ", ".join(choices.FILTER_RULES) in msg and ", ".join(choices.TASK_NAMES) in msg
    assert ", ".join(choices.ENGINES) in msg and ", ".join(choices.LOGPROB_CODECS) in msg
    assert "loss.method='nope' is not one of" in msg and "f-tis" in msg


def test_the_configured_choices_are_what_the_code_implements():
    """config.choices declares each vocabulary torch-free; the modules that implement them agree."""
    from ftis_flwr.config import choices
    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.maths.loss import LOSS_REGISTRY
    from ftis_flwr.node.tiny.models import TINY_SIZES
    from ftis_flwr.tasks import make_task
    from ftis_flwr.wire.compact import LP_CODECS

    assert set(choices.BUILTIN_LOSSES) <= set(LOSS_REGISTRY)
    assert set(TINY_SIZES) == set(choices.TINY_SIZES)
    assert set(LP_CODECS) == set(choices.LOGPROB_CODECS)
    from ftis_flwr.tasks.registry import _PREFIXES, _TASKS

    assert set(choices.TASK_NAMES) == set(_TASKS) and set(choices.TASK_PREFIXES) == set(_PREFIXES)
    for name in choices.TASK_NAMES:  # builds lazily: nothing is read or downloaded here
        assert make_task(TaskConfig(name=name, dataset="json", data_files={"train": "x.jsonl"})) is not None


def test_validation_needs_no_torch():
    """The choices are torch-free: validating a whole preset imports neither torch nor transformers."""
    import subprocess
    import sys

    script = ("import sys; from ftis_flwr.experiment import load_experiment; load_experiment('cpu-xtok');"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


@pytest.fixture
def registered_loss():
    from ftis_flwr.maths.loss import LOSS_REGISTRY, register_loss

    before = dict(LOSS_REGISTRY)

    @register_loss("test-plain-pg", "f-test-plain-pg")
    def plain_pg(terms, cfg):
        return -terms.lp * terms.adv

    yield plain_pg
    LOSS_REGISTRY.clear()
    LOSS_REGISTRY.update(before)


def test_user_registered_loss_is_selectable_from_a_preset_yaml(tmp_path, registered_loss):
    preset = tmp_path / "my-preset.yaml"
    preset.write_text("loss: {method: f-test-plain-pg}\nrounds: {num_rounds: 2}\n")
    cfg = load_experiment(str(preset))
    assert cfg.loss.method == "f-test-plain-pg" and cfg.rounds.num_rounds == 2


LOSS_MODULE = '''
from ftis_flwr.maths.loss import register_loss


def my_loss(terms, cfg):
    return -terms.lp * terms.adv


@register_loss("by-name-in-module")
def _registered(terms, cfg):
    return -terms.lp * terms.adv
'''


@pytest.fixture
def loss_module(tmp_path, monkeypatch):
    from ftis_flwr.maths.loss import LOSS_REGISTRY

    name = f"user_losses_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(LOSS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(LOSS_REGISTRY)
    yield name
    LOSS_REGISTRY.clear()
    LOSS_REGISTRY.update(before)


def test_import_path_loss_is_imported_and_registered_on_first_use(loss_module):
    import torch

    from ftis_flwr.config.schema import LossConfig
    from ftis_flwr.maths.loss import LOSS_REGISTRY, LossInputs, compute_loss, is_filtered

    for method in (f"{loss_module}:my_loss", f"f-{loss_module}:my_loss", f"{loss_module}:by-name-in-module"):
        cfg = load_experiment(overrides={"loss.method": method})
        assert cfg.loss.method == method and method in LOSS_REGISTRY
    assert is_filtered(f"f-{loss_module}:my_loss") and not is_filtered(f"{loss_module}:my_loss")
    lp = torch.zeros(2, 3, requires_grad=True)
    out = compute_loss(LossInputs(lp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]),
                                  torch.ones(2, 3, dtype=torch.bool), torch.tensor([False, True])),
                       LossConfig(method=f"{loss_module}:my_loss"))
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0] * 3, [1.0] * 3]) / 6)


def test_bad_import_path_loss_is_a_config_error(loss_module):
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        load_experiment(overrides={"loss.method": "no_such_module_xyz:fn"})
    with pytest.raises(ConfigError, match="has no loss function or registered loss 'nope'"):
        load_experiment(overrides={"loss.method": f"{loss_module}:nope"})


def test_node_worker_imports_an_import_path_loss_when_it_builds_the_experiment(loss_module, tmp_path):
    """A fresh process, like a node worker: ``_Server._load`` must register the loss itself."""
    import json
    import os
    import subprocess
    import sys

    cfg = load_experiment(overrides={"loss.method": f"{loss_module}:my_loss"})
    (tmp_path / "spec.json").write_text(json.dumps({"experiment": to_dict(cfg), "card": to_dict(cfg.nodes[0]),
                                                    "cache_dir": str(tmp_path)}))
    script = f"""
import ftis_flwr.node.node, ftis_flwr.node.host.worker as w
from pathlib import Path
ftis_flwr.node.node.Node = lambda card, experiment, cache_dir, ranks: experiment  # no model: the experiment
server = w._Server(Path({str(tmp_path)!r}))
server._load()
experiment = server.node
from ftis_flwr.maths.loss import get_loss_fn
print("OK", get_loss_fn(experiment.loss.method).__name__)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK my_loss" in proc.stdout, proc.stderr[-2000:]


def test_from_dict_stays_cheap_for_the_per_message_client_app():
    """The ClientApp rebuilds the experiment per message: it must not import torch to validate."""
    import subprocess
    import sys

    script = ("import sys; from ftis_flwr.experiment import from_dict, load_experiment;"
              "from ftis_flwr.config.schema import to_dict, ExperimentConfig;"
              "from_dict(to_dict(ExperimentConfig())); print(sorted(m for m in ('torch', 'transformers') "
              "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_run_config_file_and_overrides_and_missing_file(tmp_path):
    from ftis_flwr.experiment import load_run_config

    text = tmp_path / "exp.yaml"
    text.write_text("rounds: {num_rounds: 4}\nnodes:\n  - {name: x}\n  - {name: y, seed: 5}\n")
    cfg = load_run_config({"preset": "", "config-file": str(text), "rounds.num-rounds": "",
                           "overrides": "nodes.y.tiny-size=large 'nodes.0.lora-config.target-modules=q_proj, v_proj'"})
    assert cfg.rounds.num_rounds == 4 and cfg.nodes[1].tiny_size == "large" and cfg.nodes[1].seed == 5
    assert cfg.nodes[0].lora_config.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="no such file"):
        load_run_config({"config-file": str(tmp_path / "missing.yaml")})
    with pytest.raises(ConfigError, match="is not key=value"):
        load_run_config({"overrides": "nodes.0.lr"})


def test_yaml_type_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(ConfigError, match=r"YAML config.*rollout.group_size"):
        load_experiment(yaml_text="rollout: {group_size: many}\n")


def test_server_app_prints_one_short_message_and_fails_the_run(capsys):
    import logging

    from flwr.app import Context, RecordDict

    from server_app.server_app import main

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"preset": "cpu-pair", "loss.method": "ppo", "rollout.group-size": 1.5})
    ours, flwr_log = logging.getLogger("ftis_flwr"), logging.getLogger("flwr")
    saved = (list(ours.handlers), ours.level, ours.propagate, list(flwr_log.filters))
    try:
        with pytest.raises(ConfigError) as err:
            main(None, context)
        _check_short_message(capsys, err, flwr_log)
    finally:  # main() configures logging for a real run: undo it for the tests that follow
        ours.handlers[:], flwr_log.filters[:] = saved[0], saved[3]
        ours.setLevel(saved[1])
        ours.propagate = saved[2]


def _check_short_message(capsys, err, flwr_log):
    import logging

    out = capsys.readouterr().out
    assert "ftis-flwr: invalid configuration (2 errors)" in out and "loss.method='ppo'" in out
    assert "rollout.group_size=1.5 is not an integer" in out
    # Flower then logs the failure with exc_info: our filter drops the traceback.
    record = flwr_log.makeRecord("flwr", logging.ERROR, __file__, 1, "%s raised an exception", ("ServerApp",),
                                 (ConfigError, err.value, err.value.__traceback__))
    assert all(f.filter(record) for f in flwr_log.filters)
    assert record.exc_info is None and "listed above" in record.getMessage()


def test_worker_idle_timeout_must_outlast_a_round():
    from ftis_flwr.config.schema import ConfigError

    assert load_experiment("cpu-pair").idle_timeout() == 3 * 600.0
    with pytest.raises(ConfigError, match="at least twice rounds.round_timeout"):
        load_experiment("cpu-pair", {"worker_idle_timeout": 900, "rounds.round_timeout": 600})
    assert load_experiment("cpu-pair", {"worker_idle_timeout": 1200}).idle_timeout() == 1200


def test_a_yaml_layers_problems_are_all_named_with_their_lines():
    """Unknown keys, values of the wrong type and bad bounds of a YAML layer, at once, each with
    its line; a value a flat key sets afterwards is blamed on the flat key, not on the file."""
    text = "rounds:\n  num_rounds: -3\n  colour: red\ntrain: {lr: 0, micro_batch_size: many}\n"
    with pytest.raises(ConfigError) as err:
        load_experiment(yaml_text=text, overrides={"train.lr": -1}, yaml_name="config-file 'x.yaml'")
    lines = str(err.value).splitlines()
    assert "invalid configuration (4 errors):" in lines[0]
    assert "  - config-file 'x.yaml', line 2, column 3: rounds.num_rounds=-3 must be >= 1" in lines
    assert any(ln.startswith("  - config-file 'x.yaml', line 3, column 3: unknown key 'rounds.colour'; the keys "
                             "of rounds: eval_every,") for ln in lines)
    assert "  - config-file 'x.yaml', line 4, column 16: train.micro_batch_size='many' is not an integer" in lines
    assert "  - train.lr=-1.0 must be > 0" in lines  # the flat key's value, not the file's line


def test_a_yaml_layer_gives_the_same_experiment_as_before():
    """Every shipped preset reads as OmegaConf reads it, dashes in keys allowed, 1e-4 a float."""
    cfg = load_experiment(yaml_text="rollout: {group-size: 4}\ntrain: {lr: 1e-4}\n")
    assert cfg.rollout.group_size == 4 and cfg.train.lr == 1e-4
    with pytest.raises(ConfigError, match=r"the YAML config: the file must be a mapping"):
        load_experiment(yaml_text="- 1\n- 2\n")


def test_a_missing_preset_or_file_does_not_hide_the_other_problems(tmp_path):
    from ftis_flwr.experiment import load_run_config

    with pytest.raises(ConfigError) as err:
        load_run_config({"preset": "nope", "config-file": str(tmp_path / "missing.yaml"), "train.lr": 0,
                         "overrides": "nodes.0.lr"})
    msg = str(err.value)
    assert "(4 errors)" in msg and "preset 'nope' is neither" in msg and "no such file here" in msg
    assert "'nodes.0.lr' is not key=value" in msg and "train.lr=0.0 must be > 0" in msg
