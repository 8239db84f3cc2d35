"""Group advantages, pooling, the filter decision and g schedules on hand-made numbers."""

import math

import numpy as np
import pytest
import torch

from ftis_flwr.config.schema import GSchedule
from ftis_flwr.maths.advantages import (
    filter_mask,
    frac_zero_std_groups,
    g_for_round,
    group_advantages,
    pooled_advantages,
)


def test_group_scaling_hand_example_numpy():
    r = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    a = group_advantages(r, scale="group", eps=1e-6)
    std0 = math.sqrt(0.25 * 0.75)  # population std of [1, 0, 0, 0]
    np.testing.assert_allclose(a[0], np.array([0.75, -0.25, -0.25, -0.25]) / (std0 + 1e-6))
    np.testing.assert_allclose(a[1], np.array([-0.5, 0.5, 0.5, -0.5]) / (0.5 + 1e-6))
    assert isinstance(a, np.ndarray) and a.shape == r.shape


def test_group_uses_population_std():
    a = group_advantages(np.array([[0.0, 1.0]]), eps=0.0)
    np.testing.assert_allclose(a, [[-1.0, 1.0]])  # unbiased std would give +-0.707


def test_none_scaling_is_mean_centring_torch():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 4.0, 6.0, 8.0]])
    a = group_advantages(r, scale="none")
    assert isinstance(a, torch.Tensor) and a.shape == r.shape
    torch.testing.assert_close(a, torch.tensor([[0.75, -0.25, -0.25, -0.25], [-3.0, -1.0, 1.0, 3.0]]))


def test_torch_and_numpy_agree_and_int_rewards_work():
    r = np.array([[1, 0, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0]])
    a_np = group_advantages(r)
    a_t = group_advantages(torch.tensor(r, dtype=torch.float64))
    np.testing.assert_allclose(a_np, a_t.numpy(), rtol=1e-12)
    assert a_np.dtype == np.float64


def test_all_equal_group_is_exactly_zero_and_counted():
    r = np.array([[0.1, 0.1, 0.1], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    a = group_advantages(r)
    assert np.all(a[0] == 0.0) and np.all(a[2] == 0.0)
    assert np.any(a[1] != 0.0)
    assert frac_zero_std_groups(r) == pytest.approx(2 / 3)
    assert frac_zero_std_groups(torch.tensor(r)) == pytest.approx(2 / 3)
    assert frac_zero_std_groups([np.array([1.0, 1.0]), np.array([0.0, 1.0, 1.0])]) == 0.5
    assert frac_zero_std_groups([]) == 0.0
    t = group_advantages(torch.tensor([[0.3, 0.3]]))
    assert torch.all(t == 0)


def _config_error(key: str, value) -> str:
    """What the configuration says of a setting the maths no longer checks itself."""
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_experiment

    with pytest.raises(ConfigError) as err:
        load_experiment(overrides={key: value}, import_registries=False)
    return str(err.value)


def test_bad_inputs_raise():
    assert "advantage.scale_rewards='batch' is not one of group, none" in _config_error(
        "advantage.scale_rewards", "batch")
    assert "advantage.eps=-1.0 must be >= 0" in _config_error("advantage.eps", -1.0)
    with pytest.raises(ValueError, match="2-D"):
        group_advantages(np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(np.array([[0.0, np.nan]]))
    with pytest.raises(TypeError):
        group_advantages([[0.0, 1.0]])


def test_pooled_with_unique_keys_is_vertical():
    rewards = [np.array([1.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0])]
    pooled = pooled_advantages(rewards, ["p1", "p2"])
    for r, a in zip(rewards, pooled):
        np.testing.assert_allclose(a, group_advantages(r[None, :])[0])


def test_horizontal_pooling_equals_vertical_on_concatenation():
    parts = [np.array([1.0, 1.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0, 0.0, 0.0, 1.0])]
    keys = ["q", "q", "other"]
    out = pooled_advantages(parts, keys, scale="group")
    whole = group_advantages(np.concatenate(parts[:2])[None, :])[0]
    np.testing.assert_allclose(np.concatenate(out[:2]), whole)
    np.testing.assert_allclose(out[2], group_advantages(parts[2][None, :])[0])
    assert [a.shape for a in out] == [p.shape for p in parts]
    # The pooling bias the paper describes: node 1 alone would learn nothing from [1, 1, 1].
    assert np.all(out[0] > 0)


def test_pooled_validates_lengths():
    with pytest.raises(ValueError, match="same length"):
        pooled_advantages([np.array([1.0])], ["a", "b"])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        pooled_advantages([np.array([])], ["a"])


# Samples: (foreign, A, kl) with g = 50.
_TABLE = [(False, -1.0, 100.0), (True, -1.0, 100.0), (True, -1.0, 1.0), (True, 1.0, 100.0),
          (True, 0.0, 1.0), (True, 1.0, 1.0)]


def _expected(rule, scope):
    filt, neg, far = [], [], []
    for f, a, k in _TABLE:
        n, d = a <= 0, k > 50
        hit = (f or scope == "all") and ((n and d) if rule == "and" else (n or d))
        filt.append(hit)
        neg.append(hit and n)
        far.append(hit and d)
    return filt, neg, far


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("rule", ["and", "or"])
@pytest.mark.parametrize("scope", ["foreign", "all"])
def test_filter_mask_table(backend, rule, scope):
    foreign = np.array([t[0] for t in _TABLE])
    adv = np.array([t[1] for t in _TABLE])
    kl = np.array([t[2] for t in _TABLE])
    if backend == "torch":
        foreign, adv, kl = map(torch.as_tensor, (foreign, adv, kl))
    got = filter_mask(adv, kl, foreign, threshold=50.0, rule=rule, scope=scope)
    for g, e in zip(got, _expected(rule, scope)):
        assert [bool(x) for x in g] == e
    filtered, neg, far = got
    assert all(bool(n or k) for f, n, k in zip(filtered, neg, far) if f)  # every cause named


def test_filter_mask_rule_specific_facts():
    foreign = np.array([True, True, False])
    adv = np.array([-1.0, 0.5, -1.0])
    kl = np.array([80.0, 80.0, 80.0])
    f_and = filter_mask(adv, kl, foreign, threshold=50, rule="and", scope="foreign")[0]
    f_or = filter_mask(adv, kl, foreign, threshold=50, rule="or", scope="foreign")[0]
    assert f_and.tolist() == [True, False, False]
    assert f_or.tolist() == [True, True, False]
    # kl exactly at g is not far; NaN KL counts as far.
    at_g = filter_mask(np.array([-1.0]), np.array([50.0]), np.array([True]), threshold=50)[0]
    nan = filter_mask(np.array([-1.0]), np.array([np.nan]), np.array([True]), threshold=50)[0]
    assert at_g.tolist() == [False] and nan.tolist() == [True]


def test_filter_mask_bad_inputs():
    a, k, f = np.zeros(2), np.zeros(2), np.zeros(2, dtype=bool)
    assert "loss.filter_rule='xor' is not one of and, or" in _config_error("loss.filter_rule", "xor")
    assert "loss.filter_scope='own' is not one of foreign, all" in _config_error("loss.filter_scope", "own")
    with pytest.raises(ValueError, match="equal length"):
        filter_mask(a, np.zeros(3), f, threshold=1)
    with pytest.raises(ValueError, match="bool"):
        filter_mask(a, k, np.zeros(2), threshold=1)


def test_advantages_come_from_whole_group_before_filtering():
    # One prompt, G=4, one correct answer: the filter removes the negatives afterwards, but the
    # positive keeps the advantage computed with them in the group.
    rewards = np.array([[1.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards)[0]
    kl = np.array([100.0, 100.0, 100.0, 100.0])
    filtered, _, _ = filter_mask(adv, kl, np.ones(4, dtype=bool), threshold=50, rule="and")
    assert filtered.tolist() == [False, True, True, True]
    assert adv[0] == pytest.approx(0.75 / (math.sqrt(0.1875) + 1e-6))
    assert group_advantages(rewards[:, :1])[0, 0] == 0.0  # what recomputing after would give


def test_g_for_round_constant_and_linear():
    const = GSchedule(kind="constant", start=1.0, end=100.0)
    assert g_for_round(const, 50.0, 1, 10) == 50.0
    assert g_for_round(const, 7.0, 10, 10) == 7.0
    lin = GSchedule(kind="linear", start=1.0, end=100.0)
    assert g_for_round(lin, 50.0, 1, 10) == 1.0
    assert g_for_round(lin, 50.0, 10, 10) == 100.0
    assert g_for_round(lin, 50.0, 4, 10) == pytest.approx(1.0 + 99.0 * 3 / 9)
    assert g_for_round(lin, 50.0, 0, 10) == 1.0  # clamped
    assert g_for_round(lin, 50.0, 25, 10) == 100.0
    assert g_for_round(lin, 50.0, 1, 1) == 1.0
    decreasing = GSchedule(kind="linear", start=100.0, end=0.0)
    assert g_for_round(decreasing, 50.0, 6, 11) == pytest.approx(50.0)
    assert "nodes[a].g.kind='cosine' is not one of constant, linear" in _config_error(
        "nodes.0.g.kind", "cosine")
    assert "rounds.num_rounds=0 must be >= 1" in _config_error("rounds.num_rounds", 0)
