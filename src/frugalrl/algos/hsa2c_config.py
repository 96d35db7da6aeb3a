"""The config of an HSA2C run (:class:`HSA2CConfig`): every field is a ``frugalrl train hsa2c`` flag and a key of
``config.json``; the algorithm is :mod:`frugalrl.algos.hsa2c`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from frugalrl.config import ActorCriticConfig, NetConfig, NormConfig, RunConfig, check_fields
from frugalrl.dpsgd.config import DPSGDConfig, DPSGDOptions, UpdateCodec
from frugalrl.runs import jsonable

PROBLEM = "frugalrl.algos.hsa2c:make_a2c_problem"
"""The DPSGD problem factory every HSA2C process builds its :class:`~frugalrl.algos.hsa2c.A2CProblem` from."""


@dataclass(kw_only=True)
class HSA2CConfig(NormConfig, NetConfig, ActorCriticConfig, RunConfig, DPSGDOptions):
    """Every knob of an HSA2C run (the paper's symbols in brackets). Field names are the CLI flags.

    The DPSGD options (workers, processes, local steps, master batch, rates, stopping, codecs,
    transport) are :class:`~frugalrl.dpsgd.config.DPSGDOptions`' own, the run's (env, seed, budget,
    evaluation, checkpoints, output) :class:`~frugalrl.config.RunConfig`'s; HSA2C changes some defaults.
    Its local rate ``eta`` is an RMSProp step size with ``grad_scaling='rmsprop'``, a plain SGD one with 'none'
    (values for each: docs/benchmarks.md#hsa2c-defaults); each Hogwild process has its own ``envs_per_process``
    envs; ``local_steps=1`` with ``synchronous`` is the DDRL A3C baseline; ``eval_every`` counts global
    updates (DPSGD's ``log_every``).
    """

    renamed: ClassVar[dict[str, str]] = {"k": "num_steps"}

    local_steps: int = 10
    eta: float = 1e-3
    momentum: float = 0.0
    """Master momentum μ (``m ← μ m + Σ w``, ``v ← v + ρ m``); 0 is Alg. 1's plain step, and ``--momentum 0.5
    --rho 0.5`` the DPSGD paper's HSA2C master (why 0: docs/benchmarks.md#hsa2c-m0-lunar)."""
    eta_anneal: float = 0.5
    """Fraction of the run's global updates, at its end, over which ``eta`` falls linearly to 0 (0: constant, the
    paper's; 1: A3C's linear schedule over the whole run). The default cools the rate down over the second half, so
    that a learned policy stops drifting (why: docs/benchmarks.md#hsa2c-anneal50-vs-a3c-lunar)."""
    average: float = 0.05
    """Polyak averaging over about the last 5% of the run's global updates: evaluations, the target check and
    the final weights use the server's average ``v̄`` (the workers still pull ``v``), which holds still where a
    constant-rate policy keeps swinging (why: docs/benchmarks.md#hsa2c-average)."""
    global_updates: int | None = None
    """Stop after this many global updates; None: ``total_timesteps`` sets the budget (with both, the fewer)."""
    update_codec: UpdateCodec = "bf16+zstd"
    """Wire codec of the pushed updates: bf16 values, compressed, where the return held; the pulls stay fp32 and
    delta-coded, since bf16 pulls did not hold it (why both: docs/benchmarks.md#hsa2c-codecs)."""
    eval_every: int = 20
    eval_every_s: float | None = None
    """Evaluate at the first global update after every this many seconds of training instead of every
    ``eval_every`` global updates: one wall-clock cadence for variants whose global updates differ in size
    (HSA2C against its B = 1 baselines)."""
    num_steps: int = 5
    """Steps rolled per env per gradient (the paper's k: k-step bootstrapped returns)."""
    gae_lambda: float = 1.0
    """λ of generalised advantage estimation within each k-step rollout: 1 is the paper's k-step bootstrapped
    return (Alg. 9) and SB3's A2C default; lower trades variance for bias (rl-zoo's A2C uses 0.9 on its pybullet
    locomotion tasks)."""
    envs_per_process: int = 8
    """Environments per Hogwild process: the local mini-batch (m); a gradient costs k × m env steps."""
    grad_scaling: Literal["rmsprop", "none"] = "rmsprop"
    """'rmsprop': divide each gradient by its per-process running RMS; 'none': plain SGD steps."""
    rms_alpha: float = 0.99
    """Decay of the RMSProp running mean of squared gradients."""
    rms_eps: float = 1e-5
    """ε of the RMSProp denominator."""
    norm_reward: bool | None = True
    """Scale each Hogwild process's rewards by the running std of its envs' discounted return (the value
    function then learns scaled returns; evaluations report raw ones); None: as norm_obs resolves."""
    norm_obs: bool | None = True
    """Normalise vector observations by their running mean and variance inside the agent (frames and grids are
    scaled, not normalised). The statistics are part of the weights DPSGD moves: each local step merges its
    rollout's observations, the master adds the pushes like any update, and pulls, averages, checkpoints and
    evaluations carry them. Without it small inputs such as MountainCar-v0's velocity (±0.07) are invisible to the
    network (why: docs/benchmarks.md#hsa2c-mountaincar). None: as PPO's, on for Box actions only."""
    sde: bool | None = None
    """Generalised state-dependent exploration (SB3's gSDE; :class:`~frugalrl.nets.MLPActorCritic`'s ``sde``): the
    noise is a learned linear function of the actor's features, held for ``sde_sample_freq`` steps, its matrix
    starting at ``log_std_init`` −2 in half-widths of the action box. None: on for Box actions, where it learns
    far more than independent noise (why: docs/benchmarks.md#hsa2c-sde)."""
    sde_sample_freq: int = 16
    """Env steps between draws of the ``sde`` noise matrices."""
    ent_anneal: float = 0.0
    """Anneal the entropy coefficient linearly to 0 over this last fraction of the run's global updates (1: from
    the start; 0: constant ``ent_coef``), on the global clock the rates use (``eta_anneal``)."""
    log_eval_episodes: int = 1
    """Greedy episodes of each periodic evaluation (the server-side loss). One that reaches ``target_return``
    is confirmed on ``eval_episodes`` episodes (those of the final evaluation) before the run stops."""
    eval_max_steps: int = 1000
    """Steps after which an evaluation episode that has not ended is cut (its return so far counted): lower than
    the other algorithms' cap, since the server plays a periodic evaluation every few updates."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field.

        The HSA2C fields are checked here, every part's (the DPSGD options': ``"HSA2CConfig.workers must be ..."``)
        along the chain, the rest of the DPSGD run by :meth:`dpsgd_config`.
        """
        check_fields(self, positive_ints=("num_steps", "envs_per_process", "log_eval_episodes", "eval_max_steps",
                                          "sde_sample_freq"),
                     positive=("rms_eps", "eval_every_s"), unit=("rms_alpha", "ent_anneal", "gae_lambda"))
        super().validate()  # after the fields that budget_updates divides by
        if self.ent_anneal and self.budget_updates is None:
            raise ValueError("HSA2CConfig.ent_anneal needs a budget (total_timesteps or global_updates)")
        self.dpsgd_config()

    @property
    def env_steps_per_gradient(self) -> int:
        """Env steps behind one local gradient (num_steps × m)."""
        return self.num_steps * self.envs_per_process

    @property
    def env_steps_per_update(self) -> int:
        """Env steps a global update stands for: M updates of B·p gradients of k × m steps."""
        return self.master_batch * self.local_steps * self.processes * self.env_steps_per_gradient

    @property
    def budget_updates(self) -> int | None:
        """Global updates of the run: ``global_updates`` or ``total_timesteps`` worth of them, the fewer."""
        by_steps = math.ceil(self.total_timesteps / self.env_steps_per_update)
        return by_steps if self.global_updates is None else min(self.global_updates, by_steps)

    def problem_kwargs(self) -> dict[str, Any]:
        """JSON keyword arguments of :func:`~frugalrl.algos.hsa2c.make_a2c_problem`: this config (every process builds
        its problem from it; the entropy schedule's clock, a resumed run's included, comes from DPSGD's workers)."""
        return {"config": jsonable(dataclasses.asdict(self))}

    def dpsgd_config(self, done_updates: int = 0) -> DPSGDConfig:
        """The :class:`~frugalrl.dpsgd.config.DPSGDConfig` this run is: the inherited options, the A2C problem
        (``done_updates``: global updates an earlier segment of a resumed run made)."""
        budget = self.budget_updates
        return DPSGDConfig(
            **{**self.options(), "global_updates": None if budget is None else max(1, budget - done_updates)},
            problem=PROBLEM,
            problem_kwargs=self.problem_kwargs(),
            seed=self.seed + done_updates,
            log_every=self.eval_every,
            log_every_s=self.eval_every_s,
            target_loss=None if self.target_return is None else -float(self.target_return),
            clock_offset=done_updates,
        )
