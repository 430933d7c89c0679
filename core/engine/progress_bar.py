"""A one-line progress display on stderr for Engine.generate and Engine.embed (use_tqdm=True)."""

from __future__ import annotations

from miro.core.engine.stats import EngineStats


class ProgressBar:
    """done / total, tokens/s and time left, on stderr; nothing when not enabled."""

    def __init__(self, total: int, enabled: bool, label: str = "generate"):
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn(label),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[speed]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task(label, total=total, speed="")
            self._bar.start()

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar:
            self._bar.update(self._task, completed=self.done)

    def show(self, stats: EngineStats) -> None:
        if self._bar:
            speed = f"{stats.prompt_tokens_per_s:.0f} prompt tok/s, {stats.generation_tokens_per_s:.0f} gen tok/s"
            self._bar.update(self._task, speed=speed)

    def close(self) -> None:
        if self._bar:
            self._bar.stop()
