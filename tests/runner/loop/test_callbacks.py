"""The plugins' Keras callbacks: one that raises is named with its plugin; a hook that returns anything but
callbacks is left out with a warning, as one that raises is."""

import types

import pluggy
import pytest

from mtbench.errors import RunFailure
from mtbench.plugins import hookspecs
from mtbench.plugins.manager import Registry
from mtbench.runner.loop.callbacks import PluginCallbacks


def test_a_callback_that_raises_is_named_with_its_plugin():
    class Counting:
        def set_model(self, model):
            self.model, self.steps = model, []

        def on_train_batch_end(self, step, logs):
            self.steps.append(step)

    class Boom(Counting):
        def on_train_batch_end(self, step, logs):
            raise RuntimeError(f"boom at step {step}")

    counting = Counting()
    callbacks = PluginCallbacks([("counter", counting), ("hunt", Boom())], model="the model")
    assert counting.model == "the model"
    with pytest.raises(RunFailure, match=r"^Keras callback Boom of plugin 'hunt' failed in on_train_batch_end: "
                                         r"RuntimeError: boom at step 2$"):
        callbacks.on_train_batch_end(2, {"loss": 1.0})
    assert counting.steps == [2]  # the plugins before it were called


def test_a_hook_that_returns_no_callbacks_is_left_out_with_a_warning():
    import keras
    manager = pluggy.PluginManager("mtbench")
    manager.add_hookspecs(hookspecs)
    for name, returned in (("careless", lambda config: "nope"), ("careful", lambda config: [keras.callbacks.History()])):
        module = types.ModuleType(name)
        module.mtbench_keras_callbacks = hookspecs.hookimpl(returned)
        manager.register(module, name=name)
    registry = Registry(hook=manager.hook)
    callbacks = registry.keras_callbacks(config=None)
    assert [(plugin, type(callback).__name__) for plugin, callback in callbacks] == [("careful", "History")]
    assert registry.warnings == ["plugin 'careless' failed in mtbench_keras_callbacks and was left out: "
                                 "TypeError(\"it returned 'nope', not a list of keras.callbacks.Callback\")"]
