"""The live view of a training run: a progress bar per epoch, a line per epoch and evaluation.

An observer of the run (run/observers.py); refreshes at most twice a second from its own
thread, so it costs the loop almost nothing.
"""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hpcai500_tf.report.console import console
from hpcai500_tf.run.observers import Observer


class LiveView(Observer):
    def __init__(self):
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            refresh_per_second=2,
            transient=True,
        )
        self.task = None

    def message(self, text: str) -> None:
        console.print(text, style="dim", markup=False)

    def on_epoch_start(self, epoch: int, epochs: int, steps: int) -> None:
        if self.task is None:
            self.progress.start()
        else:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(
            "train", total=steps, epoch=f"{epoch}/{epochs}", loss="-", lr="-", rate=""
        )

    def on_step(self, step: int, loss: float, learning_rate: float, examples_per_s: float) -> None:
        self.progress.update(
            self.task,
            completed=step,
            loss=f"{loss:.4f}",
            lr=f"{learning_rate:.4g}",
            rate=f"{examples_per_s:,.0f} ex/s",
        )

    def on_epoch_end(self, epoch: int, loss: float, examples_per_s: float) -> None:
        self.progress.console.print(
            f"epoch {epoch:>3}  loss {loss:.4f}  {examples_per_s:,.1f} examples/s"
        )

    def on_eval(self, epoch: int, quality: float, target: float) -> None:
        mark = "[green]target reached[/green]" if quality >= target else f"target {target}"
        self.progress.console.print(
            f"          eval after epoch {epoch}: quality {quality:.4f}  ({mark})"
        )

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()
