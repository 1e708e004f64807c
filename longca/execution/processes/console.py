"""What a run prints on the screen: LongCA's progress lines, warnings, errors and its closing line.

Snakemake describes every job in a block of about fourteen lines and every scheduling round in two
more; on a grid of hundreds of cells they bury what a person needs.  ``quiet_screen`` keeps them off
the screen (Snakemake's own log, ``.snakemake/log/*.snakemake.log``, still has every line), unless
the run asks for them with Snakemake's ``--verbose``, or is a dry run (``-n`` prints the plan).
Errors and warnings always reach the screen.  ``closing_line_last`` prints the run's closing line
after Snakemake's own last lines, so it is the last line a person sees.
"""

from __future__ import annotations

import atexit
import logging
import sys

# Snakemake's events (the ``event`` of its log records) that describe the jobs one by one or the
# workflow's set-up: the job blocks, shell commands, "N of M steps" and the job statistics table.
JOB_EVENTS = frozenset({"run_info", "workflow_started", "shellcmd", "job_info", "job_started", "job_finished",
                        "group_info", "resources_info", "progress"})
# Its plain lines about scheduling and set-up, by how they begin.
SET_UP_LINES = ("Select jobs to execute", "Execute ", "Building DAG of jobs", "Using shell:",
                "Assuming unrestricted shared filesystem usage", "Provided cores:", "Rules claiming more threads",
                "Elapsed time:", "Job stats:")
SCREEN_HANDLER = "DefaultStreamHandler"  # the name Snakemake gives the handler that writes to the screen


class JobChatter(logging.Filter):
    """Keeps Snakemake's per-job and set-up lines off the handler it is added to; warnings, errors and
    every other line pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        event = getattr(record, "event", None)
        if event is not None and str(event) in JOB_EVENTS:
            return False
        message = record.getMessage() if isinstance(record.msg, str) else ""
        return not message.lstrip().startswith(SET_UP_LINES)


def quiet_screen(verbose: bool, dryrun: bool) -> bool:
    """Keep Snakemake's job lines off the screen for this run (not with ``--verbose`` or ``-n``).
    Returns whether it did: Snakemake's screen handler may be missing (a logger plugin replaced it)."""
    if verbose or dryrun:
        return False
    handlers = [h for h in logging.getLogger("snakemake.logging").handlers if h.name == SCREEN_HANDLER]
    for handler in handlers:
        if not any(isinstance(f, JobChatter) for f in handler.filters):
            handler.addFilter(JobChatter())
    return bool(handlers)


def closing_line_last(line: str) -> None:
    """Print ``line`` when the process ends, after Snakemake's own closing lines."""
    atexit.register(lambda: print(line, file=sys.stderr, flush=True))
