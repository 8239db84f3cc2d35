"""The built wheel: the library and its presets, no top-level `clients` or `server_app` packages."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(REPO)], check=True, timeout=300)
    (whl,) = out.glob("ftis_flwr-*.whl")
    return zipfile.ZipFile(whl).namelist()


def test_only_the_library_is_a_top_level_package(wheel):
    top = {name.split("/")[0] for name in wheel if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"ftis_flwr"}, top


def test_presets_and_shipped_models_are_in_the_wheel(wheel):
    assert "ftis_flwr/config/presets/cpu-pair.yaml" in wheel  # no force-include: they live in the package
    assert any(n.startswith("ftis_flwr/assets/tiny/") and n.endswith(".safetensors") for n in wheel)
