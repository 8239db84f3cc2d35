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
``report``, ``compare`` and ``answers`` read a run's folder (:mod:`ftis_flwr.cli.run_tools`); the
command line is read in :mod:`.checking`, handed to Flower in :mod:`.flwr_run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ftis_flwr.cli import run_tools
from ftis_flwr.cli.checking import (  # noqa: F401 (the CLI's names, as tests and users import them)
    CheckError,
    check,
    declared_keys,
    fold_node_keys,
    localise,
    missing_packages,
    parse_run_config,
    resolve_keys,
)
from ftis_flwr.cli.flwr_run import (  # noqa: F401
    EXIT_FAILED,
    FAILED_LINE,
    _run,
    _stream,
    flwr_args,
    flwr_command,
    run_status,
    stale_tracker_env,
)

EXIT_INVALID, EXIT_USAGE = 2, 64  # 64: EX_USAGE, apart from an invalid configuration (1: flwr_run.EXIT_FAILED)
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
