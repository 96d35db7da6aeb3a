"""Per-env hyperparameter presets, like rl-zoo's hyperparameter files: ``presets/<algo>.json``, and fallbacks
per family of envs for the envs that have none.

Each file maps an env (a Gymnasium id, or a ``module:function`` factory) to field values of the algorithm's
config, with ``_source`` saying where they come from. ``frugalrl train ALGO --env X`` starts from X's preset
when there is one; when there is none and the file has ``_families`` (PPO's), from the entry of X's family,
chosen by its spaces (:func:`family_of`: ``continuous``, ``discrete``, ``image`` or ``grid``), so that a
continuous-control task does not inherit Atari's settings. A preset is for the spaces it was tuned on: env kwargs
that make another registered env take that env's preset, and kwargs or wrappers that change the spaces' kinds or
sizes take the family's (:func:`resolve`). Flags given on the command line override either.
``--preset NAME`` takes the preset of another env id, ``--preset family:continuous`` a family's, ``--preset
FILE.json`` a file of your own (one set of fields, or a mapping env -> fields as here), ``--preset none`` the
config's defaults. In Python: ``frugalrl.presets.make_config("ppo", "LunarLander-v3", seed=2)``. The config
records where each value that differs from its default came from (``sources``, :func:`build`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from frugalrl.batching import keep_batch

if TYPE_CHECKING:
    import gymnasium as gym

log = logging.getLogger(__name__)

AUTO = "auto"
NONE = "none"
FAMILY = "family:"
"""Prefix of a family's preset name (``family:continuous``)."""
Family = Literal["continuous", "discrete", "image", "grid"]
"""Families of envs that get their own fallback: Box actions, other actions, image frames, small grids."""


def _file(algo: str) -> dict[str, Any]:
    name = f"{algo.replace('-', '_')}.json"
    path = resources.files(__package__).joinpath(name)
    return json.loads(path.read_text()) if path.is_file() else {}


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """Every preset of ``algo`` by env (``{}`` if it has no preset file)."""
    return {k: v for k, v in _file(algo).items() if not k.startswith("_")}


def families(algo: str) -> dict[str, dict[str, Any]]:
    """``algo``'s fallback per family (the ``_families`` entry of its file; ``{}``: none, the config's defaults)."""
    return {k: v for k, v in _file(algo).get("_families", {}).items() if not k.startswith("_")}


def family_of(observation_space: gym.Space, action_space: gym.Space) -> Family:
    """The family of an env with these (single-env) spaces: ``image`` for uint8 frames (either channel order) and ``grid`` for small
    (H, W, C) grids (what ``--net auto`` gives a CNN, :func:`frugalrl.nets.image_layout`), else ``continuous`` for
    Box actions, else ``discrete``."""
    import gymnasium as gym

    from frugalrl.nets import image_layout

    layout = image_layout(observation_space)
    if layout is not None:
        return "grid" if layout == "grid" else "image"
    return "continuous" if isinstance(action_space, gym.spaces.Box) else "discrete"


def env_family(env: str, env_kwargs: dict[str, Any] | None = None, env_wrappers: list[Any] | None = None) -> Family:
    """The family of ``env``: one env is built here, as a worker builds it (wrappers included), to read its spaces."""
    from frugalrl.envs.spec import to_env_spec

    return family_of(*_spaces(to_env_spec(env, env_kwargs, env_wrappers)))


def space_kind(space: gym.Space) -> Any:
    """What a preset's tuning rests on in a space: its type and sizes, not its bounds (``Discrete(4)`` and a
    ``Box`` of shape ``(2,)`` differ; two Boxes of shape ``(3,)`` with other bounds do not)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return ("Dict", tuple((key, space_kind(sub)) for key, sub in space.spaces.items()))
    if isinstance(space, gym.spaces.Tuple):
        return ("Tuple", tuple(space_kind(sub) for sub in space.spaces))
    if isinstance(space, gym.spaces.Discrete):
        return ("Discrete", int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return ("MultiDiscrete", tuple(int(n) for n in space.nvec.ravel()), space.nvec.shape)
    return (type(space).__name__, space.shape, str(space.dtype))


def registered_as(env: str, env_kwargs: dict[str, Any] | None, ids: Any) -> str | None:
    """The id among ``ids`` registered as the env that ``env`` with ``env_kwargs`` makes: the same entry point,
    constructor kwargs and time limit (``LunarLander-v3`` with ``continuous=True`` is ``LunarLanderContinuous-v3``);
    ``render_mode`` is left out (it changes how an env shows itself, not its task). None where there is none."""
    if not env_kwargs or not isinstance(env, str):
        return None
    import gymnasium as gym

    try:
        base = gym.spec(env)
    except Exception:  # noqa: BLE001 - not a registered id (a factory path, an env missing here)
        return None
    made = {k: v for k, v in env_kwargs.items() if k not in ("render_mode", "max_episode_steps")}
    steps = env_kwargs.get("max_episode_steps", base.max_episode_steps)
    for other in ids:
        try:
            spec = gym.spec(other) if other != env else None
        except Exception:  # noqa: BLE001 - a preset keyed by a factory path
            continue
        if (spec is not None and spec.entry_point == base.entry_point and spec.kwargs == {**base.kwargs, **made}
                and spec.max_episode_steps == steps):
            return str(other)
    return None


def preset_misfit(tuned_on: str, given: tuple[gym.Space, gym.Space]) -> str | None:
    """Why the preset tuned on ``tuned_on`` does not fit an env with the spaces ``given`` (observations,
    actions): they differ in the kinds or sizes of their spaces (``LunarLander-v3`` with ``continuous=True`` acts in
    a Box; CartPole under a wrapper that returns frames observes images), so the preset was tuned on another task.
    None where they agree, or where ``tuned_on`` cannot be built here (the preset then applies)."""
    from frugalrl.envs.spec import to_env_spec

    try:
        tuned = _spaces(to_env_spec(tuned_on))
    except Exception:  # noqa: BLE001 - a factory that needs its kwargs, an env missing here: nothing to compare
        return None
    if [space_kind(s) for s in tuned] == [space_kind(s) for s in given]:
        return None
    return f"it {_words(given)} there, where {tuned_on} itself {_words(tuned)}"


def _built_spaces(env: str, env_kwargs: dict[str, Any] | None, env_wrappers: list[Any] | None
                  ) -> tuple[gym.Space, gym.Space] | None:
    """The spaces of the env ``env`` with ``env_kwargs`` and ``env_wrappers`` makes; None where it cannot be built
    here (its preset then applies, and its family, if asked for, is looked up again to report the error)."""
    from frugalrl.envs.spec import to_env_spec

    try:
        return _spaces(to_env_spec(env, env_kwargs, env_wrappers))
    except Exception:  # noqa: BLE001 - a module only the workers have, a missing simulator: nothing to compare
        return None


def _spaces(spec: Any) -> tuple[gym.Space, gym.Space]:
    made = spec.make()
    try:
        return made.observation_space, made.action_space
    finally:
        made.close()


def _words(spaces: tuple[gym.Space, gym.Space]) -> str:
    """``observes Box(8,) float32 and acts in Discrete(4)``: the spaces' kinds and sizes, without their bounds."""
    import gymnasium as gym

    def kind(space: gym.Space) -> str:
        if isinstance(space, gym.spaces.Box):
            return f"Box{space.shape} {space.dtype}"
        return " ".join(str(space).split())  # a multi-dimensional space prints rows
    return f"observes {kind(spaces[0])} and acts in {kind(spaces[1])}"


def resolve(algo: str, env: str, preset: str | None = AUTO, env_kwargs: dict[str, Any] | None = None,
            env_wrappers: list[Any] | None = None, note: Callable[[str], object] | None = None
            ) -> tuple[dict[str, Any], str | None]:
    """The field values ``preset`` gives ``algo`` on ``env``, and its name (None: no preset applies).

    ``preset``: ``"auto"`` (``env``'s own if any, else its family's if the algorithm has one, named ``family:NAME``: ``env`` is built once
    with ``env_kwargs`` and ``env_wrappers`` to read its spaces), ``"none"``, an env id of the algorithm's file, ``family:NAME``, or a
    ``.json`` file (its fields, or the entry for ``env`` in a mapping env -> fields). With ``"auto"``, an id whose
    ``env_kwargs`` make another registered env with a preset gets that one (:func:`registered_as`), and the preset is
    left for the family's where ``env_kwargs`` or ``env_wrappers`` change the spaces it was tuned on
    (:func:`preset_misfit`); ``note`` hears either. ``ValueError`` names an unknown preset.
    """
    if preset is None or preset.lower() in (NONE, "null", ""):
        return {}, None
    table, fallbacks = presets(algo), families(algo)
    if preset == AUTO:
        own = registered_as(env, env_kwargs, table) or (env if env in table else None)
        # the spaces of the env asked for, built once, where its kwargs or wrappers may change them
        given = (_built_spaces(env, env_kwargs, env_wrappers)
                 if own is not None and (own != env or env_kwargs or env_wrappers) else None)
        misfit = preset_misfit(own, given) if own is not None and given is not None else None
        if own is not None and misfit is None:
            if own != env and note is not None:
                note(f"{env} with these env kwargs is {own}: its {algo} preset applies")
            return _fields(table[own]), own
        if misfit is not None and note is not None:
            note(f"{own}'s {algo} preset does not fit the env the env kwargs and wrappers make: {misfit} (--preset "
                 f"{own} applies it anyway)")
        family = (None if not fallbacks else family_of(*given) if given is not None
                  else env_family(env, env_kwargs, env_wrappers))
        if family not in fallbacks:  # an algorithm may have fallbacks for some families only
            return {}, None
        preset = FAMILY + family
    if preset in table:
        return _fields(table[preset]), preset
    if preset.startswith(FAMILY) and preset.removeprefix(FAMILY) in fallbacks:
        return _fields(fallbacks[preset.removeprefix(FAMILY)]), preset
    path = Path(preset)
    if path.suffix == ".json" and path.is_file():
        data = json.loads(path.read_text())
        if isinstance(data, dict) and env in data and isinstance(data[env], dict):
            data = data[env]
        if not isinstance(data, dict):
            raise ValueError(f"preset file {path} must hold a JSON object of config fields")
        return _fields(data), str(path)
    known = ", ".join([*sorted(table), *(FAMILY + f for f in fallbacks)]) or "none"
    raise ValueError(f"unknown {algo} preset {preset!r}: give an env id with a preset ({known}), a .json file, "
                     "'auto' or 'none'")


def _fields(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not k.startswith("_")}


def label(name: str) -> str:
    """How a preset's name reads as the source of a value: ``preset CartPole-v1``, ``family continuous``."""
    return f"family {name.removeprefix(FAMILY)}" if name.startswith(FAMILY) else f"preset {name}"


def overview(algo: str) -> str:
    """One sentence for ``--help``: which presets and families set ``algo``'s defaults ('' if none)."""
    table, fallbacks = presets(algo), families(algo)
    if not table:
        return ""
    text = f"Defaults come from the env's preset if it has one ({', '.join(table)})"
    if fallbacks:
        text += (f", else from its family's ({', '.join(fallbacks)}, by its spaces: image frames, small grids, "
                 "else Box actions, else discrete)")
    return text + ", else from the dataclass; flags override them, --preset none skips them."


def build(cls: type, values: dict[str, Any], name: str | None, given: dict[str, Any],
          given_as: str = "command line") -> Any:
    """Config ``cls`` from a preset's ``values`` (its ``name``), then the fields ``given`` (they win).

    Its ``sources`` say where each value that differs from the dataclass's default came from: the preset's
    :func:`label`, or ``given_as``.
    """
    from frugalrl.config import config_from_dict

    data = {**values, **given, "preset": name}
    cfg = config_from_dict(cls, data, where="config" if name in (None, NONE) else label(name))
    origin = {**{k: label(name) for k in values if name is not None}, **{k: given_as for k in given}}
    cfg.sources = {name: origin[name] for name in _set_fields(cfg) if name in origin}
    return cfg


def _set_fields(cfg: Any) -> list[str]:
    """The fields of config ``cfg`` whose value differs from the dataclass's default (``preset`` and ``sources``
    aside)."""
    return [f.name for f in dataclasses.fields(cfg)
            if f.name not in ("preset", "sources") and getattr(cfg, f.name) != _default(f)]


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def describe(cfg: Any) -> str:
    """The compact block a run prints at its start: each value that differs from the dataclass's default, by
    source (``cfg.sources``), and the preset applied even where it changes none."""
    by_source: dict[str, list[str]] = {}
    if cfg.preset not in (None, NONE):
        by_source[label(cfg.preset)] = []
    for key, source in cfg.sources.items():
        by_source.setdefault(source, []).append(f"{key}={json.dumps(getattr(cfg, key))}")
    lines = [f"  {source}: {' '.join(items) or '(no value other than the defaults)'}" for source, items in by_source.items()]
    return "\n".join([f"settings: {type(cfg).__name__}'s defaults, except", *lines] if lines else
                     [f"settings: {type(cfg).__name__}'s defaults"])


ATARI_FACTORY = "frugalrl.envs.atari:make_atari"


def atari_frames(env: Any, env_kwargs_given: bool) -> tuple[str, dict[str, Any]] | None:
    """What ``frugalrl train`` and :func:`make_config` run for an ``ALE/...`` or ``<Game>NoFrameskip-v4`` id given
    without env kwargs: the preprocessed frames the Nature-CNN and the image family take (rl-zoo's way with Atari
    ids); None for any other env."""
    if not isinstance(env, str) or env_kwargs_given:
        return None
    game = env.removeprefix("ale_py:")
    if not (game.startswith("ALE/") or game.endswith("NoFrameskip-v4")):  # the ids without a frame skip of their own
        return None
    return ATARI_FACTORY, {"env_id": game}


def make_config(algo: str, env: str, preset: str | None = AUTO, **overrides: Any) -> Any:
    """``algo``'s config for ``env``: the preset's values (or the family's), then ``overrides`` (the Python
    ``--preset``); its ``sources`` say which set each value. The same path as ``frugalrl train`` (:func:`configure`),
    its notes logged."""
    from frugalrl.algos import algorithm

    _, cls = algorithm(algo).load()
    return configure(algo, cls, {**overrides, "env": env}, preset, given_as="argument", note=log.info)


def configure(algo: str, cls: type, given: dict[str, Any], preset: str | None = AUTO,
              given_as: str = "command line", note: Callable[[str], object] | None = None,
              strict: bool = False) -> Any:
    """Config ``cls`` of ``algo`` from the preset ``preset`` names (the env's own by default, else its family's),
    then the fields ``given``; ``note`` hears what a user should know (an Atari id preprocessed, no preset for the
    env, an env that cannot be built here to choose its family). An Atari id without ``env_kwargs`` becomes
    :func:`atari_frames`' factory, as rl-zoo does. With ``strict``, an env that cannot be built raises."""
    note = note or (lambda _: None)
    given = dict(given)
    env = given.get("env", next(f.default for f in dataclasses.fields(cls) if f.name == "env"))
    atari = atari_frames(env, "env_kwargs" in given)
    if atari is not None:
        note(f"{env} with the standard Atari preprocessing ({ATARI_FACTORY}: 4 stacked 84×84 grayscale frames, "
             f"frame skip 4); --env-kwargs '{{}}' keeps the raw frames")
        env, given["env_kwargs"] = atari
        given["env"] = env
    try:
        values, name = resolve(algo, env, preset, given.get("env_kwargs"), given.get("env_wrappers"), note)
    except Exception as e:  # auto only (unless ``strict``): the run itself reports an env it cannot build
        if preset != AUTO or strict:
            raise
        note(f"cannot build {env} here to choose its family ({e}); using the defaults of {cls.__name__}")
        return build(cls, {}, None, given, given_as)
    if preset == AUTO and (name is None or name.startswith(FAMILY)):
        fallback = f"the {label(name)} fallback" if name else f"the defaults of {cls.__name__}"
        none = f"no {algo} preset for {env}" if env not in presets(algo) else f"not {env}'s preset"
        note(f"{none}; using {fallback} and the values given")
    if name is None and preset != AUTO:
        name = NONE  # recorded: the defaults were asked for (:func:`hand_built_note` stays silent)
    cfg = build(cls, values, name, given, given_as)
    keep_batch(cfg, values, given, note, label(name) if name not in (None, NONE) else f"{cls.__name__}'s defaults")
    return cfg


def hand_built_note(algo: str, cfg: Any) -> str | None:
    """What ``frugalrl train`` would have set differently for a config built as a dataclass (no preset applied,
    no value recorded in ``sources``): the env's preset or family fallback for each field left at its default, and
    the Atari preprocessing; one line for the run to log, or None where it would set the same or cannot tell (an
    env that cannot be built here)."""
    if cfg.preset is not None or cfg.sources or not isinstance(cfg.env, str):  # a callable: no command line runs it
        return None
    try:
        cli = configure(algo, type(cfg), {name: getattr(cfg, name) for name in _set_fields(cfg)}, strict=True)
    except Exception:  # the run reports an env it cannot build (nor can this tell its family), or a bad value
        return None
    what = [f"{k}={json.dumps(getattr(cli, k))}" for k, source in cli.sources.items() if source != "command line"]
    if cli.env != cfg.env:
        what.insert(0, "the standard Atari preprocessing")
    if not what:
        return None
    source = f"its {label(cli.preset)}" if cli.preset is not None else "no preset"
    return (f"{type(cfg).__name__} was built directly, so it keeps the dataclass's defaults where `frugalrl train "
            f"{algo} --env {cfg.env}` would start from {source}: {' '.join(what)}; "
            f"frugalrl.presets.make_config({algo!r}, {cfg.env!r}, ...) builds what the command line builds "
            f"(preset='none' says the defaults are meant)")
