"""Issue 17, pictures: bytes per env step, AAPS's KL against δ with its sync events, and several runs in one
figure (``frugalrl plots RUN RUN ... --out FILE``), drawn from real short CartPole runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from frugalrl.algos.ppo import PPOConfig, train
from frugalrl.cli import main
from frugalrl.plots import (
    KL_MAX,
    KL_MEAN,
    SYNCS,
    _sync_events,
    aaps_delta,
    aaps_lag_guard,
    differing_keys,
    make_overlay,
    make_plots,
    run_labels,
)
from frugalrl.runs import read_metrics

TINY = dict(env="CartPole-v1", workers=2, envs_per_worker=4, num_steps=32, num_minibatches=1, update_epochs=10,
            learning_rate=1e-3, gamma=0.98, gae_lambda=0.8, ent_coef=0.0, backend="serial", seed=1,
            progress=False, tensorboard=False, plots=False, eval_episodes=2)
RUN_PNGS = {"return_vs_steps.png", "return_vs_time.png", "syncs_per_worker.png", "bytes_by_kind.png",
            "bytes_per_step.png"}


def _train(root: Path, name: str, **overrides) -> Path:
    summary = train(PPOConfig(**{**TINY, **overrides}, run_dir=str(root), run_name=name))
    return Path(summary["run_dir"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Real runs: a δ sweep of AAPS (the second drawing its plots at the end of training), a sync-every-update
    run, one AAPS update (no KL measured yet), and a plain Gymnasium vector env (no wire at all)."""
    root = tmp_path_factory.mktemp("runs")
    return {
        "aaps_small": _train(root, "aaps_small", sync="aaps", kl_threshold=0.01, total_timesteps=3072),
        "aaps_large": _train(root, "aaps_large", sync="aaps", kl_threshold=0.05, total_timesteps=3072, plots=True),
        "every": _train(root, "every", sync="every", total_timesteps=1024),
        "one_update": _train(root, "one_update", sync="aaps", total_timesteps=256),
        "gym": _train(root, "gym", vector_env="gym", total_timesteps=1024),
    }


def _png(path: Path) -> None:
    assert path.exists(), path
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, (path, len(data))


def test_aaps_run_draws_bytes_per_step_and_kl_vs_delta(runs, tmp_path):
    rows = read_metrics(runs["aaps_small"])
    assert any(KL_MEAN in r for r in rows), "an AAPS run logs its KL estimate"
    events = _sync_events(rows)
    assert sum(n for _, n in events) == [r for r in rows if SYNCS in r][-1][SYNCS] > 2
    assert any(r.get(KL_MEAN, 0) > 0.01 for r, _ in events), "some syncs are the KL going over δ"

    written = make_plots(runs["aaps_small"], tmp_path / "pngs")
    assert {p.name for p in written} == RUN_PNGS | {"kl_vs_delta.png"}
    assert all(p.parent == tmp_path / "pngs" for p in written)
    for p in written:
        _png(p)


def test_training_draws_the_new_plots_at_the_end(runs):
    names = {p.name for p in (runs["aaps_large"] / "plots").iterdir()}
    assert names == RUN_PNGS | {"kl_vs_delta.png"}
    for name in ("bytes_per_step.png", "kl_vs_delta.png"):
        _png(runs["aaps_large"] / "plots" / name)


def test_runs_without_the_data_skip_those_plots(runs, tmp_path):
    every = {p.name for p in make_plots(runs["every"])}
    assert every == RUN_PNGS  # bytes, but no AAPS: no KL plot
    one = {p.name for p in make_plots(runs["one_update"])}
    assert not any(KL_MEAN in r for r in read_metrics(runs["one_update"]))
    assert "kl_vs_delta.png" not in one and "bytes_per_step.png" in one
    gym = {p.name for p in make_plots(runs["gym"])}
    assert gym == {"return_vs_steps.png", "return_vs_time.png"}  # no ClusterEnv: nothing on a wire

    # A run directory with a config and nothing else (a run killed before its first update).
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(runs["aaps_small"] / "config.json", bare / "config.json")
    assert make_plots(bare) == []
    # Metrics from before the wire columns existed: a KL plot needs KL, a bytes plot bytes.
    old = tmp_path / "old"
    shutil.copytree(runs["aaps_small"], old)
    rows = [{k: v for k, v in r.items() if not k.startswith(("syncs/", "bytes/"))} for r in read_metrics(old)]
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = {p.name for p in make_plots(old)}
    assert "kl_vs_delta.png" not in names and "bytes_per_step.png" not in names and "return_vs_steps.png" in names


def test_kl_plot_draws_per_worker_kl_and_bytes_by_kind(runs):
    """A ClusterEnv run logs ``syncs/kl_max``, ``syncs/kl/<w>`` and ``bytes/<kind>`` for every kind that moved;
    the KL and bytes plots draw them."""
    rows = read_metrics(runs["aaps_small"])
    kl_rows = [r for r in rows if KL_MEAN in r]
    assert kl_rows and all(KL_MAX in r and r[KL_MAX] >= r[KL_MEAN] for r in kl_rows)
    assert any("syncs/kl/0" in r and "syncs/kl/1" in r for r in kl_rows)
    assert any("bytes/observations" in r for r in rows)
    written = {p.name: p for p in make_plots(runs["aaps_small"])}
    _png(written["kl_vs_delta.png"])
    _png(written["bytes_per_step.png"])


def test_overlay_labels_runs_by_the_config_key_that_differs(runs, tmp_path):
    sweep = [runs["aaps_small"], runs["aaps_large"]]
    assert run_labels(sweep) == ["kl_threshold=0.01", "kl_threshold=0.05"]
    _png(make_overlay(sweep, tmp_path / "sweep.png"))
    _png(make_overlay(sweep, tmp_path / "named.png", labels=["small δ", "large δ"]))
    with pytest.raises(ValueError, match="labels"):
        make_overlay(sweep, tmp_path / "x.png", labels=["one"])
    # Rules that differ: the AAPS-only panel (KL) still draws, for the runs that have it.
    mixed = [runs["aaps_small"], runs["every"], runs["gym"]]
    labels = run_labels(mixed)
    assert len(set(labels)) == 3
    _png(make_overlay(mixed, tmp_path / "mixed.png"))


def test_labels_fall_back_to_directory_names(runs, tmp_path):
    assert differing_keys([{"a": 1, "run_name": "x", "_meta": {}}, {"a": 1, "run_name": "y", "_meta": {"t": 2}}]) == []
    twin = tmp_path / "twin"
    shutil.copytree(runs["aaps_small"], twin)
    assert run_labels([runs["aaps_small"], twin]) == ["aaps_small", "twin"]  # same config


def test_delta_from_config_or_summary():
    assert aaps_delta({"sync": "aaps", "kl_threshold": 0.02}) == 0.02
    assert aaps_delta({"sync": "every", "kl_threshold": 0.02}) is None
    assert aaps_delta({}, {"details": {"sync_rule": "aaps(0.1, lag<=20)"}}) == 0.1
    assert aaps_delta({}, {"details": {"sync_rule": "aaps(0.03)"}}) == 0.03
    assert aaps_delta({}, {}) is None


def test_lag_guard_is_the_one_the_run_applied():
    """The summary's rule names the guard a run used (a share of a short run's updates), config.json the field."""
    assert aaps_lag_guard({"max_policy_lag": 20}, {"details": {"sync_rule": "aaps(0.05, lag<=1)"}}) == 1
    assert aaps_lag_guard({"max_policy_lag": 20}, {}) == 20
    assert aaps_lag_guard({"max_policy_lag": None}, {"details": {"sync_rule": "aaps(0.05)"}}) is None


def test_cli_one_run_or_an_overlay(runs, tmp_path, monkeypatch, capsys):
    a, b = str(runs["aaps_small"]), str(runs["aaps_large"])
    assert main(["plots", a]) == 0  # as before: into RUN/plots
    assert "kl_vs_delta.png" in capsys.readouterr().out
    assert main(["plots", a, "--out", str(tmp_path / "pngs")]) == 0
    assert (tmp_path / "pngs" / "bytes_per_step.png").exists()

    assert main(["plots", a, b, "--out", str(tmp_path / "sweep.png")]) == 0
    assert capsys.readouterr().out.strip().endswith("sweep.png")
    _png(tmp_path / "sweep.png")
    monkeypatch.chdir(tmp_path)
    assert main(["plots", a, b, "--label", "small", "--label", "large"]) == 0
    _png(tmp_path / "overlay.png")
    assert main(["plots", a, b, "--out", str(tmp_path / "pngs")]) == 0  # a folder: overlay.png in it
    _png(tmp_path / "pngs" / "overlay.png")

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plots", str(empty), str(empty)]) == 2
    assert "has metrics" in capsys.readouterr().err
    assert main(["plots", a, str(tmp_path / "missing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
