"""Time to target quality, as MLPerf measures it: BLEU of greedy translations of the validation set every
--eval-every steps, and the training wall time (the evaluations' own time kept apart) at which it first reaches
--target-bleu. A target that is not reached is a result too."""

from dataclasses import dataclass, field


@dataclass
class QualityTarget:
    target_bleu: float = None
    eval_every: int = None
    evaluations: list = field(default_factory=list)  # {"step", "bleu", "chrf", "training_s", "seconds"}

    def due(self, step):
        return self.eval_every is not None and step % self.eval_every == 0

    def record(self, step, bleu, chrf, training_s, seconds):
        """Adds an evaluation; True when it reaches the target."""
        self.evaluations.append({"step": step, "bleu": bleu, "chrf": chrf, "training_s": training_s,
                                 "seconds": seconds})
        return self.target_bleu is not None and bleu >= self.target_bleu

    def reached(self):
        if self.target_bleu is None:
            return None
        return next((e for e in self.evaluations if e["bleu"] >= self.target_bleu), None)

    def to_dict(self):
        """The `target` section of the result; None when the run evaluated nothing along the way."""
        if self.eval_every is None:
            return None
        reached = self.reached()
        outcome = None if self.target_bleu is None else ("reached" if reached else "not reached")
        return {
            "metric": "bleu", "split": "valid", "target_bleu": self.target_bleu, "eval_every": self.eval_every,
            "outcome": outcome,
            "steps_to_target": reached["step"] if reached else None,
            "time_to_target_s": reached["training_s"] if reached else None,
            "evaluation_s": sum(e["seconds"] for e in self.evaluations),
            "evaluations": list(self.evaluations),
        }
