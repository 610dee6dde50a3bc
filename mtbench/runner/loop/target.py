"""Time to target quality, as MLPerf measures it: the task's validation figure (BLEU of its translations, greedy or
--beam's; a language model's loss) every --eval-every steps, and the training wall time (the evaluations' own time
kept apart) at which it first reaches the target (--target-bleu, --target-loss). A target that is not reached is a
result too."""

from dataclasses import dataclass, field


@dataclass
class QualityTarget:
    metric: str = "bleu"           # the task's validation figure (`Task.validation_metric`)
    target: float = None
    higher_is_better: bool = True
    eval_every: int = None
    evaluations: list = field(default_factory=list)  # {"step", the task's validation figures, "training_s", "seconds"}

    def due(self, step):
        return self.eval_every is not None and step % self.eval_every == 0

    def reaches(self, value):
        return self.target is not None and (value >= self.target if self.higher_is_better else value <= self.target)

    def record(self, step, scores, training_s, seconds):
        """Adds an evaluation ({figure: value} of the validation split); True when it reaches the target."""
        self.evaluations.append({"step": step, **scores, "training_s": training_s, "seconds": seconds})
        return self.reaches(scores[self.metric])

    def best(self):
        """The evaluation of the best validation figure so far (the first of equals), or None."""
        if not self.evaluations:
            return None
        choose = max if self.higher_is_better else min
        return choose(self.evaluations, key=lambda e: e[self.metric])

    def latest_is_best(self):
        """Whether the latest evaluation is better than every earlier one (the first is)."""
        return bool(self.evaluations) and self.best() is self.evaluations[-1]

    def reached(self):
        if self.target is None:
            return None
        return next((e for e in self.evaluations if self.reaches(e[self.metric])), None)

    def to_dict(self):
        """The `target` section of the result; None when the run evaluated nothing along the way."""
        if self.eval_every is None:
            return None
        reached = self.reached()
        outcome = None if self.target is None else ("reached" if reached else "not reached")
        return {
            "metric": self.metric, "split": "valid", "target": self.target,
            f"target_{self.metric}": self.target, "eval_every": self.eval_every,
            "outcome": outcome,
            "steps_to_target": reached["step"] if reached else None,
            "time_to_target_s": reached["training_s"] if reached else None,
            "evaluation_s": sum(e["seconds"] for e in self.evaluations),
            "best": self._best_record(),
            "evaluations": list(self.evaluations),
        }

    def _best_record(self):
        best = self.best()
        if best is None:
            return None
        return {"step": best["step"], self.metric: best[self.metric], "saved": best.get("saved_as_best")}
