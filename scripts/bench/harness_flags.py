"""Flag handling the time-budget benchmark harnesses share (quality.py, domain_adaptation.py)."""

import argparse
import os


def apply_smoke(args: argparse.Namespace, argv: list[str], smoke: dict) -> None:
    """With --smoke, sets each of `smoke`'s values the command line did not give."""
    if not args.smoke:
        return
    given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
    for key, value in smoke.items():
        if key not in given:
            setattr(args, key, value)


def torch_python(given: str | None, env: str, default: str) -> str:
    """The PyTorch interpreter: the flag, else $env, else `default`."""
    return given or os.environ.get(env) or default


def check_runs(args: argparse.Namespace, systems: tuple[str, ...]) -> str | None:
    """A one-line problem with --systems, --budgets (minutes) or --seeds, or None."""
    unknown = [s for s in args.systems.split(",") if s not in systems]
    if unknown:
        return f"--systems: {unknown[0]!r} is unknown; choose from {', '.join(systems)}"
    try:
        budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        return f"--budgets={args.budgets!r}: give minutes, e.g. 5,10,20"
    if not budgets or min(budgets) <= 0:
        return f"--budgets={args.budgets!r}: every budget must be > 0 minutes"
    if args.seeds < 1:
        return f"--seeds={args.seeds} must be >= 1"
    return None
