"""`tokenrouter train-router LOGS --out FILE`: a learned router from verify-mode decision logs."""
from __future__ import annotations

import argparse

from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.signals.route_gate import ClassPolicy
from tokenrouter_backend.core.signals.token_classes import CLASS_NAMES
from tokenrouter_backend.learning.outcome_labels import Labels
from tokenrouter_backend.learning.router_training import DEFAULT_L2, NotEnoughData, report_text, train
from tokenrouter_backend.operations.decision_log import read_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="decision-log files (JSON lines) from verify mode")
    parser.add_argument("--out", required=True, help="router file to write (JSON; config parameter router_file)")
    parser.add_argument("--holdout", type=float, default=0.2,
                        help="share of requests held out for evaluation, in (0, 1) (default: %(default)s)")
    parser.add_argument("--eval", action="append", default=None, metavar="LOG",
                        help="evaluate on these logs (other prompts) instead of a held-out share of LOGS (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train / held-out split (default: 0)")
    parser.add_argument("--l2", type=float, default=DEFAULT_L2, help="L2 penalty per sample (default: %(default)s)")
    parser.add_argument("--target-agreement", type=float, default=None,
                        help="agreement the chosen threshold must reach on the training split (default: that of "
                             "the confidence rule at --confidence-threshold)")
    parser.add_argument("--confidence-threshold", type=float, default=RouterDefaults.confidence_threshold,
                        help="the confidence rule the default target comes from (default: %(default)s)")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="also draw the held-out frontier (unchecked share vs agreement) into PNG (matplotlib)")
    parser.add_argument("--critical", action="append", default=[], metavar="CLASS=VALUE",
                        help="class policy as served (critical_<class>: verify or a scale), repeatable")
    parser.add_argument("--labels", choices=[lb.value for lb in Labels], default=Labels.TOKEN.value,
                        help="token: every heavy disagreement is a positive; outcome: only those whose light token "
                             "is not a whitespace-only variant of heavy's (needs --tokenizer) (default: token)")
    parser.add_argument("--tokenizer", metavar="PATH", default=None,
                        help="with --labels outcome: tokenizer.json, a folder holding one, or a model repository")


def load_texts(args: argparse.Namespace) -> list[str] | None:
    """Each token id's text for outcome labels (None: token labels); ValueError names the option."""
    if args.labels != Labels.OUTCOME.value:
        return None
    if not args.tokenizer:
        raise ValueError("--labels outcome needs --tokenizer (the served model's tokenizer)")
    from tokenizers import Tokenizer  # noqa: PLC0415 - only with outcome labels

    from tokenrouter_backend.cli.replay import find_tokenizer_file  # noqa: PLC0415
    from tokenrouter_backend.operations.route_setup import vocabulary_texts  # noqa: PLC0415
    try:
        return vocabulary_texts(Tokenizer.from_file(str(find_tokenizer_file(args.tokenizer))))
    except Exception as exc:  # noqa: BLE001 - any load failure names the user's path
        raise ValueError(f"--tokenizer: {exc}") from exc


def plot_frontier(frontier, path: str) -> None:
    import matplotlib  # noqa: PLC0415 - only with --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, points, style in (("confidence threshold", frontier.confidence, "o-"),
                                ("confidence + classes", frontier.confidence_rules, "s--"),
                                ("learned router + classes", frontier.router, "^-")):
        ax.plot([p.unchecked_share for p in points], [p.agreement for p in points], style, label=name)
    ax.set_xlabel("unchecked share (light tokens the heavy model never checks)")
    ax.set_ylabel("predicted agreement with heavy greedy")
    ax.set_title("held-out route replay")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if not 0.0 < args.holdout < 1.0:
        print(f"train-router: --holdout must be in (0, 1); got {args.holdout}")
        return 2
    if args.target_agreement is not None and not 0.0 <= args.target_agreement <= 1.0:
        print(f"train-router: --target-agreement must be in [0, 1]; got {args.target_agreement}")
        return 2
    try:
        pairs = dict(item.split("=", 1) for item in args.critical)
        unknown = set(k.strip() for k in pairs) - set(CLASS_NAMES)
        if unknown:
            raise ValueError(f"unknown class {sorted(unknown)}; classes: {', '.join(CLASS_NAMES)}")
        policy = ClassPolicy.from_config({f"critical_{k.strip()}": v for k, v in pairs.items()})
    except (ValueError, InvalidRequest) as exc:
        print(f"train-router: --critical CLASS=VALUE: {exc}")
        return 2
    try:
        texts = load_texts(args)
    except ValueError as exc:
        print(f"train-router: {exc}")
        return 2
    records = [r for path in args.logs for r in read_log(path)]
    try:
        held = [r for path in args.eval for r in read_log(path)] if args.eval else None
        report = train(records, policy, args.confidence_threshold, args.holdout, args.seed, args.l2,
                       args.target_agreement, held_out=held, texts=texts)
    except NotEnoughData as exc:
        print(f"train-router: {exc}")
        return 1
    report.router.save(args.out)
    print(report_text(report))
    if args.plot:
        plot_frontier(report.frontier, args.plot)
        print(f"wrote {args.plot}")
    print(f"\nwrote {args.out}")
    return 0
