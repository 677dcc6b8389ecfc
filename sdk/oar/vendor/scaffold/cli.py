"""The ``oar new-backend`` and ``oar ci render`` commands (registered by :mod:`oar.cli`)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["new_backend", "ci"]


@click.command("new-backend")
@click.argument("name")
@click.option("--device-type", required=True, help="The name users pass to oar.set_device, e.g. npu.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write the project.  [default: ./NAME]")
@click.option("--ci", "ci_systems", multiple=True, type=click.Choice(["github", "gitlab", "jenkins", "none"]),
              default=("github",), show_default=True, help="CI configuration to include (repeatable).")
@click.option("--force", is_flag=True, help="Write into a directory that is not empty.")
@click.option("--async", "async_streams", is_flag=True,
              help="The asynchronous shape: a worker thread per stream running heap launch packets; the "
                   "launch-time checks stay synchronous.")
def new_backend(name: str, device_type: str, directory: Path | None, ci_systems: tuple[str, ...], force: bool,
                async_streams: bool) -> None:
    """Generate NAME, a device plugin project that builds, loads and runs the conformance suite clean.

    A C plugin over host memory (every REQUIRED entry of device_api.h working, marked TODO), kernel
    stubs for every op of ops.yaml, CMake and pip builds registering it under oar.plugins, the
    expected conformance results, a README and CI configuration. Streams run their work at once,
    or with --async on a worker thread each.
    """
    from oar.vendor.scaffold import ProjectError, generate

    systems = [system for system in ci_systems if system != "none"]
    try:
        written = generate(name, device_type, directory, ci=systems, force=force, async_streams=async_streams)
    except ProjectError as error:
        raise click.ClickException(str(error)) from error
    root = directory if directory is not None else Path(name)
    click.echo(f"wrote {len(written)} files into {root}/")
    click.echo("next:")
    click.echo(f"  cd {root}")
    click.echo("  pip install --no-build-isolation .")
    click.echo(f"  conformance run --device {device_type} --quick --expected conformance/expected.yaml "
               f"--fault-op _{name}_fault")


@click.group()
def ci() -> None:
    """CI configuration for a vendor's plugin project."""


@ci.command("render")
@click.option("--system", required=True, type=click.Choice(["github", "gitlab", "jenkins"]), help="The CI system.")
@click.option("--device-type", default="npu", show_default=True, help="The device type under test.")
@click.option("--expected", default="conformance/expected.yaml", show_default=True,
              help="The expected-results file, relative to the project ('' for none).")
@click.option("--quick/--full", default=True, show_default=True, help="The quick tier or the whole suite.")
@click.option("--fault-op", default=None, help="The plugin's fault-injection op (abi.sticky.* tests).")
@click.option("--python", "python_version", default="3.11", show_default=True, help="Python version of the job.")
@click.option("--oar", "oar_requirement", default="oar", show_default=True,
              help="What pip installs for Oar: a name, a version spec, a wheel path or URL.")
@click.option("--runner", default=None,
              help="GitHub runs-on label, GitLab runner tag or Jenkins agent label of a machine with the device.")
def render(system, device_type, expected, quick, fault_op, python_version, oar_requirement, runner) -> None:
    """Print the CI configuration of SYSTEM (redirect it into the project)."""
    from oar.vendor import ci as oar_ci

    try:
        text = oar_ci.render(system, device_type=device_type, expected=expected or None, quick=quick,
                             fault_op=fault_op, python_version=python_version, oar_requirement=oar_requirement,
                             runner=runner)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(text, nl=False)
