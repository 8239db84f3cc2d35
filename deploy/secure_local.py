"""Authenticated deployment on loopback: TLS + registered SuperNode keys (Flower 1.42).

    python deploy/secure_local.py [--workdir DIR] [--rounds 2]

What it shows, step by step, with nothing leaving 127.0.0.1:
  1. a private CA signs a server certificate for 127.0.0.1/localhost (``<workdir>/certs``);
  2. four SuperNode key pairs (ECDSA P-384, OpenSSH format, as ``ssh-keygen -t ecdsa -b 384``);
  3. ``flower-superlink`` serves HTTPS only (no ``--insecure``) with ``--enable-supernode-auth``;
     plain HTTP and HTTPS without our CA are refused by it;
  4. the operator registers three public keys with ``flwr supernode register`` (the only way in
     1.42: ``--auth-list-public-keys`` CSV files are rejected since the switch to CLI-managed auth);
  5. SuperNodes "small" and "large" (the cards of the offline default, preset cpu-pair) connect
     with ``--root-certificates`` and their private keys, and ``flwr run`` trains for N rounds;
  6. outsiders are refused: a SuperNode whose key was never registered (ActivateNode -> HTTP 412,
     Flower error 2004) and one with no key, which would otherwise register itself (RegisterNode
     -> HTTP 412, error 2001); each logs "Exit Code: 305" and exits with status 1;
  7. each card is pinned to its SuperNode's public key (the card's ``public_key``, from a
     ``config-file``): a third SuperNode, registered and online ("impostor"), that claims card
     "small" is left out and named before round 0 (a ``node_left_out`` event), and the run goes
     on with the two real nodes.
Every process is started in its own session and stopped by process group at the end, also on
failure. ``main(argv)`` returns a dict with the evidence; the exit status is 1 if a check failed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent if (Path(sys.executable).parent / "flower-superlink").exists() \
    else Path(shutil.which("flower-superlink") or sys.executable).parent
CARDS = ("small", "large")  # node names of ftis_flwr/config/presets/cpu-pair.yaml
IMPOSTOR = "impostor"  # a registered SuperNode that claims card "small", pinned to another key
REFUSAL = "Failed to initialize the connection to the SuperLink"  # supernode/fleet_http_connection.py


def say(msg: str) -> None:
    print(f"[secure-local] {msg}", flush=True)


# ----------------------------------------------------------------------------- keys and certificates
def make_certs(out: Path) -> dict[str, Path]:
    """A private CA and a server certificate for 127.0.0.1 / localhost signed by it (EC P-256)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def cert(subject, key, issuer, issuer_key, ca: bool, sans=None):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                            critical=False))
        if ca:
            b = b.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), True)
        else:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, srv_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("ftis-flwr local CA", ca_key, "ftis-flwr local CA", ca_key, ca=True)
    srv = cert("127.0.0.1", srv_key, "ftis-flwr local CA", ca_key, ca=False,
               sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(srv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def make_node_key(out: Path, name: str) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format: ``<name>`` (private) and ``<name>.pub``."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    priv, pub = out / name, out / f"{name}.pub"
    priv.write_bytes(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.OpenSSH, s.NoEncryption()))
    priv.chmod(0o600)
    pub.write_bytes(key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH) + b"\n")
    return priv, pub


def write_pins(path: Path, pub_keys: dict[str, Path], preset: str = "cpu-pair") -> Path:
    """A config-file with the preset's cards, each pinned to its SuperNode's public key."""
    from omegaconf import OmegaConf

    from ftis_flwr.config.schema import to_dict
    from ftis_flwr.experiment import load_experiment

    nodes = to_dict(load_experiment(preset))["nodes"]
    for node in nodes:
        node["public_key"] = pub_keys[node["name"]].read_text().strip()
    path.write_text(OmegaConf.to_yaml({"nodes": nodes}))
    return path


def seed_cache(cache: Path, preset: str = "cpu-pair") -> dict[str, str]:
    """Put the preset's tiny models into ``cache`` (shipped copies, hash-checked) before the run.

    Flower runs the ClientApp from an unpacked app bundle that holds no ``.safetensors``; the
    node then looks for the shipped models in the installed distribution, and when that is an
    editable install of another checkout it finds none and warm-starts (minutes on 2 cores).
    """
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.tiny.models import find_shipped, warm_start
    from ftis_flwr.tasks import make_task

    exp = load_experiment(preset)
    task = make_task(exp.task)
    out = {}
    for card in exp.nodes:
        if card.source == "tiny":
            folder = warm_start(card, task, cache)
            out[card.name] = "shipped" if find_shipped(folder.name) else "trained here"
    return out


# ----------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    say(f"start {Path(cmd[0]).name} (log {log.name})")
    with open(log, "wb") as out:  # the child keeps its own copy of the file descriptor
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Stop one process group we started: SIGTERM, then SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def kill_workers(cache: Path) -> None:
    """SIGKILL, by pid, the node workers the federation left under its (private) cache directory,
    with whatever they started (their process groups)."""
    from ftis_flwr.node.host.processes import kill_workers_of_new_runs

    kill_workers_of_new_runs(cache, before=set())  # every run's: the cache is this script's own


def wait_for(check, proc: subprocess.Popen | None, what: str, timeout: float):
    """Poll ``check()`` until it returns something truthy; fail if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with code {proc.returncode}")
        if result := check():
            return result
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not seen within {timeout:.0f} s")


def flwr(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def node_status(env: dict, superlink: str = "secure") -> dict[str, str]:
    """``flwr supernode ls --format json``: node id -> status ('registered', 'online', ...)."""
    res = flwr(["supernode", "ls", superlink, "--format", "json"], env)
    text = res.stdout
    if res.returncode or "{" not in text:
        return {}
    data = json.loads(text[text.index("{"): text.rindex("}") + 1])
    return {n["node-id"]: n["status"] for n in data.get("nodes", [])}


# ----------------------------------------------------------------------------- TLS probes
def probe_tls(port: int, ca: Path) -> dict[str, str]:
    """HTTPS trusted by our CA answers; plain HTTP and HTTPS with the system trust store fail."""
    out = {}
    for name, make in (("https_with_ca", lambda: http.client.HTTPSConnection(
                           "127.0.0.1", port, timeout=10, context=ssl.create_default_context(cafile=str(ca)))),
                       ("https_system_trust", lambda: http.client.HTTPSConnection(
                           "127.0.0.1", port, timeout=10, context=ssl.create_default_context())),
                       ("plain_http", lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10))):
        conn = make()
        try:
            conn.request("GET", "/")
            out[name] = f"HTTP {conn.getresponse().status}"
        except (OSError, http.client.HTTPException) as exc:
            out[name] = f"refused: {type(exc).__name__}: {exc}"
        finally:
            conn.close()
    return out


# ----------------------------------------------------------------------------- main
def expect_refused(cmd: list[str], env: dict, log: Path, procs: list, timeout: float) -> dict:
    """Start a SuperNode that must be turned away; its exit code and the refusal lines of its log."""
    proc = start(cmd, env, log)
    procs.append(proc)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # still running: it got in (or hangs); checked below
        code = None
    lines = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace")).splitlines()  # no colours
    evidence = [ln.strip() for ln in lines if REFUSAL in ln or "Exit Code:" in ln or "[code:" in ln]
    return {"exit_code": code, "evidence": evidence,
            "refused": code == 1 and any("Exit Code: 305" in ln for ln in evidence)
            and any(REFUSAL in ln for ln in evidence)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-size", type=int, default=64, help="shrinks the default's 500 to keep it fast")
    ap.add_argument("--prompts-per-node", type=int, default=16)
    ap.add_argument("--refusal-timeout", type=float, default=60, help="seconds a refused node may take")
    args = ap.parse_args(argv)
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="ftis-secure-"))).resolve()
    logs, cache, runs, home = work / "logs", work / "cache", work / "runs", work / "flwr-home"
    for d in (logs, home):
        d.mkdir(parents=True, exist_ok=True)
    result: dict = {"workdir": str(work), "checks": {}, "rounds": [], "nodes_per_round": []}
    checks = result["checks"]

    certs = make_certs(work / "certs")
    keys = {name: make_node_key(work / "keys", name) for name in (*CARDS, "intruder", IMPOSTOR)}
    say(f"CA, server certificate and {len(keys)} SuperNode key pairs written under {work}")
    pins = write_pins(work / "pins.yaml", {card: keys[card][1] for card in CARDS})
    result["models"] = seed_cache(cache)
    if sorted(result["models"]) != sorted(CARDS):
        raise RuntimeError(f"the default preset's nodes are {sorted(result['models'])}, not {CARDS}")
    say(f"node models in the cache: {result['models']}")

    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "secure"\n\n'
        f'[superlink.secure]\naddress = "127.0.0.1:{port}"\nroot-certificates = "{certs["ca"]}"\n\n'
        f'[superlink.plain]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home))
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
                 ("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1"),
                 ("TOKENIZERS_PARALLELISM", "false")):
        env.setdefault(k, v)
    superlink_cmd = [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(certs["ca"]),
                     "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]),
                     "--enable-supernode-auth", "--isolation", "subprocess", "--host", "127.0.0.1",
                     "--port", str(port), "--disable-runtime-dependency-installation"]
    result["superlink_cmd"] = superlink_cmd

    def supernode(card: str, key: Path | None) -> list[str]:
        cmd = [str(BIN / "flower-supernode"), "--root-certificates", str(certs["ca"]),
               "--superlink", f"127.0.0.1:{port}", "--port", str(free_port()), "--node-config", f'card="{card}"']
        return cmd + (["--auth-supernode-private-key", str(key)] if key else [])

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    procs: list[subprocess.Popen] = []
    try:
        procs.append(start(superlink_cmd, env, logs / "superlink.log"))
        wait_for(listening, procs[0], "SuperLink listening", 60)
        result["tls"] = tls = probe_tls(port, certs["ca"])
        checks["tls_only"] = (tls["https_with_ca"].startswith("HTTP ") and tls["plain_http"].startswith("refused")
                              and tls["https_system_trust"].startswith("refused"))
        plain = flwr(["supernode", "ls", "plain"], env)
        result["insecure_cli"] = {"returncode": plain.returncode, "tail": (plain.stdout + plain.stderr)[-600:]}
        checks["insecure_cli_refused"] = plain.returncode != 0
        say(f"TLS probes: {tls}; `flwr supernode ls` with insecure = true: exit {plain.returncode}")

        result["registered"] = {}
        for name in (*CARDS, IMPOSTOR):
            reg = flwr(["supernode", "register", str(keys[name][1]), "secure", "--name", name], env)
            if reg.returncode:
                raise RuntimeError(f"flwr supernode register failed:\n{reg.stdout}\n{reg.stderr}")
            result["registered"][name] = reg.stdout.strip().splitlines()[-1]
            say(f"registered {name}: {result['registered'][name]}")
        for card in CARDS:
            procs.append(start(supernode(card, keys[card][0]), env, logs / f"supernode-{card}.log"))
        # registered and admitted by the SuperLink, but it claims a card pinned to another key
        procs.append(start(supernode("small", keys[IMPOSTOR][0]), env, logs / f"supernode-{IMPOSTOR}.log"))
        online = wait_for(lambda: (s := node_status(env)) and list(s.values()).count("online") == 3 and s,
                          None, "the three registered SuperNodes online", 120)
        say(f"SuperNodes online: {online}")

        # Outsiders: a well-formed but unregistered key, and no key at all (Flower would otherwise
        # let such a node register itself). Both trust our CA, so only authentication stops them.
        for name, key in (("intruder", keys["intruder"][0]), ("anonymous", None)):
            result[name] = out = expect_refused(supernode("small", key), env, logs / f"supernode-{name}.log",
                                                procs, args.refusal_timeout)
            checks[f"{name}_refused"] = out["refused"]
            say(f"{name} SuperNode: exit {out['exit_code']}; {' | '.join(out['evidence'])}")
        checks["only_registered_listed"] = len(node_status(env)) == 3

        if all(checks.values()):
            say(f"flwr run, {args.rounds} rounds (a minute or two)")
            run_config = (f"rounds.num-rounds={args.rounds} rounds.eval-size={args.eval_size} "
                          f"rounds.prompts-per-node={args.prompts_per_node} cache-dir='{cache}' run-dir='{runs}' "
                          f"config-file='{pins}'")
            run = flwr(["run", ".", "secure", "--stream", "--run-config", run_config], env, timeout=900)
            (logs / "flwr-run.log").write_text(run.stdout + run.stderr)
            result["run_returncode"] = run.returncode
        else:
            say("a check failed: not running the federation")
        checks["run_ok"] = result.get("run_returncode") == 0
    finally:
        kill_workers(cache)
        for proc in reversed(procs):
            stop(proc)

    # The SuperLink's side of the refusals (read once it has flushed its log).
    result["superlink_412"] = [ln.strip() for ln in (logs / "superlink.log").read_text(errors="replace").splitlines()
                               if '/v1/fleet/' in ln and 'HTTP/1.1" 412' in ln]
    checks["superlink_412_twice"] = len(result["superlink_412"]) == 2
    run_dirs = sorted(runs.glob("*")) if runs.exists() else []
    if len(run_dirs) == 1 and (run_dirs[0] / "metrics.jsonl").exists():
        from ftis_flwr.server.reporting.summary import load_metrics

        result["run_dir"] = str(run_dirs[0])
        records = load_metrics(run_dirs[0])
        result["rounds"] = [r["round"] for r in records]
        result["nodes_per_round"] = [sorted(r["nodes"]) for r in records]
        from ftis_flwr.server.reporting.summary import load_events

        result["left_out"] = [e["reason"] for e in load_events(run_dirs[0]) if e["event"] == "node_left_out"]
    checks["impostor_left_out"] = (len(result.get("left_out", [])) == 1
                                   and "claims model card 'small', which is pinned" in result["left_out"][0])
    checks["rounds_complete"] = result["rounds"] == list(range(args.rounds + 1))
    checks["both_nodes_every_round"] = result["nodes_per_round"] == [sorted(CARDS)] * (args.rounds + 1)
    result["ok"] = all(checks.values())
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    res = main()
    say("summary:")
    for name, ok in res["checks"].items():
        say(f"  {'PASS' if ok else 'FAIL'}  {name}")
    say(f"rounds {res['rounds']}, nodes {res['nodes_per_round'][:1]}; logs in {res['workdir']}/logs")
    say("all checks passed" if res["ok"] else "SOME CHECKS FAILED")
    sys.exit(0 if res["ok"] else 1)
