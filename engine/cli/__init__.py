"""The `railyard` command line; its commands are being split out of `engine.cli.tasks`."""

from engine.cli.tasks import *  # noqa: F403
from engine.cli.tasks import app, main

__all__ = ["app", "main"]
