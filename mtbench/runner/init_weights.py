"""`mtbench init-weights`: the initial weights of a configuration (drawn with numpy from its seed, or a pretrained
model's), written to a backend-neutral weights file that every run of a comparison loads."""

from mtbench.runner.data.weights_file import write_weights_file
from mtbench.runner.loop.timing import Stopwatch
from mtbench.runner.results.output import check_output_path
from mtbench.plugins.api import RunContext
from mtbench.runner.setup import build_model, choose_plugins, import_keras, initial_values, resolve_reporters
from mtbench.runner.training import prepare_data, read_data


def write_initial_weights(config, registry, console, path, overwrite=False):
    """Draws the initial weights of `config`'s model from its seed and writes them to a weights file; returns
    the file's sha256.

    The numpy draw needs every variable's Keras path and shape, and the embedding's shape depends on the
    tokenizer's vocabulary, known only once the corpus is read. Rather than restate the model's structure
    without keras (a second description that could drift from the real one), this prepares the data and builds
    the model exactly as a run does, on `config.backend`, and writes only numpy arrays: the file is
    backend-neutral although keras named its variables. Like a run, it needs a process of its own, because
    keras fixes its backend at import."""
    # compare passes its runs' trackers on: named as train names them, they follow nothing here
    resolve_reporters(config.report_to, registry)
    plugins = choose_plugins(config, registry)
    check_output_path(path, overwrite, kind=".npz", reads=config.input_files())
    stopwatch = Stopwatch()
    raw = read_data(config, plugins, console, stopwatch)
    import_keras(config, plugins.backend, registry=plugins.registry)
    plugins.backend.open_compile_cache(config)  # as a run's: the draw's programs compiled once for both
    data = prepare_data(config, plugins, raw, stopwatch)
    model, _ = build_model(RunContext(config=config, backend=plugins.backend, task=plugins.task), plugins,
                           data.tokenizer)
    weights, init = initial_values(config, plugins, model)
    return write_weights_file(path, weights, init)
