"""The selector's metrics: the lifecycle's StageTimer hook, turned into Prometheus series and the
`decision` log line (with the milliseconds each stage took)."""

from __future__ import annotations

from vmsched.contracts import ScheduleDecision
from vmsched.lifecycle import Stages, StageTimes
from vmsched.logging import get_logger
from vmsched.metrics import DECISION_SECONDS, DECISIONS, LOCK_WAIT_SECONDS, cluster_label

log = get_logger("vmsched.selector")


class SelectorMetrics(StageTimes):
    def lock_waited(self, seconds: float) -> None:
        LOCK_WAIT_SECONDS.observe(seconds)

    def decided(self, decision: ScheduleDecision, stages: Stages, seconds: float) -> None:
        cluster = cluster_label(decision.cluster_id)
        DECISIONS.labels(cluster, decision.status.value).inc()
        DECISION_SECONDS.labels(cluster).observe(seconds)
        log.info(
            "decision",
            status=decision.status.value,
            host=decision.host_id,
            summary=decision.explanation.summary,
            elapsed_ms=round(decision.elapsed_ms, 2),
            stages_ms=stages,
        )
