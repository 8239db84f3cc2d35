"""The README's "own ServerApp" example, taken verbatim from README.md, run in a Flower simulation
with this project's ClientApp (the offline default for 3 rounds)."""

import json
import re
from pathlib import Path

import pytest
from conftest import kill_workers

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parent.parent / "README.md"


def readme_block(section: str) -> str:
    text = README.read_text().split(f"## {section}", 1)[1]
    return text.split("```python", 1)[1].split("```", 1)[0]


def test_the_readme_own_serverapp_example_runs(tmp_path, monkeypatch, capsys):
    from flwr.simulation import run_simulation

    from clients.client_app import app as client_app

    monkeypatch.setenv("FTIS_CACHE", str(tmp_path / "cache"))  # workers inherit it
    monkeypatch.chdir(tmp_path)  # the example's runs/ folder lands here
    namespace: dict = {}
    exec(compile(readme_block("Using the strategy in your own ServerApp"), "README.md", "exec"), namespace)
    try:
        run_simulation(namespace["app"], client_app, num_supernodes=2,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        kill_workers(tmp_path / "cache")
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("round ")] == \
        [f"round {r}" for r in range(4)]
    final = [line for line in out.splitlines() if line.startswith("final models:")]
    assert len(final) == 1
    (checkpoints,) = (tmp_path / "runs").glob("*/checkpoints")
    # the run is named as the ServerApp names its runs
    assert re.fullmatch(r"\d{8}-\d{6}-cpu-pair-vertical-f-tis-[0-9a-f]{4}", checkpoints.parent.name)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["large", "small"]
    assert json.loads((checkpoints / "small" / "ftis_policy.json").read_text())["kind"] == "full"
