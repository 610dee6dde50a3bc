"""`--report-to tensorboard`: the run's figures as TensorBoard event files, streamed while it trains.

Events go to RESULT.run/tensorboard, or with --logging-dir to LOGGING_DIR/GROUP/RESULT-NAME, so that one
`tensorboard --logdir LOGGING_DIR` shows every run of a comparison side by side. TensorBoard has no run
parameters of its own: the configuration and tags are written as its hparams and as config.json beside the
events."""

import json
import os
import time

from mtbench import Reporter, hookimpl


class TensorBoardTracker(Reporter):
    name = "tensorboard"
    description = "experiment tracker: TensorBoard event files, streamed while the run trains"
    needs = ("tensorboard",)
    install_hint = "pip install 'mtbench[tensorboard]'"

    def __init__(self):
        self.writer = None

    def start(self, run):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        directory = event_directory(run)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            json.dump({"name": run.name, "group": run.group, "tags": run.tags, "config": run.config}, f, indent=2)
        self.writer = EventFileWriter(directory)
        self._write(hparams_summary(run.tags), step=0)

    def log(self, metrics, step):
        from tensorboard.compat.proto.summary_pb2 import Summary
        values = [Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()]
        self._write(Summary(value=values), step)

    def _write(self, summary, step):
        from tensorboard.compat.proto.event_pb2 import Event
        if summary is not None:
            self.writer.add_event(Event(summary=summary, step=step, wall_time=time.time()))
            self.writer.flush()  # a run that crashes keeps every figure it got to

    def report(self, result, console, complete):
        self.log({"completed": 1.0 if complete else 0.0}, len(result["history"]))
        self.writer.close()  # flushes every event to disk
        self.writer = None


def event_directory(run):
    if run.logging_dir is None:
        return os.path.join(run.directory, "tensorboard")
    stem = os.path.splitext(os.path.basename(run.result_path))[0]
    return os.path.join(run.logging_dir, *([run.group] if run.group else []), stem)


def hparams_summary(tags):
    """The run's tags as TensorBoard hparams (a session-start summary of the hparams plugin, built from its
    protos, which need no TensorFlow), so that the HParams tab filters runs by backend, extras and dtype."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2
    start = plugin_data_pb2.SessionStartInfo()
    for name, value in tags.items():
        start.hparams[name].string_value = str(value)
    content = plugin_data_pb2.HParamsPluginData(session_start_info=start, version=metadata.PLUGIN_DATA_VERSION)
    return Summary(value=[Summary.Value(tag=metadata.SESSION_START_INFO_TAG, tensor=metadata.NULL_TENSOR,
                                        metadata=metadata.create_summary_metadata(content))])


@hookimpl
def mtbench_register_reporters(register):
    register(TensorBoardTracker())
