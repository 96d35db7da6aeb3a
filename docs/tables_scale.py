"""The scale model's check against real runs on emulated hosts (``benchmarks/shaped_links.py --workers ...``):
what :mod:`frugalrl.scale_model` predicted from the smallest run, against what each run measured. Registered by
``docs/gen_tables.py`` as the ``scale_model`` bench."""

from __future__ import annotations

from collections.abc import Callable

from table_model import Cell, Source, Table


def t_scale_model(arg: str) -> list[Table]:
    """One row per run: seconds and bytes per iteration, predicted and measured, and the prediction's error."""
    s = Source(arg)
    floor = all("down_bytes_per_iter_floor" in m["predicted"] for m in s("model"))  # models since 2026-11-30
    rows: list[list[Cell]] = []
    for i, m in enumerate(s("model")):
        p, q, e = ("model", i, "predicted"), ("model", i, "measured"), ("model", i, "error")
        row: list[Cell] = [[m["rate"]], [m["sync"]], [str(m["workers"])], [str(m["from_workers"])]]
        for key, fmt, scale in (("s_per_iter", ".2f", 1.0), ("up_bytes_per_iter", ".0f", 1e-3),
                                ("down_bytes_per_iter", ".0f", 1e-3)):
            row += [[s.num(*p, key, fmt=fmt, scale=scale)], [s.num(*q, key, fmt=fmt, scale=scale)],
                    [s.num(*e, key, fmt="+.0%")]]
        if floor:  # the downlink at the sync rule's lag-guard rate: what fewer syncs can come down to
            row.insert(-2, [s.num(*p, "down_bytes_per_iter_floor", fmt=".0f", scale=1e-3)])
        rows.append(row)
    header = ["link", "sync", "workers", "predicted from", "s/iter: model", "measured", "error",
              "up kB/iter: model", "measured", "error", "down kB/iter: model", *(["guard floor"] if floor else []),
              "measured", "error"]
    return [Table(header, rows, sources=[s.name], commands=[s.command()], align="lllr" + "r" * (len(header) - 4))]


def t_scale_model_paced(arg: str) -> list[Table]:
    """The scale model against the head at many paced emulated workers (``learner_capacity.py --pace``): seconds
    per iteration measured, and the model's prediction from two unpaced runs (``--calibrate``), in its three forms."""
    s = Source(arg)
    rows: list[list[Cell]] = []
    for i, r in enumerate(s("rows")):
        c = ("rows", i, "model_check")
        row: list[Cell] = [[r["setting"]], [str(r["workers"])], [s.num("rows", i, "s_per_iter", fmt=".3f")]]
        for key in ("model", "model_linear_update", "model_before"):
            row += [[s.num(*c, key, "s_per_iter", fmt=".3f")], [s.num(*c, key, "error", fmt="+.0%")]]
        rows.append(row)
    header = ["setting", "workers", "measured s/iter", "model", "error", "linear update", "error",
              "before (no serving, linear)", "error"]
    return [Table(header, rows, sources=[s.name], commands=[s.command()], align="llrrrrrrr")]


def t_scale_model_parts(arg: str) -> list[Table]:
    """The scale model against real worker processes (``learner_capacity.py --backend local --pace worker``): the
    iteration's error split into its rollout (the workers' stepping and the head's serving) and its update."""
    s = Source(arg)
    rows: list[list[Cell]] = []
    for i, r in enumerate(s("rows")):
        c = ("rows", i, "model_check")
        rows.append([[r["setting"]], [str(r["workers"])], [s.num("rows", i, "s_per_iter", fmt=".3f")],
                     [s.num(*c, "model", "s_per_iter", fmt=".3f")], [s.num(*c, "model", "error", fmt="+.0%")],
                     [s.num(*c, "model", "rollout_error", fmt="+.0%")],
                     [s.num(*c, "measured_update_s_per_iter", fmt=".3f")],
                     [s.num(*c, "model", "update_s", fmt=".3f")], [s.num(*c, "model", "update_error", fmt="+.0%")],
                     [s.num(*c, "model", "up_bytes_error", fmt="+.1%")]])
    header = ["setting", "workers", "measured s/iter", "model", "error", "rollout's error", "update s: measured",
              "model", "error", "up bytes error"]
    return [Table(header, rows, sources=[s.name], commands=[s.command()], align="ll" + "r" * 8)]


def _cell(run: dict) -> tuple:
    """What tells a run (or its model row) from the others of a ``shaped_links.py`` file."""
    return run["rate"], run.get("delay", "0"), run["sync"], run["uplink"], run["workers"]


_MS = {"fmt": ".0f", "scale": 1e3}
_ERROR = {"fmt": "+.0%"}
_COUNT = {"fmt": "d"}


def _by_cell(files: list[Source], rows_of: int, columns: list[tuple[int, str, tuple, dict]],
             header: list[str], delayed_only: bool = False) -> list[Table]:
    """A table of ``shaped_links.py`` files' cells matched by setting: one row per run of ``files[rows_of]``
    (delay, sync, workers; ``delayed_only``: those with a delay), then per column ``(file, "runs", "model" or
    "model_paced", path in the row, format)``."""
    parts = {part for _, part, _, _ in columns} | {"runs"}
    index = [{part: {_cell(r): i for i, r in enumerate(f(part))} for part in parts if part in f.data} for f in files]
    rows: list[list[Cell]] = []
    for r in files[rows_of]("runs"):
        if delayed_only and r.get("delay", "0") == "0":
            continue
        row: list[Cell] = [[r["delay"]], [r["sync"]], [str(r["workers"])]]
        for f, part, path, fmt in columns:
            row.append([files[f].num(part, index[f][part][_cell(r)], *path, **fmt)])
        rows.append(row)
    return [Table(["one-way delay", "sync", "workers", *header], rows, sources=[f.name for f in files],
                  commands=[f.command() for f in files], align="lll" + "r" * len(columns))]


def t_link_latency(arg: str) -> list[Table]:
    """Link latency (``shaped_links.py --delays``): seconds per iteration with the weights in the rollout request
    (the first file) against weights sent on their own (the second, the same command before that change), and the
    model's prediction from the runs without delay."""
    files = [Source(name) for name in arg.split()]
    return _by_cell(files, 0, [(1, "runs", ("s_per_iter_median",), _MS), (0, "runs", ("s_per_iter_median",), _MS),
                               (0, "model", ("predicted", "s_per_iter"), _MS), (0, "model", ("error", "s_per_iter"), _ERROR),
                               (0, "runs", ("weight_syncs",), _COUNT)],
                    ["ms/iter, weights on their own", "ms/iter, weights in the request", "model (from no delay)",
                     "error", "syncs"])


def t_link_latency_rounds(arg: str) -> list[Table]:
    """Link latency in repeated rounds (``shaped_links.py --delays``, the same command run once per file): each
    cell's seconds per iteration and the model's error, round by round."""
    files = [Source(name) for name in arg.split()]
    n = range(len(files))
    return _by_cell(files, 0, [*((j, "runs", ("s_per_iter_median",), _MS) for j in n),
                               *((j, "model", ("error", "s_per_iter"), _ERROR) for j in n)],
                    [*(f"ms/iter, round {j + 1}" for j in n), *(f"model error, round {j + 1}" for j in n)])


def t_link_rtt(arg: str) -> list[Table]:
    """One request and its reply on a link with delay (``link_rtt.py``): milliseconds and the fraction of a round
    trip above it, back to back and after an idle spell, for raw TCP and Ray calls."""
    s = Source(arg)
    rows: list[list[Cell]] = []
    for i, r in enumerate(s("rows")):
        rows.append([[r["transport"]], [f"{r['size']:,}"],
                     [s.num("rows", i, "back_to_back_ms", fmt=".1f")], [s.num("rows", i, "back_to_back_extra_rtt", fmt="+.2f")],
                     [s.num("rows", i, "after_idle_ms", fmt=".1f")], [s.num("rows", i, "after_idle_extra_rtt", fmt="+.2f")]])
    header = ["transport", "request bytes", "ms, back to back", "round trips above one", "ms, after idle",
              "round trips above one"]
    return [Table(header, rows, sources=[s.name], commands=[s.command()], align="lrrrrr")]


def t_link_pacing(arg: str) -> list[Table]:
    """The model's error per delayed cell with one round trip an iteration and with TCP's pacing added
    (``shaped_links.py --remodel FILE --pacing link_rtt.json``: ``model_paced``), file by file (files of one rate)."""
    files = [Source(name) for name in arg.split()]
    n = range(len(files))
    return _by_cell(files, 0, [col for j in n for col in ((j, "model", ("error", "s_per_iter"), _ERROR),
                                                          (j, "model_paced", ("error", "s_per_iter"), _ERROR))],
                    [h for f in files for h in (f"{_label(f)}: one round trip", "paced")], delayed_only=True)


def _error_summary(files: list[Source], before: Callable[[Source], str], after: str,
                   groups: Callable[[dict], str | None], header: list[str]) -> list[Table]:
    """Per file and group of its model rows (``groups``: a row's group, None to leave it out; groups of fewer workers
    first), the mean error and mean absolute error of seconds per iteration under the model key ``before(file)`` and
    under that key with ``after`` appended, the same cells matched by setting."""
    rows: list[list[Cell]] = []
    for f in files:
        base = before(f)
        other = {_cell(m): i for i, m in enumerate(f(base + after))}
        cells: dict[str, list[tuple[int, int]]] = {}
        for i, m in enumerate(f(base)):
            group = groups(m)
            if group is not None:
                cells.setdefault(group, []).append((i, other[_cell(m)]))
        for group, pairs in sorted(cells.items(), key=lambda g: f(base)[g[1][0][0]]["workers"]):  # fewest first
            one = [(base, i, "error", "s_per_iter") for i, _ in pairs]
            two = [(base + after, j, "error", "s_per_iter") for _, j in pairs]
            rows.append([[_label(f)], [group], [str(len(pairs))],
                         [f.agg("mean", one, fmt="+.1%")], [f.agg("mean", two, fmt="+.1%")],
                         [f.agg("mean_abs", one, fmt=".1%")], [f.agg("mean_abs", two, fmt=".1%")]])
    return [Table(["file", "workers", *header], rows, sources=[f.name for f in files],
                  commands=[f.command() for f in files], align="lllrrrr")]


def t_link_pacing_summary(arg: str) -> list[Table]:
    """Per ``shaped_links.py`` file and worker group, over its cells with a delay: the model's mean error and mean
    absolute error with one round trip an iteration and with TCP's pacing (``model_paced``)."""
    def group(m: dict) -> str | None:
        if m["delay"] == "0":
            return None
        return "16" if m["workers"] == 16 else "4–8" if m["workers"] in (4, 8) else None

    return _error_summary([Source(name) for name in arg.split()], lambda f: "model", "_paced", group,
                          ["delayed cells", "mean error: one round trip", "paced", "mean |error|: one round trip",
                           "paced"])


def t_link_stepcost_summary(arg: str) -> list[Table]:
    """Per ``shaped_links.py`` file and worker count, over the cells the model predicts (not its fitting runs): the
    model's mean error and mean absolute error without and with a worker's step cost (``model_stepcost``, or
    ``model_paced_stepcost`` against ``model_paced`` where the file has pacing)."""
    def group(m: dict) -> str | None:
        fitting = (m["workers"], m.get("delay", "0")) == (m["from_workers"], m.get("from_delay", "0"))
        return None if fitting else str(m["workers"])

    return _error_summary([Source(name) for name in arg.split()],
                          lambda f: "model_paced" if "model_paced" in f.data else "model", "_stepcost", group,
                          ["cells", "mean error: envs-proportional", "step cost", "mean |error|: envs-proportional",
                           "step cost"])


def _label(f: Source) -> str:
    """A ``shaped_links_*.json`` file's short name in a table."""
    return f.name.removeprefix("shaped_links_").removesuffix(".json")


def t_link_ingress(arg: str) -> list[Table]:
    """The same ``shaped_links.py`` command without and with ``--ingress`` (the first and second file): seconds per
    iteration and the model's error, where only the hosts' egress is shaped and where the learner's ingress is too."""
    files = [Source(name) for name in arg.split()]
    return _by_cell(files, 1, [(0, "runs", ("s_per_iter_median",), _MS), (0, "model", ("error", "s_per_iter"), _ERROR),
                               (1, "runs", ("s_per_iter_median",), _MS), (1, "model", ("error", "s_per_iter"), _ERROR),
                               (1, "runs", ("weight_syncs",), _COUNT)],
                    ["ms/iter, egress shaped", "model error", "ms/iter, ingress too", "model error", "syncs"])
