"""Values of any Gymnasium space as message arrays and JSON, and their batches as Gymnasium's vector envs make them.

Box and Discrete observations and actions travel as one ``(k, ...)`` array (``obs``, ``actions``): the fast path,
and the only one worker-side inference, rollouts and checkpoints take. Any other space of Gymnasium's own
(MultiDiscrete, MultiBinary, Tuple, Dict, Graph, Text, Sequence, OneOf, nested) is walked: each fixed-shape leaf
(Box, Discrete, MultiDiscrete, MultiBinary) travels as its own ``(k, ...)`` array named by its path (``obs/1/0``:
part 1 of a Tuple, then part 0), and each value of a variable-shape leaf (Graph, Text, Sequence, OneOf) as JSON in
the message header whose arrays travel alongside (``obs/2#0``, metered as the batch's kind). In the header, a value
that repeats step after step (a mission string through an episode) costs nothing once the header is numbered
(:mod:`frugalrl.wire.headers`), and what a new value costs is metered as control. Nothing is pickled: the
receiving side rebuilds only NumPy arrays and scalars, strings, tuples, dicts and ``GraphInstance``, guided by the
space it expects. The batch (:func:`batch`) is exactly Gymnasium's ``concatenate`` of the values. A custom
``Space`` subclass travels only if it declares string values (``dtype=str``, as minigrid's ``MissionSpace``): those
go as JSON, as Text's do; any other custom space, whose values could be anything, is refused (:func:`check_space`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces as S
from gymnasium.vector.utils import batch_differing_spaces, batch_space, concatenate, create_empty_array

from frugalrl.action_heads import action_desc
from frugalrl.wire.message import Message, WireError

if TYPE_CHECKING:
    from frugalrl.envs.spec import EnvSpec

FIXED = (S.Box, S.Discrete, S.MultiDiscrete, S.MultiBinary)
"""Leaves whose values have one shape and dtype: a batch of them is one array."""
VARIABLE = (S.Graph, S.Text, S.Sequence, S.OneOf)
"""Leaves whose values vary in shape: a batch of them is a tuple of values (as Gymnasium batches them)."""


def is_simple(space: gym.Space) -> bool:
    """Box or Discrete: one ``(k, ...)`` array, the fast path (worker-side inference takes only these)."""
    return isinstance(space, S.Box | S.Discrete)


def agents_act_in(space: gym.Space) -> bool:
    """Whether frugalrl's agents act in the action space ``space``: those :func:`frugalrl.action_heads.action_desc`
    describes (Box, Discrete, and MultiDiscrete and MultiBinary of one dimension)."""
    try:
        action_desc(space)
    except TypeError:
        return False
    return True


def check_inference(obs_space: gym.Space, act_space: gym.Space,
                    what: str = "worker-side inference (step(agent), rollout)") -> None:
    """``TypeError`` unless observations are a Box and agents act in the action space (:func:`agents_act_in`)."""
    if not (isinstance(obs_space, S.Box) and agents_act_in(act_space)):
        hint = ("; wrap the env into Box observations (env_wrappers, --env-wrappers: e.g. minigrid.wrappers."
                "ImgObsWrapper, gymnasium.wrappers.FlattenObservation)") if isinstance(obs_space, S.Dict | S.Tuple) else ""
        if not agents_act_in(act_space):
            hint += ("; frugalrl's agents act in Box, Discrete, MultiDiscrete (of one dimension) and "
                     "MultiBinary (of one dimension) action spaces: step(actions) with a policy of your own takes any")
        one_line = " ".join(f"not {obs_space} and {act_space}".split())  # a multi-dimensional nvec prints rows
        raise TypeError(f"{what} needs Box observations and an action space frugalrl's agents act in, {one_line}{hint}")


def check_space(space: gym.Space, what: str) -> None:
    """``ValueError`` for a space with a part that is not one of Gymnasium's own (its values cannot travel as
    data without pickling them)."""
    if isinstance(space, S.Tuple | S.OneOf):
        for sub in space.spaces:
            check_space(sub, what)
    elif isinstance(space, S.Dict):
        for sub in space.spaces.values():
            check_space(sub, what)
    elif isinstance(space, S.Sequence):
        check_space(space.feature_space, what)
    elif isinstance(space, S.Graph):
        for part in (space.node_space, space.edge_space):
            if part is not None:
                check_space(part, what)
    elif not isinstance(space, FIXED + (S.Text,)) and not holds_strings(space):
        raise ValueError(f"ClusterEnv cannot carry the {what} space {space} ({type(space).__name__}): only "
                         "Gymnasium's own spaces and custom spaces of strings (dtype=str) travel, as arrays and JSON "
                         "(other custom values would need pickle)")


def holds_strings(space: gym.Space) -> bool:
    """A space that declares its values strings (``Space(dtype=str)``, e.g. minigrid's ``MissionSpace``)."""
    return space.dtype is not None and space.dtype.kind == "U"


# ---------------------------------------------------------------------------------------------- batches
def batch(space: gym.Space, values: list[Any]) -> Any:
    """The batch of ``values`` (Gymnasium's ``concatenate``): arrays for fixed leaves, tuples for variable ones."""
    return concatenate(space, values, create_empty_array(space, len(values)))  # type: ignore[arg-type]


def item(space: gym.Space, tree: Any, i: int) -> Any:
    """Value ``i`` of a batch (what Gymnasium's ``iterate`` yields)."""
    if isinstance(space, S.Tuple):
        return tuple(item(sub, tree[j], i) for j, sub in enumerate(space.spaces))
    if isinstance(space, S.Dict):
        return {key: item(sub, tree[key], i) for key, sub in space.spaces.items()}
    return tree[i]


def take(space: gym.Space, tree: Any, start: int, stop: int) -> Any:
    """Values ``start .. stop - 1`` of a batch, as a batch."""
    if isinstance(space, S.Tuple):
        return tuple(take(sub, tree[j], start, stop) for j, sub in enumerate(space.spaces))
    if isinstance(space, S.Dict):
        return {key: take(sub, tree[key], start, stop) for key, sub in space.spaces.items()}
    return tree[start:stop]


def join(space: gym.Space, trees: list[Any]) -> Any:
    """Batches one after the other, as one batch."""
    if isinstance(space, S.Tuple):
        return tuple(join(sub, [t[j] for t in trees]) for j, sub in enumerate(space.spaces))
    if isinstance(space, S.Dict):
        return {key: join(sub, [t[key] for t in trees]) for key, sub in space.spaces.items()}
    if isinstance(space, FIXED):
        return np.concatenate(trees)
    return tuple(v for t in trees for v in t)


def batch_size(space: gym.Space, tree: Any) -> int:
    """How many values a batch holds (``TypeError`` if ``tree`` is not a batch of ``space``)."""
    if isinstance(space, S.Tuple | S.Dict):
        if isinstance(space, S.Tuple) and not (isinstance(tree, tuple | list) and len(tree) == len(space.spaces)):
            raise TypeError(f"a batch of {space} is a tuple of {len(space.spaces)} batches, got {type(tree).__name__}")
        if isinstance(space, S.Dict) and not (isinstance(tree, dict) and set(tree) == set(space.spaces)):
            raise TypeError(f"a batch of {space} is a dict with keys {list(space.spaces)}, got {type(tree).__name__}")
        keys = range(len(space.spaces)) if isinstance(space, S.Tuple) else list(space.spaces)
        subs = space.spaces if isinstance(space, S.Tuple) else list(space.spaces.values())
        sizes = {batch_size(sub, tree[key]) for key, sub in zip(keys, subs, strict=True)}
        if len(sizes) != 1:
            raise ValueError(f"the parts of a batch of {space} hold different numbers of values: {sorted(sizes)}")
        return sizes.pop()
    if isinstance(space, FIXED):
        arr = np.asarray(tree)
        if arr.ndim == 0:
            raise TypeError(f"Unable to iterate over the following elements: {tree}")
        return int(arr.shape[0])
    if not isinstance(tree, tuple | list):
        raise TypeError(f"a batch of {space} is a tuple of values, got {type(tree).__name__}")
    return len(tree)


# ---------------------------------------------------------------------------------------------- on the wire
def to_message(msg: Message, space: gym.Space, tree: Any, prefix: str, kind: str) -> None:
    """Put a batch of ``space`` into ``msg``: arrays named ``prefix`` + path, variable values in
    ``msg.meta[prefix]``, every array metered as ``kind``."""
    if is_simple(space) or isinstance(space, FIXED):
        msg.arrays[prefix] = np.asarray(tree)
        return
    meta: dict[str, Any] = {}
    _put(space, tree, prefix, msg.arrays, meta)
    msg.meta[prefix] = meta
    msg.kinds.update({name: kind for name in msg.arrays if name.startswith((prefix + "/", prefix + "#"))})


def from_message(msg: Message, space: gym.Space, prefix: str) -> Any:
    """The batch :func:`to_message` put into ``msg`` (``WireError`` for values that do not match ``space``)."""
    if is_simple(space) or isinstance(space, FIXED):
        return msg.arrays[prefix]
    try:
        return _get(space, prefix, msg.arrays, msg.meta.get(prefix, {}))
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"the {prefix!r} values of a {msg.op!r} message are corrupt: {type(e).__name__}: {e}") from e


def _put(space: gym.Space, tree: Any, path: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    if isinstance(space, S.Tuple):
        for j, sub in enumerate(space.spaces):
            _put(sub, tree[j], f"{path}/{j}", arrays, meta)
    elif isinstance(space, S.Dict):
        for j, (key, sub) in enumerate(space.spaces.items()):
            _put(sub, tree[key], f"{path}/{j}", arrays, meta)
    elif isinstance(space, FIXED):
        arrays[path] = np.ascontiguousarray(tree)
    else:
        meta[path] = [pack_value(v, path, arrays) for v in tree]


def _get(space: gym.Space, path: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
    if isinstance(space, S.Tuple):
        return tuple(_get(sub, f"{path}/{j}", arrays, meta) for j, sub in enumerate(space.spaces))
    if isinstance(space, S.Dict):
        return {key: _get(sub, f"{path}/{j}", arrays, meta) for j, (key, sub) in enumerate(space.spaces.items())}
    if isinstance(space, FIXED):
        return arrays[path]
    return tuple(unpack_value(v, arrays) for v in meta[path])


def pack_value(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON, its arrays added to ``arrays`` (``TypeError`` for anything but data)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"an array of dtype {value.dtype} in {path!r} cannot travel (numbers and booleans can)")
        name = f"{path}#{len(arrays)}"
        arrays[name] = np.ascontiguousarray(value)
        return {"a": name}
    if isinstance(value, S.GraphInstance):
        return {"g": [pack_value(part, path, arrays) for part in (value.nodes, value.edges, value.edge_links)]}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"s": [value.dtype.str, value.item()]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return {"t" if isinstance(value, tuple) else "l": [pack_value(v, path, arrays) for v in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"d": [[key, pack_value(v, path, arrays)] for key, v in value.items()]}
    raise TypeError(f"a {type(value).__name__} in {path!r} cannot travel as data (arrays, numbers, strings, tuples, "
                    "dicts and GraphInstances can)")


def unpack_value(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The value :func:`pack_value` made, rebuilt from its JSON and ``arrays`` (data only: nothing is unpickled)."""
    if not isinstance(value, dict):
        return value
    (tag, body), = value.items()
    if tag == "a":
        return arrays[body]
    if tag == "s":
        dtype = np.dtype(body[0])
        if dtype.kind not in "biuf":
            raise TypeError(f"scalar dtype {dtype} cannot travel")
        return np.array(body[1], dtype=dtype)[()]
    if tag == "g":
        return S.GraphInstance(*(unpack_value(part, arrays) for part in body))
    if tag in ("t", "l"):
        out = [unpack_value(v, arrays) for v in body]
        return tuple(out) if tag == "t" else out
    if tag == "d":
        return {key: unpack_value(v, arrays) for key, v in body}
    raise TypeError(f"unknown value tag {tag!r}")


# ---------------------------------------------------------------------------------------------- the head's batches
class Batches:
    """The head's view of one space's batches over ``num_envs`` envs, ``k`` per worker: Gymnasium's batch layout
    (one array for Box and Discrete), built from and split into the workers' messages."""

    def __init__(self, space: gym.Space, num_envs: int, k: int) -> None:
        self.space, self.num_envs, self.k = space, num_envs, k
        self.simple = is_simple(space)

    def copy(self, tree: Any) -> Any:
        """A copy the caller may change."""
        return tree.copy() if isinstance(tree, np.ndarray) else copy.deepcopy(tree)

    def update(self, current: Any, replies: dict[int, Message], prefix: str = "obs") -> Any:
        """``current`` (None: nothing yet, every worker replied) with the envs of each replying worker replaced by
        its reply's values."""
        k = self.k
        if self.simple:  # one concatenation of each worker's rows, new or kept (in the dtype kept so far)
            return np.concatenate([replies[w].arrays[prefix] if w in replies else current[w * k : (w + 1) * k]
                                   for w in range(self.num_envs // k)],
                                  dtype=None if current is None else current.dtype, casting="unsafe")
        parts = [from_message(replies[w], self.space, prefix) if w in replies
                 else take(self.space, current, w * k, (w + 1) * k) for w in range(self.num_envs // k)]
        return join(self.space, parts)

    def values(self, msg: Message, prefix: str) -> list[Any]:
        """The values of a batch a message carries, one by one."""
        tree = from_message(msg, self.space, prefix)
        if isinstance(self.space, S.Discrete):
            return tree.tolist()  # plain integers, as Discrete envs return them
        if self.simple:
            return list(tree)
        return [item(self.space, tree, i) for i in range(batch_size(self.space, tree))]

    def item(self, tree: Any, i: int) -> Any:
        """Env ``i``'s value in a batch (a copy for an array)."""
        value = item(self.space, tree, i)
        return value.copy() if isinstance(value, np.ndarray) else copy.deepcopy(value)

    def split(self, tree: Any, prefix: str, kind: str) -> dict[int, Message]:
        """A batch the learner gives (actions), one ``step`` message per worker; ``ValueError`` / ``TypeError`` as
        Gymnasium's ``iterate`` raises them for a batch of the wrong size or layout."""
        n = batch_size(self.space, tree)
        if n != self.num_envs:
            raise ValueError(f"actions hold {n} values for {self.num_envs} envs")
        out: dict[int, Message] = {}
        for w in range(self.num_envs // self.k):
            msg = Message("step")
            to_message(msg, self.space, take(self.space, tree, w * self.k, (w + 1) * self.k), prefix, kind)
            out[w] = msg
        return out


# ---------------------------------------------------------------------------------------------- the head's probe
@dataclass
class Probed:
    """What the head learns from one env built on it (AsyncVectorEnv's "dummy env") and the observation mode."""

    single_observation_space: gym.Space
    observation_space: gym.Space
    single_action_space: gym.Space
    action_space: gym.Space
    spec: Any
    metadata: dict[str, Any]
    render_mode: str | None


def probe(env_spec: EnvSpec, num_envs: int, observation_mode: Any = "same") -> Probed:
    """Build env 0 on the head for its spaces, metadata and render mode; ``observation_mode`` as AsyncVectorEnv's:
    ``"same"``, ``"different"`` (every env built once on the head for its space) or ``(batched, single)``."""
    custom = isinstance(observation_mode, tuple) and len(observation_mode) == 2
    if custom and not all(isinstance(sp, gym.Space) for sp in observation_mode):
        raise TypeError(f"Expected both elements of observation_mode to be Spaces, got {type(observation_mode[0])} "
                        f"and {type(observation_mode[1])}")
    if not custom and observation_mode not in ("same", "different"):
        raise ValueError("Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                         f"observation space, actual got {observation_mode}")
    try:
        env = env_spec.make()
    except Exception as e:
        raise ValueError(f"could not build environment {env_spec.describe()!r}: {type(e).__name__}: {e}") from e
    single, act = env.observation_space, env.action_space
    metadata, render_mode, spec = dict(env.metadata), env.render_mode, env.spec
    env.close()
    if custom:
        batched, single = observation_mode
    elif observation_mode == "different":
        spaces = [single]
        for j in range(1, num_envs):
            other = env_spec.make(j)
            spaces.append(other.observation_space)
            other.close()
        batched = batch_differing_spaces(spaces)
    else:
        batched = batch_space(single, num_envs)
    check_space(single, "observation")
    check_space(act, "action")
    return Probed(single, batched, act, batch_space(act, num_envs), spec, metadata, render_mode)


def check_worker_spaces(env: Any, observation_mode: Any) -> None:
    """AsyncVectorEnv's check that every env has the head's spaces (observation spaces: equal, or for another
    ``observation_mode`` of the same shape and dtype), made on the workers; ``RuntimeError`` if not."""
    import base64

    import cloudpickle  # type: ignore[import-untyped]

    spaces = base64.b64encode(cloudpickle.dumps((env.single_observation_space, env.single_action_space))).decode()
    same = isinstance(observation_mode, str) and observation_mode == "same"
    msg = Message("spaces", {"spaces": spaces, "same": same})

    def retry(w: int, reason: str) -> Message:
        env._restart(w, reason)
        return msg

    replies = env._request({w: msg for w in range(env.num_workers)}, on_failure=retry)
    if not all(r.meta["obs"] for r in replies.values()):
        if same:
            raise RuntimeError("ClusterEnv(..., observation_mode='same') however the sub-environments observation "
                               "spaces are not equivalent. If this is intentional, use `observation_mode='different'` "
                               "instead.")
        raise RuntimeError("ClusterEnv(..., observation_mode='different' or custom space) however the "
                           "sub-environment's observation spaces do not share a common shape and dtype.")
    if not all(r.meta["act"] for r in replies.values()):
        raise RuntimeError(f"Some environments have an action space different from `{env.single_action_space}`. In "
                           "order to batch actions, the action spaces from all environments must be equal.")


def same_spaces(envs: list[gym.Env], meta: dict[str, Any]) -> dict[str, bool]:
    """The worker's side of :func:`check_worker_spaces` (the spaces are the head's own pickle, as its env functions
    are: nothing travels that way from a worker)."""
    import base64

    import cloudpickle
    from gymnasium.spaces.utils import is_space_dtype_shape_equiv

    obs, act = cloudpickle.loads(base64.b64decode(meta["spaces"]))
    same = bool(meta["same"])
    return {"obs": all(e.observation_space == obs if same else is_space_dtype_shape_equiv(e.observation_space, obs)
                       for e in envs),
            "act": all(e.action_space == act for e in envs)}
