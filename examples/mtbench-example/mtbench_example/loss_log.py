"""The extra `loss-log`: wraps whatever train step was chosen before it (the backend's fast step, Keras's own,
or an earlier extra's) and records what really went through it."""

import math

from mtbench import Extra, WrappingStep


class LossLogStep(WrappingStep):
    """Calls the step it wraps and records each step's loss and every `finalize`. `WrappingStep` passes on
    `finalize` and whether the inner step trains through Keras's compiled function."""

    def __init__(self, inner, log):
        super().__init__(inner)
        self.log = log  # the extra's state for this run, kept in run.extras_state["loss-log"]
        self.name = f"{inner.name}+loss-log"

    def __call__(self, x, y, sample_weight):
        logs = self.inner(x, y, sample_weight)
        # The batch's loss, computed before the update, kept as the step returned it: a framework scalar the
        # device may still be computing. float() here would wait for the device on every step (the loop reads
        # losses only at the edges of its timing windows); `LossLog.record` reads them once training is over.
        self.log["losses"].append(logs["loss"])
        return logs

    def finalize(self):
        # A step that keeps the weights outside the Keras variables (the JAX fast step) writes them back in its
        # finalize, and evaluation reads the Keras variables: always pass it on.
        self.log["finalize_calls"] += 1
        super().finalize()


class LossLog(Extra):
    name = "loss-log"
    description = "wraps the train step and records each step's loss and the step it wrapped"
    backends = ("jax", "torch")
    wraps_step = True  # whatever step it is given: a compiler mtbench adds (--step) goes before it

    def make_train_step(self, run, model, step):
        log = {"wrapped_step": step.name, "losses": [], "finalize_calls": 0}
        run.extras_state[self.name] = log
        return LossLogStep(step, log)

    def record(self, run):
        """Facts, not intentions: how many steps really went through the wrapper and with which losses (null
        where a loss was not finite, as in the result's history)."""
        log = run.extras_state[self.name]
        losses = [float(loss) for loss in log["losses"]]  # training is over: reading them stalls nothing
        losses = [loss if math.isfinite(loss) else None for loss in losses]
        return {"wrapped_step": log["wrapped_step"], "steps": len(losses), "losses": losses,
                "finalize_calls": log["finalize_calls"]}
