"""The ``frugalrl`` command line.

    frugalrl train ppo --env LunarLander-v3 --workers 2 --sync aaps --kl-threshold 0.05
    frugalrl eval runs/<name> --episodes 20
    frugalrl plots runs/<name>
    frugalrl train pipeline-ppo --cut topk --cut-percentile 0.99
    frugalrl pipeline-bytes                        # Table I of the pipeline paper, and ours
    frugalrl lda fit reuters --n-topics 10 --workers 2 --processes 1 --local-steps 5
    frugalrl slurm --nodes 4 --partition cpu --submit -- frugalrl train ppo --env LunarLander-v3

Every ``train`` flag is a field of the algorithm's dataclass config (``PPOConfig``): the CLI and the
Python API take the same options, and ``config.json`` in the run directory records them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from typing import Any

ALGOS = {
    "ppo": ("frugalrl.algos.ppo", "PPOConfig", "train"),
    "impala": ("frugalrl.algos.impala", "IMPALAConfig", "train"),
    "pipeline-ppo": ("frugalrl.algos.pipeline_ppo", "PipelinePPOConfig", "train"),
    "hsa2c": ("frugalrl.algos.hsa2c", "HSA2CConfig", "train"),
}


def _field_parser(tp: Any):
    """An argparse ``type=`` for a dataclass field annotation (str, int, float, bool, lists, dicts, optionals)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = _field_parser(next(a for a in args if a is not type(None)))
        return lambda s: None if s.lower() in ("none", "null", "") else inner(s)
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str):
        return tp
    if origin is list:
        item = args[0] if args else str
        return lambda s: [item(x) for x in s.replace(",", " ").split()]
    if origin is tuple:  # tuple[int, int, int]: "1,2,4"
        item = args[0] if args else str
        return lambda s: tuple(item(x) for x in s.replace(",", " ").split())
    if origin is dict or tp is dict:
        return _parse_json_dict
    return str


def _parse_bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


def _parse_json_dict(s: str) -> dict:
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {s!r}: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {s!r}")
    return value


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--flag`` per field of dataclass ``cls`` (underscores become dashes)."""
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        flag = "--" + f.name.replace("_", "-")
        help_text = docs.get(f.name, "")  # the parsers' ArgumentDefaultsHelpFormatter adds the default
        parser.add_argument(flag, dest=f.name, type=_field_parser(hints[f.name]), default=default,
                            metavar=f.name.upper(), help=help_text)


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal right after a field) from the source of ``cls`` and of the
    dataclasses it inherits from: a field redeclared only to change its default keeps its base's docstring."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass):
            for name, doc in _own_field_docs(klass).items():
                docs.setdefault(name, doc)
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings written in the class body of ``cls`` itself."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser."""
    import importlib

    parser = argparse.ArgumentParser(prog="frugalrl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an agent")
    algos = train.add_subparsers(dest="algo", required=True)
    for algo, (module, cfg_name, _) in ALGOS.items():
        cls = getattr(importlib.import_module(module), cfg_name)
        p = algos.add_parser(algo, help=f"{algo} ({cfg_name})", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_dataclass_args(p, cls)
    ev = sub.add_parser("eval", help="evaluate a run's latest checkpoint")
    ev.add_argument("run_dir")
    ev.add_argument("--episodes", type=int, default=10)
    ev.add_argument("--seed", type=int, default=20_000)
    ev.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")
    pl = sub.add_parser("plots", help="(re)draw a run's PNG plots")
    pl.add_argument("run_dir")
    pb = sub.add_parser("pipeline-bytes", help="Table I of the pipeline paper from its settings, or a run's "
                        "predicted vs measured bytes (--run)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    pb.add_argument("--run", default=None, help="a pipeline-ppo run directory: predict its bytes from config.json "
                    "and compare with summary.json")
    pb.add_argument("--iterations", type=int, default=100)
    pb.add_argument("--steps", type=int, default=4096, help="env steps per iteration")
    pb.add_argument("--epochs", type=int, default=10)
    pb.add_argument("--minibatches", type=int, default=32)
    pb.add_argument("--obs-shape", default="4,96,96")
    pb.add_argument("--feature-dim", type=int, default=4096)
    pb.add_argument("--percentiles", default="0.9,0.99")
    pb.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lda = sub.add_parser("lda", help="LDA topic models by DPSVI (stochastic variational inference on DPSGD)")
    lda_sub = lda.add_subparsers(dest="lda_command", required=True)
    fit = lda_sub.add_parser("fit", help="fit LDA to CORPUS ('synthetic', 'reuters', a UCI docword or .ldac file)",
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    fit.add_argument("corpus_arg", metavar="CORPUS")
    fit.add_argument("--out", default=None, help="write the summary (without λ) as JSON here")
    from frugalrl.dpsgd.lda import LDAConfig

    add_dataclass_args(fit, LDAConfig)
    sl = sub.add_parser("slurm", help="write (and --submit) an sbatch script: Ray on the allocation, then a command",
                        usage="frugalrl slurm --nodes N --partition P [options] -- COMMAND...")
    sl.add_argument("--nodes", type=int, required=True, help="nodes: one Ray head, the rest Ray workers")
    sl.add_argument("--partition", required=True)
    sl.add_argument("--time", default=None, help="wall-time limit, e.g. 02:00:00")
    sl.add_argument("--cpus-per-task", type=int, default=None, help="CPUs per node (also ray start --num-cpus)")
    sl.add_argument("--job-name", default="frugalrl")
    sl.add_argument("--output", default=None, help="Slurm output file (%%j = job id)")
    sl.add_argument("--ray-auth-token", action="store_true", help="export RAY_AUTH_MODE=token in the script")
    sl.add_argument("--script-out", default=None, help="where to write the script (default: stdout, "
                    "or <job-name>.sbatch with --submit)")
    sl.add_argument("--submit", action="store_true", help="run sbatch on the script and print the job id")
    sl.add_argument("train_command", nargs=argparse.REMAINDER, help="the command to run, after '--'")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``frugalrl`` script."""
    import importlib

    args = build_parser().parse_args(argv)
    if args.command == "train":
        module, cfg_name, fn_name = ALGOS[args.algo]
        mod = importlib.import_module(module)
        cls = getattr(mod, cfg_name)
        cfg = cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
        try:
            summary = getattr(mod, fn_name)(cfg)
        except (ValueError, TypeError) as e:
            print(f"frugalrl: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("frugalrl: interrupted; workers stopped", file=sys.stderr)
            return 130
        if summary:  # a lone pipeline stage 1 has nothing to report
            _print_summary(summary)
        return 0
    if args.command == "eval":
        return _eval(args)
    if args.command == "slurm":
        return _slurm(args)
    if args.command == "pipeline-bytes":
        return _pipeline_bytes(args)
    if args.command == "lda":
        return _lda_fit(args)
    if args.command == "plots":
        from frugalrl.plots import make_plots

        for path in make_plots(args.run_dir):
            print(path)
        return 0
    return 2


def _eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from frugalrl.envs.spec import to_env_spec
    from frugalrl.evaluation import evaluate
    from frugalrl.runs import load_checkpoint

    run_dir = Path(args.run_dir)
    config_path = run_dir / "config.json"
    if not config_path.exists():
        print(f"frugalrl: error: {run_dir} is not a run directory (no config.json)", file=sys.stderr)
        return 2
    config = json.loads(config_path.read_text())
    try:
        agent, payload = load_checkpoint(run_dir)
    except FileNotFoundError as e:
        print(f"frugalrl: error: {e}", file=sys.stderr)
        return 2
    spec = to_env_spec(config["env"], config.get("env_kwargs") or {})
    mean, std, returns = evaluate(agent, spec, args.episodes, seed=args.seed, deterministic=not args.stochastic)
    result = {"run_dir": str(run_dir), "env_id": config["env"], "checkpoint_step": payload.get("step"),
              "episodes": args.episodes, "return_mean": mean, "return_std": std, "returns": returns}
    print(json.dumps(result, indent=2))
    return 0


def _lda_fit(args: argparse.Namespace) -> int:
    from frugalrl.dpsgd.lda import LDAConfig, fit_lda

    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(LDAConfig)}
    fields["corpus"] = args.corpus_arg
    try:
        summary = fit_lda(LDAConfig(**fields))
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
        from frugalrl.runs import _jsonable

        with open(args.out, "w") as f:
            json.dump(_jsonable(summary), f, indent=1)
    return 0


def _pipeline_bytes(args: argparse.Namespace) -> int:
    from frugalrl import pipeline_bytes

    if args.run is None:
        try:
            rows = pipeline_bytes.table_one(
                iterations=args.iterations, steps=args.steps, epochs=args.epochs, minibatches=args.minibatches,
                obs_shape=tuple(int(x) for x in args.obs_shape.split(",")), feature_dim=args.feature_dim,
                percentiles=tuple(float(x) for x in args.percentiles.split(",")))
        except ValueError as e:
            print(f"frugalrl: error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(rows, indent=2) if args.json else pipeline_bytes.format_table(rows))
        return 0
    from pathlib import Path

    from frugalrl.algos.pipeline_ppo import PipelinePPOConfig, predict_bytes

    run_dir = Path(args.run)
    try:
        config = json.loads((run_dir / "config.json").read_text())
        measured = json.loads((run_dir / "summary.json").read_text())["bytes"]
    except FileNotFoundError as e:
        print(f"frugalrl: error: {run_dir} is not a finished pipeline-ppo run: {e}", file=sys.stderr)
        return 2
    names = {f.name for f in dataclasses.fields(PipelinePPOConfig)}
    predicted = predict_bytes(PipelinePPOConfig(**{k: v for k, v in config.items() if k in names}))
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
    cfg = SlurmConfig(nodes=args.nodes, partition=args.partition, time=args.time, cpus_per_task=args.cpus_per_task,
                      job_name=args.job_name, output=args.output, ray_auth_token=args.ray_auth_token)
    try:
        script = render_sbatch(cfg, command)
    except ValueError as e:
        print(f"frugalrl: error: {e}", file=sys.stderr)
        return 2
    path = args.script_out or (f"{args.job_name}.sbatch" if args.submit else None)
    if path is None:
        sys.stdout.write(script)
        return 0
    with open(path, "w") as f:
        f.write(script)
    print(f"wrote {path}", file=sys.stderr)
    if args.submit:
        try:
            print(submit(path))
        except (FileNotFoundError, RuntimeError) as e:
            print(f"frugalrl: error: {e}", file=sys.stderr)
            return 1
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    nbytes = {k: v for k, v in summary.get("bytes", {}).items()
              if k != "total" and isinstance(v, int | float) and v}  # kinds only, not the per-direction dicts
    top = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(nbytes.items(), key=lambda kv: -kv[1])[:3])
    lines = [
        f"\n{summary['algo']} on {summary['env_id']} (seed {summary['seed']}): {summary['env_steps']} steps in "
        f"{summary['wall_seconds']:.1f} s ({summary['steps_per_second']:.0f} steps/s)",
        f"  evaluation return {summary['eval_return_mean']:.1f} ± {summary['eval_return_std']:.1f}",
    ]
    if "weight_syncs" in summary:
        syncs = summary["weight_syncs"]
        per_worker = f" (per worker {syncs['per_worker']})" if syncs.get("per_worker") else ""
        lines.append(f"  weight syncs {syncs.get('total', 0)}{per_worker}")
    lines.append(f"  bytes {summary.get('bytes', {}).get('total', 0) / 1e6:.2f} MB ({top})")
    lines.append(f"  run directory: {summary['run_dir']}")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
