"""What ``ftis-flwr check`` asks of ``task.environment`` beyond TRL's contract (issue #57), before
any node starts. Loading the class (:func:`ftis_flwr.tasks.checks.environment_errors`) shows
that it is well formed; these show that it fits this federation:

- ``reset(**row)`` takes the data set's rows: it runs once on the first train row, seeded as a
  node seeds it, so a missing ``**kwargs`` or a column it needs shows now, not in round 0;
- every node's model has room to answer: an episode's prompt, with the tools' schemas (which a
  chat template writes into it) and ``reset``'s text, leaves it a position;
- every node's model can write a tool call: each tokenizer has a tool-call format
  (``task.tool-format``, else the one its chat template implies) and the characters to write one
  (the tiny char tokenizer has no braces, so no ``hermes`` call);
- (warnings) peers can replay each other's episodes: with more than one node sharing, a class
  without ``deterministic = True``, nodes whose models write tool calls in different formats, or
  nodes of one tokenizer with different chat templates, have every node refuse its peers'
  episodes and train alone.
"""

from __future__ import annotations

from typing import Any

from ftis_flwr.config.schema import ExperimentConfig

SAMPLE_VALUES = {"integer": 12, "number": 1.5, "boolean": True, "string": "x"}
"""A value of each JSON type, to write one call of a tool in a format."""


def _spec(exp: ExperimentConfig) -> Any:
    """The environment as a node loads it, or None (its load errors are tasks.checks')."""
    from ftis_flwr.tasks.checks import loaded_environment

    try:
        return loaded_environment(exp.task)
    except Exception:  # noqa: BLE001 - named by tasks.checks.environment_errors
        return None


def sample_call(fmt: Any, spec: Any) -> str:
    """One call of the environment's first tool, written in ``fmt``, every argument set."""
    name, schema = next(iter(spec.tools.items()))
    props = schema["function"]["parameters"]["properties"]
    args = {arg: SAMPLE_VALUES.get(p.get("type") if isinstance(p.get("type"), str) else "string", "x")
            for arg, p in props.items()}
    return fmt.render(name, args, spec.tools)


def episode_errors(exp: ExperimentConfig) -> list[str]:
    """``reset`` on the first train row, and each node's tool-call format (module docstring); one
    message per problem, naming the key and the nodes."""
    if not exp.task.environment:
        return []
    spec = _spec(exp)
    if spec is None:
        return []
    from ftis_flwr.tasks.checks import built_task
    from ftis_flwr.tasks.environment import EnvironmentFault, reset_seed
    from ftis_flwr.tasks.episode_prompt import prompt_ids, prompt_messages, with_reset_text
    from ftis_flwr.tasks.node_models import node_models
    from ftis_flwr.tasks.prompt_fit import lost_characters
    from ftis_flwr.tasks.tool_calls import tool_format_for

    key = f"task.environment={exp.task.environment!r}"
    errors = []
    problem = built_task(exp.task).train_problem(0)
    env, extra = spec.acquire(), None
    try:
        extra = env.reset(dict(problem.columns), reset_seed(exp.rounds.seed, problem.id))
    except EnvironmentFault as exc:
        errors.append(f"{key}: on the first train row ({problem.id}, columns {', '.join(problem.columns)}): {exc}")
    finally:
        spec.release(env)
    models, _ = node_models(exp)
    messages = with_reset_text(prompt_messages(problem, exp.task.chat), extra)
    for model in models:
        try:
            tok = model.tokenizer()
        except Exception:  # noqa: BLE001 - not on this machine: the prompt check's warning names it
            continue
        need = len(prompt_ids(tok, messages, spec.schemas)) + 1
        if need > model.positions:
            errors.append(f"{model.names} ({model.what}): {key}: the episode prompt of the first train row "
                          f"({problem.id}), with the tools' schemas and reset's text, leaves no position to answer "
                          f"in: {need} positions with one token, more than the model's {model.positions}: shorten "
                          "the tools' docstrings or reset's text, or use a model with more positions")
        if not spec.tools:
            continue
        try:
            fmt = tool_format_for(tok, exp.task.tool_format or "auto")
        except ValueError as exc:
            errors.append(f"{model.names} ({model.what}): {key}: {exc} (task.tool-format)")
            continue
        call = sample_call(fmt, spec)
        _, chars = lost_characters(tok, call)
        if chars:
            errors.append(f"{model.names} ({model.what}): {key}: its tokenizer cannot write a tool call in the "
                          f"{fmt.name} format ({call!r}: no {', '.join(map(repr, chars))}): set task.tool-format "
                          "to a format it can write" + (" (tiny)" if model.tiny else ""))
    return errors


def episode_notes(exp: ExperimentConfig) -> list[str]:
    """The warnings that peers will refuse each other's episodes, when they will: a class that does
    not declare itself deterministic, nodes of different tokenizers with one ratio per completion
    (``loss.cross_tokenizer_ratio=sequence``), and :func:`template_notes`."""
    from ftis_flwr.config.choices import AdvantageMode

    if not exp.task.environment or len(exp.nodes) < 2 or exp.advantage.mode == AdvantageMode.ALONE:
        return []
    spec = _spec(exp)
    if spec is None:
        return []
    if not spec.deterministic:
        return [f"warning: task.environment={exp.task.environment!r}: {spec.name} does not declare deterministic = "
                "True, so the nodes cannot replay each other's episodes and will refuse them (each trains on its own, "
                "counted in <source>/episodes_no_replay); add the class attribute if the same row, seed and tool "
                "calls always give the same results (docs/your-own-environment.md)"]
    from ftis_flwr.config.choices import CrossTokenizerMode, CrossTokenizerRatio
    from ftis_flwr.tasks.node_models import node_models

    models = node_models(exp)[0]
    tokenizers = {model.tiny or model.folder for model in models}
    if len(tokenizers) > 1 and exp.exchange.cross_tokenizer != CrossTokenizerMode.OFF and \
            exp.loss.cross_tokenizer_ratio == CrossTokenizerRatio.SEQUENCE:
        return [f"warning: task.environment={exp.task.environment!r}: the nodes have different tokenizers and "
                "loss.cross-tokenizer-ratio='sequence' (one ratio per completion) has none per model turn, so each "
                "refuses the other's episodes on replay (counted in <source>/env_replay_refused); use 'chunk' "
                "or 'word' (docs/your-own-environment.md#what-a-receiver-checks-replay)"]
    return template_notes(exp, models)


def template_notes(exp: ExperimentConfig, models: list[Any]) -> list[str]:
    """The warnings for nodes whose chat templates differ: peers whose models write tool calls in
    different formats refuse each other's episodes, and so do peers of one tokenizer with different
    templates (the token path requires the prompt and tool turns in the receiver's template).
    Peers of different tokenizers share episodes across templates: the text path checks a tool
    turn against its sender's layout (docs/your-own-environment.md)."""
    from ftis_flwr.tasks.tool_calls import tool_format_for

    formats: dict[str, list[str]] = {}
    templates: dict[str, dict[str, list[str]]] = {}
    for model in models:
        try:
            tok = model.tokenizer()
            fmt = tool_format_for(tok, exp.task.tool_format or "auto").name
        except Exception:  # noqa: BLE001 - not on this machine, or no format: named by episode_errors
            continue
        formats.setdefault(fmt, []).append(model.names)
        by_template = templates.setdefault(str(model.tiny or model.folder), {})  # one per tokenizer
        by_template.setdefault(str(getattr(tok, "chat_template", None) or ""), []).append(model.names)
    key = f"task.environment={exp.task.environment!r}"
    notes = []
    if len(formats) > 1:
        groups = "; ".join(f"{fmt}: {', '.join(names)}" for fmt, names in formats.items())
        notes.append(f"warning: {key}: the nodes' models write tool calls in different formats ({groups}), so each "
                     "refuses the other's episodes on replay (counted in <source>/env_replay_refused) and trains on "
                     "its own; set task.tool-format to one format every tokenizer can write "
                     "(docs/your-own-environment.md#what-a-receiver-checks-replay)")
    for by_template in templates.values():
        if len(by_template) > 1:
            groups = "; ".join(", ".join(names) for names in by_template.values())
            notes.append(f"warning: {key}: nodes of one tokenizer write tool turns with different chat templates "
                         f"({groups}), so each refuses the other's episodes on replay (counted in "
                         "<source>/env_replay_refused) and trains on its own; give them one template "
                         "(docs/your-own-environment.md#what-a-receiver-checks-replay)")
    return notes
