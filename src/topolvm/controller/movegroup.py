"""Claims that move together (docs/mobility.md, "Moving a claim"): a pod's node-local claims
each have a VolumeMove, listing the others in ``spec.together``, and one target node. Each goes
through the steps on its own and waits for the others at three points, so that the pod never
runs with some of its claims moved and others not:

- the pod stops only once every pre-copy is done;
- a claim is swapped only once every final copy is done: from the first swap on, the moves
  only go forward (before it, the failure of one rolls all of them back);
- the pod is let go only once every claim is swapped.

The reconciler handles the moves of one group one at a time (:meth:`Group.key` names the
lock), so that each decides on the others' settled state. Each records the others it has
seen (``status.togetherSeen``): one seen and then gone was deleted (before the swap: all roll
back; after: it finished), one never seen is waited for a while (``topolvm move`` creates
them one after the other).
"""

from __future__ import annotations

from lightkube import AsyncClient

from topolvm.constants import Names
from topolvm.controller.movesteps import Rollback
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.moveobject import MovePhase, VolumeMoveObject
from topolvm.move.rules import Refused

FAILED = frozenset({MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK, MovePhase.REFUSED})
COMMITTED = frozenset({MovePhase.SWAPPING, MovePhase.STARTING, MovePhase.SUCCEEDED})
NOT_YET = frozenset({MovePhase.PENDING, MovePhase.PRE_COPY})  # a companion may not exist yet
PARTNER_WAIT = 300  # seconds a move waits for a companion's VolumeMove to be created


def key(vm: VolumeMoveObject) -> str:
    """The group's name: its namespace and claims (one move alone is a group of one)."""
    return f"{vm.namespace}/{','.join(sorted({vm.claim, *vm.together}))}"


class Group:
    """One VolumeMove and the VolumeMoves of the claims that move with it (None: none yet, or
    only a finished one older than this move, from an earlier move of the claim)."""

    def __init__(self, vm: VolumeMoveObject, others: dict[str, VolumeMoveObject | None]):
        self.vm = vm
        self.others = others
        self.seen = set(vm.status.together_seen.split(",")) - {""}

    @classmethod
    async def read(cls, client: AsyncClient, names: Names, vm: VolumeMoveObject) -> Group:
        res = api.volumemove_resource(names)
        others: dict[str, VolumeMoveObject | None] = {}
        for claim in vm.together:
            raw = await api.get(client, res, claim, namespace=vm.namespace)
            other = None if raw is None else VolumeMoveObject.from_dict(raw)
            if other is not None and other.done and other.created < vm.created:
                other = None  # an earlier move's
            others[claim] = other
        return cls(vm, others)

    @property
    def seen_now(self) -> str:
        """``status.togetherSeen`` with the companions present now."""
        present = {c for c, o in self.others.items() if o is not None}
        return ",".join(sorted(self.seen | present))

    def check_agreed(self) -> None:
        """Before the move starts: each other VolumeMove that exists moves this claim too, to
        the same node, and has not failed (:class:`Refused`)."""
        mine = set(self.vm.together) | {self.vm.claim}
        for claim, other in sorted(self.others.items()):
            if other is None:
                continue
            same_node = other.target_node == self.vm.target_node
            if set(other.together) | {other.claim} != mine or not same_node:
                raise Refused(
                    "NotTogether", f"the VolumeMove of claim {claim} does not list the same "
                    f"claims ({', '.join(other.together) or 'none'}) or target node "
                    f"({other.target_node or 'none'}) as this one"
                )  # fmt: skip
            if other.status.phase in FAILED:
                raise Refused("TogetherFailed", _failed_text(claim, other))

    def check_alive(self, age: int) -> None:
        """Before the swap: a failed or deleted companion rolls this move back too, and so
        does one not created within :data:`PARTNER_WAIT` seconds of this move (``age``)."""
        for claim, other in sorted(self.others.items()):
            if other is None and claim in self.seen:
                raise Rollback("TogetherGone", f"the VolumeMove of claim {claim}, which moves "
                               "with this one, was deleted")  # fmt: skip
            if other is None:
                if self.vm.status.phase in NOT_YET and age < PARTNER_WAIT:
                    continue  # topolvm move creates them one after the other
                raise Rollback("TogetherMissing", f"no VolumeMove of claim {claim}, which "
                               "moves with this one, was created")  # fmt: skip
            if other.status.phase in FAILED:
                raise Rollback("TogetherFailed", _failed_text(claim, other))

    @property
    def committed(self) -> list[str]:
        """The companions swapped already: this move can no longer roll back."""
        return sorted(c for c, o in self.others.items() if o and o.status.phase in COMMITTED)

    @property
    def past_precopy(self) -> bool:
        """A companion has stopped the pod (the stop is the group's, not a failure)."""
        return any(o is not None and o.status.phase not in NOT_YET | FAILED
                   for o in self.others.values())  # fmt: skip

    async def waiting(self, store: LogicalVolumeStore, phase: str, what: str) -> str:
        """What this move waits for, or "" once every companion is past ``phase`` (or in it
        with its copy done, for a copy phase). From the swap on, a companion seen and gone
        since has finished (its VolumeMove deleted once done)."""
        order = MovePhase.ORDER
        for claim, other in sorted(self.others.items()):
            if other is None:
                if claim in self.seen and phase == MovePhase.SWAPPING:
                    continue
                return f"waiting for the VolumeMove of claim {claim}, which moves with this one"
            at = other.status.phase
            if at in order and order.index(at) > order.index(phase):
                continue
            if at == phase and phase in (MovePhase.PRE_COPY, MovePhase.FINAL_COPY):
                name = other.status.target_volume
                lv = await store.get(name, fresh=True) if name else None
                if lv is not None and lv.copy_done:
                    continue
            return f"{what} done; waiting for claim {claim}'s (phase {at})"
        return ""


def _failed_text(claim: str, other: VolumeMoveObject) -> str:
    s = other.status
    return f"the move of claim {claim}, which moves with this one, is {s.phase}: {s.message}"
