"""Run a ``frugalrl`` command on a Ray cluster started inside one Slurm allocation.

    frugalrl slurm --nodes 4 --partition cpu --time 02:00:00 -- frugalrl train ppo --env LunarLander-v3

writes an sbatch script (``--script-out``, or stdout) and, with ``--submit``, hands it to ``sbatch``.
The script follows the usual Ray-on-Slurm pattern (one task per node): the first node of the allocation starts the
Ray head, the others Ray workers; once all are alive the command runs in the batch step, a ``frugalrl train``
command with ``--backend ray --ray-address`` appended (``--transport ray`` for ``train hsa2c``); on exit Ray stops
on every node and the script exits with the command's status. ``--ray-auth-token`` turns on Ray's token
authentication, without which anyone who can reach the head's port can run code on the allocation. Each step, and
how to provide the token: docs/multi-node.md#slurm (the generated script repeats the token steps as comments).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
from pathlib import Path

RAY_PORT = 6379

_WAIT_SNIPPET = """\
import sys, time
addr, want, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
import ray
while True:
    try:
        ray.init(address=addr, logging_level="ERROR", log_to_driver=False)
        alive = sum(1 for n in ray.nodes() if n.get("Alive"))
        ray.shutdown()
    except Exception:
        alive = 0
    if alive >= want:
        print(f"ray cluster at {addr}: {alive} node(s) alive")
        sys.exit(0)
    if time.monotonic() > deadline:
        sys.exit(f"ray cluster at {addr}: {alive} of {want} node(s) alive after {sys.argv[3]} s")
    time.sleep(2)
"""

_AUTH_COMMENT = """\
# ---- Ray token authentication (Ray >= 2.52) --------------------------------------------------------
# Without it, anyone who can reach the head's port {port} or its dashboard can run code in this job.
#  1. Once, on a login node:  ray get-auth-token --generate
#     (writes the token to ~/.ray/auth_token; the home directory must be shared with the compute
#     nodes), or keep the token in a file of your own (chmod 600) and
#     export RAY_AUTH_TOKEN_PATH=/path/to/token   (RAY_AUTH_TOKEN, the token itself, wins over both,
#     but then it sits in the job's environment).
#  2. RAY_AUTH_MODE=token must reach every Ray process and client (head, workers, the training driver):
#     uncomment the export below (frugalrl slurm --ray-auth-token does it), or export it before sbatch
#     (sbatch forwards the submitting environment by default; srun forwards it to the Ray steps).
# ------------------------------------------------------------------------------------------------------
"""


@dataclasses.dataclass
class SlurmConfig:
    """What ``frugalrl slurm`` puts in the sbatch script."""

    nodes: int
    """Nodes in the allocation: one Ray head and ``nodes - 1`` Ray workers."""
    partition: str
    """Slurm partition (``#SBATCH --partition``)."""
    time: str | None = None
    """Wall-time limit, e.g. ``02:00:00`` (``#SBATCH --time``); None leaves the partition default."""
    cpus_per_task: int | None = None
    """CPUs per node given to Ray (``#SBATCH --cpus-per-task`` and ``ray start --num-cpus``)."""
    job_name: str = "frugalrl"
    """``#SBATCH --job-name``."""
    output: str | None = None
    """``#SBATCH --output`` (Slurm patterns such as ``%j`` allowed); None leaves Slurm's default."""
    port: int = RAY_PORT
    """Port of the Ray head (GCS)."""
    ray_wait: float = 300.0
    """Seconds to wait for the head, then for all nodes, before giving up."""
    python: str = "python3"
    """Interpreter (with ``ray`` installed) that runs the wait snippet."""
    ray_auth_token: bool = False
    """Export ``RAY_AUTH_MODE=token`` in the script (the token itself must be set up beforehand)."""
    script_out: str | None = None
    """Where ``frugalrl slurm`` writes the script (None: standard output, or ``<job_name>.sbatch`` with ``submit``)."""
    submit: bool = False
    """Run ``sbatch`` on the script and print the job id."""
    requeue: bool = True
    """For ``frugalrl train``: ``#SBATCH --requeue``, SIGTERM ``signal_grace`` s before the time limit passed on to the
    run (it checkpoints and exits 75), the job then requeued, and a requeued job resumes from the run directory."""
    signal_grace: int = 120
    """Seconds before the time limit at which Slurm warns the script (``#SBATCH --signal=B:TERM@N``)."""

    def validate(self) -> None:
        """Raise ValueError for options Slurm or Ray would reject (or misread)."""
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if self.cpus_per_task is not None and (
            isinstance(self.cpus_per_task, bool) or not isinstance(self.cpus_per_task, int) or self.cpus_per_task < 1
        ):
            raise ValueError(f"cpus_per_task must be an integer >= 1, got {self.cpus_per_task!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port!r}")
        if isinstance(self.signal_grace, bool) or not isinstance(self.signal_grace, int) or self.signal_grace < 1:
            raise ValueError(f"signal_grace must be an integer >= 1 (seconds), got {self.signal_grace!r}")
        if not self.ray_wait > 0:
            raise ValueError(f"ray_wait must be > 0 seconds, got {self.ray_wait!r}")
        for name in ("partition", "time", "job_name", "output", "python"):
            value = getattr(self, name)
            if value is None and name in ("time", "output"):
                continue
            if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                raise ValueError(f"{name} must be a non-empty string without whitespace, got {value!r}")


def is_frugalrl_train(command: list[str]) -> bool:
    """True for ``frugalrl train ...`` and ``python -m frugalrl[.cli] train ...``."""
    if len(command) >= 2 and os.path.basename(command[0]) == "frugalrl" and command[1] == "train":
        return True
    for i in range(len(command) - 2):
        if command[i] == "-m" and command[i + 1] in ("frugalrl", "frugalrl.cli") and command[i + 2] == "train":
            return os.path.basename(command[0]).startswith("python")
    return False


def _passes(command: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in command)


def _ray_flag(command: list[str]) -> str | None:
    """The flag that puts ``frugalrl train ALGO``'s workers on Ray (the algorithm table's ``ray_flag``:
    ClusterEnv's ``--backend``, DPSGD's ``--transport``; None for one that has no Ray workers)."""
    from frugalrl.algos import ALGORITHMS

    i = command.index("train") + 1
    entry = ALGORITHMS.get(command[i]) if i < len(command) else None
    return "--backend" if entry is None else entry.ray_flag


def command_line(command: list[str]) -> str:
    """The shell line that runs ``command``: every argument quoted, plus the Ray flags for ``frugalrl train``."""
    line = shlex.join(command)
    if is_frugalrl_train(command):
        flag = _ray_flag(command)
        if flag is None:
            return line
        if not _passes(command, flag):
            line += f" {flag} ray"
        if not _passes(command, "--ray-address"):
            line += ' --ray-address "$ray_address"'
    return line


def _flag_value(command: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag v`` or ``--flag=v``), else None."""
    for i, a in enumerate(command):
        if a == flag and i + 1 < len(command):
            return command[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1 :]
    return None


def requeue_lines(command: list[str]) -> list[str]:
    """The shell lines that run ``frugalrl train`` so that a requeued job continues its run: a run name fixed by
    the job id (unless given), ``--resume`` when the run directory holds a checkpoint, SIGTERM passed on to the
    run (which checkpoints and exits 75), and ``scontrol requeue`` after such an exit."""
    q = shlex.quote
    name = _flag_value(command, "--run-name")
    named = command if name is not None else [*command, "--run-name", "frugalrl-JOBID"]
    first = command_line(named).replace(q("frugalrl-JOBID"), '"frugalrl-$SLURM_JOB_ID"')
    head = command[: command.index("train") + 2]  # the executable, ``train`` and the algorithm
    run_name = q(name) if name is not None else '"frugalrl-$SLURM_JOB_ID"'
    run_path = f'{q(_flag_value(command, "--run-dir") or "runs")}/{run_name}'
    resumed = command_line([*head, "--resume", "RUNPATH"]).replace(q("RUNPATH"), '"$run_path"')
    return [
        f"run_path={run_path}",
        "term_pending=0  # a signal that comes while the run starts is passed on as soon as it has started",
        "trap 'term_pending=1' INT TERM",
        'if [[ -f "$run_path/checkpoints/latest.pt" ]]; then  # a requeued job: continue the run',
        '    echo "frugalrl slurm: resuming $run_path (restart ${SLURM_RESTART_COUNT:-0})"',
        f"    {resumed} &",
        "else",
        f"    {first} &",
        "fi",
        "train_pid=$!",
        """trap 'kill -TERM "$train_pid" 2>/dev/null || true' TERM  # the time limit is near: checkpoint""",
        """trap 'kill -TERM "$train_pid" 2>/dev/null || true' INT  # (a background job ignores SIGINT)""",
        """if (( term_pending )); then kill -TERM "$train_pid" 2>/dev/null || true; fi""",
        'while kill -0 "$train_pid" 2>/dev/null; do  # a signal interrupts a wait, not the run',
        '    wait "$train_pid" || true',
        "done",
        'rc=0; wait "$train_pid" || rc=$?  # the run\'s own exit status (bash keeps it once the run has ended)',
        "trap 'exit 143' INT TERM",
        "if (( rc == 75 )); then  # preempted and saved: run again",
        '    echo "frugalrl slurm: the run is saved; requeueing job $SLURM_JOB_ID"',
        '    scontrol requeue "$SLURM_JOB_ID" || true',
        "fi",
        "exit $rc",
    ]


def render_sbatch(cfg: SlurmConfig, command: list[str]) -> str:
    """The sbatch script that starts Ray on the allocation, runs ``command`` and stops Ray (pure function)."""
    cfg.validate()
    if not command or not command[0]:
        raise ValueError("empty command: give the command to run after '--', e.g. -- frugalrl train ppo ...")
    q = shlex.quote
    n = cfg.nodes
    cpus = f" --cpus-per-task={cfg.cpus_per_task}" if cfg.cpus_per_task else ""
    num_cpus = f" --num-cpus={cfg.cpus_per_task}" if cfg.cpus_per_task else ""
    sbatch = [f"--job-name={cfg.job_name}", f"--partition={cfg.partition}", f"--nodes={n}", "--ntasks-per-node=1"]
    if cfg.cpus_per_task:
        sbatch.append(f"--cpus-per-task={cfg.cpus_per_task}")
    if cfg.time:
        sbatch.append(f"--time={cfg.time}")
    if cfg.output:
        sbatch.append(f"--output={cfg.output}")
    requeue = cfg.requeue and is_frugalrl_train(command)
    if requeue:
        sbatch += ["--requeue", f"--signal=B:TERM@{cfg.signal_grace}", "--open-mode=append"]
    lines = ["#!/bin/bash", *(f"#SBATCH {opt}" for opt in sbatch)]
    lines += [
        "# Generated by `frugalrl slurm`: a Ray head on the first node, Ray workers on the others, then",
        "#   " + shlex.join(command).replace("\r", "\\r").replace("\n", "\\n"),
        "",
        _AUTH_COMMENT.format(port=cfg.port).rstrip("\n"),
        ("" if cfg.ray_auth_token else "# ") + "export RAY_AUTH_MODE=token",
        "",
        "set -euo pipefail",
        "",
        f"num_nodes={n}",
        f"port={cfg.port}",
        f"ray_wait={q(str(cfg.ray_wait))}",
        f"ray_python={q(cfg.python)}",
        "",
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'if (( ${#nodes[@]} < num_nodes )); then',
        '    echo "frugalrl slurm: expected $num_nodes nodes in SLURM_JOB_NODELIST, got ${#nodes[@]}" >&2',
        "    exit 1",
        "fi",
        'head_node=${nodes[0]}',
        'head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)',
        "if [[ $head_ip == *' '* ]]; then  # several addresses: take the first IPv4 one",
        "    for addr in $head_ip; do",
        '        if [[ $addr == *.* ]]; then head_ip=$addr; break; fi',
        "    done",
        '    head_ip=${head_ip%% *}',
        "fi",
        'ray_address="$head_ip:$port"',
        'export RAY_ADDRESS="$ray_address"',
        'echo "frugalrl slurm: Ray head $head_node at $ray_address, $num_nodes node(s)"',
        "",
        "ray_pids=()",
        "stop_ray() {",
        "    local rc=$?",
        "    trap - EXIT INT TERM",
        '    srun --overlap --nodes="$num_nodes" --ntasks="$num_nodes" --ntasks-per-node=1 ray stop --force \\',
        "        >/dev/null 2>&1 || true",
        '    if (( ${#ray_pids[@]} )); then',
        '        kill "${ray_pids[@]}" 2>/dev/null || true',
        '        wait "${ray_pids[@]}" 2>/dev/null || true',
        "    fi",
        "    exit $rc",
        "}",
        "trap stop_ray EXIT",
        "trap 'exit 143' INT TERM",
        "",
        "wait_for_nodes() {  # wait_for_nodes WANT: until WANT Ray nodes are alive, at most $ray_wait s",
        f'    "$ray_python" -c {q(_WAIT_SNIPPET)} "$ray_address" "$1" "$ray_wait"',
        "}",
        "",
        f'srun --nodes=1 --ntasks=1{cpus} -w "$head_node" \\',
        f'    ray start --head --node-ip-address="$head_ip" --port="$port"{num_cpus} --block &',
        "ray_pids+=($!)",
        "wait_for_nodes 1",
        "",
        "if (( num_nodes > 1 )); then",
        f'    srun --nodes=$((num_nodes - 1)) --ntasks=$((num_nodes - 1)) --ntasks-per-node=1{cpus} \\',
        f'        --exclude="$head_node" ray start --address="$ray_address"{num_cpus} --block &',
        "    ray_pids+=($!)",
        '    wait_for_nodes "$num_nodes"',
        "fi",
        "",
        *(requeue_lines(command) if requeue else [command_line(command)]),
        "",
    ]
    return "\n".join(lines)


def write_script(cfg: SlurmConfig, command: list[str], path: str | os.PathLike[str]) -> Path:
    """Render the script into ``path`` (made executable) and return the path."""
    text = render_sbatch(cfg, command)
    out = Path(path)
    out.write_text(text)
    out.chmod(0o755)
    return out


def submit(path: str | os.PathLike[str]) -> str:
    """``sbatch`` the script at ``path`` and return the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise FileNotFoundError("sbatch not found on PATH: run this on a Slurm login node, or drop --submit "
                                "and submit the script yourself")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no sbatch script at {path}")
    proc = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch {path} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id:
        raise RuntimeError(f"sbatch {path} printed no job id: {proc.stdout!r}")
    return job_id
