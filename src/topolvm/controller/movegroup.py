"""Claims that move together (docs/mobility.md, "Moving a claim"): a pod's node-local claims
each have a VolumeMove, listing the others in ``spec.together``, and one target node. Each goes
through the steps on its own and waits for the others at these points, so that the pod never
runs with some of its claims moved and others not:

- the pod stops only once every pre-copy is done;
- a claim is swapped only once every final copy is done and every member is in Swapping, and
  only after the group's commit: ``commitTime`` written onto EVERY member, in the order of
  their claims, each a compare-and-swap on that member's status (:meth:`Group.commit`);
- the pod is let go only once every claim is swapped and every target volume is cut for its
  verification.

The commit is what fences two writers (a stale leader and the new one): a member with
``commitTime`` never rolls back, and a rollback is a compare-and-swap on that member's status,
so a commit that reached it since makes the rollback fail (the pass reads again and decides
again), and a rollback that reached it first makes the commit fail. A member rolled back
without ``commitTime`` means the commit can never be whole, so no claim of the group was
deleted: the group is ``aborted`` and the members that have ``commitTime`` roll back too
(:func:`topolvm.k8s.moveobject.may_write`). Within one controller the moves of one group are
also handled one at a time (:func:`key` names the lock).

Each records the others it has seen (``status.togetherSeen``): one seen and then gone was
deleted (before the swap: all roll back; after: it finished), one never seen is waited for a
while (``topolvm move`` creates them one after the other). A done member keeps its finalizer
while another member of its group is in progress (:meth:`Group.busy`), so that none vanishes
mid-commit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from lightkube import AsyncClient
from lightkube.resources.core_v1 import PersistentVolumeClaim

from topolvm.constants import Names
from topolvm.controller.movesteps import Rollback
from topolvm.k8s import api
from topolvm.k8s.lvstore import LogicalVolumeStore
from topolvm.k8s.moveobject import Condition, MovePhase, MoveStatus, VolumeMoveObject
from topolvm.move import verdict
from topolvm.move.prepull import ImagesPulled
from topolvm.move.rules import Refused

log = logging.getLogger(__name__)
FAILED = frozenset({MovePhase.ROLLING_BACK, MovePhase.ROLLED_BACK, MovePhase.REFUSED})
Write = Callable[[VolumeMoveObject, MoveStatus], Awaitable[VolumeMoveObject]]
NOT_YET = frozenset({MovePhase.PENDING, MovePhase.PRE_COPY})  # a companion may not exist yet
PARTNER_WAIT = 300  # seconds a move waits for a companion's VolumeMove to be created


def key(vm: VolumeMoveObject) -> str:
    """The group's name: its namespace and claims (one move alone is a group of one)."""
    return f"{vm.namespace}/{','.join(sorted({vm.claim, *vm.together}))}"


class Group:
    """One VolumeMove and the VolumeMoves of the claims that move with it (None: none yet, or
    only a finished one older than this move, from an earlier move of the claim)."""

    def __init__(
        self, vm: VolumeMoveObject, others: dict[str, VolumeMoveObject | None],
        claim_gone: str = "",
    ):  # fmt: skip
        self.vm = vm
        self.others = others
        self.claim_gone = claim_gone  # why the claim of before the move is gone ("": it is not)
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
        return cls(vm, others, await _claim_gone(client, vm))

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

    def _present(self) -> list[VolumeMoveObject]:
        """This move and the companions that exist, in the order of their claims."""
        return sorted([self.vm, *(o for o in self.others.values() if o is not None)],
                      key=lambda m: m.claim)  # fmt: skip

    @property
    def aborted(self) -> list[str]:
        """The members rolled back (or refused) without ``commitTime``: the group's commit can
        never be whole, and no claim of the group was deleted."""
        return [m.claim for m in self._present()
                if m.status.phase in FAILED and not m.status.commit_time]  # fmt: skip

    @property
    def swapped(self) -> list[str]:
        """The companions past the swap (their old claim deleted)."""
        return sorted(c for c, o in self.others.items()
                      if o and o.status.phase in MovePhase.SWAPPED)  # fmt: skip

    def rollback_blocked(self) -> str:
        """Why this move may not roll back now ("": it may)."""
        if self.vm.status.phase in MovePhase.SWAPPED:  # its old claim deleted: only forward
            return f"claim {self.vm.claim} was swapped already (phase {self.vm.status.phase})"
        if swapped := self.swapped:  # whatever else: a claim of the pod is on the target
            return f"{', '.join(swapped)}, moved with this claim, swapped already"
        if self.vm.status.commit_time and self.claim_gone:  # only the swap deletes it
            return f"{self.claim_gone}: the old volume has no claim to go back to"
        if self.aborted:
            return ""
        if self.vm.status.commit_time:
            return "the claims moved together are committed to the swap (commitTime)"
        if self.vm.status.phase != MovePhase.SWAPPING:
            # the group decides in Swapping (its commit, or a member's rollback before it)
            swapping = sorted(c for c, o in self.others.items()
                              if o and o.status.phase == MovePhase.SWAPPING)  # fmt: skip
            if swapping:
                return f"{', '.join(swapping)}, moved with this claim, swapped already"
        return ""

    @property
    def commit_complete(self) -> bool:
        """Every member carries ``commitTime`` (one past the swap, or seen and gone after this
        one's commit, did too): the old claims may be deleted."""
        if not self.vm.status.commit_time:
            return False
        for claim, other in self.others.items():
            if other is None:
                if claim not in self.seen:
                    return False
                continue  # gone once the commit reached this one: it finished
            if not other.status.commit_time and other.status.phase not in MovePhase.SWAPPED:
                return False
        return True

    def not_swapping(self) -> str:
        """What the commit waits for: a companion not in Swapping yet ("": none)."""
        for claim, other in sorted(self.others.items()):
            if other is None:
                if claim in self.seen and self.vm.status.commit_time:
                    continue
                return f"waiting for the VolumeMove of claim {claim}, which moves with this one"
            at = other.status.phase
            if at != MovePhase.SWAPPING and at not in MovePhase.SWAPPED:
                return f"final copy done; waiting for claim {claim}'s swap (phase {at})"
        return ""

    async def commit(self, write: Write, stamp: str, text: str) -> None:
        """``commitTime`` onto every member that lacks it, in the order of their claims, each
        by ``write`` (a compare-and-swap against the version read: a member changed since
        raises, and the pass decides again). This move's object is updated in place."""
        for member in self._present():
            if member.status.commit_time or member.status.phase in MovePhase.SWAPPED:
                continue
            stored = await write(member, replace(member.status, commit_time=stamp, message=text))
            if member is self.vm:
                self.vm.status, self.vm.resource_version = stored.status, stored.resource_version
            else:
                self.others[member.claim] = stored
            log.info("group commit written", extra={
                "move": f"{member.namespace}/{member.name}", "by": self.vm.name})  # fmt: skip

    def busy(self) -> list[str]:
        """The companions in progress that were there before this move ended: a done member
        keeps its VolumeMove (finalizer) until they end."""
        ended = self.vm.status.completion_time
        return sorted(c for c, o in self.others.items() if o is not None and not o.done
                      and (not ended or not o.created or o.created <= ended))  # fmt: skip

    async def cuts_waiting(self, store: LogicalVolumeStore) -> str:
        """Before the pod is let go: each companion's target volume is cut for its
        verification (it may change once the pod runs); "" once all are."""
        for claim, other in sorted(self.others.items()):
            if other is None or other.status.phase != MovePhase.STARTING:
                continue  # gone (finished), or past Starting: its pod started
            target = await store.get(other.made_name, fresh=True)
            if target is None or not verdict.cut_made(other.uid, target):
                return f"waiting for claim {claim}'s target volume to be cut for its verification"
        return ""

    @property
    def puller(self) -> str:
        """The claim whose move pulls the pod's images on the target for the whole group (the
        first of its claims): one pre-pull pod for the pod, not one per claim."""
        return min({self.vm.claim, *self.vm.together})

    def pulled_for_group(self) -> Condition | None:
        """The puller's ``ImagesPulled`` condition, once it has one (None before, or while its
        VolumeMove is not there yet)."""
        other = self.others.get(self.puller)
        return None if other is None else other.status.condition(ImagesPulled.TYPE)

    @property
    def past_precopy(self) -> bool:
        """A companion has stopped the pod (the stop is the group's, not a failure)."""
        return any(o is not None and o.status.phase not in NOT_YET | FAILED
                   for o in self.others.values())  # fmt: skip

    async def waiting(self, store: LogicalVolumeStore, phase: str, what: str) -> str:
        """What this move waits for, or "" once every companion is past ``phase`` (or in it
        with its copy done, for a copy phase). From the swap on, a companion seen and gone
        since has finished (its VolumeMove deleted once done)."""
        for claim, other in sorted(self.others.items()):
            if other is None:
                if claim in self.seen and phase == MovePhase.SWAPPING:
                    continue
                return f"waiting for the VolumeMove of claim {claim}, which moves with this one"
            at = other.status.phase
            if MovePhase.rank(at) > MovePhase.rank(phase):
                continue
            if at == phase and phase in (MovePhase.PRE_COPY, MovePhase.FINAL_COPY):
                lv = await store.get(other.made_name, fresh=True)
                # a pre-copy is over once its copy is done and its image pre-pull too
                pulling = phase == MovePhase.PRE_COPY and (
                    other.status.condition(ImagesPulled.TYPE) is None)  # fmt: skip
                if lv is not None and lv.copy_done and not pulling:
                    continue
            return f"{what} done; waiting for claim {claim}'s (phase {at})"
        return ""


def _failed_text(claim: str, other: VolumeMoveObject) -> str:
    s = other.status
    return f"the move of claim {claim}, which moves with this one, is {s.phase}: {s.message}"


async def _claim_gone(client: AsyncClient, vm: VolumeMoveObject) -> str:
    """Why the claim the move started from (``status.claimUID``) is gone or going ("": it is
    there, or the move has not recorded it yet)."""
    uid = vm.status.claim_uid
    if not uid:
        return ""
    raw = await api.get(client, PersistentVolumeClaim, vm.claim, namespace=vm.namespace)
    meta = (raw or {}).get("metadata") or {}
    if raw is None or meta.get("uid") != uid:
        return f"claim {vm.claim} ({uid}) is deleted"
    if meta.get("deletionTimestamp"):
        return f"claim {vm.claim} ({uid}) is being deleted"
    return ""
