"""``frugalrl slurm``: the sbatch script that starts Ray on an allocation and runs a command there.

Most tests run the generated script under bash with fake ``scontrol``/``srun``/``ray``/``sbatch`` executables
on PATH that record their argv (a dry run: no Slurm, no Ray needed). ``test_real_slurm`` starts a one-node
Slurm cluster (slurmctld + slurmd, ``AuthType=auth/none``) when the Slurm daemons are installed and we are
root, and runs the script through real ``sbatch``/``srun``/``scontrol`` (Ray still faked).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from frugalrl.slurm import SlurmConfig, command_line, is_frugalrl_train, render_sbatch, submit

NASTY = ["--env", "Lunar Lander", "--note", "it's \"quoted\" $HOME `x` ; rm -rf /", "--empty", ""]

# One recorder for every fake: appends "name\x1farg1\x1farg2...\x1e" to $FAKE_LOG, then acts a little.
FAKE = r"""#!/bin/bash
name=${0##*/}
rec=$name; for a in "$@"; do rec+=$'\x1f'$a; done
{ flock 9; printf '%s\x1e' "$rec" >&9; } 9>> "$FAKE_LOG"  # locked: concurrent fakes do not interleave
case $name in
  scontrol) [[ $1 == show && $2 == hostnames ]] && printf '%s\n' ${FAKE_NODES:-n1 n2 n3} ;;
  srun) for a in "$@"; do [[ $a == hostname ]] && echo "${FAKE_HEAD_IP:-10.0.0.1}"; done ;;
  ray) if [[ -n ${FAKE_BLOCK:-} ]]; then for a in "$@"; do [[ $a == --block ]] && exec sleep 120; done; fi ;;
  waitpy) sleep 0.3; exit "${FAKE_WAIT_RC:-0}" ;;  # lets the background fakes record first
  frugalrl) echo "RAY_ADDRESS=$RAY_ADDRESS"
            if [[ -n ${FAKE_PREEMPT_ONCE:-} ]]; then  # the first run saves a checkpoint and exits as preempted
              ck=runs/frugalrl-$SLURM_JOB_ID/checkpoints
              if [[ ! -f $ck/latest.pt ]]; then mkdir -p "$ck"; : > "$ck/latest.pt"; exit 75; fi
            fi
            if [[ -n ${FAKE_TRAIN_WAIT:-} ]]; then
              sleep 60 & nap=$!; trap 'echo "got TERM"; kill $nap; exit 75' TERM; : > "$FAKE_LOG.trapped"; wait
            fi
            exit "${FAKE_TRAIN_RC:-0}" ;;
  sbatch) echo "4242;cluster" ;;
esac
exit 0
"""


def _fakes(tmp_path: Path, names=("scontrol", "srun", "ray", "waitpy", "frugalrl", "sbatch")) -> Path:
    if not (shutil.which("bash") and shutil.which("flock")):
        pytest.skip("the fake Slurm/Ray commands need bash and flock")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        f = bin_dir / name
        f.write_text(FAKE)
        f.chmod(0o755)
    return bin_dir


def _records(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [r.split("\x1f") for r in log.read_text().split("\x1e") if r]


def _dry_run(tmp_path: Path, cfg: SlurmConfig, command: list[str], **env: str):
    bin_dir = _fakes(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(cfg, command))
    log = tmp_path / "calls.log"
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), "SLURM_JOB_NODELIST": "n[1-3]",
                "SLURM_JOB_NUM_NODES": str(cfg.nodes), "SLURM_JOB_ID": "7", "HOME": str(tmp_path), **env}
    proc = subprocess.run(["bash", str(script)], env=full_env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    return proc, _records(log)


def _cfg(**kw) -> SlurmConfig:
    base = {"nodes": 3, "partition": "cpu", "python": "waitpy"}
    return SlurmConfig(**{**base, **kw})


def _is_stop(r: list[str]) -> bool:
    return r[0] == "srun" and "stop" in r


def test_script_passes_bash_n(tmp_path):
    if not shutil.which("bash"):
        pytest.skip("needs bash")
    script = tmp_path / "s.sbatch"
    script.write_text(render_sbatch(SlurmConfig(nodes=2, partition="p", time="01:00:00", cpus_per_task=4,
                                                output="o-%j.txt", ray_auth_token=True),
                                    ["frugalrl", "train", "ppo", *NASTY, "--multi", "a\nb"]))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_sbatch_lines():
    text = render_sbatch(SlurmConfig(nodes=4, partition="gpu-long", time="02:30:00", cpus_per_task=8,
                                     job_name="lunar", output="logs/%x-%j.out"), ["echo", "hi"])
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == ["#SBATCH --job-name=lunar", "#SBATCH --partition=gpu-long", "#SBATCH --nodes=4",
                      "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=8", "#SBATCH --time=02:30:00",
                      "#SBATCH --output=logs/%x-%j.out"]
    assert text.startswith("#!/bin/bash\n#SBATCH")
    minimal = render_sbatch(SlurmConfig(nodes=1, partition="cpu"), ["echo"])
    assert not any(f"--{k}" in minimal for k in ("time", "output", "cpus-per-task"))
    assert "--num-cpus" not in minimal


def test_auth_token_documented_and_optional():
    off = render_sbatch(SlurmConfig(nodes=1, partition="cpu"), ["echo"])
    on = render_sbatch(SlurmConfig(nodes=1, partition="cpu", ray_auth_token=True), ["echo"])
    for text in (off, on):
        assert "RAY_AUTH_TOKEN_PATH" in text and "ray get-auth-token --generate" in text
    assert "\n# export RAY_AUTH_MODE=token\n" in off
    assert "\nexport RAY_AUTH_MODE=token\n" in on


def test_dry_run_sequence_and_quoting(tmp_path):
    cmd = ["frugalrl", "train", "ppo", *NASTY]
    proc, rec = _dry_run(tmp_path, _cfg(cpus_per_task=2), cmd, FAKE_HEAD_IP="10.0.0.1 fe80::1")
    assert proc.returncode == 0, proc.stderr
    assert "RAY_ADDRESS=10.0.0.1:6379" in proc.stdout
    # foreground commands, in order; the two background `srun ray start` may interleave with them
    fg = [r for r in rec if not (r[0] == "srun" and "start" in r)]
    assert [r[0] for r in fg] == ["scontrol", "srun", "waitpy", "waitpy", "frugalrl", "srun"]
    assert fg[0] == ["scontrol", "show", "hostnames", "n[1-3]"]
    assert fg[1] == ["srun", "--nodes=1", "--ntasks=1", "-w", "n1", "hostname", "--ip-address"]
    assert fg[2][-3:] == ["10.0.0.1:6379", "1", "300.0"] and fg[3][-3:] == ["10.0.0.1:6379", "3", "300.0"]
    assert fg[4][1:] == ["train", "ppo", *NASTY, "--run-name", "frugalrl-7", "--backend", "ray", "--ray-address",
                         "10.0.0.1:6379"]
    assert _is_stop(fg[5]) and fg[5][fg[5].index("ray"):] == ["ray", "stop", "--force"]
    assert "--overlap" in fg[5] and "--nodes=3" in fg[5]
    starts = [r for r in rec if r[0] == "srun" and "start" in r]
    head = next(r for r in starts if "--head" in r)
    assert head == ["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "-w", "n1", "ray", "start", "--head",
                    "--node-ip-address=10.0.0.1", "--port=6379", "--num-cpus=2", "--block"]
    worker = next(r for r in starts if "--head" not in r)
    assert worker == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=2",
                      "--exclude=n1", "ray", "start", "--address=10.0.0.1:6379", "--num-cpus=2", "--block"]
    # the workers start only after the head answered (the head's own record may race the first wait)
    assert rec.index(worker) > rec.index(fg[2])


def test_single_node_starts_no_workers(tmp_path):
    proc, rec = _dry_run(tmp_path, _cfg(nodes=1), ["frugalrl", "train", "ppo"],
                         SLURM_JOB_NODELIST="n1", FAKE_NODES="n1")
    assert proc.returncode == 0, proc.stderr
    starts = [r for r in rec if r[0] == "srun" and "start" in r]
    assert len(starts) == 1 and "--head" in starts[0]
    assert [r[-2] for r in rec if r[0] == "waitpy"] == ["1"]


def test_training_failure_is_the_exit_status_and_ray_still_stops(tmp_path):
    proc, rec = _dry_run(tmp_path, _cfg(), ["frugalrl", "train", "ppo"], FAKE_TRAIN_RC="3")
    assert proc.returncode == 3
    assert _is_stop(rec[-1])


def test_cluster_never_ready_skips_training(tmp_path):
    proc, rec = _dry_run(tmp_path, _cfg(), ["frugalrl", "train", "ppo"], FAKE_WAIT_RC="1")
    assert proc.returncode != 0
    assert "frugalrl" not in [r[0] for r in rec]
    assert _is_stop(rec[-1])


def test_requeue_directives_only_for_frugalrl_train():
    train = render_sbatch(SlurmConfig(nodes=1, partition="cpu", signal_grace=90), ["frugalrl", "train", "ppo"])
    assert {"#SBATCH --requeue", "#SBATCH --signal=B:TERM@90", "#SBATCH --open-mode=append"} <= set(train.splitlines())
    for text in (render_sbatch(SlurmConfig(nodes=1, partition="cpu"), ["echo", "hi"]),
                 render_sbatch(SlurmConfig(nodes=1, partition="cpu", requeue=False), ["frugalrl", "train", "ppo"])):
        assert "--requeue" not in text and "--signal" not in text and "--resume" not in text


def test_a_preempted_run_requeues_the_job_and_the_requeued_job_resumes(tmp_path):
    """Exit 75 (the run saved itself on SIGTERM): ``scontrol requeue``; the requeued job finds the run's checkpoint
    (its name fixed by the job id) and resumes it instead of starting from zero."""
    proc, rec = _dry_run(tmp_path, _cfg(nodes=1), ["frugalrl", "train", "ppo", "--env", "X"], FAKE_NODES="n1",
                         SLURM_JOB_NODELIST="n1", FAKE_TRAIN_RC="75")
    assert proc.returncode == 75 and ["scontrol", "requeue", "7"] in rec, proc.stderr
    (tmp_path / "runs" / "frugalrl-7" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "frugalrl-7" / "checkpoints" / "latest.pt").write_bytes(b"")
    (tmp_path / "calls.log").unlink()
    proc, rec = _dry_run(tmp_path, _cfg(nodes=1), ["frugalrl", "train", "ppo", "--env", "X"], FAKE_NODES="n1",
                         SLURM_JOB_NODELIST="n1", SLURM_RESTART_COUNT="1")
    assert proc.returncode == 0 and "resuming runs/frugalrl-7 (restart 1)" in proc.stdout, proc.stderr
    train = next(r for r in rec if r[0] == "frugalrl")
    assert train[1:5] == ["train", "ppo", "--resume", "runs/frugalrl-7"] and "--env" not in train
    assert not any(r[:2] == ["scontrol", "requeue"] for r in rec)


def test_sigterm_to_the_batch_script_reaches_the_run(tmp_path):
    """``--signal=B:TERM@N`` signals the batch shell only: it passes SIGTERM on to the run and requeues on its 75."""
    bin_dir = _fakes(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(_cfg(nodes=1), ["frugalrl", "train", "ppo"]))
    log = tmp_path / "calls.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), "SLURM_JOB_NODELIST": "n1", "FAKE_NODES": "n1",
           "SLURM_JOB_ID": "7", "HOME": str(tmp_path), "FAKE_TRAIN_WAIT": "1"}
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "calls.log.trapped").exists():  # the fake run has set its trap (a loaded machine is slow)
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75 and "got TERM" in out, (out, _records(log))
    assert ["scontrol", "requeue", "7"] in _records(log)


def test_too_few_nodes_in_allocation(tmp_path):
    proc, rec = _dry_run(tmp_path, _cfg(nodes=3), ["echo"], FAKE_NODES="n1")
    assert proc.returncode == 1 and "expected 3 nodes" in proc.stderr
    assert [r[0] for r in rec] == ["scontrol"]


def test_background_ray_steps_are_ended(tmp_path):
    t0 = time.monotonic()
    proc, rec = _dry_run(tmp_path, _cfg(), ["frugalrl", "train", "ppo"], FAKE_BLOCK="1")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 30  # the `--block` fakes sleep 120 s unless the script kills them


def test_ray_flags_only_for_frugalrl_train():
    assert is_frugalrl_train(["frugalrl", "train", "ppo"])
    assert is_frugalrl_train(["/opt/venv/bin/frugalrl", "train", "ppo"])
    assert is_frugalrl_train(["python3", "-m", "frugalrl", "train", "ppo"])
    assert is_frugalrl_train(["python", "-u", "-m", "frugalrl.cli", "train", "ppo"])
    assert not is_frugalrl_train(["frugalrl", "eval", "runs/x"])
    assert not is_frugalrl_train(["python", "my_train.py", "train"])
    assert command_line(["python", "x.py"]) == "python x.py"
    assert command_line(["frugalrl", "train", "ppo", "--backend=ray"]) == \
        'frugalrl train ppo --backend=ray --ray-address "$ray_address"'
    assert command_line(["frugalrl", "train", "ppo", "--ray-address", "h:1"]) == \
        "frugalrl train ppo --ray-address h:1 --backend ray"
    assert command_line(["frugalrl", "train", "ppo", "--backend", "ray", "--ray-address=h:1"]) == \
        "frugalrl train ppo --backend ray --ray-address=h:1"
    # HSA2C's workers are DPSGD's: placed by --transport
    assert command_line(["python", "-m", "frugalrl", "train", "hsa2c"]) == \
        'python -m frugalrl train hsa2c --transport ray --ray-address "$ray_address"'
    assert command_line(["frugalrl", "train", "hsa2c", "--transport=local"]) == \
        'frugalrl train hsa2c --transport=local --ray-address "$ray_address"'


@pytest.mark.parametrize("kw, match", [
    ({"nodes": 0}, "nodes must be"),
    ({"nodes": -2}, "nodes must be"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"partition": ""}, "partition"),
    ({"partition": "a b"}, "partition"),
    ({"job_name": "x\ny"}, "job_name"),
    ({"output": "my out.txt"}, "output"),
    ({"port": 0}, "port"),
])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        render_sbatch(SlurmConfig(**{"nodes": 1, "partition": "cpu", **kw}), ["echo"])


def test_empty_command():
    with pytest.raises(ValueError, match="empty command"):
        render_sbatch(SlurmConfig(nodes=1, partition="cpu"), [])


def test_submit(tmp_path, monkeypatch):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    bin_dir = _fakes(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="sbatch not found"):
        submit(script)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    assert submit(script) == "4242"
    assert _records(tmp_path / "calls.log") == [["sbatch", "--parsable", str(script)]]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from frugalrl.cli import main

    rc = main(["slurm", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_prints_script(capsys):
    rc, out, err = _cli(capsys, "--nodes", "2", "--partition", "cpu", "--time", "00:10:00", "--", "frugalrl",
                        "train", "ppo", "--env", "Lunar Lander")
    assert rc == 0, err
    assert "#SBATCH --nodes=2" in out and "#SBATCH --time=00:10:00" in out
    assert ("\n    frugalrl train ppo --env 'Lunar Lander' --run-name \"frugalrl-$SLURM_JOB_ID\" --backend ray "
            "--ray-address \"$ray_address\" &\n") in out


def test_cli_errors(tmp_path, monkeypatch, capsys):
    rc, _, err = _cli(capsys, "--nodes", "0", "--partition", "cpu", "--", "echo")
    assert rc == 2 and "nodes must be" in err
    rc, _, err = _cli(capsys, "--nodes", "1", "--partition", "cpu")
    assert rc == 2 and "empty command" in err
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rc, _, err = _cli(capsys, "--nodes", "1", "--partition", "cpu", "--submit", "--", "echo")
    assert rc == 1 and "sbatch not found" in err
    assert (tmp_path / "frugalrl.sbatch").exists()  # written before the submit attempt


def test_cli_submit_with_fake_sbatch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{_fakes(tmp_path)}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "l"))
    out_path = tmp_path / "x.sbatch"
    rc, out, err = _cli(capsys, "--nodes", "1", "--partition", "cpu", "--script-out", str(out_path), "--submit",
                        "--", "echo")
    assert rc == 0, err
    assert out.strip() == "4242"
    assert out_path.read_text().startswith("#!/bin/bash")


# ---------------------------------------------------------------- a real one-node Slurm cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def slurm_cluster(tmp_path):
    """slurmctld + slurmd for this host (CPUs=2, auth/none), in the foreground; yields the env for clients."""
    daemons = [shutil.which(n) or f"/usr/sbin/{n}" for n in ("slurmctld", "slurmd")]
    if not all(os.access(d, os.X_OK) for d in daemons) or not shutil.which("sbatch"):
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        pytest.skip("starting slurmd needs root")
    host = socket.gethostname().split(".")[0]
    d = tmp_path / "slurm"
    for sub in ("state", "spool", "log"):
        (d / sub).mkdir(parents=True)
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=frugaltest
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen([daemons[0], "-D", "-i", "-f", str(conf)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env)]
    try:
        time.sleep(0.5)
        procs.append(subprocess.Popen([daemons[1], "-D", "-f", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env))
        deadline = time.monotonic() + 20
        state = ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout
            if state.strip() == "idle":
                break
            time.sleep(0.3)
        if state.strip() != "idle":
            logs = "".join(p.read_text()[-2000:] for p in (d / "log").iterdir())
            pytest.skip(f"Slurm daemons did not come up here (sinfo: {state.strip()!r}): {logs}")
        yield env, host
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_real_slurm(tmp_path, slurm_cluster):
    env, host = slurm_cluster
    bin_dir = _fakes(tmp_path, names=("ray", "waitpy", "frugalrl"))
    log = tmp_path / "calls.log"
    env = {**env, "PATH": f"{bin_dir}:{env['PATH']}", "FAKE_LOG": str(log), "FAKE_BLOCK": "1"}
    out = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    cfg = SlurmConfig(nodes=1, partition="debug", time="00:05:00", cpus_per_task=1, output=str(out),
                      job_name="frugal-test", python="waitpy")
    script.write_text(render_sbatch(cfg, ["frugalrl", "train", "ppo", *NASTY]))
    old = os.environ.copy()
    os.environ.update(env)  # submit() runs sbatch with our environment; sbatch exports it to the job
    try:
        job_id = submit(script)
    finally:
        os.environ.clear()
        os.environ.update(old)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, env=env)
        if not q.stdout.strip():
            break
        time.sleep(0.5)
    info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env).stdout
    text = out.read_text() if out.exists() else "(no output file)"
    assert "JobState=COMPLETED" in info, f"{info}\n{text}"
    rec = _records(log)
    ray_calls = [r for r in rec if r[0] == "ray"]
    head_ip = subprocess.run(["hostname", "--ip-address"], capture_output=True, text=True).stdout.split()[0]
    assert ["ray", "start", "--head", f"--node-ip-address={head_ip}", "--port=6379", "--num-cpus=1",
            "--block"] in ray_calls
    assert ["ray", "stop", "--force"] in ray_calls
    train = [r for r in rec if r[0] == "frugalrl"]
    assert train == [["frugalrl", "train", "ppo", *NASTY, "--run-name", f"frugalrl-{job_id}", "--backend", "ray",
                      "--ray-address", f"{head_ip}:6379"]]
    assert f"Ray head {host} at {head_ip}:6379" in text
    assert f"RAY_ADDRESS={head_ip}:6379" in text


def test_real_slurm_requeue_resumes_the_run(tmp_path, slurm_cluster, monkeypatch):
    """Real sbatch and scontrol: the run saves itself and exits 75 (a fake ``frugalrl`` that does so once), the
    script requeues the job, Slurm starts it again, and the requeued job resumes the run (same run directory, from
    the job id) and completes: never from zero."""
    env, _ = slurm_cluster
    bin_dir = _fakes(tmp_path, names=("ray", "waitpy", "frugalrl"))
    log = tmp_path / "calls.log"
    env = {**env, "PATH": f"{bin_dir}:{env['PATH']}", "FAKE_LOG": str(log), "FAKE_BLOCK": "1",
           "FAKE_PREEMPT_ONCE": "1"}
    out = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    cfg = SlurmConfig(nodes=1, partition="debug", time="00:05:00", cpus_per_task=1, output=str(out),
                      job_name="frugal-requeue", python="waitpy")
    script.write_text(render_sbatch(cfg, ["frugalrl", "train", "ppo", "--env", "CartPole-v1"]))
    monkeypatch.chdir(tmp_path)  # the job's working directory: its runs/ go here
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # sbatch exports the submitting environment to the job
    job_id = submit(script)
    deadline = time.monotonic() + 240
    info = ""
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        if "JobState=COMPLETED" in info or "JobState=FAILED" in info:
            break
        if "JobState=PENDING" in info and "Restarts=1" in info:  # Slurm holds a requeued job back a while
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
        time.sleep(0.5)
    text = out.read_text() if out.exists() else "(no output file)"
    assert "JobState=COMPLETED" in info and "Restarts=1" in info, f"{info}\n{text}"
    train = [r for r in _records(log) if r[0] == "frugalrl"]
    assert [r[1:5] for r in train] == [["train", "ppo", "--env", "CartPole-v1"],
                                       ["train", "ppo", "--resume", f"runs/frugalrl-{job_id}"]]
    assert "requeueing job" in text and f"resuming runs/frugalrl-{job_id} (restart 1)" in text
