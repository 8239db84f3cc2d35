"""Where a preset name leads: the YAML files shipped in ``ftis_flwr/config/presets``, or a path.
Apart from :mod:`ftis_flwr.config.merge` because the validation reads a preset's task section
(:mod:`ftis_flwr.config.task_keys`) and merge runs the validation."""

from __future__ import annotations

from pathlib import Path

from ftis_flwr.config.schema import ConfigError

PRESET_DIR = Path(__file__).resolve().parent / "presets"
"""The named presets, shipped inside the package (source checkout and wheel alike)."""


def _preset_dirs() -> list[Path]:
    return [d for d in (PRESET_DIR,) if d.is_dir()]


def resolve_preset(preset: str) -> Path:
    """A preset name (file stem under ftis_flwr/config/presets) or a path to a YAML file."""
    path = Path(preset).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = next((d / f"{preset}.yaml" for d in _preset_dirs() if (d / f"{preset}.yaml").is_file()),
                     PRESET_DIR / f"{preset}.yaml")
    if candidate.is_file():
        return candidate
    available = sorted({p.stem for d in _preset_dirs() for p in d.glob("*.yaml")})
    raise ConfigError(f"preset {preset!r} is neither a YAML file nor one of: "
                      f"{', '.join(available) or '(none found)'}")
