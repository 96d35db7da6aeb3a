"""Config parts every algorithm is composed of, written once.

An algorithm's config is a dataclass that inherits the parts it needs and adds its own fields::

    @dataclass(kw_only=True)
    class PPOConfig(PPOLossConfig, ClusterConfig, RunConfig):   # frugalrl.algos.ppo
        num_steps: int = 128
        ...

so that its fields stay flat (``cfg.seed``, ``cfg.workers``, ``--envs-per-worker`` on the command line),
each shared field is declared and documented once, here, and ``config.json`` records them all. A part
that needs another default for one algorithm redeclares only the default (``learning_rate: float = 6e-4``);
its docstring is found along the MRO (:func:`field_docs`).

Validation is cooperative: every part's ``validate()`` calls ``super().validate()`` and checks its own
fields; :class:`ConfigPart` checks every ``Literal``-typed field against its allowed values, so option
strings are validated in one place with one message.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from frugalrl.sync import SyncRule, lag_guard, make_sync_rule
from frugalrl.wire.uplink import Behaviour, ObsCodec, Uplink, UplinkOptions

Backend = Literal["serial", "local", "ray"]
"""Where ClusterEnv's workers run: in this process, in local processes, or in Ray actors."""
SyncName = Literal["every", "interval", "aaps"]
"""Weight-sync rules by their command-line name (see :func:`frugalrl.sync.make_sync_rule`)."""
Net = Literal["auto", "mlp", "cnn"]
"""The actor-critic network (see :attr:`NetConfig.net` and :func:`frugalrl.nets.make_agent`)."""
WeightsCodec = Literal["fp32", "bf16", "fp16", "int8"]
"""How weights travel to the workers (see :mod:`frugalrl.wire.codecs`)."""
EnvErrorRule = Literal["raise", "restart"]
"""What an env that raises does to a run (:mod:`frugalrl.envs.restarts`)."""


RECORDED = {"flag": False}
"""Metadata of a config field that a run records but the command line does not set (:func:`is_flag`)."""


def is_flag(f: dataclasses.Field) -> bool:
    """Whether config field ``f`` is a command-line flag: every field is, but the ones marked :data:`RECORDED`."""
    return bool(f.metadata.get("flag", True))


class ConfigPart:
    """Base of every config part: the end of the cooperative ``validate()`` chain."""

    renamed: ClassVar[dict[str, str]] = {}
    """Old field names and their new ones: an old ``config.json`` or preset still loads (:func:`config_from_dict`)."""

    def validate(self) -> None:
        """Check every ``Literal`` field; subclasses add their checks and call ``super().validate()``."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            allowed = literal_choices(hints[f.name])
            value = getattr(self, f.name)
            if allowed is not None and value not in allowed and not (value is None and _optional(hints[f.name])):
                doc = field_docs(type(self)).get(f.name, "").split("\n")[0]
                raise ValueError(f"{type(self).__name__}.{f.name} must be one of {allowed!r}, got {value!r}"
                                 + (f" ({doc})" if doc else ""))


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation (also inside ``Optional``), else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if typing.get_origin(arg) is Literal:
                return typing.get_args(arg)
    return None


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def check_fields(
    cfg: Any,
    positive_ints: tuple[str, ...] = (),
    positive: tuple[str, ...] = (),
    nonneg: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
) -> None:
    """Raise ``ValueError`` naming the first field of ``cfg`` outside its range.

    ``positive_ints``: integers ≥ 1; ``positive``: finite numbers > 0; ``nonneg``: numbers ≥ 0;
    ``unit``: numbers in [0, 1]. A field set to None is skipped (optional fields are optional).
    """
    for name in positive_ints:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for names, ok, what in (
        (positive, lambda v: math.isfinite(v) and v > 0, "> 0"),
        (nonneg, lambda v: v >= 0, ">= 0"),
        (unit, lambda v: 0 <= v <= 1, "in [0, 1]"),
    ):
        for name in names:
            value = getattr(cfg, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
                raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclass(kw_only=True)
class RunConfig(ConfigPart):
    """What every training run has: the env, the seed, the budget, evaluation, checkpoints and output."""

    env: str = "CartPole-v1"
    """Gymnasium id or 'module:function' env factory."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env (JSON on the command line)."""
    env_wrappers: list[str | dict[str, dict[str, Any]]] = field(default_factory=list)
    """Wrappers around each env, innermost first, as rl-zoo's env_wrapper: 'module:Class' (or 'module.Class'),
    or {"module:Class": {keyword arguments}}; on the command line, names separated by commas, one such JSON object,
    or a JSON list."""
    preset: str | None = None
    """The preset the settings start from (frugalrl.presets): on the command line the env's own by default (else
    its family's: 'family:continuous', 'family:discrete', 'family:image' or 'family:grid', by the env's spaces,
    where the algorithm has families), 'none', another env id, a family, or a .json file; here, the one that was
    applied ('none': the defaults, asked for; None: no preset applies, or the config was built directly)."""
    sources: dict[str, str] = field(default_factory=dict, metadata=RECORDED)
    """Where each value that differs from the dataclass's default came from ('preset NAME', 'family FAMILY',
    'command line'...): what frugalrl.presets.build recorded, kept in config.json; not a flag."""
    seed: int = 1
    """Seed of the network, the envs, action sampling and minibatch order."""
    total_timesteps: int = 500_000
    """Env steps of the whole run."""
    eval_episodes: int = 10
    """Episodes of each evaluation (deterministic actions, fresh envs in the training process)."""
    eval_every: int = 0
    """Evaluate every this many updates (0: only at the end)."""
    eval_max_steps: int = 10_000
    """Steps after which an evaluation episode that has not ended is cut and its return so far counted (the run
    says so): an env without a time limit of its own would otherwise play a policy that never reaches an end
    forever. Gymnasium's time limits (500 steps on CartPole, 1,000 on MuJoCo) end episodes before it."""
    eval_stochastic: bool = True
    """Each evaluation also plays eval_episodes episodes sampling actions (as the workers act), so that every
    entry of the evaluation history has a deterministic and a stochastic return beside the training return."""
    target_return: float | None = None
    """Stop early once an evaluation's mean return reaches this."""
    checkpoint_every: int = 0
    """Write a checkpoint (that ``--resume`` continues from) every this many updates (0: by time only)."""
    checkpoint_every_s: float | None = 600.0
    """Write a checkpoint after the first update that starts this many seconds of training after the last one,
    and after every evaluation that is the run's best so far (None: only checkpoint_every and the end)."""
    run_dir: str = "runs"
    """Directory that holds the run directories."""
    run_name: str | None = None
    """Name of this run's directory (default: algorithm, env, seed and time); one that holds a run is refused."""
    torch_threads: int = 1
    """Threads torch may use in the training process."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events into the run directory."""
    log_every_s: float = 0.0
    """Write an update's metrics row (metrics.jsonl, TensorBoard) once this many seconds of training passed since
    the last one written, and always with an evaluation, an event (a fault, a stall), a checkpoint and at the end;
    its training return and length are then those of every episode since that row (0: a row for every update,
    exact for plots such as AAPS's KL at each sync). Bounds a fast, long run's files: a run at 0 that writes over
    100 MB an hour is told so. HSA2C evaluates at every row it logs (its eval_every): this changes nothing there."""
    plots: bool = True
    """Draw PNG plots into the run directory at the end."""

    def validate(self) -> None:
        """Check the run fields."""
        super().validate()
        check_fields(self, positive_ints=("total_timesteps", "torch_threads", "eval_max_steps"),
                     nonneg=("eval_episodes", "eval_every", "checkpoint_every", "log_every_s"))
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a dict, got {type(self.env_kwargs).__name__}")
        if not isinstance(self.env_wrappers, list) or not all(
                isinstance(w, str) or (isinstance(w, dict) and len(w) == 1) for w in self.env_wrappers):
            raise ValueError("env_wrappers must be a list of 'module:Class' names or {'module:Class': "
                             f"{{keyword arguments}}}} entries, got {self.env_wrappers!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        check_fields(self, positive=("checkpoint_every_s",))
        if not math.isfinite(self.log_every_s):
            raise ValueError(f"log_every_s must be a finite number of seconds >= 0, got {self.log_every_s!r}")
        if self.target_return is not None and not math.isfinite(self.target_return):
            raise ValueError(f"target_return must be a finite number or None, got {self.target_return!r}")

    def evaluates_after(self, update: int, total_updates: int) -> bool:
        """Whether the run evaluates after ``update`` (1-based): every ``eval_every`` updates and after the last.
        The one evaluation schedule: the driver and both pipeline stages read it."""
        if not self.eval_episodes:
            return False
        return (bool(self.eval_every) and update % self.eval_every == 0) or update >= total_updates

    def checkpoints_after(self, update: int) -> bool:
        """Whether the run writes a checkpoint after ``update`` (every ``checkpoint_every`` updates)."""
        return bool(self.checkpoint_every) and update % self.checkpoint_every == 0


@dataclass(kw_only=True)
class ClusterConfig(ConfigPart):
    """Where experience comes from: a ClusterEnv's workers, and when they receive weights."""

    backend: Backend = "local"
    """Where the env workers run: 'local' (processes), 'serial' (in this process) or 'ray' (Ray actors)."""
    ray_address: str | None = None
    """backend 'ray': the Ray cluster to join ('auto' or 'host:port'); None starts a private Ray."""
    workers: int = 2
    """Env worker processes (or actors)."""
    envs_per_worker: int = 4
    """Environments stepped by each worker."""
    num_steps: int = 128
    """Steps per env per rollout fragment (an update learns from workers × envs_per_worker × num_steps). Where
    workers or envs_per_worker are given without it, the preset or family sets it to keep the batch it was tuned
    with (frugalrl.batching.keep_batch)."""
    sync: SyncName = "aaps"
    """Weight-sync rule: 'aaps' (when KL(worker policy ‖ learner) on the worker's recent states exceeds
    kl_threshold, with the max_policy_lag guard), 'every' (each update) or 'interval' (every sync_interval
    updates). AAPS is the default because it learned as well as 'every' on every env of the learning suite
    (docs/benchmarks.md#frugal-defaults)."""
    kl_threshold: float = 0.05
    """δ of AAPS."""
    max_policy_lag: int | None = 20
    """AAPS's guard: a worker whose policy is this many learner updates old gets the weights whatever the KL
    (its KL is measured on states its own stale policy visits, and can stay under δ while the learner has
    moved on); None: KL only."""
    max_policy_lag_fraction: float | None = 0.25
    """The guard is also at most this share of the run's updates (rounded down, at least 1 update), so that a run
    of a few large updates still refreshes its workers: in a 5-update run no worker acts with a policy more than
    one update old; from 80 updates on, max_policy_lag alone applies. None: max_policy_lag alone."""
    sync_interval: int = 1
    """n of the 'interval' rule."""
    weights_codec: WeightsCodec = "bf16"
    """How weights travel to the workers: bf16 (the default: half of fp32's bytes, and the workers act with the
    rounded weights, whose log-probabilities the losses correct for), fp32, fp16 or int8 (a symmetric scale per
    tensor, on the wire only: the workers act with the decoded float weights)."""
    weights_delta: bool = True
    """A worker that holds an older copy of the weights is sent only what changed (the XOR or the difference of
    the codec's words with its copy, compressed, or the changed words alone), when that is smaller than a full
    copy; exact: it ends with the very weights a full copy gives. False: a full copy every sync."""
    uplink: Uplink = "auto"
    """How experience is compressed on its way from the workers (lossless: the learner gets the very same
    arrays): 'auto' (byte-plane shuffle + zstd, stacked image frames sent one new frame per step, each stream
    only while its measured CPU cost is under the link time it saves at uplink_link_mbps), 'lz4' or 'zstd'
    (always) or 'none' (raw bytes). Arrays under 1 KiB (per-step replies) are not compressed; small boolean
    ones are still bit-packed."""
    uplink_obs: ObsCodec = "fp32"
    """Float observations on the uplink: 'fp32' (float64 ones, MuJoCo's, become float32 on the worker before its
    policy acts on them: the learner trains on what the policy saw, in half the bytes), 'exact' (the env's dtype),
    or lossy 'fp16', 'bf16', 'int8', 'int16' (int: an affine code per feature and message, not the weights' int8;
    error at most half a step of range / (2^bits − 1)). Lossy codes change what the learner trains on; the
    workers still act on the float32 observations."""
    uplink_behaviour: Behaviour = "recompute"
    """What the workers send about their policy per step: nothing ('recompute': the head recomputes the taken
    action's log-probability from the copy of the weights the worker holds), 'logprob' (that log-probability: all
    the losses and AAPS's KL estimate need) or 'params' (the full distribution parameters)."""
    uplink_link_mbps: float = 100.0
    """The link rate (Mbit/s) uplink 'auto' weighs each codec's CPU time against."""
    crash_loop_tries: int = 8
    """A worker that dies again before completing a request is replaced this many times in a row (after back-offs
    of 0, 0.25, 0.5, ... up to 4 s), then the run stops with its checkpoint; one that dies after useful work is
    always replaced."""
    on_env_error: EnvErrorRule = "raise"
    """An env that raises in reset() or step(), or returns a NaN: 'raise' stops the run with its checkpoint and
    the error; 'restart' replaces its worker as a dead one is (its envs start new episodes, a rollout is collected
    again), under the same crash-loop rule, and the summary counts it (an evaluation plays the episode again)."""
    inline_workers: int | None = None
    """Local backend: how many workers run in the learner's process (stepped while the other workers step theirs;
    their envs share its fate: no isolation or timeout; they move to processes once the learner has grown by
    worker_memory_mb). None: as many as keep the worker processes fewer than the cores; 0: every worker in a
    process of its own."""
    worker_memory_mb: float | None = 2048.0
    """A worker process over this resident memory (MB) is replaced between two rollouts (or steps), its envs starting
    new episodes, so that an env that leaks cannot take a long run down (local backend; inline workers move to
    processes once the learner has grown by this much; None: never)."""

    if typing.TYPE_CHECKING:  # RunConfig's, which every config with a ClusterConfig also has
        total_timesteps: int

    def uplink_options(self) -> UplinkOptions:
        """The uplink fields as the options the workers take (checked)."""
        return UplinkOptions(self.uplink, self.uplink_obs, self.uplink_behaviour, self.uplink_link_mbps)

    def validate(self) -> None:
        """Check the cluster fields."""
        super().validate()
        check_fields(self, positive_ints=("workers", "envs_per_worker", "num_steps", "sync_interval", "crash_loop_tries"),
                     positive=("kl_threshold", "worker_memory_mb"))
        if self.max_policy_lag is not None:
            check_fields(self, positive_ints=("max_policy_lag",))
        check_fields(self, positive=("max_policy_lag_fraction",), unit=("max_policy_lag_fraction",))
        self.sync_rule()
        self.uplink_options()
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"ray_address must be a non-empty string or None, got {self.ray_address!r}")

    @property
    def num_envs(self) -> int:
        """Environments in all."""
        return self.workers * self.envs_per_worker

    @property
    def batch_size(self) -> int:
        """Transitions per update."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run (at least one)."""
        return max(1, self.total_timesteps // self.batch_size)

    def sync_rule(self) -> SyncRule:
        """The weight-sync rule these fields describe."""
        guard = lag_guard(self.max_policy_lag, self.max_policy_lag_fraction, self.num_updates)
        return make_sync_rule(self.sync, self.kl_threshold, self.sync_interval, guard)


@dataclass(kw_only=True)
class ActorCriticConfig(ConfigPart):
    """The actor-critic loss every actor-critic algorithm has: discount, entropy and value weights, clipping."""

    gamma: float = 0.99
    """Discount factor."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss, ``½ (R − V)²`` (CleanRL's; SB3's is ``(R − V)²``, so SB3's 0.5 is 1 here)."""
    max_grad_norm: float = 0.5
    """Gradient norm clip (0: none)."""

    def validate(self) -> None:
        """Check the loss weights."""
        super().validate()
        check_fields(self, nonneg=("ent_coef", "vf_coef", "max_grad_norm"), unit=("gamma",))


@dataclass(kw_only=True)
class OptimConfig(ActorCriticConfig):
    """The learner's Adam optimiser (PPO, IMPALA, pipeline PPO), on top of the actor-critic loss."""

    learning_rate: float = 2.5e-4
    """Adam step size."""
    anneal_lr: bool = True
    """Anneal the step size linearly to 0 over the run."""

    def validate(self) -> None:
        """Check the optimisation fields."""
        super().validate()
        check_fields(self, positive=("learning_rate",))

    def lr_at(self, update: int, num_updates: int) -> float:
        """The step size of update ``update`` (1-based) of ``num_updates``."""
        if not self.anneal_lr:
            return self.learning_rate
        return (1.0 - (update - 1.0) / num_updates) * self.learning_rate


@dataclass(kw_only=True)
class NetConfig(ConfigPart):
    """The actor-critic network: an MLP for flat observations, a CNN for images (``net``)."""

    net: Net = "auto"
    """'auto': the Nature-CNN for uint8 frames ((C, H, W) as Atari's preprocessing stacks them, or (H, W, C) as
    CarRacing renders them; Discrete or Box actions), the MinAtar paper's CNN for small (H, W, C)
    grids (MinAtar), an MLP otherwise; 'mlp': an MLP on the flattened observation; 'cnn': a CNN (an error for
    observations that are not images)."""

    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden widths of the actor's and the critic's MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the hidden layers."""
    log_std_init: float | None = None
    """Initial log standard deviation of a Gaussian policy (Box actions); None: 0, or −2 with state-dependent
    exploration (HSA2C's ``sde``: the log-std of each entry of its noise matrix, in half-widths of the action box;
    rl-zoo's gSDE entries use −2 to 0)."""
    ortho_init: bool = True
    """Orthogonal initialisation (CleanRL, SB3); False: PyTorch's default."""

    def validate(self) -> None:
        """Check the network fields."""
        super().validate()
        if not self.hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.hidden):
            raise ValueError(f"hidden must list positive widths, got {self.hidden!r}")

    def mlp_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~frugalrl.nets.MLPActorCritic`."""
        return {"activation": self.activation, "log_std_init": self.log_std_init, "ortho_init": self.ortho_init}

    def agent_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~frugalrl.nets.make_agent`: ``hidden``, ``net`` and the MLP's options."""
        return {"hidden": tuple(self.hidden), "net": self.net, **self.mlp_options()}


@dataclass(kw_only=True)
class NormConfig(ConfigPart):
    """Running normalisation of observations (inside the agent) and rewards (on the learner)."""

    norm_obs: bool | None = None
    """Normalise observations by running mean and variance inside the agent (the statistics travel with the
    weights); None: on for continuous (Box) actions, off for discrete ones."""
    norm_reward: bool | None = None
    """Divide rewards by the running standard deviation of the discounted return (learner side); None: as
    norm_obs resolves."""

    def normalization(self, continuous_actions: bool) -> tuple[bool, bool]:
        """``(norm_obs, norm_reward)`` as used for an env with (or without) continuous actions."""
        obs = continuous_actions if self.norm_obs is None else bool(self.norm_obs)
        reward = obs if self.norm_reward is None else bool(self.norm_reward)
        return obs, reward


@dataclass(kw_only=True)
class ValueNormConfig(ConfigPart):
    """The critic's scale without changing the rewards (the learners that fit a critic to returns: PPO, IMPALA)."""

    norm_value: bool = False
    """Fit the critic to returns standardised by their running mean and std (learner side), the rewards left
    as the env gives them: the critic's scale without norm_reward's change of the rewards."""


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal right after a field) of ``cls`` and its bases.

    The class that declares a field's docstring wins over bases; a subclass that only redeclares a
    default keeps the base's docstring.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def config_from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build config ``cls`` from a JSON dict (``config.json``): renamed fields are read under their old names too,
    unknown keys are an error naming them."""
    names = {f.name for f in dataclasses.fields(cls)}
    for old, new in getattr(cls, "renamed", {}).items():
        if old in data:
            data = {**{k: v for k, v in data.items() if k != old}, new: data.get(new, data[old])}
    unknown = sorted(k for k in data if k not in names and k != "algo" and not k.startswith("_"))
    if unknown:
        raise ValueError(f"{where} has fields {cls.__name__} does not know: {', '.join(unknown)}")
    values = {k: v for k, v in data.items() if k in names}
    hints = typing.get_type_hints(cls)
    for k, v in values.items():  # JSON has no tuples
        options = typing.get_args(hints[k]) if typing.get_origin(hints[k]) in (typing.Union, types.UnionType) else ()
        if isinstance(v, list) and any(typing.get_origin(t) is tuple for t in (hints[k], *options)):
            values[k] = tuple(v)
    return cls(**values)
