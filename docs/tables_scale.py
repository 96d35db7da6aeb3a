"""The scale model's check against real runs on emulated hosts (``benchmarks/shaped_links.py --workers ...``):
what :mod:`frugalrl.scale_model` predicted from the smallest run, against what each run measured. Registered by
``docs/gen_tables.py`` as the ``scale_model`` bench."""

from __future__ import annotations

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


def t_link_latency(arg: str) -> list[Table]:
    """Link latency (``shaped_links.py --delays``): seconds per iteration with the weights in the rollout request
    (the first file) against weights sent on their own (the second, the same command before that change), and the
    model's prediction from the runs without delay."""
    now, before = (Source(name) for name in arg.split())
    old = {_cell(r): i for i, r in enumerate(before("runs"))}
    models = {_cell(m): i for i, m in enumerate(now("model"))}
    rows: list[list[Cell]] = []
    for i, r in enumerate(now("runs")):
        key = _cell(r)
        m = models[key]
        rows.append([[r["delay"]], [r["sync"]], [str(r["workers"])],
                     [before.num("runs", old[key], "s_per_iter_median", fmt=".0f", scale=1e3)],
                     [now.num("runs", i, "s_per_iter_median", fmt=".0f", scale=1e3)],
                     [now.num("model", m, "predicted", "s_per_iter", fmt=".0f", scale=1e3)],
                     [now.num("model", m, "error", "s_per_iter", fmt="+.0%")],
                     [now.num("runs", i, "weight_syncs", fmt="d")]])
    header = ["one-way delay", "sync", "workers", "ms/iter, weights on their own", "ms/iter, weights in the request",
              "model (from no delay)", "error", "syncs"]
    return [Table(header, rows, sources=[now.name, before.name], commands=[now.command(), before.command()],
                  align="lllrrrrr")]


def t_link_latency_rounds(arg: str) -> list[Table]:
    """Link latency in repeated rounds (``shaped_links.py --delays``, the same command run once per file): each
    cell's seconds per iteration and the model's error, round by round."""
    rounds = [Source(name) for name in arg.split()]
    index = [{_cell(r): i for i, r in enumerate(s("runs"))} for s in rounds]
    models = [{_cell(m): i for i, m in enumerate(s("model"))} for s in rounds]
    rows: list[list[Cell]] = []
    for r in rounds[0]("runs"):
        key = _cell(r)
        row: list[Cell] = [[r["delay"]], [r["sync"]], [str(r["workers"])]]
        row += [[s.num("runs", ix[key], "s_per_iter_median", fmt=".0f", scale=1e3)] for s, ix in zip(rounds, index, strict=True)]
        row += [[s.num("model", mx[key], "error", "s_per_iter", fmt="+.0%")] for s, mx in zip(rounds, models, strict=True)]
        rows.append(row)
    n = len(rounds)
    header = ["one-way delay", "sync", "workers", *(f"ms/iter, round {j + 1}" for j in range(n)),
              *(f"model error, round {j + 1}" for j in range(n))]
    return [Table(header, rows, sources=[s.name for s in rounds], commands=[s.command() for s in rounds],
                  align="lll" + "r" * (2 * n))]


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


def t_link_ingress(arg: str) -> list[Table]:
    """The same ``shaped_links.py`` command without and with ``--ingress`` (the first and second file): seconds per
    iteration and the model's error, where only the hosts' egress is shaped and where the learner's ingress is too."""
    egress, both = (Source(name) for name in arg.split())
    runs = {_cell(r): i for i, r in enumerate(egress("runs"))}
    models = [{_cell(m): i for i, m in enumerate(s("model"))} for s in (egress, both)]
    rows: list[list[Cell]] = []
    for i, r in enumerate(both("runs")):
        key = _cell(r)
        rows.append([[r["delay"]], [r["sync"]], [str(r["workers"])],
                     [egress.num("runs", runs[key], "s_per_iter_median", fmt=".0f", scale=1e3)],
                     [egress.num("model", models[0][key], "error", "s_per_iter", fmt="+.0%")],
                     [both.num("runs", i, "s_per_iter_median", fmt=".0f", scale=1e3)],
                     [both.num("model", models[1][key], "error", "s_per_iter", fmt="+.0%")],
                     [both.num("runs", i, "weight_syncs", fmt="d")]])
    header = ["one-way delay", "sync", "workers", "ms/iter, egress shaped", "model error", "ms/iter, ingress too",
              "model error", "syncs"]
    return [Table(header, rows, sources=[egress.name, both.name], commands=[egress.command(), both.command()],
                  align="lllrrrrr")]
