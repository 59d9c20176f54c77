"""tqdm progress bars per stage, or nothing when disabled (tests, benchmarks)."""

from __future__ import annotations

import sys

from tqdm import tqdm


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def bar(self, description: str, total: int) -> tqdm | _Silent:
        if not self.enabled:
            return _Silent()
        return tqdm(total=total, desc=description, unit="batch", file=sys.stderr, mininterval=0.5, leave=True,
                    dynamic_ncols=True)

    def note(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message, file=sys.stderr)
