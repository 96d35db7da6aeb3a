"""Split-model PPO over two real gloo processes: bytes equal the estimator, errors are clear, it learns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from frugalrl.cli import main as cli_main
from frugalrl.nets import Heads, action_desc, make_encoder
from frugalrl.pipeline import PipelinePPOConfig, predict_bytes, train
from frugalrl.pipeline.bytes import table_one
from frugalrl.pipeline.launcher import free_port

QUIET = {"progress": False, "tensorboard": False, "plots": False}


def _car_cfg(tmp_path: Path, **kw) -> PipelinePPOConfig:
    """CarRacing-v3 (4×96×96 frames, the paper's cut of 4096) at a tiny budget; short episodes."""
    base = dict(env_kwargs={"max_episode_steps": 40}, num_envs=2, num_steps=32, num_minibatches=2,
                update_epochs=2, total_timesteps=128, warmup_timesteps=64, head_hidden=32,
                run_dir=str(tmp_path), **QUIET)
    base.update(kw)
    return PipelinePPOConfig(**base)


def test_encoder_and_heads_match_the_paper():
    enc = make_encoder(gym.spaces.Box(0, 255, (4, 96, 96), np.uint8), [64])
    assert enc.feature_dim == 4096
    assert enc(torch.zeros(2, 4, 96, 96, dtype=torch.uint8)).shape == (2, 4096)
    space = gym.spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
    heads = Heads(4096, action_desc(space), hidden=512)
    assert [m.weight.shape for m in heads.actor if hasattr(m, "weight")] == [(512, 4096), (3, 512)]
    u = torch.randn(1000, 3) * 5
    a = heads.env_action(u)
    assert (a[:, 0] >= -1).all() and (a[:, 0] <= 1).all() and (a[:, 1:] >= 0).all() and (a[:, 1:] <= 1).all()


@pytest.mark.parametrize("index", ["coo16", pytest.param("bitmask", marks=pytest.mark.slow)])
def test_two_stage_carracing_bytes_equal_the_estimator(tmp_path, index):
    """A real two-process gloo run on CarRacing: dense warm start, then sparse; every byte predicted."""
    cfg = _car_cfg(tmp_path, cut_index=index, cut_percentile=0.9, run_name=f"car-{index}")
    summary = train(cfg)
    assert summary["env_steps"] == 128 and summary["details"]["feature_dim"] == 4096
    ckpt = Path(summary["run_dir"]) / "checkpoints"
    assert (ckpt / "latest.pt").exists() and (ckpt / "heads.pt").exists()  # each stage keeps its half
    predicted = predict_bytes(cfg)
    assert predicted["exact"]
    measured = {k: v for k, v in summary["bytes"].items() if v and k not in ("up", "down", "per_worker", "messages")}
    assert measured == predicted["bytes"]
    assert summary["bytes"]["up"] == {k: v for k, v in predicted["up"].items()}
    assert summary["bytes"]["down"] == {k: v for k, v in predicted["down"].items()}
    # The sparse update really is smaller than the dense warm-start one.
    dense = predict_bytes(PipelinePPOConfig(**{**cfg.__dict__, "warmup_timesteps": 10**6}))
    assert summary["bytes"]["gradients"] < 0.7 * dense["bytes"]["gradients"]
    # The CLI compares prediction and measurement from the run directory.
    assert cli_main(["pipeline-bytes", "--run", summary["run_dir"], "--json"]) == 0


def test_sparse_cut_shrinks_gradient_bytes_tenfold(tmp_path):
    cfg = _car_cfg(tmp_path, warmup_timesteps=0, cut_percentile=0.99, cut_index="auto")
    dense_cfg = _car_cfg(tmp_path, cut="dense")
    sparse, dense = predict_bytes(cfg)["bytes"], predict_bytes(dense_cfg)["bytes"]
    assert sparse["gradients"] <= 0.1 * dense["gradients"]


def test_table_one_reproduces_the_paper():
    rows = {r["setup"]: r for r in table_one()}
    cloud = rows["cloud, formula, 2 B/element"]
    pipe = rows["pipeline, formula, 2 B/element"]
    assert cloud["elements"] == 100 * 4096 * 4 * 96 * 96
    assert pipe["elements"] == 100 * 10 * 32 * 128 * 4096 * 2
    assert 2.0 < pipe["bytes"] / cloud["bytes"] < 2.5  # the paper: 2.4×
    assert 27e9 < cloud["bytes"] / 1.074 < 30e9  # ≈ 28 GB (GiB)
    sparse = rows["ours: activations bf16, gradients p=0.99 gap+bf16"]["bytes"]
    assert sparse < 0.55 * rows["ours: activations bf16, gradients dense fp32"]["bytes"]


def test_bad_configs_raise_before_any_process_starts(tmp_path):
    with pytest.raises(ValueError, match="cut_percentile"):
        _car_cfg(tmp_path, cut_percentile=1.5).validate()
    with pytest.raises(ValueError, match="divisible"):
        _car_cfg(tmp_path, num_minibatches=3).validate()
    with pytest.raises(ValueError, match="cut_index"):
        _car_cfg(tmp_path, cut_index="zip").validate()
    with pytest.raises(ValueError, match="unknown Gymnasium environment id"):
        train(_car_cfg(tmp_path, env="NoSuchEnv-v0"))
    with pytest.raises(ValueError, match="Box observation|frames or flat"):
        train(_car_cfg(tmp_path, env="envs_for_tests:TextObservationEnv", env_kwargs={}))


def test_stages_with_different_configs_refuse_to_train(tmp_path):
    """Two separately started stages (as on two machines: ``frugalrl train pipeline-ppo --rank R``) must agree on
    the config."""
    port = free_port("127.0.0.1")
    procs = []
    for rank, lr in ((0, 1e-3), (1, 2e-3)):
        flags = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
                 "--total-timesteps", "128", "--learning-rate", str(lr), "--rank", str(rank), "--master-port", str(port),
                 "--timeout", "60", "--run-dir", str(tmp_path), "--run-name", "mismatch", "--no-progress",
                 "--no-tensorboard", "--no-plots"]
        procs.append(subprocess.Popen([sys.executable, "-m", "frugalrl.cli", "train", "pipeline-ppo", *flags],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode != 0 for p in procs)
    errors = [err for _, err in results]
    assert all("digest mismatch" in e for e in errors), errors


def _stage_pids(marker: str, rank: int) -> list[int]:
    """Pids of the launcher's stage processes of rank ``rank`` in run directory ``marker`` (stage 1 writes to
    its ``stage1.log``, stage 0 to the terminal)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            out = os.readlink(entry / "fd" / "1")
        except OSError:
            continue
        if "frugalrl.pipeline.launcher import stage_entry" in cmd and (marker in out) == (rank == 1):
            pids.append(int(entry.name))
    return pids


def test_a_dead_stage_is_reported_not_hung(tmp_path):
    cfg = PipelinePPOConfig(env="CartPole-v1", num_envs=2, num_steps=64, num_minibatches=2, update_epochs=2,
                            total_timesteps=10**6, head_hidden=16, run_dir=str(tmp_path), **QUIET)

    def kill_stage1():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = _stage_pids(str(tmp_path), 1)
            if pids:
                time.sleep(3)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_stage1)
    killer.start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="pipeline stage"):
        train(cfg)
    killer.join()
    assert time.monotonic() - start < 90


def test_pipeline_ppo_learns_cartpole(tmp_path):
    """Learning through the cut on a small real task: sparse p = 0.99 gradients with the default accumulator
    for three quarters of the run (the learning suite's CartPole setting, ``benchmarks/pipeline_suite.py``)."""
    cfg = PipelinePPOConfig(env="CartPole-v1", num_envs=8, num_steps=128, num_minibatches=4, update_epochs=4,
                            total_timesteps=40_960, learning_rate=2.5e-3, anneal_lr=True, head_hidden=64,
                            cut="topk", cut_percentile=0.99, warmup_timesteps=10_240, ent_coef=0.0,
                            clip_vloss=False, vf_coef=1.0, seed=1, run_dir=str(tmp_path), **QUIET)
    summary = train(cfg)
    assert summary["eval_return_mean"] >= 150, summary["details"]["return_curve"]
    assert summary["bytes"]["gradients"] > 0


def test_sparse_activations_are_lossless_and_smaller(tmp_path):
    """ReLU features sent as their non-zero entries: same training bytes elsewhere, fewer activation bytes."""
    from frugalrl.pipeline.stage0 import encode_features
    from frugalrl.wire.cut import decode_cut

    cfg = _car_cfg(tmp_path, activations_sparse=True, cut_index="coo16", run_name="sparse-act")
    f = torch.relu(torch.randn(32, 4096))
    msg = encode_features(cfg, f)
    dense = encode_features(_car_cfg(tmp_path), f)
    assert len(msg) < 0.75 * len(dense)
    assert torch.equal(decode_cut(msg), decode_cut(dense))
    summary = train(cfg)
    predicted = predict_bytes(cfg)
    assert not predicted["exact"]
    assert 0 < summary["bytes"]["activations"] <= predicted["bytes"]["activations"]
    assert summary["bytes"]["gradients"] == predicted["bytes"]["gradients"]
