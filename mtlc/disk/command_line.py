"""What the four scripts' command lines share: each option given once, and what was given as one
immutable record (GivenOptions). Click keeps the last of an
option given twice (`--csv a --csv b` writes b; `--max-error 1 --max-error 20` accepts at 20), so a
command line that says two things is refused in one line before any work.
"""
from collections import namedtuple

import click


def repeated_options(command, args):
    """The first option of `command` (not one that takes many values) that `args` give more than once,
    with the count, or None. Arguments after `--` are no options."""
    args = list(args)
    if "--" in args:
        args = args[:args.index("--")]
    for param in command.params:
        if not isinstance(param, click.Option) or param.multiple or param.count:
            continue
        names = [*param.opts, *param.secondary_opts]
        given = sum(arg in names or any(arg.startswith(f"{name}=") for name in names if name.startswith("--"))
                    for arg in args)
        if given > 1:
            return param.opts[0], given
    return None


class OnceEach:
    """A click command (mixed in before its class) that refuses an option given twice."""

    def parse_args(self, ctx, args):
        repeated = repeated_options(self, args)
        if repeated:
            raise click.UsageError(f"{repeated[0]} is given {repeated[1]} times: give it once", ctx=ctx)
        return super().parse_args(ctx, args)


class Command(OnceEach, click.Command):
    """click.Command, each option given once."""


def given_options(options):
    """The command line as click parsed it, an immutable record (None where a preset decides): what a
    script fills in from presets and data goes into its typed settings (train/settings.py), never back
    here; `._replace(...)` makes the resolved copy where a script needs one."""
    return namedtuple("GivenOptions", options)(**options)
