"""The request lifecycle: a schedule request from arrival to its stored, published decision.

The wiring between the pure domain (vmsched.scheduling) and the stores and bus; the selector
service is a thin shell over it. One job per module:

- `queueing`  the order waiting requests are decided in (pure);
- `turns`     one attempt of one request, how a cluster's next group is taken, what deciding one
              request of a group comes to (pure);
- `replay`    what a request id already decided gets (pure);
- `decisions` the ScheduleDecision of each way a handling ends (pure);
- `timing`    the one hook that hears stage timings, lock waits and decisions;
- `calls`     the workers' RPCs (`place`, `filter`, `weigh`);
- `events`    decision events and the records they are owed by;
- `placing`   placing a group, in a filter-worker or here;
- `commit`    the one fenced commit of a group's outcomes;
- `groups`    group commit: per-cluster queues and runners under the cluster lock;
- `core`      `Lifecycle.decide`: replay, the attempts with their bounded wait, errors.
"""

from vmsched.lifecycle.commit import Commit
from vmsched.lifecycle.core import Lifecycle, PolicySource
from vmsched.lifecycle.queueing import Waiting, decision_order, effective_priority
from vmsched.lifecycle.replay import Stored, event_of, owes_event, same_request
from vmsched.lifecycle.timing import Stages, StageTimer, StageTimes
from vmsched.lifecycle.turns import Outcome, Turn, TurnResult, Verdict, Wait, one_group, runs

__all__ = [
    "Commit",
    "Lifecycle",
    "Outcome",
    "PolicySource",
    "StageTimer",
    "StageTimes",
    "Stages",
    "Stored",
    "Turn",
    "TurnResult",
    "Verdict",
    "Wait",
    "Waiting",
    "decision_order",
    "effective_priority",
    "event_of",
    "one_group",
    "owes_event",
    "runs",
    "same_request",
]
