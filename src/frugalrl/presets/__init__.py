"""Per-env hyperparameter presets, like rl-zoo's hyperparameter files: ``presets/<algo>.json``.

Each file maps an env (a Gymnasium id, or a ``module:function`` factory) to field values of the algorithm's
config, with ``_source`` saying where they come from. ``frugalrl train ALGO --env X`` starts from X's preset
when there is one (and says so when there is none); flags given on the command line override it.
``--preset NAME`` takes the preset of another env id, ``--preset FILE.json`` a file of your own (one set of
fields, or a mapping env -> fields as here), ``--preset none`` the config's defaults. In Python:
``frugalrl.presets.make_config("ppo", "LunarLander-v3", seed=2)``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

AUTO = "auto"
NONE = "none"


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """Every preset of ``algo`` (``{}`` if it has no preset file)."""
    name = f"{algo.replace('-', '_')}.json"
    path = resources.files(__package__).joinpath(name)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def resolve(algo: str, env: str, preset: str | None = AUTO) -> tuple[dict[str, Any], str | None]:
    """The field values ``preset`` gives ``algo`` on ``env``, and its name (None: no preset applies).

    ``preset``: ``"auto"`` (``env``'s own, if any), ``"none"``, an env id of the algorithm's file, or a
    ``.json`` file (its fields, or the entry for ``env`` in a mapping env -> fields). ``ValueError`` names
    an unknown preset.
    """
    if preset is None or preset.lower() in (NONE, "null", ""):
        return {}, None
    table = presets(algo)
    if preset == AUTO:
        return (_fields(table[env]), env) if env in table else ({}, None)
    if preset in table:
        return _fields(table[preset]), preset
    path = Path(preset)
    if path.suffix == ".json" and path.is_file():
        data = json.loads(path.read_text())
        if isinstance(data, dict) and env in data and isinstance(data[env], dict):
            data = data[env]
        if not isinstance(data, dict):
            raise ValueError(f"preset file {path} must hold a JSON object of config fields")
        return _fields(data), str(path)
    known = ", ".join(sorted(table)) or "none"
    raise ValueError(f"unknown {algo} preset {preset!r}: give an env id with a preset ({known}), a .json file, "
                     "'auto' or 'none'")


def _fields(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not k.startswith("_")}


def make_config(algo: str, env: str, preset: str | None = AUTO, **overrides: Any) -> Any:
    """``algo``'s config for ``env``: the preset's values, then ``overrides`` (the Python ``--preset``)."""
    from frugalrl.algos import algorithm
    from frugalrl.config import config_from_dict

    _, cls = algorithm(algo).load()
    values, name = resolve(algo, env, preset)
    return config_from_dict(cls, {**values, **overrides, "env": env, "preset": name}, where=f"preset {name}")
