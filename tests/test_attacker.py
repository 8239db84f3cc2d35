"""A peer that lies, through a real Flower simulation.

Three SuperNodes run this project's ClientApp; the third, ``mallory``, forges its reply on the
wire after its (real) round, one attack per round: NaN and positive log-probs, token ids outside
the vocabulary, ragged lengths, a wrong tokenizer fingerprint, an oversized payload, groups
relabelled as another node's, prompts it was not assigned, a duplicated prompt, inflated rewards,
completions longer than the experiment's cap.
What breaks a wire rule (NaN and positive log-probs, ragged lengths, an oversized payload) the
server rejects when the reply arrives: that round is mallory's failure, named in a
``payload_rejected`` event of node "server", and nothing of it is forwarded. What only a receiver
can judge (its vocabulary and tokenizer, the stamp, the assignment, its own scoring) the honest
nodes reject with its reason and count in groups and samples, and train only on what is honest;
the server names the repeat offender.

What this shows about learning: none of mallory's forged samples enters an honest node's update
(``samples_foreign`` counts only the other honest node's, plus the one legitimate group of the
duplicate attack and the inflated-rewards groups, whose rewards the receivers recompute), so the
attacker cannot move the honest nodes other than by taking a share of the prompt schedule.
"""


import pytest
from conftest import kill_workers

from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.reporting.summary import load_events, load_metrics
from simulations.forger import forgeries, forging_app

pytestmark = pytest.mark.slow

FEDERATION = """
rounds: {num_rounds: 11, prompts_per_node: 4, eval_every: 0, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6, batch_size: 64}
wire: {max_tokens_per_payload: 200, format: compact}
train: {lr: 1e-3, micro_batch_size: 32}
nodes:
  - {name: a, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: b, tiny_size: small, warmstart_target: 0.6, seed: 0, lora: true, lora_config: {r: 8, alpha: 16}}
  - {name: mallory, tiny_size: small, warmstart_target: 0.6, seed: 0}
"""


_F = forgeries(vocab_size=62, max_new_tokens=6, max_tokens_per_payload=200, relabel_as="a")

# round mallory generated in -> (forgery, groups rejected, samples rejected, reason fragment)
AT_SERVER = {0, 1, 3, 5}
"""The attacks the server itself rejects on arrival (a wire rule); the receivers judge the rest."""
ATTACKS = {
    0: ("nan_logprob", 4, 16, "log-prob nan is non-finite"),
    1: ("positive_logprob", 4, 16, "log-prob 0.5 is positive"),
    2: ("id_outside_vocab", 4, 16, "outside [0, 62)"),
    3: ("ragged", 4, 16, "its counts need"),  # format 1: "logprobs length"
    4: ("tokenizer_fp", 4, 16, "tokenizer fingerprint 'ffffffffffffffff' differs"),
    5: ("oversized", 4, 16, "exceed wire.max_tokens_per_payload=200"),
    6: ("relabelled", 4, 16, "labelled as made by 'a', but the server received it from 'mallory'"),
    7: ("unassigned_prompt", 4, 16, "prompt id not assigned to mallory"),
    8: ("duplicate_prompt", 3, 12, "prompt id used more than once"),
    9: ("inflated_rewards", 0, 0, None),
    10: ("overlong", 4, 16, "exceeds rollout.max_new_tokens=6"),
}


def mallory_app():
    """This project's ClientApp, except that the node serving card ``mallory`` forges its replies."""
    return forging_app("mallory", lambda rnd: _F[ATTACKS[rnd][0]] if rnd in ATTACKS else None)


def test_every_forgery_is_rejected_with_its_reason_and_counted(tmp_path):
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from server_app.server_app import run

    exp = load_experiment(yaml_text=FEDERATION,
                          overrides={"cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    out = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        out["run_dir"] = run(grid, exp, connect_timeout=60)

    try:
        run_simulation(server, mallory_app(), num_supernodes=3,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        kill_workers(tmp_path / "cache")
    rounds, events = load_metrics(out["run_dir"]), load_events(out["run_dir"])
    failed = {e["round"]: e for e in events if e["event"] == "node_failed"}
    assert sorted(failed) == sorted(AT_SERVER) and {e["node"] for e in failed.values()} == {"mallory"}
    rejected = [e for e in events if e["event"] == "payload_rejected"]
    for made_in, (_, groups, samples, reason) in ATTACKS.items():
        used_in = made_in + 1  # groups of round r are trained on in round r + 1
        if made_in in AT_SERVER:  # mallory's round failed; the receivers never saw those bytes
            (got,) = [e for e in rejected if e["round"] == made_in and e["node"] == "server"]
            assert got["source"] == "mallory" and reason in got["reason"], got
            assert (got["groups"], got["samples"]) == (groups, samples), got
            assert failed[made_in]["reason"].startswith("payload rejected by the server"), failed[made_in]
            for receiver in ("a", "b"):
                m = rounds[used_in]["nodes"][receiver]
                assert "mallory/groups_rejected" not in m and m["samples_foreign"] == 16, (receiver, m)
                assert not [e for e in rejected if e["round"] == used_in and e["node"] == receiver]
            continue
        for receiver in ("a", "b"):
            m = rounds[used_in]["nodes"][receiver]
            got = [e for e in rejected if e["round"] == used_in and e["node"] == receiver]
            where = f"attack of round {made_in}, receiver {receiver}: {m}"
            if reason is None:  # inflated rewards: used, but scored by the receiver itself
                assert not got and m["samples_foreign"] == 32, where
                assert m.get("mallory/rewards_corrected", 0) > 0, where
                (seen,) = [e for e in events if e["event"] == "rewards_corrected"
                           and e["round"] == used_in and e["node"] == receiver]
                assert seen["source"] == "mallory" and seen["samples"] == m["mallory/rewards_corrected"]
                continue
            assert len(got) == 1 and got[0]["source"] == "mallory" and reason in got[0]["reason"], where
            assert (m["mallory/groups_rejected"], m["mallory/samples_rejected"]) == (groups, samples), where
            assert (got[0]["groups"], got[0]["samples"]) == (groups, samples), where
            assert m["samples_foreign"] == 16 + (16 - samples), where  # the other honest node's 16
    repeat = [e["round"] for e in events if e["event"] == "payload_rejected_repeatedly"]
    assert repeat and all(e["node"] == "mallory" for e in events
                          if e["event"] == "payload_rejected_repeatedly"), repeat
