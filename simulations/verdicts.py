"""The paper's claims, tested on a finished sweep: paired over seeds, with the rule fixed first.

    python -m simulations.verdicts runs/sweep-main            # markdown to stdout
    python -m simulations.verdicts runs/sweep-main --out runs/sweep-main/verdicts.md
    python -m simulations.verdicts runs/sweep-main --brief   # the claims that ran, paired rule only
    python -m simulations.verdicts runs/sweep-main --plan 2  # + the seeds an MDD of 2 points needs

Each claim compares two configurations of one setup on the same seeds (same models, prompts and
sampling seed), one node at a time, on the final evaluation: d_s = 100 * (acc_A - acc_B) in
points for seed s. Each row is judged by two rules, side by side. **Today's rule** (the first
one, column "today's rule") was written before any result was read:

- a "better/worse" claim (A above B) is **reproduced** when every seed agrees (d_s > 0 for all
  n >= 5 seeds: one-sided sign test p = 2^-n <= 0.031), **not reproduced** when every seed
  disagrees, and **inconclusive** otherwise (or with fewer than 5 seeds);
- a "level" claim (A ends level with B) is **reproduced** when the mean d is within ±2 points
  and the seeds do not all agree in sign, **not reproduced** when all seeds agree (A reliably
  above or below B: which one is said), and inconclusive with fewer than 5 seeds.

"Every seed agrees" gets harder to meet as seeds are added, so more seeds cannot settle a claim
under it. The **paired rule** (``paired.py``, fixed before the runs of issue 39; columns "mean
[95% interval]" to "paired rule") judges the same d_s by the paired Student-t 95% interval of
their mean (a verdict in about 5% of studies with no effect: ``paired.py --calibrate``): an
"above" claim is reproduced when the interval lies above 0 and refuted when it lies below; a
"level" claim is reproduced when it lies inside ±2 points and refuted when it lies wholly
outside. Beside it: the exact Wilcoxon signed-rank p and the minimum detectable
difference (80% power) for that many seeds.

Claims checked here (algorithm §11, the paper's Table 2 and Figure 3), per setup:

- (a) NoIS collapses: nois vertical ends below alone, in-distribution, for some node;
- (c) F-TIS ends level with alone in-distribution, for every node;
- (d) F-TIS beats alone out-of-distribution for the weaker partner (lower round-0 ID accuracy;
  on a tie within 1 point, the lower final ID accuracy alone);
- (a') F-TIS ends above NoIS in-distribution (the correction is what prevents (a)).

Where their runs are in the sweep (``sweeps/extra-f.yaml``, ``extra-h.yaml``, ``extra-g.yaml``
or ``cpu.yaml``), also:

- (b) F-NoIS ends above NoIS in-distribution, with the share of NoIS's loss to alone recovered;
- (w) F-TIS ends above F-NoIS in-distribution: what the weights add to the filter (the
  collapse counts of the same study: ``collapse.py``);
- (e) vertical F-TIS ends above horizontal F-TIS in-distribution;
- (f) F-VIS is above F-TIS at the first evaluation after round 0 and below it at the end;
- (g) small g early, large g late: F-TIS with g rising linearly (from 1), and with every constant
  g below the reference g (``--g``, the paper's 50), is above the reference at the first
  evaluation after round 0; the reference is above each smaller constant g at the end.

Not a claim of the paper, tested the same way where ``sweeps/extra-rule.yaml`` ran:

- (rule) filter rule "or" ends level with "and" (the authors' rule): setup ``<name>-or`` (F-TIS
  with ``loss.filter_rule=or``) against setup ``<name>``'s F-TIS, same seeds.
- (ratio) between peers of different tokenizers, F-TIS with chunk ratios ends above F-TIS with one
  HACPO-style ratio of means per completion (``sweeps/xtok.yaml``, ``xtok-seq.yaml``): setup
  ``<name>-seq`` (``loss.cross_tokenizer_ratio=sequence``) against setup ``<name>``'s F-TIS; and
  word-boundary chunks (ALM-style, setup ``<name>-word``, ``loss.cross_tokenizer_ratio=word``)
  above chunk ratios (``sweeps/xfamily-rg.yaml``).

F-TIS means F-TIS vertical at the reference g in every claim but (g).

A claim whose configurations are not in the sweep is listed as "not run".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from simulations.paired import HEADER, NOT_RUN, cells, seeds_for
from simulations.sweep_report import config_label, load_results

MIN_SEEDS = 5
LEVEL_POINTS = 2.0
Judge = Callable[[list[float], str], str]
"""A claim's verdict cells from its per-seed differences and kind ("above" / "level"): ``both``."""


def finals(results: list[dict], setup: str, label: str, split: str, at: int | None = None
           ) -> dict[int, dict[str, float]]:
    """seed -> node -> final accuracy of one configuration on ``split`` (``at``: the evaluation
    of that round instead)."""
    out: dict[int, dict[str, float]] = {}
    for r in results:
        p = r["point"]
        if p["setup"] != setup or config_label(p) != label:
            continue
        for node, data in r["summary"]["nodes"].items():
            series = data.get("accuracy", {}).get(split, [])
            if at is not None:
                series = [x for x in series if x[0] == at]
            if series:
                out.setdefault(p["seed"], {})[node] = series[-1][1]
    return out


def first_eval_after_start(results: list[dict], setup: str, split: str) -> int | None:
    """The first evaluated round after round 0 in the setup's runs (the "early" point)."""
    rounds = sorted({x[0] for r in results if r["point"]["setup"] == setup
                     for d in r["summary"]["nodes"].values() for x in d.get("accuracy", {}).get(split, [])})
    return next((x for x in rounds if x > 0), None)


def starts(results: list[dict], setup: str, split: str) -> dict[str, float]:
    """node -> mean round-0 accuracy over every run of the setup (the models before training)."""
    acc: dict[str, list[float]] = {}
    for r in results:
        if r["point"]["setup"] != setup:
            continue
        for node, data in r["summary"]["nodes"].items():
            series = data.get("accuracy", {}).get(split, [])
            if series and series[0][0] == 0:
                acc.setdefault(node, []).append(series[0][1])
    return {n: sum(v) / len(v) for n, v in acc.items()}


def weaker_partner(start: dict[str, float], alone_final: dict[int, dict[str, float]]) -> str:
    """The node with the lower round-0 ID accuracy; within 1 point (the same base model, as in
    the trainable-parameter setup), the one that ends lower alone (the weaker learner)."""
    lo = min(start.values())
    tied = [n for n, v in start.items() if v - lo < 0.01]
    if len(tied) == 1:
        return tied[0]
    mean = {n: sum(a[n] for a in alone_final.values() if n in a) / max(1, sum(n in a for a in alone_final.values()))
            for n in tied}
    return min(tied, key=mean.get)


def paired(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], node: str) -> list[float]:
    seeds = sorted(s for s in set(a) & set(b) if node in a[s] and node in b[s])
    return [100.0 * (a[s][node] - b[s][node]) for s in seeds]


def decide(d: list[float], kind: str) -> str:
    """The rule's decision in a word: "above" / "below" (every seed on that side), "level" (a
    "level" claim whose mean is within ±LEVEL_POINTS, seeds not all on one side), or "?"
    (inconclusive, fewer than MIN_SEEDS seeds included)."""
    if len(d) < MIN_SEEDS:
        return "?"
    if all(x > 0 for x in d):
        return "above"
    if all(x < 0 for x in d):
        return "below"
    if kind == "level" and abs(sum(d) / len(d)) < LEVEL_POINTS:
        return "level"
    return "?"


def verdict(d: list[float], kind: str) -> str:
    if len(d) < MIN_SEEDS:
        return f"inconclusive ({len(d)} seeds < {MIN_SEEDS})"
    above, below = sum(x > 0 for x in d), sum(x < 0 for x in d)
    mean = sum(d) / len(d)
    word = decide(d, kind)
    if kind == "above":
        if word == "above":
            return f"reproduced ({above}/{len(d)} seeds, sign test p={2.0 ** -len(d):.3f})"
        if word == "below":
            return f"not reproduced (below in {below}/{len(d)} seeds)"
        return f"inconclusive (above in {above}/{len(d)} seeds)"
    if word in ("above", "below"):
        return f"not reproduced ({word} in every seed: {mean:+.1f} points)"
    if word == "level":
        return f"reproduced (mean within ±{LEVEL_POINTS:g} points; {above} above, {below} below)"
    return f"inconclusive (mean {mean:+.1f} points, seeds split {above}/{below})"


def both(d: list[float], kind: str, plan: float | None = None) -> str:
    """Today's rule's verdict, then the paired rule's cells (``paired.cells``), for one claim;
    with ``plan``, last, the seeds whose MDD would be ``plan`` points (``paired.seeds_for``)."""
    text = f"{verdict(d, kind)} | {cells(d, kind)}"
    if plan is not None:
        n = seeds_for(d, plan)
        text += f" | {'-' if n is None else n}"
    return text


def fmt_points(d: list[float]) -> str:
    """Paired differences in points: "mean (min..max)", or "-" when there are none."""
    if not d:
        return "-"
    return f"{sum(d) / len(d):+.1f} ({min(d):+.1f}..{max(d):+.1f})"


def reference_ftis(labels: set[str], g: str) -> str | None:
    """The F-TIS vertical label the claims compare against: constant ``g`` if it ran, else the
    first constant g in the sweep (never a schedule)."""
    constant = sorted((lab for lab in labels if lab.startswith("f-tis vertical g=")
                       and not lab.startswith("f-tis vertical g=lin")), key=_g_value)
    if f"f-tis vertical g={g}" in constant:
        return f"f-tis vertical g={g}"
    if constant:
        print(f"verdicts: no f-tis vertical g={g} in the sweep; F-TIS is {constant[0]!r}", file=sys.stderr)
    return next(iter(constant), None)


def _g_value(label: str) -> float:
    """A label's constant g; infinity for a schedule or no g."""
    try:
        return float(label.rsplit("g=", 1)[1])
    except (IndexError, ValueError):
        return float("inf")


def claims(results: list[dict], id_split: str = "test", ood_split: str = "ood",
           reference_g: str = "50", plan: float | None = None) -> list[str]:
    """Markdown rows: setup, claim, node, paired difference mean (min..max), n, today's rule's
    verdict, then the paired rule's mean [95% interval], Wilcoxon p, MDD and verdict; with
    ``plan``, a last column: how many seeds would bring the MDD down to ``plan`` points."""
    extra = "" if plan is None else f" seeds for an MDD of {plan:g} |"
    rows = [f"| setup | claim | node | difference, points: mean (min..max) | seeds | today's rule | {HEADER} |{extra}",
            "|" + " --- |" * (10 if plan is None else 11)]
    not_run = NOT_RUN if plan is None else NOT_RUN + " | -"

    def judge(d: list[float], kind: str) -> str:
        return both(d, kind, plan)

    labels = {config_label(r["point"]) for r in results}
    ftis = reference_ftis(labels, reference_g)
    setups = list(dict.fromkeys(r["point"]["setup"] for r in results))
    for setup in setups:
        nodes = list(starts(results, setup, id_split))
        if setup.endswith(RULE_SUFFIX) and setup[:-len(RULE_SUFFIX)] in setups:
            rows += _variant_rows(results, setup, setup[:-len(RULE_SUFFIX)], nodes, ftis, id_split, judge,
                                  '(rule) "or" level with "and" (ID)', "level", variant_first=True)
            continue
        if setup.endswith(RATIO_SUFFIX) and setup[:-len(RATIO_SUFFIX)] in setups:
            rows += _variant_rows(results, setup, setup[:-len(RATIO_SUFFIX)], nodes, ftis, id_split, judge,
                                  "(ratio) chunk ratios above a sequence ratio (ID)", "above", variant_first=False)
            continue
        if setup.endswith(WORD_SUFFIX) and setup[:-len(WORD_SUFFIX)] in setups:
            rows += _variant_rows(results, setup, setup[:-len(WORD_SUFFIX)], nodes, ftis, id_split, judge,
                                  "(ratio) word-boundary chunks above chunk ratios (ID)", "above", variant_first=True)
            continue
        alone_id, alone_ood = finals(results, setup, "alone", id_split), finals(results, setup, "alone", ood_split)
        nois_id = finals(results, setup, "nois vertical", id_split)
        if nois_id and alone_id:
            for node in nodes:
                d = paired(alone_id, nois_id, node)
                rows.append(f"| {setup} | (a) NoIS ends below alone (ID) | {node} | {fmt_points(d)} | {len(d)} | "
                            f"{judge(d, 'above')} |")
        else:
            rows.append(f"| {setup} | (a) NoIS ends below alone (ID) | - | - | 0 | not run | {not_run} |")
        if ftis is None or not alone_id:
            rows.append(f"| {setup} | (c), (d) | - | - | 0 | not run (no f-tis vertical or alone) | {not_run} |")
            continue
        ftis_id, ftis_ood = finals(results, setup, ftis, id_split), finals(results, setup, ftis, ood_split)
        if nois_id:
            for node in nodes:
                d = paired(ftis_id, nois_id, node)
                rows.append(f"| {setup} | (a') F-TIS ends above NoIS (ID) | {node} | {fmt_points(d)} | {len(d)} | "
                            f"{judge(d, 'above')} |")
        for node in nodes:
            d = paired(ftis_id, alone_id, node)
            rows.append(f"| {setup} | (c) F-TIS level with alone (ID) | {node} | {fmt_points(d)} | {len(d)} | "
                        f"{judge(d, 'level')} |")
        start = starts(results, setup, id_split)
        weaker = weaker_partner(start, alone_id)
        d = paired(ftis_ood, alone_ood, weaker)
        rows.append(f"| {setup} | (d) F-TIS above alone (OOD), weaker partner | {weaker} "
                    f"(ID {start[weaker]:.3f} at round 0) | {fmt_points(d)} | {len(d)} | {judge(d, 'above')} |")
        rows += _more(results, setup, nodes, labels, ftis, id_split, judge)
    def has(part: str) -> bool:
        return any(part in lab for lab in labels)

    for claim, needs, ran in (("(b) F-NoIS recovers most of NoIS's loss", "f-nois", has("f-nois")),
                              ("(e) vertical beats horizontal", "horizontal", has("horizontal")),
                              ("(f) F-VIS faster early, falls late", "f-vis", has("f-vis")),
                              ("(g) small g early, large g late", "f-tis vertical with a smaller g or a schedule",
                               bool(_g_compared(labels, ftis)))):
        if not ran:
            rows.append(f"| all | {claim} | - | - | 0 | not run (needs {needs} runs: sweeps/extra-*.yaml) | "
                        f"{not_run} |")
    return rows


RULE_SUFFIX = "-or"
RATIO_SUFFIX = "-seq"
WORD_SUFFIX = "-word"


def _variant_rows(results: list[dict], setup: str, base: str, nodes: list[str], ftis: str | None,
                  id_split: str, judge: Judge, claim: str, kind: str, variant_first: bool) -> list[str]:
    """A claim between setup ``<base>`` and its variant ``setup`` (same seeds), F-TIS's final ID
    accuracy per node; ``variant_first``: the difference is variant - base, else base - variant.
    (rule): ``<base>-or`` level with ``<base>``; (ratio): ``<base>`` above ``<base>-seq``."""
    if ftis is None:
        return []
    variant, plain = finals(results, setup, ftis, id_split), finals(results, base, ftis, id_split)
    a, b = (variant, plain) if variant_first else (plain, variant)
    rows = []
    for node in nodes:
        d = paired(a, b, node)
        rows.append(f"| {base} | {claim} | {node} | {fmt_points(d)} | {len(d)} | {judge(d, kind)} |")
    return rows


def _more(results: list[dict], setup: str, nodes: list[str], labels: set[str], ftis: str,
          id_split: str, judge: Judge) -> list[str]:
    """Rows of (b), (e), (f) and (g) where their runs exist (see the module's docstring)."""
    rows = []
    nois = finals(results, setup, "nois vertical", id_split)
    alone = finals(results, setup, "alone", id_split)
    fnois_label = next((lab for lab in sorted(labels) if lab.startswith("f-nois vertical")), None)
    fnois = finals(results, setup, fnois_label, id_split) if fnois_label else {}
    if fnois and nois:
        for node in nodes:
            d = paired(fnois, nois, node)
            same = {k: alone[k] for k in alone if k in fnois}  # NoIS's loss on the same seeds
            lost = paired(same, nois, node)
            share = (f"; recovers {sum(d) / sum(lost):.0%} of NoIS's loss to alone"
                     if lost and sum(lost) > 0 and len(lost) == len(d) else "")
            rows.append(f"| {setup} | (b) F-NoIS ends above NoIS (ID) | {node} | {fmt_points(d)}{share} | {len(d)} | "
                        f"{judge(d, 'above')} |")
    if fnois and ftis:  # what the weights add to the filter (sweeps/xfamily-upper-40.yaml)
        weighted = finals(results, setup, ftis, id_split)
        for node in nodes:
            d = paired(weighted, fnois, node)
            rows.append(f"| {setup} | (w) F-TIS ends above F-NoIS (ID) | {node} | {fmt_points(d)} | {len(d)} | "
                        f"{judge(d, 'above')} |")
    fvis_label = next((lab for lab in sorted(labels) if lab.startswith("f-vis vertical")), None)
    early = first_eval_after_start(results, setup, id_split)
    if fvis_label and ftis and early is not None and finals(results, setup, fvis_label, id_split):
        fvis_e, ftis_e = (finals(results, setup, lab, id_split, at=early) for lab in (fvis_label, ftis))
        fvis_l, ftis_l = (finals(results, setup, lab, id_split) for lab in (fvis_label, ftis))
        for node in nodes:
            d = paired(fvis_e, ftis_e, node)
            rows.append(f"| {setup} | (f) F-VIS above F-TIS early (ID, round {early}) | {node} | {fmt_points(d)} | "
                        f"{len(d)} | {judge(d, 'above')} |")
            d = paired(ftis_l, fvis_l, node)
            rows.append(f"| {setup} | (f) F-VIS below F-TIS at the end (ID) | {node} | {fmt_points(d)} | {len(d)} | "
                        f"{judge(d, 'above')} |")
    horizontal = next((lab for lab in sorted(labels) if lab.startswith("f-tis horizontal")), None)
    vert, hor = (finals(results, setup, lab, id_split) if lab else {} for lab in (ftis, horizontal))
    if vert and hor:  # a setup the horizontal grid left out has no row
        for node in nodes:
            d = paired(vert, hor, node)
            rows.append(f"| {setup} | (e) vertical F-TIS ends above horizontal (ID) | {node} | {fmt_points(d)} | "
                        f"{len(d)} | {judge(d, 'above')} |")
    rows += _g_rows(results, setup, nodes, labels, ftis, id_split, early, judge)
    return rows


def _g_compared(labels: set[str], ftis: str | None) -> list[str]:
    """The F-TIS labels claim (g) compares with the reference ``ftis``: every schedule and every
    smaller constant g, smallest first (a larger constant g has no (g) row)."""
    if ftis is None:
        return []
    return [lab for lab in sorted(labels, key=lambda lab: (_g_value(lab), lab)) if lab.startswith("f-tis vertical g=")
            and lab != ftis and (lab.startswith("f-tis vertical g=lin") or _g_value(lab) < _g_value(ftis))]


def _g_rows(results: list[dict], setup: str, nodes: list[str], labels: set[str], ftis: str | None,
            id_split: str, early: int | None, judge: Judge) -> list[str]:
    """(g): every schedule and smaller constant g above the reference early; the reference above
    every smaller constant g at the end."""
    if ftis is None or early is None:
        return []
    rows = []
    small = _g_compared(labels, ftis)
    ref_e, ref_l = finals(results, setup, ftis, id_split, at=early), finals(results, setup, ftis, id_split)
    for lab in small:
        g, ref = lab.split()[-1], ftis.split()[-1]
        if not finals(results, setup, lab, id_split):
            continue  # a setup this g's grid left out
        for node in nodes:
            d = paired(finals(results, setup, lab, id_split, at=early), ref_e, node)
            rows.append(f"| {setup} | (g) {g} above {ref} early (ID, round {early}) | {node} | {fmt_points(d)} | "
                        f"{len(d)} | {judge(d, 'above')} |")
        if lab.startswith("f-tis vertical g=lin"):
            continue  # a schedule ends at the reference g: "late" compares constants only
        for node in nodes:
            d = paired(ref_l, finals(results, setup, lab, id_split), node)
            rows.append(f"| {setup} | (g) {ref} above {g} at the end (ID) | {node} | {fmt_points(d)} | "
                        f"{len(d)} | {judge(d, 'above')} |")
    return rows


def brief(rows: list[str]) -> list[str]:
    """The claims that ran, in four columns for a short table (a README's): claim, node, the
    paired mean difference with its 95% interval, seeds, and the paired rule's verdict."""
    def split(row: str) -> list[str]:
        return [c.strip() for c in row.strip().strip("|").split(" | ")]

    def tail(cells: list[str]) -> str:  # claims(plan=...)'s last column, where it is there
        return "".join(f" {c} |" for c in cells[10:])

    head = split(rows[0])
    out = ["| claim | node | difference, points: mean [95% interval] | seeds | paired rule |" + tail(head),
           "| --- | --- | --- | --- | --- |" + " --- |" * len(head[10:])]
    for row in rows[2:]:
        cells = split(row)
        if cells[5].startswith("not run"):
            continue
        out.append(f"| {cells[1]} | {cells[2]} | {cells[6]} | {cells[4]} | {cells[9]} |" + tail(cells))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="a sweep's output folder (holding results/)")
    p.add_argument("--id-split", default="test")
    p.add_argument("--ood-split", default="ood")
    p.add_argument("--g", default="50", help="the reference g of F-TIS (default: the paper's 50)")
    p.add_argument("--out", default="", help="also write the table to this file (a note quoted at the "
                   "top of the file it replaces, its lines starting with '>', is kept above the table)")
    p.add_argument("--brief", action="store_true",
                   help="only the claims that ran: claim, node, the paired interval, seeds, the paired verdict")
    p.add_argument("--plan", type=float, default=None, metavar="POINTS",
                   help="add a column: how many seeds would bring the minimum detectable difference "
                   "down to POINTS, if the per-seed differences kept their spread")
    a = p.parse_args(argv)
    if a.plan is not None and not (0 < a.plan < float("inf")):
        p.error(f"--plan {a.plan:g}: a difference in points above 0")
    results = load_results(Path(a.sweep))
    if not results:
        raise SystemExit(f"{a.sweep}: no finished run under results/")
    rows = claims(results, a.id_split, a.ood_split, a.g, plan=a.plan)
    text = "\n".join(brief(rows) if a.brief else rows)
    print(text)
    if a.out:
        out = Path(a.out)
        out.write_text(leading_note(out) + text + "\n")


def leading_note(path: Path) -> str:
    """The note quoted at the top of ``path`` (its first lines starting with ``>``, and one blank
    line after them), or ``""``: a page's note (e.g. which reward its runs trained with) survives a
    redraw of its table."""
    if not path.is_file():
        return ""
    note = []
    for line in path.read_text().splitlines():
        if not line.startswith(">"):
            break
        note.append(line)
    return "\n".join(note) + "\n\n" if note else ""


if __name__ == "__main__":
    main()
