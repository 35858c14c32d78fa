"""VoiceAffinityRouter: requests for one voice go to one engine replica while it has free slots.

A replica that served a voice holds its reference codes and its prefilled prefix KV, so the next
request for that voice starts there without encoding or prefilling the voice again. Each voice
key (a saved voice's id, or the hash of an inline clip's bytes) has one preferred replica, chosen
by rendezvous hashing over the running replicas: every router (one per ingress replica) picks the
same one without sharing state, and when a replica comes or goes only the voices it preferred
move. When the preferred replica's ongoing requests fill its sequence slots, the request goes to
the least-loaded replica instead, so one hot voice cannot overload one GPU. Requests without a
voice always go to the least-loaded replica.

This is Ray Serve's custom request router API rather than model multiplexing: multiplexing keys
"loaded models" on replicas and waits for a replica holding the model before it falls back, while
here the fallback decision needs the replica's load against its own slot count (reported by the
replica in its routing stats), and an inline clip is a key that is never "loaded" explicitly.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from . import router_registry

VOICE_KEY_ARG = "voice_key"  # the keyword argument of engine calls that carries the routing key
QUEUE_PROBE_DEADLINE_S = 0.2


def voice_key(voice_id: str | None, clip_bytes: list[bytes]) -> str | None:
    """The routing key of a request: its saved voice (ids ignore case), else the content of its
    inline clips."""
    if voice_id:
        return f"voice:{voice_id.casefold()}"
    if not clip_bytes:
        return None
    digest = hashlib.sha256()
    for data in clip_bytes:
        digest.update(hashlib.sha256(data).digest())
    return f"clip:{digest.hexdigest()}"


def preferred_replica(key: str, replicas: list[RunningReplica]) -> RunningReplica:
    """Rendezvous (highest random weight) hashing: stable while the replica set is."""
    def weight(replica: RunningReplica) -> bytes:
        return hashlib.blake2b(f"{key}\n{replica.replica_id.unique_id}".encode(), digest_size=8).digest()

    return max(replicas, key=weight)


class VoiceAffinityRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self.counts = router_registry.RoutingCounts()
        router_registry.register(self._deployment_id.name, self)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.kwargs.get(VOICE_KEY_ARG) if pending_request is not None else None
        if not key:
            return [candidate_replicas]
        preferred = preferred_replica(key, candidate_replicas)
        # Kept on the request itself (a retried request is routed again with the same object).
        pending_request.s1_preferred_replica = preferred.replica_id.unique_id
        if await self._saturated(preferred):
            return [candidate_replicas]  # the least loaded of all (the preferred one only if it is the least)
        return [[preferred], candidate_replicas]

    async def _saturated(self, replica: RunningReplica) -> bool:
        """Its ongoing requests fill the sequence slots it reported (or its max_ongoing_requests).

        Asked of the replica each time: Serve keeps the router's queue-length cache current only
        under strict max_ongoing_requests, and a stale count would keep sending a hot voice to a
        full replica."""
        try:
            ongoing = await replica.get_queue_len(deadline_s=QUEUE_PROBE_DEADLINE_S)
        except Exception:  # unreachable now: let Serve's own probing and retries decide
            return False
        return ongoing >= replica_slots(replica)

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        preferred = getattr(pending_request, "s1_preferred_replica", None)
        if preferred is None:
            self.counts.add("unkeyed")
        else:
            self.counts.add("hits" if replica_id.unique_id == preferred else "spills")


def replica_slots(replica: RunningReplica) -> int:
    stats = replica.routing_stats or {}
    metadata = getattr(replica, "replica_metadata", None) or {}
    return int(stats.get("slots") or metadata.get("slots") or replica.max_ongoing_requests)

