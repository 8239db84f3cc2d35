"""``ftis-flwr``: check an experiment locally in a second, then run it with Flower and exit with
the run's outcome.

    ftis-flwr check . --run-config "preset='cpu-smollm2' loss.trunc-c=3"
    ftis-flwr run . --stream --federation-config "num-supernodes=2" --run-config "rounds.num-rounds=4"
    ftis-flwr plan paper-size-base --device-gib 80

Why: ``flwr run --stream`` (Flower 1.42) exits 0 whatever happened to the run, names no key it
rejects (``[code: 15] Invalid run configuration.``) and reports the project's own configuration
errors only after the run has started (20-30 s). ``check`` reads the app's ``pyproject.toml``,
applies ``--run-config`` as Flower will (its own parser), names every unknown key with its closest
declared one, builds the experiment as the ServerApp does and prints every error at once. ``run``
does the same, then runs ``flwr run`` with the same arguments (an underscore spelling of a declared
key, ``loss.trunc_c``, is passed on as declared, ``loss.trunc-c``), streams it, asks Flower for the
run's final status (``flwr ls --run-id``) and exits 0 only when the run completed. A SuperLink that
does not answer yet (started a moment before) is asked again for up to ``--wait`` seconds. Plain ``flwr run``
keeps working; this adds nothing the app needs. ``plan`` checks a preset (with ``--run-config`` on
top) the same way and prints each node's memory per rank, in GiB (:mod:`ftis_flwr.config.plan`).
``report``, ``compare`` and ``answers`` read a run's folder (:mod:`ftis_flwr.run_tools`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from ftis_flwr import run_tools

EXIT_INVALID, EXIT_FAILED, EXIT_USAGE = 2, 1, 64  # 64: EX_USAGE, apart from an invalid configuration
DESCRIPTION = """Check a run configuration of the ftis-flwr Flower app in about a second (every
unknown key and bad value named at once), run it with `flwr run`, and exit with the run's outcome;
then read a run: where its rounds went, two runs side by side, what its models answer."""
EPILOG = """examples:
  ftis-flwr check . --run-config "preset='cpu-smollm2' loss.trunc-c=3"
  ftis-flwr run . --stream --federation-config "num-supernodes=2 client-resources-num-cpus=1"
  ftis-flwr plan paper-size-base --device-gib 80
  ftis-flwr report runs/<run name>
  ftis-flwr compare runs/<run A> runs/<run B>
  ftis-flwr answers runs/<run name> --show 5
  ftis-flwr stop

`run` passes every argument it does not know (--stream, --federation-config, a federation name)
on to `flwr run`; `check` takes the same command line and checks what it can.

exit codes: 0 completed (valid, for check; planned, for plan), 1 the run failed, 2 invalid configuration,
64 a command line ftis-flwr itself cannot parse"""
STARTED = re.compile(r"Successfully started run (\d+)")
FAILED_LINE = "ftis-flwr: the run failed: "
"""How the ServerApp's line for a failed run begins (``ftis_flwr.server.summary.FAILED_PREFIX``):
``run`` ends with its reason's first sentence after the run's status."""
TRACKER_ENV = {"mlflow": "MLFLOW_", "wandb": "WANDB_"}
"""Tracker -> the prefix of the environment variables it reads where the ServerApp runs."""
UNREACHABLE = "Connection to the SuperLink is unavailable"  # flwr 1.42's words when nothing answers
WAIT_STEP = 2.0


class CheckError(Exception):
    """Everything wrong with a run configuration, one message per line."""


def declared_keys(app: Path) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` entries (flattened, as Flower reads them) of ``app``."""
    path = app / "pyproject.toml"
    if not path.is_file():
        raise CheckError(f"{app}: no pyproject.toml (give the Flower app's folder, e.g. `.`)")
    from flwr.common.config import flatten_dict

    data = tomllib.loads(path.read_text())
    return flatten_dict(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def _spellings(key: str) -> str:
    return key.replace("_", "-")


def resolve_keys(given: dict[str, Any], declared: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``given`` with each key spelled as declared (dashes and underscores are equal), and one
    error per key that is not declared, naming the closest declared keys."""
    by_spelling = {_spellings(k): k for k in declared}
    out, errors = {}, []
    for key, value in given.items():
        name = by_spelling.get(_spellings(key))
        if name is None:
            close = difflib.get_close_matches(_spellings(key), list(by_spelling), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(by_spelling[c] for c in close)}?" if close else ""
            errors.append(f"unknown key {key!r}{hint} (per-node keys go in overrides='nodes.0.lr=1e-3'; "
                          f"every key: python -m ftis_flwr.config.keys --list)")
        else:
            out[name] = value
    return out, errors


_PAIR = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")
"""One ``key=value`` pair of a ``--run-config`` string (a quoted value may hold spaces)."""


def parse_run_config(values: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``--run-config`` values as Flower parses them (a TOML file, or ``key=value`` pairs), and
    the pairs Flower refuses, each named: the good pairs are kept, so the rest is still checked."""
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args(values or None), []
    except Exception as exc:  # Flower's own message (a click exception or a ValueError): find the pairs
        good, bad = {}, []
        for value in values:
            for pair in _PAIR.findall(value) if not value.endswith(".toml") else [value]:
                try:
                    good.update(parse_config_args([pair]))
                except Exception:
                    bad.append(pair)
        if not bad:
            return {}, [f"--run-config: {getattr(exc, 'message', None) or exc}"]
        return good, [f"--run-config: {pair}: a string value needs quotes, e.g. preset='cpu-pair' (Flower "
                      "reads key=value pairs of TOML values)" for pair in bad]


PATH_KEYS = ("run-dir", "cache-dir", "config-file", "resume", "task.train-path", "task.data-files.train",
             "task.data-files.test", "task.data-files.validation", "task.data-files.ood")
"""Run-config keys that name a path on the machine the ServerApp runs on."""
CODE_KEYS = ("task.name", "task.reward", "task.rewards", "task.environment")
"""Run-config keys that may name a file of the user's code (``<file.py>:<name>``, comma-separated)."""


def _code_path(value: str) -> str:
    """``"rel/reward.py:f"`` -> ``"/abs/rel/reward.py:f"``; anything else as it is."""
    target, sep, attr = value.strip().rpartition(":")
    if sep and target.endswith(".py") and attr:
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return value.strip()


def localise(given: dict[str, Any], app: Path) -> dict[str, Any]:
    """For a run on the local SuperLink: relative paths (files, data files, a user's code in
    ``<file.py>:<name>``) resolved against the user's working directory, and ``run-dir`` (when not
    given) the app folder's ``runs/``, all absolute, so the outputs land where the user is, not in
    the directory the SuperLink was first started from."""
    out = dict(given)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = str(Path(out[key]).expanduser().resolve())
    for key in CODE_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = ",".join(_code_path(v) for v in out[key].split(",")) if key == "task.rewards" \
                else _code_path(out[key])
    dataset = out.get("task.dataset")
    if isinstance(dataset, str) and dataset and Path(dataset).expanduser().exists():  # a local folder
        out["task.dataset"] = str(Path(dataset).expanduser().resolve())
    out.setdefault("run-dir", str((app / "runs").resolve()))
    return out


def fold_node_keys(parsed: dict[str, Any]) -> dict[str, Any]:
    """``nodes.<index or name>.<field>=value`` pairs, a card's field set for one run, moved into
    ``overrides`` (where the run configuration keeps per-node keys, after any already there), so
    ``--run-config "nodes.large.ranks=2"`` means ``--run-config "overrides='nodes.large.ranks=2'"``."""
    node = {k: v for k, v in parsed.items() if k.startswith("nodes.") and k.count(".") >= 2}
    if not node:
        return parsed
    out = {k: v for k, v in parsed.items() if k not in node}
    pairs = [f"{k}={shlex.quote(v if isinstance(v, str) else _as_toml(v))}" for k, v in node.items()]
    out["overrides"] = " ".join([str(out.get("overrides", "") or ""), *pairs]).strip()
    return out


def check(app: Path | None, run_config: list[str], *, local: bool = False) -> tuple[dict[str, Any], Any]:
    """(the ``--run-config`` pairs spelled as declared, the experiment); CheckError listing every
    problem otherwise. ``local``: the run goes to the local SuperLink (:func:`localise` its paths).
    ``app`` None (a plan made anywhere): no declared keys to check against, the merge names the
    unknown ones.
    A ``resume`` run is checked for its folder only (its configuration is the one saved in it)."""
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_run_config

    declared = declared_keys(app) if app is not None else {}
    parsed, errors = parse_run_config(run_config)
    parsed = fold_node_keys(parsed)
    given, unknown = resolve_keys(parsed, declared) if app is not None else (parsed, [])
    errors += unknown  # and the known keys are checked all the same: every problem at once
    if local:
        given = localise(given, app)
    merged = {**declared, **given}
    resume = str(merged.get("resume", "") or "")
    if resume:
        if not Path(resume).expanduser().is_dir():
            errors.append(f"resume={resume!r}: no such run directory")
        if errors:
            raise CheckError("\n".join(errors))
        return given, None
    try:
        exp = load_run_config(merged)
    except (ConfigError, ValueError) as exc:
        errors += _items(str(exc))
    if errors:
        raise CheckError(f"invalid configuration ({len(errors)} error{'s' * (len(errors) > 1)}):\n  - "
                         + "\n  - ".join(errors))
    return given, exp


def _items(message: str) -> list[str]:
    """The problems a ConfigError lists (``invalid configuration (n errors):`` then ``  - `` lines),
    so that they and the command line's own make one list."""
    head, sep, rest = message.partition(":\n  - ")
    return rest.split("\n  - ") if sep and head.startswith("invalid ") else [message]


def missing_packages(exp: Any) -> list[str]:
    """One line per card whose named source's package, and per tracker of ``report.to`` whose
    package, is not installed on this machine."""
    from ftis_flwr.config.named_sources import missing_package
    from ftis_flwr.config.validation import tracker_package_errors

    return [f"node {c.name}: source {c.source!r} needs `{cmd}`" for c in exp.nodes
            if (cmd := missing_package(c.source))] + tracker_package_errors(exp)


def _as_toml(value: Any) -> str:
    return (json.dumps(value) if isinstance(value, str)
            else str(value).lower() if isinstance(value, bool) else repr(value))


def flwr_command() -> str:
    """Flower's ``flwr``: beside this interpreter (its environment's), else the first on PATH."""
    here = Path(sys.executable).parent / "flwr"
    return str(here) if here.exists() else (shutil.which("flwr") or "flwr")


def flwr_args(args: argparse.Namespace, given: dict[str, Any]) -> list[str]:
    """The ``flwr run`` command line: the user's arguments, ``--run-config`` rewritten with the
    declared spellings (and, for the local SuperLink, absolute paths)."""
    cmd = [flwr_command(), "run", str(args.app), *args.rest]
    if given:  # a TOML file's pairs too: Flower takes key=value pairs or one file, not both
        cmd += ["--run-config", " ".join(f"{k}={_as_toml(v)}" for k, v in given.items())]
    return cmd


def run_status(run_id: str, app: Path, superlink: list[str]) -> str:
    """Flower's status of a run (``finished:completed``, ``finished:failed``, ...) on the SuperLink
    the run went to, or "" when it cannot be read."""
    try:
        out = subprocess.run([flwr_command(), "ls", *superlink, "--run-id", run_id, "--format", "json"], cwd=app,
                             capture_output=True, text=True, timeout=60).stdout
        runs = json.loads(out[out.index("{"):]).get("runs", [])
        return str(runs[0].get("status", "")) if runs else ""
    except (OSError, ValueError, subprocess.SubprocessError, IndexError, AttributeError):
        return ""


def _stream(cmd: list[str]) -> tuple[int, str, bool, str]:
    """Run ``flwr run``, echoing its output: (exit code, run id or "", whether it could not reach
    the SuperLink, why the run failed as its ServerApp said it or "")."""
    run_id, unreachable, why = "", False, ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                match = STARTED.search(line)
                run_id = run_id or (match.group(1) if match else "")
                unreachable = unreachable or UNREACHABLE in line
                if line.startswith(FAILED_LINE):
                    why = line[len(FAILED_LINE):].strip().split(". ")[0].split(" (metrics")[0]
        except KeyboardInterrupt:
            proc.terminate()
            print(f"\nftis-flwr: interrupted; the run may go on in the SuperLink (flwr stop {run_id or '<run id>'})")
            return 130, run_id, False, ""
    return proc.returncode, run_id, unreachable, why


def stale_tracker_env(exp: Any, port: int | None = None) -> str:
    """Why the local SuperLink cannot report as this shell asks, or "": a tracker of ``report.to``
    reads variables (``MLFLOW_*``, ``WANDB_*``) on which this shell and the running local SuperLink
    (whose environment its ServerApp gets: that of the command that started it) disagree. Only the
    names are said: a value may be a secret."""
    from ftis_flwr import local_superlink

    prefixes = tuple(TRACKER_ENV[t] for t in exp.report.to if t in TRACKER_ENV)
    port = port or int(os.environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", local_superlink.PORT))
    for pid in local_superlink.listening_pids(port) if prefixes else []:
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # not ours to read: nothing to compare
            continue
        there = dict(p.partition("=")[::2] for p in pairs if "=" in p)
        names = sorted(k for k in {*os.environ, *there} if k.startswith(prefixes) and os.environ.get(k) != there.get(k))
        if names:
            return (f"the local SuperLink (pid {pid}), whose environment the run's server gets, was started with other "
                    f"tracker settings than this shell's ({', '.join(names)}). Stop it (`ftis-flwr stop`) and run this "
                    "command again: the SuperLink starts anew with this shell's environment")
    return ""


def _run(args: argparse.Namespace, given: dict[str, Any]) -> int:
    cmd = flwr_args(args, given)
    print("ftis-flwr: " + " ".join(cmd), flush=True)
    deadline = time.monotonic() + args.wait
    while True:
        returncode, run_id, unreachable, why = _stream(cmd)
        # a SuperLink started a moment ago (the deployment recipe) may not answer yet: no run was
        # started, so asking again is safe
        if not (returncode and unreachable and not run_id and time.monotonic() < deadline):
            break
        print(f"ftis-flwr: the SuperLink does not answer yet; trying again for up to "
              f"{deadline - time.monotonic():.0f} s more (--wait)", flush=True)
        try:
            time.sleep(WAIT_STEP)
        except KeyboardInterrupt:
            return 130
    if returncode == 130:
        return 130
    if returncode:
        print(f"ftis-flwr: flwr run exited with {returncode}", file=sys.stderr)
        return returncode
    if not run_id:
        print("ftis-flwr: flwr run started no run", file=sys.stderr)
        return EXIT_FAILED
    superlink = args.rest[:1] if args.rest and not args.rest[0].startswith("-") else []
    status = run_status(run_id, args.app, superlink)
    if "--stream" not in args.rest:
        print(f"ftis-flwr: run {run_id} started ({status or 'status unknown'}); follow it with "
              f"`flwr log {run_id}`, see its outcome with `flwr ls --run-id {run_id}`")
        return 0
    ok = status.endswith("completed")
    why = f": {why}" if why and not ok else ""
    print(f"ftis-flwr: run {run_id} {status or 'ended with an unknown status'}{why}",
          file=sys.stdout if ok else sys.stderr)
    return 0 if ok else EXIT_FAILED


class _Parser(argparse.ArgumentParser):
    """argparse with its own exit code for a bad command line (argparse's 2 is taken: invalid
    configuration)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _version() -> str:
    """The installed package's version (``pyproject.toml``), or "unknown" from a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ftis-flwr")
    except PackageNotFoundError:
        return "unknown"


def _device_gib(text: str) -> float:
    from ftis_flwr.config.plan import device_gib  # here, not at start: `stop` and `--version` need none of it

    return device_gib(text)


def _add_plan(sub: Any) -> None:
    what = "estimate each node's memory per rank (GiB) and where it fits, offline"
    c = sub.add_parser("plan", help=what, description=f"ftis-flwr plan: {what}.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("preset", help="a preset name (e.g. paper-size-base) or a YAML file")
    c.add_argument("app", nargs="?", default=None, type=Path,
                   help="a Flower app's folder: its declared keys check --run-config, as `check` does")
    c.add_argument("--run-config", action="append", default=[], help="as for flwr run (may repeat)")
    c.add_argument("--device-gib", type=_device_gib, default=None, metavar="N",
                   help="one GPU's memory in GiB: where a node does not fit, the ranks (FSDP2) it needs "
                        "(default: the smallest common device that fits)")


def _plan(args: argparse.Namespace) -> int:
    """``ftis-flwr plan``: the preset with ``--run-config`` on top, checked as ``check`` checks it,
    then its memory plan; exit 2 when it is invalid."""
    from ftis_flwr.config.plan import headline, report

    if args.rest:
        print(f"ftis-flwr: note: not used by the plan: {' '.join(args.rest)}", file=sys.stderr)
    try:
        _, exp = check(args.app, [f"preset={json.dumps(args.preset)}", *args.run_config])
    except CheckError as exc:
        print(f"ftis-flwr: the configuration is not valid:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    if exp is None:
        print("ftis-flwr: a resume run reuses its saved configuration: plan its preset instead", file=sys.stderr)
        return EXIT_INVALID
    print(headline(args.preset, exp))
    print(report(exp, args.device_gib), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="ftis-flwr", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    stop = sub.add_parser("stop", help="stop the local SuperLink that `flwr run` left running (by its pid)")
    stop.add_argument("--port", type=int, default=None, help="its port (default 39091, Flower's)")
    for name, what in (("check", "check the run configuration and exit"),
                       ("run", "check it, run `flwr run` with the same arguments, exit with the outcome")):
        c = sub.add_parser(name, help=what, description=f"ftis-flwr {name}: {what}.", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.add_argument("app", nargs="?", default=".", type=Path, help="the Flower app's folder (default: .)")
        c.add_argument("--run-config", action="append", default=[], help="as for flwr run (may repeat)")
        c.add_argument("--no-reward-probe", action="store_true",
                       help="do not score cheap answers with the task's reward (ftis_flwr.tasks.reward_probe)")
        if name == "run":
            c.add_argument("--wait", type=float, default=60.0, metavar="S",
                           help="while the SuperLink does not answer (it may be starting), ask again for up to "
                                "S seconds (default 60; 0: once)")
    _add_plan(sub)
    run_tools.add_commands(sub, EPILOG)
    args, rest = p.parse_known_args(argv)
    args.rest = rest
    if args.command in run_tools.COMMANDS:
        if rest:
            p.error(f"unrecognized arguments: {' '.join(rest)}")
        return run_tools.main(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "stop":
        from ftis_flwr import local_superlink

        port = args.port or local_superlink.PORT
        pids = local_superlink.stop(port)
        print(f"ftis-flwr: stopped the local SuperLink (pid {', '.join(map(str, pids))})" if pids else
              f"ftis-flwr: no SuperLink listens on port {port}", flush=True)
        return 0
    if args.command == "check" and rest:  # a `run` command line with `check` for `run`: still checked
        print(f"ftis-flwr: note: flwr run's own arguments are passed to it by `run` and not checked here: "
              f"{' '.join(rest)}", file=sys.stderr)
    local = args.command == "run" and not (args.rest and not args.rest[0].startswith("-"))
    try:
        given, exp = check(args.app, args.run_config, local=local)
    except CheckError as exc:
        print(f"ftis-flwr: the run configuration is not valid; nothing was started:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    what = "resume" if exp is None else f"{len(exp.nodes)} nodes ({', '.join(c.name for c in exp.nodes)}), " \
        f"{exp.rounds.num_rounds} rounds, {exp.advantage.mode} {exp.loss.method}"
    print(f"ftis-flwr: configuration valid: {what}", flush=True)
    if exp is not None:  # a model whose tokenizer is not on this machine: its prompts were not checked
        from ftis_flwr.tasks.environment_checks import episode_notes
        from ftis_flwr.tasks.prompt_fit import prompt_notes

        for line in prompt_notes() + episode_notes(exp):
            print(f"ftis-flwr: {line}", file=sys.stderr, flush=True)
    if exp is not None and not args.no_reward_probe:  # warnings only: the exit code is the same
        from ftis_flwr.tasks.reward_probe import probe_lines

        for line in probe_lines(exp):
            print(f"ftis-flwr: {line}", file=sys.stderr, flush=True)
    missing = [] if exp is None else missing_packages(exp)
    if missing and local and args.command == "run":  # a simulation: every node runs here
        print("ftis-flwr: a simulation runs every node and the server on this machine, and a package it needs "
              "is not installed; "
              "nothing was started:\n" + "\n".join(missing), file=sys.stderr)
        return EXIT_INVALID
    for line in missing:
        print(f"ftis-flwr: note: {line} (needed where that part runs)", flush=True)
    stale = stale_tracker_env(exp) if local and exp is not None and args.command == "run" else ""
    if stale:
        print(f"ftis-flwr: {stale}; nothing was started", file=sys.stderr)
        return EXIT_INVALID
    if local and exp is not None:
        print(f"ftis-flwr: outputs in {given['run-dir']}", flush=True)
    return 0 if args.command == "check" else _run(args, given)


if __name__ == "__main__":
    sys.exit(main())
