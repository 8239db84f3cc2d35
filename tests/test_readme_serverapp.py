"""The "own ServerApp" example, taken verbatim from docs/own-serverapp.md (its pyproject.toml and
ServerApp), run with ``flwr run`` and this project's ClientApp (the offline default for 3 rounds)."""

import json
import re
from pathlib import Path

import pytest
from conftest import doc_block, kill_workers
from test_flwr_run import superlink  # noqa: F401  (the SuperLink fixture the flwr run test owns)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
PAGE, SECTION = "docs/own-serverapp.md", "Using the strategy in your own ServerApp"


def test_the_readme_own_serverapp_app_runs_with_flwr_run(tmp_path, superlink):  # noqa: F811
    """The page's pyproject.toml and ServerApp block as a folder of their own, with this
    project's clients/ copied in, run with ``flwr run`` against a SuperLink this test owns."""
    import shutil
    import subprocess

    from conftest import flower_bin

    app = tmp_path / "my-federation"
    shutil.copytree(REPO / "clients", app / "clients", ignore=shutil.ignore_patterns("__pycache__"))
    (app / "my_server.py").write_text(doc_block(SECTION, "python", PAGE))
    (app / "pyproject.toml").write_text(doc_block(SECTION, "toml", PAGE))
    cache = tmp_path / "cache"
    env = dict(superlink, FTIS_CACHE=str(cache))
    cmd = [str(flower_bin() / "flwr"), "run", ".", "--stream", "--federation-config",
           "num-supernodes=2 client-resources-num-cpus=1"]
    try:
        proc = subprocess.run(cmd, cwd=app, env=env, capture_output=True, text=True, timeout=600)
    finally:
        kill_workers(cache)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len([line for line in out.splitlines() if line.startswith("final models:")]) == 1, out[-4000:]
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("round ")] == \
        [f"round {r}" for r in range(4)], out[-4000:]
    # the page's relative runs/ resolves on the server: under the SuperLink's working directory
    (checkpoints,) = (tmp_path / "runs").glob("*/checkpoints")
    # the run is named as the ServerApp names its runs
    assert re.fullmatch(r"\d{8}-\d{6}-arithmetic-cpu-pair-vertical-f-tis-[0-9a-f]{4}", checkpoints.parent.name)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["large", "small"]
    assert json.loads((checkpoints / "small" / "ftis_policy.json").read_text())["kind"] == "full"
