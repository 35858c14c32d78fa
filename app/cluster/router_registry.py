"""The voice routers of this process, by deployment name, and their counts.

Apart from app.cluster.routing on purpose: Serve ships the router class to the processes that
route by pickling its module by value, so that module holds no locks or shared state; this one is
imported by name, so the ingress's /ready and /metrics find the very router its handle uses.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

_routers: dict[str, object] = {}
_lock = threading.Lock()


@dataclass
class RoutingCounts:
    """Voice requests routed to their preferred replica (hits) or elsewhere because it was busy
    (spills), and requests without a voice (unkeyed)."""

    hits: int = 0
    spills: int = 0
    unkeyed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, outcome: str) -> None:
        with self.lock:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"hits": self.hits, "spills": self.spills, "unkeyed": self.unkeyed}


def register(deployment_name: str, router) -> None:
    with _lock:
        _routers[deployment_name] = router


def router_for(deployment_name: str):
    """The router this process's handle to `deployment_name` uses (None before its first call)."""
    with _lock:
        return _routers.get(deployment_name)
