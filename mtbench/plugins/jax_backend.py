"""The JAX backend."""

from mtbench.plugins.api import Backend
from mtbench.plugins.hookspecs import hookimpl
from mtbench.runner.hardware import cpu_model


class JaxBackend(Backend):
    name = "jax"
    keras_backend = "jax"
    framework_modules = ("jax", "jaxlib")
    description = "Keras 3 on JAX: train steps compiled by XLA (jax.jit)"

    def framework_versions(self):
        import jax
        import jaxlib
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}

    def device_info(self):
        import jax
        devices = jax.devices()
        first = devices[0]
        name = cpu_model() if first.platform == "cpu" else first.device_kind
        return {"kind": first.platform, "name": name, "count": len(devices)}

    def synchronize(self, model=None):
        import jax
        # XLA runs asynchronously: a clock is only honest once the values the step produced exist.
        if model is not None:
            jax.block_until_ready([v.value for v in model.variables])
        jax.effects_barrier()

    def peak_device_bytes(self):
        import jax
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
        peaks = [p for p in peaks if p is not None]
        return sum(peaks) if peaks else None

    def compile_inference(self, fn, model):
        import jax
        import keras

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return fn(*args)

        compiled = jax.jit(stateless)

        def call(*args):
            # Read the variables afresh on every call: Keras may have replaced the arrays since the last one.
            return compiled([v.value for v in model.variables], *args)

        return call

    def make_train_step(self, run, model):
        import keras
        if keras.distribution.distribution() is not None:
            return None  # Keras's own step lays the state out over the mesh; this one does not
        from mtbench.plugins.jax_jit_step import JitTrainStep
        return JitTrainStep(model)


@hookimpl
def mtbench_register_backends(register):
    register(JaxBackend())
