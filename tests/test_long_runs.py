"""What a days-long run accumulates: its metrics file (millions of rows) is cut at a resume and drawn by the plots
line by line, never read into memory whole; the stall watch keeps only the updates it judges on."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from frugalrl.runs import RunDirectory, keep_metrics_to, read_metrics, read_metrics_thinned
from frugalrl.sync_state import StallWatch


def _write_rows(path: Path, steps: list[int], evals: set[int] = frozenset(), torn: bool = False) -> None:
    with open(path, "w") as f:
        for i, step in enumerate(steps):
            row = {"step": step, "time": i * 0.5, "train/episode_return": float(i)}
            if i in evals:
                row = {"step": step, "time": i * 0.5, "eval/return_mean": 100.0 + i}
            f.write(json.dumps(row) + "\n")
        if torn:
            f.write('{"step": 99999999, "time": 1.0, "train/epi')


def test_a_resume_keeps_the_rows_up_to_its_step_and_drops_a_torn_line(tmp_path):
    steps = [64 * i for i in range(1, 501)]
    _write_rows(tmp_path / "metrics.jsonl", steps, evals={10, 20}, torn=True)
    RunDirectory(tmp_path, {}, tensorboard=False, resume_step=64 * 300).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == steps[:300]
    assert not list(tmp_path.glob(".metrics.jsonl.*"))  # the new file replaced the old one


def test_cutting_a_large_metrics_file_holds_one_line_at_a_time(tmp_path):
    """200,000 rows (~14 MB): the cut allocates a few kilobytes at its peak, not the file."""
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, list(range(200_000)))
    tracemalloc.start()
    keep_metrics_to(path, 150_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak
    with open(path) as f:
        lines = f.readlines()
    assert len(lines) == 150_001 and json.loads(lines[-1])["step"] == 150_000


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), max_rows=st.integers(1, 200), evals=st.sets(st.integers(0, 2999), max_size=20),
       torn=st.booleans())
def test_thinned_metrics_spread_evenly_and_keep_evaluations_and_the_last_row(tmp_path_factory, n, max_rows, evals,
                                                                            torn):
    run = tmp_path_factory.mktemp("run")
    evals = {e for e in evals if e < n}
    _write_rows(run / "metrics.jsonl", list(range(n)), evals, torn)
    rows = read_metrics_thinned(run, max_rows)
    every = read_metrics(run)
    assert rows == [r for r in every if r in rows]  # in file order, each a row of the file
    assert [r for r in rows if "eval/return_mean" in r] == [r for r in every if "eval/return_mean" in r]
    training = [r["step"] for r in rows if "eval/return_mean" not in r]
    all_training = [r["step"] for r in every if "eval/return_mean" not in r]
    assert len(training) <= max_rows + 1 and (not all_training or training[-1] == all_training[-1])
    if len(all_training) <= max_rows:
        assert training == all_training
    else:  # every k-th training row (k a power of two), then the last: at least half of max_rows
        at = [all_training.index(step) for step in training[:-1]]
        assert at[0] == 0 and len({b - a for a, b in zip(at, at[1:], strict=False)}) <= 1
        assert len(training) >= max_rows // 2


def test_the_stall_watch_keeps_two_windows_of_updates():
    watch = StallWatch(window=10)
    for i in range(10_000):
        watch.observe(i, lag=1.0, train_return=float(i), rule="aaps")
    assert len(watch.lags) == len(watch.returns) == 20 and watch.updates == 10_000


def test_both_readers_keep_a_whole_last_row_without_its_newline_and_drop_a_torn_one(tmp_path):
    assert read_metrics(tmp_path) == read_metrics_thinned(tmp_path) == []  # no file yet
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}')  # a blank line; the last row whole, its newline not yet written
    assert read_metrics(tmp_path) == read_metrics_thinned(tmp_path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"step": 2, "tr')
    assert read_metrics(tmp_path) == read_metrics_thinned(tmp_path) == [{"step": 1}]
