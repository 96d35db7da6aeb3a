"""Run directories: config, metrics, TensorBoard events, checkpoints and summary.

Layout of ``runs/<name>/``::

    config.json        everything needed to rerun (the dataclass config, with the algorithm and versions)
    metrics.jsonl      one JSON row per logged update (also the source of the plots)
    events.out.tfevents.*   TensorBoard
    checkpoints/       latest.pt: what ``--resume`` continues from (and ``frugalrl eval`` scores)
    summary.json       the run summary (:class:`RunSummary`)
    plots/*.png        return vs steps and vs time, syncs per worker, bytes by kind, bytes per env step over time,
                       KL vs δ with the sync events (AAPS runs)

Files are written so that a run killed at any moment (SIGKILL included) leaves no torn file that
matters: checkpoints and JSON files are written to a temporary name, flushed to disk and renamed over
the old one; ``metrics.jsonl`` is appended line by line, and a resumed run drops a torn last line and
every row after its checkpoint, so no step is logged twice.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

CHECKPOINT = "latest.pt"
"""The checkpoint ``--resume`` and ``frugalrl eval`` read, in ``<run>/checkpoints/``."""
BEST = "best.pt"
"""The policy of the run's best evaluation so far (``frugalrl eval RUN --checkpoint best``), beside ``latest.pt``."""
GROWTH_AFTER_S = 600.0
"""Training seconds after which a run's metrics growth is judged (a shorter run's files are small anyway)."""
GROWTH_MB_PER_HOUR = 100.0
"""Metrics growth above which a run that writes a row for every update is told of ``log_every_s``."""
EVENT_COLUMNS = ("faults/", "health/", "monitor/")
"""Column prefixes of events a thinned row must not drop (:class:`UpdateRows` writes such a row at once)."""
log = logging.getLogger("frugalrl")


@dataclass
class RunSummary:
    """What every run reports (``summary.json``); ``details`` holds what only one algorithm has."""

    algo: str
    env_id: str
    seed: int
    env_steps: int
    """Env steps taken in all (resumed segments included)."""
    updates: int
    """Learner updates: PPO and IMPALA updates, pipeline iterations, HSA2C global updates."""
    wall_seconds: float
    """Seconds from start to end, evaluation included (startup of workers excluded)."""
    train_seconds: float
    """Seconds of training: ``wall_seconds`` without evaluation."""
    steps_per_second: float
    """``env_steps / train_seconds``."""
    eval_return_mean: float
    """Mean return of the final evaluation (deterministic actions: the mode of the policy's distribution)."""
    eval_return_std: float
    eval_episodes: int
    eval_deterministic: bool
    """Whether ``eval_return_mean`` comes from deterministic (mode) actions."""
    stochastic_return_mean: float | None
    """Mean return of a final evaluation that samples its actions from the policy (None where not made)."""
    stochastic_return_std: float | None
    eval_history: list[dict[str, Any]]
    """Every evaluation: ``{step, seconds, mean, std}`` (seconds of training)."""
    train_return_mean_last100: float | None
    """Mean return of the last 100 training episodes (the workers' behaviour policy)."""
    episodes: int
    """Training episodes finished."""
    stop_reason: str
    """'budget' (all steps or updates done), 'target_return', or what the algorithm reports."""
    target_return: float | None
    time_to_target: dict[str, Any] | None
    """``{step, seconds}`` of the first evaluation at or above ``target_return``."""
    weight_syncs: dict[str, Any]
    """``{total, per_worker}``: weight messages sent to workers."""
    bytes: dict[str, Any]
    """Bytes on the wire by kind, ``total``, ``up`` / ``down`` by kind, ``per_worker``, ``messages``."""
    restarts: int
    """Workers replaced after a failure."""
    policy_lag_mean: float | None
    """Mean learner-minus-behaviour policy version of the training data (None where it has no meaning)."""
    resumes: list[dict[str, Any]]
    """One entry per resume: ``{step, at, envs}`` (``envs``: 'restored', 'reset' or a list of envs reset)."""
    eval_disagreement: dict[str, Any] | None
    """Set when the final evaluation contradicts the training curve (see :func:`~frugalrl.evaluation.evaluation_disagreement`)."""
    eval_regression: dict[str, Any] | None
    """Set when the final evaluation is clearly below the run's best one (``best``, ``best_step``, ``final``, ``drop``,
    ``margin``, ``message``; see :func:`~frugalrl.evaluation.evaluation_regression`): the run peaked, then got worse.
    ``checkpoints/best.pt`` holds the policy of the best evaluation. Where the run can play both policies again
    (every algorithm with one agent), ``recheck`` holds their scores on fresh episodes, which confirmed the drop
    (see :func:`~frugalrl.evaluation.regression_recheck`); a drop they do not confirm was the luck of the best check,
    and is only logged."""
    sync_stalls: list[dict[str, Any]]
    """Times the run noticed that its training return stopped improving while the workers acted with an old
    policy (``{step, lag, train_return, message}``; see :class:`~frugalrl.sync_state.StallWatch`)."""
    run_dir: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return jsonable(asdict(self))


def slug(text: str) -> str:
    """``text`` made safe for a directory name (at most 40 characters): an env id's ``/`` must not nest the run."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types (dataclasses and numpy/torch scalars included; anything else as str)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, float | int | str | bool) or obj is None:
        return obj
    return str(obj)


@contextmanager
def replacing(path: Path, binary: bool = True) -> Iterator[IO[Any]]:
    """A new file for ``path``: written beside it, synced, then renamed over it (the rename synced too), so that a
    crash leaves either the old file or the new one. A failure (a full disk) removes the partial copy, which must
    not keep the space, and names ``path`` in its OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # which file could not be written
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` (:func:`replacing`)."""
    with replacing(path) as f:
        f.write(data)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    write_atomic(path, (json.dumps(jsonable(data), indent=2) + "\n").encode())


class RunDirectory:
    """One training run's directory and its writers.

    ``resume_step`` continues an existing directory from a checkpoint taken at that env step: the
    metrics logged after it are dropped (they are logged again), TensorBoard purges its events from
    that step on, and ``config.json`` takes ``config`` (its ``_meta``: the run's, from its ``config.json``) with the
    segment's first checkpoint (a flag changed on resume holds for the next resume too).
    """

    def __init__(self, path: str | Path, config: dict[str, Any], tensorboard: bool = True,
                 resume_step: int | None = None) -> None:
        self.dir = Path(path)
        self.checkpoints = self.dir / "checkpoints"
        self._config_after_checkpoint: dict[str, Any] | None = None
        if resume_step is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.checkpoints.mkdir(exist_ok=True)
            import torch  # here, not at the top: experience.py (worker processes) imports this module

            meta = {"python": platform.python_version(), "torch": torch.__version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
            write_json(self.dir / "config.json", {**config, "_meta": meta})
            self._metrics = open(self.dir / "metrics.jsonl", "w")  # noqa: SIM115 - closed in close()
        else:  # the settings this segment runs with (flags given with --resume) are what a later resume reads,
            # once the segment has saved a checkpoint with them (a resume that fails to start leaves the old ones)
            meta = {**config.get("_meta", {}), "resumed": time.strftime("%Y-%m-%dT%H:%M:%S")}  # the run's, kept
            self._config_after_checkpoint = {**config, "_meta": meta}
            keep_metrics_to(self.dir / "metrics.jsonl", resume_step)
            self._metrics = open(self.dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, seconds: float, values: dict[str, Any]) -> None:
        """Record scalar ``values`` at ``step`` env steps, ``seconds`` into the run."""
        row = {"step": int(step), "time": round(seconds, 3), **jsonable(values)}
        try:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        except OSError as e:  # a full disk: say which file
            e.filename = e.filename or str(self.dir / "metrics.jsonl")
            raise
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)

    def bytes_written(self) -> int:
        """Bytes of ``metrics.jsonl`` and the TensorBoard events so far (the events flushed first)."""
        if self._tb is not None:
            self._tb.flush()
        return self._metrics.tell() + sum(p.stat().st_size for p in self.dir.glob("events.out.tfevents.*"))

    def save_checkpoint(self, payload: dict[str, Any], name: str = CHECKPOINT) -> Path:
        """Write ``checkpoints/<name>`` (``latest.pt``; ``best.pt`` holds the best-evaluated policy) atomically
        (torch.save of tensors and plain containers only, so that :func:`read_checkpoint` reads it with
        ``weights_only=True``)."""
        import io

        import torch

        buf = io.BytesIO()
        torch.save(payload, buf)
        path = self.checkpoints / name
        write_atomic(path, buf.getvalue())
        if name == CHECKPOINT and self._config_after_checkpoint is not None:
            write_json(self.dir / "config.json", self._config_after_checkpoint)
            self._config_after_checkpoint = None
        return path

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically."""
        write_json(self.dir / "summary.json", summary)

    def close(self) -> None:
        """Close the writers."""
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()


class UpdateRows:
    """The update rows of a run's metrics: one for every update (``every_s`` 0), or one each ``every_s`` seconds of
    training, the latest update's, and every row that is kept: one with an evaluation, at a stop or a checkpoint,
    or with an event column (:data:`EVENT_COLUMNS`: a restarted worker, a stall, the Monitor's check). A row has the
    training return and length of every episode since the last row written, so thinning drops none. A run process
    that writes a row for every update is told once, after :data:`GROWTH_AFTER_S`, if its files grow faster than
    :data:`GROWTH_MB_PER_HOUR`."""

    def __init__(self, directory: RunDirectory, every_s: float) -> None:
        self.directory = directory
        self.every_s = every_s
        self._held: tuple[int, float, dict[str, Any]] | None = None  # (env steps, seconds, row) not yet written
        self._written_s: float | None = None
        self._since: list[tuple[float, Any]] = []  # (return, length or None) of episodes since the last row
        self._judged = False
        self._rows = self._kept = 0  # rows written by this process, and those written whatever every_s is

    def episodes(self, returns: list[float], lengths: list[Any]) -> None:
        """Episodes that ended in the update about to be added (lengths: the same count, or none known)."""
        self._since += zip(returns, list(lengths[:len(returns)]) + [None] * (len(returns) - len(lengths)), strict=True)

    def add(self, step: int, seconds: float, row: dict[str, Any], keep: bool = False) -> None:
        """An update's row, at ``step`` env steps and ``seconds`` of training; ``keep``: written now."""
        keep = keep or any(k.startswith(EVENT_COLUMNS) for k in row)
        self._held = (step, seconds, row)
        if keep or not self.every_s or self._written_s is None or seconds - self._written_s >= self.every_s:
            self._kept += keep
            self.flush()
        if not self._judged and seconds >= GROWTH_AFTER_S:
            self._judged = True
            mb_per_hour = self.directory.bytes_written() / 1e6 / seconds * 3600
            if mb_per_hour > GROWTH_MB_PER_HOUR and not self.every_s and self._kept < self._rows / 2:
                log.warning("frugalrl: this run's metrics.jsonl and TensorBoard events grow by %.0f MB an hour, a row "
                            "for every update; --log-every-s 1 writes at most a row a second (and every evaluation)",
                            mb_per_hour)

    def flush(self) -> None:
        """Write the held row, if any."""
        if self._held is None:
            return
        step, seconds, row = self._held
        if self._since:
            row = {**row, "train/episode_return": float(np.mean([r for r, _ in self._since]))}
            lengths = [float(n) for _, n in self._since if n is not None]
            if lengths:
                row["train/episode_length"] = float(np.mean(lengths))
        self.directory.log(step, seconds, row)
        self._held, self._written_s, self._since = None, seconds, []
        self._rows += 1


def read_checkpoint(path: str | Path, name: str = CHECKPOINT) -> dict[str, Any]:
    """The payload of a checkpoint (a run directory's ``checkpoints/<name>``, or a ``.pt`` file), read with
    ``weights_only=True``."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / name
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = read_torch_file(path)
    if not isinstance(payload, dict) or "format" not in payload or "parts" not in payload:
        raise ValueError(f"{path} is not a frugalrl checkpoint (a torch file without its format, parts and counters)")
    return payload


def read_torch_file(path: Path) -> Any:
    """A torch file of frugalrl's (tensors and plain containers: ``weights_only=True``, nothing else unpickled); a
    truncated, foreign or random file raises one ``ValueError`` line naming it."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever torch.load raised, one line naming the file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a readable frugalrl checkpoint (truncated or not one: {first[:160]})") from None


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's ``config.json`` (``FileNotFoundError`` naming it if it is not a run directory)."""
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    return json.loads(path.read_text())


def _row_step(line: str) -> int:
    """The ``step`` of one metrics line, read without parsing the row where it comes first (as
    :meth:`RunDirectory.log` writes it)."""
    if line.startswith('{"step": '):
        end = line.find(",", 9)
        if end > 9 and line[9:end].isdigit():
            return int(line[9:end])
    return int(json.loads(line)["step"])


def keep_metrics_to(path: Path, step: int) -> None:
    """Keep the rows of ``metrics.jsonl`` at ``path`` up to env step ``step`` (a torn last line dropped), line by line
    into a new file that replaces it: a resumed days-long run's file is gigabytes, never read into memory."""
    with replacing(path, binary=False) as out:
        if path.exists():
            with open(path, encoding="utf-8") as rows:
                for line in rows:
                    if not line.endswith("\n"):  # a row is written with its newline: only a kill tears one
                        break
                    if line.strip() and _row_step(line) <= step:
                        out.write(line)


def read_metrics_thinned(run_dir: str | Path, max_rows: int = 20_000) -> list[dict[str, Any]]:
    """About ``max_rows`` rows of ``metrics.jsonl`` at most, evenly spread over the run, with every evaluation row
    and the last row: what plots draw of a days-long run (millions of rows) without reading it into memory."""
    kept: list[tuple[int, dict[str, Any]]] = []  # (line number, row): every stride-th training row
    evals: list[tuple[int, dict[str, Any]]] = []
    stride, seen, last = 1, 0, (-1, "")
    for i, line in _metric_lines(Path(run_dir) / "metrics.jsonl"):
        is_eval = '"eval/' in line
        if not is_eval:
            last, seen = (i, line), seen + 1
            if (seen - 1) % stride:
                continue
        row = json.loads(line)
        (evals if is_eval else kept).append((i, row))
        if len(kept) > max_rows:  # every other one goes; from now on every (2 × stride)-th row is kept
            kept, stride = kept[::2], stride * 2
    if last[0] >= 0 and (not kept or kept[-1][0] != last[0]):
        kept.append((last[0], json.loads(last[1])))
    return [row for _, row in sorted(kept + evals, key=lambda pair: pair[0])]


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (a torn last line, from a killed run, is skipped); every one, in memory: for
    tests and short runs (plots read :func:`read_metrics_thinned`)."""
    return [json.loads(line) for _, line in _metric_lines(Path(run_dir) / "metrics.jsonl")]


def _metric_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every row of the metrics file ``path``, read line by line; blank lines skipped, and
    the last line if a kill tore it (a row is written with its newline: one without is whole only if it parses)."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                try:
                    json.loads(line)
                except json.JSONDecodeError:
                    return
            yield i, line
