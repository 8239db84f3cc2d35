"""docs/reference/metrics.md is generated from the catalogue in ftis_flwr/server/reporting/metric_names.py, and
the catalogue names every metric the code logs: the page fails here when it drifts, and a metric
logged without a catalogue entry fails here (the update's metrics, computed from a synthetic batch;
the real runs kept under docs/) and in tests/test_e2e_simulation.py (a tiny federation's run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ftis_flwr.server.reporting import metric_names
from ftis_flwr.server.reporting.metric_names import METRICS, PAGE, SECTIONS, find, main, render, uncatalogued

REPO = Path(__file__).resolve().parent.parent


def test_the_metrics_reference_page_is_up_to_date(tmp_path):
    assert PAGE == REPO / "docs" / "reference" / "metrics.md"
    assert PAGE.read_text() == render(), "run `python -m ftis_flwr.server.reporting.metric_names --write`"
    stale = tmp_path / "metrics.md"
    stale.write_text(render().replace("`w_mean`", "`w_avg`"))
    assert main(["--check", "--page", str(stale)]) == 1
    assert main(["--write", "--page", str(stale)]) == 0 and main(["--check", "--page", str(stale)]) == 0
    nav = (REPO / "mkdocs.yml").read_text()
    assert "reference/metrics.md" in nav


def test_the_catalogue_is_well_formed():
    seen = [(m.scope, m.name) for m in METRICS]
    assert len(seen) == len(set(seen)), "a metric is catalogued twice"
    assert {m.section for m in METRICS} == set(SECTIONS)
    assert {m.scope for m in METRICS} == {"node", "server"}
    assert all(m.meaning.endswith(".") and m.unit for m in METRICS)
    for m in METRICS:  # every entry is found by its own name (a pattern by itself, as written)
        assert find(m.name, m.scope) is m


@pytest.mark.parametrize("key,scope,name", [
    ("w_mean", "node", "w_mean"),
    ("gemma/w_mean", "node", "<source>/w_mean"),
    ("small/w_p90", "node", "<source>/w_p<q>"),
    ("large/text_refused", "node", "<source>/text_refused"),
    ("large/text_refused_unknown_token", "node", "<source>/text_refused_<reason>"),
    ("eval/ood/accuracy", "node", "eval/<split>/accuracy"),
    ("round_seconds", "server", "round_seconds"),
    ("ranks", "node", "ranks"),
])
def test_a_logged_key_finds_its_entry(key, scope, name):
    assert find(key, scope).name == name


def test_an_unknown_key_is_reported_with_its_scope():
    records = [{"round": 0, "server": {"round_seconds": 1.0, "w_mean": 1.0},
                "nodes": {"a": {"w_mean": 1.0, "a/b/w_mean": 1.0, "eval/test/acc": 0.5}}},
               {"event": "node_failed", "node": "a"}]
    assert uncatalogued(records) == ["node: a/b/w_mean", "node: eval/test/acc", "server: w_mean"]


def _stats():
    """A batch of 4 samples from two sources with a clipping method: every loss metric appears."""
    from ftis_flwr.maths.loss_metrics import LossStats

    n_tokens = np.array([2, 3, 1, 2])
    n = int(n_tokens.sum())
    return LossStats(
        loss_sum=1.0, denominator=4.0, foreign=np.array([False, False, True, True]),
        sources=["a", "a", "b", "b"], advantages=np.array([1.0, -1.0, 0.0, -0.5]),
        advantages_used=np.array([1.0, -1.0, 0.0, 0.0]), filtered=np.array([False, False, False, True]),
        filtered_negative=np.array([False, False, False, True]), filtered_kl=np.array([False, False, False, True]),
        would_filter=np.array([False, False, False, True]), counted=np.ones(4, bool),
        sample_kl=np.array([0.0, 0.0, 0.5, 80.0]), n_tokens=n_tokens,
        log_ratio=np.linspace(-1, 1, n), w=np.linspace(0.2, 2.0, n), clip=np.zeros(n, bool))


def test_every_metric_of_an_update_is_catalogued():
    from ftis_flwr.maths.loss_metrics import loss_metrics, own_gap

    s = _stats()
    logged = {**loss_metrics(s, trunc_c=2.0), **own_gap(s)}
    assert "a/w_p99" in logged and "clip_frac" in logged  # the batch reaches the optional ones
    assert uncatalogued([{"nodes": {"a": logged}}]) == []


def test_every_text_refusal_reason_is_a_catalogued_metric():
    from ftis_flwr.xtok.represent import REASONS

    assert all(find(f"b/text_refused_{why}").name == "<source>/text_refused_<reason>" for why in REASONS)


def test_every_metric_of_the_runs_the_lab_keeps_is_catalogued():
    """Real runs (SmolLM2 and Gemma, across tokenizers) whose metrics.jsonl the lab keeps
    (simulations/results/)."""
    files = sorted((REPO / "simulations" / "results").rglob("metrics.jsonl"))
    assert len(files) >= 90, len(files)  # 98 when the run data left docs/
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    assert uncatalogued(records) == [], "add them to ftis_flwr/server/reporting/metric_names.py (and --write the page)"


def test_the_catalogue_needs_no_torch():
    import subprocess
    import sys

    script = ("import sys; import ftis_flwr.server.reporting.metric_names;"
              "print(sorted(m for m in ('torch', 'flwr', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]
    assert metric_names.__doc__
