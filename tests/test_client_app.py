"""The ClientApp's own decisions: which card a SuperNode serves, and paths it takes from the server."""

import json
from pathlib import Path

import pytest

from clients.client_app import NoCard, checkpoint_dir, experiment_of, select_card
from ftis_flwr.config.schema import to_dict
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.host.processes import worker_dir

EXP = load_experiment(yaml_text="nodes: [{name: small}, {name: large}]")


def test_a_card_by_name_or_partition_and_the_two_ways_to_serve_none():
    assert select_card(EXP, {"card": "large"}).name == "large"
    assert select_card(EXP, {"partition-id": 0}).name == "small"
    with pytest.raises(NoCard, match="neither a 'card' nor a 'partition-id'"):
        select_card(EXP, {})
    with pytest.raises(NoCard, match="partition-id 2 has no model card"):
        select_card(EXP, {"partition-id": 2})
    with pytest.raises(ValueError, match="card='huge' is neither a model card") as err:
        select_card(EXP, {"card": "huge"})
    assert not isinstance(err.value, NoCard)  # an unknown card refuses the run; no card is left out


@pytest.mark.parametrize("run_name,node", [("../../etc", ".."), ("/abs/path", "a/b"), ("ok-run", ".")])
def test_server_sent_names_never_leave_the_workers_folder(tmp_path, run_name, node):
    d = worker_dir(tmp_path, run_name, node).resolve()
    assert d.parent.parent == (tmp_path / "workers").resolve()


def test_the_node_decides_where_its_final_model_goes(tmp_path):
    assert checkpoint_dir("/srv/runs/r1/checkpoints", "r1", "small", {}) == Path("/srv/runs/r1/checkpoints/small")
    assert checkpoint_dir("/srv/x", "r1", "small", {"out-dir": str(tmp_path)}) == tmp_path / "r1" / "small"
    for bad in ("checkpoints", "/srv/runs/../../etc"):
        with pytest.raises(ValueError, match="not a plain absolute path"):
            checkpoint_dir(bad, "r1", "small", {})


def test_the_experiment_is_parsed_once_per_text_and_a_bad_one_refused_every_time():
    """Every message of a run carries the same JSON: parsed once per process (OmegaConf's merge
    takes ~0.1 s, a round's overhead in simulation); an invalid one is never cached."""
    text = json.dumps(to_dict(EXP))
    first = experiment_of(text)
    assert experiment_of(text) is first and [c.name for c in first.nodes] == ["small", "large"]
    bad = json.loads(text)
    bad["loss"]["trunc_c"] = -1.0
    for _ in range(2):
        with pytest.raises(ValueError, match="trunc_c"):
            experiment_of(json.dumps(bad))


# ------------------------------------------------------------------ Flower's routing of the queries


@pytest.fixture
def task_identity(monkeypatch):
    """Flower stamps new Messages with the running app's ids; outside an app, set them."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _query(message_type: str, content=None):
    from flwr.app import Message, RecordDict

    msg = Message(RecordDict(content or {}), dst_node_id=1, message_type=message_type)
    msg.metadata.__dict__["_message_id"] = "m1"  # as the SuperNode's copy has
    return msg


def _context(node_config):
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


def test_the_server_sends_exactly_the_query_types_the_client_app_serves():
    """Every query the server builds is typed "query.<action>" and has a decorated handler here."""
    from clients.client_app import QUERIES, app
    from ftis_flwr.server.lifecycle import query_type
    from ftis_flwr.wire import protocol

    sent = {query_type(k) for k in (protocol.HELLO, protocol.BUILD, protocol.STOP, protocol.FINISH)}
    assert sent == {f"query.{a}" for a in QUERIES} == {"query.hello", "query.build", "query.stop", "query.finish"}
    assert set(app._registered_funcs) == sent | {"train.default"}


def test_flower_routes_a_hello_to_its_handler_and_refuses_an_unknown_query(task_identity):
    from flwr.app import ConfigRecord
    from flwr.clientapp import ClientApp

    from clients.client_app import app, serve_queries
    from ftis_flwr.wire import protocol

    hello = _query("query.hello", {protocol.HELLO: ConfigRecord({"experiment": json.dumps(to_dict(EXP))})})
    reply = app(hello, _context({"partition-id": 1}))
    assert reply.metadata.message_type == "query.hello" and reply.content[protocol.HELLO]["node"] == "large"
    for wrong, action in (("query.nope", "nope"), ("query", "default")):  # no fall-through to another handler
        with pytest.raises(ValueError, match=f"No query function registered with name '{action}'"):
            app(_query(wrong, {protocol.FINISH: ConfigRecord({})}), _context({"partition-id": 0}))
    other = serve_queries(ClientApp())  # a wrapper of train (the forger) answers the same queries
    assert other(hello, _context({"card": "small"})).content[protocol.HELLO]["node"] == "small"
