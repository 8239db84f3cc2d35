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
    ("ftis_flwr.node.node, ftis_flwr.maths.loss, ftis_flwr.maths.advantages, ftis_flwr.wire.groups, ftis_flwr.node.state, "
     "ftis_flwr.xtok.align, ftis_flwr.maths.loss_chunks, ftis_flwr.xtok.token_bytes, ftis_flwr.xtok.translate, ftis_flwr.node.intake, "
     "ftis_flwr.node.tiny_bpe",
     ("flwr",)),
    ("server_app.server_app, ftis_flwr.server.strategy", ("clients",)),
])
def test_imports_stay_in_their_layer(modules, banned):
    out = subprocess.run([sys.executable, "-c", CHECK.format(modules=modules, banned=banned)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
