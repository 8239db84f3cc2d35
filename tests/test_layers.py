"""Layering: the node and the maths know nothing about Flower; the ServerApp never imports the
ClientApp. Each check runs in a fresh interpreter, so nothing imported by other tests hides a leak."""

import subprocess
import sys

import pytest

CHECK = """
import sys
import {modules}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {banned!r})
assert not leaked, leaked[:5]
"""


@pytest.mark.parametrize("modules,banned", [
    ("ftis_flwr.node, ftis_flwr.loss, ftis_flwr.advantages, ftis_flwr.groups, ftis_flwr.node_state, "
     "ftis_flwr.align, ftis_flwr.loss_chunks, ftis_flwr.token_bytes, ftis_flwr.aligned, ftis_flwr.intake, "
     "ftis_flwr.tiny_bpe",
     ("flwr",)),
    ("server_app.server_app, ftis_flwr.strategy", ("clients",)),
])
def test_imports_stay_in_their_layer(modules, banned):
    out = subprocess.run([sys.executable, "-c", CHECK.format(modules=modules, banned=banned)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
