"""The JAX backend."""

from mtbench import Backend, cpu_model, hookimpl, median_flops_per_s


_compile_events = []  # [count] once the listener is registered


def _count_compile(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _compile_events[0] += 1


class JaxBackend(Backend):
    name = "jax"
    keras_backend = "jax"
    framework_modules = ("jax", "jaxlib")
    description = "Keras 3 on JAX: train steps compiled by XLA (jax.jit)"

    def unsupported_dtype_reason(self, dtype, device):
        if device.get("kind") == "cpu" and "float16" in dtype and "bfloat16" not in dtype:
            return f"XLA on the CPU has no float16 matmul ({dtype}); use bfloat16 or mixed_bfloat16 there"
        return None

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

    def matmul_flops_per_s(self, dtype, size):
        import jax
        import jax.numpy as jnp
        a = jax.random.normal(jax.random.key(0), (size, size), dtype=dtype)
        b = jax.random.normal(jax.random.key(1), (size, size), dtype=dtype)
        matmul = jax.jit(jnp.matmul)
        return median_flops_per_s(lambda: matmul(a, b).block_until_ready(), 2 * size ** 3)

    def compilations(self):
        import jax
        if not _compile_events:
            jax.monitoring.register_event_duration_secs_listener(_count_compile)
            _compile_events.append(0)
        return _compile_events[0]

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
        from mtbench.plugins.backends.jax_jit_step import JitTrainStep
        return JitTrainStep(model)


@hookimpl
def mtbench_register_backends(register):
    register(JaxBackend())
