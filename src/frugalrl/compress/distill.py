"""Knowledge distillation (AcceRL, Zhang 2022, equation 1): teach a smaller policy to act like the learner's.

The student is trained on recent states to match the teacher's action distribution and value:

    loss = KL(pi_teacher(.|s) || pi_student(.|s)) + value_coef * (v_teacher(s) - v_student(s))^2
           - beta * H(pi_student(.|s))

with ``value_coef = 1/2`` in the paper. The entropy bonus keeps the student from collapsing onto the
teacher's argmax on the few states it sees (AcceRL: "to prevent policy overfitting").

Two uses, as in the paper: fine-tune a pruned network (``Prune(0.5)`` then ``Distill()``), or distill
into a fresh, smaller network of the teacher's class (``Distill(student={"hidden": [32, 32]})``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from frugalrl import dists
from frugalrl.compress.base import Artifact, CompressContext, Compressor
from frugalrl.nets import ActorCritic, build_policy, copy_obs_norm

DEFAULT_STEPS = 300
_CHUNK = 1024  # states per forward pass when labelling / measuring the whole observation set


def _check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(obs[i : i + _CHUNK]) for i in range(0, obs.shape[0], _CHUNK)])


def _device(module: nn.Module) -> torch.device:
    try:
        return next(module.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _check_options(steps: int, batch_size: int, lr: float, beta: float, value_coef: float) -> None:
    """Raise ``ValueError`` naming the first bad distillation option."""
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    _check_positive("lr", lr)
    _check_positive("beta", beta, allow_zero=True)
    _check_positive("value_coef", value_coef, allow_zero=True)


def distill(
    teacher: ActorCritic,
    student: ActorCritic,
    observations: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    batch_size: int = 256,
    lr: float = 1e-3,
    beta: float = 0.01,
    value_coef: float = 0.5,
    seed: int = 0,
    kl_tol: float | None = None,
) -> dict[str, float]:
    """Train ``student`` **in place** to imitate ``teacher`` on ``observations``; return loss statistics.

    ``steps`` Adam updates on minibatches of ``batch_size`` states drawn (with replacement) by a
    ``torch.Generator`` seeded with ``seed``, so a run is reproducible; with ``kl_tol``, it stops early once the
    mean KL(teacher ‖ student) of the last 25 minibatches is below ``kl_tol`` (``steps`` is then a bound). The teacher is only read: its
    outputs are computed once, without gradients. Observations may be uint8 frames; the agents cast them.
    Both agents must have the same ``dist_kind`` and action size; the value term needs ``value(obs)`` on
    both (pass ``value_coef=0`` for policies without a critic).

    Returns ``first_loss``/``last_loss`` (minibatch losses of the first and last update), ``kl_mean``,
    ``kl_max`` and ``value_mse`` of the trained student over all ``observations``, and ``steps``.
    The student is left in eval mode.
    """
    _check_options(steps, batch_size, lr, beta, value_coef)
    if teacher.dist_kind != student.dist_kind:
        raise ValueError(
            f"teacher and student must have the same action distribution, got {teacher.dist_kind!r} "
            f"and {student.dist_kind!r}"
        )
    use_value = value_coef > 0
    if use_value and not (hasattr(teacher, "value") and hasattr(student, "value")):
        raise TypeError("distillation with value_coef > 0 needs value(obs) on both teacher and student")
    obs = torch.as_tensor(observations)
    if obs.ndim < 2 or obs.shape[0] == 0:
        raise ValueError(f"observations must be a non-empty batch of states, got shape {tuple(obs.shape)}")
    kind = teacher.dist_kind
    device = _device(student)
    obs = obs.to(_device(teacher))

    with torch.no_grad():
        t_params = _chunked(teacher.dist_params, obs).float().to(device)
        # Not read when use_value is False.
        t_value = _chunked(teacher.value, obs).float().to(device) if use_value else torch.empty(0)
    obs = obs.to(device)
    with torch.no_grad():
        s_params = student.dist_params(obs[:1])
    if s_params.shape[1:] != t_params.shape[1:]:
        raise ValueError(
            f"teacher and student action heads differ: {tuple(t_params.shape[1:])} vs {tuple(s_params.shape[1:])} "
            "parameters"
        )

    student.requires_grad_(True)
    student.train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(int(seed))
    n = obs.shape[0]
    first = last = float("nan")
    window: list[float] = []
    done = 0
    for step in range(steps):
        idx = torch.randint(n, (batch_size,), generator=gen).to(device)
        params = student.dist_params(obs[idx]).float()
        loss = dists.kl(kind, t_params[idx], params).mean()
        window.append(float(loss.detach()))
        if beta > 0:
            loss = loss - beta * dists.entropy(kind, params).mean()
        if use_value:
            loss = loss + value_coef * (t_value[idx] - student.value(obs[idx]).float()).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 0:
            first = float(loss.detach())
        last = float(loss.detach())
        done = step + 1
        if kl_tol is not None and len(window) == 25:
            if sum(window) / 25 < kl_tol:
                break
            window = []
    student.eval()

    with torch.no_grad():
        kl = dists.kl(kind, t_params, _chunked(student.dist_params, obs).float())
        mse = (
            (t_value - _chunked(student.value, obs).float()).pow(2).mean() if use_value else torch.tensor(0.0)
        )
    return {
        "steps": float(done),
        "first_loss": first,
        "last_loss": last,
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "value_mse": float(mse),
    }


class Distill(Compressor):
    """Chain stage: knowledge distillation of ``ctx.teacher`` into a student on ``ctx.observations``.

    With ``student=None`` the student is (a copy of) ``art.module``, typically the network a ``Prune``
    stage just produced, which distillation fine-tunes. With a dict, the student is a fresh network of
    the teacher's class built from the teacher's spec with those keyword arguments overridden, e.g.
    ``{"channels": [16, 32], "hidden": 256}`` (Nature-CNN) or ``{"hidden": [32, 32]}`` (MLP); it is
    initialised with ``torch`` seeded by ``ctx.seed``. Neither the teacher nor ``art.module`` is
    modified. The statistics of the last run (see :func:`distill`) are kept in ``last_stats``.
    """

    def __init__(
        self,
        student: dict[str, Any] | None = None,
        steps: int = DEFAULT_STEPS,
        batch_size: int = 256,
        lr: float = 1e-3,
        beta: float = 0.01,
        value_coef: float = 0.5,
        kl_tol: float | None = None,
        warm_start: bool = False,
    ):
        if student is not None and not isinstance(student, dict):
            raise TypeError(
                f"student must be None (fine-tune the incoming network) or a dict of keyword arguments "
                f"overriding the teacher's spec, got {type(student).__name__}"
            )
        _check_options(steps, batch_size, lr, beta, value_coef)
        self.student = None if student is None else dict(student)
        self.steps = steps
        self.batch_size = batch_size
        self.lr = float(lr)
        self.beta = float(beta)
        self.value_coef = float(value_coef)
        self.kl_tol = None if kl_tol is None else float(kl_tol)
        self.warm_start = bool(warm_start)
        self.last_stats: dict[str, float] | None = None
        """What :func:`distill` returned on the last :meth:`apply`."""
        self._previous: ActorCritic | None = None

    def make_student(self, art: Artifact, ctx: CompressContext) -> ActorCritic:
        """The network to train: a deep copy of ``art.module``, or a fresh one from the teacher's spec; with
        ``warm_start``, the student of the previous :meth:`apply` when it has the same architecture (a learner
        that moved a little since is followed in a few steps, where a fresh start takes hundreds)."""
        previous = self._previous
        if self.warm_start and previous is not None and previous.spec.to_json() == (
                art.module.spec.to_json() if self.student is None else previous.spec.to_json()):
            student = copy.deepcopy(previous).float()
            copy_obs_norm(ctx.teacher, student)
            return student
        if self.student is None:
            return copy.deepcopy(art.module).float()
        spec = ctx.teacher.spec
        spec = replace(spec, kwargs={**spec.kwargs, **self.student})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ctx.seed)
            try:
                student = build_policy(spec)
            except TypeError as e:
                raise TypeError(
                    f"cannot build a student from {spec.factory} with overrides {self.student}: {e}"
                ) from e
        copy_obs_norm(ctx.teacher, student)
        return student.to(_device(ctx.teacher))

    def apply(self, art: Artifact, ctx: CompressContext) -> Artifact:
        """Distill the teacher into the student; return it as an fp32 artifact (frozen, eval mode)."""
        student = self.make_student(art, ctx)
        self.last_stats = distill(
            ctx.teacher,
            student,
            ctx.observations,
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            beta=self.beta,
            value_coef=self.value_coef,
            seed=ctx.seed,
            kl_tol=self.kl_tol,
        )
        student.requires_grad_(False)
        if self.warm_start:
            self._previous = copy.deepcopy(student)
        return Artifact(module=student.eval())

    def describe(self) -> str:
        """``distill``, or ``distill:STEPS`` when the steps differ from the default (the ``--compress`` syntax)."""
        return "distill" if self.steps == DEFAULT_STEPS else f"distill:{self.steps}"


__all__ = ["DEFAULT_STEPS", "Distill", "distill"]
