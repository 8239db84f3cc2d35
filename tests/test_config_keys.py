"""pyproject.toml's [tool.flwr.app.config] block is generated from ftis_flwr/config/schema.py: they must agree."""

from pathlib import Path

from ftis_flwr.config.keys import PYPROJECT, current_block, main, render_block, replace_block

REPO = Path(__file__).resolve().parent.parent


def test_pyproject_block_agrees_with_the_dataclasses():
    assert PYPROJECT == REPO / "pyproject.toml"
    assert current_block(PYPROJECT.read_text()) == render_block(), (
        "[tool.flwr.app.config] in pyproject.toml disagrees with ftis_flwr/config/schema.py: "
        "run `python -m ftis_flwr.config.keys --write`")


def test_write_rewrites_only_the_block(tmp_path):
    text = PYPROJECT.read_text()
    stale = text.replace('"loss.method" = ""\n', "").replace(
        "[tool.flwr.app.config]\n", "[tool.flwr.app.config]\nold-key = 1\n")
    stale += "\n[tool.other]\nx = 1\n"  # a table after the block survives byte for byte
    path = tmp_path / "pyproject.toml"
    path.write_text(stale)
    assert main(["--check", "--pyproject", str(path)]) == 1
    assert main(["--write", "--pyproject", str(path)]) == 0
    new = path.read_text()
    assert main(["--check", "--pyproject", str(path)]) == 0
    start = text.index("[tool.flwr.app.config]")
    assert new[:start] == text[:start] and new.endswith("\n\n[tool.other]\nx = 1\n")
    assert "old-key" not in new and '"loss.method" = ""' in new
    assert replace_block(new) == new


def test_every_scalar_field_has_a_key():
    import dataclasses

    from ftis_flwr.config.keys import run_config_keys
    from ftis_flwr.config.schema import ExperimentConfig

    keys = set(run_config_keys().values())
    for section in dataclasses.fields(ExperimentConfig):
        value = getattr(ExperimentConfig(), section.name)
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                if isinstance(getattr(value, f.name), (str, int, float, bool)):
                    assert f"{section.name}.{f.name}" in keys


def test_the_configuration_reference_page_is_up_to_date(tmp_path):
    """docs/reference/configuration.md is generated from the same docstrings; stale = fail."""
    from ftis_flwr.config.reference import PAGE, render

    assert PAGE == REPO / "docs" / "reference" / "configuration.md"
    assert PAGE.read_text() == render(), "run `python -m ftis_flwr.config.reference --write`"
    text = render()
    for key in ("`loss.trunc-c`", "`nodes.N.*`", "`cpu-pair`", "`f-tis`", "`tiny-tokenizer`"):
        assert key in text, key
    stale = tmp_path / "configuration.md"
    stale.write_text(text.replace("`loss.trunc-c`", "`loss.trunc`"))
    from ftis_flwr.config.reference import main

    assert main(["--check", "--page", str(stale)]) == 1
    assert main(["--write", "--page", str(stale)]) == 0 and main(["--check", "--page", str(stale)]) == 0
