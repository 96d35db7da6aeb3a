"""The ``frugalrl`` command line.

    frugalrl train ppo --env LunarLander-v3 --workers 2 --sync aaps --kl-threshold 0.05
    frugalrl train ppo --resume runs/<name>        # continue a run from its latest checkpoint
    frugalrl eval runs/<name> --episodes 20        # any algorithm's run directory
    frugalrl plots runs/<name>
    frugalrl plots runs/a runs/b runs/c --out sweep.png   # several runs in one figure
    frugalrl train pipeline-ppo --cut topk --cut-percentile 0.99
    frugalrl pipeline-bytes                        # Table I of the pipeline paper, and ours
    frugalrl lda fit reuters --n-topics 10 --workers 2 --processes 1 --local-steps 5
    frugalrl slurm --nodes 4 --partition cpu --submit -- frugalrl train ppo --env LunarLander-v3

Every ``train`` flag is a field of the algorithm's dataclass config (``PPOConfig``...), composed of the
shared parts of :mod:`frugalrl.config`: the CLI and the Python API take the same options, each flag's
help is the field's docstring with its default, and ``config.json`` in the run directory records them
all. Booleans work bare (``--plots`` / ``--no-plots``) or with a value (``--plots false``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

from frugalrl.algos import ALGORITHMS, algorithm, resumed_config
from frugalrl.config import config_from_dict, field_docs, is_flag, literal_choices


def _field_parser(tp: Any) -> Any:
    """An argparse ``type=`` for a dataclass field annotation (str, int, float, bool, lists, tuples, dicts, optionals)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner_type = next(a for a in args if a is not type(None))
        inner = _field_parser(inner_type)
        # None spells "off" for most optional fields; an optional boolean's None is "auto" (decided per env)
        nones = ("none", "null", "", "auto") if inner_type is bool else ("none", "null", "")
        return lambda s: None if s.lower() in nones else inner(s)
    if tp is bool:
        return _parse_bool
    if origin is typing.Literal:
        return type(args[0])
    if tp in (int, float, str):
        return tp
    if origin in (list, tuple):
        item = args[0] if args and args[0] in (int, float, str) else str
        convert = list if origin is list else tuple
        # a JSON list; one JSON object, a list of one (an env wrapper with its keywords); or words
        return lambda s: (convert(_parse_json_list(s)) if s.lstrip().startswith("[")
                          else convert([_parse_json_dict(s)]) if s.lstrip().startswith("{")
                          else convert(item(x) for x in s.replace(",", " ").split()))
    if origin is dict or tp is dict:
        return _parse_json_dict
    return str


def _is_optional_bool(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {bool, type(None)}


def _parse_bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


def _parse_json(s: str, kind: type, what: str) -> Any:
    """``s`` as JSON of type ``kind`` (``what`` names it in the error)."""
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}: {e}") from e
    if not isinstance(value, kind):
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return value


def _parse_json_list(s: str) -> list:
    return _parse_json(s, list, "a JSON list")


def _parse_json_dict(s: str) -> dict:
    return _parse_json(s, dict, "a JSON object")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                       preset: tuple[dict[str, Any], str | None] = ({}, None)) -> None:
    """One ``--flag`` per field of dataclass ``cls`` (underscores become dashes), its help the field's
    docstring and its effective default: the ``preset``'s value (its fields and name: an env's preset or a
    family's) where it sets one, else the dataclass's. Only flags given on the command line are set on the
    namespace (the dataclass supplies the defaults), so a resumed run can tell what was changed. Fields that a
    run only records (:func:`frugalrl.config.is_flag`) get no flag."""
    from frugalrl.presets import label

    values, preset_name = preset
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not is_flag(f):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = _default(f)
        required = default is dataclasses.MISSING
        shown = "required" if required else f"default: {_shown(default)}"
        if f.name in values and preset_name is not None:
            shown = f"{label(preset_name)}: {_shown(values[f.name])}; without it {shown.removeprefix('default: ')}"
        help_text = f"{docs.get(f.name, '')} ({shown})".strip().replace("%", "%%")
        choices = literal_choices(hints[f.name])
        common: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if hints[f.name] is bool or _is_optional_bool(hints[f.name]):
            parser.add_argument(flag, nargs="?", const=True, type=_field_parser(hints[f.name]),
                                metavar="BOOL" if hints[f.name] is bool else "BOOL|auto", **common)
            parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                default=argparse.SUPPRESS, help=f"same as {flag} false")
            continue
        parser.add_argument(flag, type=_field_parser(hints[f.name]), required=required,
                            metavar="{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper(),
                            choices=list(choices) + ([None] if None not in choices else []) if choices else None,
                            **common)


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` given on the command line."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


class _Version(argparse.Action):
    """``--version``: frugalrl's and its main libraries' versions, read from the installed packages' metadata
    (nothing is imported)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from frugalrl import __version__

        def installed(name: str) -> str:
            try:
                return f"{name} {version(name)}"
            except PackageNotFoundError:
                return f"{name} not installed"

        libraries = ", ".join(installed(n) for n in ("torch", "gymnasium", "numpy"))
        print(f"frugalrl {__version__} (python {sys.version.split()[0]}, {libraries})")
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full argument parser; with the command line ``argv``, the help of ``train ALGO`` shows the defaults
    that its ``--env`` / ``--preset`` take effect with."""
    parser = argparse.ArgumentParser(
        prog="frugalrl", description="Distributed reinforcement learning that counts every byte (docs: "
        "docs/getting-started.md).", epilog="examples:\n" + (__doc__ or "").split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print frugalrl's version and those of the libraries "
                        "it runs on (for a bug report), then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an agent (or continue a run with --resume)")
    algos = train.add_subparsers(dest="algo", required=True)
    from frugalrl.presets import overview

    for name, entry in ALGORITHMS.items():
        _, cls = entry.load()
        p = algos.add_parser(name, help=entry.help,
                             description=f"{entry.help}. Flags are the fields of {entry.config}. {overview(name)}")
        p.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="continue this run directory from its latest checkpoint, with its config.json "
                            "(flags given here change it, e.g. a larger --total-timesteps)")
        add_dataclass_args(p, cls, preset=_help_preset(name, cls, argv))
    ev = sub.add_parser("eval", help="evaluate a run's latest checkpoint, or its best-evaluated policy (any algorithm)")
    ev.add_argument("run_dir", help="a run directory")
    ev.add_argument("--checkpoint", choices=("latest", "best"), default="latest",
                    help="latest: checkpoints/latest.pt (the end of the run); best: checkpoints/best.pt, the policy "
                         "of the run's best evaluation (default: latest)")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (default: 10)")
    ev.add_argument("--seed", type=int, default=20_000,  # evaluation.FRESH_SEED (the CLI does not import torch)
                    help="env seed of the first episode (default: 20000, episodes no run evaluation plays)")
    ev.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")
    ev.add_argument("--max-steps", type=int, default=None,
                    help="cut an episode that has not ended after this many steps, its return so far counted "
                         "(default: the run's eval_max_steps)")
    ev.add_argument("--torch-threads", type=int, default=1,
                    help="threads torch may use (default: 1: one observation at a time runs faster on one)")
    ev.add_argument("--video", default=None, metavar="FILE",
                    help="also write the episodes as a video, FILE.mp4 or FILE.gif (the env renders rgb_array frames)")
    pl = sub.add_parser("plots", help="(re)draw a run's PNG plots, or overlay several runs in one figure")
    pl.add_argument("run_dirs", nargs="+", metavar="RUN", help="a run directory; several: one overlay figure")
    pl.add_argument("--out", default=None, help="one run: the folder for its PNGs (default: RUN/plots); several: "
                    "the overlay's PNG file, or a folder for overlay.png (default: ./overlay.png)")
    pl.add_argument("--label", action="append", default=None, metavar="LABEL",
                    help="several runs: a legend label per run, in order (default: the config.json keys whose "
                    "values differ between the runs, else the directory names)")
    pb = sub.add_parser("pipeline-bytes", help="Table I of the pipeline paper from its settings, or a run's "
                        "predicted vs measured bytes (--run)")
    pb.add_argument("--run", default=None, help="a pipeline-ppo run directory: predict its bytes from config.json "
                    "and compare with summary.json (default: none, print Table I)")
    pb.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from frugalrl.pipeline.bytes import TableOneConfig

    add_dataclass_args(pb, TableOneConfig)
    sm = sub.add_parser("scale-model", help="a PPO or IMPALA run's bytes and seconds per iteration at N workers, and "
                        "the worker count at which the learner's link or core saturates "
                        "(docs/multi-node.md#scale-model)")
    sm.add_argument("run_dir", help="a finished ClusterEnv PPO or IMPALA run directory (not resumed)")
    sm.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16, 64, 256, 1024],
                    help="worker counts to predict (default: 2 4 8 16 64 256 1024)")
    sm.add_argument("--link-gbit", type=float, default=10.0, help="the learner's link in Gbit/s (default: 10)")
    sm.add_argument("--run-link-gbit", type=float, default=None,
                    help="the link the measured run had, if shaped (its transfer time is taken out of its rollouts)")
    sm.add_argument("--rtt-ms", type=float, default=0.0,
                    help="the round-trip time between the learner and its workers in ms (default: 0, none)")
    sm.add_argument("--run-rtt-ms", type=float, default=0.0,
                    help="the round-trip time the measured run had (its latency is taken out of its rollouts)")
    sm.add_argument("--pacing", default=None, metavar="JSON[:TRANSPORT]",
                    help="benchmarks/link_rtt.py's measurement of the link: the round trips a message takes beyond "
                         "one by its size, added to each iteration's (default transport tcp-bbr; default: none)")
    sm.add_argument("--step-cost", default=None, metavar="JSON",
                    help="benchmarks/worker_step_cost.py's measurement of a worker's step: its fixed part keeps a "
                         "worker of fewer envs from being proportionally faster (default: none, proportional)")
    sm.add_argument("--worker-cores", type=int, default=None,
                    help="cores the workers share (default: a core per worker)")
    sm.add_argument("--step-rate", type=float, default=None,
                    help="env steps/s per worker for the saturation counts (default: the run's own)")
    sm.add_argument("--serve-us-per-step", type=float, default=0.0,
                    help="the head's own work per ingested env step besides the update, in µs "
                         "(benchmarks/learner_capacity.py measures it; default: 0, left out)")
    sm.add_argument("--update-fit-run", default=None, metavar="RUN_DIR",
                    help="a run of the same update at another batch size: splits the update's time into a fixed and "
                         "a per-sample part (default: none, the update taken as linear in the batch, an upper bound)")
    sm.add_argument("--same-total-envs", action="store_true",
                    help="spread the run's envs over each worker count (default: each worker keeps its envs)")
    sm.add_argument("--json", action="store_true", help="print JSON instead of tables")
    lda = sub.add_parser("lda", help="LDA topic models by DPSVI (stochastic variational inference on DPSGD)")
    lda_sub = lda.add_subparsers(dest="lda_command", required=True)
    fit = lda_sub.add_parser("fit", help="fit LDA to CORPUS ('synthetic', 'reuters', a UCI docword or .ldac file)")
    fit.add_argument("corpus_arg", metavar="CORPUS")
    fit.add_argument("--out", default=None, help="write the summary (without λ) as JSON here")
    from frugalrl.dpsgd.lda import LDAConfig

    add_dataclass_args(fit, LDAConfig, skip=("corpus",))
    sl = sub.add_parser("slurm", help="write (and --submit) an sbatch script: Ray on the allocation, then a command",
                        usage="frugalrl slurm --nodes N --partition P [options] -- COMMAND...")
    from frugalrl.slurm import SlurmConfig

    add_dataclass_args(sl, SlurmConfig)
    sl.add_argument("train_command", nargs=argparse.REMAINDER, help="the command to run, after '--'")
    return parser


def _help_preset(algo: str, cls: type, argv: list[str] | None) -> tuple[dict[str, Any], str | None]:
    """The preset that ``frugalrl train ALGO --help`` (with its ``--env``, ``--env-kwargs``,
    ``--env-wrappers``, ``--preset``) would apply, the env's own or its family's: the values its help then shows
    as the defaults. Nothing unless ``argv`` asks for that algorithm's help, or if the env cannot be built here to
    find its family."""
    from frugalrl import presets

    if not argv or argv[:2] != ["train", algo] or not {"-h", "--help"} & set(argv):
        return {}, None
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env", default=next(f.default for f in dataclasses.fields(cls) if f.name == "env"))
    pre.add_argument("--env-kwargs", type=_parse_json_dict, default=None)
    pre.add_argument("--env-wrappers", type=_field_parser(typing.get_type_hints(cls)["env_wrappers"]), default=None)
    pre.add_argument("--preset", default=presets.AUTO)
    try:
        known, _ = pre.parse_known_args(argv[2:])
        env, env_kwargs = (presets.atari_frames(known.env, known.env_kwargs is not None)
                           or (known.env, known.env_kwargs))
        return presets.resolve(algo, env, known.preset, env_kwargs, known.env_wrappers)
    except Exception:  # an env that cannot be built here, a bad preset: the help shows the dataclass's defaults
        return {}, None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``frugalrl`` script."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    _search_working_dir()
    if args.command == "train":
        return _train(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "slurm":
        return _slurm(args)
    if args.command == "pipeline-bytes":
        return _pipeline_bytes(args)
    if args.command == "lda":
        return _lda_fit(args)
    if args.command == "plots":
        return _plots(args)
    if args.command == "scale-model":
        return _scale_model(args)
    return 2


def _search_working_dir() -> None:
    """Let ``--env mymodule:make_env`` (or ``mymodule:MyEnv-v0``) find ``mymodule.py`` in the working directory,
    as ``python -m`` would; searched last, so it never shadows an installed package. Workers inherit the path."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _scale_model(args: argparse.Namespace) -> int:
    from frugalrl.scale_model import Pacing, StepCost, report

    try:
        pacing = None if args.pacing is None else Pacing.parse(args.pacing)
        step_cost = None if args.step_cost is None else StepCost.from_json(args.step_cost)
        out = report(args.run_dir, args.workers, args.link_gbit, args.run_link_gbit, args.worker_cores, args.step_rate,
                     args.same_total_envs, args.serve_us_per_step, args.update_fit_run, args.rtt_ms / 1e3,
                     args.run_rtt_ms / 1e3, pacing, step_cost)
    except (FileNotFoundError, ValueError) as e:
        return _error(str(e))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    f, sat = out["figures"], out["saturation"]
    print(f"measured at {f['workers']} workers: {f['env_steps_per_worker_iter']:.0f} env steps per worker per "
          f"iteration, up {f['up_bytes_per_step']:.1f} B/step + {f['up_bytes_per_worker_iter']:,.0f} B of headers, "
          f"down {f['down_bytes_per_step']:.1f} B/step + {f['down_bytes_per_worker_iter']:,.0f} B of headers + "
          f"{f['syncs_per_worker_iter']:.2f} × {f['weight_bytes_per_sync']:,.0f} B of weights per iteration"
          + (f", after a first full copy of {f['first_copy_bytes']:,.0f} B (left out below: a long run's steady "
             "state)" if f["first_copy_bytes"] else ""))
    if f["overlap"]:
        print("the next rollout runs during the update (IMPALA's rollout thread): an iteration is the longer of the two")
    floor = any(p["down_bytes_per_iter_floor"] < p["down_bytes_per_iter"] for p in out["predictions"])
    if floor:
        print(f"the sync rule's lag bound ({f['lag_bound']} updates) keeps a worker's syncs at {1 / f['lag_bound']:.2f} "
              "per iteration or more: 'down floor' is the downlink at that rate, what fewer syncs at more workers "
              "can come down to")
    print(f"\n{'workers':>8s} {'up MB/iter':>11s} {'down MB/iter':>13s}" + (f" {'down floor':>11s}" if floor else "")
          + f" {'link s':>8s} {'rollout s':>10s} {'serve s':>8s} {'update s':>9s} {'s/iter':>8s}   (link "
          f"{args.link_gbit:g} Gbit/s" + (f", {args.rtt_ms:g} ms round trips{' paced' if pacing else ''}: in 'link s'"
                                             if args.rtt_ms else "")
          + ")")
    for p in out["predictions"]:
        print(f"{p['workers']:8d} {p['up_bytes_per_iter'] / 1e6:11.3f} {p['down_bytes_per_iter'] / 1e6:13.3f}"
              + (f" {p['down_bytes_per_iter_floor'] / 1e6:11.3f}" if floor else "")
              + f" {p['link_s']:8.3f} {p['rollout_compute_s']:10.3f} {p['serve_s']:8.3f} {p['update_s']:9.3f} "
              f"{p['s_per_iter']:8.3f}")
    links = ", ".join(f"{k}: {v:,.0f}" for k, v in sat["workers_at_link_saturation"].items())
    core = sat["workers_at_core_saturation"]
    if core is None:
        core_text = "its core: no update time measured"
    elif sat["learner_core_share_fixed"] >= 1.0:
        core_text = "its core is saturated at any worker count (each update's fixed part outlasts a rollout)"
    else:
        core_text = f"its core (serving and updates) at {core:,.0f}"
    print(f"\nat {sat['step_rate_per_worker']:,.0f} env steps/s per worker, the learner's link saturates at "
          f"{links} workers; {core_text}")
    return 0


def _plots(args: argparse.Namespace) -> int:
    from frugalrl.plots import make_overlay, make_plots

    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        return _error(f"not a run directory: {', '.join(missing)}")
    if len(args.run_dirs) == 1:
        for path in make_plots(args.run_dirs[0], args.out):
            print(path)
        return 0
    out = Path(args.out or "overlay.png")
    if out.is_dir():
        out = out / "overlay.png"
    try:
        print(make_overlay(args.run_dirs, out, labels=args.label))
    except ValueError as e:
        return _error(str(e))
    return 0


def _error(message: str) -> int:
    print(f"frugalrl: error: {message}", file=sys.stderr)
    return 2


def _note(line: str) -> None:
    """A note of the run's settings on stderr (stdout may be a JSON)."""
    print(f"frugalrl: note: {line}", file=sys.stderr)


def _train(args: argparse.Namespace) -> int:
    from frugalrl.driver import StorageFull
    from frugalrl.envs.restarts import WorkersFailed
    from frugalrl.envs.worker import WorkerError
    from frugalrl.evaluation import EvaluationEnvError
    from frugalrl.runs import read_config

    mod, cls = algorithm(args.algo).load()
    changes = given(args, cls)
    try:
        if args.resume is not None:
            saved = read_config(args.resume)
            if saved.get("algo") != args.algo:
                return _error(f"{args.resume} is a {saved.get('algo')} run, not {args.algo}")
            cfg = resumed_config(args.resume, cls, saved, changes, "command line (resume)", _note)
        else:
            cfg = _with_preset(args.algo, cls, changes)
        summary = mod.train(cfg, resume=args.resume)
    except (ValueError, TypeError, FileNotFoundError) as e:
        return _error(str(e))
    except StorageFull as e:
        resume = f"free space, then continue with  frugalrl train {args.algo} --resume {e.run_dir}"
        then = (f"{resume} (from step {e.step})" if e.step is not None else resume if args.resume
                else "no checkpoint was written yet: free space and start it again")
        return _error(f"{e}: the run stopped; {then}")
    except (WorkerError, WorkersFailed, EvaluationEnvError) as e:  # an env raised, or workers kept dying
        saved_to = f"; the run is saved: continue with  frugalrl train {args.algo} --resume {e.run_dir}" if e.run_dir else ""
        if isinstance(e, EvaluationEnvError) and e.trained:  # nothing left to train: a resume would only evaluate
            saved_to = f"; the run made all its updates and is saved: frugalrl eval {e.run_dir} plays its policy again"
        return _error(f"{'workers failed: ' if isinstance(e, WorkersFailed) else ''}{e}{saved_to}")
    except KeyboardInterrupt:
        print("frugalrl: interrupted; workers stopped", file=sys.stderr)
        return 130
    if not summary:  # a lone pipeline stage 1 has nothing to report
        return 0
    from frugalrl.driver import EXIT_PREEMPTED, STOP_SIGNALS
    from frugalrl.summary_text import summary_text

    print(summary_text(summary))
    if summary["stop_reason"] in STOP_SIGNALS.values():
        print(f"frugalrl: {summary['stop_reason']}: continue with  frugalrl train {args.algo} --resume "
              f"{summary['run_dir']}", file=sys.stderr)
    return EXIT_PREEMPTED if summary["stop_reason"] == "preempted" else 0


def _with_preset(algo: str, cls: type, changes: dict[str, Any]) -> Any:
    """The config from the preset ``--preset`` names, then the flags given (:func:`frugalrl.presets.configure`);
    prints its notes and where each value that is not the dataclass's default came from."""
    from frugalrl import presets

    choice = changes.pop("preset", presets.AUTO)
    cfg = presets.configure(algo, cls, changes, choice,
                            note=_note)
    print(f"frugalrl: {presets.describe(cfg)}", file=sys.stderr)
    return cfg


def _eval(args: argparse.Namespace) -> int:
    import torch

    from frugalrl.algos import load_policy
    from frugalrl.envs.spec import to_env_spec
    from frugalrl.evaluation import MAX_STEPS, EvaluationEnvError, PolicyEvaluator, progress_lines
    from frugalrl.runs import read_config
    from frugalrl.video import VideoError, record

    try:
        config = read_config(args.run_dir)
        agent, counters = load_policy(args.run_dir, args.checkpoint)
    except (FileNotFoundError, ValueError) as e:
        return _error(str(e))
    if args.episodes < 1:
        return _error(f"--episodes must be a positive integer, got {args.episodes}")
    if args.max_steps is not None and args.max_steps < 1:
        return _error(f"--max-steps must be a positive integer, got {args.max_steps}")
    if args.torch_threads < 1:
        return _error(f"--torch-threads must be a positive integer, got {args.torch_threads}")
    torch.set_num_threads(args.torch_threads)
    try:
        spec = to_env_spec(config["env"], config.get("env_kwargs") or {}, config.get("env_wrappers"))
    except ValueError as e:  # an env this process cannot import (the run's PYTHONPATH?)
        return _error(str(e))
    max_steps = args.max_steps or int(config.get("eval_max_steps") or MAX_STEPS)
    evaluator = PolicyEvaluator(agent, spec, args.episodes, args.seed, not args.stochastic, max_steps)
    try:
        if args.video is None:
            played = evaluator(poll=progress_lines(args.episodes))
        else:
            played, frames = record(evaluator, args.video, poll=progress_lines(args.episodes))
    except (VideoError, EvaluationEnvError, ValueError) as e:  # ValueError: an env that cannot be built here
        return _error(str(e))
    if args.video is not None:
        print(f"frugalrl: {frames} frames of {args.episodes} episode{'s' * (args.episodes != 1)} written to "
              f"{args.video}", file=sys.stderr)
    result = {"run_dir": str(Path(args.run_dir)), "algo": config.get("algo"), "env_id": config["env"],
              "checkpoint": args.checkpoint, "checkpoint_step": counters.get("env_steps"), "episodes": args.episodes,
              "deterministic": not args.stochastic, "return_mean": played.mean, "return_std": played.std,
              "returns": played.returns, "max_steps": max_steps, "cut_episodes": played.cut}
    print(json.dumps(result, indent=2))
    return 0


def _lda_fit(args: argparse.Namespace) -> int:
    from frugalrl.dpsgd.lda import LDAConfig, fit_lda

    try:
        summary = fit_lda(LDAConfig(**given(args, LDAConfig), corpus=args.corpus_arg))
    except (ValueError, FileNotFoundError) as e:
        print(f"frugalrl: error: {e}", file=sys.stderr)
        return 2
    summary.pop("lambda", None)
    c = summary["corpus"]
    print(f"LDA on {c['name']}: {c['train_docs']} training docs, {c['heldout_docs']} held out, vocabulary {c['vocab']}")
    print(f"  held-out perplexity {summary['initial_perplexity']:.1f} -> {summary['final_perplexity']:.1f} "
          f"in {summary['wall_time_s']:.1f} s ({summary['global_updates']} global updates)")
    if summary.get("target_perplexity") is not None:
        reached = summary["time_to_target_s"]
        print(f"  target {summary['target_perplexity']}: " + (f"reached at {reached:.1f} s" if reached is not None else "not reached"))
    for k, words in enumerate(summary["top_words"]):
        print(f"  topic {k:2d}: {' '.join(map(str, words))}")
    if args.out:
        from frugalrl.runs import jsonable

        with open(args.out, "w") as f:
            json.dump(jsonable(summary), f, indent=1)
    return 0


def _pipeline_bytes(args: argparse.Namespace) -> int:
    from frugalrl.pipeline import bytes as pipeline_bytes

    if args.run is None:
        try:
            rows = pipeline_bytes.table_one(pipeline_bytes.TableOneConfig(**given(args, pipeline_bytes.TableOneConfig)))
        except ValueError as e:
            return _error(str(e))
        print(json.dumps(rows, indent=2) if args.json else pipeline_bytes.format_table(rows))
        return 0
    from frugalrl.pipeline import PipelinePPOConfig, predict_bytes
    from frugalrl.runs import read_config

    run_dir = Path(args.run)
    try:
        config = read_config(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        measured = summary["bytes"]
        predicted = predict_bytes(config_from_dict(PipelinePPOConfig, config, where=str(run_dir / "config.json")),
                                  summary["details"].get("truncation_bootstraps", ()))
    except (FileNotFoundError, ValueError) as e:
        return _error(f"{run_dir} is not a finished pipeline-ppo run: {e}")
    kinds = [k for k in predicted["bytes"] if k != "total"] + ["total"]
    result = {k: {"predicted": predicted["bytes"][k], "measured": measured.get(k, 0)} for k in kinds}
    if args.json:
        print(json.dumps({"exact": predicted["exact"], "bytes": result}, indent=2))
    else:
        print(f"{'kind':12s} {'predicted':>14s} {'measured':>14s}  ({'exact' if predicted['exact'] else 'expected'})")
        for k, v in result.items():
            print(f"{k:12s} {v['predicted']:14,.0f} {v['measured']:14,.0f}")
    return 0


def _slurm(args: argparse.Namespace) -> int:
    from frugalrl.slurm import SlurmConfig, render_sbatch, submit

    command = args.train_command[1:] if args.train_command[:1] == ["--"] else args.train_command
    try:
        cfg = SlurmConfig(**given(args, SlurmConfig))
        script = render_sbatch(cfg, command)
    except ValueError as e:
        return _error(str(e))
    path = cfg.script_out or (f"{cfg.job_name}.sbatch" if cfg.submit else None)
    if path is None:
        sys.stdout.write(script)
        return 0
    with open(path, "w") as f:
        f.write(script)
    print(f"wrote {path}", file=sys.stderr)
    if cfg.submit:
        try:
            print(submit(path))
        except (FileNotFoundError, RuntimeError) as e:
            print(f"frugalrl: error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
