"""The deployment recipe, run verbatim from docs/deployment.md: a SuperLink and two SuperNodes on
ports the user chose, the federation added to ``$FLWR_HOME/config.toml``, ``ftis-flwr run`` to it,
and every process stopped by the block's own last line."""

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import doc_block, flower_bin, free_port, kill_workers

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def _group(pgid: int, wait: float = 30.0) -> list[str]:
    """Live processes of process group ``pgid`` (every process the block started), after up to
    ``wait`` seconds for them to exit."""
    import time

    deadline = time.monotonic() + wait
    while True:
        rows = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat=,args="], capture_output=True,
                              text=True).stdout.splitlines()
        live = [r for r in rows if int(r.split()[1]) == pgid and not r.split()[2].startswith("Z")]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(1)


def test_the_readme_deployment_recipe_runs_verbatim(tmp_path):
    block = doc_block("Deployment across institutions", "bash", "docs/deployment.md")
    home, cache = tmp_path / "flwr-home", tmp_path / "cache"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n')  # a config.toml that exists already
    port = free_port()
    while port > 65000:  # the SuperNodes take the two ports after it
        port = free_port()
    env = dict(os.environ, FLWR_HOME=str(home), PORT=str(port), FTIS_CACHE=str(cache),
               PATH=f"{flower_bin()}{os.pathsep}{os.environ['PATH']}")
    before = set((REPO / "runs").glob("*")) if (REPO / "runs").exists() else set()
    log = tmp_path / "block.log"
    # output to a file, not a pipe: a process the block left behind (when a line before the kill
    # failed) would hold a pipe open and hang the test until its timeout, hiding what failed
    with log.open("w") as sink:
        shell = subprocess.Popen(["bash", "-e", "-c", block], cwd=REPO, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            shell.wait(timeout=600)
        finally:
            left = _group(shell.pid, wait=30.0 if shell.poll() is not None else 0.0)
            if left:
                os.killpg(shell.pid, signal.SIGKILL)
            kill_workers(cache)
            out = log.read_text()
            # only the run directories this block named: other tests may be writing runs/ now
            for d in set((REPO / "runs").glob("*")) - before:
                if str(d) in out:
                    subprocess.run(["rm", "-rf", str(d)])
            print(out[-8000:])
    assert shell.returncode == 0, out[-4000:]
    assert "ftis-flwr: configuration valid: 2 nodes (small, large), 2 rounds" in out, out[-4000:]
    assert "the run failed" not in out, out[-4000:]
    assert "round 2/2" in out and "finished:completed" in out, out[-4000:]
    assert f"[superlink.mine-{port}]" in (home / "config.toml").read_text()
    assert not left, "processes left running after the block's kill line:\n" + "\n".join(left)
