"""One cost-assignment decision per tf.distribute job: the leader measures, every worker runs what it chose.

The cost assignment measures a step on the machine that runs it. Workers of a MultiWorkerMirroredStrategy job on
machines that differ, or are loaded differently, would each decide for themselves, and could run different graphs
(which a collective may not survive, and which train differently). So in a job of several processes only the
collective leader (the chief, else worker 0) measures -- a copy of the step it can run alone (`standalone`: devices
cleared, each all-reduce an Identity of its own input, since what is timed is the compute) -- and it shares what it
decided through TensorFlow's coordination service (the key-value store every MultiWorkerMirroredStrategy job has):

- when it plans a step: `{"plan": "decided", "profile": ...}` (its cache had the step), `{"plan": "measuring"}`
  or `{"plan": "lists"}` (it cannot measure the step: Grappler's lists as traced); the other workers wait for this
  when they plan the same step (the n-th step with collective ops: every worker runs those in the same order)
  and do as it says;
- after each piece of its measuring, spread over the step's first calls (training.deferred; piece k runs before
  call k + 1): `{}` while it measures, `{"at": k + 1, "profile": ...}` when piece k ended it. Before each call,
  every other worker reads what the leader said after the piece before the previous call -- which is there: the
  steps run in lock step, a worker's call cannot return before the leader's same call has sent its part of the
  gradients' all-reduce, and the leader publishes before starting a call. Every worker, leader included, swaps the
  decision in at piece k + 1, before the same call.

Each worker then rewrites its own traced step with the leader's measured table, the same code on the same graph:
the same graph, byte for byte (tests/training/test_multi_worker.py checks it). In one process (MirroredStrategy)
there is one decision anyway; its step is measured as `standalone` makes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re

logger = logging.getLogger("mp_rewrite")

KEY_PREFIX = "mp_rewrite/cost_assignment"
PLAN_WAIT_MS = 300_000  # a worker waits this long for the leader to plan the same step, then runs the lists
REDUCE_OPS = ("CollectiveReduceV2", "CollectiveReduce")  # input 0 is the tensor reduced, the output has its shape
_PLANNED = [0]  # steps with collective ops this process planned in a job of several processes


class NoSharing(RuntimeError):
    """A step of a job of several processes whose decision cannot be shared: every worker runs Grappler's lists."""


class LeaderFailed(RuntimeError):
    """The leader's measuring failed or was dropped: every worker keeps Grappler's lists."""


def standalone(graph_def):
    """(copy, "") of a distributed step that this process can run alone for measuring -- every node's device
    cleared, every all-reduce (CollectiveReduceV2) an Identity of its input -- or (None, why) when it has collective
    ops of another kind (a gather or broadcast changes shapes or needs its peers)."""
    others = sorted({n.op for n in graph_def.node
                     if n.op.startswith(("Collective", "Nccl")) and n.op not in REDUCE_OPS})
    if others:
        return None, f"the step has {', '.join(others)} ops, which need the other workers to run"
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        node.device = ""
        if node.op in REDUCE_OPS:
            data = node.input[0]
            controls = [i for i in node.input if i.startswith("^")]
            dtype, shapes = node.attr["T"].type, node.attr.get("_output_shapes")
            saved = type(shapes)() if shapes is not None else None
            if saved is not None:
                saved.CopyFrom(shapes)
            node.op = "Identity"
            del node.input[:]
            node.input.extend([data, *controls])
            node.attr.clear()
            node.attr["T"].type = dtype
            if saved is not None:
                node.attr["_output_shapes"].CopyFrom(saved)
    return copy, ""


@dataclasses.dataclass(frozen=True)
class Share:
    """This process's part in deciding a distributed step: `leader` (it measures and publishes), the step's key in
    the coordination service, and the digest of its graph."""

    leader: bool
    key: str
    digest: str

    def publish_plan(self, plan: str, profile=None) -> None:
        _put(f"{self.key}/plan", {"plan": plan, "profile": _text(profile), "digest": self.digest})

    def wait_plan(self) -> dict:
        """The leader's plan for this step; {"plan": "lists"} (and a warning) if it does not come in time. A plan
        for a step that differs from this worker's (layers named otherwise?) is followed, with a warning: its
        table may then choose otherwise here."""
        try:
            said = _get(f"{self.key}/plan", PLAN_WAIT_MS)
        except Exception as error:  # noqa: BLE001 -- no plan: the leader did not trace this step; run the lists
            logger.warning("mp_rewrite: no cost-assignment plan from the leader for %s within %d s (%s); this worker "
                           "runs Grappler's lists", self.key, PLAN_WAIT_MS // 1000, type(error).__name__)
            return {"plan": "lists"}
        if said.get("digest") != self.digest:
            logger.warning("mp_rewrite: %s: the leader's step is not this worker's step (the same collective ops in "
                           "the same order, but other nodes: layers named otherwise?); its measured table may "
                           "choose other precisions here than on the leader", self.key)
        return said


def share_for(graph_def) -> Share | None:
    """The Share of a step with collective ops in a job of several processes, or None in one process (one decision).
    Raises NoSharing in a job without a coordination service.

    The key is the step's place among the steps with collective ops this process planned: every worker runs those
    in the same order (each call waits for its peers'), so the n-th one is the same step on every worker, whatever
    its nodes are named here."""
    from tensorflow.python.eager import context
    ctx = context.context()
    server = getattr(ctx, "_collective_ops_server_def", None) or ctx.get_server_def()
    tasks = sum(len(job.tasks) for job in server.cluster.job) if server is not None else 0
    if tasks < 2 or not any(n.op.startswith(("Collective", "Nccl")) for n in graph_def.node):
        return None  # one process, or a step exchanging nothing with other workers: this process decides
    leader = getattr(ctx, "_collective_leader", None)
    if ctx.coordination_service is None or not leader:
        raise NoSharing("the job has no coordination service (or no collective leader) to share a decision through")
    _PLANNED[0] += 1
    me = f"/job:{server.job_name}/replica:0/task:{server.task_index}"
    return Share(leader=leader == me, key=f"{KEY_PREFIX}/step{_PLANNED[0]}", digest=_digest(graph_def))


class LeaderMeasure:
    """The leader's StepMeasure, which says after each piece whether it is done: the outcome is published at the
    piece that ends the measuring and swapped in at the next (see the module doc); a failure is published too."""

    def __init__(self, measure, share: Share):
        self.measure, self.share = measure, share
        self.traced, self.planned_runs = measure.traced, measure.planned_runs

    def pieces(self):
        """StepMeasure.pieces, publishing {} after each piece, then the decision and one piece more."""
        said = 0  # the pieces published
        try:
            inner = self.measure.pieces()
            while True:
                try:
                    what = next(inner)
                except StopIteration as done:
                    profile = done.value
                    break
                said += 1
                _put(f"{self.share.key}/piece/{said}", {})
                yield what
        except BaseException as error:  # GeneratorExit too: deferred.drop stops the measuring
            _put(f"{self.share.key}/piece/{said + 1}", {"at": said + 2, "profile": None, "why": type(error).__name__})
            raise
        said += 1
        _put(f"{self.share.key}/piece/{said}", {"at": said + 1, "profile": _text(profile)})
        yield "publishing the decision to the other workers"
        return profile


class FollowerMeasure:
    """What a worker other than the leader does across a step's first calls: before each call it reads what the
    leader said after its piece before the previous call, and swaps in the leader's decision at the same piece.

    That read waits for nothing in practice: this worker's previous call returned, so the leader's had sent its part
    of the all-reduce, after it published. Reading with a short timeout instead would miss the message under load."""

    planned_runs, leader_decides = 0, True

    def __init__(self, share: Share, traced):
        self.share, self.traced = share, traced

    def pieces(self):
        """Yield once a call until the leader's decision is due; return it as a Profile (its table decides)."""
        count = 1
        yield "waiting for the leader's first piece"
        while True:
            message = _get(f"{self.share.key}/piece/{count}", PLAN_WAIT_MS)
            count += 1
            if "at" in message:
                if message["profile"] is None:
                    raise LeaderFailed(f"the leader's measuring ended without a decision ({message.get('why')})")
                return _profile(message["profile"])
            yield "waiting for the leader's decision"


def profile_of(message: dict):
    """The Profile a plan or swap message carries."""
    return _profile(message["profile"])


def _digest(graph_def) -> str:
    """The step's graph without what differs between workers and processes: the task in devices, debug info, the
    custom gradients' process-wide numbers."""
    from ..analysis.step_profile import GRADIENT_ATTR
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        node.device = re.sub(r"/task:\d+", "/task:_", node.device)
        node.ClearField("experimental_debug_info")
        if GRADIENT_ATTR in node.attr:
            del node.attr[GRADIENT_ATTR]
    return hashlib.sha1(copy.SerializeToString(deterministic=True)).hexdigest()


def _text(profile):
    from ..analysis.profile_cache import as_text
    return None if profile is None else as_text(profile.table, profile.fp32_ms, profile.lists_ms)


def _profile(text):
    from ..analysis.graph_profile import Profile
    from ..analysis.profile_cache import from_text
    found = from_text(text)
    if found is None:
        raise LeaderFailed("the leader's decision could not be read (another version of mp_rewrite?)")
    return Profile(*found)


def _put(key: str, value: dict) -> None:
    from tensorflow.python.eager import context
    context.context().set_config_key_value(key, json.dumps(value))


def _get(key: str, timeout_ms: int) -> dict:
    from tensorflow.python.eager import context
    return json.loads(context.context().get_config_key_value(key, timeout_ms))
