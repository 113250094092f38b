"""Everything of ddp that a program may use without importing torch: the one surface the lab
imports from.

The lab builds each rank's command line from ``TrainConfig``, follows the ranks by their typed
records, judges parity from their logs, diagnoses a failed collective from the flight
recorder's dumps, and writes each run's results page and TensorBoard scalars; none of that
needs torch at import (the scalars import it only when written), and a host that only drives
containers starts faster without it. ``tests/ddp/test_torchfree.py`` holds this module (and
every ddp module the lab imports) to that.
"""

from __future__ import annotations

from ddp.flight.diagnosis import Diagnosis, diagnose
from ddp.flight.dumps import load_dumps
from ddp.flight.gloo_errors import error_meaning, strip_source
from ddp.instrument.env import (
    DUMP_SIGNAL,
    ENV_EMIT_RECORDS,
    ENV_FLIGHT_CAPACITY,
    ENV_INSTRUMENT,
    ENV_LOG_DIR,
    InstrumentEnv,
    instrument_environment,
    site_dir,
)
from ddp.instrument.records import (
    ScriptDDPRecord,
    ScriptEndRecord,
    ScriptHookRecord,
    ScriptStepRecord,
)
from ddp.program.config import (
    COMM_HOOKS,
    COMMS,
    COMPRESSION_HOOKS,
    GROUPS,
    POWERSGD_RANK,
    POWERSGD_START_ITER,
    Rendezvous,
    TrainConfig,
    flag_of,
)
from ddp.program.flags import add_train_arguments, config_from_args
from ddp.program.parity import ParityReport, check_logs
from ddp.program.records import (
    ConfigRecord,
    EndRecord,
    FailureRecord,
    LogError,
    PlanRecord,
    RankLog,
    Record,
    StepRecord,
    VerdictRecord,
    load_attempts,
    load_run,
    parse_record_line,
)
from ddp.recovery.demo.timeline import figures as recovery_figures
from ddp.recovery.demo.timeline import timeline as recovery_timeline
from ddp.recovery.demo.torchft.verdict import agreement as torchft_agreement
from ddp.recovery.etcd.client import ENV_CREDENTIALS as ETCD_CREDENTIALS_ENV
from ddp.recovery.etcd.client import ENV_ENDPOINTS as ETCD_ENDPOINTS_ENV
from ddp.recovery.etcd.cluster import etcd_binary, make_certificates, member_argv
from ddp.recovery.etcd.decider import JOB_ENV
from ddp.recovery.protocol.messages import SECRET_ENV
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)
from ddp.report import (
    REPORT_NAME,
    TB_MISSING,
    Figure,
    Headline,
    Link,
    Page,
    Section,
    Table,
    Text,
    rank_exits,
    rank_outcome,
    step_scalars,
    steps_table,
    tensorboard_available,
    write_page,
    write_scalars,
)

__all__ = [
    "COMMS",
    "COMM_HOOKS",
    "COMPRESSION_HOOKS",
    "DUMP_SIGNAL",
    "ENV_EMIT_RECORDS",
    "ENV_FLIGHT_CAPACITY",
    "ENV_INSTRUMENT",
    "ENV_LOG_DIR",
    "ETCD_CREDENTIALS_ENV",
    "ETCD_ENDPOINTS_ENV",
    "GROUPS",
    "JOB_ENV",
    "POWERSGD_RANK",
    "POWERSGD_START_ITER",
    "REPORT_NAME",
    "SECRET_ENV",
    "TB_MISSING",
    "CommitRecord",
    "ConfigRecord",
    "DeciderRecord",
    "Diagnosis",
    "EndRecord",
    "FailureRecord",
    "FaultRecord",
    "Figure",
    "Headline",
    "HealRecord",
    "InstrumentEnv",
    "Link",
    "LogError",
    "Page",
    "ParityReport",
    "PlanRecord",
    "QuorumRecord",
    "RankLog",
    "Record",
    "RecoveryVerdictRecord",
    "Rendezvous",
    "ScriptDDPRecord",
    "ScriptEndRecord",
    "ScriptHookRecord",
    "ScriptStepRecord",
    "Section",
    "StepRecord",
    "Table",
    "Text",
    "TrainConfig",
    "VerdictRecord",
    "add_train_arguments",
    "check_logs",
    "config_from_args",
    "diagnose",
    "error_meaning",
    "etcd_binary",
    "flag_of",
    "instrument_environment",
    "load_attempts",
    "load_dumps",
    "load_run",
    "make_certificates",
    "member_argv",
    "parse_record_line",
    "rank_exits",
    "rank_outcome",
    "recovery_figures",
    "recovery_timeline",
    "site_dir",
    "step_scalars",
    "steps_table",
    "strip_source",
    "tensorboard_available",
    "torchft_agreement",
    "write_page",
    "write_scalars",
]
