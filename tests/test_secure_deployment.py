"""Authenticated deployment: TLS-only SuperLink with SuperNode auth, two registered SuperNodes
train the offline default for one round, SuperNodes with an unregistered key or none are refused,
and a registered SuperNode claiming a card pinned to another key is left out.

Runs deploy/secure_local.py's ``main`` (loopback only, CPU); it stops every process it starts.
"""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("secure_local", REPO / "deploy" / "secure_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tls_and_supernode_auth(tmp_path):
    res = _script().main(["--workdir", str(tmp_path / "secure"), "--rounds", "1"])
    logs = f"logs in {res['workdir']}/logs"

    # TLS only: the SuperLink was started without --insecure; HTTPS trusted by our CA answers,
    # plain HTTP and HTTPS without our CA do not, and the CLI with insecure = true cannot list.
    cmd = res["superlink_cmd"]
    assert "--insecure" not in cmd and "--enable-supernode-auth" in cmd
    assert res["tls"]["https_with_ca"].startswith("HTTP "), res["tls"]
    assert res["tls"]["plain_http"].startswith("refused"), res["tls"]
    assert "CERTIFICATE_VERIFY_FAILED" in res["tls"]["https_system_trust"], res["tls"]
    assert res["insecure_cli"]["returncode"] != 0, res["insecure_cli"]

    # Only the two registered keys got in. A third, unregistered key is refused at ActivateNode
    # (that alone Flower does even without --enable-supernode-auth); a SuperNode with no key is
    # refused at RegisterNode, which is what --enable-supernode-auth adds.
    assert sorted(res["registered"]) == ["impostor", "large", "small"]
    for name, refusal in (("intruder", "[code: 2004] Failed to activate SuperNode."),
                          ("anonymous", "[code: 2001] SuperNode authentication is enabled.")):
        out = res[name]
        evidence = "\n".join(out["evidence"])
        assert out["exit_code"] == 1, (name, out, logs)
        assert "Exit Code: 305" in evidence and refusal in evidence, (name, out, logs)
    assert res["checks"]["only_registered_listed"], logs
    refused_calls = [line.split('"POST ')[1].split()[0] for line in res["superlink_412"]]
    assert refused_calls == ["/v1/fleet/activate-node", "/v1/fleet/register-node"], res["superlink_412"]

    # A registered SuperNode claiming card "small", which is pinned to small's key, is left out
    # and named; the federation itself ran to the end, both real nodes in every round.
    assert res["checks"]["impostor_left_out"], res.get("left_out")
    assert res.get("run_returncode") == 0, logs
    assert res["rounds"] == [0, 1], logs
    assert res["nodes_per_round"] == [["large", "small"]] * 2, logs
    assert res["ok"], res["checks"]
