"""frugalrl.scale_model: the figures it reads from a run, its predictions, and `frugalrl scale-model`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frugalrl.cli import main
from frugalrl.scale_model import Pacing, RunFigures, StepCost, contention, predict, saturation


def summary(workers: int = 2, syncs: int = 20, updates: int = 10, link_bytes: float = 1.0) -> dict:
    """A PPO summary as training writes it: 2 workers × 4 envs × 128 steps, 10 iterations."""
    steps = updates * workers * 4 * 128
    return {"algo": "ppo", "env_steps": steps, "updates": updates, "resumes": [],
            "weight_syncs": {"total": syncs},
            "bytes": {"up": {"observations": 30 * steps, "control": 2 * steps},
                      "down": {"weights": syncs * 10_000, "control": steps}},
            "details": {"workers": workers, "envs_per_worker": 4, "num_steps": 128, "rollout_seconds": 2.0,
                        "learner_update_seconds": 1.0}}


def test_figures_are_read_per_worker_and_step():
    f = RunFigures.from_summary(summary())
    assert f.env_steps_per_worker_iter == 512
    assert f.up_bytes_per_step == 30 and f.down_bytes_per_step == 0  # headers (control) are per message
    assert f.up_bytes_per_worker_iter == 2 * 512 and f.down_bytes_per_worker_iter == 512
    assert f.weight_bytes_per_sync == 10_000 and f.syncs_per_worker_iter == 1.0
    assert f.rollout_s_per_iter == pytest.approx(0.2)
    assert f.update_s_per_sample == pytest.approx(1.0 / 10_240)


def test_each_workers_first_full_copy_is_paid_once_per_run():
    """With deltas a worker's first sync is a full copy and the rest are smaller: the model keeps the first copy (F)
    apart, spread over the iterations of the run it predicts, and left out of the steady state."""
    run = summary(syncs=6, updates=10)  # 2 workers: 2 first copies of 10 kB, then 4 deltas of 2.5 kB
    run["weight_syncs"]["full_bytes"] = 10_000
    run["bytes"]["down"]["weights"] = 2 * 10_000 + 4 * 2_500
    f = RunFigures.from_summary(run)
    assert (f.first_copy_bytes, f.weight_bytes_per_sync, f.syncs_per_worker_iter) == (10_000, 2_500, 0.2)
    ten, steady = predict(f, 8, None, iterations=10), predict(f, 8, None)
    assert ten["down_bytes_per_iter"] - steady["down_bytes_per_iter"] == pytest.approx(8 * 10_000 / 10)
    assert ten["down_bytes_per_iter"] == pytest.approx(4 * run["bytes"]["down"]["weights"] / 10 + 4 * 2 * 512)
    assert saturation(f, step_rate=1000.0)["bytes_per_env_step"]["down"] == pytest.approx(1 + 0.2 * 2_500 / 512)


def test_prediction_adds_transfers_compute_and_update():
    f = RunFigures.from_summary(summary(syncs=5))  # AAPS: a quarter of every-update's syncs
    p = predict(f, 8, link_gbit=0.01)
    up, down = 8 * 512 * 32, 8 * (512 * 1 + 0.25 * 10_000)
    assert (p["up_bytes_per_iter"], p["down_bytes_per_iter"]) == (up, down)
    assert p["link_s"] == pytest.approx((up + down) * 8 / 1e7)
    assert p["update_s"] == pytest.approx(8 * 512 / 10_240)
    assert p["s_per_iter"] == pytest.approx(p["link_s"] + 0.2 + p["update_s"])
    # workers sharing 2 cores step 8/2 = 4 times slower than 2 workers on them
    assert predict(f, 8, None, worker_cores=2)["rollout_compute_s"] == pytest.approx(0.8)


def test_the_same_envs_on_more_workers_move_more_weights_and_headers_only():
    """Experience scales with the envs; each worker's weights messages and message headers do not."""
    f = RunFigures.from_summary(summary())
    two, eight = predict(f, 2, 0.01, worker_cores=2), predict(f, 8, 0.01, worker_cores=2, env_scale=0.25)
    assert eight["up_bytes_per_iter"] - two["up_bytes_per_iter"] == pytest.approx(6 * 2 * 512)
    assert eight["down_bytes_per_iter"] - two["down_bytes_per_iter"] == pytest.approx(6 * (10_000 + 512))
    assert eight["rollout_compute_s"] == pytest.approx(two["rollout_compute_s"])  # the same env steps on 2 cores
    assert eight["update_s"] == pytest.approx(two["update_s"])


def test_a_shaped_runs_own_transfers_leave_its_compute_time():
    link = 0.01  # 10 Mbit/s: 0.043 s of the 0.2 s rollout are transfers
    f = RunFigures.from_summary(summary(), link_gbit=link)
    up, down = f.bytes_per_iter(2)
    assert f.rollout_compute_s() == pytest.approx(0.2 - (up + down) * 8 / 1e7)
    assert predict(f, 2, link)["s_per_iter"] == pytest.approx(0.2 + 1024 / 10_240)  # itself, back again


def test_latency_is_one_round_trip_an_iteration_syncs_or_not():
    """The weights ride in the rollout request: every-update syncs and AAPS's rare ones wait for the same single
    round trip an iteration, at any worker count; a run's own latency leaves its compute time as its transfers do."""
    every = RunFigures.from_summary(summary(syncs=20))  # q = 1
    rare = RunFigures.from_summary(summary(syncs=2))  # q = 0.1
    rtt = 0.02
    for fig in (every, rare):
        for n in (1, 16):
            assert predict(fig, n, None, rtt_s=rtt)["latency_s"] == rtt
    assert (predict(every, 4, None, rtt_s=rtt)["s_per_iter"] - predict(every, 4, None)["s_per_iter"]
            == pytest.approx(rtt))
    delayed = RunFigures.from_summary(summary(), rtt_s=rtt)
    assert delayed.rollout_compute_s() == pytest.approx(0.2 - rtt)
    assert predict(delayed, 2, None, rtt_s=rtt)["s_per_iter"] == pytest.approx(0.2 + 1024 / 10_240)  # itself


def test_serving_moves_from_the_rollout_to_a_per_sample_term():
    """Serving measured elsewhere leaves the measured rollout, then grows with the samples; the core saturates
    on serving and update together."""
    f = replace(RunFigures.from_summary(summary()), serve_s_per_sample=1e-5)  # 10 µs: 0.01 s of the 0.2 s
    assert f.rollout_compute_s() == pytest.approx(0.2 - 1024 * 1e-5)
    assert predict(f, 2, None)["s_per_iter"] == pytest.approx(0.2 + 1024 / 10_240)  # the measured run, back
    p = predict(f, 64, None)
    assert p["serve_s"] == pytest.approx(64 * 512 * 1e-5)
    assert p["s_per_iter"] == pytest.approx(p["rollout_compute_s"] + p["serve_s"] + p["update_s"])
    s = saturation(f, step_rate=1000.0)
    assert s["workers_at_core_saturation"] == pytest.approx(1 / ((1 / 10_240 + 1e-5) * 1000))


def test_an_overlapped_rollout_hides_behind_the_update_or_the_update_behind_it():
    """IMPALA's rollout thread: an iteration is the longer of the rollout and the learner core's serving + update."""
    f = replace(RunFigures.from_summary(summary()), serve_s_per_sample=1e-5)
    for n in (2, 64):
        seq, ovl = predict(f, n, None), predict(f, n, None, overlap=True)
        rollout = ovl["link_s"] + ovl["rollout_compute_s"] + ovl["serve_s"]
        assert ovl["s_per_iter"] == pytest.approx(max(rollout, ovl["serve_s"] + ovl["update_s"]))
        assert ovl["s_per_iter"] < seq["s_per_iter"]
    # at 2 workers the rollout (0.2 s) is longer than the learner's 0.1 s; at 64, the update is the longer
    assert predict(f, 2, None, overlap=True)["s_per_iter"] == pytest.approx(0.2)
    p = predict(f, 64, None, overlap=True)
    assert p["s_per_iter"] == pytest.approx(p["serve_s"] + p["update_s"])


def test_an_update_fitted_on_two_batch_sizes_splits_fixed_and_per_sample():
    small = RunFigures.from_summary(summary(workers=2))  # 1024 samples per iteration, 0.1 s of update
    big = RunFigures.from_summary({**summary(workers=8), "details": {**summary()["details"], "workers": 8,
                                                                       "learner_update_seconds": 1.6}})
    fit = small.with_update_fit(big)  # 0.16 s per iteration on 4096 samples: 0.08 s fixed + 0.08 s per 4096
    assert fit.update_s_per_iter == pytest.approx(0.08) and fit.update_s_per_sample == pytest.approx(0.02 / 1024)
    assert predict(fit, 2, None)["update_s"] == pytest.approx(0.1)  # both runs, back again
    assert predict(fit, 8, None)["update_s"] == pytest.approx(0.16)
    assert predict(fit, 64, None)["update_s"] < predict(small, 64, None)["update_s"]  # linear: an upper bound
    s = saturation(fit, step_rate=512 / 0.2)  # 0.2 s per iteration's rollout: the fixed part takes 40 % of it
    assert s["learner_core_share_fixed"] == pytest.approx(0.4)
    assert s["workers_at_core_saturation"] == pytest.approx(0.6 / (0.02 / 1024 * 512 / 0.2))
    with pytest.raises(ValueError, match="different batch sizes"):
        small.with_update_fit(small)


def test_aaps_downlink_has_its_lag_guards_floor():
    """A worker syncs at least once every L updates (AAPS's guard): the model gives the downlink at that rate beside
    the measured one; runs from before the bound was recorded give it in their rule's description."""
    run = summary(syncs=8, updates=10)  # 0.4 syncs per worker per iteration
    aaps = RunFigures.from_summary({**run, "weight_syncs": {"total": 8, "lag_bound": 5}})
    assert aaps.lag_bound == 5 and aaps.sync_floor() == pytest.approx(0.2)
    p = predict(aaps, 16, None)
    assert p["down_bytes_per_iter_floor"] == pytest.approx(p["down_bytes_per_iter"] - 16 * 0.2 * 10_000)
    old = {**run, "details": {**run["details"], "sync_rule": "aaps(0.05, lag<=20)"}}
    assert RunFigures.from_summary(old).lag_bound == 20
    every = {**run, "details": {**run["details"], "sync_rule": "every"}}
    f = RunFigures.from_summary(every)
    assert f.lag_bound == 1 and f.sync_floor() == f.syncs_per_worker_iter  # never below the measured rate
    assert RunFigures.from_summary(run).sync_floor() == 0.0  # no bound known: no floor
    p = predict(RunFigures.from_summary(run), 4, None)
    assert p["down_bytes_per_iter_floor"] == pytest.approx(p["down_bytes_per_iter"] - 4 * 0.4 * 10_000)


def test_saturation_counts():
    f = RunFigures.from_summary(summary())
    s = saturation(f, step_rate=1000.0, links_gbit=(10.0,))
    down = 1 + 10_000 / 512
    assert s["bytes_per_env_step"] == {"up": 32, "down": pytest.approx(down)}
    assert s["workers_at_link_saturation"]["10gbit"] == pytest.approx(10e9 / 8 / (1000 * 32))
    assert s["workers_at_core_saturation"] == pytest.approx(10_240 / 1000)
    assert contention(1, 2) == 1.0 and contention(8, 2) == 4.0 and contention(8, None) == 1.0


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(0, 40))
def test_bytes_grow_linearly_and_time_never_falls(n: int, m: int, syncs: int):
    f = RunFigures.from_summary(summary(syncs=syncs), link_gbit=1.0)
    a, b = predict(f, n, 1.0, worker_cores=2), predict(f, n + m, 1.0, worker_cores=2)
    assert b["up_bytes_per_iter"] == pytest.approx(a["up_bytes_per_iter"] * (n + m) / n)
    assert b["s_per_iter"] >= a["s_per_iter"]


def test_runs_it_cannot_model_say_why():
    with pytest.raises(ValueError, match="PPO or IMPALA run"):
        RunFigures.from_summary({**summary(), "algo": "hsa2c"})
    old = summary()
    del old["details"]["rollout_seconds"]
    with pytest.raises(ValueError, match="rollout_seconds"):
        RunFigures.from_summary(old)
    with pytest.raises(ValueError, match="resumed"):
        RunFigures.from_summary({**summary(), "resumes": [{"at": 5}]})


def test_cli_on_a_real_run(tmp_path, capsys):
    """A short PPO run through ClusterEnv, then `frugalrl scale-model` on its directory."""
    assert main(["train", "ppo", "--env", "CartPole-v1", "--backend", "serial", "--workers", "2",
                 "--envs-per-worker", "2", "--num-steps", "64", "--total-timesteps", "1024", "--eval-episodes", "1",
                 "--run-dir", str(tmp_path), "--run-name", "r", "--no-progress", "--no-tensorboard",
                 "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["scale-model", str(tmp_path / "r"), "--workers", "2", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    f = out["figures"]
    assert f["workers"] == 2 and f["env_steps_per_worker_iter"] == 128
    assert 0.0 <= f["syncs_per_worker_iter"] <= 1.0  # AAPS, the default: at most one sync per update
    assert f["first_copy_bytes"] > 0 and f["iterations"] == 4  # bf16 words of the actor, the default
    two, many = out["predictions"]
    assert many["up_bytes_per_iter"] == pytest.approx(32 * two["up_bytes_per_iter"])
    assert 1 <= f["lag_bound"] <= 20  # AAPS's guard (a share of a run this short)
    assert main(["scale-model", str(tmp_path / "r"), "--workers", "8", "--serve-us-per-step", "1.5"]) == 0
    printed = capsys.readouterr().out
    assert "saturates" in printed and ("down floor" in printed) == (f["syncs_per_worker_iter"] > 1 / f["lag_bound"])
    assert main(["scale-model", str(tmp_path / "r"), "--workers", "8", "--rtt-ms", "40", "--json"]) == 0
    far = json.loads(capsys.readouterr().out)["predictions"][0]
    assert far["latency_s"] == 0.04 and far["link_s"] >= 0.04  # one round trip an iteration, in the link's time
    link_rtt = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "link_rtt.json"
    assert main(["scale-model", str(tmp_path / "r"), "--workers", "8", "--rtt-ms", "40", "--pacing",
                 f"{link_rtt}:tcp-cubic", "--json"]) == 0
    paced = json.loads(capsys.readouterr().out)["predictions"][0]
    assert paced["pacing_s"] > 0 and paced["latency_s"] == pytest.approx(0.04 + paced["pacing_s"])
    step_cost = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "worker_step_cost.json"
    assert main(["scale-model", str(tmp_path / "r"), "--workers", "2", "8", "--same-total-envs", "--step-cost",
                 str(step_cost), "--json"]) == 0
    own, spread = json.loads(capsys.readouterr().out)["predictions"]
    assert spread["rollout_compute_s"] > own["rollout_compute_s"] / 4  # a quarter of the envs, more of the time
    assert main(["scale-model", str(tmp_path / "r"), "--pacing", str(tmp_path / "r" / "summary.json")]) == 2
    assert "is not a readable link_rtt.py result" in capsys.readouterr().err
    assert main(["train", "ppo", "--env", "CartPole-v1", "--backend", "serial", "--workers", "4",
                 "--envs-per-worker", "2", "--num-steps", "64", "--total-timesteps", "2048", "--eval-episodes", "1",
                 "--run-dir", str(tmp_path), "--run-name", "r4", "--no-progress", "--no-tensorboard",
                 "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["scale-model", str(tmp_path / "r"), "--update-fit-run", str(tmp_path / "r4"), "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)["figures"]
    assert fitted["update_s_per_iter"] >= 0.0 and fitted["update_s_per_sample"] >= 0.0
    assert main(["scale-model", str(tmp_path / "r"), "--update-fit-run", str(tmp_path / "r4"),
                 "--step-rate", "1e9"]) == 0  # a rollout far shorter than any update: the core is the limit
    assert "learner's link saturates" in (printed := capsys.readouterr().out) and "its core" in printed
    assert main(["scale-model", str(tmp_path / "missing")]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_an_impala_run_is_modelled_with_its_overlapped_loop(tmp_path, capsys):
    """IMPALA's summary carries its rollouts and its loop: the model takes the longer of rollout and update unless
    told otherwise."""
    assert main(["train", "impala", "--env", "CartPole-v1", "--backend", "serial", "--workers", "2",
                 "--envs-per-worker", "2", "--num-steps", "32", "--total-timesteps", "512", "--eval-episodes", "1",
                 "--run-dir", str(tmp_path), "--run-name", "i", "--no-progress", "--no-tensorboard",
                 "--no-plots"]) == 0
    details = json.loads((tmp_path / "i" / "summary.json").read_text())["details"]
    assert details["overlap"] is True and details["rollouts"] == 512 // 128 and details["rollout_seconds"] > 0
    capsys.readouterr()
    assert main(["scale-model", str(tmp_path / "i"), "--workers", "2", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fig = RunFigures(**out["figures"])
    assert fig.overlap and fig.env_steps_per_worker_iter == 64
    for p in out["predictions"]:
        rollout = p["link_s"] + p["rollout_compute_s"] + p["serve_s"]
        assert p["s_per_iter"] == pytest.approx(max(rollout, p["serve_s"] + p["update_s"]))
        assert predict(fig, p["workers"], 10.0, overlap=False)["s_per_iter"] >= p["s_per_iter"]
    assert main(["scale-model", str(tmp_path / "i"), "--workers", "8"]) == 0
    assert "rollout thread" in capsys.readouterr().out


def test_the_shaped_links_check_reads_a_delay_by_its_seconds():
    """``shaped_links.py --model-from-delay 0ms`` models a file whose runs say ``0`` (it once matched nothing and
    printed an empty model); a delay no run has is an error, not an empty model."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import shaped_links
    finally:
        sys.path.remove(str(bench))
    runs = json.loads((bench / "results" / "shaped_links_delay_round3.json").read_text())["runs"]
    by_string = shaped_links.model_check(runs, "0")
    assert len(by_string) == len(runs) and shaped_links.model_check(runs, "0ms") == by_string
    with pytest.raises(ValueError, match="no run has the delay to model from"):
        shaped_links.model_check(runs, "5ms")


def test_pacing_adds_the_round_trips_of_each_direction_by_message_size():
    """Each iteration's reply at its size, and its request with the weights inside as often as any worker syncs
    (the iteration waits for the slowest), take the measured extra round trips (linear between the measured sizes,
    flat past the largest); the measured run's own pacing is taken out of its compute."""
    pacing = Pacing((10_000.0, 30_000.0), (0.2, 0.5))
    assert pacing.extra(0) == 0.0 and pacing.extra(-5) == 0.0 and pacing.extra(5_000) == pytest.approx(0.1)
    assert pacing.extra(20_000) == pytest.approx(0.35) and pacing.extra(1e9) == 0.5
    rtt = 0.04
    for syncs, n in ((20, 4), (2, 1), (2, 16)):  # q = 1, and q = 0.1 with one worker or sixteen
        fig = RunFigures.from_summary(summary(syncs=syncs))
        q = fig.syncs_per_worker_iter
        reply = fig.bytes_per_iter(1)[0]
        request = fig.bytes_per_iter(1, syncs_per_worker_iter=0.0)[1]
        any_sync = 1 - (1 - q) ** n
        expected = rtt * (pacing.extra(reply) + any_sync * pacing.extra(request + fig.weight_bytes_per_sync)
                          + (1 - any_sync) * pacing.extra(request))
        plain, paced = predict(fig, n, None, rtt_s=rtt), predict(fig, n, None, rtt_s=rtt, pacing=pacing)
        assert paced["pacing_s"] == pytest.approx(expected) and expected > 0
        assert paced["s_per_iter"] == pytest.approx(plain["s_per_iter"] + expected)
        assert predict(fig, n, None, pacing=pacing)["pacing_s"] == 0.0  # no delay, nothing to pace over
    assert predict(fig, 16, None, rtt_s=rtt, pacing=pacing)["pacing_s"] > predict(
        fig, 1, None, rtt_s=rtt, pacing=pacing)["pacing_s"]  # more workers: some worker's request carries weights
    delayed = replace(fig, rtt_s=rtt)
    assert predict(delayed, fig.workers, None, rtt_s=rtt, pacing=pacing)["s_per_iter"] == pytest.approx(
        predict(delayed, fig.workers, None, rtt_s=rtt)["s_per_iter"])  # the measured run predicts itself either way


def test_pacing_is_read_from_a_link_rtt_file_and_refuses_what_it_cannot_use(tmp_path):
    """Rows of the chosen transport, one size's rows averaged; a colon inside the file's path is not a transport;
    a file that is not a link_rtt.py result, a missing transport or sizes out of order are one clear error."""
    folder = tmp_path / "a:b"
    folder.mkdir()
    path = folder / "rtt.json"
    rows = [{"transport": "tcp-bbr", "size": 16_000, "back_to_back_extra_rtt": 0.3},
            {"transport": "tcp-bbr", "size": 1_000, "back_to_back_extra_rtt": 0.02},
            {"transport": "tcp-bbr", "size": 16_000, "back_to_back_extra_rtt": 0.4},
            {"transport": "ray", "size": 1_000, "back_to_back_extra_rtt": -0.01}]
    path.write_text(json.dumps({"rows": rows}))
    assert Pacing.parse(str(path)) == Pacing((1_000.0, 16_000.0), (0.02, 0.35))
    assert Pacing.parse(f"{path}:ray") == Pacing((1_000.0,), (0.0,))  # a negative extra is none
    with pytest.raises(ValueError, match="no rows of transport 'quic'"):
        Pacing.parse(f"{path}:quic")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(ValueError, match="empty.json is not a readable link_rtt.py result"):
        Pacing.from_link_rtt(tmp_path / "empty.json")
    with pytest.raises(ValueError, match="is not a readable link_rtt.py result"):
        Pacing.from_link_rtt(tmp_path)  # a folder
    with pytest.raises(ValueError, match="increasing positive sizes"):
        Pacing((2.0, 1.0), (0.1, 0.2))


def test_a_step_cost_keeps_a_worker_of_fewer_envs_from_being_proportionally_faster(tmp_path):
    """With a + b·k per step, the same envs over four times the workers cost each worker (a + b·k/4) / (a + b·k) of
    its compute, not a quarter; with no fixed part it is a quarter again, as without a step cost."""
    fig = RunFigures.from_summary(summary())  # 4 envs per worker
    assert fig.envs_per_worker == 4
    cost = StepCost(fixed_s=30e-6, per_env_s=10e-6)
    base = fig.rollout_compute_s()
    quarter = predict(fig, 8, None, worker_cores=None, env_scale=0.25)["rollout_compute_s"]
    costed = predict(fig, 8, None, worker_cores=None, env_scale=0.25, step_cost=cost)["rollout_compute_s"]
    assert quarter == pytest.approx(base / 4)
    assert costed == pytest.approx(base * (30 + 10 * 1) / (30 + 10 * 4))
    shared = predict(fig, 8, None, worker_cores=2, env_scale=0.25, step_cost=cost)["rollout_compute_s"]
    assert shared == pytest.approx(costed * 4)  # 8 workers on 2 cores against the measured 2 on 2: 4× the time
    flat = StepCost(fixed_s=0.0, per_env_s=10e-6)
    assert predict(fig, 8, None, env_scale=0.25, step_cost=flat)["rollout_compute_s"] == pytest.approx(quarter)
    assert predict(fig, 2, None, step_cost=cost)["s_per_iter"] == pytest.approx(predict(fig, 2, None)["s_per_iter"])
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"fixed_s_per_step": 3e-5, "s_per_env_step": 1e-5}))
    assert StepCost.from_json(path) == cost
    path.write_text("{}")
    with pytest.raises(ValueError, match="is not a readable worker_step_cost.py result"):
        StepCost.from_json(path)
    with pytest.raises(ValueError, match="per_env_s > 0"):
        StepCost(1e-5, 0.0)


def test_the_step_cost_benchmark_fits_a_line_through_its_points():
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import worker_step_cost
    finally:
        sys.path.remove(str(bench))
    assert worker_step_cost.fit([(1, 3.0), (2, 5.0), (4, 9.0)]) == pytest.approx((1.0, 2.0))
    stored = json.loads((bench / "results" / "worker_step_cost.json").read_text())
    a, b = worker_step_cost.fit([(p["envs"], p["s_per_step"]) for p in stored["points"]])
    assert (a, b) == pytest.approx((stored["fixed_s_per_step"], stored["s_per_env_step"]))
