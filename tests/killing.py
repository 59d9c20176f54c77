"""Fault injection for the pipeline tests: kill one actor once, at a chosen batch."""

import ray


def killer(actors, role: str, at: tuple[int, int], restart: bool):
    """An on_batch hook that kills `role`'s actor once, when batch `at` = (visit, index) has been submitted; and the
    list it appends to when it did (Ray restarts the actor if `restart`, else the runner must start a new one)."""
    done = []

    def hook(visit, index):
        if (visit, index) == at and not done:
            done.append(True)
            ray.kill(actors.handle(role), no_restart=not restart)
    return hook, done
