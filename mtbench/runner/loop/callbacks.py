"""The plugins' Keras callbacks around the training loop (`mtbench_keras_callbacks`), each called in turn, so that
one that raises is named with its plugin rather than surfacing as a bare exception from the loop."""

from mtbench.errors import MtbenchError, RunFailure


class PluginCallbacks:
    def __init__(self, named_callbacks, model):
        """`named_callbacks`: (plugin name, keras.callbacks.Callback) pairs (`Registry.keras_callbacks`)."""
        self.named_callbacks = list(named_callbacks)
        for plugin, callback in self.named_callbacks:
            self._call(plugin, callback, "set_model", model)

    def record(self):
        """[{plugin, callback}] of the callbacks that joined the run (the result's `keras_callbacks`)."""
        return [{"plugin": plugin, "callback": type(callback).__name__} for plugin, callback in self.named_callbacks]

    def on_train_begin(self):
        self._each("on_train_begin")

    def on_train_end(self):
        self._each("on_train_end")

    def on_train_batch_begin(self, step):
        self._each("on_train_batch_begin", step)

    def on_train_batch_end(self, step, logs):
        self._each("on_train_batch_end", step, logs)

    def _each(self, method, *args):
        for plugin, callback in self.named_callbacks:
            self._call(plugin, callback, method, *args)

    @staticmethod
    def _call(plugin, callback, method, *args):
        try:
            getattr(callback, method)(*args)
        except MtbenchError:
            raise
        except Exception as error:
            raise RunFailure(f"Keras callback {type(callback).__name__} of plugin '{plugin}' failed in {method}: "
                             f"{type(error).__name__}: {error}") from error
