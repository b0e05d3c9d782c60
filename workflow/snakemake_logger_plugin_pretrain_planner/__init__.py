"""Checks each `snakemake --configfile` before Snakemake loads it (pretrain_planner/configfiles.py).

Snakemake reads --configfile in its command-line code, before any line of the Snakefile runs, and says a YAML
mistake without the file or the line. What it does import first is every installed `snakemake_logger_plugin_*`
package (its plugin registries are built with its command line), so this package, shipped in the pretrain-planner
distribution, is imported by each `snakemake` process of an environment where pretrain-planner is installed, however
it was installed, and by no other process. Importing it wraps Snakemake's config-file loader; a file that passes the
check is loaded by Snakemake's own code.

To be imported Snakemake's registry requires it to be a valid logger plugin, so it is one: `--logger
pretrain-planner` writes each log record's message to stderr, unformatted. It is never chosen by default."""

from __future__ import annotations

import sys
from logging import LogRecord

from pretrain_planner.configfiles import install
from snakemake_interface_logger_plugins.base import LogHandlerBase

install()


class LogHandler(LogHandlerBase):
    """Each record's message on stderr (the plugin interface's minimum; see the module's docstring for why)."""

    def emit(self, record: LogRecord) -> None:
        print(record.getMessage(), file=sys.stderr)

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False

    @property
    def has_formatter(self) -> bool:
        return False

    @property
    def needs_rulegraph(self) -> bool:
        return False
