"""Reporters on the results a command writes: each runs on its own, so one that fails is named and the others
still run, and the result file it was given stays where it is. A reporter that did not follow the run while it
trained (in `compare`'s parent process, in `report`) is first told the run as it happened, from its history, so
that an experiment tracker records a saved result as it would have recorded the run."""

from rich.console import Console

from mtbench.runner.results.tracking import replay


def reporters_console(console):
    """The console a reporter prints to: where `console` prints, as wide and in its colours, with rich's markup on,
    as the plugin guide gives it (`[bold]` is bold). mtbench's own console reads no markup, so that the text it
    prints is shown as given (a path `corp[red].tsv` whole); its own reporters print plain text likewise."""
    return Console(file=console.file, width=console.width, color_system=console.color_system,
                   force_terminal=console.is_terminal, no_color=console.no_color, quiet=console.quiet,
                   soft_wrap=console.soft_wrap)


def run_reporters(reporters, registry, result, console, result_path, followed=False):
    """Runs every reporter on `result` (complete or partial, as its status says); `followed`: the reporters
    followed the run as it trained. Returns one line for each reporter that failed."""
    failures = []
    if not followed:
        trackers = replay(reporters, result, result_path, registry)
        reporters, failures = [r for r in reporters if r not in trackers.failed], list(trackers.failures)
    complete = result.get("status") == "completed"
    console = reporters_console(console)
    for reporter in reporters:
        try:
            registry.call("reporters", reporter, "report", result, console, complete)
        except Exception as error:  # a third-party reporter: name it; the result itself is safe on disk
            plugin = registry.provider.get(("reporters", reporter.name), "?")
            failure = (f"reporter '{reporter.name}' of plugin '{plugin}' failed: {type(error).__name__}: {error}; "
                       f"the result is in {result_path}")
            failures.append(failure)  # the command ends with it, once: no warning besides
    return failures
