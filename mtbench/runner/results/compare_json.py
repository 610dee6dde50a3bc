"""The compare JSON, as `mtbench compare` writes it and `mtbench rerun` of a compare JSON: its kind and layout
version, how it was made, the comparison's figures and the runs' entries."""

import dataclasses
import shlex
import sys
import time

from mtbench.runner.measurement.environment import host_environment
from mtbench.runner.results.report import COMPARE_KIND, stopped_comparison_warning, to_json_dict
from mtbench.runner.results.schema import COMPARE_SCHEMA_VERSION


def combined_json(comparison, runs, status, about):
    """A compare JSON (`mtbench compare`'s, `mtbench rerun`'s of a compare JSON): its kind and version, `status`
    ({'status': ...}), when and by which command it was made, `about` (what the command adds), the figures of
    `comparison`, this host and `runs` (the entries of the runs). The runs of a comparison that stopped early carry
    the warning `mtbench report` of the file gives them."""
    stopped = stopped_comparison_warning(status.get("status"), status.get("status_reason"))
    figures = to_json_dict(warned(comparison, stopped) if stopped else comparison, whole=True)
    del figures["kind"]
    return {
        "kind": COMPARE_KIND,
        "schema_version": COMPARE_SCHEMA_VERSION,
        **status,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(["mtbench", *sys.argv[1:]]),
        **about,
        **figures,
        "env": host_environment(),
        "runs": runs,
    }


def warned(comparison, warning):
    """A copy of `comparison` whose every run carries `warning` too (the caller's comparison is left as it was)."""
    groups = [dataclasses.replace(group, runs=[dataclasses.replace(run, warnings=(*run.warnings, warning))
                                               for run in group.runs])
              for group in comparison.groups]
    copies = {id(old): new for old, new in zip(comparison.groups, groups)}
    return dataclasses.replace(comparison, groups=groups,
                               baseline=copies.get(id(comparison.baseline), comparison.baseline))
