"""LongCA: a declarative benchmark of long-context attention kernels and context-parallel strategies."""

__version__ = "0.1.0"
