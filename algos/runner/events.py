"""Tensorboard event files, by tensorboard's own writer: one a run (seed_k/ in its configuration's
folder), every update's metrics at its env_steps, the hyperparameters once as a table."""
import os
import threading
import time

import numpy as np
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from . import files, reports


class Tensorboard:
    """An event file per run, flushed after each segment."""
    TAGS = {"episode_return": "charts/episodic_return", "episode_length": "charts/episodic_length",
            "episodes": "charts/episodes"}

    def __init__(self, run_dir, args, done):  # done: the env_steps already written
        self.writers, self.written = [], done.shape[1]
        for one, config_dir in files.config_dirs(run_dir, args):
            table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(one).items())
            first = Event(summary=text_pb("hyperparameters", table))
            if done.size:  # a resumed run's START: TensorBoard drops the stopped run's later steps
                first = Event(step=int(done[0, -1]) + 1,
                              session_log=SessionLog(status=SessionLog.START))
            for k in range(args.num_seeds):  # (an OSError here names its path)
                self.writers.append(EventFileWriter(os.path.join(config_dir, f"seed_{k}")))
                self.writers[-1].add_event(first)

    def write(self, metrics, last: dict):
        """metrics' updates not written yet, `last` {tag: [runs]} at each run's last step."""
        new = {k: v[:, self.written:] for k, v in metrics.items()}
        self.written, steps = metrics["env_steps"].shape[1], new.pop("env_steps")
        for r, writer in enumerate(self.writers):
            for i, step in enumerate(steps[r]):
                for k, v in new.items():
                    if np.isfinite(v[r, i]):
                        writer.add_event(self.scalar(k, v[r, i], step))
            for k, v in last.items():
                writer.add_event(self.scalar(k, v[r], metrics["env_steps"][r, -1]))
            try:
                writer.flush()
            except OSError as e:  # (its thread's: quiet_writer_errors keeps it to one line)
                raise OSError(e.errno, e.strerror, writer.get_logdir()) from None

    def write_lineages(self, args, metrics, evals):
        """--pbt, at the end: in each run's folder, lineage/<tag>: the curves of its final
        model's lineage (its ancestors' before each copy); the population best first, as text."""
        along = reports.lineages(args, metrics, evals)[0]
        self.written = 0  # (all the updates, again: as the lineage's)
        self.write({"env_steps": along.pop("env_steps"),
                    **{f"lineage/{k}": v for k, v in along.items()}}, {})
        population = "\n".join(reports.population_lines(args, metrics, evals))
        self.writers[0].add_event(Event(summary=text_pb("population by lineage", population)))
        self.writers[0].flush()

    def scalar(self, name: str, value, step) -> Event:
        value = Summary.Value(tag=self.TAGS.get(name, name.replace("loss/", "losses/")),
                              simple_value=float(value))
        return Event(wall_time=time.time(), step=int(step), summary=Summary(value=[value]))

    @staticmethod
    def quiet_writer_errors(hook):  # (threading.excepthook: write() reports a writer's error)
        if not issubclass(hook.exc_type, OSError):
            threading.__excepthook__(hook)
