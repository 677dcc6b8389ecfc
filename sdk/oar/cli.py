"""The ``oar`` command: ``oar info`` (plugins, devices, entry points),
``oar --include-dir`` (where device_api.h is installed, for vendors' builds),
``oar new-backend`` and ``oar ci render`` (a vendor's project and its CI), ``oar cache info`` and
``oar cache clear`` (the compiler's kernel cache), ``oar profile`` (a script under the profiler)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from oar.terminal import printable

__all__ = ["main", "include_dir"]


def include_dir() -> Path:
    """The directory to pass with -I: it holds oar/device_api.h and, installed, oar/plugin_support.h
    (the plugin support library, whose sources and CMake file lie in ../plugin_support)."""
    installed = Path(__file__).resolve().parent / "include"
    if (installed / "oar" / "device_api.h").is_file():
        return installed
    source = Path(__file__).resolve().parents[2] / "interface" / "include"
    if (source / "oar" / "device_api.h").is_file():
        return source
    raise click.ClickException("device_api.h is neither installed with oar nor in a source checkout")


def _text(value: object) -> str:
    """Plugin-provided text made inert for the terminal (control characters) and for rich markup."""
    return escape(printable(value))


def _bytes(count: int | None) -> str:
    if count is None:
        return "unknown"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{count} B"
        size /= 1024
    return f"{count} B"


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--include-dir", "show_include_dir", is_flag=True,
              help="Print the directory holding oar/device_api.h (for -I) and exit.")
@click.version_option(package_name="oar", prog_name="oar")
@click.pass_context
def main(ctx: click.Context, show_include_dir: bool) -> None:
    """Oar: a device plugin ABI and a framework runtime on top of it."""
    if show_include_dir:
        click.echo(str(include_dir()))
        ctx.exit(0)
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the same data as JSON.")
@click.option("--probe-timeout", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True,
              help="Seconds a plugin may take to load in its probe process before it is reported as hung.")
def info(as_json: bool, probe_timeout: float) -> None:
    """Show the plugins found and failed, their devices and entry points. Each plugin is loaded in
    a probe process first: one that crashes or hangs there is reported, not loaded."""
    import oar

    oar.plugin_manager.probe_before_loading(probe_timeout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", oar.PluginWarning)  # failures are listed below instead
        data = oar.plugins_info()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = Console(highlight=False)
    console.print(f"[bold]Oar[/bold] {oar.__version__}, host ABI {data['host_abi_version']}")
    plugins = data["plugins"]
    if not plugins:
        console.print("[yellow]no plugins found[/yellow] (set OAR_PLUGIN_PATH, or install a vendor's wheel)")
    summary = Table(title="plugins", title_justify="left")
    for column in ("device type", "status", "path", "origin"):
        summary.add_column(column, overflow="fold")
    for plugin in plugins:
        colour = {"loaded": "green", "failed": "red"}.get(plugin["status"], "yellow")
        summary.add_row(_text(plugin["device_type"] or "-"), f"[{colour}]{plugin['status']}[/{colour}]",
                        _text(plugin["path"]), _text(plugin["origin"]))
    if plugins:
        console.print(summary)
    for plugin in plugins:
        if plugin["status"] in ("failed", "duplicate"):
            console.print(f"[red]{plugin['status']}[/red] {_text(plugin['path'])}: {_text(plugin['error'])}")
    for plugin in plugins:
        if plugin["status"] == "loaded":
            _print_plugin(console, plugin, data["host_abi_version"])


def _print_plugin(console: Console, plugin: dict, host_abi: str) -> None:
    console.rule(f"[bold]{_text(plugin['device_type'])}[/bold]  {_text(plugin['path'])}")
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    same_minor = plugin["abi_version"] == host_abi
    abi_note = "" if same_minor else "  (same major: compatible)"
    table.add_row("plugin version", _text(plugin["version"] or "-"))
    table.add_row("plugin ABI", f"{_text(plugin['abi_version'])} (host {host_abi}){abi_note}")
    table.add_row("capabilities", _text(", ".join(plugin["capabilities"]) or "none"))
    table.add_row("devices", str(plugin["device_count"]))
    table.add_row("optional entries", _text(", ".join(plugin["optional_provided"]) or "none"))
    table.add_row("not provided", _text(", ".join(plugin["optional_missing"]) or "none"))
    for warning in plugin["warnings"]:
        table.add_row("[yellow]warning[/yellow]", _text(warning))
    console.print(table)
    for device in plugin["devices"]:
        device_table = Table(title=f"{_text(plugin['device_type'])}:{device['index']}", title_justify="left",
                             show_header=False, padding=(0, 2))
        device_table.add_column(style="bold")
        device_table.add_column()
        if "properties_error" in device:
            device_table.add_row("properties", f"[red]{_text(device['properties_error'])}[/red]")
        for key, value in device.get("properties", {}).items():
            shown = _bytes(value) if key == "total_memory" else value
            device_table.add_row(key, _text(shown))
        if "memory" in device:
            device_table.add_row("memory free", _bytes(device["memory"]["free"]))
        elif "memory_error" in device:
            device_table.add_row("memory", f"[red]{_text(device['memory_error'])}[/red]")
        else:
            device_table.add_row("memory free", "unknown (no device_memory_info)")
        console.print(device_table)


def _kernel_cache_module():
    """oar_codegen.kernel_cache, imported only here: the other commands work without the compiler."""
    try:
        from oar_codegen import kernel_cache
    except ModuleNotFoundError as error:
        if error.name not in ("oar_codegen", "oar_codegen.kernel_cache"):
            raise click.ClickException(f"the kernel cache could not be loaded: {error}") from error
        raise click.ClickException("the kernel cache belongs to Oar's compiler (the oar_codegen package), "
                                   "which is not installed with this oar") from error
    return kernel_cache


def _open_kernel_cache():
    kernel_cache = _kernel_cache_module()
    try:
        return kernel_cache.KernelCache()
    except kernel_cache.KernelCacheError as error:
        raise click.ClickException(str(error)) from error


@main.group()
def cache() -> None:
    """The compiler's kernel cache (under OAR_CACHE_DIR, else the user's cache directory)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print the same data as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="List every entry with its key.")
def cache_info(as_json: bool, verbose: bool) -> None:
    """Show where the kernel cache is, its entries and their size."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel_cache = _open_kernel_cache()
    summary = kernel_cache.info(verbose=verbose)
    if as_json:
        data = {"root": str(summary.root), "entries": summary.entries, "total_bytes": summary.total_bytes,
                "corrupt_entries": summary.corrupt_entries, "warnings": [str(w.message) for w in caught],
                "refused": [{"path": str(item.path), "problem": item.problem} for item in summary.refused]}
        if verbose:
            data["details"] = [{"path": str(e.path), "digest": e.digest, "size": e.size, "key": e.key,
                                "problem": e.problem} for e in summary.details]
        click.echo(json.dumps(data, indent=2))
        return
    console = Console(highlight=False)
    for warning in caught:
        console.print(f"[yellow]warning[/yellow] {_text(warning.message)}")
    table = Table(title="kernel cache", title_justify="left", show_header=False, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("path", _text(summary.root))
    table.add_row("entries", str(summary.entries))
    table.add_row("size", _bytes(summary.total_bytes))
    if summary.corrupt_entries:
        table.add_row("corrupt", f"[red]{summary.corrupt_entries}[/red] (removed when next read, or by oar cache clear)")
    if summary.refused:
        table.add_row("refused", f"[red]{len(summary.refused)}[/red] (never followed or loaded; removed by oar cache clear)")
    console.print(table)
    for item in summary.refused:
        console.print(f"[red]refused[/red] {_text(item.path)}: {_text(item.problem)}")
    if verbose and summary.details:
        entries = Table(title="entries", title_justify="left")
        entries.add_column("digest", no_wrap=True)
        for column in ("size", "target", "lang", "compiler", "flags", "device properties", "source"):
            entries.add_column(column, overflow="fold")
        for entry in summary.details:
            if entry.key is None:
                entries.add_row(entry.digest[:12], _bytes(entry.size), f"[red]{_text(entry.problem)}[/red]",
                                "", "", "", "", "")
                continue
            key = entry.key
            properties = ", ".join(f"{name}={value}" for name, value in key.get("device_properties", []))
            entries.add_row(entry.digest[:12], _bytes(entry.size), _text(key.get("target")), _text(key.get("lang")),
                            _text(key.get("compiler_identity")), _text(key.get("flags")), _text(properties),
                            f"{len(key.get('source', ''))} chars")
        console.print(entries)


@cache.command("clear")
def cache_clear() -> None:
    """Remove every kernel cache entry, and links or special files in their place (other files in
    the directory are left alone)."""
    kernel_cache = _open_kernel_cache()
    refused = kernel_cache.info().refused
    removed = kernel_cache.clear()
    console = Console(highlight=False)
    for item in refused:
        console.print(f"removed {_text(item.path)}: {_text(item.problem)}")
    console.print(f"removed {removed} kernel cache entr{'y' if removed == 1 else 'ies'} "
                  f"from {_text(kernel_cache.root)}")


# The vendor's tooling: `oar new-backend` and `oar ci render` (oar/vendor/scaffold/cli.py).
from oar.vendor.scaffold.cli import ci as _ci, new_backend as _new_backend  # noqa: E402

main.add_command(_new_backend)
main.add_command(_ci)

# `oar profile script.py [args...]` (oar/profiler/_cli.py).
from oar.profiler._cli import profile_command as _profile_command  # noqa: E402

main.add_command(_profile_command)


@main.command("serve")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--device", default=None, help="Device type or 'type:index' (default: the current device).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--max-batch", default=8, show_default=True, help="Requests decoded together (KV-cache rows).")
@click.option("--max-waiting", default=64, show_default=True, help="Requests queued beyond those; more get 429.")
@click.option("--max-tokens-limit", default=None, type=int, help="Largest max_tokens a request may ask for.")
def serve(path, device, host, port, max_batch, max_waiting, max_tokens_limit) -> None:
    """Serve a model file (oar.serve.save_model) over HTTP: an OpenAI-style /v1/completions."""
    from oar.serve.app import run

    run(path, device, host, port, max_batch, max_waiting, max_tokens_limit)


if __name__ == "__main__":
    main()
