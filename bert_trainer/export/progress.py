"""The progress line of `predict` and `generate` on stderr."""

import time


class Progress:
    """A progress line on stderr: lines read (of the total when known), inputs answered, rate.

    On a terminal it is redrawn in place after every batch; in a log it prints a line every
    `log_interval` seconds, so a long run shows it is alive without flooding the log.
    """

    def __init__(self, stream, total_lines: int | None = None, log_interval: float = 10.0, *,
                 command: str = "predict", done: str = "answered"):
        self.stream, self.total_lines = stream, total_lines
        self.command, self.done = command, done  # "generate: ... | 3 generated"
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.log_interval = log_interval
        self._start = self._last = time.perf_counter()

    def update(self, lines: int, answered: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not (self.tty or final or now - self._last >= self.log_interval):
            return
        self._last = now
        rate = answered / max(now - self._start, 1e-9)
        if self.total_lines:
            filled = int(20 * lines / self.total_lines)
            where = f"[{'#' * filled}{'.' * (20 - filled)}] line {lines}/{self.total_lines}"
        else:
            where = f"line {lines}"
        text = f"{self.command}: {where} | {answered} {self.done} | {rate:.1f}/s"
        end = "\n" if final or not self.tty else ""
        print(("\r\x1b[K" if self.tty else "") + text, end=end, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """Prints a line without mangling the progress line."""
        print(("\r\x1b[K" if self.tty else "") + text, file=self.stream, flush=True)
