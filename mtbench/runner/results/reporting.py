"""Reporters on the results a command writes: each runs on its own, so one that fails is named and the others
still run, and the result file it was given stays where it is."""


def run_reporters(reporters, registry, result, console, result_path):
    """Runs every reporter on `result` (complete or partial, as its status says); returns one line for each
    reporter that failed."""
    complete = result.get("status") == "completed"
    failures = []
    for reporter in reporters:
        try:
            reporter.report(result, console, complete)
        except Exception as error:  # a third-party reporter: name it; the result itself is safe on disk
            plugin = registry.provider.get(("reporters", reporter.name), "?")
            failures.append(f"reporter '{reporter.name}' of plugin '{plugin}' failed: {type(error).__name__}: "
                            f"{error}; the result is in {result_path}")
    for failure in failures:
        registry.warn(failure)
    return failures
