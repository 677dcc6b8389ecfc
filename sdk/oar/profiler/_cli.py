"""``oar profile script.py [args...]``: run a script under the profiler, print the table."""

from __future__ import annotations

import os
import runpy
import sys

import click

from oar.profiler._report import SORT_KEYS
from oar.profiler._recording import DEVICE_TIMING_MODES

__all__ = ["profile_command"]


@click.command("profile", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True),
              help="Also write a Chrome trace (chrome://tracing, Perfetto) to this file.")
@click.option("--sort", "sort_by", type=click.Choice(SORT_KEYS), default="device_time", show_default=True,
              help="The column the table is sorted by.")
@click.option("--limit", "row_limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows of the table (0: all).")
@click.option("--device-timing", type=click.Choice(DEVICE_TIMING_MODES), default="auto", show_default=True,
              help="Where device time comes from: the plugin's profiler entries, timing events, or none.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def profile_command(trace_path: str | None, sort_by: str, row_limit: int, device_timing: str, script: str,
                    script_args: tuple[str, ...]) -> None:
    """Run SCRIPT (as `python SCRIPT ARGS...` would: sys.argv, __main__) under oar.profiler and print
    its ops by device time."""
    from oar.profiler import profile

    if trace_path is not None:
        directory = os.path.dirname(os.path.abspath(trace_path))
        if not os.access(directory, os.W_OK):
            raise click.BadParameter(f"cannot write into {directory}", param_hint="--trace")
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    exit_code: int | str | None = 0
    prof = profile(device_timing=device_timing)
    try:
        with prof:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as stop:
                exit_code = stop.code
    finally:
        sys.argv = saved_argv
        if sys.path and sys.path[0] != saved_path0:
            del sys.path[0]
        # An exception from the script still gets the table of what ran before it.
        sys.stdout.flush()
        if prof._state == "stopped":  # not when it never started (another profiler was active)
            prof.print_table(sort_by=sort_by, row_limit=row_limit or None)
        if trace_path is not None and prof._state == "stopped":
            prof.export_chrome_trace(trace_path)
            click.echo(f"trace written to {trace_path}", err=True)
    if exit_code not in (0, None):
        sys.exit(exit_code)
