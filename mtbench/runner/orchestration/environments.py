"""What is checked before a comparison trains anything: the devices each backend sees (asked of a child `mtbench
env`, so that this process holds no device), the other environments' interpreters that entries name, and every
run's backend and extras."""

import importlib.util
import json
import os
import subprocess
import sys

from mtbench.errors import MtbenchError
from mtbench.runner.orchestration.children import last_error_line
from mtbench.runner.results.report import configuration_differences
from mtbench.runner.setup import require_extra_spanning_processes, resolve_backend, resolve_extras

def probe_devices(runs=()):
    """{backend: its devices (`Backend.device_info()`), or None where it is unavailable}, asked of a child
    (`preflight.py`): importing the frameworks here would hold device memory while the runs train. The child also
    asks each of `runs` (`runs_to_preflight`: the runs under this interpreter) whether its device
    refuses it, as the run would at its start, and what their extras' `config_changes` change: the first refusal
    (or change that parts the runs, `refuse_changes_that_part_runs`) is raised here, before anything trains."""
    answer = probe_environment(sys.executable, "cannot tell which devices the backends see", PREFLIGHT_COMMAND,
                               json.dumps(list(runs)))
    if answer["refusals"]:
        label, reason = next(iter(answer["refusals"].items()))
        raise MtbenchError(f"run '{label}': {reason}")
    refuse_changes_that_part_runs(runs, answer.get("changes") or {})
    return backend_devices(answer["environment"])


def refuse_changes_that_part_runs(runs, changes):
    """Runs that their extras' `config_changes` (`changes`: {label: {"config", "changed_by": {key: extra}}}, as the
    preflight asked them) make differ beyond what a comparison may vary would train, then be refused as not
    comparable: refused here instead, naming the extra."""
    configs = {run["label"]: (changes.get(run["label"]) or {}).get("config", run["config"]) for run in runs}
    for label, changed in changes.items():
        for other in configs:
            differences = [] if other == label else configuration_differences(configs[label], configs[other])
            for key, value, others in differences:
                extra = changed["changed_by"].get(key)
                if extra:
                    raise MtbenchError(f"run '{label}': extra '{extra}' sets {key} to {value!r} (its config_changes), "
                                       f"where run '{other}' trains with {others!r}: the runs would not be "
                                       f"comparable; only backend, extras, the model size flags and the sweep keys "
                                       f"may differ")


def runs_to_preflight(specs, configs):
    """The runs whose device refusals `probe_devices` can tell ([{label, config, processes}]): those under this
    interpreter (another interpreter's sees its own devices; of several processes, what `preflight` can tell without
    the devices they join). `configs`: each run's configuration as a dict (`TrainConfig.to_dict`)."""
    return [{"label": spec.label, "config": config, "processes": spec.processes}
            for spec, config in zip(specs, configs) if not spec.foreign]


ENV_COMMAND = ("-m", "mtbench", "env", "--json")
PREFLIGHT_COMMAND = ("-m", "mtbench.runner.orchestration.preflight")


def probe_environment(python, failing, command=ENV_COMMAND, given=""):
    """The JSON that `command` (`mtbench env --json`) prints under the interpreter `python`, in a child, `given`
    on its input; `failing` begins the line of its failure."""
    environment = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    process = subprocess.run([python, *command], capture_output=True, text=True, env=environment, input=given)
    if process.returncode != 0:
        what = "`mtbench env`" if command == ENV_COMMAND else "its check"
        raise MtbenchError(f"{failing}: {what} failed ({last_error_line(process.stderr, process.returncode)})")
    return json.loads(process.stdout)


def backend_devices(description):
    return {name: described.get("device") if described.get("available") else None
            for name, described in description["backends"].items()}


def check_interpreters(specs):
    """{interpreter: its `mtbench env --json`} of every other environment an entry names (python=PATH), each
    checked before any run starts: the file exists, is executable, and imports mtbench."""
    described = {}
    for spec in specs:
        path = spec.interpreter
        if not spec.foreign or path in described:
            continue
        where = f"run '{spec.label}': python={path}"
        if not os.path.exists(path):
            raise MtbenchError(f"{where}: no such file")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise MtbenchError(f"{where}: not an executable file")
        try:
            process = subprocess.run([path, "-c", "import mtbench"], capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL)
        except OSError as error:
            raise MtbenchError(f"{where}: cannot start it ({error.strerror})") from None
        if process.returncode != 0:
            raise MtbenchError(f"{where}: cannot import mtbench ({last_error_line(process.stderr, process.returncode)}"
                               f"); install mtbench into that environment")
        described[path] = probe_environment(path, where)
    return described


def _check_in_environment(spec, description):
    """The backend and extras of a run under another interpreter, as that environment's `mtbench env` sees them."""
    backend = description["backends"].get(spec.backend)
    if backend is None:
        raise MtbenchError(f"run '{spec.label}': unknown backend '{spec.backend}' in {spec.interpreter} (it has "
                           f"{', '.join(description['backends']) or 'none'})")
    if not backend.get("available"):
        raise MtbenchError(f"run '{spec.label}': backend '{spec.backend}' is not available in {spec.interpreter}: "
                           f"{backend.get('reason')}")
    for extra in spec.extras:
        known = description.get("extras", {}).get(extra)
        if known is None or spec.backend not in known.get("backends", ()):
            raise MtbenchError(f"run '{spec.label}': {spec.interpreter} has no extra '{extra}' for {spec.backend}")


def device_text(device):
    return f"{device.get('kind')} ({device.get('name')})"


def check_same_hardware(specs, devices, interpreters=None):
    """Runs whose backends see different hardware (JAX's CPU build beside torch's CUDA build) would compare
    machines, not frameworks: refused before anything trains. `interpreters`: `check_interpreters`' answer, for
    the runs under another environment's interpreter (whose backends may see other devices)."""
    seen = {}
    for spec in specs:
        other = (interpreters or {}).get(spec.interpreter) if spec.foreign else None
        device = (backend_devices(other) if other else devices).get(spec.backend)
        if device:
            seen.setdefault(f"{spec.backend} in {spec.python_name}" if other else spec.backend, device)
    kinds = {(device.get("kind"), device.get("name")) for device in seen.values()}
    if len(kinds) <= 1:
        return
    listed = ", ".join(f"{backend} sees {device_text(device)}" for backend, device in seen.items())
    on_cpu = [backend for backend, device in seen.items() if device.get("kind") == "cpu"]
    hint = ""
    if on_cpu and len(on_cpu) < len(seen):
        builds = {"jax": "JAX: pip install 'mtbench[jax-cuda]'", "torch": "torch: a CUDA build of torch"}
        how = "; ".join(builds[name] for name in on_cpu if name in builds) or "see the backend's documentation"
        hint = (f"; {' and '.join(on_cpu)} see{'s' if len(on_cpu) == 1 else ''} only the CPU on a machine with an "
                f"accelerator: install its accelerator build ({how})")
    raise MtbenchError(f"the runs would train on different hardware: {listed}{hint}")


def check_runs(specs, registry, interpreters=None):
    """Every backend and extra exists, is installed and fits its run: checked before any process starts (for a
    run under another interpreter, in that environment: `interpreters`, else asked here)."""
    interpreters = check_interpreters(specs) if interpreters is None else interpreters
    for spec in specs:
        if spec.foreign:
            _check_in_environment(spec, interpreters[spec.interpreter])
            if spec.processes > 1 and not interpreters[spec.interpreter]["host"].get("torch"):
                raise MtbenchError(f"run '{spec.label}': several processes are started with torchrun, which "
                                   f"{spec.interpreter} lacks (it comes with torch)")
            continue
        try:
            backend = resolve_backend(spec.backend, registry)
            require_extra_spanning_processes(spec.processes, backend, resolve_extras(spec.extras, backend, registry),
                                             registry)
        except MtbenchError as error:
            raise MtbenchError(f"run '{spec.label}': {error}") from None
        if spec.processes > 1 and importlib.util.find_spec("torch") is None:
            raise MtbenchError(f"run '{spec.label}': several processes are started with torchrun, which comes "
                               f"with torch (pip install 'mtbench[torch]')")
