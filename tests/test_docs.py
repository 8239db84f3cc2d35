"""The documentation: the README stays a front door, every relative link and image in it and in
docs/ points at a file that exists, nothing speaks of the environment the project is developed in,
and the site builds with ``mkdocs build --strict`` (every page in the nav, every link and anchor
resolved, every docstring of the API page rendered without a warning)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (a link there is not a link)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_and_image_exists(page):
    missing = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor on the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_the_docs_speak_of_the_project_not_of_where_it_is_developed(page):
    text = page.read_text()
    for word in ("../shared", "workplace"):
        assert word not in text.lower(), f"{page.relative_to(REPO)} mentions {word!r}"


def test_the_site_builds_strictly(tmp_path):
    """The ``[docs]`` extra (part of ``[test]``) builds the site into a temporary folder, never
    into the repository."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert (tmp_path / "site" / "index.html").is_file(), out[-8000:]
    api = tmp_path / "site" / "reference" / "api" / "index.html"
    assert api.is_file(), out[-8000:]
    html = api.read_text()
    assert "ftis_flwr.maths.advantages.filter_mask" in html  # a cross-reference the docstrings make
    left = re.findall(r":(?:func|class|mod|meth|attr|data|exc|obj):<code>[^<]*", html)
    assert not left, f"Sphinx roles shown as text on the API page: {left[:5]}"  # scripts/mkdocs_hooks.py


def test_the_test_suite_figure_is_quoted_once_and_linked_from_the_readme():
    """The suite's count and time stand in getting-started only (each figure once); the README
    links to them."""
    pattern = re.compile(r"(\d+) passed and (\d+) skipped\s+in\s+(\d+ min \d+ s)")
    quotes = {name: pattern.findall(" ".join((REPO / name).read_text().split()))
              for name in ("README.md", "docs/getting-started.md")}
    assert quotes["README.md"] == [] and len(quotes["docs/getting-started.md"]) == 1, quotes
    assert "(docs/getting-started.md#the-test-suite)" in (REPO / "README.md").read_text()


def test_the_key_count_the_docs_quote_is_the_keys_there_are():
    """configuration.md's "(N of them" counts the flat run-config keys the dataclasses generate
    (every key of ``[tool.flwr.app.config]`` but the app's own four: preset, config-file, resume,
    overrides); a figure that drifts from the code fails here."""
    import tomllib

    from ftis_flwr.config.merge import APP_KEYS

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat = [k for k in declared if k.replace("-", "_") not in APP_KEYS]
    quoted = re.findall(r"\((\d+) of them", " ".join((REPO / "docs/configuration.md").read_text().split()))
    assert quoted == [str(len(flat))], (quoted, len(flat))


def _study(name: str) -> tuple[set[str], set[str]]:
    """(the grid's run keys, the keys of the result files kept in simulations/results/sweep-<name>/results), each
    kept result with its run's metrics beside it."""
    from simulations.sweep_grid import load_grid

    grid = load_grid(REPO / "simulations" / "sweeps" / f"{name}.yaml", check_configs=False)
    keys = {point.key for point in grid.points}
    kept = {p.stem for p in (REPO / "simulations" / "results" / f"sweep-{name}" / "results").glob("*.json")}
    assert kept <= keys, kept - keys
    for key in kept:
        assert (REPO / "simulations" / "results" / f"sweep-{name}" / "run-data" / key / "metrics.jsonl").is_file(), key
    return keys, kept


def test_the_study_progress_the_docs_quote_is_the_results_there_are():
    """A study's results are kept in docs/ as its runs finish. While a study is under way,
    docs/real-studies.md and the README say how many of its runs are finished: that number must be
    the result files kept (each with its run's metrics), and the grid's size. A complete study
    keeps every run of its grid, and no page still calls it under way; one with no result kept has
    not started."""
    page = (REPO / "docs" / "real-studies.md").read_text() + (REPO / "README.md").read_text()
    quoted = {(int(done), int(total)) for done, total in re.findall(r"(\d+) of (\d+)\s+runs", page)}
    quoted |= {(int(done), int(total))
               for total, done in re.findall(r"Of its (\d+) runs, (\d+) (?:is|are) finished", page)}
    under_way = set()
    for name in ("xfamily-rg", "xfamily-upper", "xfamily-upper-40", "real-pair-number"):
        keys, kept = _study(name)
        if kept and kept != keys:
            under_way.add((len(kept), len(keys)))
    assert quoted == under_way, (quoted, under_way)


INTERVAL = re.compile(r"\[\s*([+\-−]?\d+(?:\.\d+)?)\s*,\s*([+\-−]?\d+(?:\.\d+)?)\s*\]")
P_OF = re.compile(r"\bp\s+of\s+(\d*\.\d+)")
QUOTED_ELSEWHERE: set[tuple[str, str]] = set()
"""Known repeats not yet replaced by a link: (page, the figure as written there). Each should go."""


def _figures(page: Path) -> list[tuple[str, int, str, tuple[float, ...], float]]:
    """(page, line, the figure as written, its values, half a unit of its last digit) for every
    interval "[lo, hi]" and every "p of x" in the page's prose."""
    name = str(page.relative_to(REPO))
    out = []
    text = re.sub(r"^(```|~~~).*?^\1", lambda m: "\n" * m.group(0).count("\n"), page.read_text(),
                  flags=re.MULTILINE | re.DOTALL)  # fenced code blanked, its lines kept, so lines count true
    text = re.sub(r"`[^`\n]*`", "", text)
    for pattern in (INTERVAL, P_OF):
        for m in pattern.finditer(text):  # the whole text: a figure may break across lines
            written = " ".join(m.group(0).split())
            ends = [g.replace("−", "-") for g in m.groups()]
            digits = max(len(e.split(".")[1]) if "." in e else 0 for e in ends)
            if (name, written) not in QUOTED_ELSEWHERE:
                out.append((name, text.count("\n", 0, m.start()) + 1, written, tuple(float(e) for e in ends),
                            0.5 * 10 ** -digits))
    return out


def test_every_interval_is_quoted_once():
    """A study's figures stand once, where they are measured, and other pages link to them, so a
    copy cannot drift from its table (issue #55: the README's "[+0.3, +4.4]" was the table's
    "[+0.34, +4.35]" rounded twice). Two quotes are the same figure when every value agrees to the
    coarser quote's precision, whatever the page and however many digits each gives."""
    figures = [f for page in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))) for f in _figures(page)]
    repeats = []
    for i, (page, line, text, values, half) in enumerate(figures):
        for other_page, other_line, other_text, other_values, other_half in figures[i + 1:]:
            if len(values) == len(other_values) and all(
                    abs(a - b) <= max(half, other_half) + 1e-9 for a, b in zip(values, other_values)):
                repeats.append(f"{text} ({page}:{line}) and {other_text} ({other_page}:{other_line})")
    assert not repeats, ("the same figure quoted twice; quote it once, where it is measured, and link "
                         "to it there: " + "; ".join(repeats))
