"""Transitional: :mod:`lab.report.report` is the report layer; this name stays only until
topology and memory (LAB-EXP) import it from there, then it is deleted."""

from lab.report.report import Closing, SweepResult, wrote_line
from lab.report.report import report as report_sweep

__all__ = ["Closing", "SweepResult", "report_sweep", "wrote_line"]
